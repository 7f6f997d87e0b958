"""JSON-RPC/REST reads of settlement (`tenzro_moeSettlements`, `tenzro_moeLedger`), open to anyone."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import Out, QueryParams
from apps.settlement import selectors
from apps.settlement.models import Settlement
from apps.settlement.split import QUANTUM

_AMOUNT = "Decimal string with 12 decimal places."
Kind = Literal["holder", "router", "burn"]


def _text(value: Decimal) -> str:
    return format(value, "f")  # str() would write a zero with 12 places as '0E-12'


class SettlementsParams(QueryParams):
    limit: int = Field(50, ge=0, le=500, description="How many of the newest settlements.")
    forward_id: str | None = Field(None, min_length=1, max_length=200, description="Only this forward's.")


class EntryOut(Out):
    account: str = Field(description='A holder\'s or the router\'s provider id, or "burn".')
    kind: Kind
    amount: str = Field(description=_AMOUNT)
    tokens: int
    price: str = Field(description="The holder's price per input token (decimal string).")


class SettlementOut(Out):
    forward_id: str
    router_id: str
    model_id: str
    receipts_digest: str = Field(description="BLAKE3 (hex) of the raw commitment hashes, concatenated in order.")
    commitments: list[str]
    total: str = Field(description=_AMOUNT)
    created_at: datetime
    entries: list[EntryOut]


class SettlementsOut(Out):
    settlements: list[SettlementOut]


class LedgerParams(QueryParams):
    account: str | None = Field(None, min_length=1, max_length=64, description="Only this account.")


class BalanceOut(Out):
    account: str
    kind: Kind
    amount: str = Field(description=_AMOUNT)
    entries: int


class LedgerOut(Out):
    balances: list[BalanceOut] = Field(description="Sum of the entries per (account, kind).")
    totals: dict[str, str] = Field(description="{holder, router, burn}: sums over every account.")


def _settlement(s: Settlement) -> dict[str, Any]:
    return {"forward_id": s.forward_id, "router_id": s.router_id, "model_id": s.model_id,
            "receipts_digest": s.receipts_digest, "commitments": s.commitments, "total": _text(s.total),
            "created_at": s.created_at,
            "entries": [{"account": e.account, "kind": e.kind, "amount": _text(e.amount), "tokens": e.tokens,
                         "price": e.price} for e in s.entries.all()]}


@rpc_method("tenzro_moeSettlements", rest="/moe/settlements", http_method="GET", tag="moe",
            params=SettlementsParams, response=SettlementsOut)
def settlements(params: SettlementsParams) -> dict[str, Any]:
    """The settlements this node paid as router, newest first, with their ledger entries (holder, router, burn)."""
    return {"settlements": [_settlement(s) for s in
                            selectors.settlements_recent(params.limit, forward_id=params.forward_id)]}


@rpc_method("tenzro_moeLedger", rest="/moe/ledger", http_method="GET", tag="moe",
            params=LedgerParams, response=LedgerOut)
def ledger(params: LedgerParams) -> dict[str, Any]:
    """Balances of the settlement ledger: the sum per account and kind."""
    rows = selectors.ledger_balances(account=params.account)
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        totals[row["kind"]] += row["amount"]
    return {"balances": [{**r, "amount": _text(r["amount"])} for r in rows],
            "totals": {kind: _text(totals[kind].quantize(QUANTUM)) for kind in ("holder", "router", "burn")}}
