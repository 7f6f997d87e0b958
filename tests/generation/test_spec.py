"""TransformerSpec from config.json: both hub spellings of RoPE, the DeepSeek family's aliases and
softmax scale, gpt-oss's layer types, sinks and YaRN without truncation, and refusals that name the key."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from apps.catalog.shapes import CatalogError
from apps.generation.rope import RopeTables, inv_freq
from apps.generation.spec import spec_from_config
from tests.generation.conftest import FIXTURES


def config(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


def test_qwen3_moe_fixture():
    spec = spec_from_config(config("qwen3_moe"), model_id="q")
    assert (spec.family, spec.attention, spec.n_heads, spec.n_kv_heads, spec.head_dim) == ("qwen3_moe", "gqa", 4, 2, 16)
    assert spec.qk_norm and spec.moe_layers == (0, 1, 2) and spec.rope.kind == "default" and not spec.rope.interleave
    assert spec.attn_scale == 16 ** -0.5 and spec.is_moe(2)
    with pytest.raises(ValueError, match=r"layer 3 outside 0\.\.2"):
        spec.is_moe(3)


def test_deepseek_v3_fixture_mla_and_yarn_scale():
    spec = spec_from_config(config("deepseek_v3"), model_id="d")
    assert (spec.attention, spec.q_lora_rank, spec.kv_lora_rank, spec.head_dim, spec.v_head_dim) == \
        ("mla", 48, 32, 24, 16)
    assert spec.moe_layers == (1, 2) and not spec.is_moe(0) and spec.dense_d_ff == 96
    assert spec.rope.kind == "yarn" and spec.rope.interleave and spec.rope.dim == 8
    # transformers yarn_apply_mscale: qk_head_dim^-0.5 · (0.1 · mscale_all_dim · ln factor + 1)²
    assert spec.attn_scale == pytest.approx(24 ** -0.5 * (0.1 * 0.8 * math.log(4.0) + 1) ** 2, rel=1e-12)
    freqs, attention_factor = inv_freq(spec.rope)
    # mscale 1.0 over mscale_all_dim 0.8: cos/sin are scaled by the ratio of the two mscales
    assert attention_factor == pytest.approx((0.1 * math.log(4) + 1) / (0.08 * math.log(4) + 1))
    plain = 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)
    # YaRN keeps the fastest dims (extrapolation) and divides the slowest by factor (interpolation)
    assert freqs[0] == pytest.approx(plain[0]) and freqs[-1] == pytest.approx(plain[-1] / 4.0)


def test_glm4_moe_fixture_biased_gqa_with_partial_rope():
    spec = spec_from_config(config("glm4_moe"), model_id="g")
    assert (spec.family, spec.attention, spec.n_heads, spec.n_kv_heads, spec.head_dim) == ("glm4_moe", "gqa", 4, 2, 16)
    assert spec.attention_bias and not spec.qk_norm and spec.moe_layers == (1, 2) and spec.dense_d_ff == 96
    assert spec.rope.dim == 8 and not spec.rope.interleave and spec.attn_scale == 16 ** -0.5
    tables = RopeTables(spec.rope)
    x = np.random.default_rng(1).standard_normal((3, 2, 16)).astype(np.float32)
    cos, sin = tables.cos_sin(np.arange(4, 7))
    turned = tables.apply(x, cos, sin)
    np.testing.assert_array_equal(turned[..., 8:], x[..., 8:])  # the second half of each head passes through
    assert not np.allclose(turned[..., :8], x[..., :8])
    with pytest.raises(CatalogError, match=r"partial_rotary_factor 0\.1 leaves 1 rotary dims"):
        spec_from_config(dict(config("glm4_moe"), partial_rotary_factor=0.1), model_id="g")
    with pytest.raises(CatalogError, match=r"partial_rotary_factor 0\.5 is not supported"):  # only GLM turns part
        spec_from_config(dict(config("qwen3_moe"), partial_rotary_factor=0.5), model_id="q")


def test_kimi_and_5x_spellings_read_the_same():
    hub = config("deepseek_v3")
    ref = spec_from_config(hub, model_id="d")
    kimi = spec_from_config(dict(hub, model_type="kimi_k2"), model_id="d")
    assert kimi.family == "deepseek_v3" and kimi.attn_scale == ref.attn_scale and kimi.rope == ref.rope
    five = {k: v for k, v in hub.items() if k not in ("rope_scaling", "rope_theta")}
    five["rope_parameters"] = {**{k: v for k, v in hub["rope_scaling"].items() if k != "type"},
                               "rope_type": "yarn", "rope_theta": hub["rope_theta"]}
    assert spec_from_config(five, model_id="d") == ref
    wrapped = {"model_type": "kimi_k25", "text_config": dict(hub, model_type="kimi_k2")}
    assert spec_from_config(wrapped, model_id="d").rope == ref.rope


def test_rotate_half_and_interleaved_pairs_turn_the_same_pairs():
    spec = spec_from_config(config("deepseek_v3"), model_id="d")
    tables = RopeTables(spec.rope)
    x = np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float32)
    cos, sin = tables.cos_sin(np.arange(5, 8))
    inter = tables.apply(x, cos, sin)
    # de-interleave the input first and rotate-half it: the same numbers
    half = RopeTables(type(spec.rope)(**{**spec.rope.__dict__, "interleave": False}))
    flat = half.apply(np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1), cos, sin)
    np.testing.assert_array_equal(inter, flat)


@pytest.mark.parametrize(("change", "reason", "match"), [
    ({"model_type": "llama"}, "unknown_model", "unsupported model_type 'llama'"),
    ({"model_type": "gpt_oss"}, "shape_incomplete", "no 'num_local_experts'"),  # read as gpt_oss: not one
    ({"qk_rope_head_dim": None}, "shape_incomplete", "no 'qk_rope_head_dim'"),
    ({"kv_lora_rank": 0}, "shape_incomplete", "'kv_lora_rank' must be a positive integer"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "shape_incomplete", "rope type 'dynamic'"),
    ({"rope_theta": None}, "shape_incomplete", "no 'rope_theta'"),
    ({"attention_bias": True}, "shape_incomplete", "attention_bias"),
    ({"hidden_act": "gelu"}, "shape_incomplete", "hidden_act 'gelu'"),
    ({"n_group": None}, "shape_incomplete", "n_group"),
])
def test_bad_configs_name_the_key(change, reason, match):
    with pytest.raises(CatalogError, match=match) as err:
        spec_from_config(dict(config("deepseek_v3"), **change), model_id="d")
    assert err.value.reason == reason


def test_qwen_refusals():
    with pytest.raises(CatalogError, match="not a multiple of num_key_value_heads 3"):
        spec_from_config(dict(config("qwen3_moe"), num_key_value_heads=3), model_id="q")
    with pytest.raises(CatalogError, match="use_sliding_window"):
        spec_from_config(dict(config("qwen3_moe"), use_sliding_window=True), model_id="q")
    with pytest.raises(CatalogError, match="JSON object"):
        spec_from_config([], model_id="q")


PUBLISHED_GPT_OSS = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "openai_gpt-oss-120b.json"
# transformers 5.24 _compute_yarn_parameters of that config (GptOssRotaryEmbedding.inv_freq), entries 0, 8..17
# (the ramp: the correction range is 8.09 .. 17.40, not rounded as truncate is false) and 31
GPT_OSS_120B_INV_FREQ = {0: 1.0, 8: 0.05081327259540558, 9: 0.031705696135759354, 10: 0.019334999844431877,
                         11: 0.011592049151659012, 12: 0.006794959306716919, 13: 0.0038603590801358223,
                         14: 0.002093792660161853, 15: 0.00105260219424963, 16: 0.0004564839182421565,
                         17: 0.00012931869423482567, 31: 3.023511396804679e-07}


def test_the_published_gpt_oss_120b_config():
    spec = spec_from_config(json.loads(PUBLISHED_GPT_OSS.read_text()), model_id="gpt-oss-120b")
    assert (spec.family, spec.attention, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim) == \
        ("gpt_oss", "gqa", 36, 64, 8, 64)
    assert spec.moe_layers == tuple(range(36)) and spec.dense_d_ff is None and spec.rms_norm_eps == 1e-5
    assert spec.attention_bias and spec.o_proj_bias and spec.attention_sinks and not spec.qk_norm
    assert spec.sliding_layers == tuple(range(0, 36, 2)) and spec.sliding_window == 128
    assert [spec.window(i) for i in range(4)] == [128, None, 128, None]
    assert spec.attn_scale == 64 ** -0.5 and not spec.rope.interleave and spec.rope.dim == 64
    assert (spec.rope.kind, spec.rope.factor, spec.rope.original_max_position_embeddings, spec.rope.theta,
            spec.rope.truncate) == ("yarn", 32.0, 4096, 150000.0, False)
    freqs, attention_factor = inv_freq(spec.rope)
    assert attention_factor == pytest.approx(0.1 * math.log(32) + 1, rel=1e-12)  # no mscale keys: get_mscale(32)
    for i, want in GPT_OSS_120B_INV_FREQ.items():
        assert freqs[i] == pytest.approx(want, rel=2e-7), i
    rounded, _ = inv_freq(dataclasses.replace(spec.rope, truncate=True))  # what truncate true would give instead
    assert not np.allclose(rounded[8:18], freqs[8:18], rtol=1e-3)


def test_gpt_oss_fixture_and_its_defaults():
    hub = config("gpt_oss")
    spec = spec_from_config(hub, model_id="g")
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.sliding_window, spec.sliding_layers) == \
        (4, 2, 16, 4, (0, 2))
    assert spec_from_config(config("gpt_oss_mxfp4"), model_id="g") == spec  # quantization_config: experts only
    # keys left out take GptOssConfig's defaults: alternating layers, window 128, head_dim 64, the published YaRN
    bare = {k: v for k, v in hub.items() if k not in ("layer_types", "sliding_window", "head_dim", "rope_scaling",
                                                      "rope_theta", "attention_bias", "num_key_value_heads")}
    d = spec_from_config(dict(bare, num_attention_heads=8), model_id="g")
    assert (d.sliding_layers, d.sliding_window, d.head_dim, d.n_kv_heads) == ((0, 2), 128, 64, 8)
    assert d.attention_bias and d.o_proj_bias
    assert (d.rope.factor, d.rope.original_max_position_embeddings, d.rope.theta, d.rope.truncate) == \
        (32.0, 4096, 150000.0, False)
    full = spec_from_config(dict(hub, layer_types=["full_attention"] * 3), model_id="g")
    assert full.sliding_layers == () and full.sliding_window is None and full.window(0) is None
    plain = spec_from_config(dict(hub, attention_bias=False), model_id="g")
    assert not plain.attention_bias and not plain.o_proj_bias


@pytest.mark.parametrize(("change", "match"), [
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types must list 3 of"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types must list 3 of"),
    ({"sliding_window": None}, "sliding_attention layers but no 'sliding_window'"),
    ({"sliding_window": 0}, "'sliding_window' must be a positive integer"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
])
def test_gpt_oss_refusals(change, match):
    with pytest.raises(CatalogError, match=match) as err:
        spec_from_config(dict(config("gpt_oss"), **change), model_id="g")
    assert err.value.reason == "shape_incomplete"
