"""Expert-forward benchmark of the CPU compute backend (core.experts.backends).

    .venv/bin/python -m bench.runtime [--quick] [--kernels | --mxfp4]

Expert dims: Qwen3-30B-A3B (d_model 2048, d_ff 768) and DeepSeek-V3 (7168, 2048); batches
1, 8, 64, 256, 512. References measured in the same run:

* numpy sgemm peak: a 2048³ f32 matmul (GFLOP/s). The f32 expert path should reach >= 80% of
  it at batch >= 64.
* memory copy bandwidth: np.copyto over 256 MiB, counted STREAM-style (bytes read + written
  per second). The batch-1 bandwidth limit is weight bytes / that bandwidth.
* quantized experts above `fused_max_rows` (dequantized tiles + sgemm) against the f32 path at
  the same batch: target <= 1.25x (the same sgemm work plus a dequantize of 4-7x fewer bytes).
* crossover: the fused C kernel (tokens in chunks of 8) against the tiled dequantize+sgemm
  path at the same batch, both forced; `fused_max_rows` is set from it.
* batch-1 "cold" times flush the caches first by writing a 512 MiB buffer (this VM reports
  a 300 MiB L3, which would otherwise hold a whole f32 expert), as for a holder serving
  more experts than fit in cache. Q8_0 and q4_k_m batch-1 cold times are reported as a
  ratio to the f32 cold time (target <= 0.5: they read 4-7x fewer bytes).

* C kernel variants (core/experts/_quant_matmul.c): every copy this CPU runs (avx512vnni,
  avxvnni, avx2, scalar) on one thread, at Qwen3 gate|up shape: the fused matmul at batch 1
  and 8 and the row dequantizer, each as a ratio to the scalar copy; `--kernels` runs only
  this table. The variant the backend picked is the "cpu kernel" reference row.
* MXFP4 at gpt-oss-120b expert dims (d_model = d_ff = 2880), batch 1: an all-MXFP4 expert (as
  gpt-oss ships them) against the f32 one of the same dims, warm and with caches flushed. Weight
  bytes read per weight (target <= 0.6: 17/32 = 0.53) and the cold time as a ratio to f32's
  (target <= 0.5), with the C variant that ran; `--mxfp4` runs only this table (a few seconds).

Quantized weights are random *valid* GGML blocks (finite f16 scales): kernel speed does not
depend on the values, and quantizing a DeepSeek-size expert would dominate the run.
Every time is the minimum over repetitions: this 2-core VM is shared, and the minimum is
the least disturbed estimate.
"""

from __future__ import annotations

import os

# Thread pools, set before numpy/numba load them (the expert worker should do the same):
# OpenBLAS worker threads spin for ~2^28 cycles after each call and GNU OpenMP (numba's
# pool) spins too; on 2 cores each pool's spinning starves the other when BLAS and numba
# calls alternate (measured: the tiled path ran 20x slower without these).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
import time
from collections.abc import Callable

import numpy as np

from bench.report import headline, print_table, write_results
from core.experts import backends
from core.experts.backends import CpuBackend, TensorIn
from testkit.blocks import random_blocks

DIMS = {"Qwen3-30B-A3B": (2048, 768), "DeepSeek-V3": (7168, 2048)}
BATCHES = (1, 8, 64, 256, 512)
CROSSOVER_BATCHES = (8, 32, 128, 256)  # fused C kernel vs tiled dequantize+sgemm
QUANTS = {"Q8_0": ("Q8_0", "Q8_0", "Q8_0"), "q4_k_m": ("Q4_K", "Q4_K", "Q6_K")}
MXFP4_DIMS = ("gpt-oss-120b", 2880, 2880)  # name, d_model, d_ff


