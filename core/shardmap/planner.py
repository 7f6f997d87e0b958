"""The dispatch planner: routing decisions in, per-holder batches out (``tenzro_moePlanDispatch``).

Pure and deterministic (no Django, no clock, no randomness). Two entry points over one core:
``plan_pairs`` takes flat pair arrays (what the forward has after gating) and returns a
columnar DispatchPlan; ``plan_dispatch`` takes the JSON routings of docs/specification.md and returns the
specification's plan shape plus ``backups`` per batch and ``unroutable``::

    {batches: [{layer, expert, provider, quic_endpoint, quic_cert_sha256, http_endpoint,
                token_indices: [...], backups: [provider, ...]}],
     token_assignments: [{token_index, slots: [{layer, expert, provider}]}],
     unroutable: [{token_index, layer, expert, reason}]}

Every routed (token, layer, expert) pair ends in exactly one batch (and its token's slots)
or in ``unroutable``, never dropped. Reasons: ``no_holder`` (nobody in the view holds the
expert), ``holders_excluded`` (every holder is in ``exclude``: they failed earlier in this
forward), ``only_cold_holders`` (the holders left are Cold and ``allow_cold`` is false),
``below_reputation_floor`` (every holder not in ``exclude`` has a reputation below the
policy's ``reputation_floor``).

Who may serve an expert (its candidates), strictly in this order:
  0. Never a provider in ``exclude``, nor one whose reputation is below the policy's
     ``reputation_floor`` (governance's line under which a provider's record of failed
     and fraudulent work outweighs its paid work; the shard map still lists it).
  1. Warm holders not excluded; only when there are none, Cold ones (with ``allow_cold``).
  2. For a hot expert (policy hot_threshold_tps on its holders' summed committed_tps) the
     ``moe_gpu`` candidates come first: an expert placed whole goes to the best GPU holder,
     even one whose measured capacity_tps is lower (capacity is measured on the rows a
     holder was sent: a GPU holder sent only small batches shows little); a split picks GPU holders first and
     CPU holders only for the places left, and water filling may leave out a GPU holder
     already so loaded that it would get under ``min_batch_rows`` rows. With no GPU
     candidate the CPU ones serve (docs/specification.md, "Expert runtime": "biases batches for hot experts toward GPU
     holders and falls back to CPU holders when none cover the shard"). A GPU-only rule
     would pile every token of a hot expert on its one GPU holder.

Score (lower is better): the estimated time at which the holder would finish this batch,
    finish(h, rows) = latency_s(h) + (load(h) + rows) / rate(h)
``load`` is the rows this plan already gave h (for any expert), ``rate`` its capacity_tps
in tokens/s (a holder that measured nothing, new or just restarted, counts as the slowest
measured one, so it is sent rows and measures; 1 when nobody measured: core.shardmap.spread),
``latency_s`` its recent round trip (its QUIC path's, else the wire's share of its answers'
latency: docs/protocol.md, "stats"; an unmeasured one counts as the slowest measured,
core.shardmap.index). Latency is paid once per holder: its batches travel
together. Equal scores go to the higher reputation, then the smaller provider id.

When the caller gives ``row_bytes`` (what one row costs on the wire, request and answer), the
rows also pay the holder's path: rate becomes 1 / (1/capacity + row_bytes * wire_s_per_byte),
its measured time per byte beyond the round trip (docs/protocol.md, "stats"). Without it, a
holder's rows cost compute only, and on a lossy or narrow path, where a row's bytes take longer
than its compute, a few milliseconds of round trip decided where every row of a forward went.

Reputation breaks exact ties only; it does not enter the finish time. It is an amount
(settlement credits less penalties), not a time, and no policy number converts one into
the other; a provider whose record is bad enough is kept out by the floor instead. Ties
are common, not a corner: a network with no measurements yet (every latency 0, equal
capacity_tps) decides every placement by them, and then the provider with the better
paid record wins instead of the smaller id. The same rank orders the water filling's
candidates and rounding, and the backups.

Load spreading: experts are placed in descending order of their token count (ties: layer,
expert), each on the candidate with the lowest finish time: longest-processing-time-first
list scheduling, which keeps every holder within one expert's rows of the least-loaded one
when holders are alike. One expert can still exceed a fair share (a shared expert gets
every token), so an expert with more rows than ``fair = ceil(routable rows / distinct
candidate providers)`` is split over up to ceil(rows / fair) of its candidates by water
filling: the rows go where they finish earliest, so the pieces end at one time. A piece is
never smaller than ``min_batch_rows`` (default 32): below that a batch-1-like expert matmul
is bound by reading the expert's weights, and a second holder reading them again for a few
rows costs more than it saves. A split that shrinks to one holder places the expert whole
(rule 2). A split expert's pieces take consecutive runs of its tokens.

Backups per batch: the expert's other holders, Warm before Cold (Cold only with
``allow_cold``), never an excluded provider, never the batch's own; GPU first for a hot
expert; then by finish(h, rows) with the plan's final loads; then higher reputation; then
provider id; never a provider below the reputation floor. The forward
redispatches to them in this order when the primary stalls, and replans with ``exclude``
when all fail. A plan of at most 32 pieces (a decode step's) ranks a batch's backups when
they are first read, with the plan's final loads (``BackupProviders``): most batches are
answered by their primaries and never read them. Whether a batch has any is known without ranking.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NamedTuple, NoReturn, overload

import numpy as np

from core.shardmap.gossip_view import MAX_ID, ProviderView
from core.shardmap.index import ShardIndex, expert_keys
from core.shardmap.routings import PlanInputError, parse_routings
from core.shardmap.spread import place

__all__ = ["Batch", "DispatchPlan", "PlanInputError", "plan_dispatch", "plan_pairs"]

MIN_BATCH_ROWS = 32
FEW_PAIRS = 32  # up to this many pairs (a decode step's tokens x top-k), segments are found over lists


class Batch(NamedTuple):
    """Rows ``token_indices`` (ascending, int64) of expert (layer, expert) go to ``provider``."""

    layer: int
    expert: int
    provider: ProviderView
    token_indices: np.ndarray
    backups: Sequence[ProviderView]  # best first: a BackupProviders


class BackupProviders(Sequence[ProviderView]):
    """A batch's backups: the plan's ranked provider indices (for a decode step's plan, ranked only when
    first read: core.shardmap.spread.RankedLater), each read as its provider. Its truth (may the batch
    hedge or fail over?) is read without ranking."""

    __slots__ = ("_indices", "_providers")

    def __init__(self, indices: Sequence[int], providers: Sequence[ProviderView]) -> None:
        self._indices, self._providers = indices, providers

    def __bool__(self) -> bool:
        return bool(self._indices)

    def __len__(self) -> int:
        return len(self._indices)

    @overload
    def __getitem__(self, i: int) -> ProviderView: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[ProviderView, ...]: ...
    def __getitem__(self, i: int | slice) -> ProviderView | tuple[ProviderView, ...]:
        if isinstance(i, slice):
            return tuple(self._providers[p] for p in self._indices[i])
        return self._providers[self._indices[i]]

    def __iter__(self) -> Iterator[ProviderView]:
        providers = self._providers
        return (providers[p] for p in self._indices)

    def __repr__(self) -> str:
        return f"BackupProviders({self._indices!r})"


@dataclass(frozen=True, eq=False)
class DispatchPlan:
    """A plan in columns, for the forward; ``to_dict`` gives the JSON shape.

    ``tokens``/``layers``/``experts`` are the pairs as given; ``pair_batch[i]`` is the index in
    ``batches`` serving pair i, -1 when the pair is in ``unroutable`` (sorted tuples
    (token, layer, expert, reason)). ``batches`` are sorted by (layer, expert, provider id).
    ``listed`` are the tokens ``token_assignments`` reports (ascending).
    """

    batches: tuple[Batch, ...]
    tokens: np.ndarray
    layers: np.ndarray
    experts: np.ndarray
    pair_batch: np.ndarray
    unroutable: tuple[tuple[int, int, int, str], ...]
    listed: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape (module docstring). Slot dicts are shared by the tokens of a batch: read-only."""
        slots: list[dict[str, Any] | None] = [
            {"layer": b.layer, "expert": b.expert, "provider": b.provider.provider_id} for b in self.batches]
        slots.append(None)  # pair_batch -1 (unroutable) indexes this last entry
        tokens, pair_batch = self.tokens, self.pair_batch
        if len(tokens) > 1 and not (tokens[1:] >= tokens[:-1]).all():
            by_token = np.argsort(tokens, kind="stable")  # stable: a token's slots keep their routing order
            tokens, pair_batch = tokens[by_token], pair_batch[by_token]
        per_pair = [slots[b] for b in pair_batch.tolist()]
        begins = np.searchsorted(tokens, self.listed, side="left").tolist()
        ends = np.searchsorted(tokens, self.listed, side="right").tolist()
        partial = {u[0] for u in self.unroutable}  # tokens with a None among their slots
        assignments = [
            {"token_index": t, "slots": [s for s in per_pair[a:e] if s is not None] if t in partial else per_pair[a:e]}
            for t, a, e in zip(self.listed.tolist(), begins, ends, strict=True)
        ]
        return {
            "batches": [
                {"layer": b.layer, "expert": b.expert, "provider": b.provider.provider_id,
                 "quic_endpoint": b.provider.quic_endpoint, "quic_cert_sha256": b.provider.quic_cert_sha256,
                 "http_endpoint": b.provider.http_endpoint, "token_indices": b.token_indices.tolist(),
                 "backups": [p.provider_id for p in b.backups]}
                for b in self.batches
            ],
            "token_assignments": assignments,
            "unroutable": [{"token_index": t, "layer": layer, "expert": e, "reason": r}
                           for t, layer, e, r in self.unroutable],
        }


