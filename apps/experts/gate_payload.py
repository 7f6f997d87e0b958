"""The gate payload of DESIGN.md: a self-describing safetensors file for one layer's router.

Tensors: ``weight`` [n_routed, d_model] (F32, F16 or BF16) and, for the sigmoid family,
an optional ``e_score_correction_bias`` [n_routed]. ``__metadata__`` (strings, as safetensors
requires): model_id, layer, router (softmax|sigmoid), top_k, norm_topk_prob,
routed_scaling_factor, n_group, topk_group, n_shared_experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.experts.errors import InvalidPayload
from apps.quantization.payload import PayloadError, serialize_safetensors, split_safetensors

ROUTERS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class GateSpec:
    """One layer's router. `weight` is f32 [n_routed, d_model] C-contiguous; `bias` f32 [n_routed]."""

    model_id: str
    layer: int
    router: str
    top_k: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    n_group: int
    topk_group: int
    n_shared_experts: int
    weight: np.ndarray
    bias: np.ndarray | None

    @property
    def n_routed(self) -> int:
        return int(self.weight.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.weight.shape[1])

    @property
    def k_total(self) -> int:
        """Slots per token: the routed top-k plus one weight-1.0 slot per shared expert."""
        return self.top_k + self.n_shared_experts

    @property
    def nbytes(self) -> int:
        return int(self.weight.nbytes + (0 if self.bias is None else self.bias.nbytes))


def encode_gate_payload(
    *,
    model_id: str,
    layer: int,
    weight: np.ndarray,
    router: str,
    top_k: int,
    norm_topk_prob: bool = False,
    routed_scaling_factor: float = 1.0,
    n_group: int = 1,
    topk_group: int = 1,
    n_shared_experts: int = 0,
    e_score_correction_bias: np.ndarray | None = None,
) -> bytes:
    """Encode a gate payload (weights stored as F32). Validates like `read_gate_payload`."""
    tensors = {"weight": np.ascontiguousarray(weight, dtype=np.float32)}
    if e_score_correction_bias is not None:
        tensors["e_score_correction_bias"] = np.ascontiguousarray(e_score_correction_bias, dtype=np.float32)
    metadata = {
        "model_id": str(model_id),
        "layer": str(int(layer)),
        "router": str(router),
        "top_k": str(int(top_k)),
        "norm_topk_prob": "true" if norm_topk_prob else "false",
        "routed_scaling_factor": repr(float(routed_scaling_factor)),
        "n_group": str(int(n_group)),
        "topk_group": str(int(topk_group)),
        "n_shared_experts": str(int(n_shared_experts)),
    }
    entries = {name: ("F32", list(t.shape), t.tobytes()) for name, t in tensors.items()}
    data = serialize_safetensors(entries, metadata)
    read_gate_payload(data)  # refuse to produce a payload we would not accept
    return data


