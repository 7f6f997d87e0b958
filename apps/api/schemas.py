"""Schemas shared by every method's OpenAPI description."""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import Ge, Le
from ninja import Schema
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _json_integer(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer; pydantic's strict mode would not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer param: 3 and 3.0 as JSON Schema has it, never true/false or "3" (strict mode).
Int = Annotated[int, BeforeValidator(_json_integer)]


def bounded_int(low: int, high: int) -> Any:
    """Int within [low, high] for list items (as a field, Field(ge=, le=) does the same). The
    bounds sit inside the validator so the JSON schema shows them as minimum/maximum."""
    return Annotated[int, Ge(low), Le(high), BeforeValidator(_json_integer)]


class Params(BaseModel):
    """Base of every JSON body's params: each value must have exactly the JSON type the schema
    gives it (no "5" for 5, no true for 1). A plain pydantic model, not a ninja Schema: ninja's
    reads any object's attributes (a list would pass as an object with every field absent)."""

    model_config = ConfigDict(strict=True)


class QueryParams(BaseModel):
    """Base of GET params: they arrive as query strings, which pydantic parses (lax mode)."""


class Out(Schema):
    """Base of every result schema. A non-finite float is a contract break (internal_error), never
    a silent `null`: the JSON encoder (orjson) would write NaN and ±inf as null."""

    model_config = ConfigDict(from_attributes=True, allow_inf_nan=False)


class ErrorOut(Out):
    """Every error answer of the REST edge (the JSON-RPC edge carries the same in `error.data`)."""

    model_config = ConfigDict(extra="allow")

    detail: str = Field(description="What was wrong, for people.")
    reason: str = Field(description="Stable snake_case reason (docs/protocol.md lists them).")


class Unloaded(Out):
    unloaded: bool


# Integer fields backed by database columns stay within a signed 32-bit column everywhere.
DB_INT_MAX = 2_147_483_647


def absent_or(*, description: str | None = None, **field: Any) -> Any:
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
