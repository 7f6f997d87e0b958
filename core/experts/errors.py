"""Errors raised by the expert-host runtime.

Each is an application error of core/errors.py (its ``reason`` is listed in REASONS there)
with a message naming what was wrong with the expected and received values.
"""

from __future__ import annotations

from core.errors import InvalidInput, NotFound, PayloadTooLarge, TenzroError
from core.formats import errors as format_errors


class ExpertRuntimeError(TenzroError):
    """Base of every runtime error; ``reason`` is stable, the message is for people."""

    reason = "expert_runtime_error"


class ExpertNotLoaded(ExpertRuntimeError, NotFound):
    """An operation named an expert this node does not hold (in either tier)."""

    reason = "expert_not_loaded"


class CorruptPayload(ExpertNotLoaded):
    """An expert's disk-tier payload no longer matches the hash recorded at load: it was
    forgotten (files removed) rather than decoded, so the node no longer holds it."""

    reason = "payload_corrupt"


class GateNotLoaded(ExpertRuntimeError, NotFound):
    """An operation needs the gate of a (model_id, layer) this node does not hold."""

    reason = "gate_not_loaded"


class ShapeMismatch(ExpertRuntimeError, InvalidInput):
    """Hidden states or tensors have the wrong rank, width or dtype."""

    reason = "shape_mismatch"


class NonFiniteInput(ExpertRuntimeError, InvalidInput):
    """Hidden states contain NaN or ±inf."""

    reason = "non_finite_input"


class InvalidPayload(ExpertRuntimeError, format_errors.InvalidPayload):
    """An expert or gate payload could not be parsed or is internally inconsistent (the runtime
    wraps the gate format's own InvalidPayload in this one, keeping its message)."""

    reason = "invalid_payload"


class ModelMismatch(ExpertRuntimeError, InvalidInput):
    """A gate and the experts of the same (model_id, layer) disagree (width, expert range)."""

    reason = "model_mismatch"


class InsufficientMemory(ExpertRuntimeError, PayloadTooLarge):
    """What was asked to be held does not fit in the memory budget."""

    reason = "over_budget"
