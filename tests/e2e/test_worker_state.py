"""The worker's state in the control plane, and the node's processes dying with it (real nodes)."""

import base64
import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from testkit.nodes import TOKEN, NodeProcess
from tests.experts.factories import MODEL, expert_payload, expert_weights

pytestmark = pytest.mark.e2e
D_MODEL, D_FF = 64, 32
FIELDS = ("model_id", "layer", "expert", "tier", "residency", "memory_bytes", "disk_bytes", "d_model", "d_ff",
          "formats", "blob_uri")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def holdings(status: dict) -> list[dict]:
    return [{k: e[k] for k in FIELDS} for e in status["experts"]]


def assert_published_equals_live(node: NodeProcess) -> dict:
    live = node.result("tenzro_moeExpertStatus", {"live": True})
    published = node.result("tenzro_moeExpertStatus")
    assert holdings(published) == holdings(live)
    assert published["gates"] == live["gates"] and published["counts"] == live["counts"]
    assert published["stale"] is False
    return published


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_published_holdings_follow_loads_evictions_unloads_and_a_worker_restart(start_node, faults) -> None:
    rng = np.random.default_rng(21)
    payloads = [expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e) for e in range(4)]
    # room for two decoded experts: the third load evicts, every execute of a cold one promotes
    node = start_node(env={"TENZRO_MEMORY_BUDGET_BYTES": str(int(2.5 * len(payloads[0]))),
                           "TENZRO_WORKER_HEARTBEAT_S": "1", "TENZRO_WORKER_STALE_S": "3",
                           "TENZRO_WORKER_TIMEOUT_S": "3"})
    for payload in payloads:
        node.result("tenzro_moeExpertLoad", {"payload": b64(payload)}, token=TOKEN)
        assert_published_equals_live(node)  # a load answers only once its holding is published
    status = assert_published_equals_live(node)
    assert status["counts"] == {"warm": 2, "cold": 2, "gates": 0}
    cold = [e["expert"] for e in status["experts"] if e["tier"] == "disk"]
    hidden = b64(rng.standard_normal((2, D_MODEL)).astype("<f4").tobytes())
    node.result("tenzro_moeExecute", {"model_id": MODEL, "layer": 0, "expert": cold[0], "d_model": D_MODEL,
                                      "hidden": hidden})
    # promotions and evictions during compute are published shortly after, coalesced
    wait_for(lambda: holdings(node.result("tenzro_moeExpertStatus"))
             == holdings(node.result("tenzro_moeExpertStatus", {"live": True})), 5, "the promotion to be published")
    node.result("tenzro_moeExpertUnload", {"model_id": MODEL, "layer": 0, "expert": 3}, token=TOKEN)
    before_kill = assert_published_equals_live(node)
    assert [e["expert"] for e in before_kill["experts"]] == [0, 1, 2]

    worker = next(p for p in node.result("tenzro_nodeProcesses")["processes"] if p["name"] == "expert-worker")
    process = psutil.Process(worker["pid"])
    fault = faults.inject("expert worker silent, then killed", "SIGSTOP to the expert worker, then SIGKILL")
    process.suspend()  # silent but not dead, so the supervisor leaves it be for now
    # while the worker is silent, reads answer from the last published state, soon marked stale
    stale = wait_for(lambda: (s := node.result("tenzro_moeExpertStatus"))["stale"] and s, 15, "a stale state")
    assert holdings(stale) == holdings(before_kill) and stale["worker_pid"] == worker["pid"]
    assert node.rpc("tenzro_moeExpertStatus", {"live": True})["error"]["data"]["reason"] == "worker_unavailable"
    process.kill()
    # the supervisor restarts it; it publishes what it finds on disk (every expert Cold), then each
    # expert its warm-up promotes back into the memory tier's room (two of the three)
    node.wait_ready()
    restarted = wait_for(lambda: (s := node.result("tenzro_moeExpertStatus"))["worker_pid"] != worker["pid"]
                         and s["counts"]["warm"] == 2 and s, 30, "the restarted worker's publish of its warmed experts")
    assert restarted["stale"] is False
    assert [(e["expert"], e["tier"]) for e in restarted["experts"]] == [(0, "memory"), (1, "memory"), (2, "disk")]
    assert_published_equals_live(node)
    fault.observe("reads answered stale from the last publish; the restarted worker published its 3 experts, "
                  "the two that fit promoted from its disk tier")
    fault.close(lost=0)


