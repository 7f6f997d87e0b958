"""Log levels that mean something, on real nodes: a peer killed and restarted, then stopped and restarted,
leaves the other node's log with no ERROR and no traceback, the peer's going and coming back said once
each, normal QUIC closes out of sight; and a clean stop leaves no traceback in the stopped node's log."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.e2e.test_gossip import FAST, wait_for

pytestmark = pytest.mark.e2e


def test_a_peer_going_away_twice_leaves_no_error_in_the_log(start_node) -> None:
    a = start_node(env=FAST)
    b = start_node(env=FAST, peers=[a.url])
    b_id = b.result("tenzro_nodeInfo")["provider_id"]
    wait_for(lambda: a.result("tenzro_gossipStatus")["known_providers"] == 1, 60, "a to know b")
    stopped_logs = []
    for how in ("SIGKILL", "SIGTERM"):
        if how == "SIGKILL":
            os.killpg(b.process.pid, signal.SIGKILL)
            b.process.wait()
        else:
            assert b.stop() == 0
            stopped_logs.append(b.log())
        wait_for(lambda: f"peer {b_id[:24]} does not answer" in a.log(), 30, f"a to notice b is gone ({how})")
        time.sleep(3)  # a few more rounds against the missing peer: said once, not every round
        b.start(**FAST)
        marks = a.log().count(f"peer {b_id[:24]} answers again")
        wait_for(lambda m=marks: a.log().count(f"peer {b_id[:24]} answers again") > m, 60, "a to hear b again")
    log = a.log()
    # once per time away, not every round; a round that spans the restart may catch the peer half up
    # (its web door answers, its QUIC door not yet) and say it once more
    assert 2 <= log.count(f"peer {b_id[:24]} does not answer") <= 4, log[-5000:]
    assert 2 <= log.count(f"peer {b_id[:24]} answers again") <= 4
    lines = log.splitlines()
    errors = [i for i, line in enumerate(lines) if re.search(r" ERROR |Traceback|never retrieved", line)]
    assert errors == [], "\n".join("\n".join(lines[i:i + 25]) for i in errors[:2])  # each with what followed
    assert not re.search(r"WARNING quic: Native peer close: \('peer_closed', \w+, 0,", log)
    for stopped in stopped_logs:  # a clean stop: no traceback, no lost Celery worker
        assert "Traceback" not in stopped and "WorkerLostError" not in stopped, stopped[-3000:]
