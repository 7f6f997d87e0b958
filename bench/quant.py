"""Quantization benchmark: throughput vs gguf-py in the same run, and quality vs baselines.

Run: .venv/bin/python -m bench.quant

Throughput is MB/s of f32 (input for quantize, output for dequantize), best of several
runs, measured back to back with the `gguf` package's kernels on the same bytes; the ratio
is ours / gguf.  gguf-py has no Q4_K/Q6_K quantizer, so those rows have no reference.
The "encoder" column says which quantizer ran (registry.encoder): "c" is the
apps.quantization._kquant_encoders extension (llama.cpp's reference Q4_K/Q6_K quantizers, bit for
bit), "numba" / "numpy" the Python paths; TENZRO_KQUANT_C=0 forces numpy for Q4_K/Q6_K.
When the C encoder ran, "numpy enc" is the numpy fallback timed on the same input and
"c/numpy" the speed-up.
Quality is the relative RMSE sqrt(mean (y-x)^2 / mean x^2) on Gaussian and Student-t (3 dof)
weights, next to the naive min/max encoder of the same layout (apps.quantization.baseline)
and llama.cpp reference figures (see LLAMA_CPP below).
"""

from __future__ import annotations

import time

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gq

from apps.quantization import kquant_c
from apps.quantization.baseline import NAIVE
from apps.quantization.registry import dequantize, encoder, quantize
from apps.quantization.types import GGMLType

from .report import print_table, write_results

SHAPES = [(768, 2048), (2048, 7168)]
TYPES = [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.F16, GGMLType.BF16]
K_QUANTS = (GGMLType.Q4_K, GGMLType.Q6_K)
GGUF = {t: GGMLQuantizationType[t.value] for t in GGMLType}

# llama.cpp figures for the same bits per weight, as published in llama.cpp's
# examples/quantize README (LLaMA-v1-7B, perplexity increase over F16 on wikitext-2).
# They are model-level perplexity deltas, not tensor RMSE; llama.cpp publishes no
# per-format relative-RMSE table for synthetic weights, so this column is context, not
# a like-for-like comparison.
LLAMA_CPP = {GGMLType.Q8_0: "+0.0004 ppl @ 8.50 bpw", GGMLType.Q6_K: "+0.0044 ppl @ 6.56 bpw",
             GGMLType.Q4_K: "+0.0535 ppl @ 4.83 bpw (Q4_K_M)"}


def best_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def throughput() -> list[dict]:
    rng = np.random.default_rng(0)
    results = []
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        mb = x.nbytes / 1e6
        repeat = 5 if x.size < 4_000_000 else 3
        for t in TYPES:
            blob = quantize(x, t)  # also JIT warm-up
            dequantize(blob, t, shape)
            slow = encoder(t) == "numpy" and t in K_QUANTS
            q_ours = best_time(lambda t=t, x=x: quantize(x, t), 1 if slow else repeat)
            q_numpy = None
            if t in K_QUANTS and encoder(t) == "c":  # the numpy fallback on the same input, for the speed-up
                kquant_c.set_enabled(False)
                try:
                    q_numpy = best_time(lambda t=t, x=x: quantize(x, t), 1)
                finally:
                    kquant_c.set_enabled(True)
            d_ours = best_time(lambda t=t, blob=blob, shape=shape: dequantize(blob, t, shape), repeat)
            ref_blob = blob if t.is_block else blob.view(np.uint16 if t != GGMLType.F32 else np.float32)
            if t == GGMLType.F16:
                ref_blob = blob.view(np.float16)
            if t == GGMLType.BF16:
                d_ref = best_time(lambda blob=blob: gq.BF16.dequantize(blob.view(np.uint8)), repeat)
            else:
                d_ref = best_time(lambda rb=ref_blob, t=t: gq.dequantize(rb, GGUF[t]), repeat)
            q_ref = None
            if t in (GGMLType.Q8_0, GGMLType.BF16, GGMLType.F16):
                q_ref = best_time(lambda t=t, x=x: gq.quantize(x, GGUF[t]), repeat)
            results.append({
                "shape": f"{shape[0]}x{shape[1]}", "type": t.value, "encoder": encoder(t),
                "quant_mb_s": mb / q_ours, "quant_ref_mb_s": mb / q_ref if q_ref else None,
                "quant_numpy_mb_s": mb / q_numpy if q_numpy else None,
                "dequant_mb_s": mb / d_ours, "dequant_ref_mb_s": mb / d_ref,
            })
    return results


def quality() -> list[dict]:
    rng = np.random.default_rng(1)
    data = {"gaussian": rng.standard_normal((256, 4096)).astype(np.float32),
            "student_t3": rng.standard_t(3, (256, 4096)).astype(np.float32)}
    rows = []
    for t in (GGMLType.Q8_0, GGMLType.Q6_K, GGMLType.Q4_K):
        row: dict = {"type": t.value, "bpw": t.bits_per_weight, "encoder": encoder(t)}
        for name, x in data.items():
            def rel(blob, x=x, t=t):
                y = dequantize(blob, t, x.shape)
                return float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x * x)))
            row[name] = rel(quantize(x, t))
            row[f"{name}_naive"] = rel(NAIVE[t](x)) if t in NAIVE else None
        rows.append(row)
    return rows


def main() -> None:
    tp = throughput()

    def f(v):
        return "-" if v is None else round(v, 1)

    def ratio(a, b):
        return "-" if b is None else f"{a / b:.2f}x"

    print_table(
        "quantize / dequantize throughput (MB/s of f32), ours vs gguf-py, same run",
        ["shape", "type", "encoder", "quant", "gguf quant", "ratio", "numpy enc", "c/numpy", "dequant",
         "gguf dequant", "ratio"],
        [[r["shape"], r["type"], r["encoder"], f(r["quant_mb_s"]), f(r["quant_ref_mb_s"]),
          ratio(r["quant_mb_s"], r["quant_ref_mb_s"]), f(r["quant_numpy_mb_s"]),
          ratio(r["quant_mb_s"], r["quant_numpy_mb_s"]),
          f(r["dequant_mb_s"]), f(r["dequant_ref_mb_s"]), ratio(r["dequant_mb_s"], r["dequant_ref_mb_s"])]
         for r in tp])
    q = quality()
    print_table(
        "relative RMSE (lower is better): searched scales vs naive min/max, same layout",
        ["type", "encoder", "bpw", "gaussian", "naive", "gain", "student-t(3)", "naive", "gain",
         "llama.cpp published"],
        [[r["type"], r["encoder"], r["bpw"], f"{r['gaussian']:.5f}",
          "-" if r["gaussian_naive"] is None else f"{r['gaussian_naive']:.5f}",
          "-" if r["gaussian_naive"] is None else f"{1 - r['gaussian'] / r['gaussian_naive']:.1%}",
          f"{r['student_t3']:.5f}", "-" if r["student_t3_naive"] is None else f"{r['student_t3_naive']:.5f}",
          "-" if r["student_t3_naive"] is None else f"{1 - r['student_t3'] / r['student_t3_naive']:.1%}",
          LLAMA_CPP[GGMLType(r["type"])]] for r in q])
    write_results("quant", {"throughput": tp, "quality": q,
                            "llama_cpp_published": {k.value: v for k, v in LLAMA_CPP.items()}})


if __name__ == "__main__":
    main()
