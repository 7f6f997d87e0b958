"""The gossip Store over the node's database (apps/providers/gossip.py's Store protocol).

Every method is a bounded number of queries whatever the number of providers: the digest is
one query, reading entries one, saving a batch a handful (bulk insert/update, one delete and
one bulk insert of the holdings of the records that changed). Callers run a whole merge inside
one transaction (services.py), with the rows it reads locked, so two processes of a node (the
worker's QUIC door, the web's HTTP door, the Celery round) never interleave on one provider.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from apps.providers.gossip import Entry
from apps.providers.models import Holding, Provider
from apps.providers.records import Heartbeat, SignedRecord


@dataclass(frozen=True)
class StoredRecord:
    """A record read back from its row: enough to gossip it (its text travels as stored)."""

    provider_id: str
    seq: int
    issued_at_ms: int
    text: str
    signature: str

    def envelope(self) -> dict[str, str]:
        return {"record": self.text, "signature": self.signature}


def _heartbeat(row: Provider) -> Heartbeat | None:
    hb = row.heartbeat
    return None if not hb else Heartbeat(row.provider_id, hb["seq"], hb["at_ms"], hb["signature"])


def _entry(row: Provider) -> Entry:
    record = StoredRecord(row.provider_id, row.seq, row.issued_at_ms, row.record_text, row.signature)
    return Entry(record=record, heartbeat=_heartbeat(row), rumor_rounds=row.rumor_rounds)


_LIVENESS_FIELDS = ("alive_ms", "rumor_rounds", "heartbeat")
_RECORD_FIELDS = ("seq", "issued_at_ms", "record_text", "signature", "roles", "http_endpoint", "quic_endpoint",
                  "quic_cert_sha256", "moe_gpu", "activation_codecs", "execute_batches", "price_per_input_token",
                  "name")


def _fields(entry: Entry) -> dict:
    hb = entry.heartbeat
    return {"alive_ms": entry.alive_ms, "rumor_rounds": entry.rumor_rounds,
            "heartbeat": None if hb is None else {"seq": hb.seq, "at_ms": hb.at_ms, "signature": hb.signature}}


def _record_fields(signed: SignedRecord) -> dict:
    r = signed.record
    return {"seq": r.seq, "issued_at_ms": r.issued_at_ms, "record_text": signed.text, "signature": signed.signature,
            "roles": sorted(r.roles), "http_endpoint": r.http_endpoint, "quic_endpoint": r.quic_endpoint,
            "quic_cert_sha256": r.quic_cert_sha256, "moe_gpu": r.moe_gpu,
            "activation_codecs": list(r.activation_codecs), "execute_batches": r.execute_batches,
            "price_per_input_token": r.price_per_input_token, "name": r.name}


class DbStore:
    def __init__(self, *, self_id: str, lock: bool = False) -> None:
        """`lock`: read rows FOR UPDATE (callers hold a transaction) so a merge sees no race."""
        self.self_id = self_id
        self._lock = lock
        # Models whose holdings this store changed (added, replaced or removed): the service
        # announces them once its transaction commits (the dashboard's live shard map).
        self.changed_models: set[str] = set()
        # Provider ids whose record this store wrote (created or newer seq): what a merge changed.
        self.stored_records: set[str] = set()
        # Provider id -> alive_ms, for rows whose liveness this store moved forward without a new
        # record (a fresh heartbeat): the dashboard's liveness, which no record change announces.
        self.heartbeats: dict[str, int] = {}

    def _rows(self):
        rows = Provider.objects.all()
        return rows.select_for_update() if self._lock else rows

    def digest(self) -> dict[str, tuple[int, int]]:
        return {pid: (seq, alive) for pid, seq, alive in Provider.objects.values_list("provider_id", "seq", "alive_ms")}

    def count(self) -> int:
        return Provider.objects.count()

    def entries(self, provider_ids: Iterable[str]) -> dict[str, Entry]:
        return {row.provider_id: _entry(row) for row in self._rows().filter(provider_id__in=list(provider_ids))}

    def rumors(self) -> list[Entry]:
        return [_entry(row) for row in Provider.objects.filter(rumor_rounds__gt=0)]

    def remove(self, provider_ids: Sequence[str]) -> None:
        gone = Provider.objects.filter(provider_id__in=list(provider_ids), is_self=False)
        self.changed_models.update(Holding.objects.filter(provider__in=gone).values_list("model_id", flat=True)
                                   .distinct())
        gone.delete()

    def save(self, entries: Sequence[Entry]) -> None:
        """Write entries: a new record's fields and holdings when its seq is newer than the row's,
        otherwise only liveness and rumor bookkeeping. Never lowers a stored seq."""
        by_id = {e.provider_id: e for e in entries}
        rows = {row.provider_id: row for row in self._rows().filter(provider_id__in=list(by_id))}
        create, update, replaced = [], [], []
        for pid, entry in by_id.items():
            row = rows.get(pid)
            newer = isinstance(entry.record, SignedRecord) and (row is None or entry.seq > row.seq)
            if row is None:
                if not newer:
                    continue  # only a verified record creates a row
                create.append(Provider(provider_id=pid, is_self=pid == self.self_id,
                                       **_record_fields(entry.record), **_fields(entry)))
                replaced.append(entry)
                continue
            if entry.seq < row.seq:
                continue  # a concurrent merge stored a newer record meanwhile
            if not newer and entry.alive_ms > row.alive_ms:
                self.heartbeats[pid] = entry.alive_ms
            for name, value in {**(_record_fields(entry.record) if newer else {}), **_fields(entry)}.items():
                setattr(row, name, value)
            update.append(row)
            if newer:
                replaced.append(entry)
        if create:
            Provider.objects.bulk_create(create)
        if update:
            Provider.objects.bulk_update(update, [*_LIVENESS_FIELDS, *_RECORD_FIELDS])
        if replaced:
            self._replace_holdings(replaced)
            self.stored_records.update(e.provider_id for e in replaced)

    def _replace_holdings(self, entries: Sequence[Entry]) -> None:
        ids = dict(Provider.objects.filter(provider_id__in=[e.provider_id for e in entries])
                   .values_list("provider_id", "pk"))
        old = Holding.objects.filter(provider_id__in=ids.values())
        # Holdings of a replaced record are rewritten whole; any model named before or after changed.
        self.changed_models.update(old.values_list("model_id", flat=True).distinct())
        self.changed_models.update(h.model_id for e in entries for h in e.record.record.holdings)  # type: ignore[union-attr]
        old.delete()
        Holding.objects.bulk_create([
            Holding(provider_id=ids[e.provider_id], model_id=h.model_id, layer=h.layer, expert=h.expert,
                    residency=h.residency, committed_tps=h.committed_tps, capacity_tps=h.capacity_tps,
                    blob_uri=h.blob_uri)
            for e in entries for h in e.record.record.holdings  # type: ignore[union-attr]
        ], batch_size=2000)
