"""ShardIndex: one model's holders in columns, built once from the view and reused.

Pure module (no Django). Both the shard map (core.shardmap.aggregation) and the dispatch
planner (core.shardmap.planner) read a ShardIndex, so a forward builds it once per view
change and plans every layer against it instead of rebuilding a shard-map dict per call.

Layout (CSR, every array read-only)::

    providers        sorted by provider_id; a provider's index is its position, so
                     comparing indices compares ids (every tie-break below relies on it)
    keys             (n_experts,) int64  (layer << 32) | expert, ascending, one per
                     expert with at least one holder
    offsets          (n_experts + 1,) int64: expert i's holders are rows
                     offsets[i] : offsets[i+1] of the holder columns
    holder_provider  (n_holders,) int64 provider index
    holder_warm      (n_holders,) bool   residency == "Warm"
    holder_tps       (n_holders,) int64  committed_tps (demand)
    holder_capacity  (n_holders,) int64  capacity_tps
    holder_blob      tuple of str | None, same rows

Within an expert, holders are ordered Warm first, then capacity_tps descending, then
provider id: the order the shard map prints and the order the planner's backups start from.

Per provider, derived: ``provider_latency_s`` and ``provider_wire_s_per_byte`` (measured
round trip, and time per byte beyond it; an unmeasured provider counts as the slowest measured
one, 0 when none is measured), ``provider_barred`` (reputation below the policy's reputation_floor:
the planner never picks it, the shard map still lists it) and ``provider_rank``, its place
in (reputation descending, provider id) order, which the planner's exact ties go by.

What is dropped while building: holdings of other models, and holdings whose provider is
not in ``providers`` (the view may lag the holdings it was built from). A provider that
lists the same (layer, expert) twice counts once (replication is about distinct
providers); the copy kept is the better one: Warm over Cold, then higher capacity_tps,
then one with a blob_uri, then the smaller blob_uri (so the result does not depend on the
order the view lists them in).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from core.shardmap.gossip_view import HoldingView, ProviderView, ReplicationPolicy

KEY_SHIFT = 32


def expert_keys(layers: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """(layer << 32) | expert as int64; both inputs already checked to lie in [0, 2**31)."""
    return (layers.astype(np.int64) << KEY_SHIFT) | experts.astype(np.int64)


def _filled(measured: list[float | None], per_second: float) -> np.ndarray:
    """Per provider, its measure in seconds (float64; `per_second` units make one): None becomes the
    largest measured, 0 when none is."""
    known = [m for m in measured if m is not None]
    fill = max(known) / per_second if known else 0.0
    return np.array([fill if m is None else m / per_second for m in measured], dtype=np.float64)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """One model's holders, indexed (see the module docstring for the layout).

    Build with ``ShardIndex.build``; treat as immutable (arrays are read-only). Equal views
    build equal indices whatever order providers and holdings were given in.
    """

    model_id: str
    policy: ReplicationPolicy
    providers: tuple[ProviderView, ...]
    keys: np.ndarray
    offsets: np.ndarray
    holder_provider: np.ndarray
    holder_warm: np.ndarray
    holder_tps: np.ndarray
    holder_capacity: np.ndarray
    holder_blob: tuple[str | None, ...]
    # Derived per expert: distinct holders, summed committed_tps (Warm and Cold), hot flag.
    replication: np.ndarray = field(init=False)
    summed_tps: np.ndarray = field(init=False)
    hot: np.ndarray = field(init=False)
    # Derived per provider: GPU flag, latency and wire time per byte in seconds, unknown ones filled (_filled).
    provider_gpu: np.ndarray = field(init=False)
    provider_latency_s: np.ndarray = field(init=False)
    provider_wire_s_per_byte: np.ndarray = field(init=False)
    # Derived per provider: reputation below the floor, and the tie rank (higher reputation, then id).
    provider_barred: np.ndarray = field(init=False)
    provider_rank: np.ndarray = field(init=False)
    # Dense (layer, expert) -> expert index table, when the ids span a small box (every real
    # model: layers 0..L-1, experts 0..E-1); None falls back to a binary search over keys.
    _table: np.ndarray | None = field(init=False, repr=False)
    _table_width: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        counts = np.diff(self.offsets)
        summed = np.add.reduceat(self.holder_tps, self.offsets[:-1]) if len(self.keys) else np.zeros(0, np.int64)
        # An unmeasured provider is assumed as slow as the slowest measured one: the planner then
        # prefers holders it has numbers for without shutting the others out. No measurement at
        # all: every latency is 0 and the ranking falls to committed_tps alone.
        latency = _filled([p.latency_ms for p in self.providers], 1e3)
        wire = _filled([p.wire_ns_per_byte for p in self.providers], 1e9)
        derived = {
            "replication": counts,
            "summed_tps": summed,
            "hot": summed >= self.policy.hot_threshold_tps,  # at the threshold counts as hot (seed: "≥ 1000")
            "provider_gpu": np.array([p.moe_gpu for p in self.providers], dtype=bool),
            "provider_latency_s": latency,
            "provider_wire_s_per_byte": wire,
            **_reputation_columns(self.providers, self.policy.reputation_floor),
        }
        width = int(self.experts.max()) + 1 if len(self.keys) else 0
        height = int(self.layers.max()) + 1 if len(self.keys) else 0
        table = None
        if len(self.keys) and height * width <= 4 * len(self.keys) + 4096:  # at most ~4 empty cells per held expert
            table = np.full(height * width, -1, dtype=np.int64)
            table[self.layers * width + self.experts] = np.arange(len(self.keys))
        derived |= {"_table": table, "_table_width": width}
        for name, value in derived.items():
            object.__setattr__(self, name, _frozen(value) if isinstance(value, np.ndarray) else value)
        for name in ("keys", "offsets", "holder_provider", "holder_warm", "holder_tps", "holder_capacity"):
            _frozen(getattr(self, name))

    @property
    def n_experts(self) -> int:
        return len(self.keys)

    @property
    def layers(self) -> np.ndarray:
        return self.keys >> KEY_SHIFT

    @property
    def experts(self) -> np.ndarray:
        return self.keys & ((1 << KEY_SHIFT) - 1)

    def layer_expert(self, indices: list[int]) -> tuple[list[int], list[int]]:
        """(layers, experts) of the given expert indices, without the whole index's columns."""
        keys = self.keys[indices] if indices else np.zeros(0, np.int64)
        return (keys >> KEY_SHIFT).tolist(), (keys & ((1 << KEY_SHIFT) - 1)).tolist()

    def provider_ids(self) -> list[str]:
        return [p.provider_id for p in self.providers]

    def lookup(self, layers: np.ndarray, experts: np.ndarray) -> np.ndarray:
        """Expert index of each (layer, expert) pair, -1 where nobody holds it. (n,) int64."""
        if self._table is not None:
            width = self._table_width
            inside = (layers < len(self._table) // max(width, 1)) & (experts < width)
            return np.where(inside, self._table[np.where(inside, layers * width + experts, 0)], -1)
        wanted = expert_keys(layers, experts)
        if not len(self.keys):
            return np.full(len(wanted), -1, dtype=np.int64)
        at = np.searchsorted(self.keys, wanted)
        clipped = np.minimum(at, len(self.keys) - 1)
        return np.where(self.keys[clipped] == wanted, clipped, -1)

    @classmethod
    def build(
        cls,
        model_id: str,
        providers: Iterable[ProviderView],
        holdings: Iterable[HoldingView],
        policy: ReplicationPolicy,
    ) -> ShardIndex:
        """Index ``model_id``'s holdings by expert.

        Raises ValueError when ``providers`` names one provider twice (the view's rows are
        one per provider; two would make every count ambiguous).
        """
        ordered = tuple(sorted(providers, key=lambda p: p.provider_id))
        ids = [p.provider_id for p in ordered]
        for a, b in pairwise(ids):
            if a == b:
                raise ValueError(f"provider {a} appears twice in the view")
        position = {pid: i for i, pid in enumerate(ids)}

        mine = [h for h in holdings if h.model_id == model_id]
        pidx = np.array([position.get(h.provider_id, -1) for h in mine], dtype=np.int64)
        known = pidx >= 0
        if not known.all():  # holdings of providers the view no longer (or not yet) lists
            mine = [h for h, k in zip(mine, known.tolist(), strict=True) if k]
            pidx = pidx[known]
        layer = np.array([h.layer for h in mine], dtype=np.int64)
        expert = np.array([h.expert for h in mine], dtype=np.int64)
        warm = np.array([h.residency == "Warm" for h in mine], dtype=bool)
        tps = np.array([h.committed_tps for h in mine], dtype=np.int64)
        cap = np.array([h.capacity_tps for h in mine], dtype=np.int64)
        key = expert_keys(layer, expert)

        # np.lexsort sorts by its LAST key first: expert, then Warm first, capacity descending, provider id.
        order = np.lexsort((pidx, -cap, ~warm, key))
        key, pidx, warm, tps, cap = key[order], pidx[order], warm[order], tps[order], cap[order]
        blob = [mine[i].blob_uri for i in order.tolist()]

        keep = _first_per_provider(key, pidx, len(ids))
        if not keep.all():
            _prefer_blob(keep, key, pidx, warm, cap, blob)
            key, pidx, warm, tps, cap = key[keep], pidx[keep], warm[keep], tps[keep], cap[keep]
            blob = [b for b, k in zip(blob, keep.tolist(), strict=True) if k]

        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
        offsets = np.append(starts, len(key)).astype(np.int64)
        return cls(model_id=model_id, policy=policy, providers=ordered, keys=key[starts].copy(), offsets=offsets,
                   holder_provider=pidx, holder_warm=warm, holder_tps=tps, holder_capacity=cap,
                   holder_blob=tuple(blob))


def _reputation_columns(providers: Sequence[ProviderView], floor: float) -> dict[str, np.ndarray]:
    """provider_barred and provider_rank (see the module docstring); providers sorted by id."""
    reputation = np.array([p.reputation for p in providers], dtype=np.float64)
    # lexsort's last key sorts first: reputation descending, then the index (= provider id order).
    order = np.lexsort((np.arange(len(providers)), -reputation))
    rank = np.empty(len(providers), dtype=np.int64)
    rank[order] = np.arange(len(providers))
    return {"provider_barred": reputation < floor, "provider_rank": rank}


def _first_per_provider(key: np.ndarray, pidx: np.ndarray, n_providers: int) -> np.ndarray:
    """Mask of the first row of each (expert, provider) in the sorted order: the better copy.

    Rows are sorted by expert first, so a dense expert number is the running count of key
    changes, and expert * n_providers + provider is unique per (expert, provider).
    """
    if not len(key):
        return np.ones(0, dtype=bool)
    dense = np.cumsum(np.r_[False, key[1:] != key[:-1]])
    pair = dense * max(n_providers, 1) + pidx
    ordered = np.sort(pair)
    if not (ordered[1:] == ordered[:-1]).any():
        return np.ones(len(key), dtype=bool)  # the usual view: no provider lists an expert twice
    _, first = np.unique(pair, return_index=True)
    keep = np.zeros(len(key), dtype=bool)
    keep[first] = True
    return keep


def _prefer_blob(
    keep: np.ndarray, key: np.ndarray, pidx: np.ndarray, warm: np.ndarray, cap: np.ndarray, blob: Sequence[str | None]
) -> None:
    """Among copies equal in residency and capacity, keep the one with the smallest blob_uri (in place).

    The sort cannot see blob_uri, so tied copies stay in input order; this rare fix-up makes
    the kept copy independent of that order. Tied copies have equal sort keys, so they are
    adjacent rows: moving the kept mark inside their run does not reorder the holders.
    """
    tied = (key[1:] == key[:-1]) & (pidx[1:] == pidx[:-1]) & (warm[1:] == warm[:-1]) & (cap[1:] == cap[:-1])
    edges = np.flatnonzero(np.diff(np.r_[0, tied.astype(np.int8), 0]))  # run i of ties: rows edges[2i] .. edges[2i+1]
    for first, last in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
        if not keep[first]:
            continue  # a better copy (Warm, or more capacity) of this provider's holding is kept elsewhere
        best = min(range(first, last + 1), key=lambda r: (_blob_rank(blob[r]), r))
        keep[first], keep[best] = False, True


def _blob_rank(uri: str | None) -> tuple[bool, str]:
    return (uri is None, uri or "")  # a copy with a blob_uri can be replicated from, so it wins
