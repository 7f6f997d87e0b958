"""Errors raised by the expert-host runtime.

Each class carries a machine-readable ``reason`` (the JSON-RPC ``data.reason`` the api layer
reports) and a message naming what was wrong with the expected and received values.
"""

from __future__ import annotations


class ExpertRuntimeError(Exception):
    """Base of every runtime error; ``reason`` is stable, the message is for people."""

    reason: str = "expert_runtime_error"


class ExpertNotLoaded(ExpertRuntimeError):
    """An operation named an expert this node does not hold (in either tier)."""

    reason = "expert_not_loaded"


class GateNotLoaded(ExpertRuntimeError):
    """An operation needs the gate of a (model_id, layer) this node does not hold."""

    reason = "gate_not_loaded"


class ShapeMismatch(ExpertRuntimeError):
    """Hidden states or tensors have the wrong rank, width or dtype."""

    reason = "shape_mismatch"


class NonFiniteInput(ExpertRuntimeError):
    """Hidden states contain NaN or ±inf."""

    reason = "non_finite_input"


class InvalidPayload(ExpertRuntimeError):
    """An expert or gate payload could not be parsed or is internally inconsistent."""

    reason = "invalid_payload"


class ModelMismatch(ExpertRuntimeError):
    """A gate and the experts of the same (model_id, layer) disagree (width, expert range)."""

    reason = "model_mismatch"
