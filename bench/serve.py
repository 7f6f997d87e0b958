"""The OpenAI-compatible API's cost: streamed chat completions against the same generation's own steps.

    .venv/bin/python -m bench.serve [--rounds 5] [--new-tokens 32]

Setup: bench/generate.py's, shape 2x128 (two MoE layers of 128 experts at Qwen3-30B-A3B's widths, Q8_0
experts, a router holding none and four holders on loopback), plus the text files a hub checkpoint
carries (testkit.text_files: a word-level tokenizer of the model's vocabulary, a ChatML template).

Per round, one streamed `POST /v1/chat/completions` (OpenAI's chunk format, read as a client reads it,
over plain HTTP) of a 32-token chat prompt at temperature 0, then one `tenzro_moeGenerate` of the same
prompt ids (the node's own API, waiting for the record: the reference). Measured at the client:
time to the first streamed token (the first chunk with content) and the gaps between tokens; from the
records: the generation's TTFT (as the worker timed it, from receiving the call: tokenizing, checks,
prefill) and each decode step's ms. The API's overhead is what the client saw beyond what the worker
spent: per round, first token − record TTFT (the median of the rounds, each round's printed), and
the inter-token gap's p50 − the decode step's p50, as a share of a decode step (target ≤ 5 %).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import itertools
import json
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from testkit.nodes import TOKEN, NodeProcess
from testkit.redis_server import private_redis
from testkit.text_files import words, write_text_files

from ._generate_model import Shape, write_model
from .forward import _stop
from .generate import load, start_nodes, wait_converged
from .report import headline, print_table, write_results

TARGET_SHARE = 0.05


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stream_chat(http: httpx.Client, router: NodeProcess, key: str, model_id: str, messages: list[dict],
                max_new: int) -> dict[str, Any]:
    """One streamed chat completion: seconds to each content chunk from the request, and its id. Over a
    kept connection, as OpenAI's clients use one (a new httpx client costs ~40 ms of its own)."""
    body = {"model": model_id, "messages": messages, "max_tokens": max_new, "temperature": 0, "stream": True}
    arrivals, generation_id = [], None
    started = time.perf_counter()
    with http.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=600,
                     headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200, response.read()[:500]
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            generation_id = chunk["id"].split("-", 1)[1]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter() - started)
    return {"generation_id": generation_id, "arrivals": arrivals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    shape = Shape.parse("2x128")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-serve-"))
    nodes: list[NodeProcess] = []
    try:
        with private_redis() as redis_host:
            try:
                start_nodes(work, redis_host, nodes)
                router = nodes[0]
                folder, experts = write_model(work / shape.name, shape, np.random.default_rng(0))
                write_text_files(folder, vocab_size=shape.vocab_size)
                load(nodes, shape, folder, experts)
                wait_converged(router, shape.model_id, len(experts))
                key = router.result("tenzro_keysCreate", {"name": "bench", "requests_per_minute": 1_000_000},
                                    token=TOKEN)["key"]
                messages = [{"role": "user", "content": " ".join(words(400)[100:127])}]
                results = run(router, key, shape, messages, args)
            finally:
                with ThreadPoolExecutor(max(1, len(nodes))) as pool:
                    list(pool.map(_stop, nodes))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["wall_s"] = time.monotonic() - started
    write_results("serve", results, [
        headline("/v1 time to first streamed token", results["v1_first_token_ms"], "ms",
                 reference="the generation's TTFT", reference_value=results["record_ttft_ms"], target="+ ≤ 5 ms"),
        headline("/v1 inter-token p50", results["v1_gap_p50_ms"], "ms", reference="decode step p50",
                 reference_value=results["step_p50_ms"], target="overhead ≤ 5 % of a step")])


def run(router: NodeProcess, key: str, shape: Shape, messages: list[dict], args: argparse.Namespace
        ) -> dict[str, Any]:
    http = httpx.Client()
    for _ in range(2):  # warm: connections, the hedging book, the tokenizer
        stream_chat(http, router, key, shape.model_id, messages, 4)
    firsts, gaps, ttfts, steps, reference = [], [], [], [], []
    for _ in range(args.rounds):
        streamed = stream_chat(http, router, key, shape.model_id, messages, args.new_tokens)
        record = router.result("tenzro_moeGeneration", {"generation_id": streamed["generation_id"]})
        arrivals = streamed["arrivals"]
        firsts.append(arrivals[0] * 1e3)
        gaps += [(b - a) * 1e3 for a, b in itertools.pairwise(arrivals)]
        ttfts.append(record["ttft_ms"])
        steps += [s["ms"] for s in record["steps"] if s["phase"] == "decode"]
        answer = router.rpc("tenzro_moeGenerate", {"model_id": shape.model_id, "prompt_ids": record["prompt_ids"],
                                                   "max_new_tokens": args.new_tokens, "wait": True},
                            token=TOKEN, timeout=600)["result"]
        reference.append(answer)
    http.close()
    step_p50 = statistics.median(steps)
    out = {
        "shape": shape.name, "rounds": args.rounds, "new_tokens": args.new_tokens,
        "prompt_tokens": len(reference[0]["prompt_ids"]),
        "v1_first_token_ms": statistics.median(firsts), "record_ttft_ms": statistics.median(ttfts),
        "v1_gap_p50_ms": statistics.median(gaps), "v1_gap_p99_ms": quantile(gaps, 0.99),
        "step_p50_ms": step_p50, "step_p99_ms": quantile(steps, 0.99),
        "rpc_ttft_ms": statistics.median(r["ttft_ms"] for r in reference),
        "rpc_decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in reference),
    }
    # Per round, then the median: a round's TTFT varies more (the holders' two cores) than the API costs.
    overheads = [first - ttft for first, ttft in zip(firsts, ttfts, strict=True)]
    out["first_token_overhead_ms"] = statistics.median(overheads)
    out["first_token_overhead_ms_rounds"] = [round(v, 2) for v in overheads]
    out["gap_overhead_share"] = (out["v1_gap_p50_ms"] - step_p50) / step_p50
    print_table("The OpenAI-compatible API against the generation's own steps (2x128, Q8_0 wire, "
                f"{out['prompt_tokens']}-token chat prompt, {args.new_tokens} new tokens, {args.rounds} rounds)",
                ["what", "/v1 streamed (client)", "the same generation (worker)", "overhead", "target"],
                [["time to first token ms", round(out["v1_first_token_ms"], 2), round(out["record_ttft_ms"], 2),
                  f"{out['first_token_overhead_ms']:+.2f} ms", "≤ +5 ms"],
                 ["inter-token p50 ms", round(out["v1_gap_p50_ms"], 2), round(step_p50, 2),
                  f"{out['gap_overhead_share']:+.1%} of a step", "≤ 5 %"],
                 ["inter-token p99 ms", round(out["v1_gap_p99_ms"], 2), round(out["step_p99_ms"], 2), "", ""]])
    print_table("tenzro_moeGenerate of the same prompt ids (the node's own API, waited for)",
                ["TTFT ms", "decode tokens/s"],
                [[round(out["rpc_ttft_ms"], 2), round(out["rpc_decode_tokens_per_s"], 2)]])
    print(f"first-token overhead per round (ms): {out['first_token_overhead_ms_rounds']}")
    return out


if __name__ == "__main__":
    main()
