"""Catalog of MoE model shapes, and shapes read from a checkpoint's ``config.json``.

Pure module (no Django). Every number in CATALOG carries a citation in its ``sources``
entry; a field nobody could cite is ``None`` and its source says so. Models newer than
any config this project could read (Qwen 3.5/3.6, Gemma 4, Kimi K2.5+/K3, MiniMax, DeepSeek
V4, GLM 5.x, Nemotron Nano) carry only the counts docs/specification.md states ("routed/active + shared").

Expert ids: routed experts are 0 … n_routed-1; shared experts, where a checkpoint fuses
them into one ``shared_experts`` MLP, are n_routed … n_routed+n_shared-1 (docs/formats.md
"Gate payload").

Checkpoint layouts (hub tensor names under ``model.layers.{L}.mlp.``):
  ``qwen_moe``     experts.{E}.{gate,up,down}_proj.weight, gate.weight (softmax router)
  ``qwen2_moe``    as qwen_moe plus a sigmoid-gated ``shared_expert`` + ``shared_expert_gate``
  ``deepseek``     as qwen_moe plus gate.e_score_correction_bias and a fused
                   ``shared_experts`` MLP; weights F8_E4M3 with 128×128 weight_scale_inv
  ``gpt_oss``      fused experts.gate_up_proj / down_proj (MXFP4); not sliceable here
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from core.errors import TenzroError

ROUTERS = ("softmax", "sigmoid")

SEED = "docs/specification.md (model list: routed/active + shared)"
NOT_FOUND = "not stated in docs/specification.md; no published config found in the sources available (no internet)"

QWEN3_30B_CONFIG = (
    "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (verbatim copy read from the public code "
    "index: num_experts 128, num_experts_per_tok 8, num_hidden_layers 48, hidden_size 2048, "
    "moe_intermediate_size 768, norm_topk_prob true, decoder_sparse_step 1, mlp_only_layers [])"
)
TRANSFORMERS_DSV3 = (
    "transformers src/transformers/models/deepseek_v3/configuration_deepseek_v3.py, DeepseekV3Config defaults "
    "('defaults will yield a similar configuration to that of the DeepSeek-V3'): n_routed_experts 256, "
    "num_experts_per_tok 8, n_shared_experts 1, num_hidden_layers 61, first_k_dense_replace 3, hidden_size 7168, "
    "moe_intermediate_size 2048, routed_scaling_factor 2.5, n_group 8, topk_group 4, norm_topk_prob true"
)
DSV3_ROUTER = (
    "transformers modeling_deepseek_v3.py DeepseekV3TopkRouter (sigmoid scores + e_score_correction_bias, "
    "group-limited top-k); docs/specification.md, 'Model catalog': DeepSeek-layout checkpoints route by sigmoid scores"
)
DSV3_LAYOUT = (
    "github.com/deepseek-ai/DeepSeek-V3 README_WEIGHTS.md (FP8 e4m3 weights, 128x128 block weight_scale_inv); "
    "docs/formats.md 'Checkpoints'"
)
KIMI_K2_README = (
    "github.com/MoonshotAI/Kimi-K2 README.md 'Model Summary': 61 layers (1 dense), attention hidden dimension "
    "7168, MoE hidden dimension per expert 2048, 384 experts, 8 selected per token, 1 shared expert"
)
KIMI_ROUTER = ("docs/specification.md, 'Model catalog': DeepSeek V3/V4 and Kimi K2/K3 route by sigmoid scores "
               "with a per-expert selection bias")
QWEN_ROUTER = "docs/specification.md, 'Model catalog': Qwen-layout checkpoints route by softmax top-k"
TRANSFORMERS_GPT_OSS = (
    "transformers src/transformers/models/gpt_oss/configuration_gpt_oss.py, GptOssConfig defaults (documented "
    "as similar to GPT-OSS-120B): num_hidden_layers 36, num_local_experts 128, num_experts_per_tok 4, "
    "hidden_size 2880, intermediate_size 2880 (per expert)"
)


class CatalogError(TenzroError, ValueError):
    """An unknown model id, or a config.json this module cannot turn into a shape."""

    reason = "unknown_model"


@dataclass(frozen=True)
class ModelShape:
    """The MoE shape of one model. ``None`` means unknown (see ``sources``)."""

    model_id: str
    family: str | None  # config model_type: "qwen3_moe", "deepseek_v3", "kimi_k2", …
    n_routed_experts: int | None
    n_active: int | None  # top_k (num_experts_per_tok)
    n_shared_experts: int | None
    n_layers: int | None
    moe_layers: tuple[int, ...] | None  # explicit MoE layer indices when n_layers and the rule are known
    moe_layer_rule: str | None  # e.g. "first_k_dense_replace=3, moe_layer_freq=1"
    d_model: int | None
    expert_d_ff: int | None  # moe_intermediate_size
    router: str | None  # "softmax" | "sigmoid"
    norm_topk_prob: bool | None
    routed_scaling_factor: float | None
    n_group: int | None
    topk_group: int | None
    checkpoint_layout: str | None  # "qwen_moe" | "qwen2_moe" | "deepseek" | "gpt_oss"
    default_source: str | None  # Hugging Face repo id
    sources: dict[str, str] = field(default_factory=dict)  # field -> citation

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer` has routed experts. Raises CatalogError when the layout is unknown."""
        if self.moe_layers is None:
            raise CatalogError(f"{self.model_id}: the MoE layer layout is not known", reason="shape_incomplete")
        return layer in self.moe_layers

    @property
    def n_experts_total(self) -> int | None:
        """Routed plus shared expert ids (the shared experts follow the routed ones)."""
        if self.n_routed_experts is None:
            return None
        return self.n_routed_experts + (self.n_shared_experts or 0)


