"""The WGSL device (core/experts/gpu/wgsl.py) against the CPU backend's exact numpy path.

The transcoding to the device layout is checked bit for bit against gguf-py's decoder with no
device. The device tests run on any WebGPU adapter, Mesa's lavapipe included (CI installs
wgpu and mesa-vulkan-drivers); they skip, saying why, only when wgpu or an adapter is missing.

Error bound (derived in `forward_bound`): the device and the CPU backend (CpuBackend(use_numba=
False): f32 weights bit-identical to gguf's, numpy sgemm) multiply the same weights in f32
and differ only in rounding. A sum of n products in any order, each rounded term passing
through at most n + 32 roundings, is within γ(n+32)·Σ M·|x| of the exact sum (γ(k) = k·u/(1-k·u),
u = 2^-24, Higham's bound), M = |w| for dense weights and |a·q| + |b| for the shader's
a·Σqx - b·Σx (Q4_K's two terms cancel, so their size, not |w|, sets the rounding). Each
side is within that of the exact f64 value, so the two within twice it; the gate/up
differences pass through silu·mul (|silu'| ≤ 1.1) plus both sides' silu rounding (the
WGSL spec lets exp err by 3 + 2|x| ulp; the CPU's 1 + tanh(g/2) loses absolute precision
for g << 0), then through down with its own accumulation bound. It is a worst case: it
grows as n·u·Σ|terms| per layer while y is a signed sum, so it comes to 1e-4 (dense, n 64)
- 2e-2 (Q4_K, n 256, where |a·q| + |b| >> |w|) of max |y|; a wrong index, scale or sub-block
misses it by far more. Real rounding errors have random signs and add like a random walk,
so the relative-to-norm difference is ~sqrt(n)·u·(a few): measured 1.4e-7 - 6.3e-7 here, and
asserted below 1e-5 (NORM_RTOL), which catches subtler errors the worst case would admit.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.experts.backends import CpuBackend, CpuExpert
from core.experts.ffn import build_expert
from core.experts.gpu.ops import DeviceError, DeviceUnavailable
from core.experts.gpu.wgsl_layout import SUB_BLOCK, dequantize_device, magnitude_device, transcode
from testkit.blocks import random_blocks
from testkit.gpu import wgsl_unavailable
from tests.experts.factories import bit_report, expert_payload, expert_weights, reference_weights

FORMATS = ["Q8_0", "Q4_K", "Q6_K"]
BATCHES = [1, 2, 3, 8, 33, 130]  # every token chunk (TC 1, 2, 4, 8) and partial chunks
U = 2.0**-24
NORM_RTOL = 1e-5


# --- transcoding (no device) -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_transcode_is_bit_identical_to_gguf(fmt):
    rng = np.random.default_rng(11)
    blocks = random_blocks(rng, fmt, 9, 512)  # every bit of every packed field random
    layout = transcode(fmt, blocks, (9, 512))
    group, offset = SUB_BLOCK[fmt]
    assert layout.quants.dtype == np.uint32 and layout.quants.shape == (9, 128)
    assert layout.meta.shape == ((9, 512 // group, 2) if offset else (9, 512 // group))
    ours, ref = dequantize_device(layout), reference_weights(fmt, blocks)
    assert ours.view(np.uint32).tobytes() == ref.view(np.uint32).tobytes(), bit_report(ours, ref)
    q = layout.quants.view(np.int8)
    lo, hi = {"Q8_0": (-128, 127), "Q4_K": (0, 15), "Q6_K": (-32, 31)}[fmt]
    assert q.min() >= lo and q.max() <= hi


def test_transcode_rejects_bad_input():
    with pytest.raises(ValueError, match="no device layout"):
        transcode("F16", np.zeros((2, 64), np.uint8), (2, 32))
    with pytest.raises(ValueError, match=r"Q8_0 \[2, 64\] needs u8 \(2, 68\)"):
        transcode("Q8_0", np.zeros((2, 64), np.uint8), (2, 64))


# --- the device ----------------------------------------------------------------------------------


def _open():
    # make test sets TENZRO_TEST_REQUIRE_WGSL: there a missing wgpu or adapter fails instead of skipping
    if reason := wgsl_unavailable():
        pytest.skip(reason)
    from core.experts.gpu.wgsl import open_device

    return open_device()


@pytest.fixture(scope="module")
def ops():
    device = _open()
    yield device
    device.close()


CASES = {  # quant -> (d_model, d_ff): K-quants need rows of 256; dense odd sizes on purpose
    "f32": (None, 64, 40),
    "f32-odd": (None, 61, 37),
    "f16": ("f16", 64, 32),
    "bf16": ("bf16", 63, 33),
    "q8_0": ("q8_0", 64, 32),
    "q4_k": ("q4_k", 256, 256),
    "q6_k": ("q6_k", 256, 256),
    "mixed": ({"gate": "q8_0", "up": "q4_k", "down": "q6_k"}, 256, 256),
}


def _expert(name: str, seed: int = 5) -> tuple[CpuExpert, tuple[str, str, str]]:
    quant, d_model, d_ff = CASES[name]
    w = expert_weights(np.random.default_rng(seed), d_model, d_ff)
    ex = build_expert(expert_payload(w, expert=0, quant=quant), CpuBackend(use_numba=False))
    return ex.prepared, tuple(ex.formats[p] for p in ("gate_proj", "up_proj", "down_proj"))


def _weights(host: CpuExpert) -> list[tuple[np.ndarray, np.ndarray]]:
    """(exact f64 weights, magnitudes M) of gate, up, down."""
    d_ff = host.d_ff
    out = []
    for w in (*host.gate_up, host.down):
        if w.ggml_type == "F32":
            out.append((w.data.astype(np.float64), np.abs(w.data.astype(np.float64))))
        else:
            layout = transcode(w.ggml_type, w.data, w.shape)
            out.append((dequantize_device(layout).astype(np.float64), magnitude_device(layout)))
    if len(host.gate_up) == 1:  # stacked gate|up: split at d_ff
        (w, m), down = out[0], out[1]
        out = [(w[:d_ff], m[:d_ff]), (w[d_ff:], m[d_ff:]), down]
    return out


def _gamma(k: int) -> float:
    return k * U / (1 - k * U)


def forward_bound(host: CpuExpert, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact f64 y, elementwise bound on |y_device - y_cpu|); see the module docstring."""
    (wg, mg), (wu, mu), (wd, md) = _weights(host)
    x = x.astype(np.float64)
    ax = np.abs(x)
    n, d_ff = x.shape[1], host.d_ff
    g, u = x @ wg.T, x @ wu.T
    e_g, e_u = _gamma(n + 32) * (ax @ mg.T), _gamma(n + 32) * (ax @ mu.T)  # each side vs exact
    s = g / (1 + np.exp(-g))
    h = s * u
    # one side's h vs exact: silu is 1.1-Lipschitz; then both sides' own silu·mul rounding
    e_h = 1.1 * e_g * (np.abs(u) + e_u) + (np.abs(s) + 1.1 * e_g) * e_u
    d_h = 2 * e_h + (16 + 4 * np.abs(g)) * U * (np.abs(g) + e_g) * (np.abs(u) + e_u)
    y = h @ wd.T
    bound = d_h @ np.abs(wd).T + 2 * _gamma(d_ff + 32) * ((np.abs(h) + d_h) @ md.T)
    return y, bound