def best(fn: Callable[[], object], reps: int, before: Callable[[], object] | None = None) -> float:
    """Minimum wall time of `fn` over `reps` runs (after one warm-up); `before` is untimed."""
    fn()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def random_weight(rng: np.random.Generator, fmt: str, rows: int, n: int) -> np.ndarray:
    """u8 [rows, row_bytes] of random valid blocks. testkit's random_blocks sets f16 scales, so
    MXFP4 (an E8M0 byte per block) is made here: random codes, scales 2^-9..2^3."""
    if fmt != "MXFP4":
        return random_blocks(rng, fmt, rows, n)
    raw = rng.integers(0, 256, (rows, n // 32, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.integers(119, 132, (rows, n // 32), dtype=np.uint8)
    return raw.reshape(rows, -1)


def make_flush() -> Callable[[], None]:
    """Evicts the caches: writes a 512 MiB buffer (this VM reports a 300 MiB L3)."""
    flush_buf = np.zeros(128 * 1024 * 1024, dtype=np.float32)

    def flush() -> None:
        np.add(flush_buf, 1.0, out=flush_buf)

    return flush


def build(backend: CpuBackend, rng: np.random.Generator, d_model: int, d_ff: int, fmts: tuple[str, ...]):
    shapes = ((d_ff, d_model), (d_ff, d_model), (d_model, d_ff))
    tensors = []
    for fmt, (rows, n) in zip(fmts, shapes, strict=True):
        if fmt == "F32":
            data = rng.standard_normal((rows, n), dtype=np.float32).view(np.uint8)
        else:
            data = random_weight(rng, fmt, rows, n)
        tensors.append(TensorIn(fmt, (rows, n), data))
    return backend.prepare_expert(*tensors)


def kernel_variants(reps: int) -> list[list[object]]:
    """Each C kernel of every variant on one thread, [m, n] = Qwen3's gate|up [1536, 2048].

    Rows: format, kernel, then ms per variant (best first) and each one's speed-up over scalar.
    The variants take turns within each repetition (see bench.quant.encoder_variants)."""
    qm = backends._quant_matmul
    variants = backends.quant_matmul_variants()
    if qm is None:
        return []
    rng = np.random.default_rng(1)
    m, n = 1536, 2048
    rows: list[list[object]] = []
    for fmt in ("Q8_0", "Q4_K", "Q6_K", "MXFP4"):
        w = random_weight(rng, fmt, m, n)
        out = np.empty((m, n), dtype=np.float32)
        cases: dict[str, Callable[[str], object]] = {}
        for t in (1, 8):
            x = rng.standard_normal((t, n), dtype=np.float32)
            y = np.empty((t, m), dtype=np.float32)
            cases[f"matmul t={t}"] = lambda v, f=fmt, w=w, x=x, y=y, t=t: qm.matmul(f, w, m, n, x, t, y, v, 1)
        cases["dequantize rows"] = lambda v, f=fmt, w=w, o=out: qm.dequantize(f, w, m, n, 0, m, o, v, 1)
        for name, run in cases.items():
            secs = dict.fromkeys(variants, float("inf"))
            for v in variants:
                run(v)  # warm-up
            for _ in range(reps):
                for v in variants:
                    start = time.perf_counter()
                    run(v)
                    secs[v] = min(secs[v], time.perf_counter() - start)
            rows.append([fmt, name, *(secs[v] * 1e3 for v in variants),
                         *(f"{secs['scalar'] / secs[v]:.2f}x" for v in variants if v != "scalar")])
    return rows


def print_kernel_variants(rows: list[list[object]]) -> None:
    variants = backends.quant_matmul_variants()
    print_table("C kernel variants, one thread, [1536, 2048] weights: ms and speed-up over scalar",
                ["format", "kernel", *(f"{v} ms" for v in variants),
                 *(f"{v} x scalar" for v in variants if v != "scalar")], rows)


def mxfp4_batch1(backend: CpuBackend, reps: int, flush: Callable[[], None]) -> list[list[object]]:
    """An all-MXFP4 expert and an f32 one at MXFP4_DIMS, batch 1: rows of expert, format, kernel,
    weight bytes per weight (target <= 0.6), warm ms, cold ms (caches flushed), each as a ratio to
    f32's, and whether the cold ratio meets <= 0.5. The two take turns within each repetition."""
    name, d_model, d_ff = MXFP4_DIMS
    rng = np.random.default_rng(2)
    experts = {"f32": build(backend, rng, d_model, d_ff, ("F32",) * 3),
               "MXFP4": build(backend, rng, d_model, d_ff, ("MXFP4",) * 3)}
    x = rng.standard_normal((1, d_model), dtype=np.float32)
    warm = dict.fromkeys(experts, float("inf"))
    cold = dict.fromkeys(experts, float("inf"))
    for p in experts.values():
        backend.forward(p, x)  # warm-up
    for _ in range(reps):
        for fmt, p in experts.items():
            for times, before in ((cold, flush), (warm, None)):
                if before is not None:
                    before()
                start = time.perf_counter()
                backend.forward(p, x)
                times[fmt] = min(times[fmt], time.perf_counter() - start)
    rows: list[list[object]] = []
    for fmt, p in experts.items():
        per_weight = p.nbytes / (3 * d_model * d_ff)
        kernel = "BLAS sgemm" if fmt == "f32" else backend.cpu_kernel  # batch 1: the fused path
        ratio = cold[fmt] / cold["f32"]
        quantized = fmt != "f32"
        rows.append([name, fmt, kernel, per_weight, ("yes" if per_weight <= 0.6 else "NO") if quantized else "-",
                     warm[fmt] * 1e3, cold[fmt] * 1e3, warm[fmt] / warm["f32"], ratio,
                     ("yes" if ratio <= 0.5 else "NO") if quantized else "-"])
    return rows


def print_mxfp4(rows: list[list[object]]) -> None:
    print_table("MXFP4 expert, batch 1, vs the f32 expert (targets: ≤0.6 bytes/weight, cold ≤0.50× f32)",
                ["expert", "format", "kernel", "bytes/weight", "met", "warm ms", "cold ms", "warm x f32",
                 "cold x f32", "met"], rows)


def mxfp4_headlines(rows: list[list[object]]) -> list[dict[str, object]]:
    (f32, mx) = rows
    return [headline(f"MXFP4 weight bytes per weight {mx[0]}", mx[3], "B", reference="f32", reference_value=f32[3],
                     target="≤ 0.6 B"),
            headline(f"MXFP4 batch-1 cold forward {mx[0]} ({mx[2]})", mx[6], "ms", reference="f32 cold forward",
                     reference_value=f32[6], target="≤ 0.50× f32")]


def main(quick: bool = False, kernels_only: bool = False, mxfp4_only: bool = False) -> None:
    rng = np.random.default_rng(0)
    backend = CpuBackend()
    reps = 3 if quick else 10
    if mxfp4_only:
        print(f"cpu kernel: {backend.cpu_kernel}")
        rows = mxfp4_batch1(backend, 5 if quick else reps, make_flush())
        print_mxfp4(rows)
        write_results("runtime_mxfp4", {"cpu_kernel": backend.cpu_kernel, "rows": rows}, mxfp4_headlines(rows))
        return
    variant_rows = kernel_variants(reps)
    if kernels_only:
        print(f"cpu kernel: {backend.cpu_kernel}")
        print_kernel_variants(variant_rows)
        write_results("runtime_kernels", {"cpu_kernel": backend.cpu_kernel,
                                          "variants": backends.quant_matmul_variants(), "rows": variant_rows})
        return

    # -- references ------------------------------------------------------------------------
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    b = rng.standard_normal((2048, 2048), dtype=np.float32)
    sgemm_gflops = 2 * 2048**3 / best(lambda: a @ b, reps) / 1e9
    src = np.ones(64 * 1024 * 1024, dtype=np.float32)  # 256 MiB
    dst = np.empty_like(src)
    copy_bw = 2 * src.nbytes / best(lambda: np.copyto(dst, src), reps)
    flush = make_flush()

    print_table("References (same run)", ["reference", "value"], [
        ["numpy sgemm 2048^3 (GFLOP/s)", sgemm_gflops],
        ["copy bandwidth, read+write (GB/s)", copy_bw / 1e9],
        ["cpu kernel", backend.cpu_kernel],
        ["fused kernel up to batch", backend.fused_max_rows],
    ])

    f32_rows, bw_rows, q_rows, cross_rows = [], [], [], []
    fused = CpuBackend(fused_max_rows=1 << 30) if backend.cpu_kernel.startswith("c-") else None
    tiled = CpuBackend(fused_max_rows=0)
    results: dict[str, object] = {"sgemm_gflops": sgemm_gflops, "copy_bandwidth_gbs": copy_bw / 1e9,
                                  "cpu_kernel": backend.cpu_kernel, "experts": {}}
    for name, (d_model, d_ff) in DIMS.items():
        experts = {"f32": build(backend, rng, d_model, d_ff, ("F32",) * 3)}
        for q, fmts in QUANTS.items():
            experts[q] = build(backend, rng, d_model, d_ff, fmts)
        flops_per_row = 2 * 3 * d_model * d_ff
        # The bare BLAS calls of the same shapes: what numpy alone reaches on this expert's matmuls
        # (small-batch sgemm runs well below the 2048^3 peak, which bounds any f32 expert forward).
        w_gu = rng.standard_normal((2 * d_ff, d_model), dtype=np.float32)
        w_down = rng.standard_normal((d_model, d_ff), dtype=np.float32)
        times: dict[tuple[str, int], float] = {}
        for batch in BATCHES:
            x = rng.standard_normal((batch, d_model), dtype=np.float32)
            big = batch >= 64 and d_model > 4096
            r = max(2, reps // 3) if big else reps
            for fmt, prepared in experts.items():
                times[(fmt, batch)] = best(lambda p=prepared, x=x: backend.forward(p, x), r)
            t = times[("f32", batch)]
            h = rng.standard_normal((batch, d_ff), dtype=np.float32)
            bare = best(lambda x=x, w=w_gu: w @ x.T, r) + best(lambda h=h, w=w_down: w @ h.T, r)
            gflops = flops_per_row * batch / t / 1e9
            frac = gflops / sgemm_gflops
            target = "≥0.80" if batch >= 64 else "-"
            ok = ("yes" if frac >= 0.8 else "NO") if batch >= 64 else "-"
            f32_rows.append([name, batch, t * 1e3, gflops, sgemm_gflops, frac, bare * 1e3,
                             flops_per_row * batch / bare / 1e9 / sgemm_gflops, bare / t, target, ok])
            for q in QUANTS:
                tiles = batch > backend.fused_max_rows
                path = "tiled+sgemm" if tiles else f"fused {backend.cpu_kernel}"
                ratio = times[(q, batch)] / t
                q_rows.append([name, q, batch, path, times[(q, batch)] * 1e3, t * 1e3, ratio,
                               "≤1.25" if tiles else "-", ("yes" if ratio <= 1.25 else "NO") if tiles else "-"])

        if fused is not None:
            for q in QUANTS:
                for batch in CROSSOVER_BATCHES:
                    x = rng.standard_normal((batch, d_model), dtype=np.float32)
                    r = 2 if d_model > 4096 or quick else 3
                    tf = best(lambda p=experts[q], x=x: fused.forward(p, x), r)
                    tt = best(lambda p=experts[q], x=x: tiled.forward(p, x), r)
                    cross_rows.append([name, q, batch, tf * 1e3, tt * 1e3, tf / tt, "fused" if tf < tt else "tiled"])

        # batch 1, caches flushed before every call
        x1 = rng.standard_normal((1, d_model), dtype=np.float32)
        cold = {fmt: best(lambda p=p, x1=x1: backend.forward(p, x1), reps, before=flush) for fmt, p in experts.items()}
        for fmt, prepared in experts.items():
            nbytes = prepared.nbytes
            limit = nbytes / copy_bw
            ratio_f32 = cold[fmt] / cold["f32"]
            target = "-" if fmt == "f32" else "≤0.50"
            ok = "-" if fmt == "f32" else ("yes" if ratio_f32 <= 0.5 else "NO")
            bw_rows.append([name, fmt, nbytes / 1e6, cold[fmt] * 1e3, limit * 1e3, cold[fmt] / limit,
                            times[(fmt, 1)] * 1e3, ratio_f32, target, ok])
        results["experts"][name] = {
            "d_model": d_model, "d_ff": d_ff,
            "forward_ms": {f"{fmt}@{batch}": v * 1e3 for (fmt, batch), v in times.items()},
            "batch1_cold_ms": {fmt: v * 1e3 for fmt, v in cold.items()},
            "weight_bytes": {fmt: p.nbytes for fmt, p in experts.items()},
        }
        del experts

    print_table("f32 expert forward vs numpy sgemm peak",
                ["expert", "batch", "ms", "GFLOP/s", "sgemm GFLOP/s", "fraction", "bare sgemm ms", "bare fraction",
                 "bare/ours", "target", "met"], f32_rows)
    print_table("Batch 1, caches flushed: time vs memory-bandwidth limit (weight bytes / copy bandwidth)",
                ["expert", "format", "weight MB", "cold ms", "limit ms", "x limit", "warm ms", "x f32 cold",
                 "target", "met"], bw_rows)
    print_table("Quantized expert forward by batch (warm) vs the f32 path",
                ["expert", "format", "batch", "path", "ms", "f32 ms", "x f32", "target", "met"], q_rows)
    if variant_rows:
        print_kernel_variants(variant_rows)
    mxfp4_rows = mxfp4_batch1(backend, reps, flush)
    print_mxfp4(mxfp4_rows)
    if cross_rows:
        print_table(f"Crossover: fused C kernel vs tiled dequantize+sgemm (fused_max_rows = {backend.fused_max_rows})",
                    ["expert", "format", "batch", "fused ms", "tiled ms", "fused/tiled", "faster"], cross_rows)
    results["tables"] = {"f32": f32_rows, "batch1": bw_rows, "quantized": q_rows, "crossover": cross_rows,
                         "kernel_variants": variant_rows, "mxfp4": mxfp4_rows}
    write_results("runtime", results, [
        *(headline(f"f32 expert forward {r[0]}, batch {r[1]}", r[3], "GFLOP/s", reference="numpy sgemm peak",
                   reference_value=r[4], target="≥ 0.80 of sgemm") for r in f32_rows if r[1] >= 64),
        *(headline(f"{r[1]} expert forward {r[0]}, batch {r[2]} (tiled)", r[4], "ms", reference="f32 forward",
                   reference_value=r[5], target="≤ 1.25× f32") for r in q_rows if r[7] != "-"),
        *(headline(f"{r[1]} batch-1 cold forward {r[0]}", r[3], "ms", reference="f32 cold forward",
                   reference_value=r[3] / r[7], target="≤ 0.50× f32") for r in bw_rows if r[1] != "f32"),
        *mxfp4_headlines(mxfp4_rows)])


if __name__ == "__main__":
    main(quick="--quick" in sys.argv, kernels_only="--kernels" in sys.argv, mxfp4_only="--mxfp4" in sys.argv)
