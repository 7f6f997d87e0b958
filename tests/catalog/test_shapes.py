"""Catalog shapes: cited, complete where cited, and read from config.json for unlisted models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.catalog.shapes import CATALOG, CatalogError, ModelShape, catalog_shape, shape_from_config, shape_to_dict

# docs/specification.md, "Model catalog": (id, routed, active, shared) as it states them; None where it gives no count
SEED = [
    ("qwen3-30b-a3b", 128, 8, None), ("qwen3.5-35b-a3b", 128, 8, None), ("qwen3.5-122b-a10b", 128, 8, None),
    ("qwen3.5-397b-a17b", 128, 8, None), ("qwen3.6-35b-a3b", 128, 8, None), ("gemma-4-26b-a4b", 128, 4, 1),
    ("diffusiongemma-26b-a4b", None, None, None), ("kimi-k2-instruct", 384, 8, 1), ("kimi-k2.5", 384, 8, 1),
    ("kimi-k2.6", 384, 8, 1), ("kimi-k2.7-code", 384, 8, 1), ("kimi-k3", 896, 16, 2), ("minimax-m1", 32, 2, None),
    ("minimax-m3", 32, 2, None), ("deepseek-v3-0324", 256, 8, 1), ("deepseek-v4-pro", None, None, None),
    ("deepseek-v4-flash", None, None, None), ("glm-5", None, None, None), ("glm-5.1", None, None, None),
    ("glm-5.2", None, None, None), ("qwen3-coder-30b-a3b", 128, 8, None), ("nemotron-nano-30b-a3b", 16, 4, None),
    ("gpt-oss-120b", 128, 4, None),
]

# The published config.json of Qwen/Qwen3-30B-A3B (the MoE keys), as cited in the catalog.
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                 "hidden_size": 2048, "moe_intermediate_size": 768, "norm_topk_prob": True,
                 "decoder_sparse_step": 1, "mlp_only_layers": []}

DSV3 = {"model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
        "num_hidden_layers": 61, "first_k_dense_replace": 3, "hidden_size": 7168, "moe_intermediate_size": 2048,
        "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
        "scoring_func": "sigmoid"}


@pytest.mark.parametrize(("model_id", "routed", "active", "shared"), SEED)
def test_every_seed_model_is_listed_with_the_seed_counts(model_id, routed, active, shared):
    shape = catalog_shape(model_id)
    assert (shape.n_routed_experts, shape.n_active) == (routed, active)
    if shared is not None:
        assert shape.n_shared_experts == shared


@pytest.mark.parametrize("shape", list(CATALOG.values()), ids=list(CATALOG))
def test_every_field_has_a_source(shape: ModelShape):
    cited = {"family", "n_routed_experts", "n_active", "n_shared_experts", "n_layers", "moe_layers", "d_model",
             "expert_d_ff", "router", "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group",
             "checkpoint_layout", "default_source"}
    for f in cited - {"family"}:
        assert shape.sources.get(f), f"{shape.model_id}.{f} has no source"
    for f in cited:
        if getattr(shape, f) is None and f != "family":
            assert "not" in shape.sources[f] or "no " in shape.sources[f], (shape.model_id, f, shape.sources[f])
    if shape.moe_layers is not None and shape.n_layers is not None:
        assert all(0 <= i < shape.n_layers for i in shape.moe_layers)
    json.dumps(shape_to_dict(shape))


def test_catalog_qwen3_matches_its_config():
    cat, cfg = catalog_shape("Qwen3-30B-A3B"), shape_from_config("qwen3-30b-a3b", QWEN3_30B_A3B)
    for f in ("family", "n_routed_experts", "n_active", "n_shared_experts", "n_layers", "moe_layers", "d_model",
              "expert_d_ff", "router", "norm_topk_prob", "checkpoint_layout"):
        assert getattr(cat, f) == getattr(cfg, f), f
    dsv3 = shape_from_config("deepseek-v3-0324", DSV3)
    for f in ("n_routed_experts", "n_active", "n_shared_experts", "moe_layers", "d_model", "expert_d_ff", "router",
              "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob"):
        assert getattr(catalog_shape("deepseek-v3-0324"), f) == getattr(dsv3, f), f
    assert dsv3.moe_layers[0] == 3 and len(dsv3.moe_layers) == 58


def test_unknown_model_lists_known_ids():
    with pytest.raises(CatalogError) as err:
        catalog_shape("llama-9000")
    assert err.value.reason == "unknown_model" and "qwen3-30b-a3b" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_shape_from_config_families():
    kimi = shape_from_config("k", {"model_type": "kimi_k25", "text_config": {**DSV3, "model_type": "kimi_k2",
                                                                              "n_routed_experts": 384, "n_group": 1,
                                                                              "topk_group": 1,
                                                                              "first_k_dense_replace": 1}})
    assert (kimi.family, kimi.n_routed_experts, kimi.router, kimi.moe_layers[0]) == ("kimi_k2", 384, "sigmoid", 1)
    q2 = shape_from_config("q2", {"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
                                  "num_hidden_layers": 24, "hidden_size": 2048, "moe_intermediate_size": 1408,
                                  "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 2})
    assert (q2.n_shared_experts, q2.checkpoint_layout, q2.norm_topk_prob) == (1, "qwen2_moe", False)
    assert q2.moe_layers == tuple(range(1, 24, 2))
    assert all(v.startswith("config.json") for v in q2.sources.values())


@pytest.mark.parametrize(("config", "needle", "reason"), [
    ({**QWEN3_30B_A3B, "num_experts": None}, "'num_experts'", "config_missing_key"),
    ({k: v for k, v in DSV3.items() if k != "n_group"}, "'n_group'", "config_missing_key"),
    ({**DSV3, "hidden_size": "big"}, "'hidden_size'", "config_invalid"),
    ({**DSV3, "scoring_func": "softmax"}, "scoring_func", "config_unsupported"),
    ({"model_type": "llama"}, "'llama'", "config_unsupported"),
    ({}, "None", "config_unsupported"),
])
def test_shape_from_config_refusals(config, needle, reason):
    with pytest.raises(CatalogError) as err:
        shape_from_config("m", config)
    assert needle in str(err.value) and err.value.reason == reason


def test_the_published_glm_4_5_config_gives_its_counts():
    """zai-org/GLM-4.5's config.json (tests/fixtures/configs): 92 layers, the first 3 dense, 160 routed
    experts and 1 shared per MoE layer, top-8 by sigmoid scores scaled by 2.5; its whole-model spec is
    GQA 96/8 heads of 128 with q/k/v biases, q/k norm and RoPE on half of each head."""
    from apps.generation.spec import spec_from_config
    config = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "zai-org_GLM-4.5.json")
                        .read_text())
    shape = shape_from_config("glm-4.5", config)
    assert (shape.family, shape.n_routed_experts, shape.n_active, shape.n_shared_experts) == ("glm4_moe", 160, 8, 1)
    assert shape.moe_layers == tuple(range(3, 92)) and shape.n_experts_total == 161
    assert (shape.d_model, shape.expert_d_ff, shape.router, shape.routed_scaling_factor) == (5120, 1536, "sigmoid", 2.5)
    assert (shape.n_group, shape.topk_group, shape.norm_topk_prob, shape.checkpoint_layout) == (1, 1, True, "deepseek")
    spec = spec_from_config(config, model_id="glm-4.5")
    assert (spec.attention, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.rope.dim) == ("gqa", 96, 8, 128, 64)
    assert spec.attention_bias and spec.qk_norm and spec.dense_d_ff == 12288 and spec.vocab_size == 151552


def test_the_published_gpt_oss_120b_config_gives_its_counts():
    """openai/gpt-oss-120b's config.json: 36 layers, all MoE, 128 experts and no shared one, top-4, experts
    as wide as the model (2880); the router is the softmax one over the top-k of biased logits
    (norm_topk_prob, the gate payload's logit_bias)."""
    from apps.generation.spec import spec_from_config
    config = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "openai_gpt-oss-120b.json")
                        .read_text())
    shape = shape_from_config("gpt-oss-120b", config)
    assert (shape.family, shape.n_routed_experts, shape.n_active, shape.n_shared_experts) == ("gpt_oss", 128, 4, 0)
    assert shape.moe_layers == tuple(range(36)) and shape.n_experts_total == 128 and shape.n_layers == 36
    assert (shape.d_model, shape.expert_d_ff, shape.checkpoint_layout) == (2880, 2880, "gpt_oss")
    assert (shape.router, shape.norm_topk_prob, shape.routed_scaling_factor) == ("softmax", True, 1.0)
    assert "h·Wᵀ + b" in shape.sources["router"]
    built_in = catalog_shape("gpt-oss-120b")  # the catalog's own entry agrees with the published config
    for f in ("n_routed_experts", "n_active", "n_shared_experts", "n_layers", "moe_layers", "d_model", "expert_d_ff",
              "router", "norm_topk_prob"):
        assert getattr(built_in, f) == getattr(shape, f), f
    spec = spec_from_config(config, model_id="gpt-oss-120b")  # whole-model generation reads it as the catalog does
    assert (spec.family, spec.moe_layers, spec.d_model) == ("gpt_oss", shape.moe_layers, shape.d_model)
