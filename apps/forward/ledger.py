"""What forwards owe the control plane, gathered off the critical path and written once.

Pure module (no Django). A layer forward ends with penalties (its failures), latencies (each
winner's wire time, which the planner ranks by), the batches its sampling kept, and each remote
holder's verified work (rows served and the commitments that prove them, which the settlement
pays). A `tenzro_moeForward` writes its own ledger after its answer; a generation passes one
ledger to every MoE layer of every step and writes it once when the generation ends: one
settlement per holder per generation, bound to the concatenation of its batches' commitments,
and no database write per layer on the decode path.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.forward.report import Failure, ForwardReport


@dataclass
class ForwardWork:
    """Failures, per-holder latencies (ms, one median per forward) and wire times per byte (ns, one per
    forward that moved enough bytes), kept batches and each remote holder's work {tokens,
    price_per_input_token, commitments}, over one or many forwards."""

    failures: list[Failure] = field(default_factory=list)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    wire_ns_per_byte: dict[str, list[float]] = field(default_factory=dict)
    kept: list[dict[str, Any]] = field(default_factory=list)
    holders: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, report: ForwardReport, *, self_id: str, prices: Mapping[str, str],
            blob_of: Mapping[tuple[str, int, int], str | None]) -> None:
        """One forward's report: `prices` {provider: its record's price per input token}, `blob_of`
        {(provider, layer, expert): the blob_uri of its holding} (for kept batches, whose dispute
        fetches the expert from there)."""
        self.failures.extend(report.failures)
        for pid, stats in report.holders.items():
            if stats.latencies_s:
                # The planner's latency is a holder's round trip beside its compute (committed_tps
                # accounts for that): the QUIC path's own where it was measured, else the wire's share
                # where the holder reported its compute. Not the wire's share over QUIC: on a lossy path
                # that is mostly the time its bytes took, which grows with the rows it was given, and
                # the holder that answered faster was given every row of the next forward and the
                # other none, which left its old figure standing (docs/performance.md, "Loss and
                # reordering on the wire").
                wire = stats.rtts_s or stats.overheads_s or stats.latencies_s
                self.latencies_ms.setdefault(pid, []).append(statistics.median(wire) * 1000.0)
            if pid != self_id and (per_byte := stats.wire_ns_per_byte()) is not None:
                self.wire_ns_per_byte.setdefault(pid, []).append(per_byte)
            if pid == self_id or not stats.receipts:
                continue
            held = self.holders.setdefault(pid, {"provider_id": pid, "tokens": 0, "commitments": [],
                                                 "price_per_input_token": prices.get(pid, "0")})
            held["tokens"] += stats.rows
            held["commitments"].extend(v.commitment for v in stats.receipts)  # in the order they were accepted
            self.kept.extend({"receipt": v.receipt, "sketch": v.sketch, "carrier": v.carrier,
                              "commitment": v.commitment, "batch": v.batch,
                              "blob_uri": blob_of.get((pid, v.layer, v.expert))}
                             for v in stats.receipts if v.kept)

    def absorb(self, other: ForwardWork) -> None:
        """Take `other`'s forwards as this ledger's own (a batched step's work, settled with one of its
        generations)."""
        self.failures.extend(other.failures)
        for mine, theirs in ((self.latencies_ms, other.latencies_ms), (self.wire_ns_per_byte, other.wire_ns_per_byte)):
            for pid, values in theirs.items():
                mine.setdefault(pid, []).extend(values)
        self.kept.extend(other.kept)
        for pid, theirs in other.holders.items():
            held = self.holders.setdefault(pid, {**theirs, "tokens": 0, "commitments": []})
            held["tokens"] += theirs["tokens"]
            held["commitments"].extend(theirs["commitments"])

    def latency_medians(self) -> dict[str, float]:
        """Each holder's median over the forwards it served (ms)."""
        return {pid: statistics.median(values) for pid, values in self.latencies_ms.items()}

    def wire_medians(self) -> dict[str, float]:
        """Each holder's median wire time per byte over the forwards that measured it (ns)."""
        return {pid: statistics.median(values) for pid, values in self.wire_ns_per_byte.items()}

    def holder_rows(self) -> list[dict[str, Any]]:
        """The settlement's holders, by provider id."""
        return [self.holders[pid] for pid in sorted(self.holders)]

    def __bool__(self) -> bool:
        return bool(self.failures or self.latencies_ms or self.holders)
