"""The error and the value checks every slicer of a checkpoint shares (apps.catalog.slicing, its
per-family modules, apps.catalog.dense). Pure module (no Django)."""

from __future__ import annotations

import numpy as np

from core.errors import TenzroError


class SlicingError(TenzroError, ValueError):
    """A slice the shape or checkpoint cannot give. ``reason``: layer_not_moe, expert_out_of_range,
    unsupported_layout, shape_incomplete, shape_mismatch, non_finite; for dense layers
    (apps.catalog.dense) also layer_is_moe, layer_not_dense, dense_slices_out_of_range, invalid_quant."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)


def finite(name: str, w: np.ndarray) -> np.ndarray:
    if not np.isfinite(w).all():
        raise SlicingError("non_finite", f"{name} holds {int((~np.isfinite(w)).sum())} NaN/inf value(s)")
    return w


__all__ = ["SlicingError", "finite"]
