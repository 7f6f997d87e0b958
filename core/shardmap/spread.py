"""Placing each routed expert's rows on holders: candidates, greedy order, water-filling splits.

Pure module (no Django); the rules and their reasons are in core.shardmap.planner's
docstring, this module is their arithmetic. It works on Python lists rather than numpy:
the loop visits one expert at a time with a handful of candidates each, where numpy's
per-call overhead (about a microsecond) would cost more than the arithmetic.

Units: rows are (token, expert) pairs; rate is capacity_tps in rows per second; latency
and finish times are seconds. With the wire's time per row known (``row_bytes`` times a
provider's measured seconds per byte, w), a holder's rate is its compute and its path in
series: 1 / (1/rate + w) = rate / (1 + rate * w), which is rate itself, bit for bit, where w is 0.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, overload

import numpy as np

from core.shardmap.index import ShardIndex

NO_HOLDER, HOLDERS_EXCLUDED, ONLY_COLD = "no_holder", "holders_excluded", "only_cold_holders"
BELOW_FLOOR = "below_reputation_floor"

# A holder that has measured nothing (new, or just restarted) advertises capacity_tps 0. It is
# ranked as fast as the slowest measured holder: behind the ones with numbers, not shut out by them
# (a holder that is never planned on never measures anything). With no measurement at all, every
# holder counts 1 token/s, which keeps the finish-time arithmetic finite.
MIN_RATE = 1.0
FEW_PIECES = 32  # up to this many pieces (a decode step's top-k), backups are ranked over lists (RankedLater)


def holder_rates(capacity: np.ndarray) -> np.ndarray:
    """capacity int64 (n_holders,) -> rows/s f64 (n_holders,): a 0 (unmeasured) becomes the
    smallest measured capacity of the index, or MIN_RATE when none is measured."""
    measured = capacity[capacity > 0]
    fill = float(measured.min()) if len(measured) else MIN_RATE
    return np.where(capacity > 0, capacity, fill).astype(np.float64)


@dataclass(frozen=True, slots=True)
class Columns:
    """A ShardIndex's columns as lists (see core.shardmap.index for the layout)."""

    offsets: list[int]  # (n_experts + 1): expert e's holder rows
    n_warm: list[int]  # (n_experts): its Warm holders are the first n_warm[e] rows (Warm sorts first)
    hot: list[bool]  # (n_experts)
    provider: list[int]  # (n_holders): provider index per holder row
    rate: list[float]  # (n_holders): capacity_tps, an unmeasured one's filled in (holder_rates)
    gpu: list[bool]  # (n_providers)
    latency: list[float]  # (n_providers): seconds
    rank: list[int]  # (n_providers): exact ties go to the smaller rank (higher reputation, then provider id)
    barred: frozenset[int]  # providers whose reputation is below the policy's floor
    n_experts: int
    # The same as arrays, for the vectorized backup ranking: (n_experts + 1,), (n_experts,), (n_holders,)
    offsets_array: np.ndarray
    n_warm_array: np.ndarray
    rate_array: np.ndarray
    rank_array: np.ndarray
    wire_array: np.ndarray  # (n_providers,): seconds per byte of request and answer beyond the round trip
    provider_array: np.ndarray  # (n_holders,)
    wire_measured: bool  # some provider's wire time is above 0
    # row_bytes -> (rates with the wire in series, as a list and as an array): _rates
    with_wire: dict[int, tuple[list[float], np.ndarray]] = field(default_factory=dict)


_CACHE: weakref.WeakKeyDictionary[ShardIndex, Columns] = weakref.WeakKeyDictionary()


