"""gpt-oss attention (apps/generation/attention.py) against a direct numpy transcription of transformers'
eager_attention_forward (modeling_gpt_oss.py) with masking_utils' causal and sliding-window masks: sinks,
the window, the o_proj bias, a prefill chunk that starts mid-sequence, a past bounded to the window, and
several sequences in one call."""

from __future__ import annotations

import json

import numpy as np
import pytest

from apps.generation.attention import attention_tensor_shapes, gqa_weights, self_attention, softmax_causal
from apps.generation.rope import RopeTables, inv_freq
from apps.generation.spec import TransformerSpec, spec_from_config
from tests.generation.conftest import FIXTURES

T = 11  # positions of the test sequence: more than twice the fixture's window of 4
SLIDING, FULL = 0, 1  # the fixture's layer_types: sliding, full, sliding


@pytest.fixture(scope="module")
def spec() -> TransformerSpec:
    return spec_from_config(json.loads((FIXTURES / "gpt_oss" / "config.json").read_text()), model_id="g")


def layer_tensors(spec: TransformerSpec, layer: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + layer)
    out = {}
    for name, shape in attention_tensor_shapes(spec, layer).items():
        scale = 1.0 if name.endswith(("bias", "sinks")) else shape[-1] ** -0.5
        out[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out


def rotate_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """modeling_gpt_oss._apply_rotary_emb: x [t, heads, hd], cos/sin [t, hd/2]."""
    first, second = np.split(x, 2, axis=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([first * c - second * s, second * c + first * s], axis=-1)


def eager_reference(spec: TransformerSpec, t: dict[str, np.ndarray], layer: int, x: np.ndarray) -> np.ndarray:
    """GptOssAttention.forward of one sequence x f32 [T, d] at positions 0..T-1 with eager_attention_forward and
    the layer's mask (create_causal_mask / create_sliding_window_causal_mask) -> [T, d]."""
    p = f"model.layers.{layer}.self_attn."
    n, h, kvh, hd = x.shape[0], spec.n_heads, spec.n_kv_heads, spec.head_dim
    q = (x @ t[p + "q_proj.weight"].T + t[p + "q_proj.bias"]).reshape(n, h, hd)
    k = (x @ t[p + "k_proj.weight"].T + t[p + "k_proj.bias"]).reshape(n, kvh, hd)
    v = (x @ t[p + "v_proj.weight"].T + t[p + "v_proj.bias"]).reshape(n, kvh, hd)
    freqs, attention_scaling = inv_freq(spec.rope)
    angles = np.arange(n, dtype=np.float32)[:, None] * freqs[None, :]
    cos, sin = np.cos(angles) * np.float32(attention_scaling), np.sin(angles) * np.float32(attention_scaling)
    q, k = rotate_half(q, cos, sin).transpose(1, 0, 2), rotate_half(k, cos, sin).transpose(1, 0, 2)  # (heads, T, hd)
    v = v.transpose(1, 0, 2)
    key_states = np.repeat(k, h // kvh, axis=0)  # repeat_kv
    value_states = np.repeat(v, h // kvh, axis=0)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = j <= i  # causal_mask_function
    if spec.window(layer) is not None:
        allowed &= j > i - spec.window(layer)  # sliding_window_overlay
    mask = np.where(allowed, np.float32(0), np.finfo(np.float32).min)
    attn_weights = q @ key_states.transpose(0, 2, 1) * np.float32(spec.attn_scale) + mask
    sinks = np.broadcast_to(t[p + "sinks"].reshape(-1, 1, 1), (h, n, 1))
    combined = np.concatenate([attn_weights, sinks], axis=-1)
    combined = combined - combined.max(axis=-1, keepdims=True)
    probs = np.exp(combined) / np.exp(combined).sum(axis=-1, keepdims=True)
    out = (probs[..., :-1] @ value_states).transpose(1, 0, 2).reshape(n, h * hd)  # the sink column dropped
    return out @ t[p + "o_proj.weight"].T + t[p + "o_proj.bias"]


def setup(spec: TransformerSpec, layer: int, seed: int = 0):
    tensors = layer_tensors(spec, layer, seed)
    x = np.random.default_rng(100 + seed).standard_normal((T, spec.d_model)).astype(np.float32)
    return tensors, gqa_weights(spec, tensors, layer), RopeTables(spec.rope), x


def close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [SLIDING, FULL])
def test_prefill_equals_eager_attention(spec, layer):
    tensors, w, rope, x = setup(spec, layer)
    assert w.window == (4 if layer == SLIDING else None) and w.sinks.shape == (4,) and w.o_bias.shape == (64,)
    empty = np.zeros((0, spec.n_kv_heads, spec.head_dim), dtype=np.float32)
    out, k, v = self_attention(spec, w, rope, x, [(0, T, empty, empty)])
    close(out, eager_reference(spec, tensors, layer, x))
    assert k.shape == v.shape == (T, spec.n_kv_heads, spec.head_dim)


def test_the_sinks_the_window_and_the_o_bias_each_change_the_output(spec):
    _, w, rope, x = setup(spec, SLIDING)
    empty = np.zeros((0, spec.n_kv_heads, spec.head_dim), dtype=np.float32)
    ref = self_attention(spec, w, rope, x, [(0, T, empty, empty)])[0]
    for change in ({"sinks": None}, {"window": None}, {"o_bias": None}):
        other = self_attention(spec, type(w)(**{**w.__dict__, **change}), rope, x, [(0, T, empty, empty)])[0]
        assert np.abs(other - ref).max() > 1e-2, change


@pytest.mark.parametrize("layer", [SLIDING, FULL])
@pytest.mark.parametrize("start", [1, 3, 6])
def test_a_chunk_starting_mid_sequence_over_a_full_or_bounded_past(spec, layer, start):
    """Rows start..T-1 as one chunk (5 to 10 rows: longer than the window) over the cached rows before
    start: all of them, or on the sliding layer only the last window-1 (KVCache's bound)."""
    tensors, w, rope, x = setup(spec, layer)
    ref = eager_reference(spec, tensors, layer, x)
    empty = np.zeros((0, spec.n_kv_heads, spec.head_dim), dtype=np.float32)
    _, k, v = self_attention(spec, w, rope, x[:start], [(0, start, empty, empty)])
    pasts = [(k, v)]
    if layer == SLIDING:
        keep = spec.sliding_window - 1
        pasts.append((k[-keep:], v[-keep:]))
    for past_k, past_v in pasts:
        out, new_k, _ = self_attention(spec, w, rope, x[start:], [(start, T - start, past_k, past_v)])
        close(out, ref[start:])
        assert new_k.shape[0] == T - start


def test_several_sequences_in_one_call_each_as_alone(spec):
    """Three sequences at different positions, one call: a fresh prefill, a decode row over a bounded past,
    a chunk over a full past; each comes out as it does alone (and as eager attention gives it)."""
    tensors, w, rope, x = setup(spec, SLIDING)
    ref = eager_reference(spec, tensors, SLIDING, x)
    empty = np.zeros((0, spec.n_kv_heads, spec.head_dim), dtype=np.float32)
    _, k, v = self_attention(spec, w, rope, x, [(0, T, empty, empty)])
    segments = [(0, 4, empty, empty), (10, 1, k[7:10], v[7:10]), (5, 3, k[:5], v[:5])]
    rows = np.concatenate([x[:4], x[10:11], x[5:8]])
    out, new_k, _ = self_attention(spec, w, rope, rows, segments)
    close(out, np.concatenate([ref[:4], ref[10:11], ref[5:8]]))
    np.testing.assert_allclose(new_k, np.concatenate([k[:4], k[10:11], k[5:8]]), rtol=1e-6, atol=1e-6)


def test_softmax_with_sinks_and_window(spec):
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((2, 3, 5)).astype(np.float32)  # (heads, t, T): queries 6..8 over keys 4..8
    sinks = np.array([0.5, -1.0], dtype=np.float32).reshape(2, 1, 1)
    p = softmax_causal(scores, 6, first=4, window=3, sinks=sinks)
    query, key = np.arange(6, 9)[:, None], np.arange(4, 9)[None, :]
    visible = (key <= query) & (key > query - 3)
    assert (p[:, ~visible] == 0).all()
    e = np.where(visible, np.exp(scores.astype(np.float64)), 0.0)
    want = e / (e.sum(axis=-1, keepdims=True) + np.exp(sinks.astype(np.float64)))
    np.testing.assert_allclose(p, want, rtol=1e-6)
    assert (p.sum(axis=-1) < 1).all()  # the sink took the rest
    plain = softmax_causal(scores, 6, first=4, window=3)
    np.testing.assert_allclose(softmax_causal(scores, 6, first=4, window=3,
                                              sinks=np.full((2, 1, 1), -np.inf, dtype=np.float32)), plain)
    np.testing.assert_allclose(plain.sum(axis=-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize(("layer", "start", "rows", "match"), [
    (SLIDING, 6, 2, r"has 2 cached rows; this layer needs 3 to 6 \(window 4\)"),
    (SLIDING, 2, 3, r"has 3 cached rows; this layer needs 2 to 2 \(window 4\)"),
    (FULL, 6, 3, "has 3 cached rows; this layer needs all 6"),
])
def test_a_past_that_cannot_be_the_one_before_start_is_refused(spec, layer, start, rows, match):
    _, w, rope, x = setup(spec, layer)
    past = np.zeros((rows, spec.n_kv_heads, spec.head_dim), dtype=np.float32)
    with pytest.raises(ValueError, match=match):
        self_attention(spec, w, rope, x[:1], [(start, 1, past, past)])
