"""A holder's request split by tokens over the connection lanes its transport offers.

Pure (no Django, no QUIC library). The transport says how many lanes a request of so many rows
may take (HolderCaller.lanes over QuicPool.lanes_for; the rule is core/transport/lanes.py's); the
engine cuts the request here and sends each part on its own lane. Each part is a whole multi-expert
request of its own: the same experts, each batch keeping the pairs of the part's tokens, with its
own receipt, failover and hedging. Cutting by token rather than by expert keeps the parts'
carriers apart: a token's row travels once however many of the holder's experts it was routed to.
"""

from __future__ import annotations

import numpy as np

from core.shardmap.planner import Batch


def split_by_tokens(items: list[tuple[Batch, np.ndarray]], pair_tokens: np.ndarray,
                    lanes: int) -> list[list[tuple[Batch, np.ndarray]]]:
    """`items` [(batch, pairs int64 [n_i])], whose pairs index `pair_tokens` int64 [n_pairs], cut into at
    most `lanes` parts: every pair of a token in one part, the parts' pair counts as even as whole
    tokens allow, in token order; a batch left with no pair in a part is not in it. Each part keeps
    the batches' order and each batch's pairs their order."""
    if lanes <= 1:
        return [items]
    tokens = pair_tokens[np.concatenate([pairs for _, pairs in items])]
    unique, counts = np.unique(tokens, return_counts=True)
    lanes = min(lanes, len(unique))
    if lanes <= 1:
        return [items]
    before = np.cumsum(counts) - counts  # pairs of the tokens before each token
    part_of = before * lanes // len(tokens)  # each token's part: 0 .. lanes-1, non-decreasing
    parts: list[list[tuple[Batch, np.ndarray]]] = [[] for _ in range(lanes)]
    for batch, pairs in items:
        part = part_of[np.searchsorted(unique, pair_tokens[pairs])]
        for index in np.unique(part).tolist():
            parts[index].append((batch, pairs[part == index]))
    return [part for part in parts if part]
