"""Causal self-attention of one layer over a KV cache: GQA (q/k norm, biases, sinks, sliding window) and MLA.

Pure module (numpy, f32). `self_attention` takes the layer's prepared weights and the normed hidden
rows of one or more sequences stacked (x f32 [n, d_model]), each sequence's rows at positions
start .. start+t-1 over its own cached entries of the positions just before (all of 0 .. start-1, or
only the last ones on a sliding-window layer), and returns the attention output [n, d_model] plus the
new rows to append to the caches. The caller appends them (apps/generation/model.py), so a failed step
leaves every cache as it was. Several sequences in one call share the projections (one matrix product
for all rows: continuous batching's dense half).

Cache entries:
  GQA  k, v            f32 [T, n_kv_heads, head_dim] each, k after q/k-norm and RoPE
  MLA  latent, k_rot   f32 [T, kv_lora_rank] (kv_a_layernorm applied) and [T, qk_rope_head_dim] (RoPE
                       applied): transformers' own MLA cache, n_heads·(nope+v)/(rank+rope) times smaller
                       than the per-head keys and values (4.3x for DeepSeek-V3's 128 heads: 576 vs 32,768
                       floats per position and layer).

MLA scores and values are computed in the latent ("weight absorption", DeepSeek-V2 §2.1.2):
kv_b_proj [n_heads·(nope+v), rank] splits per head into W_UK [nope, rank] and W_UV [v, rank];
q_nope·k_nope = (q_nope·W_UK)·latent and Σ p·v = (Σ p·latent)·W_UVᵀ, so the per-head keys and values
are never materialized. Mathematically the transformers computation; f32 rounding differs at ~1e-7.

gpt-oss (transformers' eager_attention_forward): each head has a learned sink logit s_h that joins the
softmax as one more column and is then dropped, so a head can put weight on "nothing":
p_j = exp(score_j) / (Σ_k exp(score_k) + exp(s_h)). Its sliding layers mask key j from query i unless
i - window < j <= i (masking_utils.sliding_window_causal_mask_function).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apps.generation.rope import RopeTables
from apps.generation.spec import TransformerSpec


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x f32 [..., n] -> weight · x / sqrt(mean(x²) + eps), over the last axis, in f32 (as transformers)."""
    variance = np.mean(np.square(x), axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + np.float32(eps)))


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x f32 [n, k] times w [m, k] transposed -> [n, m]: a layer's projection of n rows.

    A decode batch's few rows are memory-bound: each reads the whole weight. Up to 3 rows go as one
    GEMV each (OpenBLAS's GEMM packs a whole operand first: 3–4x a GEMV at 2 rows); more go as w @ xᵀ,
    1.4–1.6x faster than x @ wᵀ at 4–64 rows, as GEMM then packs the small x (docs/performance.md,
    "Concurrent generations")."""
    if x.shape[0] <= 3:
        return np.stack([w @ row for row in x])
    return (w @ x.T).T


def softmax_causal(scores: np.ndarray, start: int, *, first: int = 0, window: int | None = None,
                   sinks: np.ndarray | None = None) -> np.ndarray:
    """scores f32 [..., t, T] of queries at positions start .. start+t-1 over keys at positions
    first .. first+T-1 -> their softmax under the causal mask (and the sliding window when `window`).

    `sinks` f32 broadcastable to [..., 1, 1] (one logit per head): an extra softmax column, dropped from
    the result, so a row sums to less than 1."""
    t, total = scores.shape[-2:]
    query = (start + np.arange(t))[:, None]  # (t, 1)
    key = (first + np.arange(total))[None, :]  # (1, T)
    visible = key <= query  # a query never sees a later position
    if window is not None:
        visible &= key > query - window
    scores = np.where(visible, scores, np.float32(-np.inf))  # (..., t, T)
    peak = scores.max(axis=-1, keepdims=True)  # each row sees at least its own key: finite
    if sinks is None:
        e = np.exp(scores - peak)
        return e / e.sum(axis=-1, keepdims=True)
    peak = np.maximum(peak, sinks)  # the max over [scores, sink], as eager_attention_forward subtracts it
    e = np.exp(scores - peak)
    return e / (e.sum(axis=-1, keepdims=True) + np.exp(sinks - peak))


@dataclass(frozen=True)
class GqaWeights:
    qkv: np.ndarray  # (n_heads·head_dim + 2·n_kv_heads·head_dim, d_model): q_proj, k_proj, v_proj stacked
    o: np.ndarray  # (d_model, n_heads·head_dim)
    q_norm: np.ndarray | None  # (head_dim,)
    k_norm: np.ndarray | None  # (head_dim,)
    qkv_bias: np.ndarray | None = None  # (n_heads·head_dim + 2·n_kv_heads·head_dim,): q/k/v biases (GLM-4.5, gpt-oss)
    o_bias: np.ndarray | None = None  # (d_model,): gpt-oss's o_proj bias
    sinks: np.ndarray | None = None  # (n_heads,): gpt-oss's per-head sink logits
    window: int | None = None  # this layer's sliding window; None: full causal attention


@dataclass(frozen=True)
class MlaWeights:
    q: np.ndarray | None  # (n_heads·qk_head_dim, d_model) when q_lora_rank is None
    q_a: np.ndarray | None  # (q_lora_rank, d_model)
    q_a_norm: np.ndarray | None  # (q_lora_rank,)
    q_b: np.ndarray | None  # (n_heads·qk_head_dim, q_lora_rank)
    kv_a: np.ndarray  # (kv_lora_rank + rope, d_model)
    kv_a_norm: np.ndarray  # (kv_lora_rank,)
    w_uk: np.ndarray  # (n_heads, nope, kv_lora_rank): kv_b_proj's key rows per head
    w_uv_t: np.ndarray  # (n_heads, kv_lora_rank, v_head_dim): kv_b_proj's value rows per head, transposed
    o: np.ndarray  # (d_model, n_heads·v_head_dim)


def attention_tensor_shapes(spec: TransformerSpec, layer: int) -> dict[str, tuple[int, ...]]:
    """Hub names and shapes of one layer's attention tensors (norms of the decoder layer excluded)."""
    p = f"model.layers.{layer}.self_attn."
    d, h = spec.d_model, spec.n_heads
    if spec.attention == "gqa":
        hd, kvh = spec.head_dim, spec.n_kv_heads
        out = {p + "q_proj.weight": (h * hd, d), p + "k_proj.weight": (kvh * hd, d),
               p + "v_proj.weight": (kvh * hd, d), p + "o_proj.weight": (d, h * hd)}
        if spec.qk_norm:
            out |= {p + "q_norm.weight": (hd,), p + "k_norm.weight": (hd,)}
        if spec.attention_bias:
            out |= {p + "q_proj.bias": (h * hd,), p + "k_proj.bias": (kvh * hd,), p + "v_proj.bias": (kvh * hd,)}
        if spec.o_proj_bias:
            out[p + "o_proj.bias"] = (d,)
        if spec.attention_sinks:
            out[p + "sinks"] = (h,)
        return out
    rank, rope, nope, v = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim
    out = {}
    if spec.q_lora_rank is None:
        out[p + "q_proj.weight"] = (h * spec.head_dim, d)
    else:
        out |= {p + "q_a_proj.weight": (spec.q_lora_rank, d), p + "q_a_layernorm.weight": (spec.q_lora_rank,),
                p + "q_b_proj.weight": (h * spec.head_dim, spec.q_lora_rank)}
    return out | {p + "kv_a_proj_with_mqa.weight": (rank + rope, d), p + "kv_a_layernorm.weight": (rank,),
                  p + "kv_b_proj.weight": (h * (nope + v), rank), p + "o_proj.weight": (d, h * v)}


def gqa_weights(spec: TransformerSpec, tensors: Mapping[str, np.ndarray], layer: int) -> GqaWeights:
    p = f"model.layers.{layer}.self_attn."
    qkv = np.concatenate([tensors[p + f"{name}_proj.weight"] for name in ("q", "k", "v")])
    bias = np.concatenate([tensors[p + f"{name}_proj.bias"] for name in ("q", "k", "v")]) \
        if spec.attention_bias else None
    return GqaWeights(qkv=qkv, o=tensors[p + "o_proj.weight"],
                      q_norm=tensors.get(p + "q_norm.weight") if spec.qk_norm else None,
                      k_norm=tensors.get(p + "k_norm.weight") if spec.qk_norm else None, qkv_bias=bias,
                      o_bias=tensors[p + "o_proj.bias"] if spec.o_proj_bias else None,
                      sinks=tensors[p + "sinks"] if spec.attention_sinks else None, window=spec.window(layer))


def mla_weights(spec: TransformerSpec, tensors: Mapping[str, np.ndarray], layer: int) -> MlaWeights:
    p = f"model.layers.{layer}.self_attn."
    nope = spec.qk_nope_head_dim
    kv_b = tensors[p + "kv_b_proj.weight"].reshape(spec.n_heads, nope + spec.v_head_dim, spec.kv_lora_rank)
    lora = spec.q_lora_rank is not None
    return MlaWeights(
        q=None if lora else tensors[p + "q_proj.weight"], q_a=tensors[p + "q_a_proj.weight"] if lora else None,
        q_a_norm=tensors[p + "q_a_layernorm.weight"] if lora else None,
        q_b=tensors[p + "q_b_proj.weight"] if lora else None,
        kv_a=tensors[p + "kv_a_proj_with_mqa.weight"], kv_a_norm=tensors[p + "kv_a_layernorm.weight"],
        w_uk=np.ascontiguousarray(kv_b[:, :nope, :]),
        w_uv_t=np.ascontiguousarray(kv_b[:, nope:, :].transpose(0, 2, 1)),
        o=tensors[p + "o_proj.weight"],
    )


Segment = tuple[int, int, np.ndarray, np.ndarray]
"""One sequence's rows in a batch: (start, rows, past_a, past_b): its rows sit at positions start ..
start+rows-1 and attend to its own cached entries past_a, past_b [P, ...] of the P positions just before,
start-P .. start-1. P is start (every earlier position) on a full-attention layer; on a sliding layer of
window W it may be as few as min(start, W-1), all that the first row can see (KVCache keeps no more)."""


def self_attention(spec: TransformerSpec, w: GqaWeights | MlaWeights, rope: RopeTables, x: np.ndarray,
                   segments: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x f32 [n, d_model], the rows of `segments` stacked in order (n = Σ rows), ->
    (out [n, d_model], new_a [n, ...], new_b [n, ...]): the new cache rows of every segment, stacked alike.

    The projections, the norms, RoPE and the output projection are row-wise, so they run once over all
    rows; only the scores and the softmax are per sequence, over its own past. A sequence's rows come
    out as they would alone, up to the float rounding of a matrix product with more rows."""
    if sum(rows for _, rows, _, _ in segments) != x.shape[0]:
        raise ValueError(f"segments cover {sum(rows for _, rows, _, _ in segments)} rows, x has {x.shape[0]}")
    window = w.window if isinstance(w, GqaWeights) else None
    for start, _, past_a, _ in segments:
        need = start if window is None else min(start, window - 1)
        if not need <= len(past_a) <= start:
            wants = f"all {start}" if window is None else f"{need} to {start} (window {window})"
            raise ValueError(f"a segment at position {start} has {len(past_a)} cached rows; this layer needs {wants}")
    positions = np.concatenate([np.arange(start, start + rows) for start, rows, _, _ in segments])
    if isinstance(w, GqaWeights):
        return _gqa(spec, w, rope, x, positions, segments)
    return _mla(spec, w, rope, x, positions, segments)


def _gqa(spec: TransformerSpec, w: GqaWeights, rope: RopeTables, x: np.ndarray, positions: np.ndarray,
         segments: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k and v new rows f32 [n, n_kv_heads, head_dim]; past_k, past_v of each segment [P, kvh, hd], the P
    positions before its start."""
    n, h, kvh, hd = x.shape[0], spec.n_heads, spec.n_kv_heads, spec.head_dim
    qkv = linear(x, w.qkv)  # one product for the three: (n, (h + 2·kvh)·hd)
    if w.qkv_bias is not None:
        qkv += w.qkv_bias
    q = qkv[:, : h * hd].reshape(n, h, hd)
    k = qkv[:, h * hd: (h + kvh) * hd].reshape(n, kvh, hd)
    v = qkv[:, (h + kvh) * hd:].reshape(n, kvh, hd)
    if w.q_norm is not None:  # Qwen3 (GLM with use_qk_norm): RMSNorm over each head's dims, before RoPE
        q = rms_norm(q, w.q_norm, spec.rms_norm_eps)
        k = rms_norm(k, w.k_norm, spec.rms_norm_eps)
    cos, sin = rope.cos_sin(positions)
    q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
    ctx = np.empty((n, h * hd), dtype=np.float32)
    rep, offset = h // kvh, 0
    # query head g·rep + r reads kv head g (transformers repeat_kv), and has sink g·rep + r
    sinks = None if w.sinks is None else w.sinks.reshape(kvh, rep, 1, 1)
    for start, t, past_k, past_v in segments:
        rows = slice(offset, offset + t)
        offset += t
        keys = np.concatenate([past_k, k[rows]]) if len(past_k) else k[rows]  # (T, kvh, hd)
        values = np.concatenate([past_v, v[rows]]) if len(past_v) else v[rows]
        qg = q[rows].reshape(t, kvh, rep, hd).transpose(1, 2, 0, 3).reshape(kvh, rep * t, hd)  # (kvh, rep·t, hd)
        scores = (qg @ keys.transpose(1, 2, 0)) * np.float32(spec.attn_scale)  # (kvh, rep·t, T)
        probs = softmax_causal(scores.reshape(kvh, rep, t, -1), start, first=start - len(past_k), window=w.window,
                               sinks=sinks)  # (kvh, rep, t, T)
        c = probs.reshape(kvh, rep * t, -1) @ values.transpose(1, 0, 2)  # (kvh, rep·t, hd)
        ctx[rows] = c.reshape(kvh, rep, t, hd).transpose(2, 0, 1, 3).reshape(t, h * hd)
    out = linear(ctx, w.o)
    if w.o_bias is not None:
        out += w.o_bias
    return out, k, v


def _mla(spec: TransformerSpec, w: MlaWeights, rope: RopeTables, x: np.ndarray, positions: np.ndarray,
         segments: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """latent f32 [n, rank] and k_rot [n, rope] new rows; past_latent, past_k_rot of each segment
    [start, rank], [start, rope]."""
    n, h, nope, rank = x.shape[0], spec.n_heads, spec.qk_nope_head_dim, spec.kv_lora_rank
    # q_lora_rank set (V3, K2): a low-rank bottleneck with its own RMSNorm; None (V2-Lite): one projection
    q = linear(x, w.q) if w.q is not None else linear(rms_norm(linear(x, w.q_a), w.q_a_norm, spec.rms_norm_eps), w.q_b)
    q = q.reshape(n, h, spec.head_dim)
    q_nope, q_rot = q[..., :nope], q[..., nope:]
    compressed = linear(x, w.kv_a)  # (n, rank + rope)
    latent = rms_norm(compressed[:, :rank], w.kv_a_norm, spec.rms_norm_eps)  # (n, rank)
    cos, sin = rope.cos_sin(positions)
    q_rot = rope.apply(q_rot, cos, sin).transpose(1, 0, 2)  # (h, n, rope)
    k_rot = rope.apply(compressed[:, None, rank:], cos, sin)[:, 0, :]  # one rope key shared by all heads
    q_lat = q_nope.transpose(1, 0, 2) @ w.w_uk  # (h, n, rank)
    ctx_lat = np.empty((h, n, rank), dtype=np.float32)
    offset = 0
    for start, t, past_latent, past_k_rot in segments:
        rows = slice(offset, offset + t)
        offset += t
        lat = np.concatenate([past_latent, latent[rows]]) if len(past_latent) else latent[rows]  # (T, rank)
        kr = np.concatenate([past_k_rot, k_rot[rows]]) if len(past_k_rot) else k_rot[rows]  # (T, rope)
        scores = q_lat[:, rows] @ lat.T + q_rot[:, rows] @ kr.T  # (h, t, T)
        ctx_lat[:, rows] = softmax_causal(scores * np.float32(spec.attn_scale), start) @ lat
    ctx = (ctx_lat @ w.w_uv_t).transpose(1, 0, 2).reshape(n, h * spec.v_head_dim)  # (h, n, v) -> (n, h·v)
    return linear(ctx, w.o), latent, k_rot


__all__ = ["GqaWeights", "MlaWeights", "Segment", "attention_tensor_shapes", "gqa_weights", "mla_weights", "rms_norm",
           "self_attention", "softmax_causal"]
