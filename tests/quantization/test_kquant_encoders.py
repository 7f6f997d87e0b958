"""The two Q4_K/Q6_K encoders: C (core/quantization/_kquant_encoders.c, through kquant_c.py)
and numpy (q4_k.py, q6_k.py).  Both must write llama.cpp's reference bytes, so that a blob's
hash does not depend on whether the extension was built.

Bit-identity with llama.cpp's reference quantizers (quantize_row_q4_K_ref,
quantize_row_q6_K_ref) is pinned by GOLDEN: sha256 prefixes of the reference's bytes for the
inputs of `golden_inputs`, produced by compiling the reference functions of
ggml-org/llama.cpp ggml/src/ggml-quants.c (commit 01243c58) with gcc -O2, no FMA
contraction, with both F16C and software f16 rounding (identical).  Every C kernel copy
(avx512, avx2, scalar) and the numpy encoder are then compared byte for byte on random and
adversarial rows, including blocks whose scales overflow f16 (compared below the registry,
which refuses to publish those).  The hand-checked blocks exercise the reference's edge
paths.  Every input is seeded; the C tests skip when the extension was not built.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from core.quantization import kquant_c
from core.quantization.baseline import NAIVE
from core.quantization.q4_k import Q4_K
from core.quantization.q6_k import Q6_K
from core.quantization.registry import dequantize, encoder, quantize
from core.quantization.types import GGMLType

from .conftest import adversarial_inputs, bit_diff_report

try:
    from core.quantization import _kquant_encoders as _kquant
except ImportError:  # no compiler at install time: the numpy encoder is still pinned to GOLDEN
    _kquant = None

needs_c = pytest.mark.skipif(_kquant is None, reason="core.quantization._kquant_encoders not built")
VARIANTS = _kquant.variants() if _kquant else []
K_TYPES = [GGMLType.Q4_K, GGMLType.Q6_K]
NUMPY = {GGMLType.Q4_K: Q4_K, GGMLType.Q6_K: Q6_K}
GGUF = {t: GGMLQuantizationType[t.value] for t in K_TYPES}
ENCODERS = ["numpy", *(f"c-{v}" for v in VARIANTS)]


def golden_inputs() -> dict[str, np.ndarray]:
    """Inputs built from integer hashing only (stable across numpy versions), 16 blocks each."""
    i = np.arange(16 * 256, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(12345)) % np.uint64(2**32)
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) % np.uint64(2**32)
    h ^= h >> np.uint64(13)
    u = ((h >> np.uint64(8)).astype(np.int64) - 2**23).astype(np.float32) * np.float32(2**-23)  # [-1, 1), exact
    outliers = u * np.float32(0.01)
    outliers[::37] = np.float32(50.0)
    sparse = np.where((h & np.uint64(7)) == 0, u, np.float32(0)).astype(np.float32)
    return {
        "uniform": u,
        "cubed": u * u * u * np.float32(4),
        "offset": u + np.float32(0.3),
        "outliers": outliers,
        "sparse": sparse,
        "tiny": u * np.float32(1e-6),
        "ties": np.rint(u * np.float32(40)) * np.float32(0.5),
    }


# sha256(bytes)[:32] of llama.cpp's reference output: (Q4_K, Q6_K).
GOLDEN = {
    "uniform": ("2549a6748a5c1cd4d7bcd43103a6e0e6", "c67d8631d4af32416af018857f6c7673"),
    "cubed": ("f1380f48a950390a0ab4fabc86b897d4", "3b9d9875e9cf72fdfc63d6cf8de90455"),
    "offset": ("89dd8fdfb9a82670709e94b0af586808", "8eb3387ada5876729ff8f30f00c28aa9"),
    "outliers": ("b8915c84d44c4072a190df7018cd6b37", "434c12bb9b9cc75ed7e4e7d379f31d2c"),
    "sparse": ("af39565c11cdfb4dd9dc225f97d89190", "0f888efdb6b5410de3b646c27e23c089"),
    "tiny": ("38f7ed0f7b5d8c9963d33a20e9b59c50", "8cd348049c2fea94799676e693cac8cd"),
    "ties": ("5bb30af1cf7053922d53a3a273d33d90", "dde8b5b6b92929e0582efb827e372eeb"),
}


def c_encode(ggml_type: GGMLType, x: np.ndarray, variant: str | None = None) -> np.ndarray:
    """The extension called directly: u8 (n_blocks * type_size,), whatever the values."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.size // 256 * ggml_type.type_size, np.uint8)
    fn = _kquant.quantize_q4_k if ggml_type == GGMLType.Q4_K else _kquant.quantize_q6_k
    fn(x, out, variant)
    return out


