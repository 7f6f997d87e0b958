"""The generation fixtures (tests/fixtures/generation, made by scripts/make_generation_fixtures.py) opened
with the project's own prepare path: the experts and gates of every MoE layer sliced at F32 and loaded
into an ExpertRuntime, whose forward_local is the MoE callback of the whole-model forward."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import prepare_layer
from apps.generation.model import WholeModel
from apps.generation.spec import spec_from_config
from apps.generation.weights import load_dense_weights
from core.experts.backends import CpuBackend
from core.experts.runtime import ExpertRuntime

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "generation"
NAMES = ("qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss", "gpt_oss_mxfp4")
SHARDED = ("glm4_moe", "gpt_oss", "gpt_oss_mxfp4")  # hub-sharded, with a model.safetensors.index.json


def fixture_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of a fixture folder, read with safetensors itself (not the node's reader): from its one
    model.safetensors, or from every shard its index names."""
    index = folder / "model.safetensors.index.json"
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    tensors: dict[str, np.ndarray] = {}
    for name in sorted(files):
        tensors.update(load_file(str(folder / name)))
    return tensors


@dataclass
class Fixture:
    name: str
    folder: Path
    model: WholeModel
    runtime: ExpertRuntime
    expected: dict
    logits: np.ndarray  # f32 [prompt_len, vocab] from transformers
    calls: list[tuple[int, tuple[int, ...]]]  # (layer, x.shape) of every MoE call, for protocol tests

    def moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        self.calls.append((layer, x.shape))
        return self.runtime.forward_local(model_id=self.name, layer=layer, hidden=x)


@pytest.fixture(scope="session", params=NAMES)
def fixture(request, tmp_path_factory) -> Fixture:
    name = request.param
    folder = FIXTURES / name
    with CheckpointReader.open(folder) as reader:
        shape = shape_from_config(name, reader.config)
        spec = spec_from_config(reader.config, model_id=name)
        runtime = ExpertRuntime(data_dir=tmp_path_factory.mktemp(name), memory_budget_bytes=64 << 20,
                                backend=CpuBackend(use_numba=False))
        for layer in shape.moe_layers:
            prepared = prepare_layer(reader, shape, model_id=name, layer=layer,
                                     experts=range(shape.n_experts_total), quant="F32")
            runtime.gate_load(payload=prepared.gate_payload)
            for payload in prepared.experts.values():
                runtime.expert_load(payload=payload)
        weights = load_dense_weights(reader, spec)
    expected = json.loads((folder / "expected.json").read_text())
    return Fixture(name=name, folder=folder, model=WholeModel(weights), runtime=runtime, expected=expected,
                   logits=np.load(folder / expected["logits_file"]), calls=[])
