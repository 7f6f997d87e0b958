"""An in-process network of gossiping nodes: real records and signatures, a simulated transport.

Each SimNode runs the same Gossip rounds a real node runs from its Celery task (offer rumors to
`fanout` random peers and send what they want, a sync with one random peer and, now and then, with
a configured one, then ack2: apps/providers/rounds.py), but messages are handed
over in memory and their JSON size is counted, in total and by kind of message (`KINDS`). Used by
the gossip tests and bench/gossip.py.

For large simulations (bench/gossip.py) three optional parts keep the protocol and make the run
cheaper or possible: `IndexedStore` (a MemoryStore whose digest is kept up to date instead of
recomputed from every Entry), `verify_once_per_envelope()` (each distinct signed envelope is
verified once per block instead of on every receipt) and `converged_network()` (a network that
starts already converged, for steady-state measurements). `SimNetwork(drop_refused=True)` drops
a message `Gossip.receive` refuses whole, as a node's peer door answers an error, instead of
raising.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from nacl.signing import SigningKey

import apps.providers.gossip as gossip_module
from apps.providers.gossip import Entry, Gossip, Limits, MemoryStore, Store, parse_digest
from apps.providers.records import Heartbeat, Holding, RecordError, SignedRecord
from testkit.records import heartbeat, new_key, signed_record

# What SimNode.sent_by_kind counts: rumor pushes, the SYN digest, the ACK answer (sent by the
# peer that was synced with), the ACK2 with what that peer wanted.
KINDS = ("push", "sync", "ack", "ack2")


def wire_size(message: dict) -> int:
    return len(json.dumps(message, separators=(",", ":")))


@dataclass
class SimNode:
    key: SigningKey
    gossip: Gossip
    seeds: list[str]  # provider ids it was configured with (its --peers)
    record: SignedRecord
    alive: bool = True
    sent_bytes: int = 0
    sent_by_kind: Counter[str] = field(default_factory=Counter)  # the same bytes, by KINDS

    @property
    def pid(self) -> str:
        return self.gossip.self_id

    def known(self) -> set[str]:
        return set(self.gossip.store.digest())


@dataclass
class SimNetwork:
    limits: Limits = field(default_factory=Limits)
    nodes: dict[str, SimNode] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    now_ms: int = 1_000_000
    store_factory: Callable[[], Store] = MemoryStore
    drop_refused: bool = False  # True: a message receive() refuses whole is dropped and counted in `refused`
    refused: Counter[str] = field(default_factory=Counter)  # messages dropped, by RecordError reason
    # the last message sized and its size: a push goes to `fanout` peers unchanged, sized once
    _sized: tuple[dict | None, int] = field(default=(None, 0), repr=False, compare=False)
    _envelope_sizes: dict[tuple[tuple[str, Any], ...], int] = field(default_factory=dict, repr=False, compare=False)

    def add(self, seed: int, *, seeds: list[str], holdings: tuple[Holding, ...] | None = None,
            n_holdings: int = 4) -> SimNode:
        key = new_key(seed)
        pid = key.verify_key.encode().hex()
        record = signed_record(key, seq=self.now_ms, at_ms=self.now_ms, n_holdings=n_holdings,
                               **({"holdings": holdings} if holdings else {}))
        node = SimNode(key, Gossip(self.store_factory(), self_id=pid, limits=self.limits), seeds, record)
        node.gossip.issue(record, heartbeat(key, seq=record.seq, at_ms=self.now_ms))
        self.nodes[pid] = node
        return node

    def _deliver(self, sender: SimNode, target: str, message: dict, kind: str = "push") -> SimNode | None:
        if self._sized[0] is not message:
            self._sized = (message, self.message_size(message))
        size = self._sized[1]
        sender.sent_bytes += size
        sender.sent_by_kind[kind] += size
        node = self.nodes.get(target)
        return node if node is not None and node.alive else None

    def message_size(self, message: dict) -> int:
        """wire_size(message), without encoding again a record envelope this network has sized before.

        A record of 500 holdings is ~100 KB of JSON and a push carries up to 256 of them; the size
        of `{..., "records": [e1, ..., ek], ...}` is that of the same message with `"records": []`
        plus each envelope's own size plus k - 1 commas (compact separators), exactly.
        """
        records = message.get("records")
        if not records:
            return wire_size(message)
        total = wire_size({**message, "records": []}) + len(records) - 1  # same keys, same order
        for envelope in records:
            key = tuple(envelope.items())
            size = self._envelope_sizes.get(key)
            if size is None:
                size = self._envelope_sizes[key] = wire_size(envelope)
            total += size
        return total

    def _refusing(self, action: Callable[[], Any]) -> Any:
        """Run a receiving step; a message refused whole (e.g. "oversized") answers an error."""
        try:
            return action()
        except RecordError as exc:
            if not self.drop_refused:
                raise
            self.refused[exc.reason] += 1
            return None

    def _receive(self, target: SimNode, message: dict) -> None:
        self._refusing(lambda: target.gossip.receive(message["records"], message["heartbeats"], now_ms=self.now_ms))

    def _answer(self, sender: SimNode, size_kind: str, answer: dict) -> None:
        size = self.message_size(answer)
        sender.sent_bytes += size
        sender.sent_by_kind[size_kind] += size

    def _push(self, node: SimNode, peer: str, push: dict) -> None:
        """Offer (push), the peer's answer (what it wants), then the records it wants (ack2)."""
        target = self._deliver(node, peer, push, "push")
        if target is None:
            return
        answer = self._refusing(lambda: target.gossip.answer_push(push, now_ms=self.now_ms))
        if not answer:
            return
        self._answer(target, "ack", answer)
        if answer["want"]:
            wanted = node.gossip.records_for(answer["want"])
            if self._deliver(node, peer, wanted, "ack2") is not None:
                self._receive(target, wanted)

    def _sync(self, node: SimNode, peer: str) -> None:
        """SYN (digest), ACK (what the peer has newer, and what it wants), ACK2."""
        syn = node.gossip.sync_request()
        target = self._deliver(node, peer, syn, "sync")
        if target is None:
            return
        ack = target.gossip.answer_sync(parse_digest(syn["digest"], limit=1 << 20))
        self._answer(target, "ack", ack)
        self._receive(node, ack)
        if ack["want"] or ack["want_beats"]:
            ack2 = node.gossip.records_for(ack["want"], ack["want_beats"])
            if self._deliver(node, peer, ack2, "ack2") is not None:
                self._receive(target, ack2)

    def round(self, *, step_ms: int = 5_000, heartbeat_every: int = 3, round_no: int = 0) -> None:
        """One gossip round on every live node (in a random order), then the clock advances."""
        order = [n for n in self.nodes.values() if n.alive]
        self.rng.shuffle(order)
        for node in order:
            if round_no % heartbeat_every == 0:
                node.gossip.issue(node.record, heartbeat(node.key, seq=node.record.seq, at_ms=self.now_ms))
            node.gossip.expire(now_ms=self.now_ms)
            candidates = sorted(node.known() | set(node.seeds))
            push = node.gossip.push_message()
            for peer in node.gossip.pick_peers(candidates, self.rng, self.limits.fanout):
                self._push(node, peer, push)
            for peer in node.gossip.pick_peers(candidates, self.rng, 1):
                self._sync(node, peer)
            seeds = [pid for pid in node.seeds if pid != node.pid]
            if seeds and self.rng.random() < self.limits.seed_sync_probability:
                self._sync(node, self.rng.choice(seeds))
        self.now_ms += step_ms

    def converged(self) -> bool:
        """Every live node knows exactly the live nodes, at their current record seq."""
        live = {pid: n.record.seq for pid, n in self.nodes.items() if n.alive}
        return all({pid: v[0] for pid, v in n.gossip.store.digest().items()} == live
                   for n in self.nodes.values() if n.alive)

    def run_until_converged(self, *, max_rounds: int = 100, **round_kw: int) -> int:
        for rounds in range(1, max_rounds + 1):
            self.round(round_no=rounds, **round_kw)
            if self.converged():
                return rounds
        raise AssertionError(f"no convergence in {max_rounds} rounds")

    def counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for node in self.nodes.values():
            total.update(node.gossip.counts)
        return total


