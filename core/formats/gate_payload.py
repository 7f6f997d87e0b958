"""The gate payload (docs/formats.md, "Gate payload"): a self-describing safetensors file for one layer's router.

Tensors: ``weight`` [n_routed, d_model] (F32, F16 or BF16); for the sigmoid family an
optional ``e_score_correction_bias`` [n_routed] (added to the scores for the choice only); and
for either routed family an optional ``logit_bias`` [n_routed], the router's own linear bias
(logits = h·Wᵀ + logit_bias: gpt-oss's GptOssTopKRouter). ``__metadata__`` (strings, as safetensors
requires): model_id, layer, router (softmax|sigmoid|dense), top_k, norm_topk_prob,
routed_scaling_factor, n_group, topk_group, n_shared_experts.

A dense (non-MoE) SwiGLU layer too large for one holder is a ``router: "dense"`` gate: zero
routed experts (``weight`` [0, d_model], which still says d_model), top_k 0, and its d_ff
slices as the n_shared_experts always-on experts 0 … n_slices-1 (weight 1.0 each), plus
``d_ff`` (the whole layer's width) and ``slice_align``. SwiGLU is separable along d_ff, so the
slices' outputs sum to the layer's::

    down · (silu(gate·x) ⊙ up·x) = Σ_s down[:, a_s:b_s] · (silu(gate[a_s:b_s]·x) ⊙ up[a_s:b_s]·x)

Slice s holds d_ff rows [a_s, b_s) of `dense_slice_bounds` (docs/protocol.md "Gate payloads").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.formats.errors import InvalidPayload
from core.formats.expert_payload import PayloadError, serialize_safetensors, split_safetensors

ROUTERS = ("softmax", "sigmoid", "dense")
MAX_DENSE_SLICES = 1024  # a bound on one layer's blobs and slots per token, far above any need


def dense_slice_bounds(d_ff: int, n_slices: int, align: int = 1) -> list[tuple[int, int]]:
    """d_ff rows [start, end) of each of `n_slices` slices of a dense layer, slice 0 first.

    The layer is cut into ``units = ceil(d_ff / align)`` blocks of `align` rows (the last block
    is short when `align` does not divide d_ff); the first ``units mod n_slices`` slices get
    ``units // n_slices + 1`` blocks, the others ``units // n_slices``. Every slice but the last
    therefore starts and ends on a multiple of `align` (so down_proj rows of a slice stay whole
    quant blocks), widths differ by at most one block, and the last slice is the narrowest. Every
    slice is non-empty exactly when 1 <= n_slices <= units (`max_dense_slices`); else ValueError.
    """
    for name, value in (("d_ff", d_ff), ("n_slices", n_slices), ("align", align)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, received {value!r}")
    limit = max_dense_slices(d_ff, align)
    if n_slices > limit:
        raise ValueError(f"d_ff {d_ff} cut in blocks of {align} rows gives at most {limit} non-empty slices, "
                         f"asked for {n_slices}")
    q, r = divmod(-(-d_ff // align), n_slices)
    starts = [align * (s * q + min(s, r)) for s in range(n_slices + 1)]
    return [(starts[s], min(starts[s + 1], d_ff)) for s in range(n_slices)]


def max_dense_slices(d_ff: int, align: int = 1) -> int:
    """The most non-empty slices `dense_slice_bounds` can cut d_ff into (ceil(d_ff / align))."""
    return -(-int(d_ff) // int(align))


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
    dense_d_ff: int | None = None  # router "dense" only: the whole layer's d_ff, cut in n_shared_experts slices
    slice_align: int = 1  # router "dense" only: the row block of dense_slice_bounds
    logit_bias: np.ndarray | None = None  # f32 [n_routed]: the router's linear bias, added to the logits

    @property
    def is_dense(self) -> bool:
        return self.router == "dense"

    def slice_bounds(self, expert: int) -> tuple[int, int]:
        """d_ff rows [start, end) held by slice `expert` of a dense gate (ValueError otherwise)."""
        if self.dense_d_ff is None or not 0 <= expert < self.n_shared_experts:
            raise ValueError(f"expert {expert} is not a slice of this gate ({self.router}, "
                             f"{self.n_shared_experts} always-on experts)")
        return dense_slice_bounds(self.dense_d_ff, self.n_shared_experts, self.slice_align)[expert]

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
        return int(self.weight.nbytes + sum(b.nbytes for b in (self.bias, self.logit_bias) if b is not None))


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
    logit_bias: np.ndarray | None = None,
) -> bytes:
    """Encode a gate payload (weights stored as F32). Validates like `read_gate_payload`."""
    tensors = {"weight": np.ascontiguousarray(weight, dtype=np.float32)}
    if e_score_correction_bias is not None:
        tensors["e_score_correction_bias"] = np.ascontiguousarray(e_score_correction_bias, dtype=np.float32)
    if logit_bias is not None:
        tensors["logit_bias"] = np.ascontiguousarray(logit_bias, dtype=np.float32)
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
    return _encode(tensors, metadata)


def encode_dense_gate_payload(*, model_id: str, layer: int, d_model: int, d_ff: int, n_slices: int,
                              slice_align: int = 1) -> bytes:
    """The gate payload of a dense layer held as `n_slices` d_ff slices (experts 0 … n_slices-1).

    ``weight`` is an empty F32 [0, d_model] tensor: no routed experts, but the payload still
    names d_model, which loads check experts against. Every token goes to every slice with
    weight 1.0 (`core.experts.gating.route`). Validates like `read_gate_payload`.
    """
    metadata = {
        "model_id": str(model_id), "layer": str(int(layer)), "router": "dense", "top_k": "0",
        "norm_topk_prob": "false", "routed_scaling_factor": "1.0", "n_group": "1", "topk_group": "1",
        "n_shared_experts": str(int(n_slices)), "d_ff": str(int(d_ff)), "slice_align": str(int(slice_align)),
    }
    return _encode({"weight": np.zeros((0, int(d_model)), dtype=np.float32)}, metadata)


def _encode(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    entries = {name: ("F32", list(t.shape), t.tobytes()) for name, t in tensors.items()}
    data = serialize_safetensors(entries, metadata)
    read_gate_payload(data)  # refuse to produce a payload we would not accept
    return data


def read_gate_payload(data: bytes | bytearray, *, model_id: str | None = None, layer: int | None = None) -> GateSpec:
    """Parse and validate a gate payload; InvalidPayload names the first problem found.

    The gate payload's contract (docs/formats.md) does not list model_id and layer among the metadata, so a
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
    logit_bias = tensors.pop("logit_bias", None)
    if tensors:
        raise InvalidPayload(f"gate payload has unexpected tensors {sorted(tensors)}")
    router = _meta_str(meta, "router")
    if router not in ROUTERS:
        raise InvalidPayload(f"gate router must be one of {ROUTERS}, received {router!r}")
    dense = router == "dense"
    if weight.ndim != 2 or weight.shape[1] == 0 or (weight.shape[0] == 0) != dense:
        want = "[0, d_model] (a dense layer has no routed experts)" if dense else "[n_routed, d_model]"
        raise InvalidPayload(f"gate 'weight' of router {router!r} must be {want}, received shape {weight.shape}")
    n_routed = weight.shape[0]
    spec = GateSpec(
        model_id=_meta_str(meta, "model_id", default=model_id),
        layer=_meta_int(meta, "layer", minimum=0, default=layer),
        router=router,
        top_k=_meta_int(meta, "top_k", minimum=0),
        norm_topk_prob=_meta_bool(meta, "norm_topk_prob", default=False),
        routed_scaling_factor=_meta_float(meta, "routed_scaling_factor", default=1.0),
        n_group=_meta_int(meta, "n_group", minimum=1, default=1),
        topk_group=_meta_int(meta, "topk_group", minimum=1, default=1),
        n_shared_experts=_meta_int(meta, "n_shared_experts", minimum=0, default=0),
        weight=np.ascontiguousarray(weight, dtype=np.float32),
        bias=None if bias is None else np.ascontiguousarray(bias, dtype=np.float32),
        dense_d_ff=_meta_int(meta, "d_ff", minimum=1) if dense else None,
        slice_align=_meta_int(meta, "slice_align", minimum=1, default=1) if dense else 1,
        logit_bias=None if logit_bias is None else np.ascontiguousarray(logit_bias, dtype=np.float32),
    )
    if dense:
        _check_dense(spec, meta)
        return spec
    for key in ("d_ff", "slice_align"):
        if key in meta:
            raise InvalidPayload(f"gate payload metadata {key!r} only applies to router 'dense', not {router!r}")
    if spec.top_k < 1:
        raise InvalidPayload(f"gate payload metadata 'top_k' must be >= 1 for router {router!r}, received 0")
    if spec.bias is not None:
        if spec.router != "sigmoid":
            raise InvalidPayload("e_score_correction_bias only applies to the sigmoid router")
        if spec.bias.shape != (n_routed,):
            raise InvalidPayload(
                f"e_score_correction_bias must have shape ({n_routed},), received {spec.bias.shape}"
            )
    if spec.logit_bias is not None and spec.logit_bias.shape != (n_routed,):
        raise InvalidPayload(f"logit_bias must have shape ({n_routed},), received {spec.logit_bias.shape}")
    if n_routed % spec.n_group:
        raise InvalidPayload(f"n_group {spec.n_group} does not divide n_routed {n_routed}")
    if spec.topk_group > spec.n_group:
        raise InvalidPayload(f"topk_group {spec.topk_group} exceeds n_group {spec.n_group}")
    # with group-limited routing only the kept groups' experts are selectable
    selectable = n_routed if spec.router == "softmax" else spec.topk_group * (n_routed // spec.n_group)
    if spec.top_k > selectable:
        raise InvalidPayload(f"top_k {spec.top_k} exceeds the {selectable} selectable experts")
    if not all(t is None or np.isfinite(t).all() for t in (spec.weight, spec.bias, spec.logit_bias)):
        raise InvalidPayload("gate tensors contain NaN/inf")
    if not np.isfinite(spec.routed_scaling_factor):
        raise InvalidPayload(f"routed_scaling_factor must be finite, received {spec.routed_scaling_factor}")
    return spec


def _check_dense(spec: GateSpec, meta: dict[str, Any]) -> None:
    """A dense gate routes nothing: every routing knob must be absent or neutral, so a payload
    never says one thing (e.g. a scaling factor) that route() then silently ignores."""
    if spec.bias is not None or spec.logit_bias is not None:
        raise InvalidPayload("a dense gate has no routed experts, so no e_score_correction_bias or logit_bias")
    neutral = {"top_k": (spec.top_k, 0), "norm_topk_prob": (spec.norm_topk_prob, False),
               "routed_scaling_factor": (spec.routed_scaling_factor, 1.0), "n_group": (spec.n_group, 1),
               "topk_group": (spec.topk_group, 1)}
    for key, (got, want) in neutral.items():
        if got != want:
            raise InvalidPayload(f"gate payload metadata {key!r} must be {want!r} for router 'dense' "
                                 f"(every token goes to every slice, weight 1.0), received {meta.get(key)!r}")
    n, d_ff, align = spec.n_shared_experts, spec.dense_d_ff, spec.slice_align
    if not 1 <= n <= MAX_DENSE_SLICES:
        raise InvalidPayload(f"a dense gate needs 1..{MAX_DENSE_SLICES} slices in 'n_shared_experts', received {n}")
    if n > max_dense_slices(d_ff, align):
        raise InvalidPayload(f"d_ff {d_ff} in blocks of slice_align {align} gives at most "
                             f"{max_dense_slices(d_ff, align)} non-empty slices; 'n_shared_experts' is {n}")


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
        shape = tuple(info["shape"])
        start, end = info["data_offsets"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidPayload(f"gate tensor {name!r} has a malformed header entry: {str(info)[:200]}") from exc
    # Whole non-negative JSON integers only: a negative or float dimension would reach reshape, and
    # a product taken in int64 would wrap for lying shapes; Python ints do not.
    if not all(type(v) is int and v >= 0 for v in (*shape, start, end)):
        raise InvalidPayload(f"gate tensor {name!r}: shape and data_offsets must be non-negative integers, got "
                             f"{str(info['shape'])[:100]} and {str(info['data_offsets'])[:100]}")
    count = math.prod(shape)
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
    if key not in meta:
        if default is not None:
            return default
        raise InvalidPayload(f"gate payload metadata {key!r} is required")
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
