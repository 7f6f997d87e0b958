"""The floor of a distributed decode on this machine: bench/generate.py's model and holders over plain
loopback TCP, then with the node's stack added a part at a time, against one process.

    .venv/bin/python -m bench.wire_floor [--quick] [--holders 1,4] [--ways tcp,...,nodes] [--profile]

bench/generate.py's targets (network + dispatch ≤ 2 ms per MoE layer, decode ≥ 0.6x one process) are
set against one process. Five node processes share this machine's cores, so part of what they miss is
the machine's, and part is the node's stack. This benchmark measures the machine's part, then adds the
node's stack a part at a time: the event loops, the QUIC transport, the codec and receipts, the nodes as
holders. What is left between the last of these and bench/generate.py is the node's router (the planner
and the forward's engine, the ledger, the generation's records).

What is measured, and how. The same 2x128 model as bench/generate.py (bench/_generate_model.py: two MoE
layers of Qwen3-30B-A3B's 128 experts, Q8_0, top-8, the LM head at its real share) and the same split:
N holders (`--holders`, 1 and 4 by default), expert e of each layer on holder e % N. The holders of the
first four ways are processes of this benchmark (bench/_floor_holders.py), each an ExpertRuntime with
the same C kernels and worker pool as a node's. The router is this process: the dense part and the gates
(WholeModel); for each MoE layer it gates, asks every holder for its experts' (expert, token rows) in one
request carrying the layer's rows (f32 unless said), and combines the answers. Five ways (`--ways`),
each on holders of its own, each adding one part of a node's stack:

* `tcp`: plain loopback TCP (TCP_NODELAY, a 4-byte length and a pickle), blocking sockets on the
  router's own thread: every request sent, then each answer read in turn. No event loop, no QUIC: the
  processes, the loopback and the cores they share, and nothing else.
* `asyncio`: the same frames on asyncio streams: each holder an asyncio server computing on its event
  loop, the router's requests on an event loop in a thread of its own, to which each layer is handed from
  the dense part's thread (the two hops a node's router makes), every request in flight at once.
* `quic`: the node's own transport with its default settings: each holder a QUIC door
  (core.transport.quic_server, computing on its event loop as a node computes a decode frame), the
  router the node's client (core.transport.pool.QuicPool) on an event loop in a thread of its own, to
  which each layer is handed from the dense part's thread, as a node's router does. No codec, receipt,
  planner or record.
* `quic+receipts`: `quic` with the node's payload: the rows in and out as Q8_0 (the wire's default codec,
  each answer encoded in one call) and one v2 receipt per answer (top-16 sketches, ed25519), signed by the
  holder and verified against the rows by the router, as nodes do.
* `nodes`: `quic+receipts` against real nodes as holders (`tenzro node run`, with bench/generate.py's
  settings, on a redis-server of their own, with no peers to gossip with), asked with moe/execute's
  multi-expert frame as a node's router asks (docs/protocol.md, "Multi-expert execute"). Between this and
  bench/generate.py, the router differs, and bench/generate.py's holders gossip with it.

The reference is the same model in this process with every expert (bench/_generate_model.Local), the
generations interleaved with it so drift hits both alike, `max_new` tokens after a 32-token prompt.
Figures as bench/generate.py defines them: TTFT (the prefill), decode tokens/s, router dense ms per
token (a step less its MoE layers), and per MoE layer of a decode step: the slowest holder's compute
(the time its execute_carrier took, or the compute_ms a node reported: the critical path if the holders
ran side by side) and network + dispatch, the rest of the layer's wall time (gate, the requests, the
holders' wake-up and queueing, the answers, the combine). "cores busy" is every process's CPU (the
nodes': all of theirs) over the generations' wall time. `--profile` samples holder 0 (a node's expert
worker) with py-spy during each way's rounds (bench/_pyspy.py).
"""

from __future__ import annotations

import os