def columns_of(shard: ShardIndex) -> Columns:
    """The index's columns as lists, computed once per index and kept while the index lives.

    Two threads may both compute them the first time; the results are equal, so either wins.
    """
    cols = _CACHE.get(shard)
    if cols is None:
        warm = shard.holder_warm.astype(np.int64)
        n_warm = np.add.reduceat(warm, shard.offsets[:-1]) if shard.n_experts else np.zeros(0, np.int64)
        rate = holder_rates(shard.holder_capacity)
        cols = Columns(
            offsets=shard.offsets.tolist(), n_warm=n_warm.tolist(), hot=shard.hot.tolist(),
            provider=shard.holder_provider.tolist(), rate=rate.tolist(), gpu=shard.provider_gpu.tolist(),
            latency=shard.provider_latency_s.tolist(), rank=shard.provider_rank.tolist(),
            wire_array=shard.provider_wire_s_per_byte,
            provider_array=shard.holder_provider, wire_measured=bool(shard.provider_wire_s_per_byte.any()),
            barred=frozenset(np.flatnonzero(shard.provider_barred).tolist()), n_experts=shard.n_experts,
            offsets_array=shard.offsets, n_warm_array=n_warm, rate_array=rate, rank_array=shard.provider_rank)
        _CACHE[shard] = cols
    return cols


class Piece(NamedTuple):
    """Rows ``first : first + rows`` of segment ``segment`` (expert ``expert``) go to ``provider``."""

    segment: int
    expert: int
    provider: int
    first: int
    rows: int
    backups: Sequence[int]  # provider indices, best first: a tuple, or a RankedLater for a plan of few pieces


