"""Dense layers cut into d_ff slices: the slices' SwiGLU sums to the layer's, byte accounting, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.dense import dense_layer, dense_tensor, prepare_dense_layer, slice_dense
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import SlicingError, prepare_layer
from core.experts.backends import CpuBackend
from core.experts.runtime import ExpertRuntime
from core.formats.gate_payload import read_gate_payload
from testkit.checkpoints import FileServer, deepseek_v3, llama_dense, write_checkpoint
from tests.catalog.test_slicing import needed_bytes
from tests.experts.factories import swiglu_reference

PROJ = ("gate", "up", "down")
# The sum of the slices against the dense f64 reference, relative L2 over the output. f32: the
# slices are exact cuts, so only f32 rounding of the matmuls and of the sum remains. Quantized:
# each slice carries its own weights' rounding (Q8_0 ≈ 0.2% of a block's max per weight, Q4_K
# ≈ 5-8%); the errors are independent across slices, so the sum's relative error is of the
# order of one expert's (tests/catalog/test_slicing.py's per-expert bounds, 0.02 and 0.15).
BOUND = {None: 1e-5, "q8_0": 0.02, "q4_k_m": 0.15}


def rel(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def layer_weights(model, layer: int) -> dict[str, np.ndarray]:
    return {p: model.dense[dense_tensor(layer, p)] for p in PROJ}


def forward_through_runtime(tmp_path, prepared, hidden: np.ndarray) -> np.ndarray:
    """Load the dense gate and every slice into a runtime and run its (unchanged) local forward."""
    rt = ExpertRuntime(data_dir=tmp_path / "rt", memory_budget_bytes=64 << 20, backend=CpuBackend(use_numba=False))
    rt.gate_load(payload=prepared.gate_payload)
    for payload in prepared.experts.values():
        rt.expert_load(payload=payload)
    routing = rt.route(model_id=prepared.model_id, layer=prepared.layer, hidden=hidden)
    assert (routing.experts == np.arange(len(prepared.experts))).all() and (routing.weights == 1.0).all()
    return rt.forward_local(model_id=prepared.model_id, layer=prepared.layer, hidden=hidden)


@pytest.mark.parametrize("quant", [None, "q8_0"])
def test_deepseek_first_dense_layer_in_three_slices_over_http(tmp_path, quant):
    model = deepseek_v3(tmp_path / "ckpt", shards=2)  # layer 0 dense: FP8, d_ff 408, d_model 160
    shape = shape_from_config("tiny-dsv3", model.config)
    assert shape.moe_layers == (1,)
    x = np.random.default_rng(9).standard_normal((6, 160)).astype(np.float32)
    with FileServer(model.root) as server, CheckpointReader.open(server.url) as reader:
        seen = []
        prepared = prepare_dense_layer(reader, shape, model_id="tiny-dsv3", layer=0, n_slices=3, quant=quant,
                                       on_progress=lambda done, total, s: seen.append((done, total, s)))
        assert server.bytes_sent == reader.bytes_read
    assert seen == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]
    gate = read_gate_payload(prepared.gate_payload)
    assert (gate.router, gate.n_routed, gate.top_k, gate.n_shared_experts, gate.d_model, gate.dense_d_ff) == \
        ("dense", 0, 0, 3, 160, 408)
    if quant == "q8_0":  # cut on Q8_0's 32-row blocks: 13 blocks -> 5, 4, 4; 408 = 12·32 + 24, so the last is short
        assert gate.slice_align == 32
        assert [gate.slice_bounds(s) for s in range(3)] == [(0, 160), (160, 288), (288, 408)]
        assert prepared.formats[0] == {"gate": "Q8_0", "up": "Q8_0", "down": "Q8_0"}
        assert prepared.formats[2] == {"gate": "Q8_0", "up": "Q8_0", "down": "F16"}  # rows of 120: F16 fallback
    else:
        assert gate.slice_align == 1 and [gate.slice_bounds(s) for s in range(3)] == [(0, 136), (136, 272), (272, 408)]
    y = forward_through_runtime(tmp_path, prepared, x)
    assert rel(y, swiglu_reference(layer_weights(model, 0), x)) < BOUND[quant]


@pytest.mark.parametrize("quant", [None, "q8_0", "q4_k_m"])
def test_llama_layer_slices_sum_to_the_layer_and_read_only_what_they_need(tmp_path, quant):
    # d_model 256 lets gate/up be Q4_K; d_ff 704 = 2·256 + 192: q4_k_m cuts on Q6_K's 256-row blocks
    model = llama_dense(tmp_path / "ckpt", d_model=256, d_ff=704, n_layers=2, shards=2)
    x = np.random.default_rng(10).standard_normal((5, 256)).astype(np.float32)
    index = json.loads((model.root / "model.safetensors.index.json").read_text())["weight_map"]
    with CheckpointReader.open(model.root) as reader:
        prepared = prepare_dense_layer(reader, None, model_id="tiny-llama", layer=1, n_slices=3, quant=quant)
        # gate and up rows are read once over all slices; down's columns are not contiguous: once per slice
        names = [dense_tensor(1, p) for p in PROJ]
        want = needed_bytes(model.root, names[:2], index) + 3 * needed_bytes(model.root, names[2:], index)
        assert reader.bytes_by_kind["tensor"] == want
    gate = read_gate_payload(prepared.gate_payload)
    widths = [b - a for a, b in (gate.slice_bounds(s) for s in range(3))]
    if quant == "q4_k_m":
        assert widths == [256, 256, 192]
        assert [prepared.formats[s]["down"] for s in range(3)] == ["Q6_K", "Q6_K", "Q8_0"]  # 192: a Q8_0 fallback
        assert prepared.formats[0]["gate"] == "Q4_K"
    else:
        assert sum(widths) == 704 and max(widths) - min(widths) <= gate.slice_align
    y = forward_through_runtime(tmp_path, prepared, x)
    assert rel(y, swiglu_reference(layer_weights(model, 1), x)) < BOUND[quant]


def test_the_slices_are_exact_cuts_of_the_layer(tmp_path):
    """In f64 the sum of the slices' SwiGLU is the layer's up to rounding (no f32 in the way)."""
    model = llama_dense(tmp_path / "ckpt", d_model=96, d_ff=352, dtype="F32", shards=1)
    x = np.random.default_rng(11).standard_normal((4, 96))
    with CheckpointReader.open(model.root) as reader:
        dense = dense_layer(reader, None, 0, n_slices=5, quant=None)
        parts = [slice_dense(reader, dense, s) for s in range(5)]
    for (a, b), (g, u, d) in zip(dense.bounds, parts, strict=True):
        np.testing.assert_array_equal(g, model.dense[dense_tensor(0, "gate")][a:b])
        np.testing.assert_array_equal(u, model.dense[dense_tensor(0, "up")][a:b])
        np.testing.assert_array_equal(d, model.dense[dense_tensor(0, "down")][:, a:b])
    total = sum(swiglu_reference({"gate": g, "up": u, "down": d}, x) for g, u, d in parts)
    np.testing.assert_allclose(total, swiglu_reference(layer_weights(model, 0), x), rtol=1e-12, atol=1e-12)


def test_dense_prepare_is_deterministic(tmp_path):
    model = llama_dense(tmp_path / "ckpt")
    runs = []
    for _ in range(2):
        with CheckpointReader.open(model.root) as reader:
            p = prepare_dense_layer(reader, None, model_id="m", layer=0, n_slices=2, quant="q8_0", slices=[1])
        runs.append((p.gate_payload, p.experts))
    assert runs[0] == runs[1] and list(runs[0][1]) == [1]


def test_refusals(tmp_path):
    ds = deepseek_v3(tmp_path / "ds")
    ds_shape = shape_from_config("tiny-dsv3", ds.config)
    llama = llama_dense(tmp_path / "llama", d_ff=352, n_layers=2)
    with CheckpointReader.open(ds.root) as dsr, CheckpointReader.open(llama.root) as lr:
        for call, reason, words in (
            (lambda: dense_layer(dsr, ds_shape, 1, n_slices=2, quant=None), "layer_is_moe", "first_k_dense_replace"),
            # without a shape the checkpoint's router tensor says it
            (lambda: dense_layer(dsr, None, 1, n_slices=2, quant=None), "layer_is_moe", "MoE layer"),
            (lambda: dense_layer(dsr, ds_shape, 2, n_slices=2, quant=None), "layer_not_dense", "of 2 has no dense"),
            (lambda: dense_layer(lr, None, 7, n_slices=2, quant=None), "layer_not_dense", "mlp.gate_proj"),
            (lambda: dense_layer(dsr, ds_shape, 0, n_slices=0, quant=None), "dense_slices_out_of_range", "1..1024"),
            (lambda: dense_layer(dsr, ds_shape, 0, n_slices=1025, quant=None), "dense_slices_out_of_range", "1..1024"),
            # d_ff 352 in Q6_K's 256-row blocks: 2 blocks, so at most 2 slices
            (lambda: dense_layer(lr, None, 0, n_slices=3, quant="q4_k_m"), "dense_slices_out_of_range",
             "Q6_K's 256-row blocks"),
            (lambda: dense_layer(lr, None, 0, n_slices=353, quant=None), "dense_slices_out_of_range", "at most 352"),
            (lambda: prepare_dense_layer(lr, None, model_id="m", layer=0, n_slices=2, quant=None, slices=[2]),
             "expert_out_of_range", "subset of 0..1"),
            (lambda: prepare_layer(dsr, ds_shape, model_id="m", layer=0, experts=[0], quant=None), "layer_not_moe",
             "dense_slices"),
        ):
            with pytest.raises(SlicingError) as err:
                call()
            assert err.value.reason == reason and words in str(err.value), str(err.value)
        assert dense_layer(lr, None, 0, n_slices=2, quant="q4_k_m").bounds == ((0, 256), (256, 352))


def test_inconsistent_dense_tensors_are_refused(tmp_path):
    tensors = {dense_tensor(0, "gate"): ("F32", np.zeros((64, 32), np.float32)),
               dense_tensor(0, "up"): ("F32", np.zeros((64, 32), np.float32)),
               dense_tensor(0, "down"): ("F32", np.zeros((32, 48), np.float32))}
    root = write_checkpoint(tmp_path / "bad", {"model_type": "llama", "hidden_size": 32}, tensors)
    with CheckpointReader.open(root) as reader, pytest.raises(SlicingError) as err:
        dense_layer(reader, None, 0, n_slices=2, quant=None)
    assert err.value.reason == "shape_mismatch" and "expected (32, 64)" in str(err.value)
