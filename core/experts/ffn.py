"""The SwiGLU expert forward over a resident expert: ``down(silu(gate·x) ⊙ up·x)``.

An expert payload (docs/formats.md, "Expert payload") is parsed by core.formats.expert_payload and
handed to the compute backend, which keeps the weights in whatever form it computes with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from core.experts.backends import ComputeBackend, TensorIn
from core.experts.errors import InvalidPayload
from core.experts.validation import check_hidden
from core.formats.expert_activation import SILU, ExpertActivation
from core.quantization.presets import TENSOR_NAMES

if TYPE_CHECKING:  # the payload reader pulls in the codecs (and numba): imported where used
    from core.formats.expert_payload import ExpertPayload

# The projection names come from the payload format: "gate" -> "gate_proj.weight". Experts and
# their `formats` are keyed by the tensor name without ".weight" ("gate_proj"; docs/protocol.md).
FORMAT_KEYS = {p: name.removesuffix(".weight") for p, name in TENSOR_NAMES.items()}


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
    activation: str = "silu"

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
    activation: ExpertActivation = SILU
    biases: dict[str, np.ndarray] = field(default_factory=dict)  # {} or gate/up [d_ff], down [d_model]


def parse_payload(payload: bytes) -> ExpertPayload:
    """read_expert_payload with every parse failure mapped to InvalidPayload."""
    from core.formats.expert_payload import PayloadError, read_expert_payload

    if not isinstance(payload, bytes | bytearray | memoryview) or len(payload) == 0:
        raise InvalidPayload("expert payload is empty or not bytes")
    try:
        return read_expert_payload(bytes(payload))
    except (PayloadError, ValueError, KeyError, TypeError) as exc:
        raise InvalidPayload(f"expert payload could not be parsed: {exc}") from exc


def read_header(parsed: ExpertPayload) -> tuple[ExpertHeader, dict[str, TensorIn]]:
    """The header and the three projections (keyed "gate_proj", "up_proj", "down_proj") of a
    parsed payload, with gate/up [d_ff, d_model] and down [d_model, d_ff] checked by
    core.formats.expert_payload.expert_dims (raises InvalidPayload)."""
    from core.formats.expert_payload import PayloadError, expert_dims

    try:
        stored = {p: parsed.tensors[name] for p, name in TENSOR_NAMES.items()}
        d_ff, d_model = expert_dims({p: t.shape for p, t in stored.items()})
    except KeyError as exc:
        raise InvalidPayload(f"expert payload lacks {exc} (found {sorted(parsed.tensors)})") from exc
    except PayloadError as exc:
        raise InvalidPayload(str(exc)) from exc
    tensors = {FORMAT_KEYS[p]: TensorIn(ggml_type=t.ggml_type.value, shape=(int(t.shape[0]), int(t.shape[1])),
                                        data=t.data) for p, t in stored.items()}
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
        activation=parsed.activation, biases=dict(parsed.biases),
    )
    return header, tensors


def build_expert(payload: bytes, backend: ComputeBackend) -> ResidentExpert:
    """Decode an expert payload into a backend-resident expert (raises InvalidPayload)."""
    return build_expert_from(*read_header(parse_payload(payload)), backend)


def build_expert_from(header: ExpertHeader, tensors: dict[str, TensorIn], backend: ComputeBackend) -> ResidentExpert:
    """A backend-resident expert from an already parsed and checked payload. InvalidPayload for an
    activation or biases the backend does not run (see core.experts.backends.ComputeBackend)."""
    extra: dict[str, Any] = {}
    if header.activation.kind != "silu" or header.biases:
        runs = getattr(backend, "activations", ("silu",))
        if header.activation.kind not in runs or (header.biases and not getattr(backend, "biases", False)):
            what = header.activation.kind + (" with biases" if header.biases else "")
            able = "with or without biases" if getattr(backend, "biases", False) else "without biases"
            raise InvalidPayload(f"the {backend.name} backend cannot run this expert: activation {what} "
                                 f"(it runs {', '.join(runs)} experts {able})")
        extra = {"activation": header.activation, "biases": header.biases}
    prepared = backend.prepare_expert(tensors["gate_proj"], tensors["up_proj"], tensors["down_proj"], **extra)
    return ResidentExpert(
        model_id=header.model_id, layer=header.layer, expert=header.expert,
        d_model=header.d_model, d_ff=header.d_ff, formats=header.formats,
        prepared=prepared, nbytes=int(prepared.nbytes), activation=header.activation.kind,
    )


def expert_forward(expert: ResidentExpert, hidden: np.ndarray, backend: ComputeBackend) -> np.ndarray:
    """hidden f32 [t, d_model] -> f32 [t, d_model]; raises ShapeMismatch / NonFiniteInput."""
    x = check_hidden(hidden, expert.d_model)
    if x.shape[0] == 0:
        return np.zeros((0, expert.d_model), dtype=np.float32)
    return backend.forward(expert.prepared, x)
