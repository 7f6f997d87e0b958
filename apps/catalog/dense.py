"""Slice a dense (non-MoE) SwiGLU layer of a checkpoint into d_ff slices held like experts.

Pure module (no Django). A dense layer's MLP is ``model.layers.{L}.mlp.{gate,up,down}_proj.weight``
(DeepSeek-V3's first_k_dense_replace layers, Qwen3-MoE's mlp_only_layers, any Llama-style
model). SwiGLU is separable along d_ff, so slice s — d_ff rows [a, b) of gate_proj and up_proj
and the same columns of down_proj — is an ordinary expert payload, and the layer's output is
the sum of the slices' outputs::

    gate, up [d_ff, d_model]        down [d_model, d_ff]
    +---------+ a                   +----+-----+----+
    | slice 0 |                     | s0 | s1  | s2 |   columns [a, b) of each row:
    +---------+ b                   |    |     |    |   not contiguous, read in row chunks
    | slice 1 |                     +----+-----+----+
    +---------+
    | slice 2 |
    +---------+

The slices are published as experts (model, L, 0 … n-1) with a dense gate
(core.formats.gate_payload: router "dense"), whose route sends every token to every slice with
weight 1.0. The cut is `dense_slice_bounds` aligned to the block of the down projection's
requested quant type (its rows run along d_ff): every slice but the last keeps whole blocks,
and the last falls back (types.resolve_type) only when the block does not divide d_ff itself.
Deterministic: the same checkpoint, layer, slice count and quant give byte-identical payloads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from apps.catalog.checkpoint import FP8_BLOCK, CheckpointReader
from apps.catalog.shapes import ModelShape
from apps.catalog.slicing import PreparedLayer, SlicingError, expert_tensor, gate_tensor
from core.formats.expert_payload import encode_expert_payload, read_expert_payload
from core.formats.gate_payload import (
    MAX_DENSE_SLICES,
    dense_slice_bounds,
    encode_dense_gate_payload,
    max_dense_slices,
)
from core.quantization.presets import PROJECTIONS, TENSOR_NAMES, resolve_quant

# Rows of down_proj per ranged read: a multiple of DeepSeek's 128-row FP8 scale blocks, so no
# scale row is fetched twice; 512 rows of an 18,432-wide layer are ~9 MB of FP8 (~38 MB as f32).
DOWN_CHUNK_ROWS = 4 * FP8_BLOCK


def dense_tensor(layer: int, proj: str) -> str:
    return f"model.layers.{layer}.mlp.{proj}_proj.weight"


@dataclass(frozen=True)
class DenseLayer:
    """One dense layer as it will be cut: slice s holds d_ff rows ``bounds[s]``."""

    layer: int
    d_model: int
    d_ff: int
    slice_align: int
    bounds: tuple[tuple[int, int], ...]

    @property
    def n_slices(self) -> int:
        return len(self.bounds)


def slice_alignment(quant: str | Mapping[str, str] | None) -> int:
    """Rows per block of the down projection's requested type (1 for F32/F16/BF16)."""
    try:
        return resolve_quant(quant)["down"].block_size
    except ValueError as exc:
        raise SlicingError("invalid_quant", f"invalid quant: {exc}") from exc


def dense_layer(reader: CheckpointReader, shape: ModelShape | None, layer: int, *, n_slices: int,
                quant: str | Mapping[str, str] | None) -> DenseLayer:
    """Check that `layer` is a dense SwiGLU layer that cuts into `n_slices`, and say how.

    `shape` (from config.json or the catalog) may be None for a model with no MoE shape (a
    Llama): then only the tensor names decide. Reads the safetensors headers, no weights.
    SlicingError reasons: dense_slices_out_of_range, layer_is_moe, layer_not_dense,
    shape_mismatch, invalid_quant.
    """
    if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or layer < 0:
        raise SlicingError("layer_not_dense", f"layer must be a non-negative integer, received {layer!r}")
    layer = int(layer)
    if isinstance(n_slices, bool) or not isinstance(n_slices, int | np.integer) \
            or not 1 <= n_slices <= MAX_DENSE_SLICES:
        raise SlicingError("dense_slices_out_of_range",
                           f"dense_slices must be an integer in 1..{MAX_DENSE_SLICES}, received {n_slices!r}")
    model = shape.model_id if shape is not None else "the checkpoint"
    moe_by_shape = shape is not None and shape.moe_layers is not None and layer in shape.moe_layers
    if moe_by_shape or reader.has_tensor(gate_tensor(layer)) or reader.has_tensor(expert_tensor(layer, 0, "gate")):
        rule = f" ({shape.moe_layer_rule})" if moe_by_shape and shape.moe_layer_rule else ""
        raise SlicingError("layer_is_moe", f"{model}: layer {layer} is an MoE layer{rule}; its experts are "
                                           "prepared by id (experts), not cut into dense slices")
    names = [dense_tensor(layer, p) for p in PROJECTIONS]
    if not reader.has_tensor(names[0]):
        n_layers = f" of {shape.n_layers}" if shape is not None and shape.n_layers is not None else ""
        raise SlicingError("layer_not_dense", f"{model}: layer {layer}{n_layers} has no dense MLP "
                                              f"({names[0]!r} is not in the checkpoint)")
    gate, up, down = (reader.tensor_info(n) for n in names)
    if len(gate.shape) != 2 or 0 in gate.shape:
        raise SlicingError("shape_mismatch", f"{names[0]} has shape {gate.shape}, expected [d_ff, d_model]")
    d_ff, d_model = gate.shape
    for name, info, want in ((names[1], up, (d_ff, d_model)), (names[2], down, (d_model, d_ff))):
        if info.shape != want:
            raise SlicingError("shape_mismatch", f"{name} has shape {info.shape}, expected {want} from "
                                                 f"{names[0]} {gate.shape}")
    if shape is not None and shape.d_model is not None and shape.d_model != d_model:
        raise SlicingError("shape_mismatch", f"{names[0]} has d_model {d_model}, the shape of {model} says "
                                             f"{shape.d_model}")
    align = slice_alignment(quant)
    limit = max_dense_slices(d_ff, align)
    if n_slices > limit:
        down_type = resolve_quant(quant)["down"].value
        raise SlicingError("dense_slices_out_of_range",
                           f"{model}: layer {layer} has d_ff {d_ff}; cut on {down_type}'s {align}-row blocks (the "
                           f"down projection's rows run along d_ff) it gives at most {limit} non-empty slices, "
                           f"asked for {n_slices}; ask for fewer, or a down type with smaller blocks")
    return DenseLayer(layer=layer, d_model=int(d_model), d_ff=int(d_ff), slice_align=align,
                      bounds=tuple(dense_slice_bounds(int(d_ff), int(n_slices), align)))


