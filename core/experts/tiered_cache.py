"""Tiered expert cache: a byte-bounded memory-tier LRU over a disk tier of raw payloads.

Every registered expert has its raw payload on disk (written through at load), so the disk
tier is the source of truth: eviction only drops the decoded copy, promotion decodes the
file again, and a restart re-registers every file found (as Cold). Decoding is
deterministic, so a spilled and re-promoted expert computes bit-identical results.

Invariant, checked at every insertion: sum(nbytes of memory-tier experts) + reserved <= budget,
where `reserved` is memory the node holds outside the tier under the same budget (a router's
dense weights, apps/generation): a reservation evicts experts to the disk tier, LRU first,
until both fit. An expert larger than the budget left is never made resident; `get` decodes it for the call
only (the caller's reference keeps it alive, the tier never counts it).

Integrity: each payload's BLAKE3 (its blob hash when it came from a blob) is recorded at load in
the sidecar, and every promotion checks the bytes read against it. A payload that no longer
matches (a bit flipped on disk, a file tampered with) is never decoded: the expert is forgotten
(its files removed, `on_corrupt` told, so the worker can fetch the blob again from a peer) and
the call fails with CorruptPayload. Costs one hash pass (~1 GB/s) per promotion.

Locking: one lock guards the tier state (records, LRU order, byte count). Disk reads and
decoding run outside it; concurrent promotions of the same key share one decode through a
Future. A thread already computing with an expert keeps its reference when the expert is
evicted meanwhile, so eviction never blocks on or breaks a running forward.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from blake3 import blake3

from core.durable_files import link_or_write_atomic, write_atomic
from core.experts.errors import CorruptPayload, ExpertNotLoaded, InvalidPayload
from core.experts.ffn import ExpertHeader, ResidentExpert

log = logging.getLogger(__name__)

Key = tuple[str, int, int]
FALLBACK_BUDGET = 4 * 1024**3
BUDGET_FRACTION = 0.60


def default_memory_budget() -> int:
    """60% of psutil's available memory; 4 GiB when that cannot be read."""
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except Exception:  # psutil missing, or /proc unreadable in a sandbox
        return FALLBACK_BUDGET
    return int(available * BUDGET_FRACTION) if available > 0 else FALLBACK_BUDGET


