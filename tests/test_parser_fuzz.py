"""Fuzzing of the parsers that read bytes from peers and files, with hypothesis, time-boxed.

Targets: expert and gate payloads (safetensors header, dtypes, shapes, metadata, GGML block rows),
the QUIC frame decoder, provider records and heartbeats, holders' receipts, a kept batch handed to
`receipt/verify` (apps/receipts/evidence.py), and a checkpoint
folder (safetensors shard headers, the index, config.json). Inputs are random bytes and valid
inputs mutated (bit flips, truncation, length fields rewritten, bytes spliced in, the JSON
header replaced). Each parser must return an object or raise the project's error for it —
never another exception — and must not allocate memory a lying length field asks for.

The whole module gets TENZRO_FUZZ_SECONDS (default 60) of fuzzing, split evenly between the
targets; each target runs hypothesis in rounds until its share is spent and prints how many
inputs it ran.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.sources import CheckpointError
from apps.providers.records import RecordError, verify_heartbeat, verify_record
from apps.receipts.commitment import Expected, ReceiptError, receipt_body, sign_receipt, sketch_bytes, verify_receipt
from apps.receipts.evidence import carrier_bytes, kept_batch
from core.errors import TenzroError
from core.experts.ffn import parse_payload, read_header
from core.formats.gate_payload import read_gate_payload
from core.transport.framing import FrameDecoder, FramingError, request_frame, response_frame
from testkit.checkpoints import qwen3_moe
from testkit.records import heartbeat, new_key, signed_record
from tests.experts.factories import expert_payload, expert_weights, qwen_gate

TARGETS = ("expert_payload", "gate_payload", "frame", "record", "receipt", "kept_batch", "checkpoint")
BUDGET_S = float(os.environ.get("TENZRO_FUZZ_SECONDS", "60")) / len(TARGETS)
# What one input may make a parser allocate at its peak, past a few times its own size: a
# lying length field must be refused before anything of the size it claims is allocated.
ALLOC_SLACK = 32 * 1024 * 1024
ROUND = settings(max_examples=20, deadline=None, database=None, phases=[Phase.generate], derandomize=False,
                 suppress_health_check=list(HealthCheck))


HOSTILE_JSON = [b"[" * 100_000, b'{"a":' * 5000, b"NaN", b'"\\ud800"', b"{}", b"[]", b"\xff\xfe", b"1e999",
                b'{"__metadata__":[]}', b'{"__metadata__":{"model_id":{}}}',
                b'{"x":{"dtype":"F32","shape":[1e30],"data_offsets":[0,4]}}',
                b'{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}',
                b'{"x":{"dtype":"U8","shape":[-1,4],"data_offsets":[4,0]}}']


def mutated(valid: list[bytes], *, length_fields: tuple[tuple[int, str], ...],
            header: tuple[int, int, str] | None = None) -> st.SearchStrategy[bytes]:
    """Random bytes, or one of `valid` with a few mutations; `length_fields` are (offset, struct
    format) of the format's length fields, rewritten with boundary and random values; `header`
    (where the JSON header starts, its length field's offset and format) lets a hostile JSON
    header replace the real one with a length field that tells the truth (None: the whole input
    is JSON)."""

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(valid)))
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(("flip", "truncate", "length", "splice", "byte", "json")))
            if kind == "flip" and data:
                i = draw(st.integers(0, len(data) - 1))
                data[i] ^= 1 << draw(st.integers(0, 7))
            elif kind == "truncate" and data:
                del data[draw(st.integers(0, len(data) - 1)):]
            elif kind == "length" and length_fields:
                offset, fmt = draw(st.sampled_from(length_fields))
                size = struct.calcsize(fmt)
                top = (1 << (8 * size)) - 1
                value = draw(st.one_of(st.sampled_from([0, 1, 7, 8, len(data), len(data) + 1, top, top // 2]),
                                       st.integers(0, top)))
                if len(data) >= offset + size:
                    struct.pack_into(fmt, data, offset, value)
            elif kind == "splice":
                i = draw(st.integers(0, len(data)))
                data[i:i] = draw(st.binary(max_size=64))
            elif kind == "byte" and data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.sampled_from(b'{}[]",:0-9\x00\xff e'))
            elif kind == "json":  # a hostile JSON header in place of the real one
                text = draw(st.sampled_from(HOSTILE_JSON))
                if header is None:
                    data = bytearray(text)
                else:
                    start, at, fmt = header
                    if len(data) >= start:
                        struct.pack_into(fmt, data, at, len(text))
                        data[start:] = text

        return bytes(data)

    return st.one_of(st.binary(max_size=512), mutate())


def fuzz(name: str, inputs: st.SearchStrategy, check: Callable[[object], None]) -> None:
    """Run `check` on inputs drawn from `inputs` until this target's share of the budget is spent."""
    ran = 0
    peak_over = 0

    @ROUND
    @given(inputs)
    def one(value: object) -> None:
        nonlocal ran, peak_over
        ran += 1
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        check(value)
        _, peak = tracemalloc.get_traced_memory()
        size = len(value) if isinstance(value, bytes | bytearray) else len(json.dumps(value, default=repr))
        assert peak - base < ALLOC_SLACK + 8 * size, f"{name}: {peak - base} bytes allocated for a {size}-byte input"
        peak_over = max(peak_over, peak - base)

    # A first round outside tracemalloc: the first time a text strategy draws, hypothesis builds its
    # tables of the characters a codec can encode (cached under .hypothesis/ afterwards), and built
    # under tracemalloc in a fresh clone that round took 40-75 s instead of seconds.
    one()
    tracemalloc.start()
    try:
        deadline = time.monotonic() + BUDGET_S
        rounds = 0
        while time.monotonic() < deadline or rounds == 0:
            one()
            rounds += 1
    finally:
        tracemalloc.stop()
    print(f"\nfuzz {name}: {ran} inputs in {BUDGET_S:.1f} s ({rounds} rounds), peak allocation "
          f"{peak_over / 1e6:.2f} MB")


def _raises_only(errors: tuple[type[BaseException], ...], call: Callable[[], object]) -> None:
    """Run `call`; the parser's own errors are fine, any other exception fails the input."""
    with contextlib.suppress(errors):
        call()


SAFETENSORS_LENGTH = ((0, "<Q"),)
SAFETENSORS_HEADER = (8, 0, "<Q")


def test_expert_payloads() -> None:
    rng = np.random.default_rng(0)
    w = expert_weights(rng, 32, 16)
    valid = [expert_payload(w, expert=1), expert_payload(w, expert=2, quant="q8_0"),
             expert_payload(expert_weights(rng, 256, 32), expert=3, quant="q4_k_m")]

    def check(data: bytes) -> None:
        _raises_only((TenzroError,), lambda: read_header(parse_payload(data)))

    fuzz("expert_payload", mutated(valid, length_fields=SAFETENSORS_LENGTH, header=SAFETENSORS_HEADER), check)


def test_gate_payloads() -> None:
    rng = np.random.default_rng(1)
    valid = [qwen_gate(rng, d_model=32, n_routed=4, top_k=2, norm=True)[0]]
    fuzz("gate_payload", mutated(valid, length_fields=SAFETENSORS_LENGTH, header=SAFETENSORS_HEADER),
         lambda data: _raises_only((TenzroError,), lambda: read_gate_payload(data)))


def test_frames() -> None:
    valid = [request_frame("moe/execute", {"model_id": "m", "layer": 0, "d_model": 4}, b"\x00" * 64),
             response_frame({"tokens": 1}, b"\x01" * 16), request_frame("moe/status", {})]

    @st.composite
    def chunked(draw: st.DrawFn) -> tuple[bytes, list[int]]:
        data = draw(mutated(valid, length_fields=((4, ">I"), (8, ">Q")), header=(16, 4, ">I")))
        cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
        return data, cuts

    def check(case: tuple[bytes, list[int]]) -> None:
        data, cuts = case
        decoder = FrameDecoder(max_body=1 << 20)
        bounds = [0, *cuts, len(data)]

        def run() -> None:
            for start, end in itertools.pairwise(bounds):
                decoder.feed(data[start:end])
            decoder.finish()

        _raises_only((FramingError,), run)

    fuzz("frame", chunked(), check)


def test_records_and_heartbeats() -> None:
    key = new_key(5)
    record = signed_record(key, seq=3, at_ms=1_000_000).envelope()
    beat = heartbeat(key, seq=3, at_ms=1_000_000).to_json()
    json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                               | st.floats(allow_nan=False), lambda inner: st.lists(inner, max_size=4)
                               | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)

    @st.composite
    def envelopes(draw: st.DrawFn) -> object:
        base = dict(draw(st.sampled_from([record, beat])))
        field = draw(st.sampled_from(sorted(base)))
        how = draw(st.sampled_from(("value", "text", "drop", "random")))
        if how == "value":
            base[field] = draw(json_values)
        elif how == "text" and isinstance(base[field], str):
            text = base[field].encode()
            base[field] = draw(mutated([text], length_fields=())).decode("utf-8", "replace")
        elif how == "drop":
            del base[field]
        else:
            return draw(json_values)
        return base

    def check(value: object) -> None:
        _raises_only((RecordError,), lambda: verify_record(value, max_bytes=64 * 1024))
        _raises_only((RecordError,), lambda: verify_heartbeat(value))

    fuzz("record", envelopes(), check)


