"""Gossip benchmark: convergence rounds against log2 N, and steady-state bytes against resending records.

Run: .venv/bin/python -m bench.gossip [--quick] [--verify-all]

An in-process network (testkit/gossip_sim.py): every node is a real `Gossip` engine
(apps/providers/gossip.py) over its own store, with real ed25519-signed records and heartbeats;
the transport is simulated (messages handed over in memory, their compact-JSON size counted).
Default `Limits` (fanout 3, TTL 60 s, 256 items per message); a round is 5 s of simulated time
and every node re-signs its heartbeat every third round (SimNetwork.round), so a minute is 12
rounds.

Convergence: N nodes with small records (4 holdings), each configured with ONE peer, node 0 (a
bootstrap node every node is given; node 0 is given none). Rounds until every node knows every
node at its current seq (SimNetwork.converged), for several RNG seeds: min / median / max,
rounds / log2 N (flat when rounds grow like log N), and whether the slowest run stays within
C·log2 N. A second table configures each node with a random earlier node instead: no node is
known to all, and a clique that formed around one part of the tree merges with the rest only
when one of its members happens to sync with its configured peer (see the notes it prints).

Steady state: every node holds 500 experts (a record of 500 holdings: ~92 KB of signed text,
~101 KB as a JSON envelope on the wire). N = 200 is simulated from the start (join, then rounds
until no rumor is left); N = 1,000 starts from an already converged state
(testkit.gossip_sim.converged_network: every store preloaded with every node's current entry,
the join phase skipped). Then one minute of warm-up (the TTL is a minute, so liveness that does
not keep up shows as expiry) and one measured minute: bytes each node sent, by message kind
(push, sync = SYN digest, ack = the sync answer, ack2), against the naive "one full record per
peer per minute" = N × envelope bytes.

Cost: ed25519 verification dominates a fully verified run (every node verifies every record and
heartbeat on every receipt, duplicates included). Runs marked "once per envelope" verify each
distinct signed envelope once per run (testkit.gossip_sim.verify_once_per_envelope; verdicts
are unchanged, only repeated checks of the same bytes are skipped). Stores are IndexedStore (the
same answers as MemoryStore, tested; its digest is not recomputed from every entry). Neither
changes a message or a byte counted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from apps.providers.gossip import Limits
from testkit.gossip_sim import KINDS, IndexedStore, SimNetwork, converged_network, verify_once_per_envelope, wire_size
from testkit.records import holdings

from .report import headline, print_table, write_results

SIZES = (25, 50, 100, 200, 1000)
QUICK_SIZES = (25, 50, 100, 200)
SEEDS = (1, 2, 3)
QUICK_SEEDS = (1, 2)
VERIFY_EVERY_UP_TO = 200  # N above this verifies once per envelope unless --verify-all
QUICK_VERIFY_EVERY_UP_TO = 100
C = 1.0  # the bound checked: rounds <= C * log2 N
MAX_ROUNDS = 60
SMALL_HOLDINGS = 4
STEADY_HOLDINGS = 500
STEADY_SIZES = (200, 1000)
QUICK_STEADY_SIZES = (200,)
ROUND_MS = 5_000
ROUNDS_PER_MINUTE = 60_000 // ROUND_MS
RECORD_VERDICTS = ("accepted", "duplicate", "replayed", "forged", "expired", "skewed", "oversized", "malformed")


@contextlib.contextmanager
def verification(every_receipt: bool) -> Iterator[Counter[str]]:
    if every_receipt:
        yield Counter()
    else:
        with verify_once_per_envelope() as counts:
            yield counts


def network(n: int, *, seed: int, topology: str, n_holdings: int = SMALL_HOLDINGS,
            distinct_holdings: bool = False) -> SimNetwork:
    """N nodes, node i configured with one peer: node 0 ("node 0") or a random earlier node ("random earlier").

    Records of `n_holdings` holdings: the same experts on every node (SimNetwork.add's default) unless
    `distinct_holdings`, where node i holds testkit.records.holdings(n_holdings, seed=i).
    """
    net = SimNetwork(limits=Limits(), rng=random.Random(seed), store_factory=IndexedStore, drop_refused=True)
    pick = random.Random(1000 + seed)
    nodes = []
    for i in range(n):
        peers = [] if i == 0 else [nodes[0 if topology == "node 0" else pick.randrange(i)].pid]
        nodes.append(net.add(i, seeds=peers, n_holdings=n_holdings,
                             holdings=holdings(n_holdings, seed=i) if distinct_holdings else None))
    return net


def convergence_run(n: int, *, seed: int, topology: str, every_receipt: bool) -> dict[str, Any]:
    net = network(n, seed=seed, topology=topology)
    started = time.perf_counter()
    with verification(every_receipt) as checks:
        try:
            rounds: int | None = net.run_until_converged(max_rounds=MAX_ROUNDS)
        except AssertionError:  # SimNetwork's "no convergence in max_rounds"
            rounds = None
    known = [len(node.known()) for node in net.nodes.values()]
    return {"n": n, "seed": seed, "topology": topology, "rounds": rounds, "wall_s": time.perf_counter() - started,
            "every_receipt": every_receipt, "distinct_verified": checks["verified"], "reused": checks["reused"],
            "refused": dict(net.refused), "known_min": min(known), "known_mean": statistics.fmean(known),
            "verdicts": dict(net.counts())}


def convergence_row(runs: list[dict[str, Any]]) -> list[Any]:
    n = runs[0]["n"]
    log_n = math.log2(n)
    rounds = sorted(math.inf if r["rounds"] is None else r["rounds"] for r in runs)  # inf: not in MAX_ROUNDS

    def show(value: float) -> str:
        return f">{MAX_ROUNDS}" if value == math.inf else f"{value:g}"

    median = statistics.median(rounds)
    missed = rounds.count(math.inf)
    return [n, len(runs), show(rounds[0]), show(median), show(rounds[-1]), f"{log_n:.2f}",
            show(median / log_n) if median == math.inf else f"{median / log_n:.2f}",
            ("yes" if rounds[-1] <= C * log_n else "no") + (f" ({missed} not in {MAX_ROUNDS})" if missed else ""),
            sum(sum(r["refused"].values()) for r in runs), min(r["known_min"] for r in runs),
            "every receipt" if runs[0]["every_receipt"] else "once per envelope",
            f"{statistics.fmean(r['wall_s'] for r in runs):.1f}"]


CONVERGENCE_COLUMNS = ["N", "runs", "rounds min", "median", "max", "log2 N", "median/log2 N", f"max <= {C:g}*log2 N",
                       "msgs refused whole", "fewest known", "signatures checked", "wall s/run"]


def no_rumors(net: SimNetwork) -> bool:
    return not any(node.gossip.store.rumors() for node in net.nodes.values())


def minute(net: SimNetwork, first_round: int) -> dict[str, Any]:
    """Run 12 rounds (one simulated minute); what each node sent, what was received, expired, refused."""
    sent_before = {pid: Counter(node.sent_by_kind) for pid, node in net.nodes.items()}
    counts_before, refused_before = net.counts(), sum(net.refused.values())
    started = time.perf_counter()
    for r in range(first_round, first_round + ROUNDS_PER_MINUTE):
        net.round(round_no=r)
    wall_s = time.perf_counter() - started
    sent = [node.sent_by_kind - sent_before[pid] for pid, node in net.nodes.items()]
    totals = sorted(sum(kinds.values()) for kinds in sent)
    counts = net.counts()
    ages = sorted(net.now_ms - alive for node in net.nodes.values()
                  for pid, (_, alive) in node.gossip.store.digest().items() if pid != node.pid)
    return {
        "bytes_per_node": {"mean": statistics.fmean(totals), "p95": totals[math.ceil(0.95 * len(totals)) - 1],
                           "max": totals[-1], **{k: statistics.fmean(s[k] for s in sent) for k in KINDS}},
        "records_received": sum(counts[v] - counts_before[v] for v in RECORD_VERDICTS),
        "expired_removed": counts["expired_removed"] - counts_before["expired_removed"],
        "refused": sum(net.refused.values()) - refused_before,
        "converged_after": net.converged(),
        # how old the newest liveness a node holds of another provider is, at the end of the minute
        "liveness_age_s": {"p50": ages[len(ages) // 2] / 1000, "max": ages[-1] / 1000},
        "wall_s": wall_s,
    }


def steady_state(n: int, *, every_receipt: bool) -> dict[str, Any]:
    """Bytes each node sends per minute, 500 holdings per node: a warm-up minute, then a measured one."""
    started = time.perf_counter()
    joined = n <= 200
    join: dict[str, Any] = {}
    with verify_once_per_envelope() as join_checks:  # the join moves every ~100 KB record many times
        if joined:
            net = network(n, seed=1, topology="node 0", n_holdings=STEADY_HOLDINGS, distinct_holdings=True)
            join["rounds_to_converge"] = rounds = net.run_until_converged(max_rounds=MAX_ROUNDS)
            while not no_rumors(net):
                rounds += 1
                net.round(round_no=rounds)
            join["rounds_until_no_rumor"] = rounds
            join["bytes_per_node"] = {k: statistics.fmean(node.sent_by_kind[k] for node in net.nodes.values())
                                      for k in KINDS}
        else:
            net = converged_network(n, rng=random.Random(1),
                                    holdings_for=lambda i: holdings(STEADY_HOLDINGS, seed=i))
            net.drop_refused = True
            rounds = 0
    join["wall_s"] = time.perf_counter() - started
    join["distinct_verified"] = join_checks["verified"]
    with verification(every_receipt) as checks:
        minutes = [minute(net, rounds + 1), minute(net, rounds + 1 + ROUNDS_PER_MINUTE)]
    envelope_bytes = statistics.fmean(wire_size(node.record.envelope()) for node in net.nodes.values())
    return {
        "n": n, "start": "joined" if joined else "preloaded", "holdings": STEADY_HOLDINGS, "join": join,
        "record_bytes": statistics.fmean(node.record.size for node in net.nodes.values()),
        "envelope_bytes": envelope_bytes, "naive_bytes_per_node_minute": n * envelope_bytes,
        "minutes": minutes, "every_receipt": every_receipt,
        "distinct_verified": checks["verified"], "reused": checks["reused"],
    }


def steady_rows(s: dict[str, Any]) -> list[list[Any]]:
    kb = 1000
    naive = s["naive_bytes_per_node_minute"]
    rows = []
    for i, m in enumerate(s["minutes"]):
        b = m["bytes_per_node"]
        rows.append([
            s["n"], s["start"], "1 (warm-up)" if i == 0 else "2", f"{s['envelope_bytes'] / kb:.1f}",
            f"{b['mean'] / kb:.1f}", f"{b['p95'] / kb:.1f}", *(f"{b[k] / kb:.1f}" for k in KINDS),
            f"{naive / kb:.0f}", f"{naive / b['mean']:.1f}", m["records_received"], m["expired_removed"],
            f"{m['liveness_age_s']['p50']:.0f}/{m['liveness_age_s']['max']:.0f}",
            "every receipt" if s["every_receipt"] else "once per envelope", f"{m['wall_s']:.0f}"])
    return rows


STEADY_COLUMNS = ["N", "start", "minute", "envelope KB", "KB/node/min mean", "p95", *(f"{k} KB" for k in KINDS),
                  "naive N*envelope KB", "naive/measured", "records received", "entries expired",
                  "liveness age p50/max s", "signatures checked", "wall s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"N up to 200, {len(QUICK_SEEDS)} seeds, N=200 verified once per envelope, "
                             "steady state at N=200 only")
    parser.add_argument("--verify-all", action="store_true",
                        help="convergence runs verify every signature on every receipt at every N (N=1,000: "
                             "~7 min a run here); the steady state keeps its setting")
    args = parser.parse_args()
    sizes, seeds = (QUICK_SIZES, QUICK_SEEDS) if args.quick else (SIZES, SEEDS)
    every_up_to = QUICK_VERIFY_EVERY_UP_TO if args.quick else VERIFY_EVERY_UP_TO
    converge_every_up_to = max(sizes) if args.verify_all else every_up_to
    started = time.perf_counter()

    star: dict[int, list[dict[str, Any]]] = {}
    for n in sizes:
        star[n] = [convergence_run(n, seed=s, topology="node 0", every_receipt=n <= converge_every_up_to)
                   for s in seeds]
        print(f"  converged N={n}: rounds {[r['rounds'] for r in star[n]]}, "
              f"{sum(r['wall_s'] for r in star[n]):.0f} s", flush=True)
    tree: dict[int, list[dict[str, Any]]] = {}
    for n in (n for n in sizes if n <= 200):
        tree[n] = [convergence_run(n, seed=s, topology="random earlier", every_receipt=False) for s in seeds]
        print(f"  random earlier N={n}: rounds {[r['rounds'] for r in tree[n]]}", flush=True)
    steady = []
    for n in QUICK_STEADY_SIZES if args.quick else STEADY_SIZES:
        steady.append(steady_state(n, every_receipt=n <= every_up_to))
        print(f"  steady state N={n}: join {steady[-1]['join']['wall_s']:.0f} s, minutes "
              f"{[round(m['wall_s']) for m in steady[-1]['minutes']]} s", flush=True)

    print_table(f"Convergence: each node configured with node 0 as its only peer, {SMALL_HOLDINGS} holdings "
                f"per record, seeds {list(seeds)}, default Limits", CONVERGENCE_COLUMNS,
                [convergence_row(runs) for runs in star.values()])
    print_table(f"Convergence: each node configured with a random earlier node as its only peer, seeds "
                f"{list(seeds)} (at most {MAX_ROUNDS} rounds)", CONVERGENCE_COLUMNS,
                [convergence_row(runs) for runs in tree.values()])
    print_table(f"Steady state: bytes each node sends per minute, {STEADY_HOLDINGS} holdings per node; minute 1 "
                f"warms up (the TTL is a minute), minute 2 is the measurement (KB = 1000 bytes)", STEADY_COLUMNS,
                [row for s in steady for row in steady_rows(s)])
    for s in steady:
        if s["start"] == "joined":
            j = s["join"]
            print(f"\nN={s['n']} joined: converged in {j['rounds_to_converge']} rounds, last rumor spent in round "
                  f"{j['rounds_until_no_rumor']}; sent per node by then: "
                  + ", ".join(f"{k} {j['bytes_per_node'][k] / 1e6:.1f} MB" for k in KINDS)
                  + " (pushes offer versions; records travel in the ack2 to peers that asked for them)")
    for s in steady:
        last = s["minutes"][-1]
        if last["expired_removed"] or last["records_received"]:
            print(f"\nN={s['n']}: not a steady state. In the measured minute {last['expired_removed']} entries "
                  f"expired (their provider's newest heartbeat had not reached the node within the TTL) and "
                  f"{last['records_received']} whole records were received again; "
                  f"{last['refused']} messages were refused whole.")
    for runs in tree.values():
        missed = [r for r in runs if r["rounds"] is None]
        if missed:
            print(f"\nRandom earlier peer, N={runs[0]['n']}: {len(missed)} of {len(runs)} runs not converged in "
                  f"{MAX_ROUNDS} rounds; the node knowing fewest knew {min(r['known_min'] for r in missed)} of "
                  f"{runs[0]['n']}. A node's configured peer is one candidate among all it knows, and once its own "
                  f"record is no longer a rumor its push carries only its heartbeat, which a node lacking the "
                  f"record drops; groups that formed apart join only when a member happens to pick its "
                  f"configured peer for a sync.")
    print("\nSignatures: 'every receipt' = every record and heartbeat verified (ed25519) each time a node "
          "receives it; 'once per envelope' = each distinct signed envelope verified once per run, the verdict "
          "remembered (testkit.gossip_sim.verify_once_per_envelope). Steady-state joins are always once per "
          "envelope; N=1,000 in the steady state starts preloaded (join skipped).")
    if any(r["refused"] for runs in (*star.values(), *tree.values()) for r in runs):
        print("Messages refused (oversized): a push of 256 rumors also carries the sender's own heartbeat, "
              "513 items where Gossip.receive accepts at most 2*256; the receiving node refuses it whole.")
    print(f"Total wall time {time.perf_counter() - started:.0f} s")
    write_results("gossip", {
        "quick": args.quick, "C": C, "max_rounds": MAX_ROUNDS, "limits": dataclasses.asdict(Limits()),
        "convergence": {"node 0": star, "random earlier": tree}, "steady_state": steady,
    }, [*(headline(f"gossip convergence, N={runs[0]['n']}, one bootstrap peer (slowest seed)",
                   None if any(r["rounds"] is None for r in runs) else max(r["rounds"] for r in runs), "rounds",
                   reference="log2 N", reference_value=math.log2(runs[0]["n"]), target=f"≤ {C}·log2 N")
          for runs in star.values()),
        *(headline(f"gossip bytes per node per minute, N={s['n']} ({s['holdings']} holdings each)",
                   s["minutes"][-1]["bytes_per_node"]["mean"], "B", reference="naive: one full record per peer",
                   reference_value=s["naive_bytes_per_node_minute"]) for s in steady)])


if __name__ == "__main__":
    main()
