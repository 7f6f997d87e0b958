"""Dense (non-expert) weights: which tensors, the budget refusal before any data is read, shape and
finiteness checks, and FP8/BF16 checkpoints over HTTP decoded as the experts' prepare path decodes them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from apps.catalog.checkpoint import CheckpointError, CheckpointReader
from apps.generation.model import WholeModel
from apps.generation.spec import spec_from_config
from apps.generation.weights import DenseLoadError, dense_bytes, dense_tensor_names, load_dense_weights
from core.errors import PayloadTooLarge
from testkit.checkpoints import FileServer, f32_to_bf16_bits, fp8_block_quantize, write_checkpoint
from tests.generation.conftest import FIXTURES, NAMES, SHARDED, fixture_tensors

MOE_PARTS = (".mlp.experts.", ".mlp.gate.", ".mlp.shared_experts.", ".mlp.router.")  # gpt-oss: mlp.router


def open_fixture(name: str) -> tuple[CheckpointReader, object]:
    reader = CheckpointReader.open(FIXTURES / name)
    return reader, spec_from_config(reader.config, model_id=name)


@pytest.mark.parametrize("name", NAMES)
def test_dense_names_are_every_tensor_but_the_moe_blocks(name):
    reader, spec = open_fixture(name)
    names = dense_tensor_names(spec)
    assert len(names) == len(set(names))
    assert not [n for n in names if any(part in n for part in MOE_PARTS)]
    stored = set(fixture_tensors(FIXTURES / name))
    moe = {n for n in stored if any(part in n for part in MOE_PARTS)}
    assert set(names) == stored - moe  # nothing missing, nothing extra
    assert {int(n.split(".")[2]) for n in moe} == set(spec.moe_layers)
    reader.close()


@pytest.mark.parametrize("name", SHARDED)
def test_the_glm_and_gpt_oss_fixtures_are_sharded_as_the_hub_serves_them(name):
    """Several shards and an index, a MoE layer's tensors in more than one of them, and the node's reader
    finding each tensor in the shard the index names with safetensors' own values."""
    folder = FIXTURES / name
    assert not (folder / "model.safetensors").exists()
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) >= 2
    layer = min(int(n.split(".")[2]) for n in weight_map if any(part in n for part in MOE_PARTS))
    assert len({f for n, f in weight_map.items() if n.startswith(f"model.layers.{layer}.")}) >= 2
    want = fixture_tensors(folder)
    assert set(want) == set(weight_map)
    with CheckpointReader.open(folder) as reader:
        for tensor, shard in weight_map.items():
            assert reader.shard_of(tensor) == shard
            got = reader.read_u8(tensor) if want[tensor].dtype == np.uint8 else reader.read_tensor(tensor)
            np.testing.assert_array_equal(got, want[tensor])


@pytest.mark.parametrize("name", NAMES)
def test_load_counts_bytes_and_reports_progress(name):
    reader, spec = open_fixture(name)
    seen: list[tuple[int, int]] = []
    with reader:
        need = dense_bytes(reader, spec)
        assert reader.bytes_by_kind["tensor"] == 0  # headers only
        weights = load_dense_weights(reader, spec, max_bytes=need, progress=lambda d, t: seen.append((d, t)))
        assert reader.bytes_by_kind["tensor"] == need  # F32 on disk: exactly the dense tensors were fetched
    assert weights.nbytes == need
    assert seen == [(i, len(seen)) for i in range(1, len(seen) + 1)] and len(seen) == len(weights.tensors)
    assert all(t.dtype == np.float32 and t.flags.c_contiguous for t in weights.tensors.values())


def test_over_budget_is_refused_before_any_tensor_data():
    reader, spec = open_fixture("deepseek_v3")
    with reader:
        need = dense_bytes(reader, spec)
        with pytest.raises(DenseLoadError, match=f"needs {need:,} bytes") as err:
            load_dense_weights(reader, spec, max_bytes=need - 1, progress=lambda d, t: pytest.fail("read"))
        assert reader.bytes_by_kind["tensor"] == 0
    assert err.value.reason == "over_budget" and err.value.kind is PayloadTooLarge
    assert err.value.data() == {"reason": "over_budget", "need_bytes": need, "max_bytes": need - 1}