def plan_dispatch(
    routings: Any,
    shard: ShardIndex,
    *,
    allow_cold: bool = False,
    exclude: Iterable[str] = (),
    min_batch_rows: int = MIN_BATCH_ROWS,
    row_bytes: int = 0,
) -> dict[str, Any]:
    """Plan the routings of docs/specification.md against ``shard``; the JSON shape of the module docstring.

    Raises PlanInputError (a ValueError) on malformed routings, naming the token.
    """
    tokens, layers, experts, listed = parse_routings(routings)
    return plan_pairs(tokens, layers, experts, shard, allow_cold=allow_cold, exclude=exclude,
                      min_batch_rows=min_batch_rows, listed=listed, row_bytes=row_bytes).to_dict()


def plan_pairs(
    tokens: np.ndarray,
    layers: np.ndarray,
    experts: np.ndarray,
    shard: ShardIndex,
    *,
    allow_cold: bool = False,
    exclude: Iterable[str] = (),
    min_batch_rows: int = MIN_BATCH_ROWS,
    listed: np.ndarray | None = None,
    row_bytes: int = 0,
) -> DispatchPlan:
    """Plan flat (token, layer, expert) pairs, each (n_pairs,) of integers in [0, 2**31).

    ``exclude``: provider ids never to plan on (unknown ids are ignored). ``listed``: the
    tokens to report in token_assignments, default those of the pairs; when given it must
    be ascending, distinct and include every token of the pairs (not checked: it costs a
    sort, and plan_dispatch builds it so). ``row_bytes``: a row's bytes on the wire, request and
    answer, to weigh each holder's measured wire time per byte (0: compute only).
    Raises PlanInputError when the arrays disagree in length, hold other than integers in
    range, or a token routes to one (layer, expert) twice.
    """
    tokens, layers, experts = (_pair_column(a, name) for a, name in
                               ((tokens, "token_index"), (layers, "layer"), (experts, "expert")))
    if not len(tokens) == len(layers) == len(experts):
        raise PlanInputError(f"pair arrays differ in length: {len(tokens)}, {len(layers)}, {len(experts)}")
    if type(min_batch_rows) is not int or min_batch_rows < 1:
        raise PlanInputError(f"min_batch_rows must be an integer >= 1, got {min_batch_rows!r}")
    if type(row_bytes) is not int or row_bytes < 0:
        raise PlanInputError(f"row_bytes must be an integer >= 0, got {row_bytes!r}")
    if isinstance(exclude, str):
        raise PlanInputError("exclude must be a collection of provider ids, not one string")
    few = len(tokens) <= FEW_PAIRS
    if listed is None:
        listed = np.array(sorted(set(tokens.tolist())), np.int64) if few else np.unique(tokens)

    order, segment_group, bounds = (_segments_few if few else _segments)(tokens, layers, experts, shard)
    t_sorted = tokens[order]
    gone = set(exclude)
    excluded = {i for i, pid in enumerate(shard.provider_ids()) if pid in gone} if gone else set()
    pieces, refused = place(shard, segment_group, [b - a for a, b in pairwise(bounds)],
                            allow_cold=allow_cold, excluded=excluded, min_batch_rows=min_batch_rows,
                            row_bytes=row_bytes)

    batches: list[Batch] = []
    sorted_batch = np.full(len(order), -1, dtype=np.int64)
    segment_start = bounds[:-1]
    # the pieces' own experts only: a decode step plans 8 pairs against an index of the whole model
    layer_of, expert_of = shard.layer_expert([piece.expert for piece in pieces])
    providers = shard.providers
    for i, piece in enumerate(pieces):  # sorted by (expert index, provider index) = (layer, expert, provider id)
        lo = segment_start[piece.segment] + piece.first
        hi = lo + piece.rows
        sorted_batch[lo:hi] = len(batches)
        batches.append(Batch(layer_of[i], expert_of[i], providers[piece.provider], t_sorted[lo:hi],
                             BackupProviders(piece.backups, providers)))
    pair_batch = np.empty(len(order), dtype=np.int64)
    pair_batch[order] = sorted_batch

    unroutable = []
    for segment, reason in refused:
        lo, hi = segment_start[segment], bounds[segment + 1]
        i = int(order[lo])
        layer, expert = int(layers[i]), int(experts[i])
        unroutable.extend((t, layer, expert, reason) for t in t_sorted[lo:hi].tolist())
    unroutable.sort()
    return DispatchPlan(batches=tuple(batches), tokens=tokens, layers=layers, experts=experts,
                        pair_batch=pair_batch, unroutable=tuple(unroutable), listed=np.asarray(listed, np.int64))