def _check(y: np.ndarray, ref: np.ndarray, host: CpuExpert, x: np.ndarray, what: str) -> None:
    assert y.dtype == np.float32 and y.shape == ref.shape
    exact, bound = forward_bound(host, x)
    excess = np.abs(y.astype(np.float64) - ref) - bound
    assert excess.max() <= 0, f"{what}: {(excess > 0).sum()} outputs beyond the bound, worst by {excess.max():.3g}"
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert rel < NORM_RTOL, f"{what}: relative-to-norm difference {rel:.3g}"
    # the bound itself is tight enough to mean something
    # not vacuous: measured 1e-4 (dense, n 64) to 2e-2 (Q4_K, n 256) of max |y|; the differences
    # themselves are ~5e-7 of it
    assert np.abs(bound).max() < 5e-2 * np.abs(exact).max()


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_cpu(ops, name):
    host, types = _expert(name)
    cpu = CpuBackend(use_numba=False)
    handle = ops.upload(host, types)
    try:
        assert handle.nbytes == ops.device_bytes(host, types) == sum(b.size for b in handle.buffers)
        rng = np.random.default_rng(17)
        d_model = host.down.shape[0]
        for t in BATCHES:
            x = rng.standard_normal((t, d_model)).astype(np.float32)
            _check(ops.forward(handle, x), cpu.forward(host, x), host, x, f"{name} {types} batch {t}")
    finally:
        ops.release(handle)


