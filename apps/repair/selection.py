"""Repair selection (pure): which provider fetches which missing replica, and which extra copy unloads.

docs/specification.md, "Repair": raising replication is pull-based. Every node runs this over its own gossip view of a
model, keeps only the rows naming itself (`only=`), and fetches those. Two nodes that share a view
compute the same rows, and an expert's missing slots go to distinct providers, so two nodes never
race to cover the same slot; a node whose view is skewed may add a copy too many, which the drop
rows trim later by the same order.

Rendezvous (highest-random-weight) hashing, exactly as docs/protocol.md "Repair selection" states it:

    key64(text)       = u64 little-endian of BLAKE2b(text UTF-8, digest_size=8)
    expert key        = key64(f"{model_id}/{layer}/{expert}")
    provider key      = key64(provider_id)
    score             = splitmix64(expert key XOR provider key)     (u64, wrapping)
    order             = score descending, ties by provider id ascending

An expert's target follows its demand (docs/protocol.md, "Repair selection", `replication_target`): the
policy's min_replication, or for a hot expert ceil(demand x headroom / one holder's capacity) clamped to
[min_replication, max_replication]. Its add rows are the first (target - holders) of that order over the
candidates that do not hold it; its drop rows are the holders at positions >= keep of that order over its
holders, keep being the target at twice the demand (a copy added for demand stays until demand halves,
so an expert near a boundary does not flap).
Adding a provider moves an expert's rows only when the newcomer lands in its top slots (probability
about its share of the candidates), which is why a joining node disturbs few assignments.

numpy + hashlib only. Scores are computed per chunk of (expert, provider) pairs as u64 arrays
(no Python loop over pairs); the only per-expert Python work is reading the views and hashing
the few expert keys that need repair.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

ADD = "add"
DROP = "drop"
NO_BLOB_URI = "no_blob_uri"
NO_CANDIDATE = "no_candidate"

# SplitMix64 (Steele, Lea & Flood 2014; Vigna's splitmix64.c) constants.
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
# Pairs scored at once: each u64 temporary is 8 MiB, so a pass stays cache-friendly and its memory
# bounded (a Kimi-K3-sized worst case is 27 M pairs: 220 MB per temporary if done in one go).
_CHUNK_PAIRS = 1 << 20
_ARGMAX_ROUNDS = 16
# Drops keep the holders the target at this multiple of the demand asks for (see the module docstring).
DROP_HYSTERESIS = 2.0  # above this many winners per row, one full sort is cheaper than k argmax passes


@dataclass(frozen=True, slots=True)
class ExpertView:
    """One (layer, expert) of the model as this node's gossip view shows it."""

    layer: int
    expert: int
    holders: tuple[str, ...]  # provider ids declaring it (Warm or Cold), any order, no duplicates
    blob_uri: str | None  # a tenzro://blob/ URI one of its holders announces; None: only inline payloads
    committed_tps: float = 0.0  # demand: summed over its holders
    capacity_tps: float = 0.0  # one holder's capacity: the median its holders advertise (0: none measured)


@dataclass(frozen=True)
class RepairRules:
    min_replication: int
    max_replication: int  # a cap: never a target by itself
    hot_threshold_tps: float
    headroom: float  # >= 1: a hot expert's holders together keep this multiple of its demand as capacity


@dataclass(frozen=True, slots=True)
class RepairRow:
    layer: int
    expert: int
    provider: str
    action: str  # "add" (fetch and hold it) | "drop" (trim an extra copy)
    rank: int  # 0-based position in the expert's order: over candidates not holding it (add), over holders (drop)
    blob_uri: str | None
    holders: int  # how many hold it now (in this view)
    target: int  # the replication it is raised to (add) or trimmed to (drop)


@dataclass(frozen=True)
class Selection:
    rows: list[RepairRow]  # sorted by (layer, expert, action, rank)
    unrepairable: list[tuple[int, int, str]]  # (layer, expert, reason), sorted by (layer, expert)
    considered: int  # experts that were under- or over-replicated
    # (layer, expert, target, reachable): demand asks for more holders than there are candidates, and the
    # expert has at least min_replication of them (below that it is unrepairable no_candidate instead)
    capped: list[tuple[int, int, int, int]] = field(default_factory=list)


