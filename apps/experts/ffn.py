"""The SwiGLU expert forward over a resident expert: ``down(silu(gate·x) ⊙ up·x)``.

An expert payload (DESIGN.md "Expert payload") is parsed by apps.quantization.payload and
handed to the compute backend, which keeps the weights in whatever form it computes with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.experts.backends import ComputeBackend, TensorIn
from apps.experts.errors import InvalidPayload
from apps.experts.validation import check_hidden

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ResidentExpert:
    """An expert decoded into a backend's form. `nbytes` is what the memory tier budgets."""

    model_id: str
    layer: int
    expert: int
    d_model: int
    d_ff: int
    formats: dict[str, str]  # projection -> ggml_type as stored in the payload
    prepared: Any
    nbytes: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.model_id, self.layer, self.expert)


@dataclass(frozen=True)
class ExpertHeader:
    """What a payload says about an expert without decoding its weights."""

    model_id: str
    layer: int
    expert: int
    d_model: int
    d_ff: int
    formats: dict[str, str]


def parse_payload(payload: bytes) -> Any:
    """read_expert_payload with every parse failure mapped to InvalidPayload."""
    from apps.quantization.payload import PayloadError, read_expert_payload

    if not isinstance(payload, bytes | bytearray | memoryview) or len(payload) == 0:
        raise InvalidPayload("expert payload is empty or not bytes")
    try:
        return read_expert_payload(bytes(payload))
    except (PayloadError, ValueError, KeyError, TypeError) as exc:
        raise InvalidPayload(f"expert payload could not be parsed: {exc}") from exc


def _projection(parsed: Any, name: str) -> TensorIn:
    tensors = parsed.tensors
    tensor = tensors.get(f"{name}.weight", tensors.get(name))
    if tensor is None:
        raise InvalidPayload(f"expert payload lacks {name}.weight (found {sorted(tensors)})")
    ggml_type = getattr(tensor.ggml_type, "value", tensor.ggml_type)
    shape = tuple(int(s) for s in tensor.shape)
    if len(shape) != 2:
        raise InvalidPayload(f"{name}.weight must be 2-D, received shape {shape}")
    return TensorIn(ggml_type=str(ggml_type), shape=(shape[0], shape[1]), data=tensor.data)


def read_header(parsed: Any) -> tuple[ExpertHeader, dict[str, TensorIn]]:
    """Check the three projections agree: gate/up [d_ff, d_model], down [d_model, d_ff]."""
    tensors = {name: _projection(parsed, name) for name in PROJECTIONS}
    d_ff, d_model = tensors["gate_proj"].shape
    expected = {"gate_proj": (d_ff, d_model), "up_proj": (d_ff, d_model), "down_proj": (d_model, d_ff)}
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise InvalidPayload(f"{name}.weight has shape {tensors[name].shape}, expected {shape}")
    try:
        layer, expert = int(parsed.layer), int(parsed.expert)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"expert payload layer/expert must be integers: {exc}") from exc
    if not parsed.model_id or layer < 0 or expert < 0:
        raise InvalidPayload(
            f"expert payload needs model_id, layer >= 0, expert >= 0; received "
            f"{parsed.model_id!r}, {layer}, {expert}"
        )
    header = ExpertHeader(
        model_id=str(parsed.model_id), layer=layer, expert=expert, d_model=d_model, d_ff=d_ff,
        formats={name: t.ggml_type for name, t in tensors.items()},
    )
    return header, tensors


def build_expert(payload: bytes, backend: ComputeBackend) -> ResidentExpert:
    """Decode an expert payload into a backend-resident expert (raises InvalidPayload)."""
    return build_expert_from(*read_header(parse_payload(payload)), backend)


def build_expert_from(header: ExpertHeader, tensors: dict[str, TensorIn], backend: ComputeBackend) -> ResidentExpert:
    """A backend-resident expert from an already parsed and checked payload."""
    prepared = backend.prepare_expert(tensors["gate_proj"], tensors["up_proj"], tensors["down_proj"])
    return ResidentExpert(
        model_id=header.model_id, layer=header.layer, expert=header.expert,
        d_model=header.d_model, d_ff=header.d_ff, formats=header.formats,
        prepared=prepared, nbytes=int(prepared.nbytes),
    )


def expert_forward(expert: ResidentExpert, hidden: np.ndarray, backend: ComputeBackend) -> np.ndarray:
    """hidden f32 [t, d_model] -> f32 [t, d_model]; raises ShapeMismatch / NonFiniteInput."""
    x = check_hidden(hidden, expert.d_model)
    if x.shape[0] == 0:
        return np.zeros((0, expert.d_model), dtype=np.float32)
    return backend.forward(expert.prepared, x)
