"""Expert payloads: one expert's gate/up/down projections in a safetensors file.

Layout (docs/formats.md, "Expert payload"):
  gate_proj.weight [d_ff, d_model], up_proj.weight [d_ff, d_model], down_proj.weight
  [d_model, d_ff].  Dense types are stored as F32 / F16 / BF16 tensors of that shape;
  block types as U8 tensors [rows, row_bytes] holding the raw GGML blocks, exactly as in a
  GGUF tensor.  `__metadata__` (all strings):
    <tensor>.ggml_type            type actually used ("Q4_K", "Q8_0", "F16", ...)
    <tensor>.shape                logical shape "rows,cols"
    <tensor>.requested_ggml_type  type the preset asked for (differs after a fallback)
    model_id, layer, expert, format ("tenzro-expert/1")
    activation                    "silu" (also when absent) or "clamped_swiglu" (gpt-oss's), which then
                                  needs activation.alpha and activation.limit (decimal strings)
  Optional biases, all three or none: gate_proj.bias [d_ff], up_proj.bias [d_ff], down_proj.bias
  [d_model], F32.  An expert is then y = down·act(gate·x + b_g, up·x + b_u) + b_d.

The safetensors container is written and parsed here (8-byte little-endian header length,
JSON header padded with spaces to 8 bytes, then the tensor bytes back to back in name
order) so that every field can be validated and tensors are zero-copy views of the input.
Pure module, never Django.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from core.formats.expert_activation import SILU, ExpertActivation
from core.formats.safetensors_header import header_length, parse_header
from core.quantization.presets import PROJECTIONS, TENSOR_NAMES, resolve_quant
from core.quantization.registry import KERNELS, dense_to_f32, dequantize, f32_to_dense, quantize
from core.quantization.types import GGMLType, resolve_type, row_bytes

FORMAT = "tenzro-expert/1"
_DENSE_ST_DTYPE = {GGMLType.F32: ("F32", "<f4"), GGMLType.F16: ("F16", "<f2"), GGMLType.BF16: ("BF16", "<u2")}
_MAX_HEADER = 1 << 20


class PayloadError(ValueError):
    """A payload that cannot be encoded or read; the message names tensor, field, expected vs got."""


@dataclass(frozen=True)
class QuantTensor:
    ggml_type: GGMLType
    shape: tuple[int, int]
    data: np.ndarray  # u8 [rows, row_bytes] for block types; f4 / f2 / u2 (bf16 bits) [rows, cols] for dense

    def dense(self) -> np.ndarray:
        """Dequantized f32 [rows, cols]."""
        if self.ggml_type.is_block:
            return dequantize(self.data, self.ggml_type, self.shape)
        return dense_to_f32(self.data, self.ggml_type).reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


BIAS_NAMES = {p: f"{p}_proj.bias" for p in PROJECTIONS}


@dataclass(frozen=True)
class ExpertPayload:
    model_id: str
    layer: int
    expert: int
    tensors: dict[str, QuantTensor]  # keys gate_proj.weight, up_proj.weight, down_proj.weight
    activation: ExpertActivation = SILU
    biases: dict[str, np.ndarray] = field(default_factory=dict)  # {} or gate/up f32 [d_ff], down f32 [d_model]

    def d_model(self) -> int:
        return self.tensors[TENSOR_NAMES["gate"]].shape[1]

    def d_ff(self) -> int:
        return self.tensors[TENSOR_NAMES["gate"]].shape[0]

    def dense(self, name: str) -> np.ndarray:
        """f32 weights of `name` ("gate" or "gate_proj.weight", etc.), dequantized."""
        key = TENSOR_NAMES.get(name, name)
        if key not in self.tensors:
            raise KeyError(f"no tensor {name!r} (have {sorted(self.tensors)})")
        return self.tensors[key].dense()


def expert_dims(shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, int]:
    """(d_ff, d_model) of an expert from its projections' shapes, keyed "gate", "up", "down".

    gate and up must be [d_ff, d_model] and down [d_model, d_ff] (d_ff, d_model taken from
    gate); PayloadError naming the projection that disagrees.  The one check of an expert's
    shapes: the encoder, the reader and core.experts.ffn all call it.
    """
    d_ff, d_model = tuple(shapes["gate"])
    want = {"up": (d_ff, d_model), "down": (d_model, d_ff)}
    for proj, shape in want.items():
        got = tuple(shapes[proj])
        if got != shape:
            raise PayloadError(
                f"inconsistent shapes: {TENSOR_NAMES[proj]} {got}, expected {shape} from "
                f"{TENSOR_NAMES['gate']} {(d_ff, d_model)}")
    return d_ff, d_model


def _as_f32_2d(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or 0 in x.shape:
        raise PayloadError(f"{name}: expected a non-empty 2-D array, got shape {x.shape}")
    return x.astype(np.float32, copy=False)


def _check_biases(biases: Mapping[str, np.ndarray], d_ff: int, d_model: int) -> dict[str, np.ndarray]:
    """{} or all three biases as f32 (gate, up [d_ff]; down [d_model]), finite; PayloadError otherwise."""
    if not biases:
        return {}
    if set(biases) != set(PROJECTIONS):
        raise PayloadError(f"biases must be given for all of {list(PROJECTIONS)} or none, got {sorted(biases)}")
    out = {}
    for proj in PROJECTIONS:
        b = np.asarray(biases[proj])
        want = (d_model,) if proj == "down" else (d_ff,)
        if b.shape != want:
            raise PayloadError(f"{BIAS_NAMES[proj]}: shape {b.shape}, expected {want}")
        b = np.ascontiguousarray(b, dtype="<f4")
        if not np.isfinite(b).all():
            raise PayloadError(f"{BIAS_NAMES[proj]}: {int((~np.isfinite(b)).sum())} non-finite value(s)")
        out[proj] = b
    return out


def encode_expert_payload(
    *, gate: np.ndarray | QuantTensor, up: np.ndarray | QuantTensor, down: np.ndarray | QuantTensor,
    quant: str | dict | None, model_id: str, layer: int, expert: int,
    biases: Mapping[str, np.ndarray] | None = None, activation: ExpertActivation = SILU,
) -> bytes:
    """Quantize one expert and serialize it.  gate, up: f32 [d_ff, d_model]; down: f32 [d_model, d_ff].

    Each tensor uses the preset's type, or llama.cpp's fallback when its block does not
    divide the row length (recorded in `<tensor>.ggml_type`).  A projection given as a
    QuantTensor is written as it is (a checkpoint's own MXFP4 blocks: no re-quantization), and
    `quant` does not apply to it.  `biases` ({"gate", "up", "down"} -> f32 vectors) and
    `activation` are written as above.  Raises PayloadError on bad shapes, non-finite weights
    or an unknown preset.
    """
    weights = {p: x if isinstance(x, QuantTensor) else _as_f32_2d(p, x)
               for p, x in (("gate", gate), ("up", up), ("down", down))}
    d_ff, d_model = expert_dims({p: x.shape for p, x in weights.items()})
    bias_arrays = _check_biases(biases or {}, d_ff, d_model)
    if not isinstance(activation, ExpertActivation):
        raise PayloadError(f"activation must be an ExpertActivation, got {type(activation).__name__}")
    if not isinstance(model_id, str) or not model_id:
        raise PayloadError(f"model_id must be a non-empty string, got {model_id!r}")
    for key, value in (("layer", layer), ("expert", expert)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise PayloadError(f"{key} must be a non-negative integer, got {value!r}")
    try:
        requested = resolve_quant(quant)
    except ValueError as exc:
        raise PayloadError(str(exc)) from None

    metadata = {"format": FORMAT, "model_id": model_id, "layer": str(int(layer)), "expert": str(int(expert)),
                **activation.metadata()}
    entries: dict[str, tuple[str, list[int], bytes]] = {
        BIAS_NAMES[p]: ("F32", [b.shape[0]], b.tobytes()) for p, b in bias_arrays.items()}
    for proj in PROJECTIONS:
        name, x = TENSOR_NAMES[proj], weights[proj]
        rows, cols = x.shape
        if isinstance(x, QuantTensor):
            st_dtype = "U8" if x.ggml_type.is_block else _DENSE_ST_DTYPE[x.ggml_type][0]
            entries[name] = (st_dtype, list(x.data.shape), np.ascontiguousarray(x.data).tobytes())
            metadata[f"{name}.ggml_type"] = metadata[f"{name}.requested_ggml_type"] = x.ggml_type.value
            metadata[f"{name}.shape"] = f"{rows},{cols}"
            continue
        used = resolve_type(requested[proj], cols)
        try:
            if used.is_block:
                blob = quantize(x, used)
                entries[name] = ("U8", list(blob.shape), blob.tobytes())
            else:
                blob = quantize(x, used)  # validates finiteness / overflow
                entries[name] = (_DENSE_ST_DTYPE[used][0], [rows, cols], blob.tobytes())
        except ValueError as exc:
            raise PayloadError(f"{name}: {exc}") from None
        metadata[f"{name}.ggml_type"] = used.value
        metadata[f"{name}.requested_ggml_type"] = requested[proj].value
        metadata[f"{name}.shape"] = f"{rows},{cols}"
    return serialize_safetensors(entries, metadata)


def serialize_safetensors(entries: dict[str, tuple[str, list[int], bytes]], metadata: dict[str, str]) -> bytes:
    """A safetensors file, byte-for-byte deterministic: tensors in name order, compact header.

    entries: name -> (dtype, shape, raw little-endian bytes). Content addressing needs identical
    bytes for identical inputs, which the safetensors library does not promise (its Rust side
    orders `__metadata__` by a randomly seeded hash map).
    """
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name in sorted(entries):
        dtype, shape, blob = entries[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text, *(entries[n][2] for n in sorted(entries))])


def split_safetensors(data: bytes) -> tuple[dict, memoryview]:
    """(header JSON object, tensor data section) of a safetensors file; PayloadError if malformed."""
    try:
        hlen = header_length(data, limit=_MAX_HEADER)
        if 8 + hlen > len(data):
            raise ValueError(f"header length {hlen} does not fit a {len(data)}-byte payload")
        header = parse_header(memoryview(data)[8:8 + hlen])
    except ValueError as exc:
        raise PayloadError(f"safetensors payload: {exc}") from None
    return header, memoryview(data)[8 + hlen:]


def _meta_int(meta: dict, key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, str) or not value.isdigit():
        raise PayloadError(f"metadata {key!r}: expected a non-negative integer string, got {value!r}")
    return int(value)


def _meta_shape(meta: dict, name: str) -> tuple[int, int]:
    value = meta.get(f"{name}.shape")
    parts = value.split(",") if isinstance(value, str) else []
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise PayloadError(f"{name}: metadata '{name}.shape' must be 'rows,cols' of positive ints, got {value!r}")
    return int(parts[0]), int(parts[1])


def _read_tensor(name: str, entry: object, meta: dict, body: memoryview) -> QuantTensor:
    type_name = meta.get(f"{name}.ggml_type")
    try:
        ggml_type = GGMLType(type_name)
    except ValueError:
        raise PayloadError(
            f"{name}: unknown ggml_type {type_name!r} (known: {', '.join(t.value for t in GGMLType)})") from None
    rows, cols = _meta_shape(meta, name)
    if not isinstance(entry, dict):
        raise PayloadError(f"{name}: header entry must be an object")
    try:
        nbytes_row = row_bytes(ggml_type, cols)
    except ValueError as exc:
        raise PayloadError(f"{name}: {exc}") from None
    if ggml_type.is_block:
        st_dtype, np_dtype, want_shape = "U8", np.uint8, [rows, nbytes_row]
    else:
        st_dtype, np_dtype = _DENSE_ST_DTYPE[ggml_type]
        want_shape = [rows, cols]
    if entry.get("dtype") != st_dtype:
        raise PayloadError(f"{name}: dtype for {ggml_type.value} must be {st_dtype}, got {entry.get('dtype')!r}")
    if entry.get("shape") != want_shape:
        raise PayloadError(
            f"{name}: tensor shape for {ggml_type.value} [{rows}, {cols}] must be {want_shape}, "
            f"got {entry.get('shape')!r}")
    offsets = entry.get("data_offsets")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise PayloadError(f"{name}: data_offsets must be [begin, end], got {offsets!r}")
    begin, end = offsets
    expected = rows * nbytes_row
    if end - begin != expected:
        raise PayloadError(
            f"{name}: byte count {end - begin} does not match {ggml_type.value} [{rows}, {cols}] "
            f"(expected {expected})")
    if not 0 <= begin <= end <= len(body):
        raise PayloadError(f"{name}: data_offsets {offsets} outside the {len(body)}-byte data section")
    arr = np.frombuffer(body, dtype=np_dtype, count=expected // np.dtype(np_dtype).itemsize, offset=begin)
    arr = arr.reshape(want_shape)
    if ggml_type.is_block:
        kernel = KERNELS[ggml_type]
        for field in kernel.scale_fields(arr.reshape(-1, kernel.type_size)):
            bad = int(np.count_nonzero(~np.isfinite(field)))
            if bad:
                raise PayloadError(f"{name}: {bad} block(s) of {ggml_type.value} have non-finite scales")
    else:
        bad = int(np.count_nonzero(~np.isfinite(dense_to_f32(arr, ggml_type))))
        if bad:
            raise PayloadError(f"{name}: {bad} non-finite value(s) in {ggml_type.value} weights")
    return QuantTensor(ggml_type=ggml_type, shape=(rows, cols), data=arr)


def read_expert_payload(data: bytes) -> ExpertPayload:
    """Parse and validate an expert payload; raises PayloadError saying what is wrong.

    Tensors are read-only views into `data` (no copy).
    """
    header, body = split_safetensors(data)
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise PayloadError("__metadata__ missing or not a string-to-string object")
    model_id = meta.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise PayloadError(f"metadata 'model_id' missing or empty: {model_id!r}")
    layer, expert = _meta_int(meta, "layer"), _meta_int(meta, "expert")

    weights = set(TENSOR_NAMES.values())
    missing = sorted(weights - set(header))
    if missing:
        raise PayloadError(f"missing tensor(s) {missing}; have {sorted(header)}")
    bias_names = set(BIAS_NAMES.values())
    present_biases = bias_names & set(header)
    if present_biases and present_biases != bias_names:
        raise PayloadError(f"biases must be all of {sorted(bias_names)} or none, found {sorted(present_biases)}")
    wanted = weights | present_biases
    extra = sorted(set(header) - wanted)
    if extra:
        raise PayloadError(f"unexpected tensor(s) {extra}; an expert payload holds {sorted(weights)} and, "
                           f"optionally, {sorted(bias_names)}")
    tensors = {name: _read_tensor(name, header[name], meta, body) for name in sorted(weights)}
    try:
        activation = ExpertActivation.from_metadata(meta)
    except ValueError as exc:
        raise PayloadError(str(exc)) from None
    d_ff, d_model = expert_dims({p: tensors[name].shape for p, name in TENSOR_NAMES.items()})
    biases = {p: _read_bias(BIAS_NAMES[p], header[BIAS_NAMES[p]], body, d_model if p == "down" else d_ff)
              for p in PROJECTIONS} if present_biases else {}

    spans = sorted(tuple(header[n]["data_offsets"]) for n in wanted)
    if spans[0][0] != 0 or any(a[1] != b[0] for a, b in itertools.pairwise(spans)) \
            or spans[-1][1] != len(body):
        raise PayloadError(f"tensor data must tile the {len(body)}-byte data section exactly; got spans {spans}")
    return ExpertPayload(model_id=model_id, layer=layer, expert=expert, tensors=tensors, activation=activation,
                         biases=biases)


def _read_bias(name: str, entry: object, body: memoryview, n: int) -> np.ndarray:
    """A bias tensor: F32 [n], finite (a read-only view of the payload)."""
    if not isinstance(entry, dict) or entry.get("dtype") != "F32" or entry.get("shape") != [n]:
        got = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, dict) else entry
        raise PayloadError(f"{name}: must be F32 [{n}], got {got!r}")
    offsets = entry.get("data_offsets")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise PayloadError(f"{name}: data_offsets must be [begin, end], got {offsets!r}")
    begin, end = offsets
    if end - begin != 4 * n or not 0 <= begin <= end <= len(body):
        raise PayloadError(f"{name}: data_offsets [{begin}, {end}] do not hold F32 [{n}] in the "
                           f"{len(body)}-byte data section")
    arr = np.frombuffer(body, dtype="<f4", count=n, offset=begin)
    if not np.isfinite(arr).all():
        raise PayloadError(f"{name}: {int((~np.isfinite(arr)).sum())} non-finite value(s)")
    return arr


__all__ = ["BIAS_NAMES", "SILU", "TENSOR_NAMES", "ExpertActivation", "ExpertPayload", "PayloadError", "QuantTensor",
           "encode_expert_payload", "expert_dims", "f32_to_dense", "read_expert_payload"]
