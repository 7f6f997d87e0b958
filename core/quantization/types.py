"""GGML tensor types, their block geometry, and llama.cpp's fallback rule.

Pure module: numpy only, never Django.
"""

from __future__ import annotations

import enum

QK_K = 256  # elements per K-quant super-block
QK8_0 = 32  # elements per Q8_0 block
QK_MXFP4 = 32  # elements per MXFP4 block


class GGMLType(str, enum.Enum):  # noqa: UP042  (str values are the shared interface)
    """A GGML tensor type, spelled as in GGUF (`GGMLQuantizationType.<name>`)."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    Q8_0 = "Q8_0"
    Q4_K = "Q4_K"
    Q6_K = "Q6_K"
    MXFP4 = "MXFP4"

    @property
    def is_block(self) -> bool:
        """True for block-quantized types (stored as raw u8 blocks)."""
        return self in _BLOCK_TYPES

    @property
    def block_size(self) -> int:
        """Elements per block (1 for dense types)."""
        return BLOCK_GEOMETRY[self][0]

    @property
    def type_size(self) -> int:
        """Bytes per block (bytes per element for dense types)."""
        return BLOCK_GEOMETRY[self][1]

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size


# (elements per block, bytes per block) exactly as GGML_QUANT_SIZES in gguf-py.
BLOCK_GEOMETRY: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q8_0: (QK8_0, 2 + QK8_0),  # f16 d + 32 x int8
    GGMLType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2),  # d, dmin, scales[12], qs[128]
    GGMLType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),  # ql, qh, scales, d
    GGMLType.MXFP4: (QK_MXFP4, 1 + QK_MXFP4 // 2),  # u8 E8M0 exponent + 32 x 4-bit E2M1 codes
}

_BLOCK_TYPES = frozenset({GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.MXFP4})
_K_QUANTS = frozenset({GGMLType.Q4_K, GGMLType.Q6_K})


def parse_type(value: str | GGMLType) -> GGMLType:
    """Parse a type name (`"Q4_K"`, `"q4_k"`); ValueError naming the value if unknown."""
    if isinstance(value, GGMLType):
        return value
    if isinstance(value, str):
        try:
            return GGMLType(value.upper())
        except ValueError:
            pass
    known = ", ".join(t.value for t in GGMLType)
    raise ValueError(f"unknown ggml_type {value!r} (known: {known})")


def row_bytes(ggml_type: GGMLType, n: int) -> int:
    """Bytes taken by one row of `n` elements; ValueError if the block does not divide n."""
    ggml_type = parse_type(ggml_type)
    if n <= 0:
        raise ValueError(f"row length must be positive, got {n}")
    block, size = BLOCK_GEOMETRY[ggml_type]
    if n % block:
        raise ValueError(f"row length {n} is not a multiple of the {ggml_type.value} block size {block}")
    return n // block * size


def resolve_type(requested: GGMLType, n: int) -> GGMLType:
    """The type actually used for rows of length `n`, following llama.cpp's fallback.

    llama.cpp (llama-quant.cpp) falls back when a row is not a multiple of the block:
    K-quants (256) go to a 32-element type, and when 32 does not divide the row either,
    to F16.  We fall back K-quant -> Q8_0 (the 32-block type with the smaller error; llama.cpp
    picks Q5_0/Q8_0 there), and the 32-element types Q8_0 and MXFP4 -> F16 (a row 32 does not
    divide fits no smaller block we ship).  Dense types never fall back.
    """
    requested = parse_type(requested)
    if n <= 0:
        raise ValueError(f"row length must be positive, got {n}")
    if not requested.is_block or n % requested.block_size == 0:
        return requested
    if requested in _K_QUANTS and n % QK8_0 == 0:
        return GGMLType.Q8_0
    return GGMLType.F16