def test_a_killed_supervisor_takes_every_process_of_the_node_with_it(start_node) -> None:
    node = start_node()
    processes = [psutil.Process(pid) for pid in node.descendants()]
    assert len(processes) >= 4  # web, expert worker, celery worker (+ its pool), celery beat
    os.kill(node.process.pid, signal.SIGKILL)  # as the OOM killer would
    node.process.wait()
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert not alive, [(p.pid, p.name()) for p in alive]
    # the same data dir and ports start again at once
    node.start()
    assert node.result("tenzro_nodeInfo")["endpoints"]["quic"] == f"127.0.0.1:{node.quic_port}"


def test_a_start_ends_what_a_previous_run_of_the_data_dir_left_behind(start_node, tmp_path) -> None:
    node = start_node()
    node.stop()
    # A leftover the kernel could not reap for us (say, from a run killed before its children
    # were told to die with it): recorded in node.pids, still running, holding nothing we know.
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    created = psutil.Process(leftover.pid).create_time()
    recycled = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    (node.data_dir / "node.pids").write_text(
        f'{{"supervisor": 1, "children": [{{"name": "expert-worker", "pid": {leftover.pid}, "create_time": {created}}},'
        f' {{"name": "web", "pid": {recycled.pid}, "create_time": 12345.0}}]}}')
    try:
        node.start()
        assert leftover.wait(timeout=10) is not None
        assert f"left behind: pids {leftover.pid}" in node.log()
        assert recycled.poll() is None  # same pid, other start time: not ours, never killed
    finally:
        for proc in (leftover, recycled):
            proc.kill()
            proc.wait()


def test_a_call_the_web_gave_up_on_is_dropped_by_the_worker(start_node, tmp_path) -> None:
    """TENZRO_WORKER_TIMEOUT_S=0.5 and one compute thread: a slow batch holds the thread past the
    deadline of the call queued behind it, which the worker then drops without computing."""
    node = start_node(env={"TENZRO_WORKER_TIMEOUT_S": "0.5", "TENZRO_COMPUTE_THREADS": "1"})
    rng = np.random.default_rng(5)
    d_model, d_ff, rows = 2048, 2048, 4096  # ~100 GFLOP: one to a few seconds on two cores
    path = tmp_path / "big.safetensors"
    path.write_bytes(expert_payload(expert_weights(rng, d_model, d_ff), expert=0))
    node.rpc("tenzro_moeExpertLoad", {"path": str(path)}, token=TOKEN, timeout=60)
    wait_for(lambda: node.result("tenzro_moeExpertStatus")["experts"], 60, "the expert to load")
    params = {"model_id": MODEL, "layer": 0, "expert": 0, "d_model": d_model,
              "hidden": b64(rng.standard_normal((rows, d_model)).astype("<f4").tobytes())}
    before = node.result("tenzro_workerStatus")["calls"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: node.rpc("tenzro_moeExecute", params, timeout=60), range(2)))
    # the web gave up (worker_unavailable), or the worker saw a call arrive already late and said so
    assert all(a["error"]["data"]["reason"] in {"worker_unavailable", "deadline_exceeded"} for a in answers), answers

    def grew(name):
        # the worker is asked within the same 0.5 s timeout: on a loaded machine it may miss one
        answer = node.rpc("tenzro_workerStatus")
        return answer["result"]["calls"].get(name, 0) - before.get(name, 0) if "result" in answer else 0

    # one call computed past its deadline (its answer dropped); the other never computed
    assert wait_for(lambda: grew("operator.dropped_past_deadline") >= 1, 30, "the queued call to be dropped")
    assert grew("operator.abandoned_past_deadline") + grew("operator.dropped_past_deadline") >= 2
