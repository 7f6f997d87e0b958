"""Distributed layer forward benchmark: real nodes on loopback against the single-process forward.

    .venv/bin/python -m bench.forward [--quick] [--replication {1,2}] [--nodes-from DIR]

What is measured, and how. Five real node processes (`tenzro node run`, testkit.nodes) run on
loopback: a router that holds only the gate, and four holders that hold the experts of a
Qwen3-30B-A3B MoE layer (128 routed experts, top-8 softmax gate with norm_topk_prob, d_model
2048, d_ff 768, f32 payloads written to files and loaded with `tenzro_moeExpertLoad {"path"}`);
expert e lives on holders e % 4, …, (e + replication - 1) % 4, so each holder carries
replication/4 of the layer. The router holds no expert, so every (token, expert) pair crosses
the wire: the honest distributed case (a holder acting as router would serve a quarter of the
pairs locally and flatter the ratio). The reference is `ExpertRuntime.forward_local` in this
process, holding all 128 experts, on the same hidden rows, timed interleaved with the
distributed forwards so drift hits both alike. Tables: (1) median latency of
`tenzro_moeForward` on the router (client wall clock, and the worker's `stats.elapsed_ms`,
which leaves out the JSON-RPC/base64 edge) for 64 and 512 tokens with f32 and Q8_0 on the wire,
as a ratio to the local forward (target <= 1.5x at 512 tokens), with the relative error of the
output; (2) wire bytes per token from `stats.bytes_sent + bytes_received` (target: Q8_0 >= 3.5x
fewer); (3) one holder's `moe/execute` for 64 KB, 1 MB and 4 MB of f32 rows over QUIC
(core.transport.pool.QuicPool, pinned) and over the HTTP peer path (`POST /peer/moe/execute`,
one raw frame, one keep-alive client), beside the same rows' compute (in this process, and the
`compute_ms` the holder reports) and an in-process QUIC echo of the same bytes (the library and
adapter alone, with the node's QUIC settings and with those before tuning: aioquic, 1,350-byte
datagrams, the kernel's socket buffers), target: QUIC at least matches HTTP at 1 MB; (4) the
per-call transport overhead of a 1-row `moe/execute` over one pooled QUIC connection at 1 and
64 concurrent calls (per-call time minus the holder's compute) beside the 0.27 ms per call a C
peer (lumabri) reports on localhost; (5) hivemind's RemoteMixtureOfExperts configuration
(d_model 1024, d_ff 4096, 16 experts, 4 per holder, top-2, 64 tokens) beside its reported
303-332 ms. The holders' per-peer limits (TENZRO_PEER_MAX_STREAMS, TENZRO_PEER_RATE_PER_S,
TENZRO_PEER_BURST, TENZRO_PEER_MAX_STREAMS_PER_PEER) are raised through their environment so that
neither the 64-call burst nor the forwards are refused. Every latency is a median; all processes
share this machine's cores, so the distributed compute competes with the transport exactly as it
would on one host.

`--nodes-from DIR` runs the nodes from another checkout (a worktree with a candidate fix in
apps/) while this process's reference, clients and echo servers stay on this one.
"""

from __future__ import annotations

import os

# As the node's supervisor does for its children (apps/node/supervisor.py): OpenBLAS threads
# that spin after each call would starve the node processes sharing these cores.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import base64
import contextlib
import importlib.metadata
import json
import shutil
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from apps.node.identity import CERT_FILE, CERT_KEY_FILE
from core.experts.runtime import ExpertRuntime
from core.formats.expert_payload import encode_expert_payload
from core.formats.gate_payload import encode_gate_payload
from core.transport.framing import FRAME_CONTENT_TYPE, FrameDecoder, Reply, request_frame
from core.transport.pool import QuicPool
from core.transport.quic import QuicSettings, quic_connection, start_server
from testkit.nodes import TOKEN, NodeProcess, free_port
from testkit.redis_server import RedisNode, private_redis

from .report import headline, print_table, write_results

N_HOLDERS = 4


@dataclass(frozen=True)
class Layer:
    model_id: str
    d_model: int
    d_ff: int
    n_routed: int
    top_k: int


