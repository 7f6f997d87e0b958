"""Read tensors out of a Hugging Face-layout checkpoint, fetching only the bytes needed.

A checkpoint is a local folder or an http(s) URL base holding ``config.json`` and either
``model.safetensors`` or ``model.safetensors.index.json`` plus its shards (docs/formats.md
"Checkpoints"). The reader fetches config.json and the index whole (both are small), then
for each shard it touches only the safetensors header — one ranged read of
``header_probe`` bytes, and a second for the rest when the header is longer — and then
exactly the byte range of each tensor asked for.

safetensors file::

    +----------+----------------------+-------------------------------------+
    | u64 LE n | JSON header (n bytes)| data: tensors at data_offsets [a,b) |
    +----------+----------------------+-------------------------------------+
    0          8                      8+n                           file end

The bytes come from apps/catalog/sources.py (a folder, or HTTP Range requests that must be
answered 206 with exactly the range asked: a server that ignores Range is refused before
its body is read, so the reader never downloads a whole shard).

Pure module (numpy + httpx), never Django.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from apps.catalog.sources import CheckpointError, HttpSource, LocalSource
from core.formats.safetensors_header import header_length, parse_header

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"

HEADER_PROBE = 64 * 1024  # first ranged read of a shard; most headers of one shard fit
MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit
FP8_BLOCK = 128  # DeepSeek-V3 weight_block_size [128, 128]

# dtype -> (numpy dtype of the stored bits, bytes per element)
_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F8_E4M3": np.dtype("u1"),
}
_ALL_ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                  "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: absolute byte offsets [start, end) in `shard`."""

    name: str
    shard: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _fp8_e4m3_lut() -> np.ndarray:
    """f32 value of each of the 256 float8_e4m3fn codes (bias 7, no inf, S.1111.111 = NaN)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7.0))
    value = sign * value
    value[(codes & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


FP8_E4M3_LUT = _fp8_e4m3_lut()


def decode_dense(raw: bytes | memoryview, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Stored bytes of a F32/F16/BF16/F8_E4M3 tensor -> f32 array (F8 without its scales)."""
    bits = np.frombuffer(raw, dtype=_DTYPES[dtype]).reshape(shape)
    if dtype == "BF16":  # bf16 is the top half of an f32
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E4M3":
        return FP8_E4M3_LUT[bits]
    return bits.astype(np.float32)


# --- reader ----------------------------------------------------------------------------------


