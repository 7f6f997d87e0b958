"""The CUDA device's layouts of an expert (core/experts/gpu/cuda.py): what an upload makes of
the CPU backend's host form, how many device bytes that takes, and which experts a grouped
forward can run together. Pure numpy: no CuPy import (the device module's docstring has the
layouts and products in full)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.experts.backends import CpuExpert, CpuWeight

SMALL_BATCH = 8  # batches up to this take the fused mat-vec kernels
HALF_FORMATS = {"F16": "f16", "BF16": "bf16"}


@dataclass(frozen=True)
class DeviceWeight:
    """One matrix on the device: fmt "F32" | "F16" | "BF16" | a block type; data f32 [m, n],
    u16 [m, n] (16-bit bits) or u8 [m, row_bytes]."""

    fmt: str
    shape: tuple[int, int]
    data: Any  # cupy.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True)
class CudaExpert:
    gate_up: tuple[DeviceWeight, ...]
    down: DeviceWeight
    d_ff: int

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.gate_up) + self.down.nbytes


def device_format(weight: CpuWeight, payload_types: tuple[str, ...]) -> str:
    """The device form of a host weight whose payload types (one, or gate and up when stacked)
    are given: the block type itself, F16/BF16 when every part had that type, else F32."""
    if weight.ggml_type != "F32":
        return weight.ggml_type
    kinds = set(payload_types)
    return kinds.pop() if len(kinds) == 1 and next(iter(kinds)) in HALF_FORMATS else "F32"


def narrow(data: np.ndarray, fmt: str) -> np.ndarray:
    """f32 [m, n] widened from F16/BF16 -> its u16 bits again; ValueError when it was not
    (the types passed do not match the host data)."""
    if fmt == "F16":
        half = data.astype(np.float16)
        if np.array_equal(half.astype(np.float32), data):
            return half.view(np.uint16)
    elif fmt == "BF16":
        bits = data.view(np.uint32)
        if not (bits & 0xFFFF).any():
            return (bits >> 16).astype(np.uint16)
    raise ValueError(f"{list(data.shape)} f32 weights are not exactly {fmt}: the payload types do not match the data")


def split_types(host: CpuExpert, types: tuple[str, str, str]) -> list[tuple[CpuWeight, tuple[str, ...]]]:
    """[(host weight, the payload types it holds)] for gate|up (or gate, up) and down."""
    if len(types) != 3:
        raise ValueError(f"types must be the (gate, up, down) ggml types, got {types!r}")
    gate, up, down = types
    if len(host.gate_up) == 1:
        parts = [(host.gate_up[0], (gate, up))]
    else:
        parts = [(host.gate_up[0], (gate,)), (host.gate_up[1], (up,))]
    return [*parts, (host.down, (down,))]


def groupable(handles: list[CudaExpert], xs: list[np.ndarray]) -> bool:
    """Whether forward_group can run these experts together: more than one, every one with
    gate|up stacked, in one non-F32 format and shape (down likewise), every batch a decode one."""
    if len(handles) < 2 or any(x.shape[0] > SMALL_BATCH for x in xs):
        return False

    def shape_of(h: CudaExpert) -> tuple[Any, ...] | None:
        if len(h.gate_up) != 1 or "F32" in (h.gate_up[0].fmt, h.down.fmt):
            return None
        return h.gate_up[0].fmt, h.gate_up[0].shape, h.down.fmt, h.down.shape, h.d_ff

    first = shape_of(handles[0])
    return first is not None and all(shape_of(h) == first for h in handles[1:])


def expert_device_bytes(host: CpuExpert, types: tuple[str, str, str]) -> int:
    """Device bytes of an expert's weights in the layouts above (what upload allocates)."""
    total = 0
    for w, kinds in split_types(host, types):
        fmt = device_format(w, kinds)
        total += w.shape[0] * w.shape[1] * 2 if fmt in HALF_FORMATS else w.nbytes
    return total
