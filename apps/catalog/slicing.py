"""Slice one layer's experts and gate out of a checkpoint into node payloads.

Pure module (no Django). The inputs are a CheckpointReader (ranged reads) and a ModelShape;
the outputs are the byte-exact payloads of docs/formats.md: the gate payload
(core.formats.gate_payload) and one expert payload per expert
(core.formats.expert_payload). Deterministic: the same checkpoint, shape, layer, experts and
quant give byte-identical payloads, so a re-run prepare job publishes the same hashes.

Shared experts (DeepSeek layout) are expert ids n_routed … n_routed+n_shared-1. The
checkpoint fuses them into one ``shared_experts`` MLP of width n_shared × d_ff; SwiGLU is
separable along d_ff, so shared expert s is rows [s·w, (s+1)·w) of gate_proj and up_proj
and the same columns of down_proj (w = fused width / n_shared)::

    y = down · (silu(gate·x) ⊙ up·x) = Σ_s down[:, s] · (silu(gate[s]·x) ⊙ up[s]·x)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import ModelShape
from apps.catalog.slice_checks import SlicingError, finite
from apps.catalog.slicing_gpt_oss import activation as gpt_oss_activation
from apps.catalog.slicing_gpt_oss import gpt_oss_router, slice_gpt_oss_expert
from core.formats.expert_payload import encode_expert_payload, read_expert_payload
from core.formats.gate_payload import encode_gate_payload
from core.quantization.presets import PROJECTIONS, TENSOR_NAMES

# --- hub tensor names --------------------------------------------------------------------------


def expert_tensor(layer: int, expert: int, proj: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}_proj.weight"


def gate_tensor(layer: int) -> str:
    return f"model.layers.{layer}.mlp.gate.weight"


def gate_bias_tensor(layer: int) -> str:
    return f"model.layers.{layer}.mlp.gate.e_score_correction_bias"


def shared_tensor(layer: int, proj: str) -> str:
    return f"model.layers.{layer}.mlp.shared_experts.{proj}_proj.weight"


def qwen2_shared_tensor(layer: int, proj: str) -> str:
    return f"model.layers.{layer}.mlp.shared_expert.{proj}_proj.weight"


# --- checks ------------------------------------------------------------------------------------


def _require(shape: ModelShape, *fields: str) -> None:
    missing = [f for f in fields if getattr(shape, f) is None]
    if missing:
        raise SlicingError("shape_incomplete", f"{shape.model_id}: shape fields {missing} are unknown; read the "
                                               "shape from the checkpoint's config.json (shape_from_config)")


def _check_layer(shape: ModelShape, layer: int) -> None:
    _require(shape, "checkpoint_layout")
    if shape.checkpoint_layout not in ("qwen_moe", "qwen2_moe", "deepseek", "gpt_oss"):
        raise SlicingError("unsupported_layout", f"{shape.model_id}: checkpoint layout {shape.checkpoint_layout!r} "
                                                 "is not sliceable (per-expert or gpt-oss fused hub tensors required)")
    _require(shape, "n_routed_experts", "n_active", "moe_layers", "router")
    if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or not shape.is_moe_layer(int(layer)):
        raise SlicingError("layer_not_moe", f"{shape.model_id}: layer {layer!r} is not an MoE layer "
                                            f"({shape.moe_layer_rule}, {shape.n_layers} layers); a dense layer "
                                            "is prepared as d_ff slices (dense_slices)")


def _check_expert(shape: ModelShape, layer: int, expert: int) -> None:
    _check_layer(shape, layer)
    n_routed, n_shared = shape.n_routed_experts, shape.n_shared_experts or 0
    if isinstance(expert, bool) or not isinstance(expert, int | np.integer) or not 0 <= expert < n_routed + n_shared:
        total = n_routed + n_shared
        raise SlicingError("expert_out_of_range", f"{shape.model_id}: expert {expert!r} outside 0..{total - 1} "
                                                  f"({n_routed} routed + {n_shared} shared)")


def _check_dims(shape: ModelShape, name: str, w: np.ndarray, want: tuple[int | None, int | None]) -> None:
    if w.ndim != 2 or any(x is not None and x != g for x, g in zip(want, w.shape, strict=True)):
        raise SlicingError("shape_mismatch", f"{name} has shape {w.shape}, expected {want} for {shape.model_id}")


# --- slices ------------------------------------------------------------------------------------


def slice_expert(reader: CheckpointReader, shape: ModelShape, layer: int, expert: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gate [d_ff, d_model], up [d_ff, d_model], down [d_model, d_ff]) f32 of one expert.

    Precondition: `layer` is an MoE layer of `shape`; `expert` in 0 … n_routed+n_shared-1.
    Only the bytes of that expert are read (for a shared expert: its rows of the fused
    gate/up, and the fused down, whose columns are not contiguous).
    """
    _check_expert(shape, layer, expert)
    if shape.checkpoint_layout == "gpt_oss":
        raise SlicingError("unsupported_layout", f"{shape.model_id}: gpt-oss experts carry biases and may be MXFP4 "
                                                 "blocks; slice them with slice_gpt_oss_expert")
    n_routed, n_shared = shape.n_routed_experts, shape.n_shared_experts or 0
    expert = int(expert)
    d_model, d_ff = shape.d_model, shape.expert_d_ff
    if expert < n_routed:
        names = [expert_tensor(layer, expert, p) for p in PROJECTIONS]
        gate, up, down = (finite(n, reader.read_tensor(n)) for n in names)
        _check_dims(shape, names[0], gate, (d_ff, d_model))
        _check_dims(shape, names[1], up, gate.shape)
        _check_dims(shape, names[2], down, (gate.shape[1], gate.shape[0]))
        return gate, up, down
    if shape.checkpoint_layout == "qwen2_moe":
        raise SlicingError("unsupported_layout", f"{shape.model_id}: Qwen2-MoE's shared_expert is scaled per token by "
                                                 "sigmoid(shared_expert_gate·x), which a weight-1.0 shared slot "
                                                 "cannot express; only routed experts are sliceable")
    s = expert - n_routed
    names = [shared_tensor(layer, p) for p in PROJECTIONS]
    fused_rows = reader.tensor_info(names[0]).shape[0]
    if fused_rows % n_shared:
        raise SlicingError("shape_mismatch", f"{names[0]} has {fused_rows} rows, not divisible into {n_shared} "
                                             "shared experts")
    w = fused_rows // n_shared
    gate = finite(names[0], reader.read_tensor(names[0], rows=(s * w, (s + 1) * w)))
    up = finite(names[1], reader.read_tensor(names[1], rows=(s * w, (s + 1) * w)))
    down_full = finite(names[2], reader.read_tensor(names[2]))
    _check_dims(shape, names[0], gate, (d_ff, d_model))
    _check_dims(shape, names[1], up, gate.shape)
    _check_dims(shape, names[2], down_full, (gate.shape[1], fused_rows))
    down = np.ascontiguousarray(down_full[:, s * w:(s + 1) * w])
    return gate, up, down


