"""Gating for both router families with one call.

softmax (Qwen3MoeSparseMoeBlock): p = softmax(h·Wᵀ); pick top_k by p; weights p (divided by
their sum when norm_topk_prob). gpt-oss's GptOssTopKRouter is this with norm_topk_prob and the
router's linear bias (logits h·Wᵀ + b): the top-k of the logits is the top-k of p, and p over
the k renormalized is the softmax of their k logits.

sigmoid (DeepseekV3TopkRouter, Kimi K2): s = sigmoid(h·Wᵀ); selection on c = s + bias,
limited to the topk_group groups (of n_group) with the largest sum of their two best c;
experts of the other groups are filled with -inf so they can never be picked (DeepSeek's
inference code and transformers 5.x; transformers 4.x filled 0.0, which picks a masked expert
when the kept groups' biased scores are negative). Weights come from the unbiased s, divided
by (sum + 1e-20) when norm_topk_prob, times routed_scaling_factor.

Shared experts follow as ids n_routed .. n_routed+n_shared-1 with weight 1.0 (DeepseekV3MoE
adds the shared MLP unscaled).

dense (a non-MoE SwiGLU layer split along d_ff, core/formats/gate_payload.py): no routed
experts and no logits; the slices 0 .. n_slices-1 are the shared experts, so every token goes
to every slice with weight 1.0 and the combine sums the slices back into the layer's output.

Ties: the reference uses torch.topk, whose order among equal values is unspecified; we break
ties by the lower expert id (stable sort), so a routing is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.experts.errors import NonFiniteInput
from core.experts.validation import check_hidden
from core.formats.gate_payload import GateSpec


@dataclass(frozen=True)
class Routing:
    """experts: int64 [t, k_total] ids; weights: f32 [t, k_total] combine weights.

    Routed slots come first, best selection score first; then the shared experts.
    """

    experts: np.ndarray
    weights: np.ndarray

    def tokens_by_expert(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """{expert id: (token indices int64 [n], weights f32 [n])}, tokens ascending."""
        flat_experts = self.experts.ravel()
        order = np.argsort(flat_experts, kind="stable")  # stable keeps tokens ascending per expert
        sorted_ids = flat_experts[order]
        bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
        k = self.experts.shape[1]
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for chunk in np.split(order, bounds):
            if chunk.size:
                out[int(flat_experts[chunk[0]])] = (chunk // k, self.weights.ravel()[chunk])
        return out


def _top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """int64 [t, k]: column indices of the k largest per row, largest first, ties to lower id."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int64)


def route(gate: GateSpec, hidden: np.ndarray) -> Routing:
    """Route hidden f32 [t, d_model] through `gate`; raises ShapeMismatch / NonFiniteInput."""
    x = check_hidden(hidden, gate.d_model)
    t = x.shape[0]
    if gate.is_dense:  # nothing to choose: only the always-on slices below
        idx, weights = np.empty((t, 0), dtype=np.int64), np.empty((t, 0), dtype=np.float32)
    else:
        idx, weights = _routed(gate, x)
    if gate.n_shared_experts:
        shared = np.arange(gate.n_routed, gate.n_routed + gate.n_shared_experts, dtype=np.int64)
        idx = np.concatenate([idx, np.broadcast_to(shared, (t, shared.size))], axis=1)
        weights = np.concatenate([weights, np.ones((t, shared.size), dtype=np.float32)], axis=1)
    return Routing(experts=np.ascontiguousarray(idx), weights=np.ascontiguousarray(weights, dtype=np.float32))


def _routed(gate: GateSpec, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The routed slots of checked rows x f32 [t, d_model]: (ids int64 [t, top_k], weights f32 [t, top_k])."""
    t = x.shape[0]
    logits = x @ gate.weight.T  # f32 [t, n_routed]; both references compute the router in f32
    if gate.logit_bias is not None:
        logits += gate.logit_bias
    if not np.isfinite(logits).all():
        raise NonFiniteInput("gate logits overflowed f32 (hidden states too large); expected finite logits")
    if gate.router == "softmax":
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
        idx = _top_indices(probs, gate.top_k)
        weights = np.take_along_axis(probs, idx, axis=1)
        if gate.norm_topk_prob:
            weights = weights / weights.sum(axis=1, keepdims=True)
    else:
        with np.errstate(over="ignore"):  # exp(-x) overflows to inf for very negative x: sigmoid -> 0
            scores = 1.0 / (1.0 + np.exp(-logits))
        choice = scores if gate.bias is None else scores + gate.bias
        if gate.n_group > 1 and gate.topk_group < gate.n_group:
            per_group = gate.n_routed // gate.n_group
            grouped = choice.reshape(t, gate.n_group, per_group)
            best = min(2, per_group)  # DeepSeek ranks a group by the sum of its two best scores
            group_scores = np.sort(grouped, axis=2)[:, :, -best:].sum(axis=2)
            kept = _top_indices(group_scores, gate.topk_group)
            keep = np.zeros((t, gate.n_group), dtype=bool)
            np.put_along_axis(keep, kept, True, axis=1)
            choice = np.where(np.repeat(keep, per_group, axis=1), choice, np.float32(-np.inf))
        idx = _top_indices(choice, gate.top_k)
        weights = np.take_along_axis(scores, idx, axis=1)
        if gate.norm_topk_prob:
            weights = weights / (weights.sum(axis=1, keepdims=True) + np.float32(1e-20))
    return idx, weights * np.float32(gate.routed_scaling_factor)