def shape_to_dict(shape: ModelShape) -> dict[str, Any]:
    """JSON-ready dict of a shape (moe_layers as a list)."""
    out = asdict(shape)
    out["moe_layers"] = None if shape.moe_layers is None else list(shape.moe_layers)
    out["n_experts_total"] = shape.n_experts_total
    return out


def _layers_deepseek(n_layers: int, first_k_dense: int, freq: int) -> tuple[int, ...]:
    # transformers DeepseekV3DecoderLayer: MoE when idx >= first_k_dense_replace and idx % moe_layer_freq == 0
    return tuple(i for i in range(n_layers) if i >= first_k_dense and i % freq == 0)


def _layers_qwen(n_layers: int, sparse_step: int, mlp_only: list[int]) -> tuple[int, ...]:
    # transformers Qwen3MoeDecoderLayer: MoE when idx not in mlp_only_layers and (idx + 1) % decoder_sparse_step == 0
    return tuple(i for i in range(n_layers) if i not in mlp_only and (i + 1) % sparse_step == 0)


def _seed_only(model_id: str, routed: int | None, active: int | None, shared: int | None,
               *, family: str | None = None, router: str | None = None, router_src: str | None = None,
               layout: str | None = None, default_source: str | None = None) -> ModelShape:
    sources = {f: NOT_FOUND for f in ("n_layers", "moe_layers", "d_model", "expert_d_ff", "norm_topk_prob",
                                      "routed_scaling_factor", "n_group", "topk_group")}
    for f, v in (("n_routed_experts", routed), ("n_active", active), ("n_shared_experts", shared)):
        sources[f] = SEED if v is not None else NOT_FOUND
    sources["router"] = router_src if router else NOT_FOUND
    sources["checkpoint_layout"] = (router_src or NOT_FOUND) if layout else NOT_FOUND
    sources["default_source"] = NOT_FOUND if default_source is None else "hub repo id (not verified offline)"
    return ModelShape(
        model_id=model_id, family=family, n_routed_experts=routed, n_active=active, n_shared_experts=shared,
        n_layers=None, moe_layers=None, moe_layer_rule=None, d_model=None, expert_d_ff=None, router=router,
        norm_topk_prob=None, routed_scaling_factor=None, n_group=None, topk_group=None,
        checkpoint_layout=layout, default_source=default_source, sources=sources,
    )


