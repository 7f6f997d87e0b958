"""Whole nodes as separate process trees on loopback: identity, QUIC, websocket, shutdown, CLI."""

import asyncio
import json
import subprocess
import sys
import time

import httpx
import psutil
import pytest
import websockets

from core.transport.quic import QuicSettings, TransportError, quic_call
from testkit.nodes import TOKEN

pytestmark = pytest.mark.e2e
QUIC = QuicSettings(max_body=1 << 20)


def test_two_nodes_side_by_side_have_different_identities(start_node) -> None:
    first = start_node()
    second = start_node(peers=[f"http://127.0.0.1:{first.http_port}"])
    info_a, info_b = first.result("tenzro_nodeInfo"), second.result("tenzro_nodeInfo")
    assert info_a["provider_id"] != info_b["provider_id"]
    assert info_a["endpoints"]["quic_cert_sha256"] != info_b["endpoints"]["quic_cert_sha256"]
    assert info_b["peers"] == [first.url]
    # Each node's worker answers for its own identity (no shared Redis channel, no shared data dir).
    assert first.result("tenzro_workerStatus")["provider_id"] == info_a["provider_id"]
    assert second.result("tenzro_workerStatus")["provider_id"] == info_b["provider_id"]


def test_processes_are_supervised_and_celery_beats(shared_node) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = shared_node.result("tenzro_nodeProcesses")
        if status["celery_heartbeat_age_s"] is not None:
            break
        time.sleep(1)
    assert status["supervised"]
    assert {p["name"]: p["state"] for p in status["processes"]} == {
        "web": "running", "expert-worker": "running", "celery-worker": "running", "celery-beat": "running",
    }
    assert status["celery_heartbeat_age_s"] is not None, "beat → broker → worker round trip never happened"


def test_quic_status_round_trip_with_certificate_pinning(shared_node) -> None:
    info = shared_node.result("tenzro_nodeInfo")
    host, port = info["endpoints"]["quic"].rsplit(":", 1)
    result, body = asyncio.run(quic_call(host=host, port=int(port), pin_sha256=info["endpoints"]["quic_cert_sha256"],
                                         method="moe/status", params={}, settings=QUIC))
    assert result["provider_id"] == info["provider_id"] and result["uptime_s"] > 0 and body == b""

    wrong_pin = "00" * 32
    with pytest.raises(TransportError) as refused:
        asyncio.run(quic_call(host=host, port=int(port), pin_sha256=wrong_pin, method="moe/status", params={},
                              settings=QUIC))
    assert refused.value.reason == "certificate_pin_mismatch"


def test_websocket_pushes_policy_change(shared_node) -> None:
    async def scenario():
        async with websockets.connect(f"ws://127.0.0.1:{shared_node.http_port}/ws/dashboard/",
                                      origin=shared_node.url) as socket:
            assert json.loads(await socket.recv())["event"] == "hello"
            proposal = shared_node.result("tenzro_policyPropose", {"changes": {"min_replication": 3}}, token=TOKEN)
            shared_node.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)
            while True:  # other pushes (node.processes, …) may come first on a busy machine
                event = json.loads(await asyncio.wait_for(socket.recv(), 20))
                if event["event"] == "policy.changed":
                    return event

    event = asyncio.run(scenario())
    assert event["event"] == "policy.changed"
    assert event["payload"]["policy"]["min_replication"] == 3
    assert shared_node.result("tenzro_policyGet")["min_replication"] == 3


def test_auth_is_refused_on_a_real_node(shared_node) -> None:
    answer = shared_node.rpc("tenzro_policyPropose", {"changes": {"min_replication": 4}}, token="guess")
    assert answer["error"]["data"]["reason"] == "unauthorized"


def test_clean_shutdown_leaves_no_process_behind(start_node) -> None:
    node = start_node()
    pids = node.descendants()
    assert len(pids) >= 4  # web, expert worker, celery worker (+ its pool), beat
    assert node.cpu_seconds() > 0.5  # bench/generate.py's cores busy: starting Django alone takes more
    assert node.stop() == 0
    survivors = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert survivors == []
    assert "node         | stopped" in node.log()


def test_crashed_child_is_restarted(start_node) -> None:
    node = start_node()
    worker_pid = node.result("tenzro_workerStatus")["pid"]
    psutil.Process(worker_pid).kill()
    deadline = time.monotonic() + 60
    answer: dict = {}
    while time.monotonic() < deadline:
        try:  # a call made while no worker runs waits for the restarted one, which may take a while to start
            answer = node.rpc("tenzro_workerStatus", timeout=10)
        except httpx.TimeoutException:
            continue
        if "result" in answer and answer["result"]["pid"] != worker_pid:
            break
        time.sleep(0.5)
    assert answer["result"]["pid"] != worker_pid, answer
    # The supervisor publishes process states every 2 s: wait for the record to catch up.
    while time.monotonic() < deadline:
        restarts = {p["name"]: p["restarts"] for p in node.result("tenzro_nodeProcesses")["processes"]}
        if restarts["expert-worker"] == 1:
            break
        time.sleep(0.5)
    assert restarts == {"web": 0, "expert-worker": 1, "celery-worker": 0, "celery-beat": 0}


def test_second_node_on_same_data_dir_or_port_is_refused(shared_node, tmp_path) -> None:
    argv = [sys.executable, "-m", "cli.main", "node", "run", "--data-dir", str(shared_node.data_dir),
            "--http", "127.0.0.1:1", "--quic", "127.0.0.1:1", "--redis-url", shared_node.redis_url]
    locked = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert locked.returncode == 1 and "already running with data dir" in locked.stderr

    argv = [sys.executable, "-m", "cli.main", "node", "run", "--data-dir", str(tmp_path / "x"),
            "--http", f"127.0.0.1:{shared_node.http_port}", "--redis-url", shared_node.redis_url]
    taken = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert taken.returncode == 1 and "--http" in taken.stderr and "not available" in taken.stderr


def test_a_memory_budget_above_the_host_is_refused_before_anything_starts(tmp_path) -> None:
    argv = [sys.executable, "-m", "cli.main", "node", "run", "--data-dir", str(tmp_path / "x"),
            "--memory-budget", "100T"]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--memory-budget" in refused.stderr
    assert "is more than this host's" in refused.stderr and not (tmp_path / "x").exists()
    malformed = subprocess.run([*argv[:-1], "lots"], capture_output=True, text=True, timeout=60)
    assert malformed.returncode == 2 and "'lots' is not a size" in malformed.stderr


def test_cli_talks_to_the_node_and_fails_in_one_line(shared_node) -> None:
    cli = [sys.executable, "-m", "cli.main", "--node", shared_node.url]
    info = subprocess.run([*cli, "node", "info"], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(info.stdout)["provider_id"] == shared_node.result("tenzro_nodeInfo")["provider_id"]

    down = subprocess.run([sys.executable, "-m", "cli.main", "--node", "http://127.0.0.1:9", "node", "info"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and "cannot reach node" in down.stderr

    refused = subprocess.run([*cli, "--token", "nope", "rpc", "tenzro_policyPropose", '{"changes": {}}'],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "unauthorized" in refused.stderr and refused.stderr.count("\n") == 1


def test_cli_lists_the_seed_commands() -> None:
    helptext = subprocess.run([sys.executable, "-m", "cli.main", "moe", "--help"], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    for command in ("catalog-shape", "prepare-experts", "prepare-status", "load-expert", "load-gate", "status",
                    "shard-map", "plan-dispatch", "forward"):
        assert command in helptext