def _segments(tokens: np.ndarray, layers: np.ndarray, experts: np.ndarray, shard: ShardIndex
              ) -> tuple[np.ndarray, list[int], list[int]]:
    """(order, segment_group, bounds): ``order`` sorts the pairs by expert, tokens ascending within one;
    the sorted pairs fall in segments of one expert each, ``segment_group`` their expert indices
    (_group_by_expert) and segment s the sorted pairs bounds[s]:bounds[s + 1]. PlanInputError when a token
    routes to one expert twice."""
    order, group = _group_by_expert(tokens, layers, experts, shard)
    g_sorted, t_sorted = group[order], tokens[order]
    repeated = np.flatnonzero((g_sorted[1:] == g_sorted[:-1]) & (t_sorted[1:] == t_sorted[:-1]))
    if repeated.size:
        _routed_twice(tokens, layers, experts, int(order[repeated[0]]))
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]]) if len(order) else np.zeros(0, np.int64)
    return order, g_sorted[starts].tolist(), [*starts.tolist(), len(order)]


def _segments_few(tokens: np.ndarray, layers: np.ndarray, experts: np.ndarray, shard: ShardIndex
                  ) -> tuple[np.ndarray, list[int], list[int]]:
    """_segments for a few pairs (a decode step's), over lists: the same order, groups and bounds,
    without the dozen numpy calls of a microsecond each that cost more than the pairs."""
    group, t = _expert_groups(layers, experts, shard).tolist(), tokens.tolist()
    order = sorted(range(len(t)), key=lambda i: (group[i], t[i]))
    segment_group, bounds = [], []
    for at, i in enumerate(order):
        if at and group[i] == group[order[at - 1]]:
            if t[i] == t[order[at - 1]]:
                _routed_twice(tokens, layers, experts, order[at - 1])
            continue
        segment_group.append(group[i])
        bounds.append(at)
    bounds.append(len(order))
    return np.array(order, np.int64), segment_group, bounds


