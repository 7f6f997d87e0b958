"""MXFP4 as a GGMLType: geometry, fallback, presets, the registered kernel (against gguf-py, bit for
bit) and the expert payload (written, read back, and refused when a block can decode to inf)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from core.formats.expert_payload import (
    PayloadError,
    encode_expert_payload,
    read_expert_payload,
    split_safetensors,
)
from core.quantization import mxfp4
from core.quantization.presets import PRESETS, PROJECTIONS, resolve_quant
from core.quantization.registry import KERNELS, dequantize, kernel, quantize
from core.quantization.types import GGMLType, parse_type, resolve_type, row_bytes

from .conftest import adversarial_inputs, bit_diff_report

T = GGMLType.MXFP4
# the E8M0 bytes with a story: ggml's two subnormal scales and the first normal one, 1/2·{1/2, 1, 2}
# around e = 127, the largest finite bound (252) and the three whose d·12 overflows f32
E8M0_EDGES = np.array([0, 1, 2, 126, 127, 128, 252, 253, 254, 255], dtype=np.uint8)


def test_geometry_matches_gguf():
    assert parse_type("mxfp4") is T and T.is_block
    assert (T.block_size, T.type_size) == gq.GGML_QUANT_SIZES[GGMLQuantizationType.MXFP4] == (32, 17)
    assert T.bits_per_weight == 4.25
    assert row_bytes(T, 2880) == 90 * 17  # gpt-oss's d_model: 90 blocks a row
    with pytest.raises(ValueError, match="not a multiple of the MXFP4 block size 32"):
        row_bytes(T, 2890)
    assert kernel("MXFP4") is KERNELS[T] and KERNELS[T].ggml_type is T


def test_fallback_like_q8_0():
    """32 divides the row: MXFP4 as asked; otherwise F16, as Q8_0 (no smaller block to go to)."""
    assert resolve_type(T, 2880) is T and resolve_type(T, 32) is T
    for n in (1, 31, 2890, 100):
        assert resolve_type(T, n) is GGMLType.F16 and resolve_type(GGMLType.Q8_0, n) is GGMLType.F16


def test_presets_accept_mxfp4():
    want = dict.fromkeys(PROJECTIONS, T)
    assert resolve_quant("mxfp4") == resolve_quant("MXFP4") == want == PRESETS["mxfp4"]
    assert resolve_quant({"gate": "MXFP4", "up": "mxfp4", "down": T}) == want
    mixed = resolve_quant({"gate": "MXFP4", "up": "MXFP4", "down": "q8_0"})
    assert mixed == {"gate": T, "up": T, "down": GGMLType.Q8_0}
    with pytest.raises(ValueError, match=r"quant\['down'\].*'mxfp8'"):
        resolve_quant({"gate": "MXFP4", "up": "MXFP4", "down": "mxfp8"})


@pytest.mark.parametrize("case", sorted(adversarial_inputs(256)))
def test_registry_round_trip(case):
    """quantize writes gguf-py's bytes (its rule, bit for bit, on every adversarial input but the
    subnormal one, where gguf-py's exponent leaves the u8 range: see core/quantization/mxfp4.py),
    dequantize decodes them as gguf-py does, and the error stays within the format's bound: a
    value is at most 2d = 1/4 of its block's top binade away from its code, a clipped one (gguf's
    scale tops out at 1.5·2^floor(log2 amax)) less than 1/4 of amax."""
    x = adversarial_inputs(512, seed=3)[case]
    blob = quantize(x, T)
    assert blob.dtype == np.uint8 and blob.shape == (x.shape[0], row_bytes(T, 512))
    if case != "subnormal":
        theirs = gq.quantize(x, GGMLQuantizationType.MXFP4)
        assert np.array_equal(blob, theirs), f"{int((blob != theirs).sum())} bytes differ"
    y = dequantize(blob, T, x.shape)
    ref = gq.dequantize(blob, GGMLQuantizationType.MXFP4)
    assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), bit_diff_report(y, ref)
    xb, yb = x.reshape(-1, 32).astype(np.float64), y.reshape(-1, 32).astype(np.float64)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    tiny = 2.0 ** -125  # below it the block gets e = 0 and the grid is what it is
    assert (np.abs(yb - xb) <= np.where(amax < tiny, amax, 0.25 * amax) + 1e-45).all()


def test_kernel_decodes_random_bytes_and_edges():
    """Every code in both nibbles under every E8M0 byte: the kernel (with and without `out`) equals
    the numpy codec and gguf-py bit for bit, subnormal scales and e = 255's infinities included."""
    k = KERNELS[T]
    rng = np.random.default_rng(50)
    blocks = rng.integers(0, 256, (256 * 4, 17), dtype=np.uint8)
    blocks[:, 0] = np.repeat(np.arange(256, dtype=np.uint8), 4)
    blocks[::4, 1:] = np.arange(16, dtype=np.uint8) * 17
    ours = k.dequantize_blocks(blocks)
    out = np.full((blocks.shape[0], 32), np.nan, np.float32)
    assert k.dequantize_blocks(blocks, out=out) is out
    with np.errstate(over="ignore"):
        ref = mxfp4.dequantize_blocks(blocks)
        theirs = gq.dequantize(blocks, GGMLQuantizationType.MXFP4).reshape(-1, 32)
    for got in (ours, out):
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), bit_diff_report(got, ref)
        assert np.array_equal(got.view(np.uint32), theirs.view(np.uint32)), bit_diff_report(got, theirs)


