"""Writes of settlement: record one forward's pay exactly once, and queue that after a commit.

``settlement_record`` is the whole rule (docs/specification.md, "Settlement and reputation"): each remote
holder is paid at its own advertised per-input-token price, the active policy's split is
applied, and the holder's reputation is credited with its net amount: the only path that
raises a score. The forward_id is the idempotency key: a settlement that exists is returned
unchanged, and the unique constraint stops two concurrent retries that both found none.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from blake3 import blake3
from celery import current_app
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.governance.selectors import policy_active
from apps.reputation.services import reputation_credit
from apps.settlement.models import BURN_ACCOUNT, EntryKind, LedgerEntry, PendingSettlement, Settlement
from apps.settlement.split import split_amounts
from core.errors import InvalidInput

logger = logging.getLogger(__name__)
SETTLE_TASK = "tenzro.settlement.settle_forward"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_HOLDER_KEYS = {"provider_id", "tokens", "price_per_input_token", "commitments"}


@dataclass(frozen=True)
class HolderWork:
    provider_id: str
    tokens: int
    price: Decimal
    price_text: str
    commitments: tuple[str, ...]  # lowercase hex


def settlement_record(*, forward_id: str, router_id: str, model_id: str, holders: list[dict[str, Any]]) -> Settlement:
    """Settle one forward: its Settlement, ledger entries and reputation credits, in one transaction.

    ``holders``: ``[{"provider_id", "tokens", "price_per_input_token" (decimal string),
    "commitments": [64 hex chars, …]}]``. A holder whose provider_id is ``router_id`` is this
    node's own work and is not paid (its commitments still enter the digest). Raises
    InvalidInput naming the field for bad input; returns the existing Settlement unchanged
    when ``forward_id`` was settled before.
    """
    work = _parse(forward_id=forward_id, router_id=router_id, model_id=model_id, holders=holders)
    existing = _settled(forward_id)
    if existing is not None:
        PendingSettlement.objects.filter(forward_id=forward_id).delete()
        return existing
    try:
        with transaction.atomic():
            PendingSettlement.objects.filter(forward_id=forward_id).delete()  # settled: out of the outbox
            return _create(forward_id=forward_id, router_id=router_id, model_id=model_id, work=work)
    except IntegrityError:
        # A concurrent retry settled this forward between our look and our insert: its rows stand, ours
        # were rolled back with the savepoint, so the forward is paid once.
        existing = _settled(forward_id)
        if existing is None:
            raise  # some other constraint: a bug, not a race
        return existing


def settlement_enqueue(*, forward_id: str, router_id: str, model_id: str, holders: list[dict[str, Any]]) -> None:
    """Queue settle_forward for after the caller's transaction commits (input checked now, not in the worker)."""
    _parse(forward_id=forward_id, router_id=router_id, model_id=model_id, holders=holders)
    payload = {"forward_id": forward_id, "router_id": router_id, "model_id": model_id, "holders": holders}
    # The outbox row commits with the caller's transaction: whatever becomes of the broker's
    # message, settlements_resume finds it at the Celery worker's next start.
    PendingSettlement.objects.update_or_create(forward_id=forward_id, defaults={"payload": payload})
    # By the task's registered name: tasks.py imports this module, so importing it back would make a cycle.
    transaction.on_commit(lambda: current_app.send_task(SETTLE_TASK, args=[payload]))


def settlements_resume(*, older_than_s: float = 0.0) -> list[str]:
    """Queue settle_forward again for every settlement still pending (queued at least `older_than_s`
    ago); called when this node's Celery worker starts, and by the periodic sweep (a message the
    broker lost while the worker ran). A copy the broker still holds may run too: settlement_record
    pays a forward_id once, whichever runs first."""
    queued = PendingSettlement.objects.order_by("created_at")
    if older_than_s > 0:
        queued = queued.filter(created_at__lte=timezone.now() - timedelta(seconds=older_than_s))
    pending = list(queued.values_list("forward_id", "payload"))
    for _, payload in pending:
        current_app.send_task(SETTLE_TASK, args=[payload])
    if pending:
        logger.info("requeued %d pending settlements", len(pending))
    return [forward_id for forward_id, _ in pending]


def receipts_digest(commitments: list[str] | tuple[str, ...]) -> str:
    """BLAKE3 (hex) of the raw 32-byte commitment hashes concatenated in the order given."""
    return blake3(b"".join(bytes.fromhex(c) for c in commitments)).hexdigest()