@dataclass
class IndexedStore(MemoryStore):
    """A MemoryStore that keeps its digest up to date as entries are saved and removed.

    MemoryStore.digest() walks every Entry (two properties each), and Gossip asks for it several
    times per node and round (receive only for its length, sync_request, answer_sync, expire),
    which makes a 1,000-node simulation spend most of its time there. Here digest() is a copy of
    a dict kept beside `items`, in the same order, so every answer equals MemoryStore's
    (tests/providers/test_gossip_sim.py runs a network on each and compares).
    Entries must not be mutated in place (Gossip never does: it saves `replace`d copies).
    """

    versions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.versions = {pid: e.version for pid, e in self.items.items()}

    def digest(self) -> dict[str, tuple[int, int]]:
        return dict(self.versions)

    def save(self, entries: Sequence[Entry]) -> None:
        super().save(entries)
        for entry in entries:
            self.versions[entry.provider_id] = entry.version

    def remove(self, provider_ids: Sequence[str]) -> None:
        super().remove(provider_ids)
        for pid in provider_ids:
            self.versions.pop(pid, None)


@contextmanager
def verify_once_per_envelope() -> Iterator[Counter[str]]:
    """Within the block, Gossip checks each distinct record envelope and heartbeat once.

    A simulation hands the same signed text to every node, each of which verifies it again on
    every receipt (a duplicate push is verified before it is found to be a duplicate), so
    ed25519 and the record parse dominate a large run. The outcome of `verify_record` /
    `verify_heartbeat` (the SignedRecord or Heartbeat, or the RecordError's reason and message)
    is remembered by the exact values they check: record text, signature and max_bytes; the
    heartbeat's four fields with their types. Verdicts are unchanged; what a reader must be told
    is that signatures were verified once per distinct envelope, not once per receipt.

    Swaps the names apps.providers.gossip looks up at call time, restored on exit; not
    thread-safe. Yields counts: "verified" (distinct envelopes checked) and "reused".
    """
    real_record, real_heartbeat = gossip_module.verify_record, gossip_module.verify_heartbeat
    memo: dict[tuple[Any, ...], SignedRecord | Heartbeat | tuple[str, str]] = {}
    counts: Counter[str] = Counter()

    def remembered(key: tuple[Any, ...] | None, check: Callable[[], SignedRecord | Heartbeat]) -> Any:
        if key is None:
            return check()
        try:
            outcome = memo.get(key)
        except TypeError:  # an unhashable field (a list where a string belongs): no memo
            return check()
        if outcome is None:
            counts["verified"] += 1
            try:
                outcome = check()
            except RecordError as exc:
                outcome = (exc.reason, exc.message)
            memo[key] = outcome
        else:
            counts["reused"] += 1
        if isinstance(outcome, tuple):
            raise RecordError(*outcome)
        return outcome

    def verify_record(value: Any, *, max_bytes: int) -> SignedRecord:
        key = None
        if isinstance(value, Mapping) and isinstance(value.get("record"), str) and isinstance(
                value.get("signature"), str):
            key = ("record", value["record"], value["signature"], max_bytes)
        return remembered(key, lambda: real_record(value, max_bytes=max_bytes))

    def verify_heartbeat(value: Any) -> Heartbeat:
        key = None
        if isinstance(value, Mapping):
            get = value.get
            key = ("heartbeat", get("provider_id"), get("seq"), get("at_ms"), get("signature"))
            if not (type(key[2]) is int and type(key[3]) is int):  # True == 1, but a bool seq is malformed
                key = None
        return remembered(key, lambda: real_heartbeat(value))

    gossip_module.verify_record, gossip_module.verify_heartbeat = verify_record, verify_heartbeat
    try:
        yield counts
    finally:
        gossip_module.verify_record, gossip_module.verify_heartbeat = real_record, real_heartbeat


def converged_network(n: int, *, limits: Limits | None = None, rng: random.Random | None = None,
                      holdings_for: Callable[[int], tuple[Holding, ...] | None] = lambda i: None,
                      store_factory: Callable[[], Store] = IndexedStore) -> SimNetwork:
    """n nodes that already know each other, as if the join phase had run and its rumors died out.

    Each node is added as SimNetwork.add does (its own signed record and heartbeat), configured
    with node 0 as its one seed; then every store is given every node's current Entry, with no
    rumor rounds left. The Entry objects are built once and shared by all stores (nothing mutates
    an Entry in place). For steady-state measurements; it skips the join phase entirely.
    """
    net = SimNetwork(limits=limits or Limits(), store_factory=store_factory,
                     **({"rng": rng} if rng is not None else {}))
    first = net.add(0, seeds=[], holdings=holdings_for(0))
    for i in range(1, n):
        net.add(i, seeds=[first.pid], holdings=holdings_for(i))
    current = [replace(e, rumor_rounds=0) for node in net.nodes.values()
               for e in node.gossip.store.entries([node.pid]).values()]
    for node in net.nodes.values():
        node.gossip.store.save(current)
    return net