class CheckpointReader:
    """Ranged reader over one checkpoint. Not thread-safe (one httpx client per reader).

    Counters: ``bytes_read`` (every byte received), and its split ``bytes_by_kind``
    ({"json", "header", "tensor"}).
    """

    def __init__(self, source: LocalSource | HttpSource, *, header_probe: int = HEADER_PROBE) -> None:
        if header_probe < 8:
            raise ValueError("header_probe must be at least 8 bytes")
        self._src = source
        self.header_probe = header_probe
        self.bytes_read = 0
        self.bytes_by_kind = {"json": 0, "header": 0, "tensor": 0}
        self._headers: dict[str, dict[str, TensorInfo]] = {}
        self._sizes: dict[str, int] = {}
        self.config: dict[str, Any] = json.loads(self._json(CONFIG, "config_invalid"))
        if not isinstance(self.config, dict):
            raise CheckpointError("config_invalid", f"{source.describe(CONFIG)} is not a JSON object")
        self.weight_map: dict[str, str] | None = None  # tensor -> shard, when sharded
        try:
            index = json.loads(self._json(INDEX, "index_invalid"))
        except CheckpointError as exc:
            if exc.reason != "not_found":
                raise
            return  # single-file checkpoint: model.safetensors (its header is read on first use)
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) and v and "/" not in v and ".." not in v
                                               for v in wm.values()):
            raise CheckpointError("index_invalid", f"{source.describe(INDEX)} has no valid weight_map")
        self.weight_map = dict(wm)

    @classmethod
    def open(cls, source: str | Path, *, header_probe: int = HEADER_PROBE, retries: int = 3,
             backoff_s: float = 0.2, timeout_s: float = 30.0, client: httpx.Client | None = None
             ) -> CheckpointReader:
        """Open a local folder or an http(s) URL base. Reads config.json and the index (if any)."""
        text = str(source)
        if text.startswith(("http://", "https://")):
            src: LocalSource | HttpSource = HttpSource(text, retries=retries, backoff_s=backoff_s,
                                                          timeout_s=timeout_s, client=client)
        else:
            root = Path(text)
            try:
                is_dir = root.is_dir()
            except OSError as exc:  # a name too long, a loop of links: no such folder either way
                raise CheckpointError("not_found", f"checkpoint folder {text[:200]!r} cannot exist: "
                                                   f"{exc.strerror}") from exc
            if not is_dir:
                raise CheckpointError("not_found", f"checkpoint folder {root} does not exist")
            src = LocalSource(root)
        try:
            return cls(src, header_probe=header_probe)
        except BaseException:
            src.close()
            raise

    def close(self) -> None:
        self._src.close()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _json(self, name: str, reason: str) -> bytes:
        data = self._src.read_small(name)
        self._count("json", len(data))
        try:
            json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
            raise CheckpointError(reason, f"{self._src.describe(name)} is not valid JSON: "
                                          f"{type(exc).__name__}: {str(exc)[:200]}") from None
        return data

    def describe(self, name: str) -> str:
        """Where `name` is read from (a path or a URL), for messages."""
        return self._src.describe(name)

    def read_optional(self, name: str) -> bytes | None:
        """A small file beside the weights (tokenizer.json, generation_config.json …), or None when the
        checkpoint has none; other failures raise CheckpointError as every read does."""
        try:
            data = self._src.read_small(name)
        except CheckpointError as exc:
            if exc.reason == "not_found":
                return None
            raise
        self._count("json", len(data))
        return data

    def _count(self, kind: str, n: int) -> None:
        self.bytes_read += n
        self.bytes_by_kind[kind] += n

    # -- headers --

    def shard_of(self, name: str) -> str:
        if self.weight_map is None:
            return SINGLE
        shard = self.weight_map.get(name)
        if shard is None:
            raise CheckpointError("tensor_missing", f"tensor {name!r} is not in {INDEX}")
        return shard

    def has_tensor(self, name: str) -> bool:
        if self.weight_map is not None:
            return name in self.weight_map
        return name in self._header(SINGLE)

    def _header(self, shard: str) -> dict[str, TensorInfo]:
        cached = self._headers.get(shard)
        if cached is not None:
            return cached
        where = self._src.describe(shard)
        try:
            first, size = self._src.read_range(shard, 0, self.header_probe, allow_short=True)
        except CheckpointError as exc:
            if exc.reason == "header_truncated":
                raise CheckpointError("header_truncated", f"{where}: shorter than the 8-byte header length") from None
            raise
        self._count("header", len(first))
        if len(first) < 8:
            raise CheckpointError("header_truncated", f"{where}: {size} bytes, shorter than the 8-byte header length")
        try:
            n = header_length(first, limit=MAX_HEADER)
        except ValueError as exc:
            raise CheckpointError("header_too_large", f"{where}: {exc}") from None
        if 8 + n > size:
            raise CheckpointError("header_truncated", f"{where}: header length {n} runs past the {size}-byte file")
        raw = first[8:8 + n]
        if len(raw) < n:  # the header is longer than the probe: fetch exactly the rest
            rest, _ = self._src.read_range(shard, len(first), 8 + n - len(first), allow_short=False)
            self._count("header", len(rest))
            raw = first[8:] + rest
        try:
            header = parse_header(raw)
        except ValueError as exc:
            raise CheckpointError("header_corrupt", f"{where}: {exc}") from None
        header.pop("__metadata__", None)
        data_start, data_len = 8 + n, size - 8 - n
        infos: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            try:
                dtype = entry["dtype"]
                shape = _json_ints(entry["shape"])
                a, b = _json_ints(entry["data_offsets"])  # ValueError unless two
                if not isinstance(dtype, str) or any(s < 0 for s in shape):
                    raise ValueError
            except (KeyError, TypeError, ValueError):
                raise CheckpointError("header_corrupt", f"{where}: malformed entry for {name!r}: {entry!r}") from None
            if not 0 <= a <= b <= data_len:
                raise CheckpointError("offsets_invalid", f"{where}: tensor {name!r} data_offsets [{a}, {b}] lie "
                                                         f"outside the {data_len}-byte data section")
            itemsize = _ALL_ST_DTYPES.get(dtype)
            if itemsize is not None and b - a != int(np.prod(shape, dtype=np.int64)) * itemsize:
                raise CheckpointError("offsets_invalid", f"{where}: tensor {name!r} {dtype}{list(shape)} needs "
                                                         f"{int(np.prod(shape)) * itemsize} bytes, "
                                                         f"data_offsets span {b - a}")
            infos[name] = TensorInfo(name=name, shard=shard, dtype=dtype, shape=shape,
                                     start=data_start + a, end=data_start + b)
        self._headers[shard] = infos
        self._sizes[shard] = size
        return infos

    def tensor_info(self, name: str) -> TensorInfo:
        shard = self.shard_of(name)
        info = self._header(shard).get(name)
        if info is None:
            raise CheckpointError("tensor_missing", f"tensor {name!r} is not in {self._src.describe(shard)}")
        return info

    # -- tensors --

    def _read(self, info: TensorInfo, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        data, _ = self._src.read_range(info.shard, start, end - start, allow_short=False)
        self._count("tensor", len(data))
        return data

    def read_tensor(self, name: str, *, rows: tuple[int, int] | None = None) -> np.ndarray:
        """Tensor `name` as f32, fetching only its bytes (only rows [r0, r1) when `rows` is given).

        F8_E4M3 weights are multiplied by their ``<name>_scale_inv`` block scales
        (w[i, j] = fp8[i, j] * scale_inv[i // 128, j // 128], edge blocks partial).
        """
        info = self.tensor_info(name)
        if info.dtype not in _DTYPES:
            raise CheckpointError("dtype_unsupported", f"tensor {name!r} has dtype {info.dtype}; supported: "
                                                       f"{', '.join(_DTYPES)}")
        raw, out_shape, (r0, r1) = self._read_rows(info, rows)
        values = decode_dense(raw, info.dtype, out_shape)
        if info.dtype == "F8_E4M3":
            values = self._apply_block_scales(name, info, values, r0, r1)
        return values

    def read_u8(self, name: str, *, rows: tuple[int, int] | None = None) -> np.ndarray:
        """A U8 tensor as stored (MXFP4 ``*_blocks`` and ``*_scales``), only rows [r0, r1) of its first axis
        when `rows` is given."""
        info = self.tensor_info(name)
        if info.dtype != "U8":
            raise CheckpointError("dtype_unsupported", f"tensor {name!r} has dtype {info.dtype}; expected U8")
        raw, out_shape, _ = self._read_rows(info, rows)
        return np.frombuffer(raw, dtype=np.uint8).reshape(out_shape)

    def _read_rows(self, info: TensorInfo, rows: tuple[int, int] | None
                   ) -> tuple[bytes, tuple[int, ...], tuple[int, int]]:
        """(bytes, shape, (r0, r1)) of rows [r0, r1) of `info`'s first axis (all of it for None)."""
        shape = info.shape
        r0, r1 = (0, shape[0] if shape else 1) if rows is None else rows
        if rows is not None and (len(shape) < 1 or not 0 <= r0 <= r1 <= shape[0]):
            raise ValueError(f"rows {rows} out of range for {info.name!r} of shape {shape}")
        if rows is None:
            return self._read(info, info.start, info.end), shape, (r0, r1)
        row_bytes = info.nbytes // shape[0] if shape[0] else 0
        raw = self._read(info, info.start + r0 * row_bytes, info.start + r1 * row_bytes)
        return raw, (r1 - r0, *shape[1:]), (r0, r1)

    def _apply_block_scales(self, name: str, info: TensorInfo, values: np.ndarray, r0: int, r1: int) -> np.ndarray:
        if len(info.shape) != 2:
            raise CheckpointError("dtype_unsupported", f"F8_E4M3 tensor {name!r} must be 2-D, has shape {info.shape}")
        block = FP8_BLOCK
        qc = self.config.get("quantization_config") if isinstance(self.config, dict) else None
        if isinstance(qc, dict) and qc.get("weight_block_size") is not None:
            wbs = qc["weight_block_size"]
            if not (isinstance(wbs, list) and len(wbs) == 2 and wbs[0] == wbs[1] and isinstance(wbs[0], int)
                    and wbs[0] > 0):
                raise CheckpointError("dtype_unsupported", f"quantization_config.weight_block_size {wbs!r} "
                                                           "is not a square block size")
            block = wbs[0]
        scale_name = f"{name}_scale_inv"
        if not self.has_tensor(scale_name):
            raise CheckpointError("tensor_missing", f"F8_E4M3 tensor {name!r} has no {scale_name!r} block scales")
        sinfo = self.tensor_info(scale_name)
        rows, cols = info.shape
        want = (-(-rows // block), -(-cols // block))
        if sinfo.shape != want:
            raise CheckpointError("offsets_invalid", f"{scale_name!r} has shape {sinfo.shape}, expected {want} for "
                                                     f"{block}x{block} blocks of {info.shape}")
        if sinfo.dtype not in ("F32", "BF16", "F16"):
            raise CheckpointError("dtype_unsupported", f"{scale_name!r} has dtype {sinfo.dtype}; expected F32/BF16/F16")
        b0, b1 = r0 // block, (-(-r1 // block)) if r1 > r0 else r0 // block
        scales = self.read_tensor(scale_name, rows=(b0, b1))  # (block rows, col blocks)
        # expand each scale over its block; edge blocks are cut to the tensor's size
        full = np.repeat(np.repeat(scales, block, axis=0), block, axis=1)  # (rows', cols')
        full = full[r0 - b0 * block: r1 - b0 * block, :cols]
        return (values * full).astype(np.float32, copy=False)


__all__ = ["CONFIG", "FP8_E4M3_LUT", "HEADER_PROBE", "INDEX", "SINGLE", "CheckpointError", "CheckpointReader",
           "TensorInfo", "decode_dense"]


def _json_ints(value: Any) -> tuple[int, ...]:
    """A header's list of integers; ValueError for anything else. Not int() of each: a float such as
    1e999 (infinity once parsed) raised OverflowError past the reader's errors, and 2.5 became 2."""
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise ValueError
    return tuple(value)
