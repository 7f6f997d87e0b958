"""Transport benchmark: one expert call through each door, against the bytes' own cost.

Run: .venv/bin/python -m bench.transport [--before REV] [--quick]

Two real nodes on loopback hold the same dense f32 expert of Qwen3-30B-A3B's shape (d_model
2048, d_ff 768): one runs this checkout ("after"), the other a git worktree of REV ("before",
default: the last commit before the web→worker data path was reworked; skipped when git or
the revision is unavailable). For 1, 64 and 512 rows it times, median of several calls:

* web: JSON-RPC `tenzro_moeExecute` (base64 rows in and out) → web process → Channels →
  expert worker → back, on both nodes, interleaved so drift hits both alike;
* compute: the same expert forward in this process (ExpertRuntime.execute), so the doors'
  own cost is visible as the difference;
* QUIC: `moe/execute` on each node's peer door over one pinned connection (raw f32 body);
* TCP echo: the same request bytes to a plain asyncio loopback echo server and back, the
  floor any transport pays to move them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from core.experts.runtime import ExpertRuntime
from core.formats.expert_payload import encode_expert_payload
from core.transport.quic import QuicSettings, quic_connection
from testkit.nodes import TOKEN, NodeProcess

from .report import headline, print_table, write_results

ROOT = Path(__file__).resolve().parent.parent
D_MODEL, D_FF, MODEL = 2048, 768, "bench/qwen3-30b-a3b-expert"
ROWS = (1, 64, 512)
# The last commit whose web process decoded rows through numpy, re-encoded them for the worker
# and spooled large bodies to disk (issue 8 reworked that path).
DEFAULT_BEFORE = "3e6be00"


def expert_payload(rng: np.random.Generator) -> bytes:
    def w(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    return encode_expert_payload(gate=w(D_FF, D_MODEL), up=w(D_FF, D_MODEL), down=w(D_MODEL, D_FF), quant=None,
                                 model_id=MODEL, layer=0, expert=0)


def before_tree(rev: str, into: Path) -> Path | None:
    """A worktree of `rev`, or None (printed) when git or the revision is not available."""
    try:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev], check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"before: no worktree of {rev} ({getattr(exc, 'stderr', exc)!s:.200}); its columns are left out")
        return None
    return into


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def time_rpc(client: httpx.Client, node: NodeProcess, body: bytes) -> float:
    start = time.perf_counter()
    answer = client.post(f"{node.url}/rpc", content=body, headers={"Content-Type": "application/json"}).json()
    elapsed = time.perf_counter() - start
    assert "result" in answer, str(answer)[:300]
    return elapsed


async def time_quic(node: NodeProcess, pin: str, rows: bytes, tokens: int, repeats: int) -> list[float]:
    params = {"model_id": MODEL, "layer": 0, "expert": 0, "tokens": tokens, "d_model": D_MODEL}
    settings = QuicSettings(max_body=64 << 20)
    async with quic_connection(host="127.0.0.1", port=node.quic_port, pin_sha256=pin, settings=settings) as peer:
        await peer.call("moe/execute", params, rows)  # warm
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            _, out = await peer.call("moe/execute", params, rows)
            samples.append(time.perf_counter() - start)
            assert len(out) == len(rows)
    return samples


async def time_tcp_echo(data: bytes, repeats: int) -> list[float]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.readexactly(len(data)):
                writer.write(chunk)
                await writer.drain()
        except asyncio.IncompleteReadError:  # the client hung up: done
            writer.close()

    server = await asyncio.start_server(lambda r, w: echo(r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    samples = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        writer.write(data)
        await writer.drain()
        await reader.readexactly(len(data))
        if i:  # the first round trip warms the socket buffers
            samples.append(time.perf_counter() - start)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    return samples


def measure(client: httpx.Client, nodes: dict[str, NodeProcess], runtime: ExpertRuntime, tokens: int,
            repeats: int, rng: np.random.Generator) -> dict:
    """Median ms of each way to run one batch of `tokens` rows through the expert."""
    hidden = rng.standard_normal((tokens, D_MODEL)).astype("<f4")
    raw = hidden.tobytes()
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeExecute", "params": {
        "model_id": MODEL, "layer": 0, "expert": 0, "d_model": D_MODEL,
        "hidden": base64.b64encode(raw).decode()}}).encode()
    compute = []
    for _ in range(repeats):
        start = time.perf_counter()
        runtime.execute(model_id=MODEL, layer=0, expert=0, hidden=hidden)
        compute.append(time.perf_counter() - start)
    web: dict[str, list[float]] = {name: [] for name in nodes}
    for node in nodes.values():
        time_rpc(client, node, body)  # warm
    for _ in range(repeats):
        for name, node in nodes.items():  # interleaved: drift hits both alike
            web[name].append(time_rpc(client, node, body))
    quic = {name: asyncio.run(time_quic(node, node.result("tenzro_nodeInfo")["endpoints"]["quic_cert_sha256"], raw,
                                        tokens, repeats)) for name, node in nodes.items()}
    return {"rows": tokens, "request_bytes": len(raw), "compute_ms": median_ms(compute),
            "tcp_echo_ms": median_ms(asyncio.run(time_tcp_echo(raw, repeats))),
            **{f"web_{name}_ms": median_ms(v) for name, v in web.items()},
            **{f"quic_{name}_ms": median_ms(v) for name, v in quic.items()}}


def table_row(record: dict) -> list:
    before_web, compute = record.get("web_before_ms"), record["compute_ms"]
    return [
        record["rows"], f"{record['request_bytes'] / 1e6:.3f}", compute,
        before_web if before_web is not None else "-", record["web_after_ms"],
        f"{record['web_after_ms'] / before_web:.2f}x" if before_web else "-", record["web_after_ms"] - compute,
        record.get("quic_before_ms", "-"), record["quic_after_ms"], record["quic_after_ms"] - compute,
        record["tcp_echo_ms"], f"{(record['quic_after_ms'] - compute) / record['tcp_echo_ms']:.1f}x",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="git revision of the 'before' node")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = {1: 20, 64: 12, 512: 6} if args.quick else {1: 40, 64: 25, 512: 12}
    rng = np.random.default_rng(0)
    payload = expert_payload(rng)
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-transport-"))
    nodes: dict[str, NodeProcess] = {}
    tree = before_tree(args.before, work / "before-src")
    try:
        nodes["after"] = NodeProcess(data_dir=work / "after", redis_db=11).start()
        if tree is not None:
            nodes["before"] = NodeProcess(data_dir=work / "before", redis_db=12, source_root=tree).start()
        load = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeExpertLoad",
                           "params": {"payload": base64.b64encode(payload).decode()}}).encode()
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            for node in nodes.values():
                time_rpc(client, node, load)
        runtime = ExpertRuntime(data_dir=work / "local", memory_budget_bytes=1 << 30)
        runtime.expert_load(payload=payload)
        with httpx.Client(timeout=120) as client:
            records = [measure(client, nodes, runtime, tokens, repeats[tokens], rng) for tokens in ROWS]
        print_table(
            f"moe/execute of one f32 expert (d_model {D_MODEL}, d_ff {D_FF}), median ms per call; "
            f"before = {args.before if tree else 'unavailable'}",
            ["rows", "MB in", "compute", "web before", "web after", "after/before", "web after - compute",
             "quic before", "quic after", "quic after - compute", "tcp echo", "(quic-compute)/tcp"],
            [table_row(r) for r in records],
        )
        write_results("transport", {"before": args.before if tree else None, "d_model": D_MODEL, "d_ff": D_FF,
                                    "results": records},
                      [headline(f"moe/execute over QUIC less compute, {r['rows']} rows", r["quic_after_ms"]
                                - r["compute_ms"], "ms", reference="TCP echo of the same bytes",
                                reference_value=r["tcp_echo_ms"]) for r in records])
    finally:
        for node in nodes.values():
            node.stop()
        if tree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
