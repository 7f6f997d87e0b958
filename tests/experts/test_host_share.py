"""The default memory budget is a share of the host among its live nodes; a chosen one above the host is refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from core.experts.host_share import HostShare, check_explicit_budget, host_memory_bytes
from core.experts.tiered_cache import BUDGET_FRACTION


def test_the_default_budget_is_the_hosts_memory_shared_by_its_live_nodes(tmp_path) -> None:
    total = host_memory_bytes()
    assert total
    me = HostShare.join("/data/a", registry=tmp_path)
    budget, line = me.budget()
    assert budget == int(total * BUDGET_FRACTION) and "shared" not in line and "60%" in line
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = HostShare.join("/data/b", registry=tmp_path, pid=sleeper.pid)
        budget, line = me.budget()
        assert budget == int(total * BUDGET_FRACTION / 2) and "shared by 2 nodes on this host" in line
        other.leave()
        assert me.budget()[0] == int(total * BUDGET_FRACTION)
        HostShare.join("/data/b", registry=tmp_path, pid=sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    # a node killed without leaving stops counting once its pid is gone, and its entry is removed
    assert me.nodes() == 1 and not (tmp_path / f"{sleeper.pid}.json").exists()
    assert (tmp_path / f"{os.getpid()}.json").exists()
    me.leave()
    assert not any(tmp_path.iterdir())


def test_a_chosen_budget_above_the_host_is_refused() -> None:
    total = host_memory_bytes()
    check_explicit_budget(total)
    with pytest.raises(ValueError, match="more than this host's"):
        check_explicit_budget(total + 1)
