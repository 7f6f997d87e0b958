"""The CUDA device (core/experts/gpu/cuda.py, cuda_kernels.cu).

Without a GPU (these run everywhere):
* the block decoders of cuda_kernels.cu, compiled for the host with a C++ compiler, against
  gguf-py's decoder bit for bit (every lane group of every block, random and edge scales), and
  the f16/bf16 widening over every bit pattern;
* nvcc compiles the whole file to PTX for sm_80 with no warning (skipped only without nvcc),
  every kernel cuda.py loads is in it, and the decode kernels contain no FMA;
* open_device's DeviceUnavailable messages (cupy missing, no device, index out of range);
* the f32 error bound the GPU tests use holds for the CPU reference path.
With a CUDA device (skipped otherwise, with CuPy's reason): the real forward at batches
1, 8, 64, 512 for every format and mixes, against CpuBackend(use_numba=False) and the f64
forward, within expert_error_bound.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from core.experts.backends import CpuBackend, CpuExpert, TensorIn
from core.experts.gpu import cuda, cuda_timing
from core.experts.gpu.cuda_selftest import expert_error_bound, random_weight
from core.experts.gpu.ops import DeviceError, DeviceUnavailable
from core.quantization.registry import dequantize
from testkit.blocks import F16_FIELDS, random_blocks
from tests.experts.factories import bit_report

BLOCK_FORMATS = ["Q8_0", "Q4_K", "Q6_K"]
SHIM = r"""
#include "%s"
template <class F> static void decode_all(const tz_u8* blocks, long long nb, float* out) {
    for (long long b = 0; b < nb; ++b)
        for (int g = 0; g < F::GROUPS; ++g) {
            float v[F::VALS];
            int p[F::VALS];
            F::group(blocks + b * F::BYTES, g, v, p);
            for (int k = 0; k < F::VALS; ++k) out[b * F::BLOCK + p[k]] = v[k];
        }
}
extern "C" int tz_host_decode(int fmt, const tz_u8* blocks, long long nb, float* out) {
    switch (fmt) {
        case 0: decode_all<TzQ8_0>(blocks, nb, out); return 0;
        case 1: decode_all<TzQ4_K>(blocks, nb, out); return 0;
        case 2: decode_all<TzQ6_K>(blocks, nb, out); return 0;
    }
    return -1;
}
extern "C" void tz_host_widen(const tz_u16* h, long long n, int bf16, float* out) {
    for (long long i = 0; i < n; ++i) out[i] = bf16 ? tz_bf16_to_f32(h[i]) : tz_f16_to_f32(h[i]);
}
"""


# -- the decoders, compiled for the host ------------------------------------------------------


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    assert cxx, "a C++ compiler is needed to build cuda_kernels.cu's decoders for the host"
    tmp = tmp_path_factory.mktemp("cuda_host")
    (tmp / "shim.cpp").write_text(SHIM % cuda.KERNELS_PATH)
    # -ffp-contract=off: the host must round each product as the device's __fmul_rn does
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
           str(tmp / "shim.cpp"), "-o", str(tmp / "shim.so")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stderr}"
    lib = ctypes.CDLL(str(tmp / "shim.so"))
    lib.tz_host_decode.restype = ctypes.c_int
    lib.tz_host_decode.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p]
    lib.tz_host_widen.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
    return lib


def host_decode(lib, fmt: str, blocks: np.ndarray) -> np.ndarray:
    """u8 [rows, row_bytes] -> f32 [rows, n] through the .cu decoders (NaN where none wrote)."""
    ggml = getattr(GGMLQuantizationType, fmt)
    block, size = quants.GGML_QUANT_SIZES[ggml]
    blocks = np.ascontiguousarray(blocks)
    nb = blocks.size // size
    out = np.full(nb * block, np.nan, dtype=np.float32)
    assert lib.tz_host_decode(BLOCK_FORMATS.index(fmt), blocks.ctypes.data, nb, out.ctypes.data) == 0
    return out.reshape(blocks.shape[0], -1)


def edge_blocks(rng: np.random.Generator, fmt: str, rows: int, n: int) -> np.ndarray:
    """Random blocks whose f16 scales are edge values: ±0, subnormals, the largest finite, ±1."""
    raw = random_blocks(rng, fmt, rows, n).reshape(rows, n // (32 if fmt == "Q8_0" else 256), -1)
    edges = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x8001, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x0400],
                     dtype=np.uint16)
    for off in F16_FIELDS[fmt]:
        pick = edges[rng.integers(0, edges.size, size=raw.shape[:2])]
        raw[:, :, off : off + 2] = pick.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_host_decoders_match_gguf(host_lib, fmt):
    rng = np.random.default_rng(160)
    for blocks in (random_blocks(rng, fmt, 48, 1024), edge_blocks(rng, fmt, 48, 1024)):
        ours = host_decode(host_lib, fmt, blocks)
        ref = quants.dequantize(blocks, getattr(GGMLQuantizationType, fmt)).astype(np.float32)
        assert ours.shape == ref.shape
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), bit_report(ours, ref)


def test_host_widening_every_f16_and_bf16(host_lib):
    bits = np.arange(1 << 16, dtype=np.uint16)
    for bf16, ref in ((0, bits.view(np.float16).astype(np.float32)),
                      (1, (bits.astype(np.uint32) << 16).view(np.float32))):
        out = np.empty(bits.size, dtype=np.float32)
        host_lib.tz_host_widen(bits.ctypes.data, bits.size, bf16, out.ctypes.data)
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(out), nan)
        assert np.array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32)), bit_report(out[~nan], ref[~nan])


# -- the device compile ------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_kernels_to_ptx_without_warnings(tmp_path):
    ptx = tmp_path / "k.ptx"
    cmd = ["nvcc", "--ptx", "-arch=sm_80", "-Werror", "all-warnings", str(cuda.KERNELS_PATH), "-o", str(ptx)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    text = ptx.read_text()
    for name in cuda.KERNEL_NAMES:
        assert f".entry {name}(" in text, f"{name} missing from the PTX"
    for name in cuda.KERNEL_NAMES:
        if name.startswith("tz_dq_"):  # an FMA would round once where gguf rounds twice
            body = text.split(f".entry {name}(", 1)[1].split("\n}\n", 1)[0]
            assert "fma." not in body and "mad." not in body, f"{name} contracts a decode product into an FMA"


# -- open_device without a device -----------------------------------------------------------


def test_open_device_here():
    """Whatever this machine has: cupy missing, no device, or a device that opens."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(DeviceUnavailable, match=r"cupy is not installed .*requirements-gpu-cuda\.txt"):
            cuda.open_device()
        return
    from cupy.cuda import runtime

    try:
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as exc:
        with pytest.raises(DeviceUnavailable) as info:
            cuda.open_device()
        assert str(info.value) == f"no CUDA device: {exc}"
        return
    ops = cuda.open_device()
    try:
        assert count >= 1 and ops.kind == "cuda" and ops.memory_total_bytes > 0 and ops.device_name
    finally:
        ops.close()


