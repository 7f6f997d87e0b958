"""Receipt cost per batch against the expert compute it proves, at Qwen3-30B-A3B dimensions.

    .venv/bin/python -m bench.receipts

One expert of Qwen3-30B-A3B (d_model 2048, moe_intermediate_size 768) prepared as q4_k_m (the
default preset) and as q8_0, batches of 8 and 64 tokens carried in Q8_0 (the wire default):

* compute: the expert forward on the holder's CPU backend (the reference, same run);
* create: what signing adds on the holder: the top-k sketch of its encoded answer (read from
  the Q8_0 blocks, apps/receipts/topk_kernel.py), BLAKE3 of the carrier and of the sketch, the
  canonical body, ed25519 sign;
* verify: what the router adds beside the decode it needs anyway: the same sketch, the
  hashes, the canonical body, ed25519 verify;
* share = (create + verify) / compute. Target: at most 5%.

Then the same per batch when a holder answers E batches of one layer step in one multi-expert
request (docs/protocol.md, "Multi-expert execute"): one v2 receipt, one carrier hash, one signature
and one verification for all E, each batch its own sketch; per-batch cost = the receipt's / E.

Last, the sketch alone, per row, for each kernel this machine has (apps/receipts/_q8_sketch.c's
variants, and the numba kernel they are held to as the reference), over 64 distinct rows.

Medians of repeated runs; prints the CPU kernel variant the backend picked and the sketch's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
from nacl.signing import SigningKey

from apps.receipts import topk_kernel
from apps.receipts.commitment import (
    Expected,
    ExpectedBatches,
    ReceiptSigner,
    blake3_hex,
    verify_batches_receipt,
    verify_receipt,
)
from bench.report import headline, print_table, write_results
from core.experts.backends import cpu_isa, quant_matmul_variants
from core.experts.ffn import build_expert, expert_forward
from core.experts.selection import select_backend
from core.formats.expert_payload import encode_expert_payload
from core.formats.wire import decode_rows, encode_rows

D_MODEL, D_FF, TOPK = 2048, 768, 16
BATCHES = (8, 64)
EXPERTS_PER_REQUEST = (2, 8)  # a decode step's top-8 over 4 holders; a prefill's share of a 128-expert layer
QUANTS = ("q4_k_m", "q8_0")
TARGET = 0.05


def median_s(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm: first-call allocations, thread pools
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    backend = select_backend()
    key = SigningKey(rng.bytes(32))
    signer = ReceiptSigner(key)
    weights = {name: (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
               for name, shape in (("gate", (D_FF, D_MODEL)), ("up", (D_FF, D_MODEL)), ("down", (D_MODEL, D_FF)))}
    rows_out, rows_multi, results = [], [], []
    for quant in QUANTS:
        payload = encode_expert_payload(gate=weights["gate"], up=weights["up"], down=weights["down"], quant=quant,
                                        model_id="Qwen/Qwen3-30B-A3B", layer=0, expert=0)
        expert = build_expert(payload, backend)
        for tokens in BATCHES:
            hidden = rng.standard_normal((tokens, D_MODEL)).astype(np.float32)
            carrier = encode_rows(hidden, "q8_0")
            x = decode_rows(carrier, "q8_0", tokens=tokens, d_model=D_MODEL)
            reps = 60 if tokens == 8 else 25
            compute = median_s(lambda x=x, expert=expert: expert_forward(expert, x, backend), reps)
            out = expert_forward(expert, x, backend)
            answer = encode_rows(out, "q8_0")
            token_indices = list(range(tokens))

            def create(answer=answer, carrier=carrier, token_indices=token_indices) -> dict:
                return signer(model_id="Qwen/Qwen3-30B-A3B", layer=0, expert=0, token_indices=token_indices,
                              d_model=D_MODEL, input_encoding="q8_0", input_carrier=carrier,
                              output_encoding="q8_0", answer=answer, k=TOPK)

            wire = create()
            seen = decode_rows(answer, "q8_0", tokens=tokens, d_model=D_MODEL)
            expect = Expected(signer.provider_id, "Qwen/Qwen3-30B-A3B", 0, 0, token_indices, D_MODEL, "q8_0",
                              blake3_hex(carrier), "q8_0", TOPK)
            created = median_s(create, reps * 4)
            verified = median_s(lambda wire=wire, expect=expect, seen=seen, answer=answer:
                                verify_receipt(wire, expect, seen, answer), reps * 4)
            share = (created + verified) / compute
            rows_out.append([quant, tokens, round(compute * 1e3, 3), round(created * 1e6, 1),
                             round(verified * 1e6, 1), f"{share:.2%}", "yes" if share <= TARGET else "NO"])
            results.append({"quant": quant, "tokens": tokens, "compute_s": compute, "create_s": created,
                            "verify_s": verified, "share": share, "target": TARGET})
            for n in EXPERTS_PER_REQUEST:
                created_n, verified_n = _batches(signer, carrier, answer, seen, tokens, n, reps)
                share_n = (created_n + verified_n) / n / compute
                rows_multi.append([quant, tokens, n, round(compute * 1e3, 3), round(created_n / n * 1e6, 1),
                                   round(verified_n / n * 1e6, 1), f"{share_n:.2%}",
                                   "yes" if share_n <= TARGET else "NO"])
                results.append({"quant": quant, "tokens": tokens, "experts_per_request": n, "compute_s": compute,
                                "create_s": created_n / n, "verify_s": verified_n / n, "share": share_n,
                                "target": TARGET})
    variant = (quant_matmul_variants() or ["numba/numpy"])[0]
    sketch_rows = _sketch_per_row(rng)
    print(f"cpu: {cpu_isa()}, kernel variant: {variant}, backend: {backend.name}, top-k {TOPK}, wire q8_0, "
          f"sketch kernel: {topk_kernel.sketch_variant()}")
    print_table("Receipt create + verify per batch vs the expert compute (Qwen3-30B-A3B expert, 2048 x 768)",
                ["quant", "tokens", "compute ms", "create µs", "verify µs", "share", f"≤ {TARGET:.0%}"], rows_out)
    print_table("The same per batch, E batches of one layer step under one v2 receipt (create and verify "
                "divided by E)", ["quant", "tokens", "E", "compute ms", "create µs / batch", "verify µs / batch",
                                  "share", f"≤ {TARGET:.0%}"], rows_multi)
    numba_us = sketch_rows["numba"]
    print_table(f"The Q8_0 sketch alone, per row (d_model {D_MODEL}, k {TOPK}, 64 distinct rows)",
                ["kernel", "µs / row", "× numba"],
                [[name, round(us, 3), round(us / numba_us, 2)] for name, us in sketch_rows.items()])
    write_results("receipts", {"cpu_isa": cpu_isa(), "kernel_variant": variant, "backend": backend.name,
                               "topk": TOPK, "rows": results, "sketch_kernel": topk_kernel.sketch_variant(),
                               "sketch_us_per_row": sketch_rows},
                  [headline(f"receipt create + verify, {r['quant']}, {r['tokens']} tokens"
                            + (f", {r['experts_per_request']} batches per receipt" if "experts_per_request" in r
                               else ""),
                            (r["create_s"] + r["verify_s"]) * 1e3, "ms", reference="the expert compute it proves",
                            reference_value=r["compute_s"] * 1e3, target=f"≤ {TARGET:.0%} of compute")
                   for r in results])


def _sketch_per_row(rng: np.random.Generator, tokens: int = 64) -> dict[str, float]:
    """µs per row of each sketch kernel here (best C variant first, the numba reference last)."""
    answer = encode_rows(rng.standard_normal((tokens, D_MODEL)).astype(np.float32), "q8_0")
    built = topk_kernel._q8_sketch.variants() if topk_kernel._q8_sketch is not None else []
    return {name: median_s(lambda name=name: topk_kernel.sketch_q8_0(answer, tokens=tokens, d_model=D_MODEL, k=TOPK,
                                                                      variant=name), 200) / tokens * 1e6
            for name in [*built, "numba"]}


def _batches(signer: ReceiptSigner, carrier: bytes, answer: bytes, seen: np.ndarray, tokens: int, n: int,
             reps: int) -> tuple[float, float]:
    """(create, verify) seconds of one v2 receipt over `n` batches of `tokens` rows each (the same rows
    and answer in every batch: the cost does not depend on the values)."""
    rows = list(range(tokens))
    batches = [(e, rows, answer) for e in range(n)]
    wire = signer.batches(model_id="Qwen/Qwen3-30B-A3B", layer=0, token_indices=rows, d_model=D_MODEL,
                          input_encoding="q8_0", input_carrier=carrier, output_encoding="q8_0", k=TOPK,
                          batches=batches)
    expect = ExpectedBatches(signer.provider_id, "Qwen/Qwen3-30B-A3B", 0, rows, D_MODEL, "q8_0",
                             blake3_hex(carrier), "q8_0", TOPK, [(e, rows) for e in range(n)])
    answers = [(seen, answer)] * n
    created = median_s(lambda: signer.batches(model_id="Qwen/Qwen3-30B-A3B", layer=0, token_indices=rows,
                                              d_model=D_MODEL, input_encoding="q8_0", input_carrier=carrier,
                                              output_encoding="q8_0", k=TOPK, batches=batches), reps * 2)
    verified = median_s(lambda: verify_batches_receipt(wire, expect, answers), reps * 2)
    return created, verified


if __name__ == "__main__":
    main()