def _build_catalog() -> dict[str, ModelShape]:
    shapes: list[ModelShape] = []
    qwen3_30b = dict(
        family="qwen3_moe", n_routed_experts=128, n_active=8, n_shared_experts=0, n_layers=48,
        moe_layers=_layers_qwen(48, 1, []), moe_layer_rule="decoder_sparse_step=1, mlp_only_layers=[]",
        d_model=2048, expert_d_ff=768, router="softmax", norm_topk_prob=True, routed_scaling_factor=1.0,
        n_group=1, topk_group=1, checkpoint_layout="qwen_moe",
    )
    shapes.append(ModelShape(
        model_id="qwen3-30b-a3b", default_source="Qwen/Qwen3-30B-A3B", **qwen3_30b,
        sources={
            **dict.fromkeys(("n_routed_experts", "n_active", "n_layers", "moe_layers", "d_model", "expert_d_ff",
                             "norm_topk_prob", "family"), QWEN3_30B_CONFIG),
            "n_shared_experts": "Qwen3MoeSparseMoeBlock has no shared expert; config has no shared_expert keys",
            "router": QWEN_ROUTER + "; transformers Qwen3MoeSparseMoeBlock (softmax, top-k)",
            "routed_scaling_factor": "softmax family: no scaling (1.0) in Qwen3MoeSparseMoeBlock",
            "n_group": "softmax family: no group-limited routing", "topk_group": "softmax family: no groups",
            "checkpoint_layout": "docs/formats.md 'Checkpoints' hub tensor names", "default_source": QWEN3_30B_CONFIG,
        },
    ))
    shapes.append(ModelShape(
        model_id="deepseek-v3-0324", family="deepseek_v3", n_routed_experts=256, n_active=8, n_shared_experts=1,
        n_layers=61, moe_layers=_layers_deepseek(61, 3, 1), moe_layer_rule="first_k_dense_replace=3, moe_layer_freq=1",
        d_model=7168, expert_d_ff=2048, router="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5,
        n_group=8, topk_group=4, checkpoint_layout="deepseek", default_source="deepseek-ai/DeepSeek-V3-0324",
        sources={
            **dict.fromkeys(("family", "n_layers", "moe_layers", "d_model", "expert_d_ff", "norm_topk_prob",
                             "routed_scaling_factor", "n_group", "topk_group"), TRANSFORMERS_DSV3),
            **dict.fromkeys(("n_routed_experts", "n_active", "n_shared_experts"),
                            TRANSFORMERS_DSV3 + "; docs/specification.md '256/8 + 1'"),
            "router": DSV3_ROUTER, "checkpoint_layout": DSV3_LAYOUT,
            "default_source": "docs/specification.md 'DeepSeek V3 0324' (hub repo id not verified offline)",
        },
    ))
    shapes.append(ModelShape(
        model_id="kimi-k2-instruct", family="kimi_k2", n_routed_experts=384, n_active=8, n_shared_experts=1,
        n_layers=61, moe_layers=_layers_deepseek(61, 1, 1), moe_layer_rule="first_k_dense_replace=1, moe_layer_freq=1",
        d_model=7168, expert_d_ff=2048, router="sigmoid", norm_topk_prob=None, routed_scaling_factor=None,
        n_group=None, topk_group=None, checkpoint_layout="deepseek", default_source="moonshotai/Kimi-K2-Instruct",
        sources={
            **dict.fromkeys(("n_routed_experts", "n_active", "n_shared_experts", "n_layers", "moe_layers",
                             "d_model", "expert_d_ff"), KIMI_K2_README + "; docs/specification.md '384/8 + 1'"),
            "family": "hub tag kimi_k2 (model_type); DeepseekV3 architecture",
            "router": KIMI_ROUTER, "checkpoint_layout": KIMI_ROUTER + "; docs/formats.md 'Checkpoints'",
            **dict.fromkeys(("norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group"),
                            "no authoritative config.json found offline; read them from the checkpoint's config.json "
                            "(shape_from_config) when preparing"),
            "default_source": "github.com/MoonshotAI/Kimi-K2 README.md (Kimi-K2-Instruct)",
        },
    ))
    shapes.append(ModelShape(
        model_id="gpt-oss-120b", family="gpt_oss", n_routed_experts=128, n_active=4, n_shared_experts=0,
        n_layers=36, moe_layers=tuple(range(36)), moe_layer_rule="every layer",
        d_model=2880, expert_d_ff=2880, router="softmax", norm_topk_prob=True, routed_scaling_factor=1.0,
        n_group=1, topk_group=1, checkpoint_layout="gpt_oss", default_source="openai/gpt-oss-120b",
        sources={
            **dict.fromkeys(("n_layers", "moe_layers", "d_model", "expert_d_ff", "family"), TRANSFORMERS_GPT_OSS),
            **dict.fromkeys(("n_routed_experts", "n_active"), TRANSFORMERS_GPT_OSS + "; docs/specification.md '128/4'"),
            "n_shared_experts": ("transformers GptOssMLP has router + experts only (no shared expert); "
                                 "docs/specification.md '128/4'"),
            **dict.fromkeys(("router", "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group"),
                            "transformers GptOssTopKRouter: softmax over the top-k of logits = h·Wᵀ + b"),
            "checkpoint_layout": "transformers GptOss base_model_ep_plan: fused experts.gate_up_proj/down_proj "
                                 "with biases (MXFP4 *_blocks/*_scales in openai/gpt-oss-120b)",
            "default_source": "transformers GptOss docs (openai/gpt-oss-120b)",
        },
    ))
    # docs/specification.md gives no "+ n" shared count for the Qwen entries; a shared expert (and so the
    # checkpoint layout) is not known for them until a config.json says so.
    qwen_seed = dict(family=None, router="softmax", router_src=QWEN_ROUTER, layout=None)
    shapes += [
        _seed_only("qwen3-coder-30b-a3b", 128, 8, None, default_source="Qwen/Qwen3-Coder-30B-A3B-Instruct",
                   **qwen_seed),
        _seed_only("qwen3.5-35b-a3b", 128, 8, None, **qwen_seed),
        _seed_only("qwen3.5-122b-a10b", 128, 8, None, **qwen_seed),
        _seed_only("qwen3.5-397b-a17b", 128, 8, None, **qwen_seed),
        _seed_only("qwen3.6-35b-a3b", 128, 8, None, **qwen_seed),
        _seed_only("gemma-4-26b-a4b", 128, 4, 1),
        _seed_only("diffusiongemma-26b-a4b", None, None, None),
        _seed_only("kimi-k2.5", 384, 8, 1, router="sigmoid", router_src=KIMI_ROUTER, layout="deepseek"),
        _seed_only("kimi-k2.6", 384, 8, 1, router="sigmoid", router_src=KIMI_ROUTER, layout="deepseek"),
        _seed_only("kimi-k2.7-code", 384, 8, 1, router="sigmoid", router_src=KIMI_ROUTER, layout="deepseek"),
        _seed_only("kimi-k3", 896, 16, 2, router="sigmoid", router_src=KIMI_ROUTER, layout="deepseek"),
        _seed_only("minimax-m1", 32, 2, None),
        _seed_only("minimax-m3", 32, 2, None),
        _seed_only("deepseek-v4-pro", None, None, None, router="sigmoid", router_src=KIMI_ROUTER, layout="deepseek"),
        _seed_only("deepseek-v4-flash", None, None, None, router="sigmoid", router_src=KIMI_ROUTER,
                   layout="deepseek"),
        _seed_only("glm-5", None, None, None),
        _seed_only("glm-5.1", None, None, None),
        _seed_only("glm-5.2", None, None, None),
        _seed_only("nemotron-nano-30b-a3b", 16, 4, None),
    ]
    # docs/specification.md lists "(128/4 + 1)" for Gemma 4 and "(384/8 + 1)" for Kimi: the "+ n" is the shared count;
    # entries listed without "+ n" leave the shared count unknown (None).
    return {s.model_id: s for s in shapes}