def read_gate_payload(data: bytes | bytearray, *, model_id: str | None = None, layer: int | None = None) -> GateSpec:
    """Parse and validate a gate payload; InvalidPayload names the first problem found.

    DESIGN.md's gate contract does not list model_id and layer among the metadata, so a
    payload may omit them: then `model_id` / `layer` (the caller's, e.g. the load request's)
    name it. Metadata that carries them wins here; the runtime refuses a load whose request
    names other ids (ModelMismatch)."""
    header, body = _split_safetensors(data)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise InvalidPayload("gate payload __metadata__ must be an object of strings")
    tensors = {name: _tensor(name, info, body) for name, info in header.items()}
    if "weight" not in tensors:
        raise InvalidPayload(f"gate payload has no 'weight' tensor (found {sorted(tensors)})")
    weight = tensors.pop("weight")
    bias = tensors.pop("e_score_correction_bias", None)
    if tensors:
        raise InvalidPayload(f"gate payload has unexpected tensors {sorted(tensors)}")
    if weight.ndim != 2 or 0 in weight.shape:
        raise InvalidPayload(f"gate 'weight' must be [n_routed, d_model], received shape {weight.shape}")
    n_routed = weight.shape[0]
    spec = GateSpec(
        model_id=_meta_str(meta, "model_id", default=model_id),
        layer=_meta_int(meta, "layer", minimum=0, default=layer),
        router=_meta_str(meta, "router"),
        top_k=_meta_int(meta, "top_k", minimum=1),
        norm_topk_prob=_meta_bool(meta, "norm_topk_prob", default=False),
        routed_scaling_factor=_meta_float(meta, "routed_scaling_factor", default=1.0),
        n_group=_meta_int(meta, "n_group", minimum=1, default=1),
        topk_group=_meta_int(meta, "topk_group", minimum=1, default=1),
        n_shared_experts=_meta_int(meta, "n_shared_experts", minimum=0, default=0),
        weight=np.ascontiguousarray(weight, dtype=np.float32),
        bias=None if bias is None else np.ascontiguousarray(bias, dtype=np.float32),
    )
    if spec.router not in ROUTERS:
        raise InvalidPayload(f"gate router must be one of {ROUTERS}, received {spec.router!r}")
    if spec.bias is not None:
        if spec.router != "sigmoid":
            raise InvalidPayload("e_score_correction_bias only applies to the sigmoid router")
        if spec.bias.shape != (n_routed,):
            raise InvalidPayload(
                f"e_score_correction_bias must have shape ({n_routed},), received {spec.bias.shape}"
            )
    if n_routed % spec.n_group:
        raise InvalidPayload(f"n_group {spec.n_group} does not divide n_routed {n_routed}")
    if spec.topk_group > spec.n_group:
        raise InvalidPayload(f"topk_group {spec.topk_group} exceeds n_group {spec.n_group}")
    # with group-limited routing only the kept groups' experts are selectable
    selectable = n_routed if spec.router == "softmax" else spec.topk_group * (n_routed // spec.n_group)
    if spec.top_k > selectable:
        raise InvalidPayload(f"top_k {spec.top_k} exceeds the {selectable} selectable experts")
    if not (np.isfinite(spec.weight).all() and (spec.bias is None or np.isfinite(spec.bias).all())):
        raise InvalidPayload("gate tensors contain NaN/inf")
    if not np.isfinite(spec.routed_scaling_factor):
        raise InvalidPayload(f"routed_scaling_factor must be finite, received {spec.routed_scaling_factor}")
    return spec


# --- safetensors container -----------------------------------------------------------------

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8")}


def _split_safetensors(data: bytes) -> tuple[dict[str, Any], memoryview]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidPayload("gate payload must be bytes")
    try:
        return split_safetensors(data)
    except PayloadError as exc:
        raise InvalidPayload(f"gate payload: {exc}") from exc


def _tensor(name: str, info: Any, body: memoryview) -> np.ndarray:
    try:
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(int(s) for s in info["shape"])
        start, end = (int(o) for o in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidPayload(f"gate tensor {name!r} has a malformed header entry: {info!r}") from exc
    count = int(np.prod(shape, dtype=np.int64))
    if not 0 <= start <= end <= len(body) or end - start != count * dtype.itemsize:
        raise InvalidPayload(
            f"gate tensor {name!r} spans bytes {start}..{end} of {len(body)}, "
            f"expected {count * dtype.itemsize} bytes for {info['dtype']}{list(shape)}"
        )
    raw = np.frombuffer(body[start:end], dtype=dtype).reshape(shape)
    if info["dtype"] == "BF16":  # bf16 is the top half of an f32
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def _meta_str(meta: dict[str, Any], key: str, *, default: str | None = None) -> str:
    value = meta.get(key, default)
    if not isinstance(value, str) or not value:
        raise InvalidPayload(f"gate payload metadata {key!r} is required (or name it in the call), "
                             f"received {value!r}")
    return value


def _meta_int(meta: dict[str, Any], key: str, *, minimum: int, default: int | None = None) -> int:
    if key not in meta and default is not None:
        return default
    raw = meta.get(key)
    try:
        value = int(str(raw))
    except ValueError:
        raise InvalidPayload(f"gate payload metadata {key!r} must be an integer, received {raw!r}") from None
    if value < minimum:
        raise InvalidPayload(f"gate payload metadata {key!r} must be >= {minimum}, received {value}")
    return value


def _meta_float(meta: dict[str, Any], key: str, *, default: float) -> float:
    if key not in meta:
        return default
    try:
        return float(str(meta[key]))
    except ValueError:
        raise InvalidPayload(f"gate payload metadata {key!r} must be a number, received {meta[key]!r}") from None


def _meta_bool(meta: dict[str, Any], key: str, *, default: bool) -> bool:
    if key not in meta:
        return default
    value = str(meta[key]).strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise InvalidPayload(f"gate payload metadata {key!r} must be true/false, received {meta[key]!r}")