def dense_gate_payload(dense: DenseLayer, *, model_id: str) -> bytes:
    """The dense gate of the layer: every token to slices 0 … n-1, weight 1.0."""
    return encode_dense_gate_payload(model_id=model_id, layer=dense.layer, d_model=dense.d_model, d_ff=dense.d_ff,
                                     n_slices=dense.n_slices, slice_align=dense.slice_align)


def _finite(name: str, w: np.ndarray) -> np.ndarray:
    if not np.isfinite(w).all():
        raise SlicingError("non_finite", f"{name} holds {int((~np.isfinite(w)).sum())} NaN/inf value(s)")
    return w


def slice_dense(reader: CheckpointReader, dense: DenseLayer, slice_id: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gate [w, d_model], up [w, d_model], down [d_model, w]) f32 of slice `slice_id` (w = b - a).

    Reads gate/up rows [a, b) only; down's columns [a, b) are not contiguous, so down is read
    whole, DOWN_CHUNK_ROWS rows at a time (memory stays one chunk plus the slice).
    """
    if isinstance(slice_id, bool) or not isinstance(slice_id, int | np.integer) \
            or not 0 <= slice_id < dense.n_slices:
        raise SlicingError("expert_out_of_range", f"slice {slice_id!r} outside 0..{dense.n_slices - 1}")
    a, b = dense.bounds[int(slice_id)]
    names = [dense_tensor(dense.layer, p) for p in PROJECTIONS]
    gate = _finite(names[0], reader.read_tensor(names[0], rows=(a, b)))
    up = _finite(names[1], reader.read_tensor(names[1], rows=(a, b)))
    down = np.empty((dense.d_model, b - a), dtype=np.float32)
    for r0 in range(0, dense.d_model, DOWN_CHUNK_ROWS):
        r1 = min(r0 + DOWN_CHUNK_ROWS, dense.d_model)
        down[r0:r1] = _finite(names[2], reader.read_tensor(names[2], rows=(r0, r1)))[:, a:b]
    return gate, up, down


def prepare_dense_slice(reader: CheckpointReader, dense: DenseLayer, *, model_id: str, slice_id: int,
                        quant: str | Mapping[str, str] | None) -> tuple[bytes, dict[str, str]]:
    """Slice, quantize and encode one slice as expert `slice_id` -> (payload, {gate|up|down: type used})."""
    g, u, d = slice_dense(reader, dense, slice_id)
    data = encode_expert_payload(gate=g, up=u, down=d, quant=quant, model_id=model_id, layer=dense.layer,
                                 expert=int(slice_id))
    parsed = read_expert_payload(data)
    return data, {p: parsed.tensors[TENSOR_NAMES[p]].ggml_type.value for p in PROJECTIONS}


def prepare_dense_layer(reader: CheckpointReader, shape: ModelShape | None, *, model_id: str, layer: int,
                        n_slices: int, quant: str | Mapping[str, str] | None, slices: Iterable[int] | None = None,
                        on_progress: Callable[[int, int, int], None] | None = None) -> PreparedLayer:
    """The dense gate plus `slices` (default all, ascending, duplicates dropped) of `layer`.

    `on_progress(done, total, slice_id)` after each slice. Raises SlicingError /
    CheckpointError / PayloadError; nothing is returned partially.
    """
    before = reader.bytes_read
    dense = dense_layer(reader, shape, layer, n_slices=n_slices, quant=quant)
    wanted = sorted(set(range(dense.n_slices) if slices is None else slices))
    outside = [s for s in wanted if not 0 <= s < dense.n_slices]
    if not wanted or outside:
        raise SlicingError("expert_out_of_range", f"slices must be a non-empty subset of 0..{dense.n_slices - 1}, "
                                                  f"received {wanted}")
    gate = dense_gate_payload(dense, model_id=model_id)
    payloads: dict[int, bytes] = {}
    formats: dict[int, dict[str, str]] = {}
    for done, s in enumerate(wanted, start=1):
        payloads[s], formats[s] = prepare_dense_slice(reader, dense, model_id=model_id, slice_id=s, quant=quant)
        if on_progress is not None:
            on_progress(done, len(wanted), s)
    return PreparedLayer(model_id=model_id, layer=dense.layer, quant=quant, gate_payload=gate, experts=payloads,
                         formats=formats, bytes_read=reader.bytes_read - before)


__all__ = ["DOWN_CHUNK_ROWS", "DenseLayer", "dense_gate_payload", "dense_layer", "dense_tensor",
           "prepare_dense_layer", "prepare_dense_slice", "slice_alignment", "slice_dense"]
