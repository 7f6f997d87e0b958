"""prepare -> blob -> load -> forward, against the dense reference, with exact byte accounting."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from apps.blobs.store import BlobStore
from apps.catalog.checkpoint import CheckpointError, CheckpointReader
from apps.catalog.shapes import catalog_shape, shape_from_config
from apps.catalog.slicing import (
    SlicingError,
    expert_tensor,
    gate_payload_for_layer,
    gate_tensor,
    prepare_layer,
    shared_tensor,
    slice_expert,
)
from core.experts.backends import CpuBackend
from core.experts.ffn import build_expert, expert_forward
from core.formats.expert_payload import read_expert_payload
from core.formats.gate_payload import read_gate_payload
from testkit.checkpoints import FileServer, deepseek_v3, qwen3_moe

# Bounds. Per weight (relative RMSE of the dequantized projection, as tests/quantization uses):
WEIGHT_BOUND = {"Q4_K": 0.08, "Q6_K": 0.02, "Q8_0": 0.006, "F16": 0.001, "F32": 0.0}
# Per expert output vs the dense f32 forward (the projections' errors compound through SwiGLU):
BOUND = {"q8_0": 0.02, "q4_k_m": 0.15, None: 1e-6}


def dense_forward(gate, up, down, x):
    h = x @ gate.T
    return ((h / (1.0 + np.exp(-h))) * (x @ up.T)) @ down.T


def rel_err(y, ref) -> float:
    return float(np.sqrt(np.mean((y - ref) ** 2) / np.mean(ref**2)))


def load_and_run(store: BlobStore, h: str, x: np.ndarray, dense: tuple[np.ndarray, ...]) -> np.ndarray:
    """Load the blob into the CPU runtime, run it, and check it against the format's bounds."""
    payload = store.read(h)
    parsed = read_expert_payload(payload)
    deq = [parsed.dense(p) for p in ("gate", "up", "down")]
    for p, w, ref in zip(("gate", "up", "down"), deq, dense, strict=True):
        fmt = parsed.tensors[f"{p}_proj.weight"].ggml_type.value
        assert rel_err(w, ref) <= WEIGHT_BOUND[fmt] + 1e-7, (p, fmt, rel_err(w, ref))
    backend = CpuBackend(use_numba=False)
    y = expert_forward(build_expert(payload, backend), x, backend)
    assert rel_err(y, dense_forward(*deq, x)) < 1e-5  # the runtime computes exactly what the blob holds
    return y


def needed_bytes(root, names, index=None) -> int:
    total = 0
    for name in names:
        shard = index[name] if index else "model.safetensors"
        raw = (root / shard).read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        a, b = json.loads(raw[8:8 + n])[name]["data_offsets"]
        total += b - a
    return total


@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m", None])
def test_qwen3_prepare_blob_load_forward_over_http(tmp_path, quant):
    model = qwen3_moe(tmp_path / "ckpt", d_model=256, d_ff=64, n_experts=4, n_layers=2, shards=3)
    shape = shape_from_config("tiny-qwen3", model.config)
    store = BlobStore(tmp_path / "blobs")
    x = np.random.default_rng(7).standard_normal((5, 256)).astype(np.float32)
    index = json.loads((model.root / "model.safetensors.index.json").read_text())["weight_map"]
    with FileServer(model.root) as server, CheckpointReader.open(server.url, header_probe=64) as reader:
        seen = []
        prepared = prepare_layer(reader, shape, model_id="tiny-qwen3", layer=1, experts=[3, 0, 3], quant=quant,
                                 on_progress=lambda done, total, e: seen.append((done, total, e)))
        assert seen == [(1, 2, 0), (2, 2, 3)]
        # bytes served == config + index + each touched shard's header + exactly the needed tensors
        names = [gate_tensor(1)] + [expert_tensor(1, e, p) for e in (0, 3) for p in ("gate", "up", "down")]
        shards = {index[n] for n in names}
        headers = sum(8 + struct.unpack("<Q", (model.root / s).read_bytes()[:8])[0] for s in shards)
        jsons = sum((model.root / f).stat().st_size for f in ("config.json", "model.safetensors.index.json"))
        assert server.bytes_sent == reader.bytes_read == jsons + headers + needed_bytes(model.root, names, index)
        assert prepared.bytes_read == reader.bytes_read - jsons
    if quant == "q4_k_m":  # d_model 256 fits Q4_K; down rows of 64 fall back to Q8_0 like llama.cpp
        assert prepared.formats[0] == {"gate": "Q4_K", "up": "Q4_K", "down": "Q8_0"}
    elif quant == "q8_0":
        assert prepared.formats[3] == {"gate": "Q8_0", "up": "Q8_0", "down": "Q8_0"}
    gate = read_gate_payload(prepared.gate_payload)
    assert (gate.router, gate.top_k, gate.norm_topk_prob, gate.n_shared_experts) == ("softmax", 2, True, 0)
    np.testing.assert_array_equal(gate.weight, model.dense[gate_tensor(1)])
    for e, payload in prepared.experts.items():
        h = store.put(payload)
        dense = tuple(model.dense[expert_tensor(1, e, p)] for p in ("gate", "up", "down"))
        assert rel_err(load_and_run(store, h, x, dense), dense_forward(*dense, x)) < BOUND[quant]


