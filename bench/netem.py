"""The distributed forward under network conditions: latency against the clean forward and the path's RTT.

    .venv/bin/python -m bench.netem [--quick] [--loopback] [--repeats N] [--transports qh3,aioquic:reno]
                                    [--conditions "1% loss,reorder"]

What is measured, and how. Three real nodes (`tenzro node run`), each in a network namespace of
its own on one bridge (testkit/netns.py; `--loopback`, or a machine where namespaces cannot be
made, runs them on loopback), with a user-space netem relay (testkit/netem.py: this kernel has
no netem qdisc) in front of each node's QUIC door, which the node advertises as its QUIC
endpoint (testkit/impaired.py). A router holds only the gate; two holders hold every expert of
a 16-expert top-4 softmax layer (d_model 1024, d_ff 512, f32 payloads), so every (token, expert)
pair crosses one relay, impaired both ways. For each condition (the relays' delay, jitter and
loss, switched live; where the delay changed, 10 s pass first, as long as the tolerant
controller remembers a path's base RTT), the run measures:

* the reference: a plain UDP ping (64-byte datagrams every 5 ms) through a relay of its own with
  the same impairment, i.e. the RTT the condition adds to one exchange;
* `tenzro_moeForward` on the router (JSON-RPC, client wall clock) for 64 tokens with Q8_0 and
  with f32 on the wire: p50 and p99, beside the same forward with the relays passing through
  unimpaired ("clean"), and the relative error against `forward_local` in this process. Timed
  forwards follow at least WARMUP untimed ones of each wire and WARMUP_S of them.
* the transport's own share ("QUIC alone p50"): the bytes each holder's requests and answers carried
  in those forwards (medians), moved by QUIC alone between processes of their own through two relays
  with the same impairment, cut over lanes as the forward's are, after the same warm-up as the
  forwards (bench/_netem_quic.py): no gate, plan, compute or receipt. What the forward takes beyond it
  is ours; a target below it is the library's loss recovery and congestion control to meet, not the
  forward's. Not measured where one path is impaired apart from the other.

The whole run is repeated for each QUIC transport (`--transports`; default qh3, the node's default,
then aioquic with its default controller, "tolerant": core/transport/quic_tolerant.py), each with
fresh nodes, so the loss targets are read per transport.

"RTTs added" = (p50 − clean p50) / ping p50: how many round trips of the path the forward pays
(one exchange per holder, in parallel, is 1; loss recovery, congestion windows growing from
their initial size, and hedges add more). Connections are pooled, so no handshake is timed.
"lanes": the median over the forwards of the most connections one holder's request was split over
(core/transport/lanes.py: more than one where the request is larger than the congestion window).
"busiest": the median over the forwards of the share of the rows the busiest holder served (50 % is
an even split between the two holders; 100 %, every row on one). In the condition where one holder is
nearer but its path alone loses 2 % of its datagrams, the planner should give that path fewer rows
(docs/protocol.md, "stats": each holder's measured wire time per byte), so there "busiest" is the
farther, clean path's share.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as bench/forward.py: idle BLAS threads must not spin
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from apps.node.identity import load_or_create_identity
from bench import _netem_quic
from bench.forward import Forwarder, Layer, local_runtime, rel_error, write_layer
from core.transport import quic_lib
from core.transport.loss_signals import CongestionSignal
from testkit.impaired import impaired_network
from testkit.netem import Impairment
from testkit.nodes import TOKEN, NodeProcess

from .report import headline, print_table, write_results

LAYER = Layer("bench/netem-layer", 1024, 512, 16, 4)
TOKENS = 64
CLEAN = "clean (relays pass through)"
CONDITIONS = {
    CLEAN: Impairment(),
    "30 ms RTT ±5, 0.1% loss": Impairment(delay_ms=15, jitter_ms=2.5, loss=0.001),
    "30 ms RTT ±5, 1% loss": Impairment(delay_ms=15, jitter_ms=2.5, loss=0.01),
    "30 ms RTT ±5, 1% loss, 1% reorder": Impairment(delay_ms=15, jitter_ms=2.5, loss=0.01, reorder=0.01),
    "30 ms RTT ±5, 2% loss": Impairment(delay_ms=15, jitter_ms=2.5, loss=0.02),
    "100 ms RTT ±10, 0.5% loss": Impairment(delay_ms=50, jitter_ms=5, loss=0.005),
    "30 ms RTT ±5, 1% reorder": Impairment(delay_ms=15, jitter_ms=2.5, reorder=0.01),
    "30 ms RTT ±5, one holder nearer (10 ms) at 2% loss": Impairment(delay_ms=15, jitter_ms=2.5),
}
# Conditions where one node's path differs from the rest (node 2 is the second holder). Here it is 20 ms
# nearer and loses 2 % of its datagrams: ranked by round trip alone, it was given most rows (73 %); the
# planner should give it fewer than the other (docs/protocol.md, "stats": each holder's wire time per
# byte), which "busiest" shows (the other holder's share, above 50 %).
ONE_PATH = {"30 ms RTT ±5, one holder nearer (10 ms) at 2% loss": (2, Impairment(delay_ms=5, jitter_ms=2.5,
                                                                                 loss=0.02))}
# What the results keep of each forward's holders: what the planner was fed, and what each holder got.
HOLDER_FIELDS = ("provider", "rows", "rtt_ms", "wire_ns_per_byte", "latency_ms_max", "compute_ms", "bytes_sent",
                 "bytes_received", "lanes")
# The loss-recovery target: at 1 % loss and at 1 % reorder, forward p50 within 2x the clean p50 plus 2 RTTs.
TARGETED = ("30 ms RTT ±5, 1% loss", "30 ms RTT ±5, 1% loss, 1% reorder", "30 ms RTT ±5, 1% reorder")
PATH_SETTLE_S = CongestionSignal.base_window_s
WARMUP = 3
# and for at least this long: the router plans on a view of the network it reads again every
# TENZRO_WORKER_CONTROL_TTL_S (5 s), so the latencies and wire times of the condition reach its plans
WARMUP_S = 6.0
NODE_ENV = {
    "TENZRO_GOSSIP_INTERVAL_S": "1", "TENZRO_GOSSIP_HEARTBEAT_S": "2", "TENZRO_GOSSIP_TTL_S": "120",
    "TENZRO_REACHABILITY_CHECK_S": "120",
    "TENZRO_PEER_MAX_STREAMS": "256", "TENZRO_PEER_RATE_PER_S": "1000000", "TENZRO_PEER_BURST": "1000000",
    "TENZRO_MEMORY_BUDGET_BYTES": str(2 << 30), "TENZRO_WORKER_TIMEOUT_S": "120",
}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def load(nodes: list[NodeProcess], gate: Path, experts: list[Path]) -> None:
    router, holders = nodes[0], nodes[1:]
    router.result("tenzro_moeGateLoad", {"path": str(gate)}, token=TOKEN)
    for holder in holders:
        for path in experts:
            answer = holder.rpc("tenzro_moeExpertLoad", {"path": str(path)}, token=TOKEN, timeout=120)
            assert "result" in answer, answer


def wait_converged(router: NodeProcess, timeout_s: float = 120.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        shard = router.result("tenzro_moeShardMap", {"model_id": LAYER.model_id})["holders"]
        if len(shard) == LAYER.n_routed and all(
                len(e["holders"]) == 2 and all(h["quic_endpoint"] for h in e["holders"]) for e in shard):
            return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"the router did not see both holders of every expert within {timeout_s} s")


def measure(forward: Forwarder, bodies: dict[str, bytes], want: np.ndarray, repeats: int) -> dict[str, Any]:
    """Forwards of each wire, interleaved, after WARMUP untimed ones each and WARMUP_S (the hedging book
    learns the new latencies: with the clean path's, hedges fire on every forward of the first lossy
    condition; the planner, the paths' round trips and wire times)."""
    samples: dict[str, list[float]] = {w: [] for w in bodies}
    errors: dict[str, float] = dict.fromkeys(bodies, 0.0)
    lanes: dict[str, list[int]] = {w: [] for w in bodies}  # per forward: the most lanes a holder's request took
    busiest: dict[str, list[float]] = {w: [] for w in bodies}  # per forward: the busiest holder's share of the rows
    # per forward, per holder: what the planner was fed and what it got (HOLDER_FIELDS)
    holders: dict[str, list[list[dict[str, Any]]]] = {w: [] for w in bodies}
    failures, hedges, retries = 0, 0, 0
    started, warmups = time.monotonic(), 0
    while warmups < WARMUP or time.monotonic() - started < WARMUP_S:
        for body in bodies.values():
            forward(LAYER, body)
        warmups += 1
    for _ in range(repeats):
        for wire, body in bodies.items():
            try:
                seconds, stats, out = forward(LAYER, body)
            except AssertionError as exc:  # an error answer: counted, not timed
                failures += 1
                print(f"forward failed ({wire}): {exc}"[:400])
                continue
            samples[wire].append(seconds * 1e3)
            errors[wire] = max(errors[wire], rel_error(out, want))
            lanes[wire].append(max((h.get("lanes", 1) for h in stats["holders"]), default=1))
            rows = [h["rows"] for h in stats["holders"]]
            busiest[wire].append(max(rows) / sum(rows) if sum(rows) else 0.0)
            holders[wire].append([{k: h.get(k) for k in HOLDER_FIELDS} for h in stats["holders"]])
            hedges += stats["hedges_fired"]
            retries += stats["retries"]
    return {"samples_ms": samples, "rel_error": errors, "failures": failures, "hedges_fired": hedges,
            "retries": retries, "lanes": lanes, "busiest_share": busiest, "holders": holders}


def run(args: argparse.Namespace, work: Path, transport: tuple[str, str]) -> dict[str, Any]:
    """Every condition with the nodes on one QUIC transport: (library, congestion control or "")."""
    rng = np.random.default_rng(0)
    gate, experts = write_layer(LAYER, work / "payloads", rng)
    runtime = local_runtime({LAYER: (gate, experts)}, work / "local")
    hidden = rng.standard_normal((TOKENS, LAYER.d_model), dtype=np.float32)
    want = runtime.forward_local(model_id=LAYER.model_id, layer=0, hidden=hidden)
    env = {**NODE_ENV, "TENZRO_QUIC_LIB": transport[0], "TENZRO_QUIC_CONGESTION": transport[1]}
    with impaired_network(3, work / "nodes", env, use_namespaces=not args.loopback) as network:
        print(f"topology: {network.topology}; relays on {network.relay_host}")
        load(network.nodes, gate, experts)
        print(f"every expert seen at both holders {wait_converged(network.nodes[0]):.0f} s after loading")
        results: dict[str, Any] = {"topology": network.topology, "tokens": TOKENS, "repeats": args.repeats,
                                   "transport": transport_name(transport),
                                   "layer": LAYER.__dict__, "conditions": {}}
        with httpx.Client(timeout=120) as client:
            forward = Forwarder(network.nodes[0], client)
            bodies = {wire: forward.body(LAYER, hidden, wire) for wire in ("q8_0", "f32")}
            delay_ms = 0.0
            identity = load_or_create_identity(work / "quic-alone")
            datagram_size = _netem_quic.nodes_datagram_size(network, transport[0])

            def quic_alone(wire: str, measured: dict[str, Any], impairment: Impairment) -> dict[str, Any]:
                exchanges = _netem_quic.holder_bytes(measured["holders"][wire])
                return {"exchanges": exchanges, "samples_ms": _netem_quic.measure(
                    network, impairment, exchanges, library=transport[0], congestion=transport[1],
                    datagram_size=datagram_size, cert=str(identity.cert_path), key=str(identity.cert_key_path),
                    pin=identity.cert_sha256, repeats=args.repeats, warmup=WARMUP, warmup_s=WARMUP_S)}

            for name, impairment in args.conditions.items():
                network.set(impairment)
                if name in ONE_PATH:
                    node, other = ONE_PATH[name]
                    network.set(other, node=node)
                if impairment.delay_ms != delay_ms:
                    # The path's delay jumped (the relays switch live; real paths do not): give the
                    # senders' controllers the time they take to forget the old path's RTT (the
                    # tolerant controller's base window) before anything is timed.
                    time.sleep(PATH_SETTLE_S)
                    delay_ms = impairment.delay_ms
                ping = network.ping(impairment, count=300)
                before = network.relays.counters()
                measured = measure(forward, bodies, want, args.repeats)
                after = network.relays.counters()
                # one path impaired apart from the others: the reference's two relays would not say which
                alone = {} if name in ONE_PATH else {wire: quic_alone(wire, measured, impairment)
                                                     for wire in bodies}
                results["conditions"][name] = {
                    "impairment": impairment.describe() + (
                        f"; node {ONE_PATH[name][0]}'s path: {ONE_PATH[name][1].describe()}" if name in ONE_PATH
                        else ""),
                    "ping": ping.summary(), **measured, "quic_alone": alone,
                    "relay_datagrams": after.received - before.received, "relay_lost": after.lost - before.lost}
                print(f"{name}: ping p50 {ping.percentile(50):.2f} ms, forwards done")
    return results


def parse_transports(text: str) -> list[tuple[str, str]]:
    """"qh3,aioquic:reno" -> [("qh3", ""), ("aioquic", "reno")] ("": the library's default controller)."""
    transports = [tuple(item.partition(":")[::2]) for item in text.split(",") if item]
    for library, _ in transports:
        if library not in quic_lib.LIBRARIES:
            raise argparse.ArgumentTypeError(f"unknown QUIC library {library!r}; choose from {quic_lib.LIBRARIES}")
    return transports


def parse_conditions(text: str) -> dict[str, Impairment]:
    """"1% loss,reorder" -> the clean condition (every run's reference) and each of CONDITIONS whose name
    holds one of the comma-separated parts."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    chosen = {name: impairment for name, impairment in CONDITIONS.items()
              if name == CLEAN or any(part in name for part in parts)}
    if len(chosen) == 1:
        raise argparse.ArgumentTypeError(f"no condition's name holds any of {parts}; they are {list(CONDITIONS)}")
    return chosen


def transport_name(transport: tuple[str, str]) -> str:
    lib = quic_lib.load(transport[0])
    congestion = transport[1] or lib.default_congestion_control or "its own"
    return f"{lib.name} {lib.version}, congestion control {congestion}"


def table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Print the table; return the headline figures."""
    conditions = results["conditions"]
    clean = {w: percentile(s, 50) for w, s in conditions[CLEAN]["samples_ms"].items()}
    rows, heads = [], []
    for name, c in conditions.items():
        ping = c["ping"]
        for wire, samples in c["samples_ms"].items():
            if not samples:
                rows.append([name, wire, *["-"] * 9, c["failures"], *["-"] * 4])
                continue
            alone = c.get("quic_alone", {}).get(wire)
            alone_p50 = percentile(alone["samples_ms"], 50) if alone else None
            p50, p99 = percentile(samples, 50), percentile(samples, 99)
            added = (p50 - clean[wire]) / ping["p50_ms"] if ping["p50_ms"] and ping["p50_ms"] > 1 else None
            bound = 2 * clean[wire] + 2 * ping["p50_ms"]
            met = ("yes" if p50 <= bound else "NO") if name in TARGETED else "-"
            rows.append([name, wire, ping["p50_ms"], ping["p99_ms"], f"{ping['lost']}/{ping['sent']}", p50, p99,
                         "-" if alone_p50 is None else alone_p50, f"{p50 / clean[wire]:.2f}x",
                         "-" if added is None else f"{added:.1f}",
                         f"{bound:.0f} {met}" if name in TARGETED else "-", c["failures"],
                         f"{c['rel_error'][wire]:.1e}", f"{c['hedges_fired']}/{c['retries']}",
                         f"{statistics.median(c['lanes'][wire]):g}",
                         f"{statistics.median(c['busiest_share'][wire]):.0%}"])
            if name != CLEAN:
                heads.append(headline(f"forward p50, {TOKENS} tokens, {wire} wire, {name}, {results['transport']}",
                                      p50, "ms",
                                      reference="clean forward p50 (relays pass through)",
                                      reference_value=clean[wire],
                                      target=f"<= 2x clean p50 + 2 RTT = {bound:.0f} ms" if name in TARGETED
                                      else "—"))
                if alone_p50 is not None:
                    heads.append(headline(f"the same bytes over QUIC alone, {wire} wire, {name}, "
                                          f"{results['transport']}", alone_p50, "ms", reference="forward p50",
                                          reference_value=p50))
                heads.append(headline(f"latency added by {name} ({wire} wire, {results['transport']}; "
                                      "ratio = RTTs added)",
                                      p50 - clean[wire], "ms", reference="relay ping RTT p50",
                                      reference_value=ping["p50_ms"]))
    print_table(
        f"Distributed forward under network conditions ({results['topology']}; QUIC: {results['transport']}; "
        f"router holds the gate, 2 holders "
        f"hold all {LAYER.n_routed} experts, top-{LAYER.top_k}, d_model {LAYER.d_model}, d_ff {LAYER.d_ff}; "
        f"{TOKENS} tokens, "
        f"{results['repeats']} forwards per wire per condition); ms; RTTs added = (p50 - clean p50) / ping p50",
        ["condition", "wire", "ping p50", "ping p99", "ping lost", "forward p50", "forward p99", "QUIC alone p50",
         "/clean",
         "RTTs added", "target (ms) met", "failed", "rel error (max)", "hedges/retries", "lanes", "busiest"], rows)
    heads.append(headline(f"forwards failed, all conditions, {results['transport']}",
                          sum(c["failures"] for c in conditions.values()), "forwards", target="0"))
    heads.append(headline(f"relative error of f32-wire forwards, worst of all conditions, {results['transport']}",
                          max(c["rel_error"]["f32"] for c in conditions.values()), "",
                          reference="forward_local in this process", target="< 1e-5"))
    return heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 forwards per wire per condition")
    parser.add_argument("--repeats", type=int, default=None, help="forwards per wire per condition (default 20)")
    parser.add_argument("--loopback", action="store_true", help="no network namespaces (nodes on 127.0.0.1)")
    parser.add_argument("--transports", type=parse_transports, default="qh3,aioquic",
                        help="the nodes' QUIC library[:congestion control], comma-separated, each a run of every "
                             "condition (TENZRO_QUIC_LIB, TENZRO_QUIC_CONGESTION; default controller: the "
                             "library's, aioquic's is 'tolerant')")
    parser.add_argument("--conditions", type=parse_conditions, default=CONDITIONS,
                        help="only the conditions whose names hold one of these comma-separated parts, beside the "
                             "clean one (results under bench/results/netem-partial.json)")
    args = parser.parse_args()
    args.repeats = args.repeats or (5 if args.quick else 20)
    runs, heads = [], []
    for transport in args.transports:
        work = Path(tempfile.mkdtemp(prefix="tenzro-bench-netem-"))
        try:
            results = run(args, work, transport)
        except BaseException:
            print(f"failed: node logs kept under {work}")
            raise
        shutil.rmtree(work, ignore_errors=True)
        runs.append(results)
    for results in runs:  # the tables together, after every run
        heads += table(results)
    write_results("netem" if args.conditions == CONDITIONS else "netem-partial", {"runs": runs}, heads)


if __name__ == "__main__":
    main()