def numpy_encode(ggml_type: GGMLType, x: np.ndarray) -> np.ndarray:
    """The numpy kernel called directly (no finiteness check): u8 (n_blocks * type_size,)."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 256)
    with np.errstate(over="ignore"):  # f16 scales that overflow: compared all the same
        return NUMPY[ggml_type].quantize_blocks(blocks).reshape(-1)


def encode(name: str, ggml_type: GGMLType, x: np.ndarray) -> np.ndarray:
    return numpy_encode(ggml_type, x) if name == "numpy" else c_encode(ggml_type, x, name.removeprefix("c-"))


@pytest.fixture
def c_on():
    before = kquant_c.enabled()
    kquant_c.set_enabled(True)
    yield
    kquant_c.set_enabled(before)


def edge_inputs(seed: int) -> dict[str, np.ndarray]:
    """K-quant edge cases beyond adversarial_inputs, f32 (4, 1024) each (4 blocks per row)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((4, 1024)).astype(np.float32)
    huge = (g * 0.01).astype(np.float32)
    huge[:, ::256] = np.float32(3e4)  # one huge outlier per super-block
    mixed = g.copy()
    mixed[:, :256] *= np.float32(1e-8)  # a near-zero block next to normal ones
    mixed[:, 256:288] = 0  # and an all-zero sub-block
    single = np.zeros((4, 1024), np.float32)
    single[:, 7::32] = g[:, 7::32]  # one nonzero value per sub-block
    # scales at the edge of f16: Q4_K d = max_scale/63 ~ range/945, Q6_K d ~ amax/4096, f16 max 65504
    return {
        "outlier_per_block": huge,
        "mixed_magnitudes": mixed,
        "single_nonzero": single,
        "offset_positive": np.abs(g) * np.float32(0.01) + np.float32(1000),
        "halves": (rng.integers(-64, 64, (4, 1024)) * 0.5).astype(np.float32),
        "alternating": np.where(np.arange(1024) % 2 == 0, np.float32(1), np.float32(-1)) * np.ones((4, 1), np.float32),
        "q4_k_f16_limit": (g / np.abs(g).max() * np.float32(3.0e7)).astype(np.float32),
        "q4_k_f16_over": (g / np.abs(g).max() * np.float32(6.5e7)).astype(np.float32),
        "q6_k_f16_limit": (g / np.abs(g).max() * np.float32(2.6e8)).astype(np.float32),
        "q6_k_f16_over": (g / np.abs(g).max() * np.float32(2.8e8)).astype(np.float32),
        "smallest_subnormals": (rng.integers(-3, 4, (4, 1024)) * np.float32(1.4e-45)).astype(np.float32),
        "f32_max": np.where(g > 0, np.float32(3e38), np.float32(-3e38)),
    }


@pytest.mark.parametrize("enc", ENCODERS)
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_bytes_match_llama_cpp_reference(name, enc):
    x = golden_inputs()[name]
    got = [hashlib.sha256(encode(enc, t, x).tobytes()).hexdigest()[:32] for t in K_TYPES]
    assert tuple(got) == GOLDEN[name]


@needs_c
@pytest.mark.parametrize("ggml_type", K_TYPES, ids=lambda t: t.value)
@pytest.mark.parametrize("seed", [21, 22])
def test_every_encoder_gives_the_same_bytes(ggml_type, seed):
    """numpy and every C kernel copy, byte for byte, on random and adversarial rows."""
    cases = {**adversarial_inputs(1024, rows=4, seed=seed), **edge_inputs(seed)}
    for case, x in cases.items():
        ref = numpy_encode(ggml_type, x)
        for variant in VARIANTS:
            got = c_encode(ggml_type, x, variant)
            assert np.array_equal(got, ref), f"{ggml_type.value} {case} {variant}: {bit_diff_report(got, ref)}"


@needs_c
@settings(max_examples=60, deadline=None, derandomize=True)
@given(ggml_type=st.sampled_from(K_TYPES), blocks=st.integers(1, 3), data=st.data())
def test_property_numpy_and_c_agree(ggml_type, blocks, data):
    x = data.draw(hnp.arrays(np.float32, (blocks, 256), elements=st.floats(
        -1e6, 1e6, allow_nan=False, allow_infinity=False, allow_subnormal=True, width=32)))
    ref = numpy_encode(ggml_type, x)
    for variant in VARIANTS:
        got = c_encode(ggml_type, x, variant)
        assert np.array_equal(got, ref), f"{ggml_type.value} {variant}: {bit_diff_report(got, ref)}"


@needs_c
def test_registry_bytes_do_not_depend_on_the_extension():
    """What prepare publishes: quantize() with the C encoder on and off."""
    x = np.random.default_rng(23).standard_t(3, (96, 2048)).astype(np.float32)
    for t in K_TYPES:
        before = kquant_c.enabled()
        try:
            kquant_c.set_enabled(True)
            c = quantize(x, t)
            kquant_c.set_enabled(False)
            assert encoder(t) == "numpy"
            npy = quantize(x, t)
        finally:
            kquant_c.set_enabled(before)
        assert np.array_equal(c, npy), f"{t.value}: {bit_diff_report(c, npy)}"