# As bench/generate.py: OpenBLAS threads that spin after each call would starve the holder processes.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import abc
import argparse
import asyncio
import contextlib
import multiprocessing
import shutil
import socket
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from nacl.signing import SigningKey

from apps.node.identity import load_or_create_identity
from apps.receipts.commitment import ExpectedBatches, blake3_hex, verify_batches_receipt
from core.formats.wire import decode_rows, encode_rows, encoded_row_bytes
from core.transport.loop_thread import LoopThread
from core.transport.pool import QuicPool
from core.transport.quic import QuicSettings
from testkit.nodes import NodeProcess, usage_of
from testkit.redis_server import private_redis

from . import _pyspy
from ._floor_holders import (
    MAX_BODY,
    RECEIPT_TOPK,
    SHAPE,
    WIRE,
    asyncio_holder,
    quic_holder,
    read_frame,
    recv_frame,
    rows_of,
    send_frame,
    split_rows,
    tcp_holder,
    write_frame,
)
from ._generate_model import D_MODEL, Local, dense_ms_per_token, write_model
from .forward import _stop
from .generate import PROMPT_TOKENS, TARGETS, load_experts, nodes_usage, start_nodes
from .report import RESULTS_DIR, headline, print_table, write_results
from .transport_quic import _free_udp_port

TRANSPORTS = ("tcp", "asyncio", "quic", "quic+receipts", "nodes")
Asked = dict[int, list[tuple[int, np.ndarray, np.ndarray]]]  # holder -> [(expert, token rows, weights)]


class RemoteMoe(abc.ABC):
    """The router's MoE layer: gate here, one request per holder (`ask`), the answers combined here."""

    def __init__(self, local: Local, holders: int) -> None:
        self.local, self.holders = local, holders
        self.layers: list[tuple[float, float]] = []  # per MoE layer: (wall s, slowest holder's compute s)

    @abc.abstractmethod
    def ask(self, layer: int, x: np.ndarray, asked: Asked) -> list[tuple[list[np.ndarray], float]]:
        """Per holder of `asked`, in its order: (each batch's rows f32 [n_i, d_model], its compute s)."""

    def moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        """hidden f32 [t, d_model] -> f32 [t, d_model], every expert asked of its holder."""
        start = time.perf_counter()
        routing = self.local.runtime.route(model_id=SHAPE.model_id, layer=layer, hidden=x)
        asked: Asked = defaultdict(list)
        for e, (tokens, weights) in sorted(routing.tokens_by_expert().items()):
            asked[e % self.holders].append((e, tokens, weights))
        out, slowest = np.zeros_like(x), 0.0
        for batches, (ys, compute_s) in zip(asked.values(), self.ask(layer, x, asked), strict=True):
            slowest = max(slowest, compute_s)
            for (_, tokens, weights), y in zip(batches, ys, strict=True):
                out[tokens] += weights[:, None] * y
        self.layers.append((time.perf_counter() - start, slowest))
        return out

    def generate(self, prompt: list[int], max_new: int) -> dict[str, Any]:
        """Local.generate with this MoE layer; the decode steps' layers (wall ms, slowest holder ms) beside."""
        self.layers = []
        record = self.local.generate(prompt, max_new, self.moe)
        per_step = len(self.layers) // max_new
        record["decode_layers_ms"] = [(wall * 1e3, slowest * 1e3) for wall, slowest in self.layers[per_step:]]
        return record

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connections to the holders."""


class OverTcp(RemoteMoe):
    """Blocking sockets on this thread: every request sent, then each answer read in turn."""

    def __init__(self, local: Local, socks: list[socket.socket]) -> None:
        super().__init__(local, len(socks))
        self.socks = socks

    def ask(self, layer: int, x: np.ndarray, asked: Asked) -> list[tuple[list[np.ndarray], float]]:
        for holder, batches in asked.items():
            send_frame(self.socks[holder], (layer, x, [(e, tokens.tolist()) for e, tokens, _ in batches]))
        return [recv_frame(self.socks[holder]) for holder in asked]

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


class OverAsyncio(RemoteMoe):
    """OverTcp's frames on asyncio streams, on an event loop in a thread of its own to which each layer is
    handed from the dense part's thread (as OverQuic, without QUIC): every request in flight at once."""

    def __init__(self, local: Local, addresses: list[tuple[str, int]]) -> None:
        super().__init__(local, len(addresses))
        self.addresses = addresses
        self.thread = LoopThread("wire-floor-asyncio")
        self.streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def ask(self, layer: int, x: np.ndarray, asked: Asked) -> list[tuple[list[np.ndarray], float]]:
        return self.thread.run(self._ask(layer, x, asked), timeout_s=60)

    async def _ask(self, layer: int, x: np.ndarray, asked: Asked) -> list[tuple[list[np.ndarray], float]]:
        if not self.streams:
            for host, port in self.addresses:
                reader, writer = await asyncio.open_connection(host, port)
                writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.streams.append((reader, writer))
        for holder, batches in asked.items():
            write_frame(self.streams[holder][1], (layer, x, [(e, tokens.tolist()) for e, tokens, _ in batches]))
        return list(await asyncio.gather(*(read_frame(self.streams[holder][0]) for holder in asked)))

    def close(self) -> None:
        for _, writer in self.streams:
            writer.close()
        self.thread.stop()


