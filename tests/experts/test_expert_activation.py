"""gpt-oss's expert kind: biased projections and the clamped SwiGLU, from the payload to the CPU backend.

The reference is a float64 transcription of transformers' GptOssExperts (modeling_gpt_oss.py): gate_up =
x @ W + b with gate/up interleaved, gate clamped to ≤ limit, up to [-limit, limit], glu = gate ·
sigmoid(alpha · gate), out = ((up + 1) · glu) @ down + down_bias.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.experts.backends import CpuBackend, quant_matmul_variants
from core.experts.errors import InvalidPayload
from core.experts.ffn import build_expert, expert_forward
from core.formats.expert_activation import ExpertActivation
from core.formats.expert_payload import PayloadError, encode_expert_payload, read_expert_payload
from testkit.gpu import wgsl_unavailable
from tests.experts.factories import expert_weights

D_MODEL, D_FF = 64, 96
GPT_OSS = ExpertActivation(kind="clamped_swiglu", alpha=1.702, limit=7.0)


def weights_and_biases(seed: int = 3) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = expert_weights(rng, D_MODEL, D_FF)
    w["gate"] *= 6  # push some pre-activations past the limit, so the clamps matter
    w["up"] *= 6
    biases = {"gate": rng.standard_normal(D_FF).astype(np.float32), "up": rng.standard_normal(D_FF).astype(np.float32),
              "down": rng.standard_normal(D_MODEL).astype(np.float32)}
    return w, biases


def payload(w, biases, *, quant=None, activation=GPT_OSS, **kw) -> bytes:
    return encode_expert_payload(gate=w["gate"], up=w["up"], down=w["down"], quant=quant, model_id="t/gpt-oss",
                                 layer=0, expert=1, biases=biases, activation=activation, **kw)


def gpt_oss_reference(w: dict[str, np.ndarray], b: dict[str, np.ndarray], x: np.ndarray, alpha: float = 1.702,
                      limit: float = 7.0) -> np.ndarray:
    """f64, in transformers' fused layout: gate_up [d, 2·d_ff] with gate in the even columns."""
    gate_up = np.empty((D_MODEL, 2 * D_FF))
    gate_up[:, 0::2], gate_up[:, 1::2] = w["gate"].T, w["up"].T
    gate_up_bias = np.empty(2 * D_FF)
    gate_up_bias[0::2], gate_up_bias[1::2] = b["gate"], b["up"]
    h = x.astype(np.float64) @ gate_up + gate_up_bias
    gate, up = np.minimum(h[:, 0::2], limit), np.clip(h[:, 1::2], -limit, limit)
    glu = gate / (1 + np.exp(-alpha * gate))
    return ((up + 1) * glu) @ w["down"].T.astype(np.float64) + b["down"]


def test_the_payload_carries_the_activation_and_the_biases():
    w, b = weights_and_biases()
    parsed = read_expert_payload(payload(w, b))
    assert parsed.activation == GPT_OSS
    assert sorted(parsed.biases) == ["down", "gate", "up"]
    for p in b:
        np.testing.assert_array_equal(parsed.biases[p], b[p])
    plain = read_expert_payload(encode_expert_payload(gate=w["gate"], up=w["up"], down=w["down"], quant=None,
                                                      model_id="t/q", layer=0, expert=0))
    assert (plain.activation.kind, plain.biases) == ("silu", {})


@pytest.mark.parametrize("t", [1, 8, 200])
@pytest.mark.parametrize("use_numba", [False, True])
def test_cpu_forward_equals_transformers_gpt_oss_expert(t, use_numba):
    w, b = weights_and_biases()
    backend = CpuBackend(use_numba=use_numba)
    expert = build_expert(payload(w, b), backend)
    assert expert.activation == "clamped_swiglu"
    x = np.random.default_rng(t).standard_normal((t, D_MODEL)).astype(np.float32)
    ref = gpt_oss_reference(w, b, x)
    pre = x.astype(np.float64) @ w["gate"].T.astype(np.float64) + b["gate"]
    assert (pre > 7).any() or t == 1  # the clamp is exercised (one token may miss it)
    y = expert_forward(expert, x, backend)
    assert y.dtype == np.float32 and y.shape == (t, D_MODEL)
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("t", [1, 8, 200])
@pytest.mark.parametrize("quant", ["q8_0", "mxfp4"])
@pytest.mark.parametrize("variant", [*quant_matmul_variants(), "off"])
def test_a_quantized_gpt_oss_expert_stays_within_the_activation_quantization_error(t, quant, variant):
    """Block weights: up to batch 128 the C kernels run the whole expert in one call, biases and the clamped
    GLU included, with int8 activation rows (~1 % relative, as for SiLU experts); "off" is numba's f32 path.
    The reference is the exact path over the same (quantized) weights."""
    w, b = weights_and_biases()
    backend, exact = CpuBackend(c_variant=variant), CpuBackend(use_numba=False)
    data = payload(w, b, quant=quant)
    x = np.random.default_rng(t).standard_normal((t, D_MODEL)).astype(np.float32)
    y = expert_forward(build_expert(data, backend), x, backend)
    ref = expert_forward(build_expert(data, exact), x, exact)
    bound = 1e-5 if variant == "off" or t > backend.fused_max_rows else 0.03
    assert np.abs(y - ref).max() <= bound * np.abs(ref).max()