def test_receipts() -> None:
    key = new_key(6)
    pid = key.verify_key.encode().hex()
    rows = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    body = receipt_body(provider_id=pid, model_id="m", layer=0, expert=1, token_indices=[0, 1, 2], d_model=8,
                        input_encoding="f32", input_carrier=b"in", output_encoding="f32", k=4,
                        sketch=sketch_bytes(rows, 4))
    signed = sign_receipt(body, key)
    wire = {**signed.body, "commitment_hash": signed.commitment_hash, "signature": signed.signature}
    expect = Expected(pid, "m", 0, 1, [0, 1, 2], 8, "f32", body["input_hash"], "f32", 4)
    verify_receipt(wire, expect, rows)  # the unmutated receipt verifies
    json_values = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=130) \
        | st.lists(st.integers(), max_size=5) | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)

    @st.composite
    def receipts(draw: st.DrawFn) -> object:
        changed = dict(wire)
        for _ in range(draw(st.integers(1, 3))):
            changed[draw(st.sampled_from(sorted(wire)))] = draw(json_values)
        return draw(st.sampled_from([changed, changed, list(changed), None, "receipt"]))

    fuzz("receipt", receipts(), lambda value: _raises_only((ReceiptError,), lambda: verify_receipt(value, expect,
                                                                                                      rows)))