@dataclass(frozen=True)
class QuicHolder:
    port: int
    pin_sha256: str
    provider_id: str | None  # its receipts' signer; None: it answers without one


class OverQuic(RemoteMoe):
    """The node's QUIC client (core.transport.pool.QuicPool) on an event loop of its own thread, as a node's
    router hands a layer from its compute thread to its loop: every request in flight at once. Where the
    holders sign, the node's payload: Q8_0 rows, and each answer's receipt verified against its rows as a
    node's router does (apps.receipts.commitment.verify_batches_receipt). `node_frames`: the holders are
    nodes, asked with moe/execute's multi-expert frame (docs/protocol.md, "Multi-expert execute")."""

    def __init__(self, local: Local, holders: list[QuicHolder], *, node_frames: bool = False) -> None:
        super().__init__(local, len(holders))
        self.quic_holders, self.node_frames = holders, node_frames
        self.thread = LoopThread("wire-floor-quic")
        self.pool: QuicPool | None = None

    def ask(self, layer: int, x: np.ndarray, asked: Asked) -> list[tuple[list[np.ndarray], float]]:
        return self.thread.run(self._ask(layer, x, asked), timeout_s=60)

    def _params(self, layer: int, tokens: list[int], batches: list[list[Any]], signed: bool) -> dict[str, Any]:
        if self.node_frames:
            return {"model_id": SHAPE.model_id, "layer": layer, "d_model": D_MODEL, "tokens": len(tokens),
                    "encoding": WIRE, "token_indices": tokens, "receipt_topk": RECEIPT_TOPK,
                    "batches": [{"expert": e, "rows": rows} for e, rows in batches]}
        return {"layer": layer, "batches": batches, **({"token_indices": tokens} if signed else {})}

    async def _ask(self, layer: int, x: np.ndarray, asked: Asked) -> list[tuple[list[np.ndarray], float]]:
        if self.pool is None:
            self.pool = QuicPool(QuicSettings(max_body=MAX_BODY))
        signed = self.quic_holders[0].provider_id is not None
        body, tokens = (encode_rows(x, WIRE) if signed else x.tobytes()), list(range(len(x)))
        requests = {holder: [[e, rows.tolist()] for e, rows, _ in batches] for holder, batches in asked.items()}
        answers = await asyncio.gather(*(
            self.pool.call(host="127.0.0.1", port=self.quic_holders[holder].port,
                           pin_sha256=self.quic_holders[holder].pin_sha256,
                           method="moe/execute" if self.node_frames else "experts",
                           params=self._params(layer, tokens, batches, signed), body=body, timeout_s=60)
            for holder, batches in requests.items()))
        out = []
        for (holder, batches), (result, answer) in zip(requests.items(), answers, strict=True):
            counts = [len(rows) for _, rows in batches]
            seconds = result["compute_ms"] / 1e3 if self.node_frames else result["compute_s"]
            if not signed:
                out.append((split_rows(rows_of(answer), counts), seconds))
                continue
            rows = split_rows(decode_rows(answer, WIRE, tokens=sum(counts), d_model=D_MODEL), counts)
            expect = ExpectedBatches(self.quic_holders[holder].provider_id, SHAPE.model_id, layer, tokens, D_MODEL,
                                     WIRE, blake3_hex(body), WIRE, RECEIPT_TOPK, batches)
            verify_batches_receipt(result["receipt"], expect, list(zip(
                rows, split_rows(memoryview(answer), counts, encoded_row_bytes(WIRE, D_MODEL)), strict=True)))
            out.append((rows, seconds))
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.thread.run(self.pool.close(), timeout_s=10)
        self.thread.stop()


