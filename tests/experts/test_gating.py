"""Both router families against numpy translations of the transformers reference blocks."""

from __future__ import annotations

import itertools
import json
import struct

import numpy as np
import pytest

from core.experts.errors import NonFiniteInput, ShapeMismatch
from core.experts.gating import route
from core.formats.errors import InvalidPayload
from core.formats.expert_payload import serialize_safetensors
from core.formats.gate_payload import (
    dense_slice_bounds,
    encode_dense_gate_payload,
    encode_gate_payload,
    max_dense_slices,
    read_gate_payload,
)
from tests.experts.factories import (
    MODEL,
    deepseek_gate,
    deepseek_v3_router_reference,
    dense_gate,
    qwen3_router_reference,
    qwen_gate,
)

RTOL = 1e-5


def _assert_same_routing(experts, weights, ref_idx, ref_w):
    """Same expert set per token, and the weight of each selected expert within RTOL."""
    k = ref_idx.shape[1]
    for t in range(experts.shape[0]):
        ours = dict(zip(experts[t, :k].tolist(), weights[t, :k].tolist(), strict=True))
        theirs = dict(zip(ref_idx[t].tolist(), ref_w[t].tolist(), strict=True))
        assert ours.keys() == theirs.keys(), f"token {t}: experts {sorted(ours)} != reference {sorted(theirs)}"
        for e, w in theirs.items():
            assert ours[e] == pytest.approx(w, rel=RTOL), f"token {t} expert {e}"


@pytest.mark.parametrize("norm", [True, False])
def test_softmax_router_matches_qwen3_reference(norm):
    rng = np.random.default_rng(1)
    payload, weight = qwen_gate(rng, d_model=64, n_routed=16, top_k=4, norm=norm)
    gate = read_gate_payload(payload)
    hidden = rng.standard_normal((37, 64)).astype(np.float32)
    routing = route(gate, hidden)
    assert routing.experts.shape == (37, 4) and routing.experts.dtype == np.int64
    assert routing.weights.dtype == np.float32
    ref_idx, ref_w = qwen3_router_reference(hidden, weight, 4, norm)
    _assert_same_routing(routing.experts, routing.weights, ref_idx, ref_w)
    if norm:
        np.testing.assert_allclose(routing.weights.sum(1), 1.0, rtol=RTOL)


def test_a_softmax_router_with_a_logit_bias_routes_as_gpt_oss() -> None:
    """GptOssTopKRouter: logits = h·Wᵀ + b, the top-k of the logits, softmax over those k (numpy
    transcription); the payload round-trips the bias and a dense gate refuses one."""
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((16, 32)).astype(np.float32) / 4
    logit_bias = rng.standard_normal(16).astype(np.float32)  # large enough to change the choice
    gate = read_gate_payload(encode_gate_payload(model_id=MODEL, layer=0, weight=weight, router="softmax",
                                                 top_k=4, norm_topk_prob=True, logit_bias=logit_bias))
    np.testing.assert_array_equal(gate.logit_bias, logit_bias)
    hidden = rng.standard_normal((29, 32)).astype(np.float32)
    logits = hidden @ weight.T + logit_bias
    ref_idx = np.argsort(-logits, axis=1, kind="stable")[:, :4]
    top = np.take_along_axis(logits, ref_idx, axis=1)
    ref_w = np.exp(top - top.max(axis=1, keepdims=True))
    ref_w /= ref_w.sum(axis=1, keepdims=True)
    routing = route(gate, hidden)
    _assert_same_routing(routing.experts, routing.weights, ref_idx, ref_w)
    unbiased = route(read_gate_payload(encode_gate_payload(model_id=MODEL, layer=0, weight=weight, router="softmax",
                                                           top_k=4, norm_topk_prob=True)), hidden)
    assert not np.array_equal(unbiased.experts, routing.experts)  # the bias is not ignored


@pytest.mark.parametrize(("n_group", "topk_group", "norm"), [(4, 2, True), (8, 3, False), (1, 1, True)])
def test_sigmoid_router_matches_deepseek_v3_reference(n_group, topk_group, norm):
    rng = np.random.default_rng(2)
    payload, weight, bias = deepseek_gate(rng, d_model=64, n_routed=32, top_k=6, n_group=n_group,
                                          topk_group=topk_group, n_shared=2, norm=norm)
    gate = read_gate_payload(payload)
    hidden = rng.standard_normal((41, 64)).astype(np.float32)
    routing = route(gate, hidden)
    assert routing.experts.shape == (41, 8)  # 6 routed + 2 shared slots
    ref_idx, ref_w = deepseek_v3_router_reference(hidden, weight, bias, top_k=6, n_group=n_group,
                                                  topk_group=topk_group, norm_topk_prob=norm,
                                                  routed_scaling_factor=2.5)
    _assert_same_routing(routing.experts, routing.weights, ref_idx, ref_w)
    # shared experts ride along as ids n_routed.. with weight 1.0
    np.testing.assert_array_equal(routing.experts[:, 6:], np.broadcast_to([32, 33], (41, 2)))
    np.testing.assert_array_equal(routing.weights[:, 6:], 1.0)