@pytest.mark.parametrize("enc", ENCODERS)
def test_q4_k_constant_block_by_hand(enc):
    """max == min: scales 0, mins all 3.25 -> lm 63, dmin = f16(3.25/63), quants 0."""
    blob = encode(enc, GGMLType.Q4_K, np.full(256, -3.25, np.float32))
    assert blob[0:2].tobytes() == b"\0\0"  # d = 0
    assert blob[2:4].view("<f2")[0] == np.float16(np.float32(3.25) / np.float32(63))
    # scales[12]: 6-bit sc 0; 6-bit m 63 -> bytes 4..7 = 63 | (63 >> 4) << 6, bytes 8..11 = 0xF0
    assert list(blob[4:16]) == [0] * 4 + [0xFF] * 4 + [0xF0] * 4
    assert not blob[16:].any()


@pytest.mark.parametrize("enc", ENCODERS)
def test_q4_k_zero_scale_sub_block_keeps_search_quants(enc):
    """Sub-block 0 tiny next to large ones: its 6-bit scale rounds to 0, its quants stay those
    of make_qkx2_quants (the reference does not reset them)."""
    x = np.ones(256, np.float32)
    x[32:] = np.linspace(-100, 100, 224, dtype=np.float32)
    x[:32] = np.linspace(0, 1e-3, 32, dtype=np.float32)
    blob = encode(enc, GGMLType.Q4_K, x)
    assert blob[4] & 63 == 0  # sc[0] == 0
    q0 = np.concatenate([blob[16:48] & 0xF])  # sub-block 0 = low nibbles of qs[0:32]
    assert list(q0) == [min(15, int(np.rint(v * (15 / 1e-3)))) for v in x[:32]]


@pytest.mark.parametrize("enc", ENCODERS)
def test_q6_k_empty_and_zero_sub_blocks_by_hand(enc):
    assert not encode(enc, GGMLType.Q6_K, np.zeros(256, np.float32)).any()  # whole block zero
    x = np.zeros(256, np.float32)
    x[16:32] = np.float32(-2.0)  # sub-block 1 constant, the others all zero
    blob = encode(enc, GGMLType.Q6_K, x)
    sc = blob[192:208].view(np.int8)
    # make_qx_quants: max = -2, iscale = 16, every l = -32 (clamped), scale = -2/-32 = 1/16;
    # scales = [0, -128 * ...]: iscale = -128 / (1/16) = -2048, sc[1] = -128, d = f16(-1/2048)
    assert list(sc) == [0, -128] + [0] * 14
    assert blob[208:210].view("<f2")[0] == np.float16(-1 / 2048)
    # sub-block 1: x/d = -2 / (-1/2048 * -128) = -32 -> q 0; zero sub-blocks keep L = 0 (not 32)
    y = gq.dequantize(blob, GGUF[GGMLType.Q6_K]).ravel()
    assert np.array_equal(y, x)
    assert not blob[:192].any()


@needs_c
@pytest.mark.parametrize("ggml_type", K_TYPES, ids=lambda t: t.value)
@pytest.mark.parametrize("case", sorted(adversarial_inputs(256)))
def test_adversarial_inputs_decode_finite_through_gguf(ggml_type, case, c_on):
    x = adversarial_inputs(1024, seed=13)[case]
    assert encoder(ggml_type) == "c"
    blob = quantize(x, ggml_type)
    y = gq.dequantize(blob, GGUF[ggml_type]).reshape(x.shape)
    assert np.isfinite(y).all()
    assert np.array_equal(dequantize(blob, ggml_type, x.shape).view(np.uint32), y.view(np.uint32))
    assert np.array_equal(blob, quantize(x, ggml_type)), "not deterministic"


@pytest.mark.parametrize("ggml_type", K_TYPES, ids=lambda t: t.value)
@pytest.mark.parametrize("dist", ["gaussian", "student_t"])
def test_searched_scales_beat_naive(ggml_type, dist):
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((64, 4096)) if dist == "gaussian" else rng.standard_t(3, (64, 4096))).astype(np.float32)

    def rmse(blob):
        return float(np.sqrt(np.mean((dequantize(blob, ggml_type, x.shape) - x) ** 2)))

    ours, naive = rmse(quantize(x, ggml_type)), rmse(NAIVE[ggml_type](x))
    assert ours < 0.97 * naive, (ours, naive)