QWEN = Layer("bench/qwen3-30b-a3b-layer", 2048, 768, 128, 8)
HIVE = Layer("bench/hivemind-rmoe-layer", 1024, 4096, 16, 2)
# One expert of Qwen3's d_model with a tiny d_ff, on holder 0 only: its compute is microseconds, so a
# 1-row call through it is nearly all transport (table 4), whatever the load on this machine.
PROBE = Layer("bench/overhead-probe", 2048, 32, 1, 1)
HIVEMIND_REPORTED_MS = (303.0, 332.0)  # RemoteMixtureOfExperts forward, 64 tokens, top-2, 4 servers
LUMABRI_CALL_MS = 0.27  # a C peer's per-call overhead on localhost, as it reports
QUIC_ROWS = (8, 128, 512)  # f32 rows of d_model 2048: 64 KB, 1 MB, 4 MB
MAX_BODY = 64 << 20
# Echo servers of table 3: the QUIC settings every node runs with (QuicSettings' defaults), and
# those before the transport was tuned (what the forward first shipped with).
ECHO_SETTINGS = {"node": {}, "untuned": {"library": "aioquic", "max_datagram_size": 1350, "socket_buffer_bytes": 0}}
NODE_ENV = {
    # Gossip fast enough that five nodes converge in seconds, slow enough to stay quiet while timing.
    "TENZRO_GOSSIP_INTERVAL_S": "2", "TENZRO_GOSSIP_HEARTBEAT_S": "5", "TENZRO_GOSSIP_TTL_S": "60",
    "TENZRO_REACHABILITY_CHECK_S": "120",
    # Raised for the benchmark: 64 concurrent streams on one connection (default 32) and thousands
    # of calls in a few seconds (default 200/s, burst 400) are what tables 3-4 measure.
    "TENZRO_PEER_MAX_STREAMS": "256", "TENZRO_PEER_RATE_PER_S": "1000000", "TENZRO_PEER_BURST": "1000000",
    # every node of the benchmark is on 127.0.0.1: one peer to each other (docs/security.md)
    "TENZRO_PEER_MAX_STREAMS_PER_PEER": "4096",
    "TENZRO_MEMORY_BUDGET_BYTES": str(8 << 30),  # every expert stays Warm (five nodes start at once)
    "TENZRO_WORKER_TIMEOUT_S": "120",
}


# -- payloads and nodes ---------------------------------------------------------------------------


def write_layer(layer: Layer, root: Path, rng: np.random.Generator) -> tuple[Path, list[Path]]:
    """Gate and expert payload files (f32, trained-like scales ~1/sqrt(fan_in)) under root."""
    root.mkdir(parents=True, exist_ok=True)
    gate = (rng.standard_normal((layer.n_routed, layer.d_model), dtype=np.float32) / np.sqrt(layer.d_model))
    gate_path = root / "gate.safetensors"
    gate_path.write_bytes(encode_gate_payload(model_id=layer.model_id, layer=0, weight=gate, router="softmax",
                                              top_k=layer.top_k, norm_topk_prob=True))
    paths = []
    for e in range(layer.n_routed):
        def w(rows: int, cols: int) -> np.ndarray:
            return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(1 / np.sqrt(cols))

        payload = encode_expert_payload(gate=w(layer.d_ff, layer.d_model), up=w(layer.d_ff, layer.d_model),
                                        down=w(layer.d_model, layer.d_ff), quant=None, model_id=layer.model_id,
                                        layer=0, expert=e)
        path = root / f"expert{e}.safetensors"
        path.write_bytes(payload)
        paths.append(path)
    return gate_path, paths


def local_runtime(layers: dict[Layer, tuple[Path, list[Path]]], data_dir: Path) -> ExpertRuntime:
    """The single-process reference: every expert of every layer in this process (files linked)."""
    runtime = ExpertRuntime(data_dir=data_dir, memory_budget_bytes=16 << 30)
    for gate, experts in layers.values():
        runtime.gate_load(payload=gate.read_bytes(), stored_at=gate)
        for path in experts:
            runtime.expert_load(payload=path.read_bytes(), stored_at=path)
    return runtime


def start_nodes(work: Path, redis_host: str, source_root: Path | None) -> list[NodeProcess]:
    """Router first, then the holders, on databases 1-5 of a Redis server of their own (the shared
    one's databases belong to whatever e2e tests run at the same time); started in parallel."""
    router = RedisNode(data_dir=work / "router", redis_db=1, redis_host=redis_host, source_root=source_root)
    holders = [RedisNode(data_dir=work / f"holder{i}", redis_db=2 + i, redis_host=redis_host, peers=[router.url],
                         source_root=source_root) for i in range(N_HOLDERS)]
    nodes = [router, *holders]
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda n: n.start(**NODE_ENV), nodes))
    return nodes


def holders_of(expert: int, replication: int) -> list[int]:
    return [(expert + j) % N_HOLDERS for j in range(replication)]


def load(nodes: list[NodeProcess], layers: dict[Layer, tuple[Path, list[Path]]], replication: dict[Layer, int]) -> None:
    """Gates on the router; expert e of a layer on holders_of(e); each node loads in its own thread."""
    router, holders = nodes[0], nodes[1:]
    work: dict[int, list[Path]] = {i: [] for i in range(N_HOLDERS)}
    for layer, (gate, experts) in layers.items():
        router.result("tenzro_moeGateLoad", {"path": str(gate)}, token=TOKEN)
        for e, path in enumerate(experts):
            for i in holders_of(e, replication[layer]):
                work[i].append(path)

    def load_all(i: int) -> None:
        for path in work[i]:
            answer = holders[i].rpc("tenzro_moeExpertLoad", {"path": str(path)}, token=TOKEN, timeout=120)
            assert "result" in answer, answer

    with ThreadPoolExecutor(N_HOLDERS) as pool:
        list(pool.map(load_all, range(N_HOLDERS)))