CATALOG: dict[str, ModelShape] = _build_catalog()


def catalog_shape(model_id: str) -> ModelShape:
    """The catalog shape of `model_id` (case-insensitive); CatalogError lists the known ids."""
    key = str(model_id).strip().lower()
    shape = CATALOG.get(key)
    if shape is None:
        raise CatalogError(
            f"model {model_id!r} is not in the catalog (known: {', '.join(sorted(CATALOG))}); "
            "pass a checkpoint to read its shape from config.json",
            reason="unknown_model",
        )
    return shape


# --- shapes from config.json ----------------------------------------------------------------

QWEN_TYPES = ("qwen3_moe", "qwen2_moe")
DEEPSEEK_TYPES = ("deepseek_v3", "kimi_k2", "glm4_moe")
GPT_OSS_TYPES = ("gpt_oss",)
SUPPORTED_MODEL_TYPES = QWEN_TYPES + DEEPSEEK_TYPES + GPT_OSS_TYPES


def _need(config: Mapping[str, Any], key: str, model_type: str, kind: type = int) -> Any:
    if key not in config or config[key] is None:
        raise CatalogError(f"config.json ({model_type}) has no {key!r}", reason="config_missing_key")
    value = config[key]
    try:
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind is int and (isinstance(value, bool) or int(value) != value):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise CatalogError(f"config.json ({model_type}) {key!r} must be {kind.__name__}, received {value!r}",
                           reason="config_invalid") from None