def key64(text: str) -> int:
    """The 64-bit key of a provider id or an expert name (see the module docstring)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def expert_name(model_id: str, layer: int, expert: int) -> str:
    return f"{model_id}/{layer}/{expert}"


def _keys(texts: Sequence[str]) -> np.ndarray:
    """(len(texts),) uint64: key64 of each text."""
    digests = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def _scores(expert_keys: np.ndarray, provider_keys: np.ndarray) -> np.ndarray:
    """(n,) x (c,) uint64 keys -> (n, c) uint64 scores: splitmix64(expert XOR provider), mixed in place."""
    z = np.bitwise_xor.outer(expert_keys, provider_keys)
    t = np.empty_like(z)
    with np.errstate(over="ignore"):  # u64 arithmetic wraps by definition of the hash
        z += _GAMMA
        np.right_shift(z, _S30, out=t)
        z ^= t
        z *= _MIX1
        np.right_shift(z, _S27, out=t)
        z ^= t
        z *= _MIX2
        np.right_shift(z, _S31, out=t)
        z ^= t
    return z


def _full_order(scores: np.ndarray) -> np.ndarray:
    """(n, c) uint64 -> (n, c) column indices, best first: score descending, then lower column."""
    columns = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    # lexsort's last key is the primary one; ~score reverses the order of unsigned scores.
    return np.lexsort((columns, ~scores), axis=-1)


def _top_order(scores: np.ndarray, k: int) -> np.ndarray:
    """(n, c) uint64 -> (n, min(k, c)) column indices of each row's k best, best first. Overwrites `scores`.

    Columns must be in provider-id order, so "lower column" is the id tie-break. For the small k of a
    repair (<= max_replication) k rounds of argmax are ~40x faster than argpartition: argmax returns the
    first of equal maxima, which is the tie rule. Each winner is zeroed before the next round; a row whose
    later winner scores 0 could therefore have re-picked a zeroed column, so such rows (probability ~2^-64
    each) are redone with a full sort and the result stays exact.
    """
    n, c = scores.shape
    k = min(k, c)
    if k == c or k > _ARGMAX_ROUNDS:
        return _full_order(scores)[:, :k]
    rows = np.arange(n)
    top = np.empty((n, k), dtype=np.intp)
    won = np.empty((n, k), dtype=np.uint64)  # the winners' scores, to undo the zeroing for a redo
    for j in range(k):
        top[:, j] = best = scores.argmax(axis=1)
        won[:, j] = scores[rows, best]
        scores[rows, best] = 0
    suspect = (won[:, 1:] == 0).any(axis=1)
    if suspect.any():
        redo = np.flatnonzero(suspect)
        original = scores[redo]
        for j in reversed(range(k)):  # reversed: a column picked twice gets its first (true) score back last
            original[np.arange(redo.size), top[redo, j]] = won[redo, j]
        top[redo] = _full_order(original)[:, :k]
    return top


def rendezvous_order(model_id: str, layer: int, expert: int, providers: Sequence[str]) -> list[str]:
    """The distinct `providers` in the expert's rendezvous order, best first."""
    ids = sorted(set(providers))
    if not ids:
        return []
    scores = _scores(_keys([expert_name(model_id, layer, expert)]), _keys(ids))
    return [ids[i] for i in _full_order(scores)[0]]


def replication_target(demand: float, capacity: float, rules: RepairRules) -> int:
    """How many holders an expert with `demand` rows/s (summed over holders) should have.

    Not hot (demand < hot_threshold_tps): min_replication. Hot: enough holders that, each serving at
    `capacity` rows/s (one holder's measured capacity; unmeasured, 0: the hot threshold stands in for
    it), together they have `headroom` times the demand: ceil(demand x headroom / capacity), clamped to
    [min_replication, max_replication].
    """
    if demand < rules.hot_threshold_tps:
        return rules.min_replication
    per_holder = capacity if capacity > 0 else rules.hot_threshold_tps
    if per_holder <= 0:  # threshold 0 and nothing measured: no figure to size by, the cap stands
        return rules.max_replication
    wanted = demand * rules.headroom / per_holder
    if not wanted < rules.max_replication:  # also an overflow to inf (a tiny capacity)
        return rules.max_replication
    return max(rules.min_replication, math.ceil(wanted))


