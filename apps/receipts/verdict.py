"""A dispute's comparison: a receipt's committed sketch against an honest re-execution.

Pure module. The disputer runs the stored request through its own copy of the expert (the
same weights: the holding's blob) and measures, per row, relative to the largest magnitude of
its recomputed row (scale s):

* value difference: |committed value - recomputed value at that index| / s, and
* omission: how far a feature the receipt left out exceeds the smallest committed magnitude,
  / s (a holder that hid a large feature, or committed a shrunk row, shows here).

The measured difference is the largest of both over every row. The tolerance covers what an
honest holder may legitimately differ by: the answer's wire codec (a Q8_0 answer rounds each
value by at most half a step, amax/127/2 <= s/254, plus the f16 scale's own rounding) and the
compute path (a holder's fused kernel quantizes activations to int8 blocks, ~1-2% relative per
expert; another batch size or a machine without the C kernels takes an exact-f32 path;
summation order differs between BLAS builds), the latter an operator setting
(TENZRO_DISPUTE_COMPUTE_TOLERANCE, default 0.05 of the row's scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Half a Q8_0 step of the row's amax, and the f16 block scale's relative rounding (2**-11) on top.
CODEC_TOLERANCE = {"f32": 0.0, "q8_0": 1.0 / 254.0 + 2.0**-11}


@dataclass(frozen=True)
class Comparison:
    upheld: bool
    difference: float  # the measured difference, in units of the recomputed row's scale
    tolerance: float
    worst_row: int  # the row where it was measured (-1 for an empty batch)
    detail: str


def compare_sketch(indices: np.ndarray, values: np.ndarray, recomputed: np.ndarray, *, output_encoding: str,
                   compute_tolerance: float) -> Comparison:
    """indices int64 [n, k], values f32 [n, k] (the committed sketch); recomputed f32 [n, d]."""
    n, k = indices.shape
    tolerance = CODEC_TOLERANCE.get(output_encoding, 0.0) + compute_tolerance
    if n == 0 or k == 0:
        return Comparison(False, 0.0, tolerance, -1, "nothing committed")
    if recomputed.shape[0] != n or int(indices.max()) >= recomputed.shape[1]:
        return Comparison(True, float("inf"), tolerance, 0,
                          f"the sketch does not fit the recomputed rows {recomputed.shape}")
    mag = np.abs(recomputed.astype(np.float64))  # (n, d)
    scale = np.maximum(mag.max(axis=1), np.finfo(np.float32).tiny)  # (n,)
    at = np.take_along_axis(recomputed.astype(np.float64), indices, axis=1)  # (n, k)
    value_diff = (np.abs(values.astype(np.float64) - at).max(axis=1)) / scale  # (n,)
    left_out = mag.copy()
    np.put_along_axis(left_out, indices, -np.inf, axis=1)
    smallest_committed = np.abs(values.astype(np.float64)).min(axis=1)  # (n,)
    omission = np.maximum(left_out.max(axis=1) - smallest_committed, 0.0) / scale if k < mag.shape[1] \
        else np.zeros(n)
    worst = np.maximum(value_diff, omission)
    row = int(np.argmax(worst))
    difference = float(worst[row])
    kind = "a committed value" if value_diff[row] >= omission[row] else "a feature left out of the sketch"
    return Comparison(difference > tolerance, difference, tolerance, row,
                      f"row {row}: {kind} differs by {difference:.4g} of the row's scale "
                      f"(tolerance {tolerance:.4g})")
