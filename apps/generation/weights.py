"""The non-expert tensors of a whole model, read from a checkpoint with ranged reads.

Pure module (no Django). The router of a generation holds these in memory (embeddings, attention,
norms, the dense layers' MLPs, the final norm and the LM head); the MoE layers' gates, routed experts
and shared experts are held by the network and are never read here.

Loading refuses before reading any tensor data: every name's header entry is looked up first (shape
checked against the spec), and the f32 bytes it would keep are compared with `max_bytes`, so an
operator learns "this model's dense part needs 14 GB" without waiting for 14 GB to download.
Tensors are decoded by CheckpointReader.read_tensor (BF16/F16 widened, F8_E4M3 multiplied by its
``weight_scale_inv`` blocks, exactly as the experts' prepare path decodes them) and kept as f32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from apps.catalog.checkpoint import CheckpointReader, TensorInfo
from apps.generation.attention import attention_tensor_shapes
from apps.generation.spec import TransformerSpec
from core.errors import TenzroError

F32_BYTES = 4


class DenseLoadError(TenzroError, ValueError):
    """The dense part cannot be loaded: ``reason`` over_budget, shape_mismatch or non_finite."""

    reason = "shape_mismatch"


def dense_tensor_shapes(spec: TransformerSpec) -> dict[str, tuple[int, ...]]:
    """{hub name: shape} of every non-expert tensor `spec` needs, in model order."""
    d = spec.d_model
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, d)}
    for layer in range(spec.n_layers):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = (d,)
        out |= attention_tensor_shapes(spec, layer)
        out[p + "post_attention_layernorm.weight"] = (d,)
        if not spec.is_moe(layer):
            ff = spec.dense_d_ff
            out |= {p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                    p + "mlp.down_proj.weight": (d, ff)}
    out["model.norm.weight"] = (d,)
    if not spec.tie_word_embeddings:
        out["lm_head.weight"] = (spec.vocab_size, d)
    return out


def dense_tensor_names(spec: TransformerSpec) -> list[str]:
    """Every non-expert tensor the model needs; never a MoE gate, routed expert or shared expert."""
    return list(dense_tensor_shapes(spec))


@dataclass
class DenseWeights:
    """f32 C-contiguous tensors keyed by hub name; exactly dense_tensor_names(spec)."""

    spec: TransformerSpec
    tensors: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _infos(reader: CheckpointReader, spec: TransformerSpec) -> list[tuple[TensorInfo, tuple[int, ...]]]:
    """Header entries of every dense tensor (reads headers only), shapes checked against the spec."""
    out = []
    for name, want in dense_tensor_shapes(spec).items():
        info = reader.tensor_info(name)  # CheckpointError tensor_missing names it
        if tuple(info.shape) != want:
            raise DenseLoadError(f"{name} has shape {list(info.shape)} in the checkpoint, the config of "
                                 f"{spec.model_id} implies {list(want)}", reason="shape_mismatch")
        out.append((info, want))
    return out


def dense_bytes(reader: CheckpointReader, spec: TransformerSpec) -> int:
    """f32 bytes load_dense_weights would keep, from the safetensors headers only."""
    return sum(int(np.prod(want, dtype=np.int64)) * F32_BYTES for _, want in _infos(reader, spec))


def load_dense_weights(reader: CheckpointReader, spec: TransformerSpec, *, max_bytes: int | None = None,
                       progress: Callable[[int, int], None] | None = None) -> DenseWeights:
    """Read and decode every dense tensor of `spec` from `reader`.

    Raises DenseLoadError "over_budget" (before any tensor data is read) when the f32 total exceeds
    `max_bytes`; "shape_mismatch" or "non_finite" naming the tensor; CheckpointError from the reader.
    `progress(done, total)` is called after each tensor.
    """
    infos = _infos(reader, spec)
    need = sum(int(np.prod(want, dtype=np.int64)) * F32_BYTES for _, want in infos)
    if max_bytes is not None and need > max_bytes:
        raise DenseLoadError(f"the dense part of {spec.model_id} needs {need:,} bytes as f32, over the budget of "
                             f"{max_bytes:,} bytes", reason="over_budget", need_bytes=need, max_bytes=max_bytes)
    tensors: dict[str, np.ndarray] = {}
    for done, (info, want) in enumerate(infos, start=1):
        value = np.ascontiguousarray(reader.read_tensor(info.name), dtype=np.float32)
        if value.shape != want:  # read_tensor keeps the header's shape; a defensive check, cheap
            raise DenseLoadError(f"{info.name} decoded to shape {list(value.shape)}, expected {list(want)}",
                                 reason="shape_mismatch")
        if not np.isfinite(value).all():
            raise DenseLoadError(f"{info.name} holds {int((~np.isfinite(value)).sum())} NaN/inf value(s)",
                                 reason="non_finite")
        tensors[info.name] = value
        if progress is not None:
            progress(done, len(infos))
    return DenseWeights(spec=spec, tensors=tensors)


__all__ = ["DenseLoadError", "DenseWeights", "dense_bytes", "dense_tensor_names", "dense_tensor_shapes",
           "load_dense_weights"]