def test_row_and_token_split_are_bit_identical(ops):
    """Weights split over several buffers (rows) and batches over several submissions (the
    max binding lowered to 1 KiB) compute each output exactly as one buffer does."""
    host, types = _expert("mixed")
    x = np.random.default_rng(3).standard_normal((33, 256)).astype(np.float32)
    whole = ops.upload(host, types)
    y_whole = ops.forward(whole, x)
    ops.release(whole)
    saved = ops.max_binding
    ops.max_binding = 1024
    try:
        split = ops.upload(host, types)
        assert [len(split.gate_up), len(split.down)] == [2 * 256 * 256 // 1024, 256 * 256 // 1024]
        assert split.nbytes == ops.device_bytes(host, types) == sum(b.size for b in split.buffers)
        y_split = ops.forward(split, x)
        ops.release(split)
    finally:
        ops.max_binding = saved
    assert y_split.tobytes() == y_whole.tobytes(), bit_report(y_split, y_whole)


def test_a_grouped_forward_is_each_experts_own_forward_in_one_submission(ops, monkeypatch):
    """forward_group over experts of different formats and widths, each with its own batch:
    one submission whose answers are bit for bit each expert's own forward; a batch larger
    than one submission holds sends the group expert by expert, with the same answers."""
    names, sizes = ["q4_k", "mixed", "q8_0", "f32", "q6_k"], [1, 8, 3, 2, 5]
    experts = [_expert(name, seed=20 + i) for i, name in enumerate(names)]
    handles = [ops.upload(host, types) for host, types in experts]
    rng = np.random.default_rng(21)
    xs = [rng.standard_normal((t, host.down.shape[0])).astype(np.float32)
          for t, (host, _) in zip(sizes, experts, strict=True)]
    try:
        alone = [ops.forward(h, x) for h, x in zip(handles, xs, strict=True)]
        grouped = ops.forward_group(handles, xs)
        for name, y, ref in zip(names, grouped, alone, strict=True):
            assert y.tobytes() == ref.tobytes(), f"{name}: {bit_report(y, ref)}"
        pairs = [x[:2] if len(x) > 1 else np.vstack([x, x]) for x in xs]  # 2 rows each: 7 KiB in all
        pairs_alone = [ops.forward(h, x) for h, x in zip(handles, pairs, strict=True)]
        singles = []
        forward = ops.forward
        monkeypatch.setattr(ops, "forward", lambda h, x: singles.append(len(x)) or forward(h, x))
        assert ops.forward_group(handles, pairs) and singles == []  # 7 KiB in one submission
        saved = ops.max_binding
        ops.max_binding = 4096  # 2 tokens a submission at d_ff 256: the batch of 8 is too large
        try:
            one_by_one = ops.forward_group(handles, xs)
            over_staging = ops.forward_group(handles, pairs)  # each batch fits, all rows at once do not
        finally:
            ops.max_binding = saved
            monkeypatch.undo()
        assert singles == [*sizes, 2, 2, 2, 2, 2]  # both went expert by expert
        assert all(y.tobytes() == ref.tobytes() for y, ref in zip(one_by_one, alone, strict=True))
        assert all(y.tobytes() == ref.tobytes() for y, ref in zip(over_staging, pairs_alone, strict=True))
        with pytest.raises(ValueError, match="5 experts but 4 batches"):
            ops.forward_group(handles, xs[:4])
    finally:
        for h in handles:
            ops.release(h)


def test_bad_input_and_released_handle(ops):
    host, types = _expert("q8_0")
    with pytest.raises(ValueError, match="not the form of types"):
        ops.upload(host, ("Q4_K", "Q4_K", "Q8_0"))
    handle = ops.upload(host, types)
    with pytest.raises(ValueError, match=r"x must be f32 \[t >= 1, 64\]"):
        ops.forward(handle, np.zeros((2, 32), np.float32))
    ops.release(handle)
    ops.release(handle)  # twice is harmless
    with pytest.raises(DeviceError, match="released") as err:
        ops.forward(handle, np.zeros((2, 64), np.float32))
    assert not err.value.fatal


def test_error_mapping(ops):
    import wgpu

    with pytest.raises(DeviceError, match="out of device memory") as err, ops._guard("test"):
        raise wgpu.GPUOutOfMemoryError("Out of memory")
    assert not err.value.fatal
    with pytest.raises(DeviceError) as err, ops._guard("test"):
        raise wgpu.GPUValidationError("Buffer size 1099511627776 is greater than the maximum buffer size")
    assert not err.value.fatal


def test_device_loss_is_fatal():
    """A destroyed device (a real loss, not a simulated error): forward raises
    DeviceError(fatal=True) at once, every time; release and close still do not raise."""
    device = _open()
    host, types = _expert("q8_0")
    handle = device.upload(host, types)
    x = np.ones((3, 64), np.float32)
    device.forward(handle, x)
    device._device.destroy()
    for _ in range(2):
        with pytest.raises(DeviceError, match="lost") as err:
            device.forward(handle, x)
        assert err.value.fatal
    with pytest.raises(DeviceError) as err:
        device.upload(host, types)
    assert err.value.fatal
    device.release(handle)
    device.close()
    device.close()


def test_software_adapter_reported(ops):
    from core.experts.gpu.wgsl import open_device

    assert ops.kind == "wgsl" and ops.memory_total_bytes is None and ops.device_name
    if ops.software:  # lavapipe / SwiftShader: auto-detection must be able to refuse it
        with pytest.raises(DeviceUnavailable, match="software"):
            open_device(allow_software=False)
