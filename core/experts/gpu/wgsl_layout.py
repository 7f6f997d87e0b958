"""The WGSL device's weight layout: every GGML block format transcoded, on the host, to one form.

    quants  int8 [m, n], packed 4 per u32 little-endian: word k of a row holds values
            4k .. 4k+3 in bits 0-7, 8-15, 16-23, 24-31 (two's complement)
    meta    per sub-block of G values: f32 scale a (formats without an offset), or
            (a, b) f32 pairs (Q4_K), [m, n/G] resp. [m, n/G, 2]

    w[r, G*s + i] = a[r, s] * q[r, G*s + i] - b[r, s]

    format  G   q            a                 b
    Q8_0    32  -127..127    d                 (none)
    Q4_K    32  0..15        d * sc[j]         dmin * m[j]
    Q6_K    16  -32..31      d * scales[j]     (none)

a and b are computed with exactly the f32 operations gguf-py's dequantizer uses (f16 widened
to f32, times the 6-bit or int8 sub-block scale as f32), so `dequantize_device` (a*q - b in
f32) is bit-identical to gguf.quants.dequantize; tests/experts/test_gpu_wgsl.py checks it.
One layout means one shader for all block formats (compiled per G and offset/no offset) and
no bit-unpacking of 4- and 6-bit fields on the device, at the price of device memory: 1.125
bytes a weight for Q8_0 (raw 1.06), 1.25 for Q4_K (raw 0.56) and Q6_K (raw 0.82).

Pure numpy: no wgpu import, so the transcoding is testable without a device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.quantization.q4_k import unpack_scales_k4
from core.quantization.types import row_bytes

# format -> (G values per sub-block, has an offset b)
SUB_BLOCK = {"Q8_0": (32, False), "Q4_K": (32, True), "Q6_K": (16, False)}


@dataclass(frozen=True)
class DeviceLayout:
    """One block-quantized matrix [m, n] in the device layout (host numpy arrays).

    quants: u32 [m, n/4]; meta: f32 [m, n/G] (no offset) or f32 [m, n/G, 2] (scale, offset).
    """

    ggml_type: str
    shape: tuple[int, int]
    group: int
    has_offset: bool
    quants: np.ndarray
    meta: np.ndarray


def _f16(raw: np.ndarray) -> np.ndarray:
    """(…, 2) u8 little-endian f16 -> (…,) f32, exact (as gguf's .view(f16).astype(f32))."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float32)


def transcode(ggml_type: str, blocks: np.ndarray, shape: tuple[int, int]) -> DeviceLayout:
    """u8 raw GGML blocks [m, row_bytes] of a [m, n] matrix -> its DeviceLayout.

    Raises ValueError for a format outside SUB_BLOCK or bytes that do not match the shape.
    """
    if ggml_type not in SUB_BLOCK:
        raise ValueError(f"no device layout for {ggml_type!r} (block formats: {sorted(SUB_BLOCK)})")
    m, n = shape
    expect = (m, row_bytes(ggml_type, n))
    if blocks.dtype != np.uint8 or blocks.shape != expect:
        raise ValueError(f"{ggml_type} [{m}, {n}] needs u8 {expect}, received {blocks.dtype} {blocks.shape}")
    group, has_offset = SUB_BLOCK[ggml_type]
    if ggml_type == "Q8_0":
        b = blocks.reshape(m, n // 32, 34)
        a = _f16(b[:, :, 0:2])  # (m, n/32)
        q = b[:, :, 2:].view(np.int8)  # (m, n/32, 32)
        meta = a
    elif ggml_type == "Q4_K":
        b = blocks.reshape(m * (n // 256), 144)  # one row per super-block
        d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]  # (nb, 1)
        sc, mn = unpack_scales_k4(b[:, 4:16])  # (nb, 8) u8
        a = d * sc.astype(np.float32)  # gguf: (d * sc.astype(f32)), (nb, 8)
        off = dmin * mn.astype(np.float32)
        # qs byte 32c + l: q[64c + l] low nibble, q[64c + 32 + l] high nibble
        qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (qs & np.uint8(0x0F)).view(np.int8)  # (nb, 4, 2, 32) = (nb, 8 sub-blocks, 32)
        meta = np.stack([a, off], axis=-1).reshape(m, n // 32, 2)
    else:  # Q6_K
        b = blocks.reshape(m * (n // 256), 210)
        d = _f16(b[:, 208:210])[:, None]  # (nb, 1)
        a = d * b[:, 192:208].view(np.int8).astype(np.float32)  # (nb, 16), gguf's order
        ql = b[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        ql = (ql & np.uint8(0x0F)).reshape(-1, 8, 32)  # (nb, 8, 32)
        qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        qh = (qh & np.uint8(0x03)).reshape(-1, 8, 32)
        q = (ql | (qh << np.uint8(4))).view(np.int8) - np.int8(32)  # (nb, 8, 32) in -32..31
        meta = a.reshape(m, n // 16)
    quants = np.ascontiguousarray(q.reshape(m, n)).view("<u4")  # (m, n/4)
    return DeviceLayout(ggml_type, (m, n), group, has_offset, quants, np.ascontiguousarray(meta, dtype=np.float32))


def dequantize_device(layout: DeviceLayout) -> np.ndarray:
    """f32 [m, n]: a*q - b in f32 as the layout defines it (the shader's weights, for tests)."""
    m, n = layout.shape
    q = layout.quants.view(np.int8).reshape(m, n // layout.group, layout.group).astype(np.float32)
    w = layout.meta[..., 0:1] * q - layout.meta[..., 1:2] if layout.has_offset else layout.meta[..., None] * q
    return w.reshape(m, n)


def magnitude_device(layout: DeviceLayout) -> np.ndarray:
    """f64 [m, n]: |a*q| + |b|, the size of the terms the shader adds (for error bounds: Q4_K's
    a*Σqx - b*Σx cancels, so its rounding scales with these, not with |w|)."""
    m, n = layout.shape
    q = layout.quants.view(np.int8).reshape(m, n // layout.group, layout.group).astype(np.float64)
    if layout.has_offset:
        mag = np.abs(layout.meta[..., 0:1] * q) + np.abs(layout.meta[..., 1:2].astype(np.float64))
    else:
        mag = np.abs(layout.meta[..., None] * q)
    return mag.reshape(m, n)