def test_prepare_is_deterministic(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", d_model=256, d_ff=64)
    shape = shape_from_config("tiny-qwen3", model.config)
    runs = []
    for _ in range(2):
        with CheckpointReader.open(model.root) as reader:
            p = prepare_layer(reader, shape, model_id="tiny-qwen3", layer=0, experts=[1, 2], quant="q4_k_m")
        store = BlobStore(tmp_path / f"blobs{len(runs)}")
        runs.append((store.put(p.gate_payload), *(store.put(p.experts[e]) for e in (1, 2))))
    assert runs[0] == runs[1]


def test_deepseek_fp8_bias_and_shared_expert(tmp_path):
    model = deepseek_v3(tmp_path / "ckpt", shards=2)
    shape = shape_from_config("tiny-dsv3", model.config)
    assert shape.moe_layers == (1,) and shape.n_shared_experts == 1
    store = BlobStore(tmp_path / "blobs")
    x = np.random.default_rng(3).standard_normal((4, 160)).astype(np.float32)
    with FileServer(model.root) as server, CheckpointReader.open(server.url) as reader:
        prepared = prepare_layer(reader, shape, model_id="tiny-dsv3", layer=1, experts=[0, 7, 8], quant="q8_0")
        tensor_names = [gate_tensor(1), gate_tensor(1).replace("weight", "e_score_correction_bias")]
        for e in (0, 7):
            for p in ("gate", "up", "down"):
                tensor_names += [expert_tensor(1, e, p), expert_tensor(1, e, p) + "_scale_inv"]
        for p in ("gate", "up", "down"):
            tensor_names += [shared_tensor(1, p), shared_tensor(1, p) + "_scale_inv"]
        index = json.loads((model.root / "model.safetensors.index.json").read_text())["weight_map"]
        assert reader.bytes_by_kind["tensor"] == needed_bytes(model.root, tensor_names, index)
        assert server.bytes_sent == reader.bytes_read
    gate = read_gate_payload(prepared.gate_payload)
    assert (gate.router, gate.top_k, gate.routed_scaling_factor, gate.n_group, gate.topk_group,
            gate.n_shared_experts, gate.norm_topk_prob) == ("sigmoid", 2, 2.5, 2, 1, 1, True)
    np.testing.assert_array_equal(gate.bias, model.dense["model.layers.1.mlp.gate.e_score_correction_bias"])
    np.testing.assert_array_equal(gate.weight, model.dense[gate_tensor(1)])
    for e, payload in prepared.experts.items():
        names = [expert_tensor(1, e, p) if e < 8 else shared_tensor(1, p) for p in ("gate", "up", "down")]
        dense = tuple(model.dense[n] for n in names)
        assert rel_err(load_and_run(store, store.put(payload), x, dense), dense_forward(*dense, x)) < BOUND["q8_0"]


def test_fused_shared_experts_split_exactly(tmp_path):
    model = deepseek_v3(tmp_path / "ckpt", n_shared=2, d_ff=72)  # fused width 144: rows cross a block edge
    shape = shape_from_config("tiny", model.config)
    x = np.random.default_rng(5).standard_normal((3, 160)).astype(np.float32)
    with CheckpointReader.open(model.root) as reader:
        parts = [slice_expert(reader, shape, 1, e) for e in (8, 9)]
        assert all(p[0].shape == (72, 160) and p[2].shape == (160, 72) for p in parts)
    # in float64 the split is exact up to rounding: the sum of the parts is the fused MLP
    x = x.astype(np.float64)
    fused = dense_forward(*(model.dense[shared_tensor(1, p)].astype(np.float64) for p in ("gate", "up", "down")), x)
    split = sum(dense_forward(*(w.astype(np.float64) for w in part), x) for part in parts)
    np.testing.assert_allclose(split, fused, rtol=1e-12, atol=1e-12)


def test_refusals(tmp_path):
    model = deepseek_v3(tmp_path / "ckpt")
    shape = shape_from_config("tiny", model.config)
    with CheckpointReader.open(model.root) as reader:
        for call, reason in (
            (lambda: slice_expert(reader, shape, 0, 0), "layer_not_moe"),
            (lambda: slice_expert(reader, shape, 1, 9), "expert_out_of_range"),
            (lambda: slice_expert(reader, shape, 1, -1), "expert_out_of_range"),
            (lambda: gate_payload_for_layer(reader, catalog_shape("minimax-m1"), 0), "shape_incomplete"),
            (lambda: slice_expert(reader, catalog_shape("gpt-oss-120b"), 0, 0), "unsupported_layout"),
            (lambda: prepare_layer(reader, shape, model_id="m", layer=1, experts=[], quant=None),
             "expert_out_of_range"),
        ):
            with pytest.raises(SlicingError) as err:
                call()
            assert err.value.reason == reason, str(err.value)
    qwen2 = shape_from_config("q2", {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                                     "num_hidden_layers": 2, "hidden_size": 160, "moe_intermediate_size": 136,
                                     "shared_expert_intermediate_size": 136})
    with CheckpointReader.open(model.root) as reader, pytest.raises(SlicingError) as err:
        slice_expert(reader, qwen2, 1, 4)
    assert err.value.reason == "unsupported_layout" and "shared_expert_gate" in str(err.value)


def test_a_failing_prepare_stores_nothing(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", shards=1)
    raw = (model.root / "model.safetensors").read_bytes()
    (model.root / "model.safetensors").write_bytes(raw[:8] + b"#" + raw[9:])  # corrupt the header JSON
    store = BlobStore(tmp_path / "blobs")
    shape = shape_from_config("m", model.config)
    with CheckpointReader.open(model.root) as reader, pytest.raises(CheckpointError) as err:
        prepared = prepare_layer(reader, shape, model_id="m", layer=0, experts=[0], quant="q8_0")
        store.put(prepared.gate_payload)
    assert err.value.reason == "header_corrupt" and store.hashes() == []
