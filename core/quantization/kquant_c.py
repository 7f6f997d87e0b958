"""The optional C encoders for Q4_K and Q6_K (core/quantization/_kquant_encoders.c).

_kquant_encoders implements llama.cpp's reference quantizers (quantize_row_q4_K_ref,
quantize_row_q6_K_ref) in their C loop order, so its bytes are those of the reference; the
numpy encoders in q4_k/q6_k do the same f32 operations in the same order and write the same
bytes (the tests compare them), only slower.  `registry.quantize` uses the C encoder when the
extension imported (built by `pip install -e .`, optional) unless TENZRO_KQUANT_C=0.
Decoding never uses it.

The extension holds one copy of each encoder per instruction set ("avx512", "avx2",
"scalar"), all writing the same bytes; the best one this CPU runs is used unless
TENZRO_KQUANT_VARIANT names another (ValueError at import if this CPU cannot run it).

Pure module: numpy only, never Django; importable without the extension.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from .types import GGMLType

try:
    from . import _kquant_encoders as _ext
except ImportError:  # pragma: no cover - no compiler at install time
    _ext = None

ENABLED = _ext is not None and os.environ.get("TENZRO_KQUANT_C", "1") != "0"


def available() -> bool:
    """True when the C extension imported."""
    return _ext is not None


def variants() -> list[str]:
    """The encoder copies this CPU runs, best first ([] without the extension)."""
    return list(_ext.variants()) if _ext is not None else []


def _checked(name: str | None) -> str | None:
    """A variant name this CPU runs (lower-cased), the best one for None/"", or None without the extension."""
    have = variants()
    if not have:
        return None
    name = (name or "").strip().lower() or have[0]
    if name not in have:
        raise ValueError(f"K-quant encoder variant {name!r} is not available here (available: {have})")
    return name


VARIANT = _checked(os.environ.get("TENZRO_KQUANT_VARIANT"))


def enabled() -> bool:
    return ENABLED


def set_enabled(flag: bool) -> None:
    """Switch the C encoders on or off (tests compare both paths)."""
    global ENABLED
    ENABLED = bool(flag) and _ext is not None


def variant() -> str | None:
    """The encoder copy `quantize` runs ("avx512", "avx2", "scalar"), or None when the C encoder is off."""
    return VARIANT if ENABLED else None


def set_variant(name: str | None) -> None:
    """Run the named copy from now on (None: the best); ValueError if this CPU cannot run it."""
    global VARIANT
    VARIANT = _checked(name)


def _encode(fn: Callable[..., None], flat: np.ndarray, type_size: int) -> np.ndarray:
    assert flat.ndim == 2 and flat.shape[1] == 256 and flat.dtype == np.float32, (flat.shape, flat.dtype)
    out = np.empty((flat.shape[0], type_size), dtype=np.uint8)
    fn(np.ascontiguousarray(flat), out, VARIANT)  # releases the GIL
    return out


def quantize_q4_k(flat: np.ndarray) -> np.ndarray | None:
    """f32 (n_blocks, 256) -> u8 (n_blocks, 144), or None when the C encoder is off."""
    return _encode(_ext.quantize_q4_k, flat, GGMLType.Q4_K.type_size) if ENABLED else None


def quantize_q6_k(flat: np.ndarray) -> np.ndarray | None:
    """f32 (n_blocks, 256) -> u8 (n_blocks, 210), or None when the C encoder is off."""
    return _encode(_ext.quantize_q6_k, flat, GGMLType.Q6_K.type_size) if ENABLED else None
