"""JSON-RPC/REST of receipts and disputes: `tenzro_moeListReceipts`, `tenzro_moeDisputeReceipt`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import DB_INT_MAX, Int, Out, Params, QueryParams
from apps.receipts import selectors, services


class ListReceiptsParams(QueryParams):
    model_id: str | None = Field(None, description="Only this model's receipts.")
    provider_id: str | None = Field(None, description="Only receipts signed by this holder.")
    limit: int = Field(50, ge=0, le=1000, description="How many of the most recent to list.")


class ReceiptRow(Out):
    id: int
    commitment_hash: str
    provider_id: str = Field(description="The holder that signed it.")
    model_id: str
    layer: int
    expert: int
    tokens: int
    created_at: datetime
    dispute: str | None = Field(description="pending | upheld | dismissed, or null if never disputed.")


class ListReceiptsOut(Out):
    total: int = Field(description="Receipts this router has kept in full.")
    receipts: list[ReceiptRow]


@rpc_method("tenzro_moeListReceipts", rest="/moe/receipts", http_method="GET", tag="moe",
            params=ListReceiptsParams, response=ListReceiptsOut,
            links={"dispute_first": {"operationId": "tenzro_moeDisputeReceipt",
                                     "requestBody": {"receipt_id": "$response.body#/receipts/0/id"}}})
def list_receipts(params: ListReceiptsParams) -> dict[str, Any]:
    """Sampled execution receipts this router has persisted (model, expert, holder, commitment hash)."""
    return {"total": selectors.receipts_count(),
            "receipts": selectors.receipts_list(model_id=params.model_id, provider_id=params.provider_id,
                                                limit=params.limit)}


class DisputeParams(Params):
    receipt_id: Int = Field(ge=1, le=DB_INT_MAX, description="The id of a receipt in tenzro_moeListReceipts.")


class DisputeOut(Out):
    receipt_id: int
    dispute_id: int
    state: str = Field(description="pending | upheld | dismissed")
    difference: float | None = Field(description="Measured, in units of a row's largest magnitude.")
    tolerance: float | None
    detail: str
    signature_valid: bool | None
    penalty: float | None = Field(description="Reputation taken from the signer when upheld.")
    error: str = Field(description="Why the last re-execution could not run (it is retried).")
    verifier_id: str = Field(description="The other holder whose signed verdict the dispute holds, or empty.")
    verdict: dict[str, Any] | None = Field(description=(
        "That holder's signed verdict (docs/protocol.md, \"Disputes by another holder\"), or null."))
    reexecuted_here: bool = Field(description="This node re-executed the batch itself (always before a penalty).")
    attempts: int
    opened_at: datetime
    decided_at: datetime | None


@rpc_method("tenzro_moeDisputeReceipt", rest="/moe/receipts/dispute", tag="moe", params=DisputeParams,
            response=DisputeOut, errors=(404,), operator_only=True)
def dispute_receipt(params: DisputeParams) -> dict[str, Any]:
    """Re-execute a stored receipt against a local copy of the expert (in the background); an upheld
    dispute penalizes the signer. Idempotent: the same receipt always answers the same dispute."""
    return selectors.dispute_view(services.dispute_open(receipt_id=params.receipt_id))
