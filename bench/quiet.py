"""The first generation after a quiet spell, against one right after it, over a path with a round trip.

    .venv/bin/python -m bench.quiet [--quick] [--rtt-ms 50] [--quiet-s 70] [--pairs 3]

What is measured, and how. Five real nodes (`tenzro node run`) on loopback, each behind a netem relay
(testkit/impaired.py) that delays every datagram half of `--rtt-ms` (so every QUIC exchange between the
router and a holder pays that round trip; HTTP from this process is not delayed): a router with the dense
part and gates of bench/generate.py's 2x128 model (Qwen3-30B-A3B widths, Q8_0 experts) and four holders,
expert e on holder e % 4. After a warm-up, each pair is `--quiet-s` seconds with no request (past QUIC's
60 s idle timeout by default), one generation ("after quiet"), then one right after it ("right after",
the reference: the same run and connections, without the quiet). The figure is each generation's TTFT
(its record's `ttft_ms`: the 32-token prompt's prefill, whose MoE layers are the first exchange with every
holder after the quiet). Two variants, each on fresh nodes:

* `kept`: the default. The router's QUIC pool keeps a holder's connection for TENZRO_FORWARD_IDLE_CLOSE_S
  (600 s) after its last forward, and PINGs it when quiet, so QUIC's idle timeout does not end it.
* `closed`: TENZRO_FORWARD_IDLE_CLOSE_S=30, shorter than the quiet: every pair's first generation opens new
  connections, each a handshake and a congestion window starting from its initial size, as every
  forward after a quiet minute did before the keep-alive (docs/performance.md, "The first generation after
  a quiet spell").
"""

from __future__ import annotations

import os

# As bench/forward.py: OpenBLAS threads that spin after each call would starve the node processes.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import testkit.nodes
from testkit.impaired import impaired_network
from testkit.netem import Impairment

from ._generate_model import Shape, write_model
from .forward import NODE_ENV
from .generate import PROMPT_TOKENS, generate, load, wait_converged
from .report import headline, print_table, write_results

VARIANTS = {"kept": {}, "closed": {"TENZRO_FORWARD_IDLE_CLOSE_S": "30"}}
NEW_TOKENS = 4  # TTFT is the figure: a few decode steps only end the generation


def run_variant(name: str, env: dict[str, str], work: Path, shape: Shape, folder: Path, experts: list[Path],
                args: argparse.Namespace) -> dict[str, Any]:
    """TTFT after each quiet spell and right after it, on fresh nodes started with `env`."""
    with impaired_network(5, work / f"nodes-{name}", {**NODE_ENV, **env}, use_namespaces=False) as network:
        router = network.nodes[0]
        load(network.nodes, shape, folder, experts)
        wait_converged(router, shape.model_id, len(experts))
        network.set(Impairment(delay_ms=args.rtt_ms / 2))
        prompt = [int(t) for t in np.random.default_rng(1).integers(0, shape.vocab_size, PROMPT_TOKENS)]
        for _ in range(3):  # warm: kernels, connections, the hedging book's latencies
            generate(router, shape.model_id, prompt, NEW_TOKENS, "q8_0")
        after, right = [], []
        for i in range(args.pairs):
            print(f"  {name}: pair {i + 1} of {args.pairs}, {args.quiet_s:g} s quiet", flush=True)
            time.sleep(args.quiet_s)
            after.append(generate(router, shape.model_id, prompt, NEW_TOKENS, "q8_0")["ttft_ms"])
            right.append(generate(router, shape.model_id, prompt, NEW_TOKENS, "q8_0")["ttft_ms"])
    return {"after_quiet_ms": after, "right_after_ms": right,
            "after_quiet_p50": statistics.median(after), "right_after_p50": statistics.median(right)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one pair per variant, 65 s quiet")
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="round trip the relays add between nodes")
    parser.add_argument("--quiet-s", type=float, default=None, help="seconds without a request (default 70)")
    parser.add_argument("--pairs", type=int, default=None, help="quiet spells per variant (default 3)")
    args = parser.parse_args()
    args.quiet_s = args.quiet_s if args.quiet_s is not None else 65.0 if args.quick else 70.0
    args.pairs = args.pairs if args.pairs is not None else 1 if args.quick else 3
    testkit.nodes.START_TIMEOUT_S = max(testkit.nodes.START_TIMEOUT_S, 300.0)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-quiet-"))
    try:
        shape = Shape.parse("2x128", None)
        folder, experts = write_model(work / shape.name, shape, np.random.default_rng(0))
        runs = {name: run_variant(name, env, work, shape, folder, experts, args) for name, env in VARIANTS.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(f"TTFT after {args.quiet_s:g} s without a request, against right after it: {shape.name} "
                f"(Q8_0 wire, {PROMPT_TOKENS}-token prompt), router + 4 holders behind relays adding a "
                f"{args.rtt_ms:g} ms round trip; medians of {args.pairs} pair(s), each variant on fresh nodes",
                ["router's pool", "after quiet ms", "right after ms", "ratio", "extra ms", "extra RTTs"],
                [[name, r["after_quiet_p50"], r["right_after_p50"], r["after_quiet_p50"] / r["right_after_p50"],
                  r["after_quiet_p50"] - r["right_after_p50"],
                  (r["after_quiet_p50"] - r["right_after_p50"]) / args.rtt_ms] for name, r in runs.items()])
    wall = time.monotonic() - started
    print(f"\nran {wall:.0f} s")
    write_results("quiet", {"quick": args.quick, "rtt_ms": args.rtt_ms, "quiet_s": args.quiet_s,
                            "pairs": args.pairs, "variants": runs, "wall_s": wall},
                  [headline(f"TTFT after {args.quiet_s:g} s quiet, {args.rtt_ms:g} ms RTT, {name}",
                            r["after_quiet_p50"], "ms", reference="right after",
                            reference_value=r["right_after_p50"]) for name, r in runs.items()])


if __name__ == "__main__":
    main()