def test_scale_fields_bound_each_block():
    """d·12 per block: the largest magnitude it decodes to, inf from e = 253 on."""
    blocks = np.zeros((len(E8M0_EDGES), 17), np.uint8)
    blocks[:, 0] = E8M0_EDGES
    blocks[:, 1] = 0x07  # code 7 (value 12) in the first value: the bound is reached
    (bound,) = KERNELS[T].scale_fields(blocks)
    assert bound.dtype == np.float32 and bound.shape == (len(E8M0_EDGES),)
    with np.errstate(over="ignore"):
        largest = np.abs(mxfp4.dequantize_blocks(blocks)).max(axis=1)
    assert np.array_equal(bound, largest)
    assert np.isfinite(bound).tolist() == [e <= 252 for e in E8M0_EDGES]
    assert bound[list(E8M0_EDGES).index(127)] == 6.0


def _weights(rng: np.random.Generator, d_model: int, d_ff: int) -> dict[str, np.ndarray]:
    return {"gate": rng.standard_normal((d_ff, d_model)).astype(np.float32) * 0.05,
            "up": rng.standard_normal((d_ff, d_model)).astype(np.float32) * 0.05,
            "down": rng.standard_normal((d_model, d_ff)).astype(np.float32) * 0.05}


def _payload(w: dict[str, np.ndarray], quant) -> bytes:
    return encode_expert_payload(gate=w["gate"], up=w["up"], down=w["down"], quant=quant,
                                 model_id="test/gpt-oss-tiny", layer=2, expert=5)


@pytest.mark.parametrize("quant", [{"gate": "MXFP4", "up": "MXFP4", "down": "MXFP4"}, "mxfp4"])
def test_expert_payload_round_trip(quant):
    rng = np.random.default_rng(51)
    w = _weights(rng, 256, 96)
    payload = read_expert_payload(_payload(w, quant))
    for proj, x in w.items():
        t = payload.tensors[f"{proj}_proj.weight"]
        assert t.ggml_type is T and t.shape == x.shape
        assert t.data.shape == (x.shape[0], row_bytes(T, x.shape[1]))
        assert np.array_equal(t.data, quantize(x, T))
        assert np.array_equal(payload.dense(proj), dequantize(quantize(x, T), T, x.shape))


def test_expert_payload_falls_back_to_f16():
    """d_ff 80: down's rows (80 long) take F16, the metadata keeps what was asked for."""
    rng = np.random.default_rng(52)
    data = _payload(_weights(rng, 256, 80), "MXFP4")
    header, _ = split_safetensors(data)
    meta = header["__metadata__"]
    assert meta["down_proj.weight.ggml_type"] == "F16"
    assert meta["down_proj.weight.requested_ggml_type"] == "MXFP4"
    assert meta["gate_proj.weight.ggml_type"] == meta["up_proj.weight.ggml_type"] == "MXFP4"
    assert read_expert_payload(data).tensors["down_proj.weight"].ggml_type is GGMLType.F16


def _with_exponent(data: bytes, tensor: str, block: int, e: int) -> bytes:
    """The payload with block `block` of `tensor` given the E8M0 byte e."""
    header, body = split_safetensors(data)
    at = len(data) - len(body) + header[tensor]["data_offsets"][0] + 17 * block
    return data[:at] + bytes([e]) + data[at + 1:]


@pytest.mark.parametrize("e", [253, 254, 255])
@pytest.mark.parametrize("tensor", ["gate_proj.weight", "down_proj.weight"])
def test_expert_payload_refuses_blocks_that_can_decode_to_inf(tensor, e):
    rng = np.random.default_rng(53)
    data = _payload(_weights(rng, 256, 96), "MXFP4")
    read_expert_payload(_with_exponent(data, tensor, 7, 252))  # the largest finite bound reads
    with pytest.raises(PayloadError, match=rf"{tensor}: 1 block\(s\) of MXFP4 have non-finite"):
        read_expert_payload(_with_exponent(data, tensor, 7, e))
