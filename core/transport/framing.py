"""Binary framing of requests and responses on one QUIC stream (sans-I/O).

One request per bidirectional stream: the client writes one request frame and ends its
side; the server writes one response frame and ends its side. A frame is a fixed
16-byte prefix, a UTF-8 JSON header, then raw body bytes (activations travel here as
raw little-endian f32 or Q8_0 blocks, never base64):

    0      2       3      4              8                      16
    +------+-------+------+--------------+-----------------------+----------------+------+
    | "TZ" | ver=1 | kind | header_len   | body_len              | header (JSON)  | body |
    |      |  u8   |  u8  | u32 big-end. | u64 big-endian        | header_len B   | ...  |
    +------+-------+------+--------------+-----------------------+----------------+------+

kind 1 = request  header {"method": str, "params": object}
kind 2 = response header {"ok": true, "result": object} | {"ok": false, "error": {"reason", "message"}}

docs/protocol.md is the normative description; keep the two in step.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

# The content type of frames carried over HTTP (POST /peer/moe/execute, docs/protocol.md).
FRAME_CONTENT_TYPE = "application/x-tenzro-frame"
MAGIC = b"TZ"
VERSION = 1
KIND_REQUEST = 1
KIND_RESPONSE = 2
PREFIX = struct.Struct(">2sBBIQ")
DEFAULT_MAX_HEADER = 1024 * 1024


class FramingError(ValueError):
    """The bytes on a stream are not a valid frame; `reason` is machine-readable."""

    def __init__(self, message: str, *, reason: str = "bad_frame", **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.details = details  # machine-readable fields for the error frame (limit_bytes, setting)


@dataclass(frozen=True)
class Frame:
    kind: int
    header: dict[str, Any]
    body: bytes | bytearray = field(default=b"", repr=False)


Body = bytes | bytearray | memoryview


def byte_view(body: Body) -> bytes | bytearray | memoryview:
    """`body` as something whose len() is its size in bytes (a typed memoryview, e.g. of a
    float32 array, counts elements), without copying it."""
    if isinstance(body, bytes | bytearray):
        return body
    view = memoryview(body)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def encode_frame_parts(kind: int, header: dict[str, Any], body: Body = b"") -> tuple[bytes, Body]:
    """The frame as (prefix + header, body), the body not copied.

    A transport writes the two parts one after the other: joining them would copy a
    multi-megabyte body once more only to put 16 bytes and a small header in front of it.
    """
    if kind not in (KIND_REQUEST, KIND_RESPONSE):
        raise ValueError(f"unknown frame kind {kind}")
    header_bytes = header_json(header)
    body = byte_view(body)
    return PREFIX.pack(MAGIC, VERSION, kind, len(header_bytes), len(body)) + header_bytes, body


def header_json(header: dict[str, Any]) -> bytes:
    """A header's compact JSON: orjson's (a decode step's frames are small, and json's Python costs more
    than they do), or json's wherever orjson would write something else or nothing: it writes NaN and
    infinities as null, so any null sends the header through json (which refuses them by name), as does
    whatever orjson cannot write (an integer past 64 bits). Either way the same JSON values."""
    try:
        raw = orjson.dumps(header, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson.JSONEncodeError is one
        raw = b"null"
    return raw if b"null" not in raw else json.dumps(header, separators=(",", ":"), allow_nan=False).encode()


def encode_frame(kind: int, header: dict[str, Any], body: Body = b"") -> bytes:
    """The whole frame in one buffer (one copy of the body; transports use encode_frame_parts)."""
    head, body = encode_frame_parts(kind, header, body)
    return b"".join((head, body))


def request_frame(method: str, params: dict[str, Any], body: Body = b"") -> bytes:
    return encode_frame(KIND_REQUEST, {"method": method, "params": params}, body)


def request_frame_parts(method: str, params: dict[str, Any], body: Body = b"") -> tuple[bytes, Body]:
    return encode_frame_parts(KIND_REQUEST, {"method": method, "params": params}, body)


@dataclass(frozen=True)
class Reply:
    """One response: the header of a kind-2 frame and its body (not yet encoded)."""

    header: dict[str, Any]
    body: bytes | bytearray | memoryview = field(default=b"", repr=False)

    @classmethod
    def ok(cls, result: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> Reply:
        return cls({"ok": True, "result": result}, body)

    @classmethod
    def error(cls, reason: str, message: str, details: dict[str, Any] | None = None) -> Reply:
        """An error reply; `details` are machine-readable fields beside the reason (e.g. `missing`)."""
        error: dict[str, Any] = {"reason": reason, "message": message}
        if details:
            error["details"] = details
        return cls({"ok": False, "error": error})

    def encode(self) -> bytes:
        return encode_frame(KIND_RESPONSE, self.header, self.body)

    def encode_parts(self) -> tuple[bytes, Body]:
        return encode_frame_parts(KIND_RESPONSE, self.header, self.body)


def response_frame(result: dict[str, Any], body: bytes | memoryview = b"") -> bytes:
    return Reply.ok(result, body).encode()


def error_frame(reason: str, message: str) -> bytes:
    return Reply.error(reason, message).encode()


class FrameDecoder:
    """Incremental decoder: feed stream bytes as they arrive, get whole frames back.

    The body is written into one preallocated buffer as it arrives (no re-concatenation,
    so a 100 MB body costs one copy). Limits are checked on the prefix, before any body
    byte is buffered, so an oversized frame is refused without allocating it.
    """

    def __init__(self, *, max_body: int, max_header: int = DEFAULT_MAX_HEADER, body_setting: str | None = None) -> None:
        """`body_setting` names the setting `max_body` comes from, so a refusal can say what to change."""
        self._max_body = max_body
        self._max_header = max_header
        self._body_setting = body_setting
        self._pending = bytearray()  # prefix + header bytes not yet parsed
        self._kind = 0
        self._header: dict[str, Any] | None = None
        self._header_len = -1
        self._body_len = 0
        self._body: bytearray | None = None
        self._body_filled = 0

    @property
    def idle(self) -> bool:
        """True between frames (nothing partial buffered)."""
        return not self._pending and self._header_len < 0 and self._body is None

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        view = memoryview(data)
        while view:
            if self._body is not None:
                take = min(len(view), len(self._body) - self._body_filled)
                self._body[self._body_filled : self._body_filled + take] = view[:take]
                self._body_filled += take
                view = view[take:]
            else:
                view = self._consume_prefix_and_header(view)
            if self._body is not None and self._body_filled == len(self._body):
                frames.append(self._complete())
        return frames

    def finish(self) -> None:
        """The stream ended: anything partial is a truncated frame."""
        if not self.idle:
            raise FramingError("stream ended in the middle of a frame", reason="truncated_frame")

    def _consume_prefix_and_header(self, view: memoryview) -> memoryview:
        if self._header_len < 0:
            need = PREFIX.size - len(self._pending)
            self._pending += view[:need]
            view = view[need:]
            if len(self._pending) < PREFIX.size:
                return view
            magic, version, kind, header_len, body_len = PREFIX.unpack(self._pending)
            self._pending.clear()
            if magic != MAGIC:
                raise FramingError(f"bad frame magic {bytes(magic)!r}, expected {MAGIC!r}", reason="bad_magic")
            if version != VERSION:
                raise FramingError(f"unsupported frame version {version}", reason="unsupported_version")
            if kind not in (KIND_REQUEST, KIND_RESPONSE):
                raise FramingError(f"unknown frame kind {kind}")
            if header_len > self._max_header:
                raise FramingError(f"frame header of {header_len} bytes exceeds {self._max_header} bytes "
                                   "(the protocol's header limit)", reason="payload_too_large",
                                   limit_bytes=self._max_header)
            if body_len > self._max_body:
                setting = {"setting": self._body_setting} if self._body_setting else {}
                named = f" ({self._body_setting})" if self._body_setting else ""
                raise FramingError(f"frame body of {body_len} bytes exceeds {self._max_body} bytes{named}",
                                   reason="payload_too_large", limit_bytes=self._max_body, **setting)
            self._kind, self._header_len, self._body_len = kind, header_len, body_len
        need = self._header_len - len(self._pending)
        self._pending += view[:need]
        view = view[need:]
        if len(self._pending) < self._header_len:
            return view
        try:  # strict JSON: no NaN or infinity (nothing here writes them), UTF-8, at most 1,024 levels deep
            header = orjson.loads(self._pending)
        except orjson.JSONDecodeError as exc:
            raise FramingError(f"frame header is not JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(header, dict):
            raise FramingError("frame header must be a JSON object")
        self._pending.clear()
        self._header = header
        self._body = bytearray(self._body_len)
        self._body_filled = 0
        return view

    def _complete(self) -> Frame:
        assert self._header is not None and self._body is not None
        # The body buffer is handed over, not copied: the decoder starts a fresh one.
        frame = Frame(kind=self._kind, header=self._header, body=self._body)
        self._header, self._body, self._header_len, self._body_filled = None, None, -1, 0
        return frame


def decode_frame(data: bytes | bytearray, *, kind: int, max_body: int, body_setting: str | None = None) -> Frame:
    """Exactly one whole frame of `kind` (a body that HTTP carried whole); FramingError otherwise."""
    decoder = FrameDecoder(max_body=max_body, body_setting=body_setting)
    frames = decoder.feed(data)
    decoder.finish()
    if len(frames) != 1 or frames[0].kind != kind:
        what = "request" if kind == KIND_REQUEST else "response"
        raise FramingError(f"the body must be exactly one {what} frame, got {len(frames)} frames")
    return frames[0]
