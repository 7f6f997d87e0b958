"""Expert payload writer/reader: round trips, sizes, and every rejection path."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors

from core.formats.expert_payload import (
    ExpertPayload,
    PayloadError,
    encode_expert_payload,
    read_expert_payload,
)
from core.quantization.presets import PROJECTIONS, resolve_quant
from core.quantization.types import GGMLType

D_MODEL, D_FF = 512, 1024


def weights(d_model=D_MODEL, d_ff=D_FF, seed=0):
    rng = np.random.default_rng(seed)
    return {"gate": rng.standard_normal((d_ff, d_model)).astype(np.float32),
            "up": rng.standard_normal((d_ff, d_model)).astype(np.float32),
            "down": rng.standard_normal((d_model, d_ff)).astype(np.float32)}


def encode(quant="q4_k_m", **kw):
    w = weights(**kw)
    return encode_expert_payload(**w, quant=quant, model_id="org/model", layer=3, expert=17), w


def split(blob: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack_from("<Q", blob)
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def join(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


@pytest.mark.parametrize("quant", ["q4_k_m", "q8_0", "q4_k", "q6_k", None, "f16", "bf16",
                                   {"gate": "q4_k", "up": "q8_0", "down": "f32"}])
def test_round_trip(quant):
    blob, w = encode(quant)
    p = read_expert_payload(blob)
    assert isinstance(p, ExpertPayload)
    assert (p.model_id, p.layer, p.expert, p.d_model(), p.d_ff()) == ("org/model", 3, 17, D_MODEL, D_FF)
    want = resolve_quant(quant)
    for proj in PROJECTIONS:
        t = p.tensors[f"{proj}_proj.weight"]
        assert t.ggml_type is want[proj]
        y = p.dense(proj)
        assert y.dtype == np.float32 and y.shape == w[proj].shape
        rel = np.sqrt(np.mean((y - w[proj]) ** 2) / np.mean(w[proj] ** 2))
        assert rel < {GGMLType.Q4_K: 0.08, GGMLType.Q6_K: 0.02, GGMLType.Q8_0: 0.006}.get(t.ggml_type, 0.005)
    assert np.array_equal(p.dense("gate_proj.weight"), p.dense("gate"))


def test_readable_by_safetensors():
    blob, _ = encode("q4_k_m")
    names = {name: info for name, info in safetensors.deserialize(blob)}
    assert set(names) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    assert names["gate_proj.weight"]["dtype"] == "U8"
    header, _ = split(blob)
    meta = header["__metadata__"]
    assert meta["gate_proj.weight.ggml_type"] == "Q4_K"
    assert meta["down_proj.weight.ggml_type"] == "Q6_K"
    assert meta["gate_proj.weight.shape"] == f"{D_FF},{D_MODEL}"
    assert (meta["model_id"], meta["layer"], meta["expert"]) == ("org/model", "3", "17")


@pytest.mark.parametrize(("quant", "bpw"), [("q8_0", 8.5), ("q4_k", 4.5), ("q6_k", 6.5625), (None, 32)])
def test_size_matches_bits_per_weight(quant, bpw):
    blob, _ = encode(quant)
    _, body = split(blob)
    n_weights = 3 * D_MODEL * D_FF
    assert len(body) * 8 == n_weights * bpw
    assert len(blob) - len(body) < 2048  # header overhead only


def test_fallback_recorded_in_metadata():
    # d_model 96: gate/up rows of 96 -> Q4_K falls back to Q8_0; down rows of d_ff=512 stay Q6_K.
    blob, _ = encode("q4_k_m", d_model=96, d_ff=512)
    meta = split(blob)[0]["__metadata__"]
    assert meta["gate_proj.weight.ggml_type"] == "Q8_0"
    assert meta["gate_proj.weight.requested_ggml_type"] == "Q4_K"
    assert meta["down_proj.weight.ggml_type"] == "Q6_K"
    p = read_expert_payload(blob)
    assert p.tensors["gate_proj.weight"].ggml_type is GGMLType.Q8_0
    blob, _ = encode("q8_0", d_model=100, d_ff=200)  # neither divisible by 32 -> F16
    assert {t.ggml_type for t in read_expert_payload(blob).tensors.values()} == {GGMLType.F16}


def test_bad_inputs_rejected_on_encode():
    w = weights()
    with pytest.raises(PayloadError, match="down"):
        encode_expert_payload(gate=w["gate"], up=w["up"], down=w["gate"], quant=None, model_id="m", layer=0, expert=0)
    with pytest.raises(PayloadError, match="q5_k"):
        encode_expert_payload(**w, quant="q5_k", model_id="m", layer=0, expert=0)
    with pytest.raises(PayloadError, match="layer"):
        encode_expert_payload(**w, quant=None, model_id="m", layer=-1, expert=0)
    bad = dict(w)
    bad["up"] = w["up"].copy()
    bad["up"][0, 0] = np.inf
    with pytest.raises(PayloadError, match=r"up_proj\.weight.*non-finite"):
        encode_expert_payload(**bad, quant="q4_k", model_id="m", layer=0, expert=0)


def mutate_meta(key, value):
    blob, _ = encode()
    header, body = split(blob)
    if value is None:
        del header["__metadata__"][key]
    else:
        header["__metadata__"][key] = value
    return join(header, body)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("gate_proj.weight.ggml_type", "Q5_K", "gate_proj.weight: unknown ggml_type 'Q5_K'"),
    ("gate_proj.weight.ggml_type", None, "gate_proj.weight: unknown ggml_type None"),
    ("up_proj.weight.shape", "1024", "up_proj.weight.*rows,cols"),
    ("up_proj.weight.shape", "1024,768", "up_proj.weight: tensor shape"),
    ("down_proj.weight.ggml_type", "Q8_0", "down_proj.weight: tensor shape for Q8_0"),
    ("model_id", None, "model_id"),
    ("layer", "x", "layer"),
])
def test_bad_metadata_rejected(key, value, match):
    with pytest.raises(PayloadError, match=match):
        read_expert_payload(mutate_meta(key, value))


def test_byte_count_mismatch_rejected():
    blob, _ = encode()
    header, body = split(blob)
    b, e = header["gate_proj.weight"]["data_offsets"]
    header["gate_proj.weight"]["data_offsets"] = [b, e - 144]
    want = r"gate_proj.weight: byte count 294768 does not match Q4_K \[1024, 512\] \(expected 294912\)"
    with pytest.raises(PayloadError, match=want):
        read_expert_payload(join(header, body))


def test_dtype_mismatch_rejected():
    blob, _ = encode()
    header, body = split(blob)
    header["gate_proj.weight"]["dtype"] = "F16"
    with pytest.raises(PayloadError, match=r"gate_proj\.weight: dtype for Q4_K must be U8"):
        read_expert_payload(join(header, body))


def test_missing_and_extra_tensors_rejected():
    blob, _ = encode()
    header, body = split(blob)
    h = dict(header)
    del h["up_proj.weight"]
    with pytest.raises(PayloadError, match=r"missing tensor\(s\) \['up_proj.weight'\]"):
        read_expert_payload(join(h, body))
    h = dict(header)
    h["bias"] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    with pytest.raises(PayloadError, match="unexpected tensor"):
        read_expert_payload(join(h, body))


def test_inconsistent_shapes_rejected():
    w = weights()
    other = weights(d_model=256)
    blob = encode_expert_payload(gate=w["gate"], up=w["up"], down=w["down"], quant="q8_0",
                                 model_id="m", layer=0, expert=0)
    blob2 = encode_expert_payload(**other, quant="q8_0", model_id="m", layer=0, expert=0)
    h1, b1 = split(blob)
    h2, b2 = split(blob2)
    # Splice the smaller expert's down_proj into the first: every tensor is valid alone.
    down = h2["down_proj.weight"]
    s, e = down["data_offsets"]
    body = b1[:h1["down_proj.weight"]["data_offsets"][0]] + b2[s:e]
    order = sorted(h1[n]["data_offsets"][0] for n in ("gate_proj.weight", "up_proj.weight"))
    assert order[0] > 0  # down_proj comes first in name order
    body = b2[s:e] + b1[h1["down_proj.weight"]["data_offsets"][1]:]
    shift = (e - s) - h1["down_proj.weight"]["data_offsets"][1]
    for n in ("gate_proj.weight", "up_proj.weight"):
        h1[n]["data_offsets"] = [o + shift for o in h1[n]["data_offsets"]]
    h1["down_proj.weight"] = dict(down, data_offsets=[0, e - s])
    h1["__metadata__"]["down_proj.weight.shape"] = h2["__metadata__"]["down_proj.weight.shape"]
    with pytest.raises(PayloadError, match=r"inconsistent shapes: down_proj\.weight"):
        read_expert_payload(join(h1, body))


def test_non_finite_scale_rejected():
    blob, _ = encode("q8_0")
    header, body = split(blob)
    b = header["up_proj.weight"]["data_offsets"][0]
    body = bytearray(body)
    body[b:b + 2] = np.array([np.inf], "<f2").tobytes()  # first block's d
    with pytest.raises(PayloadError, match=r"up_proj.weight: 1 block\(s\) of Q8_0 have non-finite scales"):
        read_expert_payload(join(header, bytes(body)))


@pytest.mark.parametrize("blob", [b"", b"\x00" * 7, struct.pack("<Q", 10**9) + b"{}", struct.pack("<Q", 2) + b"[]",
                                  struct.pack("<Q", 3) + b"{x}"])
def test_garbage_rejected(blob):
    with pytest.raises(PayloadError):
        read_expert_payload(blob)