def _opt(config: Mapping[str, Any], key: str, default: Any, model_type: str, kind: type = int) -> Any:
    if key not in config or config[key] is None:
        return default
    return _need(config, key, model_type, kind)


def shape_from_config(model_id: str, config: Mapping[str, Any]) -> ModelShape:
    """Shape of a model from its Hugging Face ``config.json`` (a dict).

    Supports model_type qwen3_moe, qwen2_moe (softmax family), deepseek_v3, kimi_k2, glm4_moe
    (sigmoid + bias family) and gpt_oss (softmax over the top-k of biased logits, fused experts with
    biases and a clamped SwiGLU); a multimodal wrapper with a ``text_config`` (Kimi K2.5)
    is read through it. CatalogError names a missing key or an unsupported model_type.
    """
    if not isinstance(config, Mapping):
        raise CatalogError("config.json must be a JSON object", reason="config_invalid")
    text = config.get("text_config")
    if isinstance(text, Mapping) and "model_type" in text and config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        config = text
    model_type = config.get("model_type")
    src = f"config.json of the checkpoint ({model_type})"
    if model_type in QWEN_TYPES:
        n_layers = _need(config, "num_hidden_layers", model_type)
        step = _opt(config, "decoder_sparse_step", 1, model_type)
        mlp_only = config.get("mlp_only_layers") or []
        if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only) or step < 1:
            raise CatalogError(f"config.json ({model_type}) has an invalid decoder_sparse_step/mlp_only_layers",
                               reason="config_invalid")
        shared = 0
        layout = "qwen_moe"
        if model_type == "qwen2_moe" and _opt(config, "shared_expert_intermediate_size", 0, model_type) > 0:
            shared, layout = 1, "qwen2_moe"
        shape = ModelShape(
            model_id=model_id, family=model_type,
            n_routed_experts=_need(config, "num_experts", model_type),
            n_active=_need(config, "num_experts_per_tok", model_type),
            n_shared_experts=shared, n_layers=n_layers,
            moe_layers=_layers_qwen(n_layers, step, mlp_only),
            moe_layer_rule=f"decoder_sparse_step={step}, mlp_only_layers={mlp_only}",
            d_model=_need(config, "hidden_size", model_type),
            expert_d_ff=_need(config, "moe_intermediate_size", model_type),
            router="softmax",
            # transformers Qwen3MoeConfig / Qwen2MoeConfig default norm_topk_prob to False
            norm_topk_prob=_opt(config, "norm_topk_prob", False, model_type, bool),
            routed_scaling_factor=1.0, n_group=1, topk_group=1, checkpoint_layout=layout,
            default_source=None, sources={},
        )
    elif model_type in DEEPSEEK_TYPES:
        scoring = config.get("scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise CatalogError(f"config.json ({model_type}) scoring_func {scoring!r} is not supported "
                               "(the DeepSeek family routes by sigmoid)", reason="config_unsupported")
        n_layers = _need(config, "num_hidden_layers", model_type)
        first_k = _need(config, "first_k_dense_replace", model_type)
        freq = _opt(config, "moe_layer_freq", 1, model_type)
        if freq < 1 or first_k < 0:
            raise CatalogError(f"config.json ({model_type}) has an invalid first_k_dense_replace/moe_layer_freq",
                               reason="config_invalid")
        shape = ModelShape(
            model_id=model_id, family=model_type,
            n_routed_experts=_need(config, "n_routed_experts", model_type),
            n_active=_need(config, "num_experts_per_tok", model_type),
            n_shared_experts=_need(config, "n_shared_experts", model_type),
            n_layers=n_layers, moe_layers=_layers_deepseek(n_layers, first_k, freq),
            moe_layer_rule=f"first_k_dense_replace={first_k}, moe_layer_freq={freq}",
            d_model=_need(config, "hidden_size", model_type),
            expert_d_ff=_need(config, "moe_intermediate_size", model_type),
            router="sigmoid",
            norm_topk_prob=_need(config, "norm_topk_prob", model_type, bool),
            routed_scaling_factor=_need(config, "routed_scaling_factor", model_type, float),
            n_group=_need(config, "n_group", model_type), topk_group=_need(config, "topk_group", model_type),
            checkpoint_layout="deepseek", default_source=None, sources={},
        )
    elif model_type in GPT_OSS_TYPES:
        n_layers = _need(config, "num_hidden_layers", model_type)
        # experts_per_token is the original release's spelling, num_experts_per_tok transformers'
        active = config.get("num_experts_per_tok", config.get("experts_per_token"))
        shape = ModelShape(
            model_id=model_id, family=model_type,
            n_routed_experts=_need(config, "num_local_experts", model_type),
            n_active=_need({"num_experts_per_tok": active}, "num_experts_per_tok", model_type),
            n_shared_experts=0, n_layers=n_layers, moe_layers=tuple(range(n_layers)), moe_layer_rule="every layer",
            d_model=_need(config, "hidden_size", model_type),
            expert_d_ff=_need(config, "intermediate_size", model_type),
            # GptOssTopKRouter: top-k of the biased logits, softmax over the k: the softmax router with the
            # gate payload's logit_bias and norm_topk_prob (docs/formats.md, "Gate payload")
            router="softmax", norm_topk_prob=True, routed_scaling_factor=1.0, n_group=1, topk_group=1,
            checkpoint_layout="gpt_oss", default_source=None, sources={},
        )
    else:
        raise CatalogError(
            f"unsupported model_type {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})",
            reason="config_unsupported",
        )
    sources = {f: src for f in shape.__dataclass_fields__ if f not in ("model_id", "sources", "default_source")}
    if model_type in GPT_OSS_TYPES:
        sources |= dict.fromkeys(("router", "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group"),
                                 "transformers GptOssTopKRouter: softmax over the top-k of logits = h·Wᵀ + b "
                                 "(the softmax router with norm_topk_prob and a logit_bias)")
    return ModelShape(**{**shape.__dict__, "sources": sources})


__all__ = ["CATALOG", "SUPPORTED_MODEL_TYPES", "CatalogError", "ModelShape", "catalog_shape", "shape_from_config",
           "shape_to_dict"]