def fake_cupy(monkeypatch, get_count) -> None:
    cupy, cuda_mod, runtime = (types.ModuleType(n) for n in ("cupy", "cupy.cuda", "cupy.cuda.runtime"))

    class CUDARuntimeError(RuntimeError):
        pass

    runtime.CUDARuntimeError = CUDARuntimeError
    runtime.getDeviceCount = lambda: get_count(CUDARuntimeError)
    cuda_mod.runtime = runtime
    cupy.cuda = cuda_mod
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda_mod), ("cupy.cuda.runtime", runtime)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_open_device_messages(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(DeviceUnavailable, match=r"^cupy is not installed .*pip install -r requirements-gpu-cuda\.txt"):
        cuda.open_device()

    def no_driver(error):
        raise error("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake_cupy(monkeypatch, no_driver)
    with pytest.raises(DeviceUnavailable, match=r"^no CUDA device: cudaErrorNoDevice: no CUDA-capable device"):
        cuda.open_device()
    fake_cupy(monkeypatch, lambda error: 0)
    with pytest.raises(DeviceUnavailable, match=r"^no CUDA device: cupy reports 0 devices"):
        cuda.open_device()
    fake_cupy(monkeypatch, lambda error: 2)
    with pytest.raises(DeviceUnavailable, match=r"^no CUDA device 2: cupy reports 2 \(0\.\.1\)"):
        cuda.open_device(device_index=2)


# -- pure helpers ---------------------------------------------------------------------------------


def host_expert(rng, fmts: tuple[str, str, str], d_model: int, d_ff: int) -> tuple[CpuExpert, list[np.ndarray]]:
    """The CPU reference backend's prepared expert and the decoded f32 gate, up, down."""
    shapes = ((d_ff, d_model), (d_ff, d_model), (d_model, d_ff))
    raws = [random_weight(rng, f, r, c) for f, (r, c) in zip(fmts, shapes, strict=True)]
    tensors = [TensorIn(f, s, raw) for f, s, raw in zip(fmts, shapes, raws, strict=True)]
    host = CpuBackend(use_numba=False).prepare_expert(*tensors)
    return host, [dequantize(raw, f, s) for f, s, raw in zip(fmts, shapes, raws, strict=True)]


def exact_forward(gate: np.ndarray, up: np.ndarray, down: np.ndarray, x: np.ndarray) -> np.ndarray:
    """f64 down(silu(gate·x) ⊙ up·x) of the decoded weights."""
    x = x.astype(np.float64)
    g, u = x @ gate.T.astype(np.float64), x @ up.T.astype(np.float64)
    with np.errstate(over="ignore"):  # e^-g = inf for g < -709: silu is -0 there, its limit
        return (g / (1.0 + np.exp(-g)) * u) @ down.T.astype(np.float64)


def test_device_layouts_and_bytes():
    rng = np.random.default_rng(161)
    host, _ = host_expert(rng, ("F16", "F16", "BF16"), 64, 32)
    assert len(host.gate_up) == 1 and cuda.device_format(host.gate_up[0], ("F16", "F16")) == "F16"
    assert cuda.expert_device_bytes(host, ("F16", "F16", "BF16")) == 3 * 64 * 32 * 2
    mixed, _ = host_expert(rng, ("F16", "BF16", "F32"), 64, 32)  # stacked on the host (all f32 there)
    assert len(mixed.gate_up) == 1 and cuda.device_format(mixed.gate_up[0], ("F16", "BF16")) == "F32"
    assert cuda.expert_device_bytes(mixed, ("F16", "BF16", "F32")) == 3 * 64 * 32 * 4
    blocks, _ = host_expert(rng, ("Q4_K", "Q6_K", "Q8_0"), 256, 256)
    assert len(blocks.gate_up) == 2
    assert cuda.expert_device_bytes(blocks, ("Q4_K", "Q6_K", "Q8_0")) == 256 * (144 + 210 + 8 * 34)
    f16 = host.gate_up[0].data
    assert np.array_equal(cuda.narrow(f16, "F16").view(np.float16).astype(np.float32), f16)
    with pytest.raises(ValueError, match="not exactly BF16"):
        cuda.narrow(f16 + np.float32(1e-3), "BF16")
    with pytest.raises(ValueError, match="types must be"):
        cuda.expert_device_bytes(host, ("F16", "F16"))


def test_oom_is_the_only_nonfatal_error():
    class CUDARuntimeError(RuntimeError):
        def __init__(self, status):
            self.status = status

    class CUBLASError(CUDARuntimeError):
        pass

    assert cuda._is_oom(MemoryError("Out of memory allocating 1,024 bytes"))
    assert cuda._is_oom(CUDARuntimeError(2)) and cuda._is_oom(CUBLASError(3))
    assert not cuda._is_oom(CUDARuntimeError(700))  # cudaErrorIllegalAddress
    assert not cuda._is_oom(CUBLASError(13))  # CUBLAS_STATUS_EXECUTION_FAILED


@pytest.mark.parametrize("fmts", [("F32",) * 3, ("Q4_K",) * 3, ("Q6_K", "Q8_0", "F16")])
def test_error_bound_holds_for_the_cpu_reference(fmts):
    rng = np.random.default_rng(162)
    host, (gate, up, down) = host_expert(rng, fmts, 512, 256)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    y = CpuBackend(use_numba=False).forward(host, x)
    exact = exact_forward(gate, up, down, x)
    bound = expert_error_bound(gate, up, down, x)
    assert (np.abs(y - exact) <= bound).all()
    assert bound.max() < 1e-2 * np.abs(exact).max()  # tight enough that a wrong decode fails it


# -- on a CUDA device -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ops():
    try:
        device = cuda.open_device()
    except DeviceUnavailable as exc:
        # the only skip the suite permits: "no CUDA device: <cupy's error>" or "cupy is not installed …"
        pytest.skip(f"CUDA backend tests need an NVIDIA device: {exc}")
    yield device
    device.close()


FORMAT_MIXES = [("F32",) * 3, ("F16",) * 3, ("BF16",) * 3, ("Q8_0",) * 3, ("Q4_K",) * 3, ("Q6_K",) * 3,
                ("Q4_K", "Q6_K", "Q8_0"), ("F16", "BF16", "Q6_K"), ("Q8_0", "Q8_0", "BF16")]


def check_forward(ops, fmts, d_model, d_ff, t, seed):
    rng = np.random.default_rng(seed)
    host, (gate, up, down) = host_expert(rng, fmts, d_model, d_ff)
    handle = ops.upload(host, fmts)
    x = rng.standard_normal((t, d_model)).astype(np.float32)
    y = ops.forward(handle, x)
    ops.release(handle)
    assert y.shape == (t, d_model) and y.dtype == np.float32 and y.flags.c_contiguous
    exact = exact_forward(gate, up, down, x)
    bound = expert_error_bound(gate, up, down, x)
    cpu = CpuBackend(use_numba=False).forward(host, x)
    assert (np.abs(y - exact) <= bound).all(), f"{fmts} t={t}: {float((np.abs(y - exact) - bound).max())} over"
    assert (np.abs(y - cpu) <= 2 * bound).all()  # both within `bound` of the exact forward


@pytest.mark.parametrize("t", [1, 2, 3, 8, 64, 512])
@pytest.mark.parametrize("fmts", FORMAT_MIXES, ids="-".join)
def test_forward_matches_cpu(ops, fmts, t):
    check_forward(ops, fmts, 512, 256, t, seed=170 + t)


@pytest.mark.parametrize("t", [3, 9])
def test_dense_odd_sizes_and_many_tiles(ops, monkeypatch, t):
    monkeypatch.setattr(cuda, "TILE_BYTES", 4 * 72 * 7)  # 7-row tiles of gate|up, 12-row of down: last partial
    for fmts in (("F16", "F16", "BF16"), ("F32", "F32", "F16")):
        check_forward(ops, fmts, 72, 40, t, seed=180 + t)
    monkeypatch.setattr(cuda, "TILE_BYTES", 256 * 4 * 5)  # 5 rows a tile, the last tile partial
    check_forward(ops, ("Q4_K", "Q6_K", "Q8_0"), 256, 256, t, seed=190 + t)


GROUPS = [(("Q8_0",) * 3, (1, 5, 2)), (("Q4_K", "Q4_K", "Q6_K"), (8, 3)), (("F16", "F16", "BF16"), (2, 2, 1, 4)),
          (("F32",) * 3, (1, 2)), (("Q8_0",) * 3, (1, 9))]  # the last two are not grouped: F32, a batch of 9


def check_group(ops, fmts, sizes, seed, *, mixed=False):
    """forward_group over experts of `fmts` with `sizes` rows each: every answer within its f32
    bound, and equal bit for bit to the expert's own forward (a grouped launch computes each
    expert's products exactly as mv<T> does). mixed: the last expert in other formats."""
    rng = np.random.default_rng(seed)
    experts, handles, xs = [], [], []
    for i, t in enumerate(sizes):
        f = ("Q6_K", "Q6_K", "Q8_0") if mixed and i == len(sizes) - 1 else fmts
        host, weights = host_expert(rng, f, 256, 256)
        experts.append(weights)
        handles.append(ops.upload(host, f))
        xs.append(rng.standard_normal((t, 256)).astype(np.float32))
    ys = ops.forward_group(handles, xs)
    for (gate, up, down), h, x, y in zip(experts, handles, xs, ys, strict=True):
        assert y.shape == x.shape and y.dtype == np.float32
        assert (np.abs(y - exact_forward(gate, up, down, x)) <= expert_error_bound(gate, up, down, x)).all()
        assert np.array_equal(y, ops.forward(h, x))
        ops.release(h)


@pytest.mark.parametrize(("fmts", "sizes"), GROUPS, ids=lambda v: "-".join(map(str, v)))
def test_grouped_forward_equals_each_experts_own(ops, fmts, sizes):
    check_group(ops, fmts, sizes, seed=230 + sum(sizes))


def test_grouped_forward_of_mixed_formats_runs_expert_by_expert(ops):
    check_group(ops, ("Q8_0",) * 3, (2, 3, 1), seed=240, mixed=True)


def test_bad_input_and_timing(ops):
    rng = np.random.default_rng(200)
    host, _ = host_expert(rng, ("Q4_K",) * 3, 256, 256)
    handle = ops.upload(host, ("Q4_K",) * 3)
    with pytest.raises(ValueError, match=r"x must be f32 \[t >= 1, 256\]"):
        ops.forward(handle, np.zeros((2, 128), dtype=np.float32))
    seconds = cuda_timing.time_forward(ops, handle, rng.standard_normal((4, 256)).astype(np.float32), reps=3)
    assert seconds > 0
    assert issubclass(DeviceError, RuntimeError)
    ops.release(handle)


# -- the orchestration on an emulated device ------------------------------------------------------
# A stand-in `cupy` whose arrays are host numpy arrays and whose kernels are emulated with the
# host-compiled decoders: it runs cuda.py's Python side (layouts, transposes, tiles, argument
# order and C types of every launch, the self-test) where no GPU exists. It says nothing about
# the kernels' device code, which only the tests above (decoders, PTX) and the GPU tests check.

SIGNATURES = {"mv": (None, np.int64, np.int32, np.int32, None, np.int32, None),
              "gmv": (None, np.int64, np.int32, np.int32, None, None, None),
              "dq": (None, np.int64, np.int32, np.int32, np.int32, None),
              "silu_mul": (None, None, None, np.int64),
              "silu_mul_rows": (None, None, None, np.int32, np.int32, np.int64)}


WEIGHTS: dict[int, np.ndarray] = {}  # emulated device address -> the array uploaded there
LAUNCHED: list[str] = []  # kernel names, in launch order


class DevArray(np.ndarray):
    @property
    def data(self):  # cupy's MemoryPointer: .ptr is the device address
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self, stream=None, out=None, blocking=True):
        if out is None:
            return np.array(self)
        assert out.shape == self.shape and out.dtype == self.dtype and blocking
        out[...] = self
        return out

    def set(self, arr, stream=None):
        assert arr.shape == self.shape and arr.dtype == self.dtype
        self[...] = arr


class Ctx:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


def emulated_cupy(monkeypatch, lib) -> None:
    mods = {n: types.ModuleType(n) for n in ("cupy", "cupyx", "cupy.cuda", "cupy.cuda.runtime", "cupy.cuda.memory",
                                             "cupy.cuda.driver", "cupy.cublas", "cupy_backends",
                                             "cupy_backends.cuda", "cupy_backends.cuda.libs",
                                             "cupy_backends.cuda.libs.cublas")}
    cp, cc = mods["cupy"], mods["cupy.cuda"]
    WEIGHTS.clear()  # it holds every array uploaded, so no address is reused while it names one
    cp.float32 = np.float32
    mods["cupyx"].empty_pinned = lambda size, dtype: np.full(size, 0xAB, dtype=dtype)  # a plain host array here

    def asarray(a):
        arr = np.array(a).view(DevArray)
        WEIGHTS[arr.ctypes.data] = arr  # a grouped launch finds each expert's weights by address
        return arr

    cp.asarray = asarray
    cp.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(DevArray)
    cp.empty = lambda shape, dtype: np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1,  # unwritten shows
                                            dtype=dtype).view(DevArray)

    def gemm(ta, tb, a, b, out):
        assert ta == "N" and tb in ("N", "T") and a.dtype == b.dtype == out.dtype == np.float32
        out[...] = a.astype(np.float64) @ (b.T if tb == "T" else b).astype(np.float64)

    mods["cupy.cublas"].gemm = gemm
    cp.cublas = mods["cupy.cublas"]
    for name in ("runtime", "memory", "driver"):
        setattr(cc, name, mods[f"cupy.cuda.{name}"])
    cc.runtime.CUDARuntimeError = type("CUDARuntimeError", (RuntimeError,), {})
    cc.runtime.getDeviceCount = lambda: 1
    cc.runtime.getDeviceProperties = lambda i: {"name": b"Emulated", "totalGlobalMem": 1 << 30, "major": 9,
                                                "minor": 0}
    cc.memory.OutOfMemoryError = type("OutOfMemoryError", (MemoryError,), {})
    cc.driver.CUDADriverError = type("CUDADriverError", (RuntimeError,), {})
    mods["cupy_backends.cuda.libs.cublas"].CUBLASError = type("CUBLASError", (RuntimeError,), {})
    mods["cupy_backends.cuda.libs"].cublas = mods["cupy_backends.cuda.libs.cublas"]
    cc.Device = cc.Stream = cc.using_allocator = Ctx
    cc.MemoryPool = type("MemoryPool", (), {"malloc": None, "free_all_blocks": lambda self: None})
    cp.cuda = cc

    def decode(fmt: str, w: np.ndarray, rows: slice, n: int) -> np.ndarray:
        if fmt in ("f16", "bf16"):
            w16 = w.reshape(-1, n)[rows]
            return (w16.view(np.float16).astype(np.float32) if fmt == "f16"
                    else (w16.astype(np.uint32) << 16).view(np.float32))
        return host_decode(lib, fmt.upper(), np.array(w.view(np.uint8).reshape(-1, w.shape[-1])[rows]))

    def kernel(name: str):
        op, fmt = name[3:].split("_", 1) if "silu" not in name else (name[3:], "")
        bucket = 0
        if op.startswith(("mv", "gmv")):
            op, bucket = op.rstrip("1248"), int(op.lstrip("gmv"))
            assert bucket in cuda.MV_ROWS, name

        def launch(grid, block, args, stream=None):
            LAUNCHED.append(name)
            kinds = SIGNATURES[op]
            assert len(args) == len(kinds), name
            for arg, kind in zip(args, kinds, strict=True):
                assert isinstance(arg, DevArray) if kind is None else type(arg) is kind, f"{name}: {arg!r}"
            if op == "mv":  # token-major x [t, n] -> y [t, m]; the smallest bucket that holds t
                w, _, m, n, x, t, y = args
                assert x.shape == (t, n) and y.shape == (t, m) and t <= bucket and bucket // 2 < t, name
                assert grid == (-(-m // (4 * cuda.MV_ROWS[bucket])),) and block == (128,), (name, grid, block)
                y[...] = x.astype(np.float64) @ decode(fmt, w, slice(0, m), int(n)).T
            elif op == "gmv":  # expert e = grid y: weights at address ws[e], rows offs[e] .. offs[e+1]
                ws, _, m, n, x, offs, y = args
                k = len(ws)
                assert offs.shape == (k + 1,) and offs[0] == 0 and offs[-1] == len(x) == len(y), name
                assert (np.diff(offs) <= bucket).all() and bucket // 2 < np.diff(offs).max(), name
                assert grid == (-(-m // (4 * cuda.MV_ROWS[bucket])), k) and block == (128,), (name, grid, block)
                for e in range(k):
                    r = slice(int(offs[e]), int(offs[e + 1]))
                    y[r] = x[r].astype(np.float64) @ decode(fmt, WEIGHTS[int(ws[e])], slice(0, m), int(n)).T
            elif op == "silu_mul_rows":  # g, u [t, ld] views (the halves of one stacked product, or two)
                g, u, h, cols, rows, ld = args
                assert h.shape == (rows, cols) and g.shape[0] == u.shape[0] == rows, name
                assert g.strides[0] == u.strides[0] == 4 * ld, name
                gg, uu = g[:, :cols], u[:, :cols]
                with np.errstate(over="ignore"):
                    h[...] = gg / (1.0 + np.exp(-gg.astype(np.float64))) * uu
            elif op == "dq":
                w, _, n, r0, rows, out = args
                out[...] = decode(fmt, w, slice(int(r0), int(r0 + rows)), int(n))
            else:
                g, u, h, count = args
                assert g.size == u.size == h.size == count
                with np.errstate(over="ignore"):
                    h[...] = g / (1.0 + np.exp(-g.astype(np.float64))) * u

        return launch

    cp.RawModule = lambda code, options: types.SimpleNamespace(get_function=kernel)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize("t", [1, 8, 9, 64])
def test_orchestration_on_emulated_device(monkeypatch, host_lib, t):
    emulated_cupy(monkeypatch, host_lib)
    monkeypatch.setattr(cuda, "TILE_BYTES", 4 * 512 * 7)  # several tiles, the last one partial
    ops = cuda.open_device()  # runs the self-test through the emulator
    assert (ops.kind, ops.device_name, ops.memory_total_bytes) == ("cuda", "Emulated", 1 << 30)
    for fmts in FORMAT_MIXES:
        check_forward(ops, fmts, 512, 256, t, seed=210 + t)
    check_forward(ops, ("F16", "F16", "BF16"), 72, 40, t, seed=220 + t)
    LAUNCHED.clear()
    for fmts, sizes in GROUPS:
        check_group(ops, fmts, [min(t, s) for s in sizes], seed=225 + t)
    grouped = {name for name in LAUNCHED if name.startswith("tz_gmv")}
    assert grouped == ({"tz_gmv1_q8_0", "tz_gmv1_q4_k", "tz_gmv1_q6_k", "tz_gmv1_f16", "tz_gmv1_bf16"} if t == 1 else
                       {"tz_gmv8_q8_0", "tz_gmv8_q4_k", "tz_gmv8_q6_k", "tz_gmv4_f16", "tz_gmv4_bf16"}), grouped
    LAUNCHED.clear()
    check_group(ops, ("Q8_0",) * 3, (1, 2), seed=226, mixed=True)
    assert not any(name.startswith("tz_gmv") for name in LAUNCHED)
    ops.close()