def test_biases_with_silu_are_added_around_the_plain_glu():
    w, b = weights_and_biases()
    backend = CpuBackend(use_numba=False)
    x = np.random.default_rng(0).standard_normal((3, D_MODEL)).astype(np.float32)
    y = expert_forward(build_expert(payload(w, b, activation=ExpertActivation()), backend), x, backend)
    g = x @ w["gate"].T + b["gate"]
    u = x @ w["up"].T + b["up"]
    ref = (g / (1 + np.exp(-g.astype(np.float64))) * u) @ w["down"].T + b["down"]
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("change, message", [
    (lambda w, b: {"biases": {"gate": b["gate"], "up": b["up"]}}, "all of"),
    (lambda w, b: {"biases": {**b, "down": b["down"][:-1]}}, "down_proj.bias: shape"),
    (lambda w, b: {"biases": {**b, "up": np.where(np.arange(D_FF) == 3, np.nan, b["up"])}}, "non-finite"),
])
def test_bad_biases_are_refused_by_name(change, message):
    w, b = weights_and_biases()
    with pytest.raises(PayloadError, match=message):
        payload(w, change(w, b)["biases"])


@pytest.mark.parametrize("kw, message", [
    ({"kind": "gelu"}, "activation 'gelu' is not known"),
    ({"kind": "clamped_swiglu", "alpha": 1.702}, "finite positive limit"),
    ({"kind": "clamped_swiglu", "alpha": -1.0, "limit": 7.0}, "finite positive alpha"),
    ({"kind": "clamped_swiglu", "alpha": 1.0, "limit": float("inf")}, "finite positive limit"),
    ({"kind": "silu", "alpha": 1.0}, "takes no alpha"),
])
def test_bad_activations_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        ExpertActivation(**kw)


def _rewrite_metadata(data: bytes, **changes: str | None) -> bytes:
    """The payload with metadata keys changed (None: removed), the header re-padded."""
    import json
    import struct

    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    for key, value in changes.items():
        if value is None:
            header["__metadata__"].pop(key, None)
        else:
            header["__metadata__"][key] = value
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


@pytest.mark.parametrize("changes, message", [
    ({"activation": "swish"}, "activation 'swish' is not known"),
    ({"activation.alpha": "fast"}, "'activation.alpha' must be a decimal number"),
    ({"activation.limit": None}, "'activation.limit' must be a decimal number"),
    ({"activation.limit": "nan"}, "finite positive limit"),
])
def test_a_tampered_activation_is_refused_on_read(changes, message):
    w, b = weights_and_biases()
    with pytest.raises(PayloadError, match=message):
        read_expert_payload(_rewrite_metadata(payload(w, b), **changes))


@pytest.mark.skipif(bool(wgsl_unavailable()), reason=wgsl_unavailable() or "")
def test_a_gpu_backend_keeps_a_gpt_oss_expert_on_the_cpu_and_answers_right():
    """The device kernels compute plain SiLU experts only: a gpt-oss expert stays on the host copy and is
    answered there (counted as cpu_format), never uploaded, never a different output."""
    from core.experts.gpu.backend import GpuBackend
    from core.experts.gpu.wgsl import open_device

    w, b = weights_and_biases()
    gpu = GpuBackend(open_device(allow_software=True), cpu=CpuBackend(use_numba=False), device_budget_bytes=16 << 20)
    try:
        x = np.random.default_rng(2).standard_normal((4, D_MODEL)).astype(np.float32)
        for activation in (GPT_OSS, ExpertActivation()):  # clamped, and SiLU with biases
            expert = build_expert(payload(w, b, activation=activation), gpu)
            ref = CpuBackend(use_numba=False)
            want = expert_forward(build_expert(payload(w, b, activation=activation), ref), x, ref)
            np.testing.assert_array_equal(expert_forward(expert, x, gpu), want)
        assert gpu.counts["uploads"] == 0 and gpu.counts["cpu_format"] == 2 and gpu.counts["device_errors"] == 0
    finally:
        gpu.close()


class _SiluOnlyBackend:
    """A compute backend as the seam's protocol describes one that declares no other GLU."""

    name, is_gpu, cpu_kernel = "plain", False, "numpy"

    def __init__(self) -> None:
        self._cpu = CpuBackend(use_numba=False)

    def prepare_expert(self, gate, up, down):
        return self._cpu.prepare_expert(gate, up, down)

    def forward(self, prepared, x):
        return self._cpu.forward(prepared, x)


def test_a_backend_without_the_kind_refuses_it_by_name():
    w, b = weights_and_biases()
    with pytest.raises(InvalidPayload, match="the plain backend cannot run this expert: activation clamped_swiglu"):
        build_expert(payload(w, b), _SiluOnlyBackend())
    with pytest.raises(InvalidPayload, match=r"activation silu with biases \(it runs silu experts without biases\)"):
        build_expert(payload(w, b, activation=ExpertActivation()), _SiluOnlyBackend())
