"""The CUDA device's self-test at open, and the error bound of an expert forward in f32.

open_device runs `self_test` once: every decoder kernel against the host decoder (bit for
bit), every mat-vec kernel and the tiled product against an f64 product of the same weights,
two whole forwards (a mat-vec batch and a tiled one) and one grouped forward of three
experts, on small random weights (a few ms). A kernel that misbehaves on some GPU or driver
then makes the device unavailable (the node runs on the CPU) rather than wrong.

`expert_error_bound` is the bound both the self-test and tests/experts/test_gpu_cuda.py use:
any f32 evaluation of down(silu(gate·x) ⊙ up·x) whose dot products have the worst-case
summation error γ_n = n·u/(1 - n·u), u = 2^-24 (Higham, Accuracy and Stability, §3.1, for
every summation order) and whose silu(g)·u is within 8u relative, differs from the exact f64
forward of the same weights by at most the returned array. silu' is bounded by 1.1 (its
maximum is 1.0998 at g ≈ 2.40), which carries the gate's error through silu.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.experts.backends import CpuExpert, CpuWeight
from core.quantization.registry import dequantize
from core.quantization.types import GGMLType

U = 2.0**-24  # f32 unit roundoff
SILU_SLOPE = 1.1  # sup |silu'(g)|
_F16_FIELDS = {"Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}  # byte offsets of f16 d / dmin (testkit.blocks too)


def gamma(n: int) -> float:
    return n * U / (1.0 - n * U)


def expert_error_bound(gate: np.ndarray, up: np.ndarray, down: np.ndarray, x: np.ndarray) -> np.ndarray:
    """f64 [t, d_model]: the bound on |y_f32 - y_exact| described above. gate/up [d_ff, d_model],
    down [d_model, d_ff], the decoded weights; x [t, d_model]."""
    x64 = x.astype(np.float64)
    ax, ag, au, ad = (np.abs(a.astype(np.float64)) for a in (x, gate, up, down))
    g = x64 @ gate.astype(np.float64).T
    u = np.abs(x64 @ up.astype(np.float64).T)
    err_g = gamma(gate.shape[1]) * (ax @ ag.T)
    err_u = gamma(up.shape[1]) * (ax @ au.T)
    with np.errstate(over="ignore"):  # e^-g = inf for g << 0: silu is then -0, its limit
        silu = np.abs(g / (1.0 + np.exp(-g)))
    s_hi, u_hi = silu + SILU_SLOPE * err_g, u + err_u  # bounds on |silu(ĝ)| and |û|
    err_h = SILU_SLOPE * err_g * u_hi + s_hi * err_u + 8 * U * s_hi * u_hi
    return err_h @ ad.T + gamma(down.shape[1]) * ((s_hi * u_hi) @ ad.T)


def random_weight(rng: np.random.Generator, fmt: str, m: int, n: int) -> np.ndarray:
    """u8 [m, row_bytes] of random valid `fmt` data: random bits with small finite f16 scales
    for block formats, small normals for F16/BF16/F32."""
    if fmt in ("F32", "F16", "BF16"):
        w = (rng.standard_normal((m, n)) / np.sqrt(n)).astype(np.float32)
        if fmt == "F16":
            return w.astype(np.float16).view(np.uint8)
        if fmt == "BF16":
            return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return w.view(np.uint8)
    ggml = GGMLType(fmt)
    raw = rng.integers(0, 256, size=(m, n // ggml.block_size, ggml.type_size), dtype=np.uint8)
    for off in _F16_FIELDS[fmt]:
        scale = (rng.standard_normal(raw.shape[:2]) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(m, -1)


def _device_form(raw: np.ndarray, fmt: str) -> np.ndarray:
    return raw.view(np.uint16) if fmt in ("F16", "BF16") else raw


def self_test(ops: Any) -> None:
    """ops: a cuda.CudaOps (not imported: cuda imports this module). Raises AssertionError
    (or DeviceError) naming the first kernel that is wrong."""
    cp = ops._cp
    rng = np.random.default_rng(16)
    m, n = 13, 512  # 13 rows: a last thread block with idle warps, a last warp of R > 1 with one row
    for fmt in ("Q8_0", "Q4_K", "Q6_K", "F16", "BF16"):
        raw = random_weight(rng, fmt, m, n)
        ref = dequantize(raw, fmt, (m, n))
        w = ops.put_weight(fmt, (m, n), _device_form(raw, fmt))
        for t in (1, 2, 3, 5, ops.small_batch, ops.small_batch + 1):  # each mat-vec kernel, then the tiles
            x = rng.standard_normal((t, n)).astype(np.float32)
            if t <= ops.small_batch:  # token-major in and out
                y = ops._run("self-test matvec", lambda w=w, x=x: ops.matvec(w, cp.asarray(x)).get().T.copy())
            else:
                y = ops._run("self-test matmul", lambda w=w, x=x: ops.matmul(w, cp.asarray(x.T.copy())).get())
            exact = ref.astype(np.float64) @ x.T.astype(np.float64)
            bound = gamma(n) * (np.abs(ref).astype(np.float64) @ np.abs(x.T).astype(np.float64))
            assert y.shape == (m, t) and y.dtype == np.float32, f"{fmt} t={t}: {y.dtype} {y.shape}"
            worst = float((np.abs(y - exact) - bound).max())
            assert worst <= 0, f"{fmt} product at t={t} exceeds its f32 error bound by {worst:.3g}"
        decoded = ops._run("self-test decode", lambda w=w: ops.decode(w, 0, m).get())
        differ = int((decoded.view(np.uint32) != ref.view(np.uint32)).sum())
        assert differ == 0, f"{fmt} decode kernel: {differ} of {m * n} values differ from the host decoder"
    # whole forwards (silu kernels, stacking, token-major and transposed paths) on a small F32 expert
    d_model, d_ff = 64, 32
    gate, up, down = (dequantize(random_weight(rng, "F32", r, c), "F32", (r, c))
                      for r, c in ((d_ff, d_model), (d_ff, d_model), (d_model, d_ff)))
    host = CpuExpert(gate_up=(CpuWeight("F32", (2 * d_ff, d_model), np.concatenate([gate, up])),),
                     down=CpuWeight("F32", (d_model, d_ff), down), d_ff=d_ff)
    handle = ops.upload(host, ("F32", "F32", "F32"))
    for t in (3, ops.small_batch + 1):
        x = rng.standard_normal((t, d_model)).astype(np.float32)
        y = ops.forward(handle, x)
        worst = float((np.abs(y - _exact(gate, up, down, x)) - expert_error_bound(gate, up, down, x)).max())
        assert worst <= 0, f"expert forward at t={t} exceeds its f32 error bound by {worst:.3g}"
    ops.release(handle)
    _self_test_group(ops, rng)


def _self_test_group(ops: Any, rng: np.random.Generator) -> None:
    """A grouped forward (forward_group: three Q4_K|Q6_K experts of 1, 4 and 2 rows, one
    grouped launch per product) within each expert's f32 bound."""
    d_model = d_ff = 256
    fmts, shapes = ("Q4_K", "Q4_K", "Q6_K"), ((d_ff, d_model), (d_ff, d_model), (d_model, d_ff))
    experts, handles, xs = [], [], []
    for t in (1, 4, 2):
        raws = [random_weight(rng, f, *shape) for f, shape in zip(fmts, shapes, strict=True)]
        experts.append([dequantize(raw, f, shape) for raw, f, shape in zip(raws, fmts, shapes, strict=True)])
        host = CpuExpert(gate_up=(CpuWeight("Q4_K", (2 * d_ff, d_model), np.concatenate(raws[:2])),),
                         down=CpuWeight("Q6_K", (d_model, d_ff), raws[2]), d_ff=d_ff)
        handles.append(ops.upload(host, fmts))
        xs.append(rng.standard_normal((t, d_model)).astype(np.float32))
    ys = ops.forward_group(handles, xs)
    for i, ((gate, up, down), x, y) in enumerate(zip(experts, xs, ys, strict=True)):
        assert y.shape == x.shape, f"grouped forward, expert {i}: shape {y.shape} for rows {x.shape}"
        worst = float((np.abs(y - _exact(gate, up, down, x)) - expert_error_bound(gate, up, down, x)).max())
        assert worst <= 0, f"grouped forward, expert {i}, exceeds its f32 error bound by {worst:.3g}"
    for handle in handles:
        ops.release(handle)


def _exact(gate: np.ndarray, up: np.ndarray, down: np.ndarray, x: np.ndarray) -> np.ndarray:
    """f64 down(silu(gate·x) ⊙ up·x)."""
    g64, u64 = x.astype(np.float64) @ gate.T.astype(np.float64), x.astype(np.float64) @ up.T.astype(np.float64)
    with np.errstate(over="ignore"):
        return (g64 / (1.0 + np.exp(-g64)) * u64) @ down.T.astype(np.float64)