def _settled(forward_id: str) -> Settlement | None:
    return Settlement.objects.filter(forward_id=forward_id).first()


def _create(*, forward_id: str, router_id: str, model_id: str, work: list[HolderWork]) -> Settlement:
    policy = policy_active()
    # Through str: the float 0.9 is 0.90000000000000002220…, the policy means 0.9.
    holder_share = Decimal(str(policy.settlement_holder_share))
    router_share = Decimal(str(policy.settlement_router_share))
    commitments = [c for w in work for c in w.commitments]
    entries: list[LedgerEntry] = []
    net: dict[str, Decimal] = defaultdict(Decimal)
    total = Decimal(0)
    for w in work:
        if w.provider_id == router_id:
            continue  # a node's own work is not paid
        try:
            gross, holder, router, burn = split_amounts(w.price, w.tokens, holder_share, router_share)
        except ValueError as exc:
            raise InvalidInput(f"holder {w.provider_id}: {exc}", reason="invalid_input") from exc
        total += gross
        net[w.provider_id] += holder
        common = {"tokens": w.tokens, "price": w.price_text}
        entries += [LedgerEntry(account=w.provider_id, kind=EntryKind.HOLDER, amount=holder, **common),
                    LedgerEntry(account=router_id, kind=EntryKind.ROUTER, amount=router, **common),
                    LedgerEntry(account=BURN_ACCOUNT, kind=EntryKind.BURN, amount=burn, **common)]
    settlement = Settlement.objects.create(forward_id=forward_id, router_id=router_id, model_id=model_id,
                                           receipts_digest=receipts_digest(commitments), commitments=commitments,
                                           total=total)
    for entry in entries:
        entry.settlement = settlement
    LedgerEntry.objects.bulk_create(entries)
    for provider_id, amount in net.items():  # one credit per provider, even when it served several batches
        if amount > 0:
            reputation_credit(provider_id=provider_id, amount=amount, reason="settlement", ref=forward_id)
    return settlement


def _parse(*, forward_id: Any, router_id: Any, model_id: Any, holders: Any) -> list[HolderWork]:
    for name, value, most in (("forward_id", forward_id, 200), ("router_id", router_id, 64),
                              ("model_id", model_id, 200)):
        if not isinstance(value, str) or not 0 < len(value) <= most:
            raise InvalidInput(f"{name} must be a non-empty string of at most {most} characters, got {value!r}",
                               reason="invalid_input")
    if not isinstance(holders, list):
        raise InvalidInput(f"holders must be a list, got {type(holders).__name__}", reason="invalid_input")
    return [_parse_holder(i, h) for i, h in enumerate(holders)]


def _parse_holder(i: int, holder: Any) -> HolderWork:
    where = f"holders[{i}]"

    def bad(field: str, why: str) -> InvalidInput:
        return InvalidInput(f"{where}.{field} {why}", reason="invalid_input", field=f"{where}.{field}")

    if not isinstance(holder, dict):
        raise InvalidInput(f"{where} must be an object, got {type(holder).__name__}", reason="invalid_input")
    if set(holder) != _HOLDER_KEYS:
        raise InvalidInput(f"{where} must have exactly the keys {sorted(_HOLDER_KEYS)}, got {sorted(holder)}",
                           reason="invalid_input")
    pid, tokens, price_text, commitments = (holder[k] for k in
                                            ("provider_id", "tokens", "price_per_input_token", "commitments"))
    if not isinstance(pid, str) or not 0 < len(pid) <= 64:
        raise bad("provider_id", f"must be a non-empty string of at most 64 characters, got {pid!r}")
    if type(tokens) is not int or tokens < 0:
        raise bad("tokens", f"must be an integer >= 0, got {tokens!r}")
    try:
        price = Decimal(price_text) if isinstance(price_text, str) and len(price_text) <= 40 else None
    except InvalidOperation:
        price = None
    if price is None or not price.is_finite() or price < 0:
        raise bad("price_per_input_token", f"must be a decimal string >= 0 such as \"0.000002\", got {price_text!r}")
    if not isinstance(commitments, list):
        raise bad("commitments", f"must be a list of 64-hex-digit hashes, got {type(commitments).__name__}")
    for n, c in enumerate(commitments):
        if not isinstance(c, str) or not _HEX64.fullmatch(c):
            raise bad(f"commitments[{n}]", f"must be 64 hex digits (a 32-byte hash), got {c!r}")
    return HolderWork(pid, tokens, price, price_text, tuple(c.lower() for c in commitments))