def test_kept_batches() -> None:
    """What `receipt/verify` reads from any peer: the receipt's fields, the batch index, and the body split
    into carrier and sketch by the receipt's own numbers."""
    key = new_key(7)
    rows = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    carrier = rows.tobytes()
    sketch = sketch_bytes(rows, 4)
    body = receipt_body(provider_id=key.verify_key.encode().hex(), model_id="m", layer=0, expert=1,
                        token_indices=[0, 1, 2], d_model=8, input_encoding="f32", input_carrier=carrier,
                        output_encoding="f32", k=4, sketch=sketch)
    signed = sign_receipt(body, key)
    wire = {**signed.body, "commitment_hash": signed.commitment_hash, "signature": signed.signature}
    assert kept_batch(wire, None, carrier, sketch).expert == 1  # the unmutated batch binds
    json_values = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70) \
        | st.lists(st.integers(-2, 2**40), max_size=5) | st.lists(st.dictionaries(st.text(max_size=6), st.integers()))

    @st.composite
    def batches(draw: st.DrawFn) -> object:
        changed = dict(wire)
        for _ in range(draw(st.integers(0, 3))):
            changed[draw(st.sampled_from(sorted(wire)))] = draw(json_values)
        data = draw(st.sampled_from([carrier + sketch, b""]) | st.binary(max_size=256))
        if draw(st.booleans()) and data:
            flip = draw(st.integers(0, len(data) - 1))
            data = data[:flip] + bytes([data[flip] ^ 0x40]) + data[flip + 1:]
        return changed, draw(st.none() | st.integers(-1, 3) | json_values), data

    def check(value: object) -> None:
        receipt, batch, data = value

        def split() -> object:
            at = carrier_bytes(receipt)
            return kept_batch(receipt, batch, data[:at], data[at:])
        _raises_only((ReceiptError,), split)

    fuzz("kept_batch", batches(), check)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return qwen3_moe(tmp_path_factory.mktemp("ckpt") / "model", d_model=16, d_ff=8, n_experts=2, n_layers=1,
                     shards=2).root


def test_checkpoints(checkpoint: Path, tmp_path: Path) -> None:
    files = sorted(p.name for p in checkpoint.iterdir())
    originals = {name: (checkpoint / name).read_bytes() for name in files}
    names = list(json.loads(originals["model.safetensors.index.json"])["weight_map"])
    work = tmp_path / "model"
    shutil.copytree(checkpoint, work)

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[str, bytes]:
        name = draw(st.sampled_from(files))
        if name.endswith(".safetensors"):
            return name, draw(mutated([originals[name]], length_fields=SAFETENSORS_LENGTH, header=SAFETENSORS_HEADER))
        return name, draw(mutated([originals[name]], length_fields=()))

    def check(case: tuple[str, bytes]) -> None:
        name, data = case
        (work / name).write_bytes(data)

        def read_all() -> None:
            reader = CheckpointReader.open(work)
            try:
                for tensor in names:
                    if reader.has_tensor(tensor):
                        reader.tensor_info(tensor)
                        reader.read_tensor(tensor)
            finally:
                reader.close()

        try:
            _raises_only((CheckpointError,), read_all)
        finally:
            (work / name).write_bytes(originals[name])

    fuzz("checkpoint", cases(), check)
