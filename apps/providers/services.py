"""Writes of the gossip view: merging what peers send, and this node's own signed record.

Every merge runs in one transaction with the rows it touches locked (DbStore(lock=True)), so the
worker's QUIC door, the web's HTTP door and the Celery round never interleave on one provider.
Verdict counts (accepted, forged, replayed, …) accumulate in GossipCount for the status.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from apps.node.selectors import node_identity
from apps.providers.gossip import Gossip, Limits, parse_digest
from apps.providers.models import GossipCount, Provider, Reachability
from apps.providers.records import ProviderRecord, SignedRecord, sign_heartbeat, sign_record
from apps.providers.selectors import announcement, wire_as_of
from apps.providers.signals import holdings_changed, providers_changed
from core import metrics


def now_ms() -> int:
    return int(time.time() * 1000)


def gossip_limits() -> Limits:
    return Limits(ttl_ms=int(settings.TENZRO_GOSSIP_TTL_S * 1000),
                  max_skew_ms=int(settings.TENZRO_GOSSIP_MAX_SKEW_S * 1000),
                  max_record_bytes=settings.TENZRO_GOSSIP_MAX_RECORD_BYTES, fanout=settings.TENZRO_GOSSIP_FANOUT,
                  seed_sync_probability=settings.TENZRO_GOSSIP_SEED_PROBABILITY)


def gossip_engine(*, lock: bool = False) -> Gossip:
    from apps.providers.store import DbStore  # the store imports models; keep this module's import light

    self_id = node_identity().provider_id
    return Gossip(DbStore(self_id=self_id, lock=lock), self_id=self_id, limits=gossip_limits())


def _count(verdicts: Counter[str]) -> None:
    for verdict, n in verdicts.items():
        if n:
            metrics.GOSSIP_RECORDS.labels(verdict).inc(n)  # verdicts are gossip.VERDICTS (+ expired_removed)
        if n and not GossipCount.objects.filter(verdict=verdict).update(count=F("count") + n):
            try:
                with transaction.atomic():
                    GossipCount.objects.create(verdict=verdict, count=n)
            except IntegrityError:  # created concurrently: add to it
                GossipCount.objects.filter(verdict=verdict).update(count=F("count") + n)


def _announce(*, engine: Gossip, removed: Sequence[str] = ()) -> None:
    """Inside a merge's transaction: once it commits, say which providers it stored or dropped and
    which models' holdings it changed (the dashboard's network page and shard map); a rolled-back
    merge announces nothing."""
    changed = sorted(getattr(engine.store, "stored_records", ()))
    alive = dict(getattr(engine.store, "heartbeats", {}))
    if changed or removed or alive:
        transaction.on_commit(lambda: providers_changed.send(sender=Provider, changed=changed, removed=list(removed),
                                                             alive=alive))
    models = sorted(getattr(engine.store, "changed_models", ()))
    if models:
        transaction.on_commit(lambda: holdings_changed.send(sender=Gossip, model_ids=models))


def gossip_receive(*, records: Sequence[Any], heartbeats: Sequence[Any]) -> dict[str, int]:
    """Merge a push (or a sync answer, or an ack2); returns the verdict counts of this message."""
    with transaction.atomic():
        engine = gossip_engine(lock=True)
        verdicts = engine.receive(records, heartbeats, now_ms=now_ms())
        _count(verdicts)
        _announce(engine=engine)
    return dict(verdicts)


def gossip_answer_push(*, message: dict[str, Any]) -> dict[str, Any]:
    """A peer's push: merge its records and heartbeats, answer the offered records wanted here."""
    with transaction.atomic():
        engine = gossip_engine(lock=True)
        answer = engine.answer_push(message, now_ms=now_ms())
        _count(Counter(answer["verdicts"]))
        _announce(engine=engine)
    return answer


def gossip_answer_sync(*, digest: Any) -> dict[str, Any]:
    """ACK to a peer's SYN: what it lacks and what this node wants."""
    limit = settings.TENZRO_GOSSIP_MAX_PROVIDERS
    return gossip_engine().answer_sync(parse_digest(digest, limit=limit))


def gossip_records_for(*, provider_ids: Sequence[str], beats_for: Sequence[str] = ()) -> dict[str, Any]:
    return gossip_engine().records_for(provider_ids, beats_for)


def gossip_push_message() -> dict[str, Any]:
    """This round's rumors (spends one round of each)."""
    with transaction.atomic():
        return gossip_engine(lock=True).push_message()