def wait_converged(router: NodeProcess, replication: dict[Layer, int], timeout_s: float = 180.0) -> float:
    """Seconds until the router sees every expert at its replication, each holder with a QUIC door."""
    started = time.monotonic()
    last: Any = None
    while time.monotonic() - started < timeout_s:
        ok = True
        for layer, r in replication.items():
            shard = router.result("tenzro_moeShardMap", {"model_id": layer.model_id})["holders"]
            last = f"{layer.model_id}: {len(shard)} experts seen"
            if len(shard) != layer.n_routed or any(
                    len(e["holders"]) != r or not all(h["quic_endpoint"] for h in e["holders"]) for e in shard):
                ok = False
                break
        if ok:
            return time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(f"the router did not see every holding within {timeout_s} s ({last})")


# -- table 1, 2, 5: the forward ---------------------------------------------------------------------


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


class Forwarder:
    """tenzro_moeForward on the router over one keep-alive client; the body is built before timing."""

    def __init__(self, router: NodeProcess, client: httpx.Client) -> None:
        self.router = router
        self.client = client

    def body(self, layer: Layer, hidden: np.ndarray, wire: str) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeForward", "params": {
            "model_id": layer.model_id, "d_model": layer.d_model, "hidden": base64.b64encode(hidden.tobytes()).decode(),
            "wire": wire}}).encode()

    def __call__(self, layer: Layer, body: bytes) -> tuple[float, dict[str, Any], np.ndarray]:
        """(client seconds, stats, output rows)."""
        start = time.perf_counter()
        response = self.client.post(f"{self.router.url}/rpc", content=body,
                                    headers={"Content-Type": "application/json"})
        elapsed = time.perf_counter() - start
        answer = response.json()
        assert "result" in answer, str(answer)[:500]
        result = answer["result"]
        out = np.frombuffer(base64.b64decode(result["output"]), dtype="<f4").reshape(result["tokens"], layer.d_model)
        return elapsed, result["stats"], out


@dataclass
class ForwardRuns:
    client_s: list[float]
    elapsed_ms: list[float]
    stats: list[dict[str, Any]]
    error: float

    def summary(self) -> dict[str, Any]:
        last = self.stats[-1]
        return {
            "client_ms": statistics.median(self.client_s) * 1e3,
            "elapsed_ms": statistics.median(self.elapsed_ms),
            "dispatch_ms": statistics.median(s["dispatch_ms"] for s in self.stats),
            "gate_plan_ms": statistics.median(s["elapsed_ms"] - s["dispatch_ms"] for s in self.stats),
            "bytes": last["bytes_sent"] + last["bytes_received"],
            "hedges_fired": sum(s["hedges_fired"] for s in self.stats),
            "hedges_won": sum(s["hedges_won"] for s in self.stats),
            "retries": sum(s["retries"] for s in self.stats),
            "failures": sum(len(s["failures"]) for s in self.stats),
            "batches": last["batches"],
            "transports": sorted({h["transport"] for s in self.stats for h in s["holders"]}),
            # per batch: a holder's latency and its wire share (latency - reported compute), medians
            "batch_latency_ms": _median_of(h.get("latency_ms_median") for s in self.stats for h in s["holders"]),
            "batch_overhead_ms": _median_of(h.get("overhead_ms_median") for s in self.stats for h in s["holders"]),
            "rows_by_holder": _rows_by_holder(self.stats),
            "rel_error": self.error,
            "runs": len(self.client_s),
        }


def _median_of(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _rows_by_holder(stats: list[dict[str, Any]]) -> dict[str, int]:
    """Rows each holder served over the runs (provider ids shortened), most first."""
    rows: dict[str, int] = {}
    for s in stats:
        for h in s["holders"]:
            rows[h["provider"][:12]] = rows.get(h["provider"][:12], 0) + h["rows"]
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]))


