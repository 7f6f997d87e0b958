"""The shape of a whole decoder-only MoE transformer, read from its Hugging Face ``config.json``.

Pure module (no Django). TransformerSpec carries every number the non-expert math needs
(apps/generation/model.py); the MoE layers' experts and gates are described by the catalog's
ModelShape (apps/catalog/shapes.py), whose layer rule this module reuses so the router and the
prepared experts can never disagree about which layers are MoE.

Families (the math of transformers 5.x, modeling_qwen3_moe.py / modeling_deepseek_v3.py /
modeling_glm4_moe.py / modeling_gpt_oss.py):
  ``qwen3_moe``    GQA attention with per-head q/k RMSNorm, rotate-half RoPE, scale head_dim^-0.5
  ``glm4_moe``     GQA attention with q/k/v biases (attention_bias), q/k RMSNorm only with use_qk_norm,
                   rotate-half RoPE on the first head_dim·partial_rotary_factor dims of each head (the
                   rest pass through), scale head_dim^-0.5; MoE layers route as deepseek_v3 does
  ``deepseek_v3``  MLA (q optionally through a q_lora_rank bottleneck, k/v through a kv_lora_rank
                   latent), RoPE on qk_rope_head_dim dims (interleaved pairs unless rope_interleave
                   is false), scale qk_head_dim^-0.5 · mscale(factor, mscale_all_dim)² under YaRN;
                   ``kimi_k2`` configs are read as deepseek_v3 (same architecture).
  ``gpt_oss``      GQA with q/k/v AND o_proj biases (attention_bias), no q/k norm, a learned attention sink
                   per head, ``layer_types`` alternating sliding-window ("sliding_attention", the last
                   sliding_window positions) and full causal layers, rotate-half YaRN RoPE (``truncate``
                   false: the ramp's bounds are not rounded), scale head_dim^-0.5; every layer MoE.
                   Keys the config leaves out take GptOssConfig's defaults (head_dim 64, 8 kv heads,
                   sliding_window 128, YaRN factor 32 over 4096 positions, rope_theta 150000).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apps.catalog.shapes import CatalogError, shape_from_config

FAMILIES = {"qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3", "glm4_moe": "glm4_moe",
            "gpt_oss": "gpt_oss"}
ROPE_KINDS = ("default", "yarn")
LAYER_TYPES = ("sliding_attention", "full_attention")
# transformers GptOssConfig's field defaults, for keys a gpt_oss config.json leaves out (note head_dim 64,
# not hidden_size // num_attention_heads, and 8 kv heads: the class defaults, not derived values)
GPT_OSS_DEFAULTS: dict[str, Any] = {
    "head_dim": 64, "num_key_value_heads": 8, "sliding_window": 128, "rms_norm_eps": 1e-5, "attention_bias": True,
    "rope_theta": 150000.0,
}
GPT_OSS_ROPE: dict[str, Any] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False, "original_max_position_embeddings": 4096}


@dataclass(frozen=True)
class RopeSpec:
    """RoPE on the first `dim` dims of each q/k head (all of them but under a partial_rotary_factor);
    YaRN fields are None for ``default``."""

    kind: str  # "default" | "yarn"
    theta: float
    dim: int
    interleave: bool  # DeepSeek's (x0, x1), (x2, x3) pairs instead of rotate-half halves
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None  # explicit cos/sin scale; None: derived from factor and mscales
    truncate: bool = True


@dataclass(frozen=True)
class TransformerSpec:
    """Everything but the experts. ``attention`` "gqa" uses n_heads/n_kv_heads/head_dim; "mla" uses the
    *_lora_rank and *_head_dim fields (head_dim is then qk_nope_head_dim + qk_rope_head_dim)."""

    model_id: str
    family: str  # "qwen3_moe" | "deepseek_v3" | "glm4_moe" | "gpt_oss"
    vocab_size: int
    d_model: int
    n_layers: int
    moe_layers: tuple[int, ...]
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention: str  # "gqa" | "mla"
    n_heads: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    qk_norm: bool  # Qwen3's per-head RMSNorm on q and k before RoPE
    dense_d_ff: int | None  # intermediate_size of the dense (non-MoE) layers; None when every layer is MoE
    rope: RopeSpec
    attn_scale: float  # softmax scale of q·k
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    max_position_embeddings: int | None = None
    attention_bias: bool = False  # q/k/v projection biases (GLM-4.5, gpt-oss)
    o_proj_bias: bool = False  # gpt-oss's output projection bias
    attention_sinks: bool = False  # gpt-oss's learned per-head sink logit (self_attn.sinks [n_heads])
    sliding_window: int | None = None  # keys visible to a query of a sliding layer: itself and the window-1 before
    sliding_layers: tuple[int, ...] = ()  # the layers of layer_types "sliding_attention"

    def window(self, layer: int) -> int | None:
        """`layer`'s sliding window (query i sees keys j with i - window < j <= i), or None: full causal."""
        return self.sliding_window if layer in self.sliding_layers else None

    def is_moe(self, layer: int) -> bool:
        """Whether `layer`'s FFN is the MoE block (run on the network) rather than a local dense SwiGLU."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer} outside 0..{self.n_layers - 1} of {self.model_id}")
        return layer in self.moe_layers


def _bad(message: str, reason: str = "shape_incomplete") -> CatalogError:
    return CatalogError(message, reason=reason)


def _int(config: Mapping[str, Any], key: str, where: str, *, default: Any = ..., positive: bool = True) -> Any:
    value = config.get(key)
    if value is None:
        if default is not ...:
            return default
        raise _bad(f"config.json ({where}) has no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value \
            or (positive and value <= 0):
        raise _bad(f"config.json ({where}) {key!r} must be a positive integer, received {value!r}")
    return int(value)


def _float(config: Mapping[str, Any], key: str, where: str, *, default: Any = ...) -> Any:
    value = config.get(key)
    if value is None:
        if default is not ...:
            return default
        raise _bad(f"config.json ({where}) has no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise _bad(f"config.json ({where}) {key!r} must be a number, received {value!r}")
    return float(value)


def _bool(config: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"config.json ({where}) {key!r} must be true or false, received {value!r}")
    return value


def _rope(config: Mapping[str, Any], where: str, dim: int, interleave: bool, *, partial_ok: bool = False) -> RopeSpec:
    """Hub spelling (``rope_theta`` + ``rope_scaling`` with ``type``) or 5.x's ``rope_parameters``.
    `partial_ok`: a partial_rotary_factor turns only int(dim · factor) dims (transformers' rule)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise _bad(f"config.json ({where}) rope_scaling/rope_parameters must be an object, received {params!r}")
    if any(isinstance(v, Mapping) for v in params.values()):
        raise _bad(f"config.json ({where}) has per-layer-type rope parameters, which are not supported")
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ROPE_KINDS:
        raise _bad(f"config.json ({where}) rope type {kind!r} is not supported (supported: {', '.join(ROPE_KINDS)})")
    theta = params.get("rope_theta", config.get("rope_theta"))
    if theta is None:
        raise _bad(f"config.json ({where}) has no 'rope_theta'")
    theta = _float({"rope_theta": theta}, "rope_theta", where)
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        factor = _float({"partial_rotary_factor": partial}, "partial_rotary_factor", where)
        if not partial_ok or not 0 < factor <= 1:
            raise _bad(f"config.json ({where}) partial_rotary_factor {partial!r} is not supported")
        dim = int(dim * factor)
        if dim < 2 or dim % 2:
            raise _bad(f"config.json ({where}) partial_rotary_factor {partial!r} leaves {dim} rotary dims "
                       "(an even number of at least 2 is needed)")
    if kind == "default":
        return RopeSpec(kind=kind, theta=theta, dim=dim, interleave=interleave)
    # transformers standardize_rope_params: a top-level original_max_position_embeddings wins, else
    # the rope dict's, else max_position_embeddings.
    original = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") \
        or config.get("max_position_embeddings")
    where_r = f"{where} rope_scaling"
    return RopeSpec(
        kind=kind, theta=theta, dim=dim, interleave=interleave,
        factor=_float(params, "factor", where_r),
        original_max_position_embeddings=_int({"o": original}, "o", where_r + " original_max_position_embeddings"),
        # `or`: transformers treats 0/None as "use the default" for the betas
        beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
        mscale=_float(params, "mscale", where_r, default=None),
        mscale_all_dim=_float(params, "mscale_all_dim", where_r, default=None),
        attention_factor=_float(params, "attention_factor", where_r, default=None),
        truncate=_bool(params, "truncate", where_r, True),
    )


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """DeepSeek's yarn_get_mscale: 0.1·mscale·ln(scale) + 1 above scale 1, else 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def spec_from_config(config: Mapping[str, Any], *, model_id: str) -> TransformerSpec:
    """TransformerSpec of a qwen3_moe / deepseek_v3 / kimi_k2 / glm4_moe / gpt_oss ``config.json`` (a dict).

    A multimodal wrapper's ``text_config`` is read through, as apps.catalog.shapes does.
    Raises CatalogError: reason "unknown_model" for an unsupported model_type, "shape_incomplete"
    naming the missing or bad key otherwise.
    """
    if not isinstance(config, Mapping):
        raise _bad("config.json must be a JSON object")
    text = config.get("text_config")
    if isinstance(text, Mapping) and config.get("model_type") not in FAMILIES:
        config = text
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise _bad(f"unsupported model_type {model_type!r} for whole-model generation (supported: "
                   f"{', '.join(FAMILIES)})", reason="unknown_model")
    where = str(model_type)
    if family == "gpt_oss":
        config = _gpt_oss_config(config)
    try:
        shape = shape_from_config(model_id, config)
    except CatalogError as exc:
        raise _bad(exc.message) from exc
    if config.get("hidden_act", "silu") != "silu":
        raise _bad(f"config.json ({where}) hidden_act {config.get('hidden_act')!r} is not supported (silu only)")
    attention_bias = _bool(config, "attention_bias", where, False)
    if attention_bias and family not in ("glm4_moe", "gpt_oss"):
        raise _bad(f"config.json ({where}) attention_bias true is not supported (hub checkpoints have none)")
    d_model = _int(config, "hidden_size", where)
    n_layers = _int(config, "num_hidden_layers", where)
    n_heads = _int(config, "num_attention_heads", where)
    moe_layers = tuple(shape.moe_layers or ())
    dense_needed = len(moe_layers) < n_layers
    dense_d_ff = _int(config, "intermediate_size", where) if dense_needed else config.get("intermediate_size")
    common = dict(
        model_id=model_id, family=family, vocab_size=_int(config, "vocab_size", where), d_model=d_model,
        n_layers=n_layers, moe_layers=moe_layers,
        rms_norm_eps=_float(config, "rms_norm_eps", where, default=1e-6),
        tie_word_embeddings=_bool(config, "tie_word_embeddings", where, False), n_heads=n_heads,
        dense_d_ff=dense_d_ff, max_position_embeddings=_int(config, "max_position_embeddings", where, default=None),
    )
    if family == "gpt_oss":
        return _gpt_oss(config, where, common, attention_bias)
    if family in ("qwen3_moe", "glm4_moe"):
        glm = family == "glm4_moe"
        if _bool(config, "use_sliding_window", where, False):
            raise _bad(f"config.json ({where}) use_sliding_window true is not supported")
        head_dim = _int(config, "head_dim", where, default=None) or d_model // n_heads
        n_kv = _int(config, "num_key_value_heads", where, default=n_heads)
        if n_heads % n_kv:
            raise _bad(f"config.json ({where}) num_attention_heads {n_heads} is not a multiple of "
                       f"num_key_value_heads {n_kv}")
        return TransformerSpec(**common, attention="gqa", n_kv_heads=n_kv, head_dim=head_dim, v_head_dim=head_dim,
                               qk_norm=_bool(config, "use_qk_norm", where, False) if glm else True,
                               rope=_rope(config, where, head_dim, interleave=False, partial_ok=glm),
                               attn_scale=head_dim ** -0.5, attention_bias=attention_bias)
    nope = _int(config, "qk_nope_head_dim", where)
    rope_dim = _int(config, "qk_rope_head_dim", where)
    if rope_dim % 2:
        raise _bad(f"config.json ({where}) qk_rope_head_dim {rope_dim} must be even")
    rope = _rope(config, where, rope_dim, interleave=_bool(config, "rope_interleave", where, True))
    scale = (nope + rope_dim) ** -0.5
    # transformers yarn_apply_mscale: any non-default rope type with a nonzero mscale_all_dim
    if rope.kind != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor or 1.0, rope.mscale_all_dim) ** 2
    return TransformerSpec(
        **common, attention="mla", n_kv_heads=n_heads, head_dim=nope + rope_dim,
        v_head_dim=_int(config, "v_head_dim", where), qk_norm=False, rope=rope, attn_scale=scale,
        q_lora_rank=_int(config, "q_lora_rank", where, default=None), kv_lora_rank=_int(config, "kv_lora_rank", where),
        qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim,
    )


def _gpt_oss_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with GptOssConfig's defaults for the keys it leaves out (an explicit null stays null:
    transformers then derives num_key_value_heads and head_dim from the head count)."""
    out = {**GPT_OSS_DEFAULTS, **config}
    if not (config.get("rope_parameters") or config.get("rope_scaling")):
        out["rope_scaling"] = GPT_OSS_ROPE
    return out


def _gpt_oss(config: Mapping[str, Any], where: str, common: dict[str, Any], attention_bias: bool) -> TransformerSpec:
    n_heads, n_layers = common["n_heads"], common["n_layers"]
    head_dim = _int(config, "head_dim", where, default=None) or common["d_model"] // n_heads
    n_kv = _int(config, "num_key_value_heads", where, default=n_heads)
    if n_heads % n_kv:
        raise _bad(f"config.json ({where}) num_attention_heads {n_heads} is not a multiple of "
                   f"num_key_value_heads {n_kv}")
    # GptOssConfig: sliding, full, sliding, full, ... when layer_types is absent
    types = config.get("layer_types") or [LAYER_TYPES[i % 2] for i in range(n_layers)]
    if not isinstance(types, list | tuple) or len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        raise _bad(f"config.json ({where}) layer_types must list {n_layers} of {', '.join(LAYER_TYPES)}, "
                   f"received {types!r}")
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    window = _int(config, "sliding_window", where, default=None)
    if sliding and window is None:
        raise _bad(f"config.json ({where}) has sliding_attention layers but no 'sliding_window'")
    # intermediate_size is the experts' width here: no layer is a dense FFN
    return TransformerSpec(**{**common, "dense_d_ff": None}, attention="gqa", n_kv_heads=n_kv, head_dim=head_dim,
                           v_head_dim=head_dim, qk_norm=False, rope=_rope(config, where, head_dim, interleave=False),
                           attn_scale=head_dim ** -0.5, attention_bias=attention_bias, o_proj_bias=attention_bias,
                           attention_sinks=True, sliding_window=window if sliding else None, sliding_layers=sliding)


__all__ = ["FAMILIES", "RopeSpec", "TransformerSpec", "spec_from_config", "yarn_mscale"]
