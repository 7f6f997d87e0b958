"""Gossip of signed provider records, sans-I/O: the merge rules and one node's round.

Pure module (no Django, no sockets, no clock): callers pass `now_ms`, a Store and a random
generator, and carry the messages. The node's database backs the Store in production
(apps/providers/services.py); an in-memory Store backs tests and the convergence simulation.

The design follows Cassandra's gossiper (org.apache.cassandra.gms.Gossiper: a GossipDigestSyn
carrying {endpoint: version}, answered by an Ack with the deltas and the digests it wants,
closed by an Ack2) and the Scuttlebutt reconciliation of van Renesse et al., "Efficient
Reconciliation and Flow Control for Anti-Entropy Protocols" (2008), with memberlist's split of
dissemination from anti-entropy (hashicorp/memberlist state.go: gossip of fresh items to a
few random peers for a bounded number of rounds, plus periodic push-pull):

* **Versions.** A provider's digest entry is (record seq, heartbeat at_ms). Records change
  rarely and are big (500 holdings ~ 90 KB); liveness changes every heartbeat and is a
  ~250-byte signed statement. A record is sent only to a peer that says it lacks it, never
  again to one that has it.
* **Dissemination (push).** A newly accepted record is a rumor for `rumor_rounds(n)` ≈ log2(n)
  + 2 rounds: each round the node *offers* its rumors' versions (and its own) with their
  heartbeats to `fanout` random peers; a peer answers which records it wants, and only those
  travel. (Pushing whole records blind resent ~9 of 10 to peers that had them: bench/gossip.)
* **Anti-entropy (pull).** Each round a node sends its digest to one random peer (sync); the
  peer answers the records and heartbeats newer on its side (the stalest on the asking side
  first, when capped) and the records and heartbeats it wants; the node sends those (ack2).
  With probability `seed_sync_probability` it also syncs with one of its configured peers,
  as Cassandra's gossiper does with its seeds, so groups that formed apart cannot stay apart.
* **Merge.** Highest record seq wins; for one seq, the latest heartbeat. Signatures, the id-key
  binding, size and clock skew are checked before anything is stored. A provider whose
  newest liveness (heartbeat, else the record's issue time) is older than the TTL is dropped.
  Every refusal is counted by its reason.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from apps.providers.records import (
    Heartbeat,
    RecordError,
    SignedRecord,
    claimed_provider_id,
    verify_heartbeat,
    verify_record,
)

# Refusal reasons, counted (visible in the node's gossip status).
VERDICTS = ("accepted", "duplicate", "replayed", "forged", "expired", "skewed", "oversized", "malformed")


@dataclass(frozen=True)
class Limits:
    """Gossip parameters (settings TENZRO_GOSSIP_*, docs/operations.md)."""

    ttl_ms: int = 60_000
    max_skew_ms: int = 30_000
    max_record_bytes: int = 1 << 20
    fanout: int = 3
    max_items_per_message: int = 256  # records (tens of KB each) per message
    max_beats_per_message: int = 1024  # heartbeats (~250 bytes each) per message
    seed_sync_probability: float = 0.25  # per round, also sync with a configured peer (see Gossip docs)


class RecordRef(Protocol):
    """What gossip needs of a stored record: its version and its envelope. A SignedRecord is one;
    a database row can be one without parsing its holdings back."""

    @property
    def provider_id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def issued_at_ms(self) -> int: ...
    def envelope(self) -> dict[str, str]: ...


@dataclass
class Entry:
    """What a node keeps of one provider. `record` is a SignedRecord when it was just verified
    (a Store writes its fields then), else whatever the Store reads back."""

    record: RecordRef
    heartbeat: Heartbeat | None = None
    rumor_rounds: int = 0  # rounds left to push this record to random peers

    @property
    def provider_id(self) -> str:
        return self.record.provider_id

    @property
    def seq(self) -> int:
        return self.record.seq

    @property
    def alive_ms(self) -> int:
        """Newest signed evidence that this record is current."""
        hb = self.heartbeat
        return max(self.record.issued_at_ms, hb.at_ms if hb is not None and hb.seq == self.record.seq else 0)

    @property
    def version(self) -> tuple[int, int]:
        return self.record.seq, self.alive_ms


class Store(Protocol):
    """Where a node keeps its entries (the database in production, a dict in tests)."""

    def digest(self) -> dict[str, tuple[int, int]]: ...
    def count(self) -> int: ...
    def entries(self, provider_ids: Iterable[str]) -> dict[str, Entry]: ...
    def save(self, entries: Sequence[Entry]) -> None: ...
    def remove(self, provider_ids: Sequence[str]) -> None: ...
    def rumors(self) -> list[Entry]: ...


@dataclass
class MemoryStore:
    """A Store in a dict: tests and the simulation."""

    items: dict[str, Entry] = field(default_factory=dict)

    def digest(self) -> dict[str, tuple[int, int]]:
        return {pid: e.version for pid, e in self.items.items()}

    def count(self) -> int:
        return len(self.items)

    def entries(self, provider_ids: Iterable[str]) -> dict[str, Entry]:
        return {pid: self.items[pid] for pid in provider_ids if pid in self.items}

    def save(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            self.items[entry.provider_id] = entry

    def remove(self, provider_ids: Sequence[str]) -> None:
        for pid in provider_ids:
            self.items.pop(pid, None)

    def rumors(self) -> list[Entry]:
        return [e for e in self.items.values() if e.rumor_rounds > 0]


def rumor_rounds(known: int) -> int:
    """Rounds a fresh record is pushed: enough for push gossip to reach everyone w.h.p. (≈ log2 n)."""
    return math.ceil(math.log2(max(known, 1) + 1)) + 2


def parse_digest(value: Any, *, limit: int) -> dict[str, tuple[int, int]]:
    """A peer's digest {provider_id: [seq, alive_ms]}; malformed entries are skipped."""
    if not isinstance(value, Mapping):
        raise RecordError("malformed", "a digest is an object {provider_id: [seq, alive_ms]}")
    if len(value) > limit:
        raise RecordError("oversized", f"a digest of {len(value)} providers exceeds {limit}")
    out = {}
    for pid, version in value.items():
        if (isinstance(pid, str) and len(pid) == 64 and isinstance(version, list) and len(version) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in version)):
            out[pid] = (version[0], version[1])
    return out


