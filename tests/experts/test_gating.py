"""Both router families against numpy translations of the transformers reference blocks."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from apps.experts.errors import InvalidPayload, NonFiniteInput, ShapeMismatch
from apps.experts.gate_payload import encode_gate_payload, read_gate_payload
from apps.experts.gating import route
from tests.experts.factories import (
    MODEL,
    deepseek_gate,
    deepseek_v3_router_reference,
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