def gate_payload_for_layer(reader: CheckpointReader, shape: ModelShape, layer: int, *,
                           model_id: str | None = None) -> bytes:
    """The gate payload (docs/formats.md) of `layer`: router weight, bias and scaling metadata."""
    _check_layer(shape, layer)
    if shape.checkpoint_layout == "qwen2_moe" and (shape.n_shared_experts or 0) > 0:
        raise SlicingError("unsupported_layout", f"{shape.model_id}: Qwen2-MoE's sigmoid-gated shared_expert "
                                                 "cannot ride as a weight-1.0 slot in the gate payload")
    if shape.checkpoint_layout == "gpt_oss":
        weight, logit_bias = gpt_oss_router(reader, shape, layer)
        return encode_gate_payload(model_id=model_id or shape.model_id, layer=layer, weight=weight, router="softmax",
                                   top_k=shape.n_active, norm_topk_prob=True, logit_bias=logit_bias)
    name = gate_tensor(layer)
    weight = finite(name, reader.read_tensor(name))
    _check_dims(shape, name, weight, (shape.n_routed_experts, shape.d_model))
    bias = None
    if shape.router == "sigmoid":
        _require(shape, "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob")
        bname = gate_bias_tensor(layer)
        if reader.has_tensor(bname):
            bias = finite(bname, reader.read_tensor(bname))
            if bias.shape != (shape.n_routed_experts,):
                raise SlicingError("shape_mismatch", f"{bname} has shape {bias.shape}, expected "
                                                     f"({shape.n_routed_experts},)")
    return encode_gate_payload(
        model_id=model_id or shape.model_id, layer=layer, weight=weight, router=shape.router,
        top_k=shape.n_active, norm_topk_prob=bool(shape.norm_topk_prob),
        routed_scaling_factor=1.0 if shape.routed_scaling_factor is None else shape.routed_scaling_factor,
        n_group=shape.n_group or 1, topk_group=shape.topk_group or 1,
        n_shared_experts=shape.n_shared_experts or 0, e_score_correction_bias=bias,
    )


