"""The error a format raises when bytes are not what they claim to be.

An application error of core/errors.py (reason `invalid_payload`), so a consumer may let it
travel to the caller as it is, or wrap it in an error of its own that names the part (the
expert runtime's InvalidPayload subclasses this one). The expert payload's encoder and reader
raise PayloadError (a ValueError) instead, which its callers map to their own reasons.
"""

from __future__ import annotations

from core.errors import InvalidInput


class InvalidPayload(InvalidInput):
    """A gate payload could not be parsed or is internally inconsistent; the message names the field."""

    reason = "invalid_payload"