def model_dir_name(model_id: str) -> str:
    """A filesystem-safe, collision-free folder name for a model id ("Qwen/Qwen3" is fine)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._")[:64] or "model"
    return f"{readable}-{hashlib.sha256(model_id.encode()).hexdigest()[:12]}"


@dataclass
class Record:
    """A registered expert: its header, where its payload lives, and a registration generation."""

    header: ExpertHeader
    path: Path
    blob_uri: str | None
    disk_bytes: int
    generation: int
    hash: str | None = None  # BLAKE3 hex of the payload; None for a file written before hashes were kept


class TieredCache:
    """Memory-tier LRU of ResidentExperts over payload files under `root`."""

    def __init__(
        self,
        *,
        root: Path,
        budget_bytes: int,
        decode: Callable[[bytes], ResidentExpert],
        on_change: Callable[[], None] | None = None,
        on_corrupt: Callable[[Key, str | None], None] | None = None,
    ) -> None:
        """`on_change()` is called (no lock held) after any registration, removal, promotion or
        eviction, from whichever thread made it; it must be cheap and thread-safe.
        `on_corrupt(key, blob_uri)` after a corrupt payload was forgotten (same rules)."""
        if budget_bytes < 0:
            raise ValueError(f"memory budget must be >= 0 bytes, received {budget_bytes}")
        self.root = Path(root)
        self.budget_bytes = int(budget_bytes)
        self._decode = decode
        self._on_change = on_change
        self._on_corrupt = on_corrupt
        self._lock = threading.RLock()
        self._records: dict[Key, Record] = {}
        self._memory: OrderedDict[Key, ResidentExpert] = OrderedDict()  # LRU first, MRU last
        self._used = 0
        self._reserved: dict[str, int] = {}  # name -> bytes held outside the tier under this budget
        self._generation = 0
        self._inflight: dict[Key, Future[ResidentExpert]] = {}

    # -- registration ------------------------------------------------------------------------

    def path_for(self, key: Key) -> Path:
        model_id, layer, expert = key
        return self.root / model_dir_name(model_id) / f"layer{layer}" / f"expert{expert}.safetensors"

    def put(
        self,
        payload: bytes | bytearray,
        expert: ResidentExpert,
        header: ExpertHeader,
        blob_uri: str | None,
        *,
        stored_at: Path | None = None,
    ) -> None:
        """Register (or replace) an expert: payload to disk, decoded copy to the memory tier.

        `stored_at` names a file already holding exactly `payload` (its blob): the disk tier
        links to it instead of writing a second copy."""
        key = expert.key
        path = self.path_for(key)
        link_or_write_atomic(path, payload, existing=stored_at)
        digest = blake3(payload).hexdigest()
        sidecar = {"model_id": header.model_id, "layer": header.layer, "expert": header.expert,
                   "d_model": header.d_model, "d_ff": header.d_ff, "formats": header.formats,
                   "blob_uri": blob_uri, "hash": digest}
        write_atomic(path.with_suffix(".json"), json.dumps(sidecar).encode())
        with self._lock:
            self._drop_memory(key)
            self._generation += 1
            self._records[key] = Record(header, path, blob_uri, len(payload), self._generation, digest)
            self._insert(key, expert)
        self._changed()

    def remove(self, key: Key) -> None:
        """Forget an expert in both tiers and delete its files; ExpertNotLoaded if unknown."""
        with self._lock:
            record = self._records.pop(key, None)
            if record is None:
                raise ExpertNotLoaded(f"expert {_fmt(key)} is not loaded on this node")
            self._drop_memory(key)
        # The payload is a hard link to its blob when it came from one: touching it dates the blob
        # from this unload, so garbage collection keeps it for its grace period and peers can
        # still fetch it (the last copy of an expert may be this one).
        with contextlib.suppress(OSError):
            os.utime(record.path)
        for p in (record.path, record.path.with_suffix(".json")):
            p.unlink(missing_ok=True)
        self._changed()

    def scan(self, read_header: Callable[[bytes], ExpertHeader]) -> list[Key]:
        """Re-register every payload file under root as a disk-tier expert (at start).

        The JSON sidecar gives the header without reading the payload; when it is missing or
        unreadable the payload itself is parsed. Unreadable payloads are skipped and logged.
        """
        found: list[Key] = []
        for path in sorted(self.root.glob("*/layer*/expert*.safetensors")):
            try:
                header, blob_uri, digest = self._read_sidecar(path)
            except (OSError, ValueError, KeyError, TypeError):
                try:
                    header, blob_uri, digest = read_header(path.read_bytes()), None, None
                except (OSError, InvalidPayload) as exc:
                    log.warning("skipping unreadable expert payload %s: %s", path, exc)
                    continue
            key = (header.model_id, header.layer, header.expert)
            if self.path_for(key) != path:
                log.warning("skipping %s: its metadata names %s, stored elsewhere", path, _fmt(key))
                continue
            with self._lock:
                self._generation += 1
                self._records[key] = Record(header, path, blob_uri, path.stat().st_size, self._generation, digest)
            found.append(key)
        return found

    @staticmethod
    def _read_sidecar(path: Path) -> tuple[ExpertHeader, str | None, str | None]:
        meta = json.loads(path.with_suffix(".json").read_text())
        header = ExpertHeader(model_id=str(meta["model_id"]), layer=int(meta["layer"]),
                              expert=int(meta["expert"]), d_model=int(meta["d_model"]),
                              d_ff=int(meta["d_ff"]), formats=dict(meta["formats"]))
        blob_uri = meta.get("blob_uri")
        # a sidecar written before hashes were kept: a blob's URI still names its hash
        digest = meta.get("hash") or (blob_uri.rsplit("/", 1)[-1] if isinstance(blob_uri, str) else None)
        return header, blob_uri, digest

    # -- lookup ------------------------------------------------------------------------------

    def record(self, key: Key) -> Record:
        with self._lock:
            record = self._records.get(key)
        if record is None:
            raise ExpertNotLoaded(f"expert {_fmt(key)} is not loaded on this node")
        return record

    def records(self) -> list[tuple[Key, Record, bool]]:
        """(key, record, in_memory) for every registered expert, sorted by key."""
        with self._lock:
            return [(k, r, k in self._memory) for k, r in sorted(self._records.items())]

    def keys(self) -> list[Key]:
        with self._lock:
            return sorted(self._records)

    def __contains__(self, key: object) -> bool:
        """Whether `key` is registered here, in either tier (without listing every key)."""
        with self._lock:
            return key in self._records

    def peek(self, key: Key) -> ResidentExpert | None:
        """The memory-tier copy without touching LRU order (for status), or None."""
        with self._lock:
            return self._memory.get(key)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    @property
    def reserved_bytes(self) -> int:
        with self._lock:
            return sum(self._reserved.values())

    def reserve(self, name: str, nbytes: int) -> None:
        """Hold `nbytes` of the budget under `name` (replacing its earlier reservation; 0 releases
        it), evicting memory-tier experts, LRU first, until the rest fits. ValueError when the
        reservations together would exceed the budget: nothing changes then."""
        with self._lock:
            others = sum(v for k, v in self._reserved.items() if k != name)
            if nbytes < 0 or others + nbytes > self.budget_bytes:
                raise ValueError(f"{nbytes} bytes for {name} do not fit: the memory budget is {self.budget_bytes} "
                                 f"bytes, {others} of them reserved already")
            if nbytes:
                self._reserved[name] = int(nbytes)
            else:
                self._reserved.pop(name, None)
            evicted = self._evict_to(self.budget_bytes - others - nbytes)
        if evicted:
            log.info("reserving %d bytes for %s moved %d experts to the disk tier", nbytes, name, evicted)
            self._changed()

    def set_budget(self, budget_bytes: int) -> int:
        """Change the budget (a node's host share moved), moving memory-tier experts to the disk tier, LRU
        first, until the tier fits beside the reservations; returns how many moved. Reservations are kept
        even when they alone exceed a smaller budget: what holds them releases them, not this."""
        if budget_bytes < 0:
            raise ValueError(f"memory budget must be >= 0 bytes, received {budget_bytes}")
        with self._lock:
            self.budget_bytes = int(budget_bytes)
            evicted = self._evict_to(max(0, self.budget_bytes - sum(self._reserved.values())))
        if evicted:
            log.info("a memory budget of %d bytes moved %d experts to the disk tier", budget_bytes, evicted)
        self._changed()
        return evicted

    def get(self, key: Key) -> ResidentExpert:
        """The decoded expert, promoting it from disk when Cold (ExpertNotLoaded if unknown)."""
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._memory.move_to_end(key)
                return hit
            record = self._records.get(key)
            if record is None:
                raise ExpertNotLoaded(f"expert {_fmt(key)} is not loaded on this node")
            future = self._inflight.get(key)
            owner = future is None
            if owner:
                future = self._inflight[key] = Future()
        assert future is not None
        if not owner:
            return future.result()  # another thread is decoding this key: share its result
        try:
            expert = self._load(key, record)
        except BaseException as exc:
            with self._lock:
                self._inflight.pop(key, None)
            future.set_exception(exc)
            raise
        with self._lock:
            self._inflight.pop(key, None)
            current = self._records.get(key)
            # unloaded or replaced while we decoded: hand back this copy but do not cache it
            promoted = current is not None and current.generation == record.generation
            if promoted:
                self._insert(key, expert)
        future.set_result(expert)
        if promoted:
            self._changed()
        return expert

    def promote(self, keys: Iterable[Key]) -> None:
        """Readahead: make each listed, registered expert memory-resident (in order)."""
        for key in dict.fromkeys(keys):  # dedupe, keep order
            with self._lock:
                if key not in self._records or key in self._memory:
                    continue
            self.get(key)

    def warm(self, keys: Iterable[Key] | None = None) -> int:
        """Promote Cold experts (in the order given; every registered one by default) into the memory
        tier's free room, never evicting one to make room: it stops at the first that does not fit.
        Returns how many were promoted.

        A restart re-registers every payload as Cold, and a planner routes to Warm holders only (a
        Cold one is asked only when nobody else holds the expert): a node brought back with room for
        its experts would serve nothing until something happened to promote them. A payload that
        fails its hash is forgotten as in `get` (on_corrupt fetches it again) and skipped."""
        promoted = 0
        for key in list(keys if keys is not None else self.keys()):
            with self._lock:
                record = self._records.get(key)
                if record is None or key in self._memory or key in self._inflight:
                    continue
            try:
                expert = self._load(key, record)
            except (CorruptPayload, InvalidPayload) as exc:
                log.warning("expert %s not warmed: %s", _fmt(key), exc)
                continue
            with self._lock:
                room = self.budget_bytes - self._used - sum(self._reserved.values())
                if expert.nbytes > room:
                    break
                current = self._records.get(key)
                if current is None or current.generation != record.generation or key in self._memory:
                    continue  # unloaded, replaced or promoted meanwhile
                self._insert(key, expert)
                promoted += 1
            self._changed()
        return promoted

    def _load(self, key: Key, record: Record) -> ResidentExpert:
        try:
            data = record.path.read_bytes()
        except OSError as exc:
            raise InvalidPayload(f"disk-tier payload of expert {_fmt(key)} is unreadable: {exc}") from exc
        if record.hash is not None and blake3(data).hexdigest() != record.hash:
            self._forget_corrupt(key, record)
            raise CorruptPayload(f"disk-tier payload of expert {_fmt(key)} at {record.path} does not match its hash "
                                 f"{record.hash[:16]}…: forgotten, not decoded")
        expert = self._decode(data)
        if expert.key != key:
            raise InvalidPayload(f"disk-tier payload at {record.path} holds {_fmt(expert.key)}, expected {_fmt(key)}")
        return expert

    def _forget_corrupt(self, key: Key, record: Record) -> None:
        """Drop a registration whose payload failed its hash (unless reloaded meanwhile) and its files."""
        with self._lock:
            if self._records.get(key) is record:
                self._records.pop(key)
                self._drop_memory(key)
        for p in (record.path, record.path.with_suffix(".json")):
            p.unlink(missing_ok=True)
        log.error("expert %s: disk-tier payload %s does not match its hash; forgotten", _fmt(key), record.path)
        self._changed()
        if self._on_corrupt is not None:
            try:
                self._on_corrupt(key, record.blob_uri)
            except Exception:
                log.exception("corrupt payload listener failed")

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:  # a listener's failure must never break a load or a forward
                log.exception("tier change listener failed")

    # -- memory tier (callers hold the lock) ----------------------------------------------------

    def _insert(self, key: Key, expert: ResidentExpert) -> None:
        limit = self.budget_bytes - sum(self._reserved.values())
        if expert.nbytes > limit:
            return  # cannot fit: stays disk-tier, decoded per call by `get`
        self._drop_memory(key)
        self._evict_to(limit - expert.nbytes)
        self._memory[key] = expert
        self._used += expert.nbytes
        assert self._used <= limit

    def _evict_to(self, limit: int) -> int:
        """Drop memory-tier experts, LRU first, until they use at most `limit` bytes; how many went."""
        evicted = 0
        while self._memory and self._used > limit:
            _, expert = self._memory.popitem(last=False)
            self._used -= expert.nbytes
            evicted += 1
        return evicted

    def _drop_memory(self, key: Key) -> None:
        old = self._memory.pop(key, None)
        if old is not None:
            self._used -= old.nbytes


def _fmt(key: Key) -> str:
    return f"(model_id={key[0]!r}, layer={key[1]}, expert={key[2]})"
