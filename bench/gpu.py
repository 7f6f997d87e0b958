"""GPU backends against the CPU backend: expert-forward throughput (rows/s), same run, same experts.

    .venv/bin/python -m bench.gpu [--quick] [--full]

Expert dims: Qwen3-30B-A3B (d_model 2048, d_ff 768) and DeepSeek-V3 (7168, 2048); formats F16
(dense), Q8_0 and q4_k_m (Q4_K gate/up, Q6_K down); batches 1, 8, 32, 128, 512. Each GPU backend
that opens here (CUDA through CuPy on an NVIDIA device; WGSL through wgpu) is timed through
GpuBackend.forward with the expert resident on the device, so a time includes the copy of x to
the device and of y back, as a request pays it. The reference is the CPU backend of this same
machine (C kernels up to its fused limit, dequantized tiles + BLAS above), timed on the same
expert in the same run; the ratio is GPU rows/s over CPU rows/s.

A software adapter (Mesa's lavapipe: WebGPU emulated on these same cores) is measured only at
Qwen3 dims and batches up to 32 unless --full: it shows the WGSL path works, not GPU speed.
Without any GPU backend the table says why each is unavailable. Quantized weights are random
valid GGML blocks (speed does not depend on the values). Times are the minimum over repetitions.

On CUDA a second table times the fused mat-vec kernels of the decode batches (1, 2, 4, 8 tokens)
alone, with CUDA events (a kernel shorter than a host launch shows the launch rate), as weight
bytes read per second against the device's copy bandwidth measured in the same run (a mat-vec
is bound by memory, as a copy is). A third times a holder's multi-expert request (8 Q8_0 experts
of one layer at 1 and 4 rows each) on every backend: the experts' forwards one by one against
one grouped forward (one device call: CUDA's grouped launch, WGSL's single submission), and the
CPU backend's.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # see bench/runtime.py
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
from typing import Any

import numpy as np

from bench.report import headline, print_table, write_results
from bench.runtime import best
from core.experts.backend_names import GPU_CHOICES
from core.experts.backends import CpuBackend, TensorIn
from core.experts.gpu.backend import GpuBackend
from core.experts.gpu.cuda_timing import copy_bandwidth
from core.experts.gpu.ops import DeviceUnavailable
from core.experts.selection import device_budget, open_device
from core.quantization.registry import f32_to_dense
from core.quantization.types import GGMLType
from testkit.blocks import random_blocks

DIMS = {"Qwen3-30B-A3B": (2048, 768), "DeepSeek-V3": (7168, 2048)}
BATCHES = (1, 8, 32, 128, 512)
MATVEC_BATCHES = (1, 2, 4, 8)  # the fused mat-vec kernels' buckets (cuda.MV_ROWS)
GROUP_EXPERTS, GROUP_BATCHES = 8, (1, 4)  # a multi-expert request: Qwen3's top-8 on one holder
FORMATS = {"F16": ("F16", "F16", "F16"), "Q8_0": ("Q8_0", "Q8_0", "Q8_0"), "q4_k_m": ("Q4_K", "Q4_K", "Q6_K")}


def tensors(rng: np.random.Generator, d_model: int, d_ff: int, fmts: tuple[str, ...]) -> list[TensorIn]:
    shapes = ((d_ff, d_model), (d_ff, d_model), (d_model, d_ff))
    out = []
    for fmt, (rows, n) in zip(fmts, shapes, strict=True):
        if fmt in ("F32", "F16", "BF16"):
            w = (rng.standard_normal((rows, n), dtype=np.float32) / np.sqrt(n)).astype(np.float32)
            data = f32_to_dense(w, GGMLType(fmt)).view(np.uint8).reshape(rows, -1)
        else:
            data = random_blocks(rng, fmt, rows, n)
        out.append(TensorIn(fmt, (rows, n), data))
    return out


def compare(cpu: CpuBackend, gpu: GpuBackend, weights: list[TensorIn], x_all: np.ndarray, batches: list[int],
            reps: int) -> list[tuple[int, float, float]]:
    """(batch, CPU seconds, GPU seconds) of one expert's forward at each batch; the GPU copy is
    released (the host copy dropped) before returning."""
    on_cpu, on_gpu = cpu.prepare_expert(*weights), gpu.prepare_expert(*weights)
    out = []
    for batch in batches:
        x = np.ascontiguousarray(x_all[:batch])
        out.append((batch, best(lambda x=x: cpu.forward(on_cpu, x), reps),
                    best(lambda x=x: gpu.forward(on_gpu, x), reps)))
    return out


def matvec_rows(ops: Any, cpu: CpuBackend, weights: list[TensorIn], fmts: tuple[str, ...],
                x_all: np.ndarray) -> list[tuple[int, str, float, float]]:
    """(t, matrix, device µs, weight GB/s) of the CUDA fused mat-vec kernels of one expert at
    the decode batches, gate|up and down, device time alone (CUDA events)."""
    from core.experts.gpu.cuda_timing import time_matvec

    handle = ops.upload(cpu.prepare_expert(*weights), fmts)
    out = []
    for t in MATVEC_BATCHES:
        for name, w in (("gate|up", handle.gate_up[0]), ("down", handle.down)):
            if len(handle.gate_up) > 1 and name == "gate|up":
                continue  # mixed types: two products, not the stacked one this table shows
            x = np.ascontiguousarray(x_all[:t, : w.shape[1]])
            seconds = time_matvec(ops, w, x, reps=50)
            out.append((t, name, seconds * 1e6, w.nbytes / seconds / 1e9))
    ops.release(handle)
    return out


def group_rows(cpu: CpuBackend, gpu: GpuBackend, d_model: int, d_ff: int, reps: int
               ) -> list[tuple[int, float, float, float]]:
    """(rows per expert, µs of GROUP_EXPERTS forwards one by one, µs of one forward_many, µs on
    the CPU one by one) of a multi-expert request: GROUP_EXPERTS Q8_0 experts of one layer,
    each over its own rows, as a holder computes a decode step's frame."""
    rng = np.random.default_rng(1)
    experts = [(gpu.prepare_expert(*w), w) for w in
               (tensors(rng, d_model, d_ff, FORMATS["Q8_0"]) for _ in range(GROUP_EXPERTS))]
    on_cpu = [cpu.prepare_expert(*w) for _, w in experts]
    out = []
    for t in GROUP_BATCHES:
        xs = [rng.standard_normal((t, d_model), dtype=np.float32) for _ in experts]
        items = [(e, x) for (e, _), x in zip(experts, xs, strict=True)]
        one_by_one = best(lambda items=items: [gpu.forward(e, x) for e, x in items], reps)
        together = best(lambda items=items: gpu.forward_many(items), reps)
        cpu_time = best(lambda xs=xs: [cpu.forward(e, x) for e, x in zip(on_cpu, xs, strict=True)], reps)
        out.append((t, one_by_one * 1e6, together * 1e6, cpu_time * 1e6))
    return out