def test_shape_disagreeing_with_the_config_names_the_tensor(tmp_path):
    reader, _ = open_fixture("deepseek_v3")
    config = dict(reader.config, intermediate_size=100)  # the checkpoint's dense layer 0 has 96
    spec = spec_from_config(config, model_id="m")
    with reader, pytest.raises(DenseLoadError, match=r"model.layers.0.mlp.gate_proj.weight has shape \[96, 64\]"):
        load_dense_weights(reader, spec)
    assert reader.bytes_by_kind["tensor"] == 0


def _rewrite(src: Path, dst: Path, *, shards: int = 1, fp8: bool = False, poison: str | None = None
             ) -> dict[str, np.ndarray]:
    """The fixture as another checkpoint: 2-D dense tensors FP8 (+ weight_scale_inv) and 1-D BF16 when `fp8`;
    returns the f32 values a reader must decode for the dense tensors."""
    config = json.loads((src / "config.json").read_text())
    spec = spec_from_config(config, model_id="m")
    dense = set(dense_tensor_names(spec))
    tensors, want = {}, {}
    for name, value in fixture_tensors(src).items():
        if poison == name:
            value = value.copy()
            value.flat[3] = np.nan
        if fp8 and name in dense and value.ndim == 2:
            codes, scale, deq = fp8_block_quantize(value)
            tensors[name], tensors[name + "_scale_inv"] = ("F8_E4M3", codes), ("F32", scale)
            want[name] = deq
        elif fp8 and name in dense:
            bits = f32_to_bf16_bits(value)
            tensors[name] = ("BF16", bits)
            want[name] = (bits.astype(np.uint32) << 16).view(np.float32)
        else:
            tensors[name] = ("F32", value)
            want[name] = value
    write_checkpoint(dst, config, tensors, shards=shards)
    return {n: v for n, v in want.items() if n in dense}


def test_fp8_and_bf16_shards_over_http_decode_like_prepare(tmp_path):
    want = _rewrite(FIXTURES / "deepseek_v3", tmp_path / "ckpt", shards=2, fp8=True)
    with FileServer(tmp_path / "ckpt") as server, CheckpointReader.open(server.url) as reader:
        spec = spec_from_config(reader.config, model_id="m")
        weights = load_dense_weights(reader, spec)
        assert server.bytes_sent == reader.bytes_read
    assert weights.tensors.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(weights.tensors[name], value, err_msg=name)


def test_non_finite_and_missing_tensors_are_named(tmp_path):
    _rewrite(FIXTURES / "qwen3_moe", tmp_path / "nan", poison="model.norm.weight")
    with CheckpointReader.open(tmp_path / "nan") as reader, \
            pytest.raises(DenseLoadError, match=r"model.norm.weight holds 1 NaN/inf") as err:
        load_dense_weights(reader, spec_from_config(reader.config, model_id="m"))
    assert err.value.reason == "non_finite"
    reader, _ = open_fixture("qwen3_moe")
    spec = spec_from_config(dict(reader.config, num_hidden_layers=4), model_id="m")  # a layer the file lacks
    with reader, pytest.raises(CheckpointError, match=r"model\.layers\.3\.input_layernorm\.weight"):
        dense_bytes(reader, spec)


def test_tied_embeddings_need_no_lm_head():
    reader, _ = open_fixture("qwen3_moe")
    with reader:
        spec = spec_from_config(dict(reader.config, tie_word_embeddings=True), model_id="m")
        names = dense_tensor_names(spec)
        assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
        weights = load_dense_weights(reader, spec)
    model = WholeModel(weights)
    logits = model.forward(np.array([1, 2, 3]), model.new_cache(), lambda layer, x: np.zeros_like(x))
    assert logits.shape == (3, spec.vocab_size) and np.isfinite(logits).all()