@dataclass(frozen=True)
class PreparedLayer:
    """One prepared layer: the gate payload and, per expert id (ascending), its payload and formats."""

    model_id: str
    layer: int
    quant: str | Mapping[str, str] | None
    gate_payload: bytes
    experts: dict[int, bytes] = field(default_factory=dict)
    formats: dict[int, dict[str, str]] = field(default_factory=dict)  # expert -> {gate|up|down: ggml_type used}
    bytes_read: int = 0  # checkpoint bytes fetched for this layer


def prepare_expert(reader: CheckpointReader, shape: ModelShape, *, model_id: str, layer: int, expert: int,
                   quant: str | Mapping[str, str] | None) -> tuple[bytes, dict[str, str]]:
    """Slice, quantize and encode one expert -> (payload bytes, {gate|up|down: ggml_type used}).

    A gpt-oss expert keeps its biases and clamped SwiGLU; its MXFP4 blocks are kept as they are
    (`quant` applies to the projections the checkpoint stores dense)."""
    if shape.checkpoint_layout == "gpt_oss":
        _check_expert(shape, layer, expert)
        e = slice_gpt_oss_expert(reader, shape, int(layer), int(expert))
        data = encode_expert_payload(gate=e.gate, up=e.up, down=e.down, quant=quant, model_id=model_id, layer=layer,
                                     expert=expert, biases=e.biases, activation=gpt_oss_activation(reader.config))
    else:
        g, u, d = slice_expert(reader, shape, layer, expert)
        data = encode_expert_payload(gate=g, up=u, down=d, quant=quant, model_id=model_id, layer=layer, expert=expert)
    parsed = read_expert_payload(data)
    return data, {p: parsed.tensors[TENSOR_NAMES[p]].ggml_type.value for p in PROJECTIONS}


def prepare_layer(reader: CheckpointReader, shape: ModelShape, *, model_id: str, layer: int,
                  experts: Iterable[int], quant: str | Mapping[str, str] | None,
                  on_progress: Callable[[int, int, int], None] | None = None) -> PreparedLayer:
    """Slice, quantize and encode `experts` of `layer` plus the layer's gate.

    Experts are processed in ascending id order (duplicates dropped); `on_progress(done,
    total, expert)` is called after each. Raises SlicingError / CheckpointError /
    PayloadError; nothing is returned partially.
    """
    wanted = sorted(set(experts))
    if not wanted:
        raise SlicingError("expert_out_of_range", "no experts requested")
    before = reader.bytes_read
    gate = gate_payload_for_layer(reader, shape, layer, model_id=model_id)
    payloads: dict[int, bytes] = {}
    formats: dict[int, dict[str, str]] = {}
    for done, expert in enumerate(wanted, start=1):
        payloads[expert], formats[expert] = prepare_expert(reader, shape, model_id=model_id, layer=layer,
                                                           expert=expert, quant=quant)
        if on_progress is not None:
            on_progress(done, len(wanted), expert)
    return PreparedLayer(model_id=model_id, layer=layer, quant=quant, gate_payload=gate, experts=payloads,
                         formats=formats, bytes_read=reader.bytes_read - before)


__all__ = ["PreparedLayer", "SlicingError", "expert_tensor", "gate_bias_tensor", "gate_payload_for_layer",
           "gate_tensor", "prepare_expert", "prepare_layer", "qwen2_shared_tensor", "shared_tensor", "slice_expert"]
