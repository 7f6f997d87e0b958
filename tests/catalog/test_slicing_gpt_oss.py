"""gpt-oss checkpoints (fused experts with biases, a biased router; dense or MXFP4) -> payloads -> the
project's own gate and expert runtime, against a numpy transcription of transformers' GptOssMLP."""

from __future__ import annotations

import numpy as np
import pytest

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import SlicingError, gate_payload_for_layer, prepare_expert, prepare_layer, slice_expert
from core.experts.backends import CpuBackend
from core.experts.ffn import build_expert, expert_forward
from core.experts.runtime import ExpertRuntime
from core.formats.expert_payload import read_expert_payload
from core.quantization.mxfp4 import blocks_from_hub
from testkit.gpt_oss_checkpoint import gpt_oss_moe

D_MODEL, D_FF, N_EXPERTS = 64, 96, 4


def transformers_mlp(dense: dict[str, np.ndarray], layer: int, x: np.ndarray, top_k: int = 2) -> np.ndarray:
    """GptOssMLP.forward in float64: router logits = x·Wᵀ + b, top-k, softmax over the k; each chosen
    expert's clamped SwiGLU on the fused, interleaved gate_up."""
    p = f"model.layers.{layer}.mlp."
    x = x.astype(np.float64)
    logits = x @ dense[p + "router.weight"].T + dense[p + "router.bias"]
    top = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(logits, top, axis=1)
    weights = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    out = np.zeros_like(x)
    for row in range(x.shape[0]):
        for e, w in zip(top[row], weights[row], strict=True):
            h = x[row] @ dense[p + "experts.gate_up_proj"][e] + dense[p + "experts.gate_up_proj_bias"][e]
            gate, up = np.minimum(h[0::2], 7.0), np.clip(h[1::2], -7.0, 7.0)
            glu = gate / (1 + np.exp(-1.702 * gate))
            y = ((up + 1) * glu) @ dense[p + "experts.down_proj"][e] + dense[p + "experts.down_proj_bias"][e]
            out[row] += w * y
    return out


@pytest.fixture(params=[False, True], ids=["dense", "mxfp4"])
def model(request, tmp_path):
    return gpt_oss_moe(tmp_path / "gpt-oss", mxfp4=request.param, d_model=D_MODEL, d_ff=D_FF,
                       n_experts=N_EXPERTS)


def test_the_layer_runs_as_transformers_gpt_oss_mlp(model, tmp_path):
    with CheckpointReader.open(model.root) as reader:
        shape = shape_from_config("t/gpt-oss", reader.config)
        runtime = ExpertRuntime(data_dir=tmp_path / "rt", memory_budget_bytes=16 << 20,
                                backend=CpuBackend(use_numba=False))
        prepared = prepare_layer(reader, shape, model_id="t/gpt-oss", layer=1, experts=range(N_EXPERTS), quant=None)
    runtime.gate_load(payload=prepared.gate_payload)
    for payload in prepared.experts.values():
        runtime.expert_load(payload=payload)
    want = "MXFP4" if "quantization_config" in model.config else "F32"
    assert all(f == dict.fromkeys(("gate", "up", "down"), want) for f in prepared.formats.values())
    x = np.random.default_rng(0).standard_normal((6, D_MODEL)).astype(np.float32)
    ref = transformers_mlp(model.dense, 1, x)
    y = runtime.forward_local(model_id="t/gpt-oss", layer=1, hidden=x)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    p = "model.layers.1.mlp.experts."
    pre = x.astype(np.float64) @ model.dense[p + "gate_up_proj"][0] + model.dense[p + "gate_up_proj_bias"][0]
    assert (pre[:, 0::2] > 7).any() and (np.abs(pre[:, 1::2]) > 7).any()  # both clamps are exercised


def test_mxfp4_blocks_are_kept_as_the_checkpoint_holds_them(tmp_path):
    """No re-quantization: the payload's blocks are the checkpoint's bytes in ggml's order (4.25 bits per
    weight), only that expert's rows are read, and a re-run writes the same bytes."""
    model = gpt_oss_moe(tmp_path / "m", mxfp4=True, d_model=D_MODEL, d_ff=D_FF, n_experts=N_EXPERTS)
    with CheckpointReader.open(model.root) as reader:
        shape = shape_from_config("t/gpt-oss", reader.config)
        prepare_expert(reader, shape, model_id="t/gpt-oss", layer=0, expert=1, quant=None)  # headers read
        before = reader.bytes_by_kind["tensor"]
        data, formats = prepare_expert(reader, shape, model_id="t/gpt-oss", layer=0, expert=2, quant="q8_0")
        read = reader.bytes_by_kind["tensor"] - before
        again, _ = prepare_expert(reader, shape, model_id="t/gpt-oss", layer=0, expert=2, quant="q8_0")
    assert data == again and formats == dict.fromkeys(("gate", "up", "down"), "MXFP4")
    parsed = read_expert_payload(data)
    p = "model.layers.0.mlp.experts."
    blocks, scales = (model.tensors[p + f"gate_up_proj_{k}"][1][2] for k in ("blocks", "scales"))
    np.testing.assert_array_equal(parsed.tensors["gate_proj.weight"].data,
                                  blocks_from_hub(blocks[0::2], scales[0::2]).reshape(D_FF, -1))
    np.testing.assert_array_equal(parsed.tensors["up_proj.weight"].data,
                                  blocks_from_hub(blocks[1::2], scales[1::2]).reshape(D_FF, -1))
    np.testing.assert_array_equal(parsed.dense("down"), model.dense[p + "down_proj"][2].T)
    weights = 3 * D_MODEL * D_FF
    assert sum(t.nbytes for t in parsed.tensors.values()) == weights * 17 // 32
    expert_bytes = weights * 17 // 32 + 2 * (2 * D_FF + D_MODEL)  # blocks + scales, and the BF16 biases
    assert read == expert_bytes, (read, expert_bytes)


def test_the_gate_is_the_softmax_router_with_the_logit_bias(model):
    from core.formats.gate_payload import read_gate_payload

    with CheckpointReader.open(model.root) as reader:
        shape = shape_from_config("t/gpt-oss", reader.config)
        gate = read_gate_payload(gate_payload_for_layer(reader, shape, 0))
    assert (gate.router, gate.top_k, gate.norm_topk_prob) == ("softmax", 2, True)
    np.testing.assert_array_equal(gate.logit_bias, model.dense["model.layers.0.mlp.router.bias"])


def test_a_gpt_oss_expert_runs_where_the_backend_runs_it_and_the_old_slicer_refuses(model):
    with CheckpointReader.open(model.root) as reader:
        shape = shape_from_config("t/gpt-oss", reader.config)
        with pytest.raises(SlicingError, match="slice_gpt_oss_expert"):
            slice_expert(reader, shape, 0, 0)
        with pytest.raises(SlicingError, match=r"outside 0\.\.3"):
            prepare_expert(reader, shape, model_id="t", layer=0, expert=4, quant=None)
        data, _ = prepare_expert(reader, shape, model_id="t", layer=0, expert=0, quant=None)
    backend = CpuBackend()  # the compiled kernels (C, or numba) on MXFP4 and F32 alike
    x = np.random.default_rng(1).standard_normal((3, D_MODEL)).astype(np.float32)
    y = expert_forward(build_expert(data, backend), x, backend)
    ref = CpuBackend(use_numba=False)
    y_ref = expert_forward(build_expert(data, ref), x, ref)
    assert np.abs(y - y_ref).max() <= 0.03 * np.abs(y_ref).max()