class Gossip:
    """One node's side of the protocol over a Store. Not thread-safe: one round at a time."""

    def __init__(self, store: Store, *, self_id: str, limits: Limits) -> None:
        self.store = store
        self.self_id = self_id
        self.limits = limits
        self.counts: Counter[str] = Counter()

    # -- receiving -------------------------------------------------------------------------------

    def receive(self, records: Sequence[Any], heartbeats: Sequence[Any], *, now_ms: int) -> Counter[str]:
        """Merge records and heartbeats from a peer (push, sync answer or ack2); count verdicts."""
        verdicts: Counter[str] = Counter()
        if len(records) > self.limits.max_items_per_message or len(heartbeats) > self.limits.max_beats_per_message:
            raise RecordError("oversized", f"{len(records)} records and {len(heartbeats)} heartbeats in one message "
                                           f"(at most {self.limits.max_items_per_message} and "
                                           f"{self.limits.max_beats_per_message})")
        beats: dict[str, Heartbeat] = {}
        for value in heartbeats:
            try:
                hb = verify_heartbeat(value)
            except RecordError as exc:
                verdicts[exc.reason] += 1
                continue
            if hb.at_ms > now_ms + self.limits.max_skew_ms:
                verdicts["skewed"] += 1
            elif hb.provider_id != self.self_id:
                newest = beats.get(hb.provider_id)
                if newest is None or hb.at_ms > newest.at_ms:
                    beats[hb.provider_id] = hb
        claimed = [claimed_provider_id(v) for v in records]
        stored = self.store.entries({pid for pid in claimed if pid} | set(beats))
        fresh: list[SignedRecord] = []
        for value, pid in zip(records, claimed, strict=True):
            current = stored.get(pid) if pid else None
            if current is not None and current.record.envelope() == value:
                verdicts["duplicate"] += 1  # the very envelope held already: no need to verify it again
                continue
            try:
                fresh.append(verify_record(value, max_bytes=self.limits.max_record_bytes))
            except RecordError as exc:
                verdicts[exc.reason] += 1
        known = self.store.count()
        changed: dict[str, Entry] = {}
        for signed in sorted(fresh, key=lambda r: (r.provider_id, r.seq)):
            verdict, entry = self._judge_record(signed, changed.get(signed.provider_id) or
                                                stored.get(signed.provider_id), beats, now_ms, known)
            verdicts[verdict] += 1
            if entry is not None:
                changed[signed.provider_id] = entry
        for pid, hb in beats.items():
            entry = changed.get(pid) or stored.get(pid)
            if entry is None or hb.seq != entry.seq:
                continue  # a record we lack or have superseded: anti-entropy fetches the record
            if hb.at_ms > entry.alive_ms:
                if now_ms - hb.at_ms > self.limits.ttl_ms:
                    verdicts["expired"] += 1
                    continue
                changed[pid] = replace(entry, heartbeat=hb)
        if changed:
            self.store.save(list(changed.values()))
        self.counts.update(verdicts)
        return verdicts

    def _judge_record(self, signed: SignedRecord, current: Entry | None, beats: Mapping[str, Heartbeat],
                      now_ms: int, known: int) -> tuple[str, Entry | None]:
        if signed.provider_id == self.self_id:
            return "duplicate", None  # only this node issues its own record
        if signed.issued_at_ms > now_ms + self.limits.max_skew_ms:
            return "skewed", None
        if current is not None and signed.seq < current.seq:
            return "replayed", None
        if current is not None and signed.seq == current.seq:
            return "duplicate", None
        hb = beats.get(signed.provider_id)
        entry = Entry(record=signed, heartbeat=hb if hb is not None and hb.seq == signed.seq else None,
                      rumor_rounds=rumor_rounds(known))
        if now_ms - entry.alive_ms > self.limits.ttl_ms:
            return "expired", None
        return "accepted", entry

    # -- sending ---------------------------------------------------------------------------------

    def sync_request(self) -> dict[str, Any]:
        """SYN: this node's digest."""
        return {"digest": {pid: list(version) for pid, version in self.store.digest().items()}}

    def answer_sync(self, peer_digest: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
        """ACK: what the peer lacks, and what this node wants of what it has.

        `records`: newer records here (the peer's oldest versions first); `heartbeats`: newer
        liveness here (the peer's stalest first, so a capped answer still refreshes whom the
        peer is closest to dropping); `want`: providers whose record is newer at the peer;
        `want_beats`: providers whose liveness is newer at the peer (same seq). The peer answers
        both wants in its ACK2, so liveness flows both ways in one exchange.
        """
        mine = self.store.digest()
        unknown = (-1, -1)
        cap = self.limits.max_items_per_message
        newer_records = sorted((pid for pid, (seq, _) in mine.items() if seq > peer_digest.get(pid, unknown)[0]),
                               key=lambda pid: (peer_digest.get(pid, unknown), pid))[:cap]
        sent = set(newer_records)
        newer_beats = sorted((pid for pid, version in mine.items()
                              if pid not in sent and version > peer_digest.get(pid, unknown)),
                             key=lambda pid: (peer_digest.get(pid, unknown)[1], pid))
        beat_ids = [*newer_records, *newer_beats][: self.limits.max_beats_per_message]
        entries = self.store.entries(beat_ids)
        want = sorted(pid for pid, (seq, _) in peer_digest.items() if seq > mine.get(pid, unknown)[0])
        want_beats = sorted(pid for pid, (seq, alive) in peer_digest.items()
                            if pid in mine and seq == mine[pid][0] and alive > mine[pid][1])
        return {
            "records": [entries[pid].record.envelope() for pid in newer_records if pid in entries],
            "heartbeats": [entries[pid].heartbeat.to_json() for pid in beat_ids
                           if pid in entries and entries[pid].heartbeat is not None],
            "want": want[:cap],
            "want_beats": want_beats[: self.limits.max_beats_per_message],
        }

    def records_for(self, provider_ids: Iterable[str], beats_for: Iterable[str] = ()) -> dict[str, Any]:
        """ACK2 (or the answer to a push's `want`): the records asked for, with their heartbeats,
        and the heartbeats asked for alone."""
        record_ids = sorted(set(provider_ids))[: self.limits.max_items_per_message]
        beat_ids = sorted(set(beats_for) - set(record_ids))[: self.limits.max_beats_per_message - len(record_ids)]
        entries = self.store.entries([*record_ids, *beat_ids])
        return {"records": [entries[pid].record.envelope() for pid in record_ids if pid in entries],
                "heartbeats": [entries[pid].heartbeat.to_json() for pid in [*record_ids, *beat_ids]
                               if pid in entries and entries[pid].heartbeat is not None]}

    def push_message(self) -> dict[str, Any]:
        """This round's push: an offer of the rumors' versions (and this node's own), with their
        heartbeats; records follow only for the ones a peer answers it wants. Spends one round of
        each rumor."""
        rumors = sorted(self.store.rumors(), key=lambda e: e.provider_id)[: self.limits.max_items_per_message]
        offered = {e.provider_id: e for e in rumors}
        offered.update(self.store.entries([self.self_id]))  # this node's liveness rides every push
        message = {"offer": {pid: list(e.version) for pid, e in offered.items()},
                   "heartbeats": [e.heartbeat.to_json() for e in offered.values() if e.heartbeat is not None]}
        if rumors:
            self.store.save([replace(e, rumor_rounds=e.rumor_rounds - 1) for e in rumors])
        return message

    def answer_push(self, message: Mapping[str, Any], *, now_ms: int) -> dict[str, Any]:
        """Merge a push's records and heartbeats; answer the verdicts and the offered records this
        node wants (a newer seq than it holds, or a provider it does not know)."""
        verdicts = self.receive(message.get("records") or [], message.get("heartbeats") or [], now_ms=now_ms)
        offer = parse_digest(message.get("offer") or {}, limit=self.limits.max_items_per_message + 1)
        mine = self.store.entries(offer)
        want = sorted(pid for pid, (seq, _) in offer.items()
                      if pid != self.self_id and (pid not in mine or seq > mine[pid].seq))
        return {"verdicts": dict(verdicts), "want": want}

    def expire(self, *, now_ms: int) -> list[str]:
        """Drop every provider (never this node) silent for longer than the TTL."""
        limit = now_ms - self.limits.ttl_ms
        gone = sorted(pid for pid, (_, alive) in self.store.digest().items() if alive < limit and pid != self.self_id)
        if gone:
            self.store.remove(gone)
            self.counts["expired_removed"] += len(gone)
        return gone

    def issue(self, record: SignedRecord, heartbeat: Heartbeat) -> None:
        """Store this node's own (re)signed record and heartbeat; a new seq becomes a rumor."""
        current = self.store.entries([self.self_id]).get(self.self_id)
        is_new = current is None or current.seq < record.seq
        rounds = rumor_rounds(self.store.count()) if is_new else current.rumor_rounds
        self.store.save([Entry(record=record, heartbeat=heartbeat, rumor_rounds=rounds)])

    def pick_peers(self, candidates: Sequence[str], rng: random.Random, k: int) -> list[str]:
        """k distinct random peers among `candidates` (never this node), in a random order."""
        pool = sorted(set(candidates) - {self.self_id})
        return rng.sample(pool, min(k, len(pool)))