@contextlib.contextmanager
def node_holders(holders: int, experts: list[Path], work: Path
                 ) -> Iterator[tuple[list[QuicHolder], list[NodeProcess]]]:
    """`holders` real nodes (`tenzro node run`, testkit.nodes, on a redis-server of their own, with
    bench/generate.py's settings, no peers), each holding experts e % holders: their QUIC doors, and the
    nodes."""
    nodes: list[NodeProcess] = []
    try:
        with private_redis() as redis_host:
            start_nodes(work, redis_host, nodes, holders, router=False)
            load_experts(nodes, experts)
            infos = [node.result("tenzro_nodeInfo") for node in nodes]
            yield [QuicHolder(node.quic_port, info["endpoints"]["quic_cert_sha256"], info["provider_id"])
                   for node, info in zip(nodes, infos, strict=True)], nodes
    finally:
        with ThreadPoolExecutor(max(1, len(nodes))) as pool:
            list(pool.map(_stop, nodes))


@contextlib.contextmanager
def holders_for(transport: str, holders: int, local: Local, experts: list[Path], work: Path
                ) -> Iterator[tuple[RemoteMoe, Callable[[], float], int]]:
    """The router's side of `transport` over its holders, the CPU seconds the router and the holders have
    used so far, and holder 0's pid (a node's: its expert worker's): holder processes of this benchmark
    (spawned, each loading its experts), or nodes."""
    if transport == "nodes":
        with node_holders(holders, experts, work) as (quic_holders, nodes):
            remote = OverQuic(local, quic_holders, node_frames=True)
            try:
                yield (remote, lambda: usage_of([os.getpid()]).cpu_s + nodes_usage(nodes).cpu_s,
                       nodes[0].result("tenzro_workerStatus")["pid"])
            finally:
                remote.close()
        return
    context = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    socks: list[socket.socket] = []
    ports: list[int] = []
    addresses: list[tuple[str, int]] = []
    identity = load_or_create_identity(work / "identity")
    seed = bytes(range(32))  # every holder signs with one key: the router checks each receipt against it
    try:
        for i in range(holders):
            data_dir = work / f"{transport}-holder-{i}"
            if transport in ("tcp", "asyncio"):
                listener = socket.create_server(("127.0.0.1", 0))
                proc = context.Process(target=tcp_holder if transport == "tcp" else asyncio_holder,
                                       args=(i, holders, experts, data_dir, listener), daemon=True)
                proc.start()
                if transport == "tcp":
                    sock = socket.create_connection(listener.getsockname(), timeout=600)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    socks.append(sock)
                addresses.append(listener.getsockname())
                listener.close()  # the child has its own copy, listening
            else:
                ready, port = context.Event(), _free_udp_port()
                proc = context.Process(target=quic_holder, args=(i, holders, experts, data_dir, port,
                                                                 str(identity.cert_path), str(identity.cert_key_path),
                                                                 seed if transport == "quic+receipts" else None,
                                                                 ready), daemon=True)
                proc.start()
                if not ready.wait(600):
                    raise RuntimeError(f"QUIC holder {i} did not start")
                ports.append(port)
            procs.append(proc)
        signer = SigningKey(seed).verify_key.encode().hex() if transport == "quic+receipts" else None
        remote = (OverTcp(local, socks) if transport == "tcp" else OverAsyncio(local, addresses)
                  if transport == "asyncio" else OverQuic(local, [QuicHolder(p, identity.cert_sha256, signer)
                                                                  for p in ports]))
        try:
            yield remote, lambda: usage_of([os.getpid(), *(p.pid for p in procs)]).cpu_s, procs[0].pid
        finally:
            remote.close()
    finally:
        for proc in procs:
            proc.join(0 if transport.startswith("quic") else 5)  # a QUIC holder serves until killed
            if proc.is_alive():
                proc.kill()
                proc.join(30)