@needs_c
@pytest.mark.parametrize("ggml_type", K_TYPES, ids=lambda t: t.value)
def test_threads_give_the_same_bytes(ggml_type):
    """GIL released, no shared state: concurrent calls (each itself split over worker threads)
    give the bytes of a lone call."""
    xs = [np.random.default_rng(s).standard_normal((64, 4096)).astype(np.float32) for s in range(4)]
    want = [c_encode(ggml_type, x) for x in xs]
    got: list[np.ndarray | None] = [None] * 8

    def work(k):
        got[k] = c_encode(ggml_type, xs[k % 4])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(8):
        assert np.array_equal(got[k], want[k % 4])
    # the split over worker threads does not change bytes: block by block == all at once
    x = xs[0].reshape(-1, 256)
    one_by_one = np.concatenate([c_encode(ggml_type, x[i:i + 1]) for i in range(x.shape[0])])
    assert np.array_equal(one_by_one, want[0])


@needs_c
@pytest.mark.parametrize("ggml_type", K_TYPES, ids=lambda t: t.value)
def test_bad_arguments_raise_value_error(ggml_type):
    fn = _kquant.quantize_q4_k if ggml_type == GGMLType.Q4_K else _kquant.quantize_q6_k
    ts = ggml_type.type_size
    x = np.zeros(512, np.float32)
    with pytest.raises(ValueError, match="dst bytes"):
        fn(x, np.empty(2 * ts - 1, np.uint8))
    with pytest.raises(ValueError, match="multiple of 256"):
        fn(np.zeros(300, np.float32), np.empty(ts, np.uint8))
    with pytest.raises(ValueError, match="float32"):
        fn(np.zeros(512, np.float64), np.empty(2 * ts, np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        fn(np.zeros((512, 2), np.float32)[:, 0], np.empty(2 * ts, np.uint8))
    ro = np.empty(2 * ts, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        fn(x, ro)
    with pytest.raises(ValueError, match="writable"):
        fn(x, b"\0" * (2 * ts))
    buf = np.zeros(512 + 2 * ts, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        fn(buf[:512], buf.view(np.uint8)[:2 * ts])
    with pytest.raises(ValueError, match="variant"):
        fn(x, np.empty(2 * ts, np.uint8), "sse9")
    with pytest.raises(TypeError):
        fn(x)
    fn(np.zeros(0, np.float32), np.empty(0, np.uint8))  # nothing to do is fine


@needs_c
def test_f16_rounding_matches_numpy():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0x477FEFFF, 0x477FF000, 0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x7F800000,
                      0xFF800000, 0, 0x80000000, 0x00000001], np.uint32)
    x = np.concatenate([bits, edges]).view(np.float32)
    x = x[~np.isnan(x)]
    got = np.empty(x.size * 2, np.uint8)
    _kquant.f32_to_f16(x, got)
    with np.errstate(over="ignore"):
        want = x.astype("<f2").view(np.uint8)
    assert np.array_equal(got, want), bit_diff_report(got, want)


def _run(code: str, **env) -> str:
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("TENZRO_KQUANT_C", "TENZRO_KQUANT_VARIANT")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**base, **env}).stdout.strip()


@needs_c
def test_env_var_forces_numpy_and_package_works_without_extension():
    probe = ("import sys; from core.quantization.registry import encoder, quantize; import numpy as np; "
             "quantize(np.ones((1, 256), np.float32), 'Q4_K'); "
             "print(encoder('Q4_K'), encoder('Q6_K'), 'django' in sys.modules)")
    assert _run(probe) == "c c False"
    assert _run(probe, TENZRO_KQUANT_C="0") == "numpy numpy False"
    blocked = "import sys; sys.modules['core.quantization._kquant_encoders'] = None; " + probe
    assert _run(blocked) == "numpy numpy False"


@needs_c
def test_variant_setting_picks_the_copy():
    probe = "from core.quantization import kquant_c; print(kquant_c.variant(), kquant_c.variants()[-1])"
    assert _run(probe) == f"{VARIANTS[0]} scalar"
    assert _run(probe, TENZRO_KQUANT_VARIANT="Scalar") == "scalar scalar"
    assert _run(probe, TENZRO_KQUANT_C="0", TENZRO_KQUANT_VARIANT="scalar") == "None scalar"
    with pytest.raises(subprocess.CalledProcessError) as failed:
        _run(probe, TENZRO_KQUANT_VARIANT="sse9")
    assert "variant 'sse9' is not available here" in failed.value.stderr
    before = kquant_c.VARIANT
    try:
        x = np.random.default_rng(24).standard_normal((4, 512)).astype(np.float32)
        blobs = []
        for name in VARIANTS:
            kquant_c.set_variant(name)
            assert kquant_c.variant() == name
            blobs.append(kquant_c.quantize_q6_k(x.reshape(-1, 256)))
        assert all(np.array_equal(b, blobs[0]) for b in blobs)
        with pytest.raises(ValueError, match="not available"):
            kquant_c.set_variant("neon")
    finally:
        kquant_c.set_variant(before)
