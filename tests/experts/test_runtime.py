"""The facade: local layer forward against the reference MoE blocks, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from core.experts.errors import (
    ExpertNotLoaded,
    ExpertRuntimeError,
    GateNotLoaded,
    InvalidPayload,
    ModelMismatch,
    NonFiniteInput,
    ShapeMismatch,
)
from core.experts.runtime import ExpertRuntime
from core.formats.expert_payload import serialize_safetensors
from tests.experts.factories import (
    MODEL,
    deepseek_gate,
    deepseek_v3_router_reference,
    dense_gate,
    dense_slices,
    expert_payload,
    expert_weights,
    moe_block_reference,
    qwen3_router_reference,
    qwen_gate,
    swiglu_reference,
)

D_MODEL, D_FF = 64, 256


@pytest.fixture
def rt(tmp_path):
    return ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=64 << 20)


def _load_experts(rt, n, rng, quant=None):
    weights = {e: expert_weights(rng, D_MODEL, D_FF) for e in range(n)}
    for e, w in weights.items():
        rt.expert_load(payload=expert_payload(w, expert=e, quant=quant))
    return weights


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_forward_local_qwen_family(rt):
    rng = np.random.default_rng(40)
    weights = _load_experts(rt, 8, rng)
    gate_payload, gate_w = qwen_gate(rng, d_model=D_MODEL, n_routed=8, top_k=2, norm=True)
    rt.gate_load(payload=gate_payload)
    x = rng.standard_normal((19, D_MODEL)).astype(np.float32)
    y = rt.forward_local(model_id=MODEL, layer=0, hidden=x)
    idx, w = qwen3_router_reference(x, gate_w, 2, True)
    assert y.dtype == np.float32
    assert _rel(y, moe_block_reference(x, idx, w, weights, shared=[])) < 1e-5


def test_forward_local_deepseek_family_with_shared_expert(rt):
    rng = np.random.default_rng(41)
    weights = _load_experts(rt, 17, rng)  # 16 routed + 1 shared (id 16)
    gate_payload, gate_w, bias = deepseek_gate(rng, d_model=D_MODEL, n_routed=16, top_k=4, n_group=4,
                                               topk_group=2, n_shared=1)
    rt.gate_load(payload=gate_payload)
    x = rng.standard_normal((23, D_MODEL)).astype(np.float32)
    y = rt.forward_local(model_id=MODEL, layer=0, hidden=x)
    idx, w = deepseek_v3_router_reference(x, gate_w, bias, top_k=4, n_group=4, topk_group=2,
                                          norm_topk_prob=True, routed_scaling_factor=2.5)
    assert _rel(y, moe_block_reference(x, idx, w, weights, shared=[16])) < 1e-5


def test_forward_local_quantized_and_spilling(tmp_path):
    """q8_0 experts under a budget of 3 of 8: readahead/spill must not change the result."""
    rng = np.random.default_rng(42)
    small = ExpertRuntime(data_dir=tmp_path / "a", memory_budget_bytes=3 * 52_224)
    big = ExpertRuntime(data_dir=tmp_path / "b", memory_budget_bytes=64 << 20)
    gate_payload, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=8, top_k=2, norm=False)
    for rt in (small, big):
        _load_experts(rt, 8, np.random.default_rng(7), quant="q8_0")
        rt.gate_load(payload=gate_payload)
    assert small.status()["counts"]["cold"] > 0
    x = rng.standard_normal((11, D_MODEL)).astype(np.float32)
    assert np.array_equal(small.forward_local(model_id=MODEL, layer=0, hidden=x),
                          big.forward_local(model_id=MODEL, layer=0, hidden=x))
    assert small.status()["memory_used_bytes"] <= small.status()["memory_budget_bytes"]


def test_missing_expert_is_a_clear_error(rt):
    rng = np.random.default_rng(43)
    _load_experts(rt, 4, rng)  # the gate routes over 8
    rt.gate_load(payload=qwen_gate(rng, d_model=D_MODEL, n_routed=8, top_k=4, norm=True)[0])
    x = rng.standard_normal((16, D_MODEL)).astype(np.float32)
    with pytest.raises(ExpertNotLoaded, match=r"selected experts \[4, 5, 6, 7\]") as info:
        rt.forward_local(model_id=MODEL, layer=0, hidden=x)
    assert info.value.reason == "expert_not_loaded"


def test_errors_carry_reasons(rt):
    rng = np.random.default_rng(44)
    _load_experts(rt, 2, rng)
    x = rng.standard_normal((2, D_MODEL)).astype(np.float32)
    cases = [
        (lambda: rt.execute(model_id=MODEL, layer=0, expert=9, hidden=x), ExpertNotLoaded, "expert_not_loaded"),
        (lambda: rt.execute(model_id=MODEL, layer=0, expert=0, hidden=x[:, :32]), ShapeMismatch, "shape_mismatch"),
        (lambda: rt.execute(model_id=MODEL, layer=0, expert=0, hidden=x * np.inf), NonFiniteInput,
         "non_finite_input"),
        (lambda: rt.route(model_id=MODEL, layer=3, hidden=x), GateNotLoaded, "gate_not_loaded"),
        (lambda: rt.forward_local(model_id=MODEL, layer=3, hidden=x), GateNotLoaded, "gate_not_loaded"),
        (lambda: rt.expert_load(payload=b"\x00" * 32), InvalidPayload, "invalid_payload"),
        (lambda: rt.gate_load(payload=b"junk"), InvalidPayload, "invalid_payload"),
        (lambda: rt.gate_unload(model_id=MODEL, layer=5), GateNotLoaded, "gate_not_loaded"),
    ]
    for call, exc_type, reason in cases:
        with pytest.raises(exc_type) as info:
            call()
        assert isinstance(info.value, ExpertRuntimeError) and info.value.reason == reason


def test_gate_expert_model_mismatch(rt):
    rng = np.random.default_rng(45)
    _load_experts(rt, 2, rng)
    wide_gate, _ = qwen_gate(rng, d_model=2 * D_MODEL, n_routed=8, top_k=2, norm=True)
    with pytest.raises(ModelMismatch, match=f"gate has d_model {2 * D_MODEL}, expert 0 has d_model {D_MODEL}"):
        rt.gate_load(payload=wide_gate)
    rt.gate_load(payload=qwen_gate(rng, d_model=D_MODEL, n_routed=8, top_k=2, norm=True)[0])
    wide_expert = expert_payload(expert_weights(rng, 2 * D_MODEL, D_FF), expert=3)
    with pytest.raises(ModelMismatch, match="d_model"):
        rt.expert_load(payload=wide_expert)
    with pytest.raises(ModelMismatch, match=r"expert 8 is out of range .* 8 routed \+ 0 shared"):
        rt.expert_load(payload=expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=8))
    # a different layer of the same model is independent
    rt.expert_load(payload=expert_payload(expert_weights(rng, 2 * D_MODEL, D_FF), expert=3, layer=1))
    rt.gate_unload(model_id=MODEL, layer=0)
    with pytest.raises(ModelMismatch, match="expert 0 of that layer has 64"):
        rt.expert_load(payload=wide_expert)


def test_gates_survive_restart(tmp_path):
    rng = np.random.default_rng(46)
    rt = ExpertRuntime(data_dir=tmp_path)
    payload, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=8, top_k=2, norm=True)
    row = rt.gate_load(payload=payload, blob_uri="tenzro://blob/" + "cd" * 32)
    assert row["router"] == "softmax" and row["n_routed"] == 8
    x = rng.standard_normal((4, D_MODEL)).astype(np.float32)
    before = rt.route(model_id=MODEL, layer=0, hidden=x)
    again = ExpertRuntime(data_dir=tmp_path)
    assert again.status()["gates"][0]["blob_uri"] == "tenzro://blob/" + "cd" * 32
    after = again.route(model_id=MODEL, layer=0, hidden=x)
    assert np.array_equal(before.experts, after.experts) and np.array_equal(before.weights, after.weights)
    again.gate_unload(model_id=MODEL, layer=0)
    assert ExpertRuntime(data_dir=tmp_path).status()["gates"] == []


def test_a_gate_file_that_no_longer_matches_its_hash_is_forgotten_at_start(tmp_path, caplog):
    rng = np.random.default_rng(48)
    rt = ExpertRuntime(data_dir=tmp_path)
    payload, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=8, top_k=2, norm=True)
    rt.gate_load(payload=payload, blob_uri="tenzro://blob/" + "cd" * 32)
    (path,) = (tmp_path / "moe" / "gates").glob("*/layer0.safetensors")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one bit of a router weight: still a well-formed payload, a different gate
    path.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        again = ExpertRuntime(data_dir=tmp_path)
    assert again.status()["gates"] == [] and not path.exists() and not path.with_suffix(".json").exists()
    assert "does not match its hash" in caplog.text and "load-gate --blob tenzro://blob/" in caplog.text


def test_status_and_holdings_shape(rt):
    rng = np.random.default_rng(47)
    w = expert_weights(rng, D_MODEL, D_FF)
    row = rt.expert_load(payload=expert_payload(w, expert=0, quant="q8_0"), blob_uri="tenzro://blob/" + "ef" * 32)
    assert row["tier"] == "memory" and row["memory_bytes"] > 0 and row["blob_uri"].startswith("tenzro://blob/")
    rt.execute(model_id=MODEL, layer=0, expert=0, hidden=rng.standard_normal((120, D_MODEL)).astype(np.float32))
    status = rt.status()
    assert set(status) >= {"experts", "gates", "memory_budget_bytes", "memory_used_bytes", "counts",
                           "gpu_backend_active", "backend", "cpu_kernel"}
    assert status["gpu_backend_active"] is False and status["backend"] == "cpu"
    assert status["cpu_kernel"].startswith(("c-", "numba-", "numpy-"))
    (row,) = status["experts"]
    assert row["residency"] == "Warm" and row["tier"] == "memory" and status["capacity_tps"] > 0
    # demand: 120 rows served in the last minute are 2 rows per wall second, on the expert and node-wide
    assert row["committed_tps"] == status["committed_tps"] == 2 and status["demand"] == [[MODEL, 0, 0, 2]]


def test_blob_loaded_expert_and_gate_are_stored_once_on_disk(rt, tmp_path):
    """`stored_at` (the blob file) is linked into the disk tier: one inode, not two copies."""
    rng = np.random.default_rng(48)
    payload = expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=2)
    blob = tmp_path / "blob-e2"
    blob.write_bytes(payload)
    rt.expert_load(payload=payload, blob_uri="tenzro://blob/" + "a" * 64, stored_at=blob)
    tier_file = next((tmp_path / "moe" / "experts").rglob("expert2.safetensors"))
    assert tier_file.stat().st_ino == blob.stat().st_ino and blob.stat().st_nlink == 2
    gate_payload, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=4, top_k=2, norm=True)
    gate_blob = tmp_path / "blob-gate"
    gate_blob.write_bytes(gate_payload)
    rt.gate_load(payload=gate_payload, stored_at=gate_blob)
    assert gate_blob.stat().st_nlink == 2
    # unloading drops the tier's name only; the blob keeps its bytes
    rt.expert_unload(model_id=MODEL, layer=0, expert=2)
    assert blob.read_bytes() == payload and blob.stat().st_nlink == 1
    # a stale `stored_at` (other size) is never trusted: the payload is written instead
    blob.write_bytes(b"other")
    rt.expert_load(payload=payload, stored_at=blob)
    assert next((tmp_path / "moe" / "experts").rglob("expert2.safetensors")).read_bytes() == payload


def test_gate_payload_without_ids_loads_when_the_call_names_them(tmp_path):
    rng = np.random.default_rng(49)
    weight = rng.standard_normal((4, D_MODEL)).astype(np.float32)
    anonymous = serialize_safetensors({"weight": ("F32", [4, D_MODEL], weight.tobytes())},
                                      {"router": "softmax", "top_k": "2"})
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=64 << 20)
    with pytest.raises(InvalidPayload, match="model_id"):
        rt.gate_load(payload=anonymous)
    row = rt.gate_load(payload=anonymous, expect={"model_id": "m/anon", "layer": 3})
    assert (row["model_id"], row["layer"], row["top_k"]) == ("m/anon", 3, 2)
    # ids in the payload must agree with the call's
    named, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=4, top_k=2, norm=True)
    with pytest.raises(ModelMismatch, match="model_id"):
        rt.gate_load(payload=named, expect={"model_id": "m/other"})
    # a restart finds the anonymous gate again under the ids of its load
    again = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=64 << 20)
    assert [(g["model_id"], g["layer"]) for g in again.status()["gates"]] == [("m/anon", 3)]


def test_every_change_of_holdings_is_reported(tmp_path):
    rng = np.random.default_rng(50)
    changes = []
    one_expert = len(expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=0))
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=int(one_expert * 2.5),
                       on_change=lambda: changes.append(1))
    payloads = [expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e) for e in range(3)]
    for payload in payloads:
        rt.expert_load(payload=payload)
    assert len(changes) == 3
    x = rng.standard_normal((2, D_MODEL)).astype(np.float32)
    cold = [e["expert"] for e in rt.status()["experts"] if e["tier"] == "disk"]
    assert cold, "the budget should have evicted an expert"
    changes.clear()
    rt.execute(model_id=MODEL, layer=0, expert=cold[0], hidden=x)  # promotion (and an eviction)
    assert changes
    changes.clear()
    rt.execute(model_id=MODEL, layer=0, expert=cold[0], hidden=x)  # already warm: nothing changed
    assert not changes
    rt.expert_unload(model_id=MODEL, layer=0, expert=0)
    assert changes == [1]


@pytest.mark.parametrize(("quant", "bound"), [(None, 1e-5), ("q8_0", 0.02)])
def test_forward_local_of_a_dense_layer_held_as_slices(rt, quant, bound):
    """A dense SwiGLU layer cut into 3 d_ff slices (ids 0..2) under a dense gate: forward_local
    runs unchanged and sums the slices back into the layer's output."""
    rng = np.random.default_rng(51)
    d_ff = 3 * 96 + 40  # 328: not a multiple of 32, so the last slice is the narrow one
    layer = expert_weights(rng, D_MODEL, d_ff)
    slices = dense_slices(layer, 3, align=32)
    assert [s["gate"].shape[0] for s in slices.values()] == [128, 128, 72]
    rt.gate_load(payload=dense_gate(d_model=D_MODEL, d_ff=d_ff, n_slices=3, slice_align=32, layer=4))
    for s, w in slices.items():
        rt.expert_load(payload=expert_payload(w, expert=s, layer=4, quant=quant))
    x = rng.standard_normal((9, D_MODEL)).astype(np.float32)
    routing = rt.route(model_id=MODEL, layer=4, hidden=x)
    np.testing.assert_array_equal(routing.experts, np.broadcast_to([0, 1, 2], (9, 3)))
    y = rt.forward_local(model_id=MODEL, layer=4, hidden=x)
    assert y.dtype == np.float32 and _rel(y, swiglu_reference(layer, x)) < bound
    gate_row = rt.status()["gates"][0]
    assert (gate_row["router"], gate_row["n_routed"], gate_row["n_shared_experts"], gate_row["top_k"]) == \
        ("dense", 0, 3, 0)


def test_dense_gate_refuses_slices_of_another_cut(rt):
    rng = np.random.default_rng(52)
    layer = expert_weights(rng, D_MODEL, 96)
    rt.gate_load(payload=dense_gate(d_model=D_MODEL, d_ff=96, n_slices=3))  # slices of 32 rows
    with pytest.raises(ModelMismatch, match=r"slice 1 has d_ff 48, .* gives it rows \[32, 64\) \(32 wide\)"):
        rt.expert_load(payload=expert_payload(dense_slices(layer, 2)[1], expert=1))
    with pytest.raises(ModelMismatch, match=r"expert 3 is out of range .* 0 routed \+ 3 shared"):
        rt.expert_load(payload=expert_payload(dense_slices(layer, 4)[3], expert=3))
    rt.expert_load(payload=expert_payload(dense_slices(layer, 3)[1], expert=1))
    # and the other way round: a gate cut differently from the slices already held
    with pytest.raises(ModelMismatch, match="slice 1 has d_ff 32"):
        rt.gate_load(payload=dense_gate(d_model=D_MODEL, d_ff=96, n_slices=2))
