"""The QUIC stream framing, sans-I/O: no sockets, no Django."""

import json
import random
import struct

import numpy as np
import pytest

from core.transport.framing import (
    KIND_REQUEST,
    KIND_RESPONSE,
    MAGIC,
    PREFIX,
    VERSION,
    FrameDecoder,
    FramingError,
    Reply,
    encode_frame,
    encode_frame_parts,
    error_frame,
    request_frame,
    response_frame,
)


def test_request_round_trip_fed_byte_by_byte() -> None:
    body = bytes(range(256)) * 40
    data = request_frame("moe/execute", {"model_id": "m", "layer": 3}, body)
    decoder = FrameDecoder(max_body=1 << 20)
    frames = []
    for i in range(len(data)):
        frames.extend(decoder.feed(data[i : i + 1]))
    decoder.finish()
    assert len(frames) == 1
    assert frames[0].kind == KIND_REQUEST
    assert frames[0].header == {"method": "moe/execute", "params": {"model_id": "m", "layer": 3}}
    assert bytes(frames[0].body) == body


def test_several_frames_in_random_chunks() -> None:
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.randrange(0, 5000)) for _ in range(20)]
    data = b"".join(response_frame({"i": i}, body) for i, body in enumerate(payloads))
    decoder = FrameDecoder(max_body=1 << 20)
    frames, offset = [], 0
    while offset < len(data):
        step = rng.randrange(1, 3000)
        frames.extend(decoder.feed(data[offset : offset + step]))
        offset += step
    decoder.finish()
    assert [f.header["result"]["i"] for f in frames] == list(range(20))
    assert [bytes(f.body) for f in frames] == payloads


def test_empty_body_frame() -> None:
    decoder = FrameDecoder(max_body=10)
    [frame] = decoder.feed(error_frame("expert_not_loaded", "no such expert"))
    assert frame.kind == KIND_RESPONSE
    assert frame.header == {"ok": False, "error": {"reason": "expert_not_loaded", "message": "no such expert"}}
    assert frame.body == b""
    assert decoder.idle


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: b"XX" + d[2:], "bad_magic"),
        (lambda d: d[:2] + b"\x09" + d[3:], "unsupported_version"),
        (lambda d: d[:3] + b"\x07" + d[4:], "bad_frame"),
    ],
)
def test_corrupt_prefix_is_refused(mutate, reason) -> None:
    data = mutate(request_frame("moe/status", {}))
    with pytest.raises(FramingError) as info:
        FrameDecoder(max_body=100).feed(data)
    assert info.value.reason == reason


def test_oversized_body_is_refused_before_buffering() -> None:
    prefix = PREFIX.pack(b"TZ", 1, KIND_REQUEST, 2, 10**12)
    with pytest.raises(FramingError) as info:
        FrameDecoder(max_body=1 << 20).feed(prefix)
    assert info.value.reason == "payload_too_large"
    assert "1000000000000" in str(info.value)


def test_truncated_frame_is_reported_at_end_of_stream() -> None:
    data = request_frame("moe/status", {}, b"x" * 100)
    decoder = FrameDecoder(max_body=1000)
    assert decoder.feed(data[:-1]) == []
    with pytest.raises(FramingError) as info:
        decoder.finish()
    assert info.value.reason == "truncated_frame"


def test_header_that_is_not_a_json_object() -> None:
    header = json.dumps([1, 2]).encode()
    data = struct.pack(">2sBBIQ", b"TZ", 1, KIND_REQUEST, len(header), 0) + header
    with pytest.raises(FramingError, match="JSON object"):
        FrameDecoder(max_body=10).feed(data)


def test_encoder_refuses_nan_in_header() -> None:
    with pytest.raises(ValueError):
        encode_frame(KIND_RESPONSE, {"ok": True, "result": {"x": float("nan")}})


def test_parts_are_the_frame_and_keep_the_body_uncopied() -> None:
    rows = np.arange(3 * 5, dtype="<f4").reshape(3, 5)
    view = memoryview(rows)  # a typed view: len() counts rows, not bytes
    head, body = encode_frame_parts(KIND_RESPONSE, {"ok": True, "result": {}}, view)
    assert len(body) == rows.nbytes
    assert np.shares_memory(np.frombuffer(body, dtype="<f4"), rows)
    assert head + bytes(body) == encode_frame(KIND_RESPONSE, {"ok": True, "result": {}}, rows.tobytes())
    decoder = FrameDecoder(max_body=1 << 20)
    frames = decoder.feed(head) + decoder.feed(bytes(body))
    assert np.array_equal(np.frombuffer(frames[0].body, dtype="<f4").reshape(3, 5), rows)
    reply_head, reply_body = Reply.ok({}, rows.tobytes()).encode_parts()
    assert reply_head + reply_body == Reply.ok({}, rows.tobytes()).encode()


@pytest.mark.parametrize("header", [
    {"ok": True, "result": {"tokens": 1, "batches": [{"expert": 3, "rows": [0]}], "x": 0.1, "s": "é\u2028"}},
    {"ok": True, "result": {"none": None, "big": 1 << 70, "neg": -(1 << 63)}},  # json: a null, an int past 64 bits
    {"ok": False, "error": {"reason": "r", "message": "m", "details": {1: "int key", "t": (1, 2)}}},
    {"method": "m", "params": {"f": 1e300, "tiny": 5e-324, "b": [True, False]}},
])
def test_a_header_is_the_json_values_it_was(header) -> None:
    frame = FrameDecoder(max_body=1 << 20).feed(encode_frame(KIND_RESPONSE, header))[0]
    assert frame.header == json.loads(json.dumps(header))


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_encoder_refuses_infinities_in_header(value) -> None:
    with pytest.raises(ValueError):
        encode_frame(KIND_RESPONSE, {"ok": True, "result": {"x": [1, value]}})


@pytest.mark.parametrize("raw", [b'{"x": NaN}', b'{"x": Infinity}', b'{"x": "\\ud800"}', b'{"x": "\xff"}',
                                 b"[" * 1100 + b"]" * 1100, b'{"x": 1'])
def test_a_header_that_is_not_strict_json_is_refused(raw) -> None:
    frame = PREFIX.pack(MAGIC, VERSION, KIND_REQUEST, len(raw), 0) + raw
    with pytest.raises(FramingError, match="frame header is not JSON") as refused:
        FrameDecoder(max_body=1 << 20).feed(frame)
    assert refused.value.reason == "bad_frame"