def open_devices() -> tuple[dict[str, Any], dict[str, str]]:
    """{kind: DeviceOps} of every GPU backend that opens here, and {kind: why not} for the rest."""
    opened: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for kind in GPU_CHOICES:
        try:
            opened[kind] = open_device(kind)
        except DeviceUnavailable as exc:
            missing[kind] = str(exc)
    return opened, missing


def main(quick: bool = False, full: bool = False) -> None:
    cpu = CpuBackend()
    opened, missing = open_devices()
    reps = 2 if quick else 4
    rows: list[list[object]] = []
    results: list[dict[str, Any]] = []
    kernel_rows: list[list[object]] = []
    group_table: list[list[object]] = []
    groups: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    copy_bps = copy_bandwidth(opened["cuda"]) if "cuda" in opened else None
    for kind, ops in opened.items():
        gpu = GpuBackend(ops, cpu=cpu, device_budget_bytes=device_budget(ops, None))
        software = ops.software and not full
        for model, (d_model, d_ff) in DIMS.items():
            if software and model != "Qwen3-30B-A3B":
                continue
            for fmt_name, fmts in FORMATS.items():
                if quick and fmt_name == "F16":
                    continue
                rng = np.random.default_rng(0)
                weights = tensors(rng, d_model, d_ff, fmts)
                x_all = rng.standard_normal((max(BATCHES), d_model), dtype=np.float32)
                batches = [b for b in BATCHES if not ((software and b > 32) or (quick and b not in (1, 32, 512)))]
                for batch, t_cpu, t_gpu in compare(cpu, gpu, weights, x_all, batches, reps):
                    rows.append([kind, model, fmt_name, batch, round(batch / t_gpu), round(batch / t_cpu),
                                 f"{t_cpu / t_gpu:.3g}x"])
                    results.append({"backend": kind, "device": ops.device_name, "software": ops.software,
                                    "model": model, "format": fmt_name, "batch": batch,
                                    "gpu_rows_per_s": batch / t_gpu, "cpu_rows_per_s": batch / t_cpu,
                                    "ratio": t_cpu / t_gpu})
                if kind == "cuda":
                    for t, matrix, us, gbs in matvec_rows(ops, cpu, weights, fmts, x_all):
                        kernel_rows.append([model, fmt_name, t, matrix, round(us, 1), round(gbs),
                                            f"{gbs * 1e9 / copy_bps:.2f}"])
                        kernels.append({"model": model, "format": fmt_name, "batch": t, "matrix": matrix,
                                        "device_us": us, "weight_gb_per_s": gbs, "copy_gb_per_s": copy_bps / 1e9})
        for model, (d_model, d_ff) in DIMS.items():
            if software and model != "Qwen3-30B-A3B":
                continue
            for t, alone, together, on_cpu in group_rows(cpu, gpu, d_model, d_ff, 3 if software else max(reps, 10)):
                group_table.append([kind, model, GROUP_EXPERTS, t, round(alone), round(together),
                                    f"{alone / together:.2f}x", round(on_cpu), f"{on_cpu / together:.2f}x"])
                groups.append({"backend": kind, "model": model, "experts": GROUP_EXPERTS, "batch": t,
                               "one_by_one_us": alone, "grouped_us": together, "cpu_us": on_cpu})
        counts = gpu.device_status()["counts"]
        if counts["cpu_rows"]:
            print(f"warning: {kind} ran {counts['cpu_rows']} rows on the CPU (last error: {gpu.last_error})")
        gpu.close()
    print(f"\nCPU reference: {cpu.cpu_kernel} (fused up to batch {cpu.fused_max_rows}, BLAS tiles above)")
    for kind, ops in opened.items():
        print(f"{kind}: {ops.device_name}" + (" (software adapter: a correctness run, not GPU speed)"
                                               if ops.software else ""))
    for kind, why in missing.items():
        print(f"{kind}: not measured: {why}")
    print_table("Expert forward, GPU backend vs CPU backend (rows/s, x to the device and y back included)",
                ["backend", "model", "format", "batch", "gpu rows/s", "cpu rows/s", "gpu/cpu"], rows)
    if kernel_rows:
        print_table(f"CUDA fused mat-vec kernels, device time (weight bytes read per second vs the device's copy "
                    f"bandwidth, {copy_bps / 1e9:.0f} GB/s counting bytes read and written, measured in this run)",
                    ["model", "format", "batch", "matrix", "device µs", "weight GB/s", "/ copy"], kernel_rows)
    if group_table:
        print_table(f"A multi-expert request ({GROUP_EXPERTS} Q8_0 experts of one layer, each over its own rows): "
                    "forwards one by one vs one grouped forward (forward_many), and the CPU backend one by one",
                    ["backend", "model", "experts", "rows each", "one by one µs", "grouped µs", "speed-up", "cpu µs",
                     "cpu/grouped"], group_table)
    headlines = []
    for kind in opened:
        mine = [r for r in results if r["backend"] == kind]
        for batch in (1, 8, 512):
            at = [r for r in mine if r["batch"] == batch and r["format"] == "Q8_0"]
            if at:
                r = max(at, key=lambda r: DIMS[r["model"]][0])
                headlines.append(headline(f"{kind} Q8_0 {r['model']} batch {batch}", r["gpu_rows_per_s"], "rows/s",
                                          reference=f"CPU backend ({cpu.cpu_kernel})",
                                          reference_value=r["cpu_rows_per_s"]))
    write_results("gpu", {"cpu_kernel": cpu.cpu_kernel, "unavailable": missing, "results": results,
                          "matvec_kernels": kernels, "groups": groups}, headlines)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv, full="--full" in sys.argv)
