"""The gate-weighted combine of a distributed layer forward, fed as results arrive.

Pure module (no Django, no I/O). A forward's routing is a set of (token, expert) *pairs*,
each with its gate weight. Expert results arrive batch by batch, in any order, from local
compute and from remote holders; each is added into the output the moment it arrives
(`add`), so the combine never waits for the slowest batch before doing its work, and a
result already combined is kept when other batches fail and are replanned.

Routed and shared slots are summed apart, because a partial result treats them apart:

* routed slots (expert id < n_routed) are renormalized over the ones that answered, so a
  token keeps its routed gate mass — the distributed analogue of serving with a reduced
  top-k (docs/specification.md, "Distributed forward");
* shared slots (the shared experts, and a dense layer's d_ff slices, weight 1.0 each) are not
  a choice among alternatives: one that is missing is simply absent from the sum.

`finish` then either fails closed (default: any missing pair is an error listing the
uncovered pairs) or, with `allow_partial`, returns the renormalized output with the missing
pairs and, per token, the share of its gate mass that was lost. A token whose served share
falls below `min_gate_mass`, or that nothing answered for, is always an error: no result is
better than a silently degraded one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import Unavailable


class ForwardIncomplete(Unavailable):
    """Some (layer, expert, token) pairs were not served; `missing` lists them."""

    reason = "forward_incomplete"

    def __init__(self, message: str, *, missing: list[dict[str, int]], reason: str | None = None,
                 **details: Any) -> None:
        super().__init__(message, reason=reason or self.reason, missing=missing, **details)


@dataclass(frozen=True)
class CombineResult:
    """out f32 [tokens, d_model]; lost_share f32 [tokens] (0 where nothing was lost);
    missing: the unserved pairs as [{layer, expert, token_index}], sorted."""

    out: np.ndarray
    lost_share: np.ndarray
    missing: list[dict[str, int]]


class StreamingCombine:
    """Accumulates expert results into one output, pair by pair.

    Pairs are given flat: tokens, experts, weights, each (n_pairs,); `layer` is the one layer
    of this forward and `n_routed` the first shared expert id (gate metadata).
    """

    def __init__(self, *, n_tokens: int, d_model: int, layer: int, tokens: np.ndarray, experts: np.ndarray,
                 weights: np.ndarray, n_routed: int) -> None:
        self.layer = layer
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.experts = np.asarray(experts, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.float32)
        if not len(self.tokens) == len(self.experts) == len(self.weights):
            raise ValueError("tokens, experts and weights of the pairs differ in length")
        self.shared = self.experts >= n_routed
        self.served = np.zeros(len(self.tokens), dtype=bool)
        self._routed_out = np.zeros((n_tokens, d_model), dtype=np.float32)
        self._shared_out = np.zeros((n_tokens, d_model), dtype=np.float32)

    @property
    def n_pairs(self) -> int:
        return len(self.tokens)

    def add(self, pairs: np.ndarray, rows: np.ndarray) -> None:
        """Add one batch's result: pairs int64 [n] (indices into the pairs, one expert's, distinct
        tokens), rows f32 [n, d_model] in the same order. A pair is added at most once."""
        pairs = np.asarray(pairs, dtype=np.int64)
        if rows.shape != (len(pairs), self._routed_out.shape[1]):
            raise ValueError(f"a batch of {len(pairs)} pairs answered rows of shape {rows.shape}, "
                             f"expected ({len(pairs)}, {self._routed_out.shape[1]})")
        if len(pairs) == 1:  # a decode step's batch: the same products and sums as below, without the index arrays
            pair = int(pairs[0])
            if self.served[pair]:
                raise ValueError("a pair was combined twice")
            self.served[pair] = True
            out = self._shared_out if self.shared[pair] else self._routed_out
            out[self.tokens[pair]] += self.weights[pair] * rows[0]
            return
        if self.served[pairs].any():
            raise ValueError("a pair was combined twice")  # a hedge's loser must never be added
        self.served[pairs] = True
        weighted = self.weights[pairs, None] * rows
        shared = self.shared[pairs]
        tokens = self.tokens[pairs]
        # Tokens are distinct within one expert's batch, so fancy-index += is exact (no np.add.at).
        if shared.all():
            self._shared_out[tokens] += weighted
        elif not shared.any():
            self._routed_out[tokens] += weighted
        else:
            self._shared_out[tokens[shared]] += weighted[shared]
            self._routed_out[tokens[~shared]] += weighted[~shared]

    def unserved(self) -> np.ndarray:
        """Indices of the pairs not served yet, int64 ascending."""
        return np.flatnonzero(~self.served)

    def missing_pairs(self) -> list[dict[str, int]]:
        gone = self.unserved()
        rows = sorted(zip(self.experts[gone].tolist(), self.tokens[gone].tolist(), strict=True))
        return [{"layer": self.layer, "expert": e, "token_index": t} for e, t in rows]

    def finish(self, *, allow_partial: bool, min_gate_mass: float = 0.0) -> CombineResult:
        """The output; raises ForwardIncomplete when pairs are missing and `allow_partial` is
        false, or a token's served share of gate mass is below `min_gate_mass` or zero."""
        n_tokens = self._routed_out.shape[0]
        if self.served.all():
            return CombineResult(self._routed_out + self._shared_out, np.zeros(n_tokens, np.float32), [])
        missing = self.missing_pairs()
        if not allow_partial:
            raise ForwardIncomplete(
                f"{len(missing)} (expert, token) pairs were not served by any holder: {_sample(missing)}; "
                "set allow_partial to accept a renormalized partial result", missing=missing)
        mass = np.abs(self.weights)  # sigmoid/softmax weights are >= 0; abs keeps the share in [0, 1] anyway
        total = np.bincount(self.tokens, weights=mass, minlength=n_tokens)
        served = np.bincount(self.tokens, weights=mass * self.served, minlength=n_tokens)
        routed = ~self.shared
        routed_total = np.bincount(self.tokens, weights=self.weights * routed, minlength=n_tokens)
        routed_served = np.bincount(self.tokens, weights=self.weights * (routed & self.served), minlength=n_tokens)
        with np.errstate(divide="ignore", invalid="ignore"):
            lost = np.where(total > 0, 1.0 - served / total, 0.0)
            scale = np.where(routed_served != 0, routed_total / routed_served, 0.0)
        touched = np.bincount(self.tokens, minlength=n_tokens) > 0
        empty = touched & (served <= 0)
        low = touched & (1.0 - lost < min_gate_mass)
        if empty.any() or low.any():
            bad = np.flatnonzero(empty | low).tolist()
            why = (f"{len(bad)} tokens kept less than min_gate_mass={min_gate_mass} of their gate mass "
                   "(or nothing answered for them)")
            raise ForwardIncomplete(f"{why}: tokens {bad[:16]}{' …' if len(bad) > 16 else ''}; missing pairs "
                                    f"{_sample(missing)}", missing=missing, reason="gate_mass_lost")
        out = scale.astype(np.float32)[:, None] * self._routed_out + self._shared_out
        return CombineResult(out, lost.astype(np.float32), missing)


def _sample(missing: list[dict[str, int]], limit: int = 8) -> str:
    shown = ", ".join(f"(layer {m['layer']}, expert {m['expert']}, token {m['token_index']})" for m in missing[:limit])
    return shown + (f" and {len(missing) - limit} more" if len(missing) > limit else "")
