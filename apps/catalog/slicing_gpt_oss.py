"""gpt-oss's fused experts and biased router, sliced out of a hub checkpoint into node payloads.

Pure module (no Django). transformers' GptOssExperts keeps every expert of a layer in four tensors:

    mlp.experts.gate_up_proj       [E, d_model, 2·d_ff]   x @ W: gate in the even columns, up in the odd
    mlp.experts.gate_up_proj_bias  [E, 2·d_ff]            interleaved alike
    mlp.experts.down_proj          [E, d_ff, d_model]
    mlp.experts.down_proj_bias     [E, d_model]

and openai's own checkpoints store the two weights as MXFP4 (docs/formats.md, "MXFP4") in the
[out, in] orientation: ``gate_up_proj_blocks`` u8 [E, 2·d_ff, d_model/32, 16] with ``_scales`` u8
[E, 2·d_ff, d_model/32] (output row 2i is gate i, 2i+1 is up i) and ``down_proj_blocks`` [E, d_model,
d_ff/32, 16]. Expert e is row e of each (one ranged read apiece); its gate/up rows are de-interleaved
into the payload's gate_proj / up_proj [d_ff, d_model] (down_proj [d_model, d_ff]). MXFP4 blocks are
repacked into ggml's block order without changing a value (core.quantization.mxfp4.blocks_from_hub):
the holder keeps the checkpoint's 4.25 bits per weight, and a re-run writes the same bytes.

The router, ``mlp.router.weight`` [E, d_model] and ``.bias`` [E], is the softmax router with
norm_topk_prob and a logit_bias (core.experts.gating).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import ModelShape
from apps.catalog.slice_checks import SlicingError, finite
from core.formats.expert_activation import ExpertActivation
from core.formats.expert_payload import QuantTensor
from core.quantization.mxfp4 import BLOCK_SIZE, blocks_from_hub
from core.quantization.types import GGMLType

# GptOssConfig's swiglu_alpha is not in the published config.json; transformers' default is the model's
SWIGLU_ALPHA = 1.702


@dataclass(frozen=True)
class GptOssExpert:
    """One expert as the payload encoder takes it: each weight f32 or the checkpoint's MXFP4 blocks."""

    gate: np.ndarray | QuantTensor  # [d_ff, d_model]
    up: np.ndarray | QuantTensor  # [d_ff, d_model]
    down: np.ndarray | QuantTensor  # [d_model, d_ff]
    biases: dict[str, np.ndarray]  # gate, up f32 [d_ff]; down f32 [d_model]