def placement(model_id: str, layer: int, expert: int, providers: Sequence[str], replication: int) -> list[str]:
    """Who holds a newly placed expert (`tenzro moe place`): the first `replication` of its rendezvous order
    over `providers` (docs/protocol.md, "Placement"): the providers repair would pick, so a later pass
    finds every expert where it would have put it."""
    return rendezvous_order(model_id, layer, expert, providers)[:replication]


def _target(view: ExpertView, rules: RepairRules) -> int:
    return replication_target(view.committed_tps, view.capacity_tps, rules)


def _keep(view: ExpertView, rules: RepairRules) -> int:
    """Holders an expert keeps before any is dropped: the target at twice its demand (hysteresis)."""
    return replication_target(DROP_HYSTERESIS * view.committed_tps, view.capacity_tps, rules)


def select_repairs(model_id: str, experts: Sequence[ExpertView], candidates: Sequence[str], rules: RepairRules,
                   *, only: str | None = None) -> Selection:
    """Add rows for every under-replicated expert's missing slots, drop rows for every over-replicated one's extras.

    experts: one view per distinct (layer, expert), holders without duplicates. candidates: the providers
    declaring at least one holding of this model (duplicates ignored; this node among them).
    only: keep only the rows naming this provider; `unrepairable` and `considered` stay global.
    Raises ValueError when the rules are inconsistent (need 0 <= min_replication <= max_replication).
    """
    if not 0 <= rules.min_replication <= rules.max_replication:
        raise ValueError(f"need 0 <= min_replication <= max_replication, got {rules}")
    if not rules.headroom >= 1:
        raise ValueError(f"need headroom >= 1, got {rules}")
    cand_ids = sorted(set(candidates))
    column = {p: i for i, p in enumerate(cand_ids)}
    under: dict[int, list[ExpertView]] = {}  # target -> views below it
    over: dict[int, list[ExpertView]] = {}  # keep -> views above it
    unrepairable: list[tuple[int, int, str]] = []
    capped: list[tuple[int, int, int, int]] = []
    for view in experts:
        held = len(view.holders)
        target = _target(view, rules)
        if held < target:
            if view.blob_uri is None:
                unrepairable.append((view.layer, view.expert, NO_BLOB_URI))
            else:
                under.setdefault(target, []).append(view)
        elif held > (keep := _keep(view, rules)):
            over.setdefault(keep, []).append(view)
    considered = len(unrepairable) + sum(map(len, under.values())) + sum(map(len, over.values()))

    # (layer, expert, action, rank, provider, view, target): the first four are unique per row, so a plain
    # tuple sort orders rows as Selection promises without ever comparing views.
    found: list[tuple[int, int, str, int, str, ExpertView, int]] = []
    provider_keys = _keys(cand_ids)  # hashed once per call
    for target, views in under.items():
        _adds(model_id, views, target, cand_ids, column, provider_keys, only, found, unrepairable, capped,
              rules.min_replication)
    for keep, views in over.items():
        _drops(model_id, views, keep, only, found)

    found.sort()
    rows = [RepairRow(layer=la, expert=e, provider=p, action=a, rank=r, blob_uri=v.blob_uri, holders=len(v.holders),
                      target=t) for la, e, a, r, p, v, t in found]
    unrepairable.sort()
    capped.sort()
    return Selection(rows=rows, unrepairable=unrepairable, considered=considered, capped=capped)


