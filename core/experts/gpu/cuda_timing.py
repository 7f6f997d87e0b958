"""Timings of the CUDA device for the benchmarks (bench/gpu.py) and tests: wall time of a
whole forward, device time of one fused mat-vec (CUDA events), and the device's copy
bandwidth, the reference a memory-bound kernel is compared to."""

from __future__ import annotations

import time

import numpy as np

from core.experts.gpu.cuda import CudaExpert, CudaOps, DeviceWeight


def time_forward(ops: CudaOps, handle: CudaExpert, x: np.ndarray, reps: int) -> float:
    """Mean wall seconds of ops.forward(handle, x) over `reps` calls, after one warm-up call.

    Each forward ends with a blocking device->host copy, so it is complete when it returns;
    the device is synchronized before the clock starts, so no earlier work is counted."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    ops.forward(handle, x)
    ops._stream.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        ops.forward(handle, x)
    ops._stream.synchronize()
    return (time.perf_counter() - start) / reps


def time_matvec(ops: CudaOps, weight: DeviceWeight, x: np.ndarray, reps: int) -> float:
    """Device seconds of one fused mat-vec of `weight` over x token-major [t <= SMALL_BATCH, n]:
    CUDA events around `reps` launches on the device's stream, after one warm-up launch
    (bench/gpu.py's kernel table). A kernel shorter than one launch from the host (~11 µs
    through CuPy on an H200's host) measures the launch rate instead: the launches queue no
    faster than the host issues them."""
    cp = ops._cp

    def run() -> float:
        x_rows = cp.asarray(x)
        ops.matvec(weight, x_rows)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(ops._stream)
        for _ in range(reps):
            ops.matvec(weight, x_rows)
        stop.record(ops._stream)
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3 / reps

    return ops._run("timed matvec", run)


def copy_bandwidth(ops: CudaOps, nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written (the
    reference a memory-bound kernel is compared to), best of `reps` copies of `nbytes`."""
    cp = ops._cp

    def run() -> float:
        src = cp.empty(nbytes // 4, dtype=cp.float32)
        dst = cp.empty_like(src)
        best = float("inf")
        for _ in range(reps + 1):  # the first copy warms up
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(ops._stream)
            dst[...] = src
            stop.record(ops._stream)
            stop.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return 2 * src.nbytes / best

    return ops._run("copy bandwidth", run)