def run_holders(transport: str, holders: int, local: Local, experts: list[Path], work: Path, prompt: list[int],
                max_new: int, rounds: int, profile: bool = False) -> dict[str, Any]:
    """Rounds of (one process, distributed) generations, interleaved; their figures. `profile`: py-spy
    samples holder 0 during the rounds (bench/_pyspy.py), where the way has one to sample."""
    with holders_for(transport, holders, local, experts, work) as (remote, cpu_used, holder_pid):
        started = time.monotonic()
        for _ in range(2):  # warm: the holders' kernels and first frames, the connections
            remote.generate(prompt, max_new)
        print(f"{transport}, {holders} holder{'s' if holders > 1 else ''}: loaded and warm "
              f"{time.monotonic() - started:.0f} s")
        ref, dist, busy = [], [], []
        spy = None
        for _ in range(rounds):
            ref.append(local.generate(prompt, max_new))
            if profile and spy is None:  # from the first distributed round on, the local ones in its window too
                spy = _pyspy.Profile(holder_pid, RESULTS_DIR / f"profile-wire-floor-{transport}.txt", 8.0)
            cpu, wall = cpu_used(), time.monotonic()
            dist.append(remote.generate(prompt, max_new))
            busy.append((cpu_used() - cpu) / (time.monotonic() - wall))
        if spy is not None:
            steps = sum(len(r["decode_step_ms"]) + 1 for r in dist)
            summary = spy.finish(steps=steps)
            print_table(f"Profile of holder 0 ({transport}) over {steps} distributed steps: CPU ms per step by "
                        f"thread (/proc; the window also spans the one-process rounds between), then its main "
                        f"thread's busy functions (py-spy samples; raw: {summary['raw']})",
                        ["thread / frame", "ms per step / share"],
                        [*([k, v] for k, v in summary["cpu_ms_per_step"].items()),
                         *([f, f"{share:.1%}"] for f, share in summary["event_loop_busy"])])
    same = sum(a == b for a, b in zip(ref[0]["tokens"], dist[0]["tokens"], strict=True))
    layers = [layer for r in dist for layer in r["decode_layers_ms"]]
    return {"transport": transport, "holders": holders, **figures(ref, dist), "cores_busy": statistics.median(busy),
            "holder_ms_per_layer": statistics.fmean(s for _, s in layers),
            "network_ms_per_layer": statistics.fmean(w - s for w, s in layers),
            "moe_ms_per_layer": statistics.fmean(w for w, _ in layers), "tokens_equal": f"{same}/{max_new}"}


