"""The WGSL device's buffers (core/experts/gpu/wgsl.py): an uploaded expert's, the activation
workspace one submission uses, the staging a grouped forward uses, and making and freeing
them so that a failure half way frees what was made."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pass:
    """One dispatch of a matmul: rows [r0, r0 + rows) of one weight, in their own buffers."""

    kernel: str  # "F32" or a block format
    rows: int
    params: Any  # uniform: n, m_out (row stride of y), y_row0, 0
    weights: tuple[Any, ...]  # (w,) dense or (quants, scales)


@dataclass
class WgslExpert:
    """An uploaded expert: the handle `upload` returns. nbytes: device bytes of its buffers."""

    d_model: int
    d_ff: int
    gate_up: list[Pass]
    down: list[Pass]
    silu_params: Any
    nbytes: int
    buffers: list[Any] = field(default_factory=list)
    bind_groups: tuple[int, list[Any]] | None = None  # (workspace generation, groups in pass order)
    released: bool = False


@dataclass
class Workspace:
    gen: int
    x: Any
    gu: Any
    h: Any
    y: Any
    readback: Any
    tokens: Any  # uniform: t, 0, 0, 0
    sizes: tuple[int, int, int]  # bytes of x|y, gu, h


@dataclass
class Staging:
    """A grouped forward's buffers: every expert's rows and token count, uploaded once, and
    every answer, read back once. Grown as needed, reused."""

    x: Any
    tokens: Any
    readback: Any
    sizes: tuple[int, int]  # bytes of x (and readback), tokens


def make_buffers(device: Any, specs: list[tuple[int, int]]) -> list[Any]:
    """One buffer per (size, usage); out of memory half way frees what was made (the next call
    retries) and raises."""
    made: list[Any] = []
    try:
        for size, usage in specs:
            made.append(device.create_buffer(size=size, usage=usage))
    except BaseException:
        destroy_all(made)
        raise
    return made


def destroy_all(buffers: list[Any]) -> None:
    for buf in buffers:
        with suppress(Exception):  # freeing never raises (the device may be gone already)
            buf.destroy()