def _adds(model_id: str, views: list[ExpertView], target: int, cand_ids: list[str], column: dict[str, int],
          provider_keys: np.ndarray, only: str | None, found: list, unrepairable: list, capped: list,
          min_replication: int) -> None:
    """Append the add rows of `views` (all below the same `target`) to `found`; an expert with fewer
    candidates than its missing slots goes to `unrepairable` (none at all, below min_replication) or
    `capped` (it reaches min_replication but not the target)."""
    n, c = len(views), len(cand_ids)
    lens = np.fromiter((len(v.holders) for v in views), dtype=np.intp, count=n)
    # (n, width) candidate column of each holder, -1 for padding and for holders that are not candidates.
    width = max(1, int(lens.max()))
    holder_cols = np.full((n, width), -1, dtype=np.intp)
    flat = np.fromiter((column.get(h, -1) for v in views for h in v.holders), dtype=np.intp, count=int(lens.sum()))
    starts = np.cumsum(lens) - lens
    slot_row = np.repeat(np.arange(n), lens)
    holder_cols[slot_row, np.arange(flat.size) - starts[slot_row]] = flat
    available = c - np.count_nonzero(holder_cols >= 0, axis=1)
    take = np.minimum(target - lens, available)  # (n,) rows this expert gets
    for i in np.flatnonzero(take < target - lens):
        if lens[i] + take[i] >= min_replication:
            capped.append((views[i].layer, views[i].expert, target, int(lens[i] + take[i])))
        elif take[i] == 0:
            unrepairable.append((views[i].layer, views[i].expert, NO_CANDIDATE))

    want = np.flatnonzero(take > 0)
    if only is not None:
        mine = column.get(only)
        if mine is None:
            return  # not a candidate: no expert's add order contains it
        want = want[~(holder_cols[want] == mine).any(axis=1)]
    if want.size == 0:
        return
    expert_keys = _keys([expert_name(model_id, views[i].layer, views[i].expert) for i in want])
    chunk = max(1, _CHUNK_PAIRS // c)
    for a in range(0, want.size, chunk):
        idx = want[a:a + chunk]
        # need + holders among candidates <= target for every row, so the top `target` of the order over
        # all candidates always contains the rows' winners once holders are skipped.
        top = _top_order(_scores(expert_keys[a:a + chunk], provider_keys), target)  # (m, k)
        eligible = ~(top[:, :, None] == holder_cols[idx, None, :]).any(axis=2)  # (m, k) not a holder
        rank = np.cumsum(eligible, axis=1) - 1  # position in the order over non-holders
        chosen = eligible & (rank < take[idx, None])
        if only is not None:
            chosen &= top == mine
        r, j = np.nonzero(chosen)
        for i, col, position in zip(idx[r].tolist(), top[r, j].tolist(), rank[r, j].tolist(), strict=True):
            view = views[i]
            found.append((view.layer, view.expert, ADD, position, cand_ids[col], view, target))


def _drops(model_id: str, views: list[ExpertView], keep: int, only: str | None, found: list) -> None:
    """Append the drop rows of the over-replicated `views`: holders ranked >= `keep` in their order."""
    if only is not None:
        views = [v for v in views if only in v.holders]
    if not views:
        return
    ids = sorted({h for v in views for h in v.holders})
    position = {p: i for i, p in enumerate(ids)}
    keys = _keys(ids)
    width = max(len(v.holders) for v in views)
    cols = np.zeros((len(views), width), dtype=np.intp)
    pad = np.ones((len(views), width), dtype=bool)
    for r, v in enumerate(views):
        cols[r, :len(v.holders)] = [position[h] for h in v.holders]
        pad[r, :len(v.holders)] = False
    scores = _scores(_keys([expert_name(model_id, v.layer, v.expert) for v in views]), keys)
    scores = np.take_along_axis(scores, cols, axis=1)  # (n, width) each holder's score
    order = np.lexsort((cols, ~scores, pad), axis=-1)  # padding last, then score descending, then id
    ranked = np.take_along_axis(cols, order, axis=1)
    for r, v in enumerate(views):
        for rank in range(keep, len(v.holders)):
            provider = ids[ranked[r, rank]]
            if only is None or provider == only:
                found.append((v.layer, v.expert, DROP, rank, provider, v, keep))


def admit(rows: Sequence[RepairRow], limit: int) -> tuple[list[RepairRow], list[RepairRow]]:
    """Split one node's rows into (admitted, deferred).

    At most `limit` "add" rows are admitted, the most under-replicated first (fewest holders), then by
    (layer, expert); the rest are deferred in that order. "drop" rows never count against the limit and
    are all admitted, after the adds. Raises ValueError for a negative limit or rows naming several providers.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if len({r.provider for r in rows}) > 1:
        raise ValueError("admit() takes one node's rows (select_repairs(..., only=node))")
    adds = sorted((r for r in rows if r.action == ADD), key=lambda r: (r.holders, r.layer, r.expert))
    drops = [r for r in rows if r.action == DROP]
    return adds[:limit] + drops, adds[limit:]
