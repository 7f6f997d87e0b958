"""An in-process network of gossiping nodes: real records and signatures, a simulated transport.

Each SimNode runs the same Gossip rounds a real node runs from its Celery task (push rumors to
`fanout` random peers, then a sync with one random peer, then ack2), but messages are handed
over in memory and their JSON size is counted. Used by the gossip tests and bench/gossip.py.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

from nacl.signing import SigningKey

from apps.providers.gossip import Gossip, Limits, MemoryStore, parse_digest
from apps.providers.records import Holding, SignedRecord
from testkit.records import heartbeat, new_key, signed_record


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

    def add(self, seed: int, *, seeds: list[str], holdings: tuple[Holding, ...] | None = None,
            n_holdings: int = 4) -> SimNode:
        key = new_key(seed)
        pid = key.verify_key.encode().hex()
        record = signed_record(key, seq=self.now_ms, at_ms=self.now_ms, n_holdings=n_holdings,
                               **({"holdings": holdings} if holdings else {}))
        node = SimNode(key, Gossip(MemoryStore(), self_id=pid, limits=self.limits), seeds, record)
        node.gossip.issue(record, heartbeat(key, seq=record.seq, at_ms=self.now_ms))
        self.nodes[pid] = node
        return node

    def _deliver(self, sender: SimNode, target: str, message: dict) -> SimNode | None:
        sender.sent_bytes += wire_size(message)
        node = self.nodes.get(target)
        return node if node is not None and node.alive else None

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
                target = self._deliver(node, peer, push)
                if target is not None:
                    target.gossip.receive(push["records"], push["heartbeats"], now_ms=self.now_ms)
            for peer in node.gossip.pick_peers(candidates, self.rng, 1):
                syn = node.gossip.sync_request()
                target = self._deliver(node, peer, syn)
                if target is None:
                    continue
                ack = target.gossip.answer_sync(parse_digest(syn["digest"], limit=1 << 20))
                target.sent_bytes += wire_size(ack)
                node.gossip.receive(ack["records"], ack["heartbeats"], now_ms=self.now_ms)
                if ack["want"]:
                    ack2 = node.gossip.records_for(ack["want"])
                    if self._deliver(node, peer, ack2) is not None:
                        target.gossip.receive(ack2["records"], ack2["heartbeats"], now_ms=self.now_ms)
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