def _routed_twice(tokens: np.ndarray, layers: np.ndarray, experts: np.ndarray, i: int) -> NoReturn:
    raise PlanInputError(f"token {int(tokens[i])} routes to layer {int(layers[i])} expert {int(experts[i])} twice")


def _group_by_expert(
    tokens: np.ndarray, layers: np.ndarray, experts: np.ndarray, shard: ShardIndex
) -> tuple[np.ndarray, np.ndarray]:
    """(order, group): ``order`` sorts the pairs by expert, tokens ascending within one.

    ``group`` is the expert index per pair (_expert_groups). When the tokens already come in ascending
    order (the JSON path, and the forward's token-major pairs), a stable sort by group alone
    keeps them so, and numpy sorts 16-bit keys stably by radix (O(n)): the groups actually
    routed to are renumbered densely to fit. Otherwise one sort of group * span + token.
    """
    group = _expert_groups(layers, experts, shard)
    if len(tokens) < 2:
        return np.arange(len(tokens)), group
    if (tokens[1:] >= tokens[:-1]).all():
        touched = np.flatnonzero(np.bincount(group))
        if len(touched) <= 1 << 16:
            dense = np.zeros(int(touched[-1]) + 1, dtype=np.uint16)
            dense[touched] = np.arange(len(touched))  # order-preserving, so groups stay in (layer, expert) order
            return np.argsort(dense[group], kind="stable"), group
    return np.argsort(group * (int(tokens.max()) + 1) + tokens), group


def _expert_groups(layers: np.ndarray, experts: np.ndarray, shard: ShardIndex) -> np.ndarray:
    """The expert index of each pair, int64 (n_pairs,); experts nobody holds get ids after the indexed ones,
    in (layer, expert) order, so they group (and are reported) too."""
    group = shard.lookup(layers, experts)
    unknown = group < 0
    if unknown.any():
        _, inverse = np.unique(expert_keys(layers[unknown], experts[unknown]), return_inverse=True)
        group[unknown] = shard.n_experts + inverse
    return group


def _pair_column(values: Any, name: str) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or (a.dtype.kind not in "iu" and a.size):
        raise PlanInputError(f"{name} must be a 1-D integer array, got {a.dtype} with shape {a.shape}")
    a = a.astype(np.int64, copy=False)
    if a.size and (int(a.min()) < 0 or int(a.max()) >= MAX_ID):
        raise PlanInputError(f"{name} values must lie in [0, 2**31)")
    return a

