"""Boundary checks on hidden-state batches, shared by gating, the expert forward and the facade."""

from __future__ import annotations

import numpy as np

from core.experts.errors import NonFiniteInput, ShapeMismatch

_MAX_LISTED_ROWS = 8  # keep error messages short for a 512-row batch full of NaN


def check_hidden(hidden: np.ndarray, d_model: int, *, what: str = "hidden") -> np.ndarray:
    """Return `hidden` as a C-contiguous f32 [t, d_model] array, or raise.

    Accepts any real floating dtype (cast to f32, the wire format); rejects other ranks,
    widths and dtypes (ShapeMismatch) and rows holding NaN/±inf (NonFiniteInput, naming the
    first rows), since one bad row would poison the gate softmax and every combined output.
    """
    if not isinstance(hidden, np.ndarray):
        raise ShapeMismatch(f"{what} must be a numpy array, received {type(hidden).__name__}")
    if hidden.ndim != 2:
        raise ShapeMismatch(f"{what} must be 2-D [tokens, {d_model}], received shape {hidden.shape}")
    if hidden.shape[1] != d_model:
        raise ShapeMismatch(
            f"{what} has d_model {hidden.shape[1]}, expected {d_model} (shape {hidden.shape})"
        )
    if hidden.dtype.kind != "f":  # np.floating's dtypes (np.issubdtype costs more than a decode row's check)
        raise ShapeMismatch(f"{what} must be floating point (f32 expected), received {hidden.dtype}")
    # copy only when needed: the common f32 C-contiguous batch passes through untouched
    x = np.ascontiguousarray(hidden, dtype=np.float32)
    finite = np.isfinite(x)
    if not finite.all():
        bad_rows = np.flatnonzero(~finite.all(axis=1))
        listed = ", ".join(str(int(r)) for r in bad_rows[:_MAX_LISTED_ROWS])
        more = f" and {bad_rows.size - _MAX_LISTED_ROWS} more" if bad_rows.size > _MAX_LISTED_ROWS else ""
        raise NonFiniteInput(
            f"{what} has NaN/inf in {bad_rows.size} of {x.shape[0]} rows (rows {listed}{more}); "
            "expected finite f32 values"
        )
    return x