def test_masked_groups_never_selected_even_with_negative_biases():
    """transformers 4.x filled masked experts with 0.0: with all biased scores negative a
    masked expert (0.0) beats every kept one. We fill -inf, like DeepSeek's inference code."""
    rng = np.random.default_rng(3)
    payload, weight, bias = deepseek_gate(rng, d_model=32, n_routed=16, top_k=4, n_group=4, topk_group=1,
                                          n_shared=0, bias_shift=-5.0)
    gate = read_gate_payload(payload)
    hidden = rng.standard_normal((25, 32)).astype(np.float32)
    routing = route(gate, hidden)
    groups = routing.experts // 4
    assert (groups == groups[:, :1]).all(), "experts from a group that was not kept were selected"
    ref_idx, ref_w = deepseek_v3_router_reference(hidden, weight, bias, top_k=4, n_group=4, topk_group=1,
                                                  norm_topk_prob=True, routed_scaling_factor=2.5)
    _assert_same_routing(routing.experts, routing.weights, ref_idx, ref_w)
    old_idx, _ = deepseek_v3_router_reference(hidden, weight, bias, top_k=4, n_group=4, topk_group=1,
                                              norm_topk_prob=True, routed_scaling_factor=2.5, masked_fill=0.0)
    kept_group = routing.experts[:, :1] // 4
    assert ((old_idx // 4) != kept_group).any(), "the 4.x fill should pick masked experts here"


def test_ties_break_to_lower_expert_id():
    weight = np.zeros((8, 4), dtype=np.float32)  # every logit 0: all experts tie
    gate = read_gate_payload(encode_gate_payload(model_id=MODEL, layer=0, weight=weight, router="softmax", top_k=3))
    routing = route(gate, np.ones((2, 4), dtype=np.float32))
    np.testing.assert_array_equal(routing.experts, [[0, 1, 2], [0, 1, 2]])


def test_tokens_by_expert_groups_each_slot():
    rng = np.random.default_rng(4)
    payload, _ = qwen_gate(rng, d_model=16, n_routed=8, top_k=2, norm=True)
    routing = route(read_gate_payload(payload), rng.standard_normal((10, 16)).astype(np.float32))
    groups = routing.tokens_by_expert()
    assert sum(len(t) for t, _ in groups.values()) == 20
    for e, (tokens, weights) in groups.items():
        for t, w in zip(tokens, weights, strict=True):
            slot = list(routing.experts[t]).index(e)
            assert routing.weights[t, slot] == w


def test_route_rejects_bad_hidden():
    rng = np.random.default_rng(5)
    gate = read_gate_payload(qwen_gate(rng, d_model=16, n_routed=8, top_k=2, norm=True)[0])
    with pytest.raises(ShapeMismatch, match="d_model 15, expected 16"):
        route(gate, np.zeros((3, 15), dtype=np.float32))
    with pytest.raises(ShapeMismatch):
        route(gate, np.zeros(16, dtype=np.float32))
    bad = np.zeros((4, 16), dtype=np.float32)
    bad[2, 3] = np.nan
    bad[3, 0] = np.inf
    with pytest.raises(NonFiniteInput, match="rows 2, 3"):
        route(gate, bad)


def test_gate_payload_round_trip_and_bf16():
    rng = np.random.default_rng(6)
    payload, weight, bias = deepseek_gate(rng, d_model=16, n_routed=8, top_k=2, n_group=2, topk_group=1, n_shared=1)
    spec = read_gate_payload(payload)
    assert (spec.router, spec.top_k, spec.n_group, spec.topk_group, spec.n_shared_experts) == ("sigmoid", 2, 2, 1, 1)
    assert spec.norm_topk_prob and spec.routed_scaling_factor == 2.5
    np.testing.assert_array_equal(spec.weight, weight)
    np.testing.assert_array_equal(spec.bias, bias)
    # a BF16 gate weight (as in hub checkpoints) widens exactly
    bits = (weight.view(np.uint32) >> 16).astype(np.uint16)
    header = {"__metadata__": {"model_id": MODEL, "layer": "0", "router": "softmax", "top_k": "2"},
              "weight": {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [0, bits.nbytes]}}
    text = json.dumps(header).encode()
    raw = struct.pack("<Q", len(text)) + text + bits.tobytes()
    np.testing.assert_array_equal(read_gate_payload(raw).weight, (bits.astype(np.uint32) << 16).view(np.float32))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"router": "relu"}, "router must be one of"),
        ({"top_k": 9}, "top_k 9 exceeds"),
        ({"n_group": 3}, "does not divide"),
        ({"n_group": 2, "topk_group": 1, "top_k": 5, "router": "sigmoid"}, "top_k 5 exceeds the 4 selectable"),
        ({"e_score_correction_bias": np.zeros(8, np.float32)}, "only applies to the sigmoid"),
        ({"router": "sigmoid", "e_score_correction_bias": np.zeros(7, np.float32)}, r"shape \(8,\)"),
        ({"logit_bias": np.zeros(7, np.float32)}, r"logit_bias must have shape \(8,\)"),
        ({"logit_bias": np.array([np.nan] + [0] * 7, np.float32)}, "NaN/inf"),
    ],
)
def test_invalid_gate_payloads(kwargs, match):
    args = {"model_id": MODEL, "layer": 0, "weight": np.ones((8, 4), np.float32), "router": "softmax", "top_k": 2}
    args.update(kwargs)
    with pytest.raises(InvalidPayload, match=match):
        encode_gate_payload(**args)