def time_forwards(forward: Forwarder, runtime: ExpertRuntime, layer: Layer, tokens: int, wires: tuple[str, ...],
                  repeats: int, warmup: int, rng: np.random.Generator) -> tuple[list[float], dict[str, ForwardRuns]]:
    """Local and distributed forwards of the same rows, interleaved; (local seconds, runs per wire)."""
    hidden = rng.standard_normal((tokens, layer.d_model), dtype=np.float32)
    want = runtime.forward_local(model_id=layer.model_id, layer=0, hidden=hidden)
    bodies = {wire: forward.body(layer, hidden, wire) for wire in wires}
    runs = {wire: ForwardRuns([], [], [], 0.0) for wire in wires}
    for wire in wires:  # warm: connections, the hedging book's per-holder latencies
        for _ in range(warmup):
            _, _, out = forward(layer, bodies[wire])
        runs[wire].error = rel_error(out, want)
    local = []
    for _ in range(repeats):
        start = time.perf_counter()
        runtime.forward_local(model_id=layer.model_id, layer=0, hidden=hidden)
        local.append(time.perf_counter() - start)
        for wire in wires:
            seconds, stats, out = forward(layer, bodies[wire])
            runs[wire].client_s.append(seconds)
            runs[wire].elapsed_ms.append(stats["elapsed_ms"])
            runs[wire].stats.append(stats)
            runs[wire].error = max(runs[wire].error, rel_error(out, want))
    return local, runs


# -- table 3, 4: one holder's moe/execute -------------------------------------------------------------


def execute_params(layer: Layer, expert: int, rows: int) -> dict[str, Any]:
    return {"model_id": layer.model_id, "layer": 0, "expert": expert, "d_model": layer.d_model, "tokens": rows,
            "encoding": "f32"}


class ExecuteProbe:
    """Every way of running one batch through one holder's expert, each timed by one call, so that a
    loop can take turns between them (drift on this shared machine hits all alike):

    * compute: ExpertRuntime.execute of the rows in this process (alone, or `concurrency` 1-row
      calls through the holder's 2 compute threads);
    * quic: `moe/execute` over core.transport.pool.QuicPool, pinned, one connection;
    * http: `POST /peer/moe/execute` with one raw request frame over one keep-alive httpx client;
    * echo: the same body echoed by an in-process server of the same QUIC adapter
      (core.transport.quic), the library alone, with each of ECHO_SETTINGS.
    """

    def __init__(self, holder: NodeProcess, pin: str, runtime: ExpertRuntime) -> None:
        self.holder, self.pin, self.runtime = holder, pin, runtime
        # QuicPool's own default of 32 streams in flight per connection, as the forward's pool: above
        # about 48, qh3 raises ValueError("Bidirectional stream limit … exceeded") when the calls outrun
        # the peer's stream credit, instead of waiting for it.
        self.pool = QuicPool(QuicSettings(max_body=MAX_BODY))
        self.http = httpx.AsyncClient(timeout=120)
        self.threads = ThreadPoolExecutor(2)  # TENZRO_COMPUTE_THREADS' default, which the holders run with
        self._echo_stack = contextlib.AsyncExitStack()
        self.echo: dict[str, Any] = {}

    async def __aenter__(self) -> ExecuteProbe:
        async def echo(request: Any) -> Reply:
            return Reply.ok({}, bytes(request.body))

        for name, knobs in ECHO_SETTINGS.items():
            settings = QuicSettings(max_body=MAX_BODY, **knobs)
            port = free_port(socket.SOCK_DGRAM)
            server = await start_server(host="127.0.0.1", port=port, cert_path=str(self.holder.data_dir / CERT_FILE),
                                        key_path=str(self.holder.data_dir / CERT_KEY_FILE), handler=echo,
                                        settings=settings)
            self._echo_stack.callback(server.close)
            self.echo[name] = await self._echo_stack.enter_async_context(
                quic_connection(host="127.0.0.1", port=port, pin_sha256=self.pin, settings=settings))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._echo_stack.aclose()
        await self.pool.close()
        await self.http.aclose()
        self.threads.shutdown()

    def compute(self, layer: Layer, hidden: np.ndarray, concurrency: int = 1) -> float:
        """Seconds per call: one execute, or `concurrency` of them through 2 threads (wall / calls)."""
        def run(_: int) -> np.ndarray:
            return self.runtime.execute(model_id=layer.model_id, layer=0, expert=0, hidden=hidden)

        start = time.perf_counter()
        if concurrency == 1:
            run(0)
        else:
            list(self.threads.map(run, range(concurrency)))
        return (time.perf_counter() - start) / concurrency

    async def quic(self, layer: Layer, body: bytes, rows: int, concurrency: int = 1) -> tuple[float, int, float]:
        """(seconds per call, request + response body bytes of one call, the holder's summed compute
        seconds as its answers report them)."""
        call = {"host": "127.0.0.1", "port": self.holder.quic_port, "pin_sha256": self.pin, "method": "moe/execute",
                "params": execute_params(layer, 0, rows), "body": body, "timeout_s": 60.0}
        start = time.perf_counter()
        answers = await asyncio.gather(*(self.pool.call(**call) for _ in range(concurrency)))
        elapsed = (time.perf_counter() - start) / concurrency
        assert all(len(out) == len(body) for _, out in answers)
        return elapsed, len(body) + len(answers[0][1]), sum(holder_compute_s(result) for result, _ in answers)

    async def http_call(self, layer: Layer, body: bytes, rows: int) -> tuple[float, int]:
        """(seconds, request + response bytes), the frames included."""
        frame = request_frame("moe/execute", execute_params(layer, 0, rows), body)
        start = time.perf_counter()
        response = await self.http.post(f"{self.holder.url}/peer/moe/execute", content=frame,
                                        headers={"Content-Type": FRAME_CONTENT_TYPE})
        answer = response.content
        elapsed = time.perf_counter() - start
        assert response.status_code == 200, answer[:300]
        frames = FrameDecoder(max_body=MAX_BODY).feed(answer)
        assert frames[0].header["ok"] and len(frames[0].body) == len(body), frames[0].header
        return elapsed, len(frame) + len(answer)

    async def echo_call(self, body: bytes, name: str) -> float:
        start = time.perf_counter()
        _, out = await self.echo[name].call("echo", {}, body, timeout_s=60)
        elapsed = time.perf_counter() - start
        assert len(out) == len(body)
        return elapsed