def figures(ref: list[dict[str, Any]], dist: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over rounds of TTFT and decode tokens/s, and dense ms per decode step, for both runs."""
    return {"ttft_ms": statistics.median(r["ttft_ms"] for r in dist),
            "one_process_ttft_ms": statistics.median(r["ttft_ms"] for r in ref),
            "decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in dist),
            "one_process_decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in ref),
            "dense_ms": dense_ms_per_token(dist), "one_process_dense_ms": dense_ms_per_token(ref)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 new tokens, 1 round (a smoke run)")
    parser.add_argument("--holders", default="1,4", help="holder process counts to run, comma-separated")
    parser.add_argument("--ways", default=",".join(TRANSPORTS), help=f"which of {', '.join(TRANSPORTS)} to run")
    parser.add_argument("--profile", action="store_true", help="py-spy samples holder 0 of each way during its "
                        "rounds: CPU per step by thread, its main thread's busy functions")
    args = parser.parse_args()
    counts = [int(n) for n in args.holders.split(",")]
    if min(counts) < 1:
        parser.error(f"--holders needs counts of at least 1, got {args.holders}")
    if unknown := set(args.ways.split(",")) - set(TRANSPORTS):
        parser.error(f"--ways: no way named {', '.join(sorted(unknown))} (there are {', '.join(TRANSPORTS)})")
    max_new, rounds = (8, 1) if args.quick else (16, 3)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-wire-floor-"))
    try:
        rng = np.random.default_rng(0)
        folder, experts = write_model(work / SHAPE.name, SHAPE, rng)
        local = Local(SHAPE, folder, experts, work / "local")
        prompt = [int(t) for t in rng.integers(0, SHAPE.vocab_size, PROMPT_TOKENS)]
        local.generate(prompt, 2)  # warm: kernels, page cache
        print(f"[{SHAPE.name}] model written and loaded {time.monotonic() - started:.0f} s; cores: {os.cpu_count()}, "
              f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        runs = [run_holders(transport, n, local, experts, work, prompt, max_new, rounds, args.profile)
                for n in counts for transport in TRANSPORTS if transport in args.ways.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(f"{SHAPE.name}, Q8_0 experts, rows as f32 (quic+receipts: Q8_0), {rounds} round(s) of {max_new} "
                "tokens: medians over rounds "
                "against one process in the same run; per MoE layer of a decode step: network + dispatch (the layer's "
                "wall time less its slowest holder's compute) and that holder's compute",
                ["transport", "holders", "TTFT ms", "x one process", "decode tok/s", "x one process", "dense ms/token",
                 "x one process", "network + dispatch ms/layer", "slowest holder ms/layer", "cores busy",
                 "tokens equal"],
                [[r["transport"], r["holders"], r["ttft_ms"], f"{r['ttft_ms'] / r['one_process_ttft_ms']:.2f}x",
                  r["decode_tokens_per_s"], f"{r['decode_tokens_per_s'] / r['one_process_decode_tokens_per_s']:.2f}x",
                  r["dense_ms"], f"{r['dense_ms'] / r['one_process_dense_ms']:.2f}x", r["network_ms_per_layer"],
                  r["holder_ms_per_layer"], f"{r['cores_busy']:.2f}", r["tokens_equal"]] for r in runs])
    write_results("wire_floor", {"quick": args.quick, "shape": SHAPE.name, "cores": os.cpu_count(), "runs": runs,
                                 "targets": TARGETS, "wall_s": time.monotonic() - started},
                  [h for r in runs for h in (
                      headline(f"{r['transport']}, {r['holders']} holders: decode", r["decode_tokens_per_s"],
                               "tokens/s", reference="one process",
                               reference_value=r["one_process_decode_tokens_per_s"],
                               target=f">= {TARGETS['decode_ratio']}x (bench/generate.py's)"),
                      headline(f"{r['transport']}, {r['holders']} holders: network + dispatch per MoE layer",
                               r["network_ms_per_layer"], "ms",
                               target=f"<= {TARGETS['network_ms_per_layer']} ms (bench/generate.py's)"))])


if __name__ == "__main__":
    main()
