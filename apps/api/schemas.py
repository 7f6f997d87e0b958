"""Schemas shared by every method's OpenAPI description."""

from __future__ import annotations

from typing import Any

from ninja import Schema
from pydantic import ConfigDict, Field


class ErrorOut(Schema):
    """Every error answer of the REST edge (the JSON-RPC edge carries the same in `error.data`)."""

    model_config = ConfigDict(extra="allow")

    detail: str = Field(description="What was wrong, for people.")
    reason: str = Field(description="Stable snake_case reason (docs/protocol.md lists them).")


class Unloaded(Schema):
    unloaded: bool


# Integer fields backed by database columns stay within a signed 32-bit column everywhere.
DB_INT_MAX = 2_147_483_647


def absent_or(*, description: str = "", **field: Any) -> Any:
    """An optional field that may be left out but is never null (its type refuses null).

    pydantic would document `"default": null`; dropped here so the OpenAPI schema does not
    suggest a value the server refuses.
    """
    extra = field.pop("json_schema_extra", None) or {}

    def schema_extra(schema: dict[str, Any]) -> None:
        schema.pop("default", None)
        schema.update(extra)

    return Field(None, description=description, json_schema_extra=schema_extra, **field)


def exactly_one_of(*names: str) -> dict[str, Any]:
    """json_schema_extra of a params object that needs exactly one of `names`."""
    return {"oneOf": [{"required": [name]} for name in names]}