@pytest.mark.parametrize("blob", [b"", b"\x00" * 4, b"\xff" * 64, b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}"])
def test_corrupt_gate_payload(blob):
    with pytest.raises(InvalidPayload):
        read_gate_payload(blob)


# --- dense layers: a gate with no routed experts, every token to every d_ff slice ---------------


def test_dense_gate_routes_every_token_to_every_slice_with_weight_one():
    gate = read_gate_payload(dense_gate(d_model=16, d_ff=96, n_slices=3, layer=2))
    assert (gate.router, gate.n_routed, gate.top_k, gate.n_shared_experts, gate.k_total, gate.d_model) == \
        ("dense", 0, 0, 3, 3, 16)
    assert (gate.layer, gate.dense_d_ff, gate.slice_align, gate.bias) == (2, 96, 1, None)
    hidden = np.random.default_rng(7).standard_normal((5, 16)).astype(np.float32)
    routing = route(gate, hidden)
    assert routing.experts.dtype == np.int64 and routing.weights.dtype == np.float32
    np.testing.assert_array_equal(routing.experts, np.broadcast_to([0, 1, 2], (5, 3)))
    np.testing.assert_array_equal(routing.weights, 1.0)
    groups = routing.tokens_by_expert()
    assert sorted(groups) == [0, 1, 2]
    for tokens, weights in groups.values():
        np.testing.assert_array_equal(tokens, np.arange(5))
        np.testing.assert_array_equal(weights, 1.0)
    assert route(gate, np.zeros((0, 16), np.float32)).experts.shape == (0, 3)
    with pytest.raises(ShapeMismatch, match="d_model 8, expected 16"):
        route(gate, np.zeros((2, 8), np.float32))
    bad = hidden.copy()
    bad[1, 1] = np.nan
    with pytest.raises(NonFiniteInput):
        route(gate, bad)


@pytest.mark.parametrize(
    ("d_ff", "n", "align", "bounds"),
    [
        (96, 3, 1, [(0, 32), (32, 64), (64, 96)]),
        (10, 4, 1, [(0, 3), (3, 6), (6, 8), (8, 10)]),  # widths differ by at most one block
        (136, 3, 32, [(0, 64), (64, 128), (128, 136)]),  # the short last block goes to the last slice
        (9 * 256, 4, 256, [(0, 768), (768, 1280), (1280, 1792), (1792, 2304)]),
        (18432, 5, 256, [(0, 3840), (3840, 7680), (7680, 11264), (11264, 14848), (14848, 18432)]),
        (64, 1, 256, [(0, 64)]),
    ],
)
def test_dense_slice_bounds(d_ff, n, align, bounds):
    assert dense_slice_bounds(d_ff, n, align) == bounds
    widths = [b - a for a, b in bounds]
    assert bounds[0][0] == 0 and bounds[-1][1] == d_ff and all(w > 0 for w in widths)
    assert all(a == b for (_, a), (b, _) in itertools.pairwise(bounds))
    assert all(a % align == 0 for a, _ in bounds) and widths == sorted(widths, reverse=True)


def test_dense_slice_bounds_cover_every_count_up_to_the_limit():
    for d_ff in (1, 7, 136, 300, 512, 1000):
        for align in (1, 32, 256):
            limit = max_dense_slices(d_ff, align)
            for n in range(1, limit + 1):
                bounds = dense_slice_bounds(d_ff, n, align)
                assert len(bounds) == n and bounds[-1][1] == d_ff and all(b > a for a, b in bounds)
            with pytest.raises(ValueError, match=f"at most {limit} non-empty slices"):
                dense_slice_bounds(d_ff, limit + 1, align)
    with pytest.raises(ValueError, match="positive"):
        dense_slice_bounds(96, 0)


def _dense_meta(**changes):
    meta = {"model_id": MODEL, "layer": "0", "router": "dense", "top_k": "0", "n_shared_experts": "3", "d_ff": "96"}
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def _raw_gate(meta, rows=0, d_model=16, bias=None):
    entries = {"weight": ("F32", [rows, d_model], np.ones((rows, d_model), np.float32).tobytes())}
    if bias is not None:
        entries["e_score_correction_bias"] = ("F32", [len(bias)], np.asarray(bias, np.float32).tobytes())
    return serialize_safetensors(entries, meta)


def test_minimal_dense_gate_metadata_reads_with_defaults():
    spec = read_gate_payload(_raw_gate(_dense_meta()))
    assert (spec.router, spec.n_shared_experts, spec.dense_d_ff, spec.slice_align) == ("dense", 3, 96, 1)
    assert [spec.slice_bounds(s) for s in range(3)] == [(0, 32), (32, 64), (64, 96)]


@pytest.mark.parametrize(
    ("meta", "rows", "bias", "match"),
    [
        (_dense_meta(), 2, None, r"must be \[0, d_model\] \(a dense layer has no routed experts\)"),
        (_dense_meta(router="softmax", top_k="1"), 0, None, r"must be \[n_routed, d_model\]"),
        (_dense_meta(top_k="2"), 0, None, "'top_k' must be 0 for router 'dense'"),
        (_dense_meta(routed_scaling_factor="2.5"), 0, None, "'routed_scaling_factor' must be 1.0"),
        (_dense_meta(norm_topk_prob="true"), 0, None, "'norm_topk_prob' must be False"),
        (_dense_meta(n_group="2"), 0, None, "'n_group' must be 1"),
        (_dense_meta(n_shared_experts="0"), 0, None, "needs 1..1024 slices"),
        (_dense_meta(n_shared_experts="1025", d_ff="4096"), 0, None, "needs 1..1024 slices"),
        (_dense_meta(n_shared_experts=None), 0, None, "needs 1..1024 slices"),
        (_dense_meta(d_ff=None), 0, None, "'d_ff' is required"),
        (_dense_meta(d_ff="0"), 0, None, "'d_ff' must be >= 1"),
        (_dense_meta(d_ff="x"), 0, None, "'d_ff' must be an integer"),
        (_dense_meta(slice_align="0"), 0, None, "'slice_align' must be >= 1"),
        (_dense_meta(d_ff="64", slice_align="32"), 0, None, "at most 2 non-empty slices"),
        (_dense_meta(), 0, [], "no e_score_correction_bias"),
        ({"router": "softmax", "top_k": "1", "model_id": MODEL, "layer": "0", "d_ff": "8"}, 2, None,
         "'d_ff' only applies to router 'dense'"),
        ({"router": "softmax", "top_k": "0", "model_id": MODEL, "layer": "0"}, 2, None, "'top_k' must be >= 1"),
    ],
)
def test_invalid_dense_gate_payloads(meta, rows, bias, match):
    with pytest.raises(InvalidPayload, match=match):
        read_gate_payload(_raw_gate(meta, rows=rows, bias=bias))


def test_dense_gate_encoder_refuses_what_the_reader_would():
    with pytest.raises(InvalidPayload, match="at most 3 non-empty slices"):
        encode_dense_gate_payload(model_id=MODEL, layer=0, d_model=16, d_ff=3, n_slices=4)
    with pytest.raises(InvalidPayload, match=r"must be \[0, d_model\]"):
        encode_dense_gate_payload(model_id=MODEL, layer=0, d_model=0, d_ff=8, n_slices=2)