def gossip_expire() -> list[str]:
    with transaction.atomic():
        engine = gossip_engine(lock=True)
        gone = engine.expire(now_ms=now_ms())
        _count(Counter({"expired_removed": len(gone)}))
        _announce(engine=engine, removed=gone)
    return gone


# -- this node's own record ---------------------------------------------------------------------

def _needs_new_seq(current: Provider | None, fields: dict[str, Any]) -> bool:
    if current is None:
        return True
    old = current.record_text
    from apps.providers.records import verify_record  # parse our own stored record back

    previous = verify_record({"record": old, "signature": current.signature}, max_bytes=len(old) + 1).record
    same = {k: getattr(previous, k) for k in fields if k != "holdings"} == {k: v for k, v in fields.items()
                                                                           if k != "holdings"}
    old_holdings = {(h.model_id, h.layer, h.expert): h for h in previous.holdings}
    new_holdings = {(h.model_id, h.layer, h.expert): h for h in fields["holdings"]}
    if not same or old_holdings.keys() != new_holdings.keys():
        return True
    step = settings.TENZRO_RECORD_TPS_STEP
    for key, new in new_holdings.items():
        old_h = old_holdings[key]
        if (old_h.residency, old_h.blob_uri) != (new.residency, new.blob_uri):
            return True
        if _moved(old_h.committed_tps, new.committed_tps, step) or _moved(old_h.capacity_tps, new.capacity_tps, step):
            return True
    return False


def _moved(old: int, new: int, step: float) -> bool:
    """A metered figure moved enough to re-sign for: by more than `step` of itself and 10 rows/s."""
    return abs(new - old) > max(step * old, 10)


def local_record_refresh() -> SignedRecord | None:
    """Re-sign this node's record when what it announces changed (docs/protocol.md lists when),
    and sign a heartbeat when the last one is TENZRO_GOSSIP_HEARTBEAT_S old. Returns the new
    record, or None when the current one still holds."""
    identity = node_identity()
    fields, _ = announcement()
    at = now_ms()
    with transaction.atomic():
        current = Provider.objects.select_for_update().filter(provider_id=identity.provider_id).first()
        engine = gossip_engine(lock=True)
        signed = None
        if _needs_new_seq(current, fields):
            seq = max(at, (current.seq + 1) if current else 0)  # monotonic even if the clock steps back
            record = ProviderRecord(provider_id=identity.provider_id, seq=seq, issued_at_ms=at, **fields)
            signed = sign_record(record, identity.signing_key)
        elif current is not None and at - current.alive_ms < settings.TENZRO_GOSSIP_HEARTBEAT_S * 1000:
            return None  # nothing changed and the last heartbeat is recent
        record_now = signed or engine.store.entries([identity.provider_id])[identity.provider_id].record
        beat = sign_heartbeat(provider_id=identity.provider_id, seq=record_now.seq, at_ms=at,
                              key=identity.signing_key)
        engine.issue(record_now, beat)
        _announce(engine=engine)
    return signed


def reachability_record(*, http_ok: bool, quic_ok: bool, checked_by: str, detail: str) -> bool:
    """Store a dial-back's answer; True when it changed what this node may announce."""
    before = Reachability.objects.filter(pk=1).first()
    Reachability.objects.update_or_create(pk=1, defaults={
        "http_ok": http_ok, "quic_ok": quic_ok, "checked_by": checked_by, "checked_at": timezone.now(),
        "detail": detail})
    return before is None or (before.http_ok, before.quic_ok) != (http_ok, quic_ok)


def provider_latency_record(*, provider_id: str, latency_ms: float, wire_ns_per_byte: float | None = None) -> None:
    """Fold a measured round trip, and where measured the wire's time per byte, into the provider's
    (EWMA, alpha 0.3 each; the wire time as the planner saw it, decayed since it was last measured):
    the planner ranks by them."""
    row = (Provider.objects.filter(provider_id=provider_id)
           .values_list("latency_ms", "wire_ns_per_byte", "wire_measured_ms").first())
    if row is None:
        return
    update: dict[str, float | int] = {"latency_ms": _folded(row[0], latency_ms)}
    if wire_ns_per_byte is not None:
        now = now_ms()
        update["wire_ns_per_byte"] = _folded(wire_as_of(row[1], row[2], now), wire_ns_per_byte)
        update["wire_measured_ms"] = now
    Provider.objects.filter(provider_id=provider_id).update(**update)


def _folded(before: float | None, measured: float) -> float:
    return measured if before is None else 0.7 * before + 0.3 * measured