def holder_compute_s(result: dict[str, Any]) -> float:
    """The compute time a holder's moe/execute answer reports (`compute_ms`; 0 from a node without it)."""
    value = result.get("compute_ms")
    return float(value) / 1e3 if isinstance(value, int | float) else 0.0


async def probe_execute(probe: ExecuteProbe, rows: int, repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    """Table 3's row for `rows` through expert 0 of the Qwen3 layer: medians of compute (in this
    process, and as the holder reports it over QUIC), QUIC, HTTP and both echoes, taking turns."""
    hidden = rng.standard_normal((rows, QWEN.d_model), dtype=np.float32)
    body = hidden.tobytes()
    samples: dict[str, list[float]] = {k: [] for k in ("compute", "holder_compute", "quic", "http", "echo_node",
                                                      "echo_untuned")}
    for i in range(repeats + 1):  # the first round warms everything
        compute = probe.compute(QWEN, hidden)
        quic, quic_bytes, holder_compute = await probe.quic(QWEN, body, rows)
        http, http_bytes = await probe.http_call(QWEN, body, rows)
        echo_node = await probe.echo_call(body, "node")
        echo_untuned = await probe.echo_call(body, "untuned")
        if i:
            for key, value in zip(samples, (compute, holder_compute, quic, http, echo_node, echo_untuned), strict=True):
                samples[key].append(value)
    med = {f"{k}_ms": statistics.median(v) * 1e3 for k, v in samples.items()}
    return {"rows": rows, "request_bytes": len(body), **med, "quic_bytes": quic_bytes, "http_bytes": http_bytes,
            "quic_mb_s": quic_bytes / med["quic_ms"] / 1e3, "http_mb_s": http_bytes / med["http_ms"] / 1e3}


async def probe_call_overhead(probe: ExecuteProbe, rounds: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Table 4: 1-row calls alone and 64 at once on one connection, taking turns with the same calls
    in this process; through a Qwen3 expert, and through PROBE, whose compute is too small to blur
    the difference. The holder's share of a call is the compute its answers report, spread over its
    2 compute threads when 64 calls are in flight."""
    out = []
    for layer in (QWEN, PROBE):
        hidden = rng.standard_normal((1, layer.d_model), dtype=np.float32)
        body = hidden.tobytes()
        for concurrency in (1, 64):
            calls, holder, local = [], [], []
            for i in range(rounds + 1):
                compute = probe.compute(layer, hidden, concurrency)
                call, _, reported = await probe.quic(layer, body, 1, concurrency)
                if i:
                    calls.append(call)
                    holder.append(reported / concurrency / min(concurrency, 2))
                    local.append(compute)
            per_call, compute = statistics.median(calls), statistics.median(holder)
            out.append({"expert": f"{layer.model_id} (d_ff {layer.d_ff})", "concurrency": concurrency,
                        "per_call_ms": per_call * 1e3, "holder_compute_ms": compute * 1e3,
                        "local_compute_ms": statistics.median(local) * 1e3, "overhead_ms": (per_call - compute) * 1e3})
    return out


# -- main -----------------------------------------------------------------------------------------------


def met(ok: bool) -> str:
    return "met" if ok else "not met"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def quic_facts(settings: QuicSettings) -> str:
    """Library, datagram size on loopback, windows and socket buffers of one QuicSettings."""
    d = settings.describe()
    return (f"{d['library']}, datagrams {settings.datagram_size_on('127.0.0.1')} B on loopback "
            f"(max_datagram_size {d['max_datagram_size']}), windows {d['connection_window'] >> 20}/"
            f"{d['stream_window'] >> 20} MiB, socket buffers {d['socket_buffer_bytes'] or 'kernel default'}")


def variants(runtime: ExpertRuntime, router: NodeProcess, nodes_from: Path | None) -> dict[str, Any]:
    """Which compute kernel and QUIC library ran, here and on the nodes."""
    status = router.result("tenzro_moeExpertStatus", {"live": True})
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    return {
        "local backend": f"{runtime.backend.name} (cpu kernel {runtime.backend.cpu_kernel})",
        "node backend": f"{status['backend']} (cpu kernel {status['cpu_kernel']})",
        "f32 matmul": f"numpy {np.__version__}, BLAS {blas.get('name', '?')} {blas.get('version', '')}".strip(),
        # The nodes run QuicSettings' defaults (read from the same environment as this process).
        "QUIC (nodes and pool)": quic_facts(QuicSettings(max_body=MAX_BODY)),
        "QUIC (echo before tuning)": quic_facts(QuicSettings(max_body=MAX_BODY, **ECHO_SETTINGS["untuned"])),
        "nodes run from": str(nodes_from) if nodes_from else "this checkout",
        "HTTP client / server": f"httpx {importlib.metadata.version('httpx')} / uvicorn "
                                f"{importlib.metadata.version('uvicorn')}",
        "cores": os.cpu_count(),
        "load average (1, 5, 15 min) at start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


@dataclass(frozen=True)
class Plan:
    quick: bool
    replication: dict[Layer, int]
    repeats: dict[int, int]  # forwards timed per token count
    warmup: int
    io_repeats: dict[int, int]  # moe/execute calls timed per row count
    rounds: int  # rounds of the per-call overhead
    nodes_from: Path | None = None

    @classmethod
    def of(cls, quick: bool, replication: int, nodes_from: Path | None) -> Plan:
        layers = {QWEN: replication, HIVE: 1, PROBE: 1}
        if quick:
            return cls(True, layers, {64: 5, 512: 3}, 1, {8: 5, 128: 5, 512: 3}, 5, nodes_from)
        return cls(False, layers, {64: 15, 512: 9}, 1, {8: 15, 128: 11, 512: 7}, 15, nodes_from)


def table_forward(forward: Forwarder, runtime: ExpertRuntime, plan: Plan, rng: np.random.Generator) -> dict[str, Any]:
    """Tables 1 and 2: the Qwen3 layer, distributed against local, and its wire bytes."""
    rows1, rows2, record = [], [], []
    for tokens in (64, 512):
        local, runs = time_forwards(forward, runtime, QWEN, tokens, ("f32", "q8_0"), plan.repeats[tokens],
                                    plan.warmup, rng)
        local_ms = statistics.median(local) * 1e3
        for wire, run in runs.items():
            s = run.summary()
            ratio, ratio_worker = s["client_ms"] / local_ms, s["elapsed_ms"] / local_ms
            err_ok = f" ({met(s['rel_error'] < 1e-5)} <1e-5)" if wire == "f32" else ""
            shares = list(s["rows_by_holder"].values())
            balance = f"{max(shares) / max(1, min(shares)):.1f}" if len(shares) == N_HOLDERS else f"{len(shares)} used"
            rows1.append([tokens, wire, local_ms, s["client_ms"], s["elapsed_ms"], s["gate_plan_ms"], s["dispatch_ms"],
                          f"{ratio:.2f}x", f"{ratio_worker:.2f}x", "≤1.5x" if tokens == 512 else "-",
                          met(ratio <= 1.5) if tokens == 512 else "-", f"{s['rel_error']:.2e}{err_ok}",
                          f"{s['hedges_fired']}/{s['hedges_won']}", s["retries"], s["batches"],
                          _fmt(s["batch_latency_ms"]), _fmt(s["batch_overhead_ms"]),
                          balance,
                          "+".join(s["transports"])])
            record.append({"tokens": tokens, "wire": wire, "local_ms": local_ms,
                           "local_samples_ms": [x * 1e3 for x in local], **s})
        f32_b, q8_b = (runs[w].summary()["bytes"] / tokens for w in ("f32", "q8_0"))
        rows2.append([tokens, f32_b, q8_b, f"{f32_b / q8_b:.2f}x", "≥3.5x", met(f32_b / q8_b >= 3.5),
                      QWEN.top_k * 2 * QWEN.d_model * 4])
    print_table(
        f"1. Distributed vs local forward, Qwen3-30B-A3B layer ({QWEN.n_routed} experts, top-{QWEN.top_k} softmax, "
        f"d_model {QWEN.d_model}, d_ff {QWEN.d_ff}, f32 experts): router holds only the gate, {N_HOLDERS} holders "
        f"at replication {plan.replication[QWEN]}; median ms over {plan.repeats[64]} / {plan.repeats[512]} runs "
        "(hedges and retries summed over them; batch latency and wire share: medians of the holders' "
        "latency_ms_median and overhead_ms_median)",
        ["tokens", "wire", "local", "distributed (client)", "stats.elapsed", "gate+plan", "dispatch", "client/local",
         "elapsed/local", "target", "met", "rel error (max)", "hedges fired/won", "retries", "batches",
         "batch latency", "batch wire share", "rows max/min holder", "transport"],
        rows1)
    print_table("2. Wire bytes per token: (stats.bytes_sent + bytes_received) / tokens",
                ["tokens", "f32 B/token", "q8_0 B/token", "f32/q8_0", "target", "met",
                 "f32 expected (top_k·2·d_model·4)"], rows2)
    return {"forward": record, "bytes_per_token": rows2}


def table_execute(holder: NodeProcess, runtime: ExpertRuntime, plan: Plan, rng: np.random.Generator) -> dict[str, Any]:
    """Tables 3 and 4: one holder's moe/execute over QUIC and HTTP, and the per-call overhead."""
    pin = holder.result("tenzro_nodeInfo")["endpoints"]["quic_cert_sha256"]

    async def probe_all() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with ExecuteProbe(holder, pin, runtime) as probe:  # expert 0: holders_of(0) starts at holder 0
            execute = [await probe_execute(probe, n, plan.io_repeats[n], rng) for n in QUIC_ROWS]
            return execute, await probe_call_overhead(probe, plan.rounds, rng)

    execute, overhead = asyncio.run(probe_all())
    rows = []
    for r in execute:
        q, h, c = r["quic_ms"], r["http_ms"], r["holder_compute_ms"]
        rows.append([r["rows"], r["request_bytes"] / 1e6, r["compute_ms"], c, q, h, r["quic_mb_s"], r["http_mb_s"],
                     f"{q / h:.2f}x", f"{(q - c) / q:.0%}", f"{(h - c) / h:.0%}", r["echo_node_ms"],
                     r["echo_untuned_ms"], met(q <= h) if r["rows"] == 128 else "-"])
    print_table(
        f"3. moe/execute on one holder (f32 rows of d_model {QWEN.d_model}): QUIC (QuicPool, pinned) vs HTTP "
        "(POST /peer/moe/execute, one raw frame, keep-alive); median ms, MB/s of request+response bytes; "
        "compute here (ExpertRuntime.execute) and as the holder reports it (compute_ms); transport share = "
        "1 - holder compute / latency; echo = the same body echoed by an in-process server of the same QUIC "
        "adapter (the library alone)",
        ["rows", "MB in", "compute here", "holder compute", "QUIC", "HTTP", "QUIC MB/s", "HTTP MB/s", "QUIC/HTTP",
         "transport share QUIC", "transport share HTTP", "echo (node's settings)",
         "echo (aioquic, 1350 B, kernel bufs)", "QUIC ≤ HTTP at 1 MB"], rows)
    print_table(
        "4. Transport overhead per remote expert call: 1-row moe/execute over one pooled QUIC connection (64 calls "
        "gathered: QuicPool keeps 32 of them in flight per connection); per call = wall / calls; holder compute = "
        "the compute_ms its answers report (64 calls: summed, over its 2 compute threads, per call); overhead = "
        "per call - holder compute",
        ["expert", "concurrent calls", "per call ms", "holder compute ms", "compute here ms", "overhead ms",
         "lumabri (C) ms", "overhead/lumabri"],
        [[r["expert"], r["concurrency"], r["per_call_ms"], r["holder_compute_ms"], r["local_compute_ms"],
          r["overhead_ms"], LUMABRI_CALL_MS, f"{r['overhead_ms'] / LUMABRI_CALL_MS:.1f}x"] for r in overhead])
    return {"quic_vs_http": execute, "call_overhead": overhead}


def table_hivemind(forward: Forwarder, runtime: ExpertRuntime, plan: Plan, rng: np.random.Generator) -> dict[str, Any]:
    """Table 5: hivemind's RemoteMixtureOfExperts configuration."""
    local, runs = time_forwards(forward, runtime, HIVE, 64, ("q8_0", "f32"), plan.repeats[64], plan.warmup, rng)
    local_ms = statistics.median(local) * 1e3
    low, high = HIVEMIND_REPORTED_MS
    rows, record = [], []
    for wire, run in runs.items():
        s = run.summary()
        rows.append([wire, local_ms, s["client_ms"], s["elapsed_ms"], f"{s['client_ms'] / local_ms:.2f}x",
                     f"{low:.0f}-{high:.0f}", f"{s['client_ms'] / low:.2f}x", f"{s['rel_error']:.2e}",
                     f"{s['hedges_fired']}/{s['hedges_won']}"])
        record.append({"wire": wire, "local_ms": local_ms, **s})
    print_table(
        f"5. hivemind RemoteMixtureOfExperts configuration: d_model {HIVE.d_model}, d_ff {HIVE.d_ff}, "
        f"{HIVE.n_routed} experts ({HIVE.n_routed // N_HOLDERS} per holder, replication 1), top-{HIVE.top_k}, "
        "64 tokens; median ms",
        ["wire", "local", "distributed (client)", "stats.elapsed", "client/local", "hivemind reported ms",
         "client/hivemind low", "rel error (max)", "hedges fired/won"], rows)
    return {"hivemind_config": record}


def run(plan: Plan, work: Path, redis_host: str, nodes: list[NodeProcess]) -> dict[str, Any]:
    """Set up (payloads, nodes, loads, convergence), then every table; `nodes` is filled as they start."""
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"quick": plan.quick, "nodes_from": str(plan.nodes_from) if plan.nodes_from else None,
                               "replication": {layer.model_id: r for layer, r in plan.replication.items()},
                               "router": "a node holding only the gates (every pair crosses the wire)"}
    t0 = time.monotonic()
    layers = {layer: write_layer(layer, work / "payloads" / layer.model_id.replace("/", "_"), rng)
              for layer in (QWEN, HIVE, PROBE)}
    t_payloads = time.monotonic()
    nodes.extend(start_nodes(work, redis_host, plan.nodes_from))
    router, holders = nodes[0], nodes[1:]
    t_started = time.monotonic()
    load(nodes, layers, plan.replication)
    t_loaded = time.monotonic()
    runtime = local_runtime(layers, work / "local")
    converged = wait_converged(router, plan.replication)
    setup = {"payloads_s": t_payloads - t0, "nodes_started_s": t_started - t_payloads,
             "loaded_s": t_loaded - t_started, "converged_after_s": converged}
    n_loads = sum(layer.n_routed * r for layer, r in plan.replication.items())
    print(f"setup: payloads {setup['payloads_s']:.0f} s, {len(nodes)} nodes started {setup['nodes_started_s']:.0f} s, "
          f"{n_loads} expert loads {setup['loaded_s']:.0f} s, every holding seen by the router {converged:.0f} s later")
    facts = variants(runtime, router, plan.nodes_from)
    print_table("Variants that ran", ["what", "value"], [[k, v] for k, v in facts.items()])
    results.update(setup=setup, variants=facts)
    drops = []
    with httpx.Client(timeout=300) as client:
        forward = Forwarder(router, client)
        for name, table in (("1-2", lambda: table_forward(forward, runtime, plan, rng)),
                            ("3-4", lambda: table_execute(holders[0], runtime, plan, rng)),
                            ("5", lambda: table_hivemind(forward, runtime, plan, rng))):
            before = udp_rcvbuf_errors()
            results.update(table())
            after = udp_rcvbuf_errors()
            drops.append([name, "-" if before is None or after is None else after - before])
    print_table("UDP datagrams dropped for a full receive buffer during each table (RcvbufErrors of "
                "/proc/net/snmp: the whole machine's, other processes' included)", ["tables", "drops"], drops)
    results["udp_rcvbuf_drops"] = dict(drops)
    results["load_average_at_end"] = os.getloadavg()
    print(f"\nload average (1, 5, 15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return results


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures `make bench`'s summary shows: 512-token latency against local, and wire bytes."""
    out = [headline(f"distributed forward, {r['tokens']} tokens, {r['wire']} wire (client)", r["client_ms"], "ms",
                    reference="forward_local in one process", reference_value=r["local_ms"],
                    target="≤ 1.5× local" if r["tokens"] == 512 else "—") for r in results["forward"]]
    out += [headline(f"wire bytes per token, {row[0]} tokens, q8_0", row[2], "B", reference="f32 on the wire",
                     reference_value=row[1], target="≤ 1/3.5 of f32") for row in results["bytes_per_token"]]
    return out


def udp_rcvbuf_errors() -> int | None:
    """The kernel's count of UDP datagrams dropped because a socket's receive buffer was full."""
    try:
        lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Udp:")]
        return int(lines[1][lines[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--replication", type=int, choices=(1, 2), default=2,
                        help="holders per expert of the Qwen3 layer (default 2, the policy's min_replication)")
    parser.add_argument("--nodes-from", type=Path, default=None,
                        help="run the nodes from this checkout (e.g. a worktree with a candidate fix)")
    args = parser.parse_args()
    plan = Plan.of(args.quick, args.replication, args.nodes_from.resolve() if args.nodes_from else None)
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-forward-"))
    nodes: list[NodeProcess] = []
    try:
        with private_redis() as redis_host:
            try:
                results = run(plan, work, redis_host, nodes)
                write_results("forward", results, headlines(results))
            finally:
                with ThreadPoolExecutor(max(1, len(nodes))) as pool:
                    list(pool.map(_stop, nodes))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stop(node: NodeProcess) -> None:
    try:
        node.stop()
    except Exception as exc:  # a node that would not stop was killed; report it, keep cleaning up
        print(f"node {node.url} did not stop cleanly: {exc}")


if __name__ == "__main__":
    main()
