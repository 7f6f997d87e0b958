"""Rotary position embeddings: inverse frequencies (default and YaRN) and their application to q/k.

Pure module (numpy). Follows transformers 5.x modeling_rope_utils.py (``_compute_default_rope_parameters``,
``_compute_yarn_parameters``) and the two ways of rotating a head:

  rotate-half (Qwen3, and DeepSeek with rope_interleave false): pair dim i with dim i + dim/2
      out = x·cos + rotate_half(x)·sin,  rotate_half([a, b]) = [-b, a]
  interleaved (DeepSeek's default): pair dims (2i, 2i+1); the output is written DE-interleaved,
      out = [x_even·cos - x_odd·sin, x_odd·cos + x_even·sin]   (all evens first, then all odds)
      q and k get the same permutation, so q·k is that of the interleaved rotation.

cos and sin carry YaRN's attention_factor (transformers multiplies them, not the scores).
"""

from __future__ import annotations

import math

import numpy as np

from apps.generation.spec import RopeSpec, yarn_mscale


def inv_freq(rope: RopeSpec) -> tuple[np.ndarray, float]:
    """(inverse frequencies f32 [dim/2], attention_factor) of `rope`."""
    dim, base = rope.dim, rope.theta
    # f64 exponents, cast once: transformers computes these in f32, which differs by an ulp at most
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)  # (dim/2,)
    if rope.kind == "default":
        return (1.0 / pos_freqs).astype(np.float32), 1.0
    factor = float(rope.factor)  # spec_from_config requires it for yarn
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    original = float(rope.original_max_position_embeddings)

    def correction_dim(rotations: float) -> float:
        # the dimension whose wavelength turns `rotations` times over the original context
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: prevent a division by zero in the ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)  # (dim/2,)
    extrapolation = 1.0 - ramp  # 1: keep the original frequency (high-frequency dims), 0: interpolate
    freqs = (1.0 / (factor * pos_freqs)) * (1.0 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return freqs.astype(np.float32), float(attention_factor)


class RopeTables:
    """cos/sin for any positions of one RopeSpec (computed per call; positions are few per step)."""

    def __init__(self, rope: RopeSpec) -> None:
        self.rope = rope
        self.inv_freq, self.attention_factor = inv_freq(rope)

    def cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """positions int [t] -> (cos, sin) f32 [t, dim/2], attention_factor applied."""
        freqs = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]  # (t, dim/2), f32 as torch
        scale = np.float32(self.attention_factor)
        return np.cos(freqs) * scale, np.sin(freqs) * scale

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate x f32 [t, heads, head_dim] by (cos, sin) [t, dim/2] -> f32 [t, heads, head_dim]: its
        first rope.dim dims turn, the rest (a partial_rotary_factor's) pass through."""
        if self.rope.dim < x.shape[-1]:
            return np.concatenate([self.apply(x[..., : self.rope.dim], cos, sin), x[..., self.rope.dim:]], axis=-1)
        c, s = cos[:, None, :], sin[:, None, :]  # (t, 1, dim/2)
        if self.rope.interleave:
            a, b = x[..., 0::2], x[..., 1::2]
        else:
            half = x.shape[-1] // 2
            a, b = x[..., :half], x[..., half:]
        # both layouts: the pair (a, b) turns by the angle; only where a and b live differs
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


__all__ = ["RopeTables", "inv_freq"]