def experts_tensor(layer: int, name: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{name}"


def router_tensor(layer: int, name: str) -> str:
    return f"model.layers.{layer}.mlp.router.{name}"


def activation(config: dict | None) -> ExpertActivation:
    """The clamped SwiGLU of a gpt_oss config.json (swiglu_limit; transformers' default 7.0)."""
    config = config if isinstance(config, dict) else {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return ExpertActivation(kind="clamped_swiglu", alpha=float(text.get("swiglu_alpha", SWIGLU_ALPHA)),
                            limit=float(text.get("swiglu_limit", 7.0)))


def _mxfp4(reader: CheckpointReader, layer: int, name: str, expert: int, rows: int, cols: int
           ) -> np.ndarray:
    """u8 ggml MXFP4 blocks [rows, cols/32·17] of `expert` from ``<name>_blocks`` / ``<name>_scales``."""
    blocks = reader.read_u8(experts_tensor(layer, name + "_blocks"), rows=(expert, expert + 1))[0]
    scales = reader.read_u8(experts_tensor(layer, name + "_scales"), rows=(expert, expert + 1))[0]
    want = (rows, cols // BLOCK_SIZE)
    if cols % BLOCK_SIZE or blocks.shape != (*want, BLOCK_SIZE // 2) or scales.shape != want:
        raise SlicingError("shape_mismatch", f"{experts_tensor(layer, name)}_blocks/_scales of expert {expert} have "
                                             f"shapes {blocks.shape}/{scales.shape}, expected {(*want, 16)}/{want}")
    return blocks_from_hub(blocks, scales).reshape(rows, -1)


def slice_gpt_oss_expert(reader: CheckpointReader, shape: ModelShape, layer: int, expert: int) -> GptOssExpert:
    """Expert `expert` of MoE layer `layer` (checked by the caller, apps.catalog.slicing)."""
    d, ff = shape.d_model, shape.expert_d_ff
    rows = (expert, expert + 1)
    gu_bias = finite(experts_tensor(layer, "gate_up_proj_bias"),
                      reader.read_tensor(experts_tensor(layer, "gate_up_proj_bias"), rows=rows)[0])
    down_bias = finite(experts_tensor(layer, "down_proj_bias"),
                        reader.read_tensor(experts_tensor(layer, "down_proj_bias"), rows=rows)[0])
    if gu_bias.shape != (2 * ff,) or down_bias.shape != (d,):
        raise SlicingError("shape_mismatch", f"layer {layer} expert biases have shapes {gu_bias.shape} and "
                                             f"{down_bias.shape}, expected {(2 * ff,)} and {(d,)}")
    biases = {"gate": np.ascontiguousarray(gu_bias[0::2]), "up": np.ascontiguousarray(gu_bias[1::2]),
              "down": down_bias}
    if reader.has_tensor(experts_tensor(layer, "gate_up_proj_blocks")):
        gate_up = _mxfp4(reader, layer, "gate_up_proj", expert, 2 * ff, d)  # [2·d_ff, blocks]: rows interleaved
        down = _mxfp4(reader, layer, "down_proj", expert, d, ff)
        return GptOssExpert(gate=QuantTensor(GGMLType.MXFP4, (ff, d), np.ascontiguousarray(gate_up[0::2])),
                            up=QuantTensor(GGMLType.MXFP4, (ff, d), np.ascontiguousarray(gate_up[1::2])),
                            down=QuantTensor(GGMLType.MXFP4, (d, ff), down), biases=biases)
    gu_name, down_name = experts_tensor(layer, "gate_up_proj"), experts_tensor(layer, "down_proj")
    gate_up = finite(gu_name, reader.read_tensor(gu_name, rows=rows)[0])  # [d, 2·d_ff]
    down_in_out = finite(down_name, reader.read_tensor(down_name, rows=rows)[0])  # [d_ff, d]
    if gate_up.shape != (d, 2 * ff) or down_in_out.shape != (ff, d):
        raise SlicingError("shape_mismatch", f"{gu_name} / {down_name} of expert {expert} have shapes "
                                             f"{gate_up.shape} / {down_in_out.shape}, expected {(d, 2 * ff)} / "
                                             f"{(ff, d)}")
    return GptOssExpert(gate=np.ascontiguousarray(gate_up[:, 0::2].T), up=np.ascontiguousarray(gate_up[:, 1::2].T),
                        down=np.ascontiguousarray(down_in_out.T), biases=biases)


def gpt_oss_router(reader: CheckpointReader, shape: ModelShape, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight f32 [E, d_model], logit bias f32 [E]) of `layer`'s router."""
    weight = finite(router_tensor(layer, "weight"), reader.read_tensor(router_tensor(layer, "weight")))
    bias = finite(router_tensor(layer, "bias"), reader.read_tensor(router_tensor(layer, "bias")))
    if weight.shape != (shape.n_routed_experts, shape.d_model) or bias.shape != (shape.n_routed_experts,):
        raise SlicingError("shape_mismatch", f"layer {layer} router weight/bias have shapes {weight.shape}/"
                                             f"{bias.shape}, expected {(shape.n_routed_experts, shape.d_model)}/"
                                             f"{(shape.n_routed_experts,)}")
    return weight, bias


__all__ = ["GptOssExpert", "activation", "experts_tensor", "gpt_oss_router", "router_tensor", "slice_gpt_oss_expert"]
