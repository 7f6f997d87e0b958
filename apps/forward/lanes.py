"""A holder's request cut in expert order over the connection lanes its transport offers.

Pure (no Django, no QUIC library). The transport says how many lanes a request of so many rows
may take (HolderCaller.lanes over QuicPool.lanes_for; the rule is core/transport/lanes.py's); the
engine cuts the request here and sends each part on its own lane. Each part is a whole multi-expert
request of its own, with its own receipt, failover and hedging.

The parts are runs of the request's (expert, token) pairs in batch order, sized in proportion to
their lanes' windows, so a part holds whole batches and at most two pieces of batches cut at its
ends: the holder reads each expert's weights once, plus once more per cut. Cut by token instead,
every part named every expert, and a holder of 16 experts whose answer went over 12 lanes read each
expert's weights 12 times: its summed compute rose from 13–38 ms to 300–560 ms a forward, more than
the round trips the lanes saved (docs/performance.md, "Loss and reordering on the wire"). The price
is the carrier: a token routed to two of the holder's experts may travel in two parts, so the parts'
requests together are up to the answer's size (each part's request is at most its own answer), where
by token they were the request's.
"""

from __future__ import annotations

import numpy as np

from core.shardmap.planner import Batch


def lane_weights(windows: list[int]) -> list[float]:
    """Each lane's share of a request, in proportion to its window (bytes it may have in flight); an
    unknown window (0) counts as the known ones' mean, every one as 1 when none is known."""
    known = [w for w in windows if w > 0]
    fill = sum(known) / len(known) if known else 1.0
    return [float(w) if w > 0 else fill for w in windows]


def split_in_expert_order(items: list[tuple[Batch, np.ndarray]], windows: list[int]
                          ) -> list[list[tuple[Batch, np.ndarray]]]:
    """`items` [(batch, pairs int64 [n_i])] cut into min(len(windows), pairs) parts, each a run of the
    pairs in batch order, their pair counts in proportion to `windows` (the bytes each lane's
    connection may have in flight; 0 = unknown, counted as the known ones' mean): a lane opened a
    moment ago starts from its initial window, and an even share would make it the forward's slowest
    part. Each part keeps the batches' order and each batch's pairs their order; no part and no batch
    in a part is empty."""
    total = sum(len(pairs) for _, pairs in items)
    lanes = min(len(windows), total)
    if lanes <= 1:
        return [items]
    weights = np.cumsum(lane_weights(windows[:lanes]), dtype=np.float64)
    bounds = [0, *np.rint(total * weights[:-1] / weights[-1]).astype(int).tolist(), total]
    for part in range(1, lanes):  # at least one pair each
        bounds[part] = min(max(bounds[part], bounds[part - 1] + 1), total - (lanes - part))
    parts: list[list[tuple[Batch, np.ndarray]]] = [[] for _ in range(lanes)]
    start = 0
    for batch, pairs in items:
        end = start + len(pairs)
        first = int(np.searchsorted(bounds, start, side="right")) - 1  # the part this batch's first pair is in
        for index in range(first, lanes):
            low, high = max(start, bounds[index]), min(end, bounds[index + 1])
            if low >= high:
                break
            parts[index].append((batch, pairs[low - start:high - start]))
        start = end
    return parts