def place(
    shard: ShardIndex,
    segment_expert: list[int],
    segment_rows: list[int],
    *,
    allow_cold: bool,
    excluded: set[int],
    min_batch_rows: int,
    row_bytes: int = 0,
) -> tuple[list[Piece], list[tuple[int, str]]]:
    """Place every segment (one routed expert's rows); return its pieces and the refused segments.

    ``segment_expert[s]`` is an expert index of the index, or >= n_experts for an expert
    nobody holds. Pieces come sorted by (segment, provider); segments must be in expert order
    for that to be (layer, expert, provider id) order, as the planner gives them. ``row_bytes``:
    the bytes one row costs on the wire, request and answer (0: the wire's time is not modelled).
    """
    cols = columns_of(shard)
    prov, lat, rank = cols.provider, cols.latency, cols.rank
    offsets, n_warm, hot, gpu, n_experts = cols.offsets, cols.n_warm, cols.hot, cols.gpu, cols.n_experts
    rate, rate_array = _rates(cols, row_bytes)
    # Below the reputation floor is treated as excluded, except in the reason an expert reports.
    barred = excluded | cols.barred if cols.barred else excluded
    refused: list[tuple[int, str]] = []
    chosen_tier: dict[int, list[int]] = {}  # segment -> candidate holder rows, preferred ones first
    preferred: dict[int, int] = {}  # segment -> how many leading candidates are preferred (GPU, hot)
    usable: set[int] = set()
    routable = 0
    for s, (e, n) in enumerate(zip(segment_expert, segment_rows, strict=True)):
        if e >= n_experts:
            refused.append((s, NO_HOLDER))
            continue
        a, b = offsets[e], offsets[e + 1]
        w = a + n_warm[e]
        if barred:
            warm = [j for j in range(a, w) if prov[j] not in barred]
            cold = [j for j in range(w, b) if prov[j] not in barred]
        else:
            warm, cold = list(range(a, w)), list(range(w, b))
        if not warm and not cold:
            # Some holder left out only by the floor: the floor is why, else this forward's failures.
            floor_only = any(prov[j] not in excluded for j in range(a, b))
            refused.append((s, BELOW_FLOOR if floor_only else HOLDERS_EXCLUDED))
            continue
        if not warm and not allow_cold:
            refused.append((s, ONLY_COLD))
            continue
        tier = warm or cold
        gpus = len(tier)
        if hot[e]:  # GPU holders first (stable: each group keeps its shard-map order)
            first = [j for j in tier if gpu[prov[j]]]
            gpus = len(first)
            if first:
                tier = first + [j for j in tier if not gpu[prov[j]]]
        chosen_tier[s] = tier
        preferred[s] = gpus or len(tier)  # no GPU holder: every candidate is preferred alike
        usable.update(map(prov.__getitem__, tier))
        routable += n
    fair = max(-(-routable // len(usable)), 1) if usable else 1

    load = [0] * len(cols.latency)
    placed: dict[int, list[tuple[int, int]]] = {}
    # Longest first; equal counts in segment order, i.e. (layer, expert) order.
    for s in sorted(chosen_tier, key=lambda s: (-segment_rows[s], s)):
        n, tier, g = segment_rows[s], chosen_tier[s], preferred[s]
        pieces = min(len(tier), -(-n // fair), n // min_batch_rows)
        alloc = _water_fill(n, tier, g, pieces, cols, rate, load, min_batch_rows) if pieces > 1 else None
        if alloc is None:
            # Whole, on the best preferred candidate; exact float ties go to the higher reputation,
            # then the smaller provider id (the rank).
            best = min(tier[:g], key=lambda j, n=n: (lat[prov[j]] + (load[prov[j]] + n) / rate[j], rank[prov[j]]))
            alloc = [(best, n)]
        for j, r in alloc:
            load[prov[j]] += r
        placed[s] = alloc

    out: list[tuple[int, int, int, int, int]] = []  # (segment, expert, holder row, first, rows)
    for s in sorted(placed):
        e, first = segment_expert[s], 0
        for j, r in sorted(placed[s], key=lambda item: prov[item[0]]):
            out.append((s, e, j, first, r))
            first += r
    backups = _backups(shard, cols, rate, rate_array, out, load, allow_cold=allow_cold, excluded=barred)
    return [Piece(s, e, prov[j], first, r, b) for (s, e, j, first, r), b in zip(out, backups, strict=True)], refused


MAX_ROW_SIZES = 8  # the row sizes an index keeps rates for (a codec and width each; a node sees a few)


def _rates(cols: Columns, row_bytes: int) -> tuple[list[float], np.ndarray]:
    """Each holder row's rate in rows/s, as a list and as an array: capacity_tps, with the wire's time per
    row in series where it is measured. Computed once per index and row size, for every holder at once
    (a few milliseconds for a whole model's, once per view), so that a decode step's plan pays nothing."""
    if row_bytes <= 0 or not cols.wire_measured:
        return cols.rate, cols.rate_array
    cached = cols.with_wire.get(row_bytes)
    if cached is None:
        if len(cols.with_wire) >= MAX_ROW_SIZES:
            cols.with_wire.clear()
        rate = cols.rate_array
        array = rate / (1.0 + rate * row_bytes * cols.wire_array[cols.provider_array])
        cached = cols.with_wire[row_bytes] = (array.tolist(), array)
    return cached


def _backups(shard: ShardIndex, cols: Columns, rate: list[float], rate_array: np.ndarray,
             pieces: list[tuple[int, int, int, int, int]], load: list[int], *,
             allow_cold: bool, excluded: set[int] | frozenset[int]) -> list[Sequence[int]]:
    """Each piece's backup providers, best first, ranked for all pieces in one sort; for a plan of at most
    FEW_PIECES pieces (a decode step's), each piece's own, ranked when first read (RankedLater).

    Pool per piece: its expert's Warm holder rows (and Cold ones with ``allow_cold``) minus
    the excluded (and below-floor) providers and the piece's own holder. Key, in order: Cold
    after Warm; for a hot expert, CPU after GPU; finish(h, rows) = latency + (final load +
    rows) / rate; the rank (higher reputation, then provider id) for exact ties.
    """
    if not pieces:
        return []
    if len(pieces) <= FEW_PIECES:
        return [RankedLater(cols, rate, piece, load, allow_cold=allow_cold, excluded=excluded) for piece in pieces]
    expert = np.array([p[1] for p in pieces], dtype=np.int64)  # (n_pieces,)
    own = np.array([p[2] for p in pieces], dtype=np.int64)
    rows = np.array([p[4] for p in pieces], dtype=np.float64)
    start = cols.offsets_array[expert]
    warm_end = start + cols.n_warm_array[expert]
    stop = cols.offsets_array[expert + 1] if allow_cold else warm_end
    lengths = stop - start
    # Ragged arange: for each piece, its pool's holder rows start .. stop-1, all pieces end to end.
    piece = np.repeat(np.arange(len(pieces)), lengths)  # (n_candidates,)
    row = np.arange(len(piece)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + start[piece]
    keep = row != own[piece]
    if excluded:
        keep &= ~np.isin(shard.holder_provider[row], np.fromiter(excluded, dtype=np.int64))
    piece, row = piece[keep], row[keep]
    who = shard.holder_provider[row]
    # rows the holder would have with this piece; the loads gathered for the candidates alone when they are
    # fewer than the providers (a decode step's few pieces against a network of a thousand)
    held = np.array([load[p] for p in who.tolist()], np.float64) if len(who) < len(load) \
        else np.asarray(load, dtype=np.float64)[who]
    busy = held + rows[piece]
    finish = shard.provider_latency_s[who] + busy / rate_array[row]
    cpu_of_hot = shard.hot[expert[piece]] & ~shard.provider_gpu[who]
    order = np.lexsort((cols.rank_array[who], finish, cpu_of_hot, row >= warm_end[piece], piece))  # last key first
    ranked = who[order].tolist()
    ends = np.cumsum(np.bincount(piece, minlength=len(pieces))).tolist()
    return [tuple(ranked[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]


class RankedLater(Sequence[int]):
    """One piece's backups (provider indices, best first) in a plan of few pieces, ranked over lists when
    first read, with the plan's final loads. A decode step's batches are nearly always answered by
    their primaries, and ranking every piece's backups up front was the larger part of its plan
    (docs/performance.md, "The decode step's plan: backups ranked when asked for"). Its truth is read
    without ranking: whether any candidate is left, which the forward asks of every request (may it
    hedge?). Two first readers at once both rank it, to the same tuple."""

    __slots__ = ("_allow_cold", "_cols", "_excluded", "_load", "_piece", "_ranked", "_rate")

    def __init__(self, cols: Columns, rate: list[float], piece: tuple[int, int, int, int, int], load: list[int],
                 *, allow_cold: bool, excluded: set[int] | frozenset[int]) -> None:
        # `load` is the plan's own list, final once place() returns: read, never copied
        self._cols, self._rate, self._piece, self._load = cols, rate, piece, load
        self._allow_cold, self._excluded = allow_cold, excluded
        self._ranked: tuple[int, ...] | None = None

    def ranked(self) -> tuple[int, ...]:
        if self._ranked is None:
            self._ranked = self._rank()
        return self._ranked

    def _candidates(self) -> Iterator[tuple[int, int]]:
        """(holder row, provider) of each candidate: the expert's Warm holder rows (and Cold ones with
        allow_cold), less the piece's own holder and the excluded providers."""
        cols, (_, e, own, _, _) = self._cols, self._piece
        start = cols.offsets[e]
        stop = cols.offsets[e + 1] if self._allow_cold else start + cols.n_warm[e]
        prov, excluded = cols.provider, self._excluded
        return ((j, p) for j in range(start, stop) if j != own and (p := prov[j]) not in excluded)

    def _rank(self) -> tuple[int, ...]:
        """_backups' keys and order over lists (a stable sort, as lexsort's), without numpy's per-call cost
        on arrays of a few candidates."""
        cols, (_, e, _, _, rows), load, rate = self._cols, self._piece, self._load, self._rate
        lat, rank, gpu = cols.latency, cols.rank, cols.gpu
        warm_end, hot = cols.offsets[e] + cols.n_warm[e], cols.hot[e]
        ranked = sorted(((j >= warm_end, hot and not gpu[p], lat[p] + (float(load[p]) + float(rows)) / rate[j],
                          rank[p], p) for j, p in self._candidates()), key=lambda c: c[:4])
        return tuple(c[4] for c in ranked)

    def __bool__(self) -> bool:
        if self._ranked is not None:
            return bool(self._ranked)
        return next(self._candidates(), None) is not None

    def __len__(self) -> int:
        return len(self.ranked())

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        return self.ranked()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ranked())

    def __repr__(self) -> str:
        return f"RankedLater({self._ranked!r})" if self._ranked is not None else "RankedLater(<not ranked yet>)"


def _water_fill(n: int, tier: list[int], preferred: int, pieces: int, cols: Columns,
                rate: list[float], load: list[int], min_batch_rows: int
                ) -> list[tuple[int, int]] | None:
    """Split n rows over at most ``pieces`` holders of ``tier`` so that they finish together.

    Picks ``pieces`` holders: the ``preferred`` leading candidates (GPU holders of a hot
    expert) first, the rest only to fill the places they leave, each group in order of the
    time it would finish an even share. While a holder would get fewer than
    ``min_batch_rows`` rows, the one given the fewest (equal counts: the one picked last)
    leaves and the rows are split again. Returns (holder row, rows) pairs with rows >=
    min_batch_rows, or None when only one holder is left: the caller then places the
    expert whole, as it places one that is not split.
    """
    prov, lat, rank = cols.provider, cols.latency, cols.rank
    share = n / pieces

    def by_finish(group: list[int]) -> list[int]:
        return sorted(group, key=lambda j: (lat[prov[j]] + (load[prov[j]] + share) / rate[j], rank[prov[j]]))

    chosen = (by_finish(tier[:preferred]) + by_finish(tier[preferred:]))[:pieces]
    while True:
        rows = _fill(n, [lat[prov[j]] + load[prov[j]] / rate[j] for j in chosen],
                     [rate[j] for j in chosen], [rank[prov[j]] for j in chosen])
        if len(chosen) == 1:
            return None
        if min(rows) >= min_batch_rows:
            return [(j, r) for j, r in zip(chosen, rows, strict=True)]
        drop = min(range(len(chosen)), key=lambda k: (rows[k], -k))
        del chosen[drop]


def _fill(n: int, free_at: list[float], rate: list[float], tie: list[int]) -> list[int]:
    """Integer rows per holder summing to n that equalize finish = free_at + rows / rate.

    Water filling: holders join in order of free_at (ties: ``tie``, the provider's rank)
    while the common finish time T still lies beyond the next one's free_at; each active
    holder gets rate * (T - free_at) rows. Rounding: floors, then the remaining rows one
    each to the largest fractional parts (ties: smaller ``tie``).
    """
    order = sorted(range(len(free_at)), key=lambda k: (free_at[k], tie[k]))
    total_rate = weighted = 0.0
    level = 0.0
    active = 0
    for k in order:
        if active and level <= free_at[k]:
            break  # T does not reach this holder's free time: it and every later one get nothing
        total_rate += rate[k]
        weighted += rate[k] * free_at[k]
        level = (n + weighted) / total_rate
        active += 1
    share = [0.0] * len(free_at)
    for k in order[:active]:
        share[k] = max(rate[k] * (level - free_at[k]), 0.0)  # >= 0 up to float error; clamp it
    rows = [math.floor(x) for x in share]
    left = n - sum(rows)
    by_fraction = sorted(order[:active], key=lambda k: (-(share[k] - rows[k]), tie[k]))
    for i in range(left):  # left < active unless float error; the modulo keeps it safe either way
        rows[by_fraction[i % len(by_fraction)]] += 1
    return rows
