"""Expert forward on the WGSL device (apps/experts/gpu/wgsl.py) against the CPU backend.

    .venv/bin/python -m bench.gpu_wgsl [--fmt Q8_0] [--d-model 2048] [--d-ff 768] [--batches 1,64]

One expert of random valid GGML blocks (Qwen3-30B-A3B dims by default), uploaded once;
each time is the minimum over repeats of one whole forward (upload of x, one submission,
readback), after a warm-up call (pipeline compile, workspace allocation). On lavapipe
(Mesa's CPU Vulkan driver) this measures the emulation, not a GPU.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from apps.experts.backends import CpuBackend, CpuExpert, TensorIn
from testkit.blocks import random_blocks


def time_forward(forward: Callable[[np.ndarray], np.ndarray], x: np.ndarray, *, repeats: int = 5,
                 budget_s: float = 10.0) -> float:
    """Seconds of one forward(x): the minimum over `repeats` calls (fewer once `budget_s` is
    spent), after one untimed warm-up call."""
    forward(x)
    best = float("inf")
    spent = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        forward(x)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - spent > budget_s:
            break
    return best


def random_expert(fmt: str, d_model: int, d_ff: int, backend: CpuBackend, seed: int = 0) -> CpuExpert:
    """A CpuExpert of random valid blocks: gate/up [d_ff, d_model], down [d_model, d_ff]."""
    rng = np.random.default_rng(seed)

    def tensor(rows: int, n: int) -> TensorIn:
        return TensorIn(fmt, (rows, n), random_blocks(rng, fmt, rows, n))

    return backend.prepare_expert(tensor(d_ff, d_model), tensor(d_ff, d_model), tensor(d_model, d_ff))


def main() -> None:
    from apps.experts.gpu.wgsl import open_device

    parser = argparse.ArgumentParser()
    parser.add_argument("--fmt", default="Q8_0")
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--d-ff", type=int, default=768)
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cpu = CpuBackend()
    host = random_expert(args.fmt, args.d_model, args.d_ff, cpu)
    ops = open_device()
    types = (args.fmt,) * 3
    handle = ops.upload(host, types)
    print(f"{args.fmt} expert d_model {args.d_model} d_ff {args.d_ff}; device: {ops.device_name} "
          f"(software {ops.software}), {ops.device_bytes(host, types) / 2**20:.1f} MiB on the device; "
          f"cpu kernel {cpu.cpu_kernel}")
    rng = np.random.default_rng(1)
    for t in (int(b) for b in args.batches.split(",")):
        x = rng.standard_normal((t, args.d_model)).astype(np.float32)
        gpu_s = time_forward(lambda v: ops.forward(handle, v), x, repeats=args.repeats)
        cpu_s = time_forward(lambda v: cpu.forward(host, v), x, repeats=args.repeats)
        print(f"batch {t:4d}: wgsl {gpu_s * 1e3:9.2f} ms   cpu {cpu_s * 1e3:8.2f} ms   wgsl/cpu {gpu_s / cpu_s:6.1f}x")
    ops.release(handle)
    ops.close()


if __name__ == "__main__":
    main()
