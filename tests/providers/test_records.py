"""Signed provider records (pure): canonical bytes, verification, and every refusal reason."""

import json

import pytest

from apps.providers.records import RECORD_DOMAIN, RecordError, canonical_json, verify_heartbeat, verify_record
from testkit.records import heartbeat, new_key, signed_record

MAX = 1 << 20


def test_a_record_round_trips_and_its_text_is_canonical() -> None:
    key = new_key(1)
    signed = signed_record(key, n_holdings=20)
    back = verify_record(json.loads(json.dumps(signed.envelope())), max_bytes=MAX)
    assert back.record == signed.record and back.text == signed.text
    fields = json.loads(signed.text)
    assert signed.text == canonical_json(fields)  # sorted keys, no spaces: one text per content
    assert [(h["model_id"], h["layer"], h["expert"]) for h in fields["moe_holdings"]] == sorted(
        (h.model_id, h.layer, h.expert) for h in signed.record.holdings)
    with pytest.raises(ValueError, match="float"):
        canonical_json({"price": 0.5})


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda env: {**env, "record": env["record"].replace('"seq":1', '"seq":2')}, "forged"),
    (lambda env: {**env, "signature": "00" * 64}, "forged"),
    (lambda env: {**env, "signature": "xyz"}, "malformed"),
    (lambda env: {"record": 5}, "malformed"),
    (lambda env: {**env, "record": env["record"] + " " * MAX}, "oversized"),
])
def test_tampered_records_are_refused_with_their_reason(mutate, reason) -> None:
    envelope = signed_record(new_key(2)).envelope()
    with pytest.raises(RecordError) as info:
        verify_record(mutate(envelope), max_bytes=MAX)
    assert info.value.reason == reason


def test_a_record_signed_by_another_key_is_forged() -> None:
    mine, other = new_key(3), new_key(4)
    signed = signed_record(mine)
    stolen = signed_record(other)  # valid signature, but by a key that is not the claimed provider
    envelope = {"record": signed.text, "signature": stolen.signature}
    with pytest.raises(RecordError) as info:
        verify_record(envelope, max_bytes=MAX)
    assert info.value.reason == "forged"


def test_fields_are_checked_after_the_signature() -> None:
    key = new_key(5)
    bad = signed_record(key, price_per_input_token="1e-6")
    with pytest.raises(RecordError, match="price_per_input_token") as info:
        verify_record(bad.envelope(), max_bytes=MAX)
    assert info.value.reason == "malformed"


def test_heartbeats_verify_against_their_provider() -> None:
    key = new_key(6)
    hb = heartbeat(key, seq=3, at_ms=10)
    assert verify_heartbeat(hb.to_json()) == hb
    with pytest.raises(RecordError) as info:
        verify_heartbeat({**hb.to_json(), "at_ms": 11})
    assert info.value.reason == "forged"


def test_activation_codecs_are_signed_and_a_record_without_them_speaks_f32() -> None:
    key = new_key(7)
    signed = signed_record(key, activation_codecs=("q8_0", "f32"))
    assert json.loads(signed.text)["activation_codecs"] == ["q8_0", "f32"]
    assert verify_record(signed.envelope(), max_bytes=MAX).record.activation_codecs == ("q8_0", "f32")

    def resigned(fields: dict) -> dict:
        text = canonical_json(fields)
        return {"record": text, "signature": key.sign(RECORD_DOMAIN + text.encode()).signature.hex()}

    older = json.loads(signed.text)
    del older["activation_codecs"]  # a record from a node before activation codecs
    assert verify_record(resigned(older), max_bytes=MAX).record.activation_codecs == ("f32",)
    for bad in ([], ["q8_0", "q8_0"], ["Q8 0"], "q8_0"):
        with pytest.raises(RecordError, match="activation_codecs") as info:
            verify_record(resigned({**older, "activation_codecs": bad}), max_bytes=MAX)
        assert info.value.reason == "malformed"


def test_a_name_is_signed_optional_and_checked() -> None:
    key = new_key(8)
    base = json.loads(signed_record(key).text)
    assert "name" not in base  # no name given: the field is absent, as in records of older nodes
    assert verify_record(signed_record(key).envelope(), max_bytes=MAX).record.name == ""

    def resigned(fields: dict) -> dict:
        text = canonical_json(fields)
        return {"record": text, "signature": key.sign(RECORD_DOMAIN + text.encode()).signature.hex()}

    named = verify_record(resigned({**base, "name": "Zürich GPU 2"}), max_bytes=MAX)
    assert named.record.name == "Zürich GPU 2" and "Z\\u00fcrich" in named.text  # ASCII-only canonical text
    assert named.record.to_json()["name"] == "Zürich GPU 2"
    for bad in ("", " padded", "x" * 65, "line\nbreak", 7):
        with pytest.raises(RecordError, match="name") as info:
            verify_record(resigned({**base, "name": bad}), max_bytes=MAX)
        assert info.value.reason == "malformed"
    # the name is inside the signed text: changing it breaks the signature
    tampered = resigned({**base, "name": "honest"})
    tampered["record"] = tampered["record"].replace("honest", "forged")
    with pytest.raises(RecordError) as info:
        verify_record(tampered, max_bytes=MAX)
    assert info.value.reason == "forged"
