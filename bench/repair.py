"""Repair selection benchmark: one pass over a Kimi-K3-sized model against the 0.5 s target.

Run: .venv/bin/python -m bench.repair

Views are synthetic: 61 layers x 898 experts (896 routed + 2 shared: 54,778 experts), 500 candidate
providers (64-hex ids, as the node's provider ids are), policy min 2 / max 8 / hot 1000 tps / headroom 2,
every holder's capacity 1000 rows/s, ~1% of experts hot (demand 4000: target 8). Cases:
  steady  a network with some skew: ~5% of experts held once (under), ~2% held by 9-11 (over), the rest
          by 2-7 (the hot ones among them by 8, i.e. at target; the others above 2 get drop rows, as
          after a demand peak), every expert with a blob URI;
  worst   every expert held once (all under-replicated: a model just loaded by one node each).

"full" is select_repairs over the whole view (every row: what a test or the dashboard shows), "only" is
select_repairs(only=a candidate) (what each node's pass runs). Times are the wall-clock median of REPEAT
runs, the best in brackets, then the median process CPU time. "met" compares the node's pass (only=)
with the target; the full pass is reported beside it.

References measured in the same run, so machines compare:
  hash    numpy scoring the same (expert, provider) pairs (the selection's own score kernel, alone): the
          floor a vectorized pass cannot beat; "x hash" is full / hash.
  python  the hash rule in plain Python integers over a 1% sample of those pairs, extrapolated: what a
          per-pair loop would cost; "python x" is python / full.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from apps.repair.selection import ExpertView, RepairRules, _keys, _scores, key64, replication_target, select_repairs
from core.experts.backends import cpu_isa

from .report import headline, print_table, timed, write_results

TARGET_S = 0.5
LAYERS, EXPERTS = 61, 898  # Kimi K3: 896 routed + 2 shared per layer (bench/planner.py's KIMI_K3)
N_PROVIDERS = 500
RULES = RepairRules(min_replication=2, max_replication=8, hot_threshold_tps=1000.0, headroom=2.0)
MODEL_ID = "kimi-k3"
BLOB = "tenzro://blob/" + "0" * 64
REPEAT = 5
MASK = (1 << 64) - 1


def providers(rng: np.random.Generator) -> list[str]:
    return [hashlib.sha256(rng.bytes(16)).hexdigest() for _ in range(N_PROVIDERS)]


def synthetic_view(rng: np.random.Generator, ids: list[str], *, worst: bool) -> list[ExpertView]:
    """(LAYERS * EXPERTS) views: holder counts per the case (module docstring)."""
    n = LAYERS * EXPERTS
    hot = rng.random(n) < 0.01
    if worst:
        counts = np.ones(n, dtype=np.intp)
    else:
        u = rng.random(n)
        counts = np.where(u < 0.05, 1, np.where(u < 0.07, rng.integers(9, 12, n), rng.integers(2, 8, n)))
        counts = np.where(hot & (counts >= 2) & (counts <= 8), 8, counts)
    views = []
    for i, count in enumerate(counts.tolist()):
        holders = tuple(ids[j] for j in rng.choice(N_PROVIDERS, size=count, replace=False))
        tps = 4000.0 if hot[i] else 50.0 * count  # hot: target ceil(4000 x 2 / 1000) = 8
        views.append(ExpertView(i // EXPERTS, i % EXPERTS, holders, BLOB, tps, 1000.0))
    return views


def score_pairs(expert_keys: np.ndarray, provider_keys: np.ndarray) -> None:
    """Score every (expert, provider) pair in the selection's chunks, keeping nothing."""
    chunk = max(1, (1 << 20) // provider_keys.size)
    for a in range(0, expert_keys.size, chunk):
        _scores(expert_keys[a:a + chunk], provider_keys)


def python_reference(pairs: int, ids: list[str], sample: float = 0.01) -> float:
    """Seconds a plain-Python per-pair loop of the same rule would take for `pairs`, from a sample."""
    n = max(1, int(pairs * sample) // N_PROVIDERS)
    t0 = time.perf_counter()
    for expert in range(n):
        e = key64(f"{MODEL_ID}/0/{expert}")
        best = max(ids, key=lambda p, e=e: (_splitmix64(e ^ key64(p)), p))
        assert best
    return (time.perf_counter() - t0) * pairs / (n * N_PROVIDERS)


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def one_pass() -> list[dict[str, Any]]:
    rows, table = [], []
    for case, worst in (("steady", False), ("worst", True)):
        rng = np.random.default_rng(1)
        ids = providers(rng)
        views = synthetic_view(rng, ids, worst=worst)
        me = ids[0]
        full, selection = timed(lambda v=views, c=ids: select_repairs(MODEL_ID, v, c, RULES), REPEAT)
        only, mine = timed(lambda v=views, c=ids, m=me: select_repairs(MODEL_ID, v, c, RULES, only=m), REPEAT)
        under = sum(1 for v in views if len(v.holders) < replication_target(v.committed_tps, v.capacity_tps, RULES))
        over = sum(1 for v in views if len(v.holders) > replication_target(2 * v.committed_tps, v.capacity_tps, RULES))
        pairs = under * N_PROVIDERS
        expert_keys = np.random.default_rng(2).integers(0, 1 << 63, size=under, dtype=np.uint64)
        provider_keys = _keys(ids)
        hash_t, _ = timed(lambda k=expert_keys, p=provider_keys: score_pairs(k, p), REPEAT)
        python_s = python_reference(pairs, ids)
        row = {"case": case, "experts": len(views), "providers": N_PROVIDERS, "under": under, "over": over,
               "considered": selection.considered, "rows": len(selection.rows), "rows_only": len(mine.rows),
               "full": full.to_dict(), "only": only.to_dict(), "target_ms": TARGET_S * 1e3,
               "only_ratio": only.median_s / TARGET_S, "full_ratio": full.median_s / TARGET_S,
               "hash_pairs": pairs, "hash": hash_t.to_dict(), "x_hash": full.median_s / hash_t.median_s,
               "python_extrapolated_ms": python_s * 1e3, "python_x": python_s / full.median_s}
        rows.append(row)
        table.append([case, f"{LAYERS}x{EXPERTS}", N_PROVIDERS, f"{under}/{over}", full.cell(), only.cell(),
                      f"{row['rows']} ({row['rows_only']})", row["target_ms"], row["only_ratio"],
                      row["only_ratio"] <= 1, row["full_ratio"] <= 1, hash_t.median_s * 1e3,
                      f"{row['x_hash']:.2f}x", python_s * 1e3, f"{row['python_x']:.0f}x"])
    print_table(f"Repair selection, one pass, {N_PROVIDERS} candidate providers (ms)",
                ["case", "layers x experts", "providers", "under/over", "full [best] cpu", "only=self [best] cpu",
                 "rows (self)", "target", "only/target", "met", "full met", "hash same pairs", "x hash",
                 "python (1%, extrap.)", "python x"], table)
    return rows


def cpu_line() -> str:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model}, {os.cpu_count()} cores, isa {cpu_isa()}, numpy {np.__version__}"


# One entry per table: (name in the JSON results, function that prints it and returns its rows).
TABLES: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = [
    ("one_pass", one_pass),
]


def main() -> None:
    print(cpu_line())
    results = {name: table() for name, table in TABLES}
    write_results("repair", {"cpu": cpu_line(), "tables": results},
                  [headline(f"repair pass (only=self), {r['case']}", r["only"]["median_ms"], "ms",
                            reference="numpy hash kernel on the same pairs", reference_value=r["hash"]["median_ms"],
                            target=f"≤ {r['target_ms']:.0f} ms") for r in results["one_pass"]])


if __name__ == "__main__":
    main()
