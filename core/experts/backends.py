"""The compute seam: every expert matmul ``Y = X·Wᵀ`` goes through a ComputeBackend.

A backend owns the in-memory form of an expert's weights (`prepare_expert`) and the SwiGLU
forward over it (`forward`), so a GPU backend is a drop-in: it uploads in `prepare_expert`
and keeps the intermediate [t, d_ff] activations on the device. The CPU backend is always
present:

* dense (F32/F16/BF16 payloads): widened once to f32 C-contiguous at load, then BLAS sgemm
  through numpy; gate and up are stacked into one [2·d_ff, d_model] matrix so one sgemm
  reads x once and a small batch gets a wider, more efficient GEMM.
* block-quantized (Q8_0/Q4_K/Q6_K): raw GGML blocks stay as loaded. Batches up to
  `fused_max_rows` take a fused kernel that reads each block once per chunk of tokens:
  - the C kernels (core/experts/_quant_matmul.c, built by setup.py), as llama.cpp does on CPUs: the
    activation rows are quantized to int8 blocks (Q8_0: 32 values, K-quants: 256) and dotted
    with the weight blocks in integer SIMD (AVX-512 VNNI / AVX-VNNI / AVX2, picked for the CPU
    at import, or a portable scalar loop). A whole expert is one C call: x quantized once for
    the stacked gate|up weights, silu·up and its quantization in C, then down; row tiles go
    to a persistent pool of worker threads, GIL released. Quantizing the activations adds a
    relative error of ~1-2% per expert (tests/experts/test_ffn.py derives the bounds), as
    llama.cpp's Q8_0 x Q8_0 does and as the Q8_0 wire format between nodes already does.
  - else the numba kernels, which dequantize each block to f32 and dot it with f32 x (exact
    up to f32 rounding, but compute-bound at ~3-5 G weights/s).
  Larger batches take the tiled path: dequantize row tiles to f32 (bit-identical to gguf's
  decoder) into a per-thread reused buffer and sgemm each tile straight into rows of yᵀ. The
  arithmetic is the f32 path's plus a dequantize of 4-7x fewer bytes (~2-5% of the sgemm time
  at batch 512). Tiles are as large as _TILE_BYTES allows (whole matrices for Qwen3 dims, 1024+
  rows for DeepSeek-V3), because every sgemm call repacks all of x: the old ~1 MiB tiles (36
  rows at d_model 7168) ran the tiled path at 1.5-2.5x the f32 path. The dequantizer is the C
  one on the pool (GIL released) when the extension is built, else numba's (under the kernel
  lock), else numpy's. bench/runtime.py, batch 256-512: ~0.95-1.15x the f32 path.
  The fused C kernels work through the tokens 8 at a time re-reading each weight tile from
  cache; crossover table: 0.2-0.25x the tiled time at batch 8, 0.6-0.75x at 32; at 128
  DeepSeek-V3 dims are ~0.95x and Qwen3 dims ~1.05-1.2x (the faster tiles moved its crossover
  below 128); at 256 tiles win on both (1.1-1.3x). fused_max_rows = 128 is kept: the fused
  path's loss at Qwen3 dims and batch 128 is within the timing noise of this VM's runs.
  Without numba or the C kernels (``use_numba=False``), every batch takes the tiled path
  with the numpy dequantizer: the exact reference path.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from core.experts.errors import InvalidPayload
from core.formats.expert_activation import SILU, ExpertActivation
from core.quantization.f16 import F16_TO_F32
from core.quantization.types import GGMLType, row_bytes

try:  # the C kernels; a machine that could not compile them falls back to numba
    from core.experts import _quant_matmul
except ImportError:
    _quant_matmul = None

BLOCK_TYPES = tuple(t.value for t in GGMLType if t.is_block)  # ("Q8_0", "Q4_K", "Q6_K")
DENSE_TYPES = tuple(t.value for t in GGMLType if not t.is_block)  # ("F32", "F16", "BF16")
_TILE_BYTES = 32 << 20  # f32 tile per sgemm in the large-batch path; see _tile_rows
# A C matmul gets one thread per this many multiply-adds (at most `threads`): waking a parked
# pool worker costs ~5-20 us on this VM, about what 256K int8 MACs take on one core.
_C_MIN_MACS_PER_THREAD = 1 << 18
# One multi-expert C call's scratch (each expert's quantized rows and f32 intermediates) at most this:
# the calling thread keeps its scratch for the next call, and a frame of many large batches would
# otherwise leave hundreds of MB behind it. A decode step's or a prefill's frame is one call.
_C_GROUP_SCRATCH_BYTES = 32 << 20
# Batches up to this size take the fused kernels; see the module docstring. numba's f32 kernels
# are compute-bound and lose to BLAS tiles much earlier.
FUSED_MAX_ROWS = {"c": 128, "numba": 8}


@dataclass(frozen=True)
class TensorIn:
    """One projection as loaded: ggml_type, logical shape (rows, n) and its raw bytes (u8)."""

    ggml_type: str
    shape: tuple[int, int]
    data: np.ndarray


@runtime_checkable
class ComputeBackend(Protocol):
    """What the runtime needs from a compute backend.

    prepare_expert(gate, up, down) -> an opaque prepared expert with an ``nbytes`` attribute
        (bytes it holds in host memory; the memory tier budgets those).
        gate/up: [d_ff, d_model]; down: [d_model, d_ff]. Raises InvalidPayload.
    forward(prepared, x f32 [t, d_model] C-contiguous finite) -> f32 [t, d_model]
        = down(silu(gate·x) ⊙ up·x). Must be callable from several threads at once.

    A backend that also runs other GLUs or biased projections (docs/formats.md, "Expert payload")
    lists them in ``activations`` and sets ``biases = True``; its prepare_expert then takes the
    keywords ``activation`` (core.formats.expert_payload.ExpertActivation) and ``biases``. Without
    those attributes a backend runs plain SiLU experts only, and core.experts.ffn refuses the others
    for it with InvalidPayload (the GPU backends today).

    A backend that computes several experts in one call (the GPU backends, the CPU's C kernels) has
    ``forward_many([(prepared, x)…]) -> [y…]`` and says ``groups_experts = True`` while it can;
    the runtime then runs a multi-expert request as one such call.
    """

    name: str
    is_gpu: bool
    cpu_kernel: str

    def prepare_expert(self, gate: TensorIn, up: TensorIn, down: TensorIn) -> Any: ...

    def forward(self, prepared: Any, x: np.ndarray) -> np.ndarray: ...


# --- CPU backend --------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuWeight:
    """f32 [m, n] C-contiguous (dense) or u8 [m, row_bytes] raw blocks (block types)."""

    ggml_type: str  # "F32" for every dense payload (widened at load) or a block type
    shape: tuple[int, int]
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True)
class CpuExpert:
    """gate_up: stacked [2·d_ff, d_model] when gate and up share a format, else (gate, up).
    gate_up_bias f32 [2·d_ff] and down_bias f32 [d_model], or None (docs/formats.md, "Expert payload")."""

    gate_up: tuple[CpuWeight, ...]
    down: CpuWeight
    d_ff: int
    activation: ExpertActivation = SILU
    gate_up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        biases = sum(b.nbytes for b in (self.gate_up_bias, self.down_bias) if b is not None)
        return sum(w.nbytes for w in self.gate_up) + self.down.nbytes + biases


def quant_matmul_variants() -> list[str]:
    """The C kernel variants this CPU can run, best first ([] when the extension is missing)."""
    return list(_quant_matmul.variants()) if _quant_matmul is not None else []


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_isa() -> str:
    """The best SIMD level the CPU reports ('avx512_vnni', 'avx512f', 'avx2', 'baseline')."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "baseline"
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    for isa in ("avx512_vnni", "avx512f", "avx2"):
        if isa in flags:
            return isa
    return "baseline"


def _silu_mul(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g)·u, overwriting g and u (returns g): silu(g) = g/2·(1 + tanh(g/2)).

    tanh rather than g/(1 + e^-g): e^-g overflows for g << 0, and numpy's exp takes a slow
    path on overflow (measured 3x slower on large activations); tanh saturates instead. Five
    in-place passes, no temporaries; the halving is exact.
    """
    g *= 0.5
    u *= g
    np.tanh(g, out=g)
    g += 1.0
    g *= u
    return g


def _clamped_swiglu(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's GLU, overwriting g and u (returns g): g' = min(g, limit), u' = clip(u, ±limit),
    g'·sigmoid(alpha·g')·(u' + 1), with sigmoid(z) = (1 + tanh(z/2))/2 (no overflow for g' << 0)."""
    np.minimum(g, np.float32(limit), out=g)
    np.clip(u, np.float32(-limit), np.float32(limit), out=u)
    u += 1.0
    u *= g
    g *= np.float32(alpha / 2)
    np.tanh(g, out=g)
    g += 1.0
    g *= 0.5
    g *= u
    return g


def _glu(activation: ExpertActivation, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    if activation.kind == "clamped_swiglu":
        return _clamped_swiglu(g, u, activation.alpha, activation.limit)
    return _silu_mul(g, u)


def _tile_rows(m: int, n: int) -> int:
    """Rows per f32 tile of the large-batch path: the whole matrix when it fits _TILE_BYTES,
    else equal tiles under it (the last one not a sliver).

    Large tiles because each sgemm call packs all of x again (t·n floats) and OpenBLAS splits a
    call's rows over its threads: measured at t 256-512 on 2 cores, 64-128-row tiles ran at
    1.2-2x the time of one whole-matrix sgemm, 512-1024-row tiles within ~10% of it. 32 MiB
    gives 1024+ rows for n up to 8192 (DeepSeek-V3 gate|up: 4 tiles of 1024 rows, 28 MiB)."""
    per_row = 4 * n
    if m * per_row <= _TILE_BYTES:
        return max(1, m)
    tiles = -(-m * per_row // _TILE_BYTES)
    return -(-m // tiles)


_TRANSPOSE_ROWS = 64  # rows of yᵀ per block: numpy's strided copy thrashes the cache on whole arrays


def _c_order(y: np.ndarray) -> np.ndarray:
    """y [t, m] as a C-contiguous array. The dense path leaves yᵀ C-contiguous (y F-order): copy
    it in blocks of columns, ~2-3x faster than one np.ascontiguousarray (measured at t 64-512)."""
    if y.flags.c_contiguous:
        return y
    out = np.empty(y.shape, dtype=np.float32)
    for c0 in range(0, y.shape[1], _TRANSPOSE_ROWS):
        out[:, c0 : c0 + _TRANSPOSE_ROWS] = y[:, c0 : c0 + _TRANSPOSE_ROWS]
    return out


def _fused_expert(prepared: CpuExpert) -> bool:
    """Whether the C kernels run this expert in one call: gate and up stacked, all block types (the
    call adds the biases and computes either GLU itself)."""
    return len(prepared.gate_up) == 1 and prepared.gate_up[0].ggml_type in BLOCK_TYPES and (
        prepared.down.ggml_type in BLOCK_TYPES)


_C_GLU = {"silu": 0, "clamped_swiglu": 1}  # _quant_matmul.expert's glu argument


def _scratch_groups(fused: list[tuple[int, CpuExpert, np.ndarray]]) -> list[list[int]]:
    """The fused experts' indices in order, cut into runs whose C scratch stays under
    _C_GROUP_SCRATCH_BYTES (an expert over it is a run of its own)."""
    groups: list[list[int]] = []
    room = 0
    for i, prepared, x in fused:
        # int8 rows and their scales for x and h, and the f32 gate|up rows (the C call's own layout, rounded up)
        need = x.shape[0] * (2 * prepared.down.shape[0] + 10 * prepared.d_ff) + 1024
        if not groups or need > room:
            groups.append([])
            room = _C_GROUP_SCRATCH_BYTES
        groups[-1].append(i)
        room -= need
    return groups


class CpuBackend:
    """Dense f32 via BLAS; block formats via the C or numba kernels (or numpy tiles).

    use_numba=False: no compiled kernels at all (C or numba), the exact numpy reference path.
    c_variant: the C kernel variant ("avx512vnni", "avxvnni", "avx2", "scalar"); None means
        $TENZRO_QDOT_VARIANT or else the best this CPU runs; "off" uses numba instead.
        Raises ValueError for a variant the CPU cannot run.
    threads: threads per C matmul (default $TENZRO_QDOT_THREADS or the CPUs this process
        may use); small matmuls run on fewer, down to one.
    fused_max_rows: the largest batch for the fused kernels (default FUSED_MAX_ROWS for the C
        or numba kernels); larger ones take the tiles.
    """

    name = "cpu"
    is_gpu = False
    activations = ("silu", "clamped_swiglu")  # what prepare_expert's `activation` may be
    biases = True  # prepare_expert takes `biases`

    def __init__(self, *, use_numba: bool = True, fused_max_rows: int | None = None, c_variant: str | None = None,
                 threads: int | None = None) -> None:
        self.isa = cpu_isa()
        self._kernels: Any = None
        self._c_variant: str | None = None
        self._threads = max(1, threads or int(os.environ.get("TENZRO_QDOT_THREADS") or 0) or _cpu_count())
        if use_numba:
            variant = (c_variant or os.environ.get("TENZRO_QDOT_VARIANT") or "").lower()
            available = quant_matmul_variants()
            if variant not in ("", "off") and variant not in available:
                raise ValueError(f"C kernel variant {variant!r} is not available here (available: {available})")
            if variant != "off" and available:
                self._c_variant = variant or available[0]
            try:
                from core.experts import numba_matmul
            except ImportError:  # numba missing or broken: the C kernels or numpy tiles still work
                numba_matmul = None
            self._kernels = numba_matmul
        default_rows = FUSED_MAX_ROWS["c" if self._c_variant else "numba"]
        self.fused_max_rows = default_rows if fused_max_rows is None else fused_max_rows
        self._lut = F16_TO_F32 if self._kernels else None
        # numba's default "workqueue" threading layer aborts on concurrent parallel launches
        # from two Python threads; one launch already uses every core, so serializing costs
        # nothing. Dense BLAS calls run unlocked.
        self._kernel_lock = threading.Lock()
        self._tiles = threading.local()  # the large-batch path's f32 tile buffer, per calling thread
        # what the fused (small-batch) path runs; numba compiles for the host CPU (LLVM picks
        # the widest vectors the ISA allows)
        if self._c_variant:
            self.cpu_kernel = f"c-{self._c_variant}"
        else:
            self.cpu_kernel = f"numba-{self.isa}" if self._kernels else "numpy-tiled"

    # -- load --------------------------------------------------------------------------------

    def prepare_expert(self, gate: TensorIn, up: TensorIn, down: TensorIn, *, activation: ExpertActivation = SILU,
                       biases: dict[str, np.ndarray] | None = None) -> CpuExpert:
        """biases: {} / None or {"gate", "up": f32 [d_ff], "down": f32 [d_model]} (checked by the payload
        reader, core.formats.expert_payload)."""
        g, u, d = (self._prepare(t) for t in (gate, up, down))
        d_ff, d_model = g.shape
        if g.ggml_type == u.ggml_type:
            stacked = np.concatenate([g.data, u.data], axis=0)  # one copy, at load only
            gate_up: tuple[CpuWeight, ...] = (CpuWeight(g.ggml_type, (2 * d_ff, d_model), stacked),)
        else:
            gate_up = (g, u)
        if activation.kind not in self.activations:
            raise InvalidPayload(f"activation {activation.kind!r} is not one the cpu backend runs {self.activations}")
        gu_bias = down_bias = None
        if biases:
            gu_bias = np.concatenate([biases["gate"], biases["up"]]).astype(np.float32)  # owned, [2·d_ff]
            down_bias = np.array(biases["down"], dtype=np.float32)
        return CpuExpert(gate_up=gate_up, down=d, d_ff=d_ff, activation=activation, gate_up_bias=gu_bias,
                         down_bias=down_bias)

    def _prepare(self, t: TensorIn) -> CpuWeight:
        from core.quantization.registry import dequantize  # dense widening (F16/BF16 -> f32)

        rows, n = t.shape
        try:
            nbytes = row_bytes(t.ggml_type, n)
        except ValueError as exc:
            raise InvalidPayload(f"{t.ggml_type} [{rows}, {n}]: {exc}") from exc
        raw = np.asarray(t.data)
        if raw.dtype != np.uint8:
            raw = np.ascontiguousarray(raw).view(np.uint8)
        if raw.size != rows * nbytes:
            raise InvalidPayload(f"{t.ggml_type} [{rows}, {n}] needs {rows * nbytes} bytes, received {raw.size}")
        raw = raw.reshape(rows, nbytes)
        if t.ggml_type in BLOCK_TYPES:
            # own the bytes: a view would pin the whole request payload in memory
            return CpuWeight(t.ggml_type, (rows, n), np.require(raw, requirements=["C", "O"]))
        if t.ggml_type not in DENSE_TYPES:
            raise InvalidPayload(f"unsupported ggml_type {t.ggml_type!r} (supported {DENSE_TYPES + BLOCK_TYPES})")
        dense = np.require(dequantize(raw, t.ggml_type, (rows, n)), dtype=np.float32, requirements=["C", "O"])
        if not np.isfinite(dense).all():
            raise InvalidPayload(f"{t.ggml_type} [{rows}, {n}] weights contain NaN/inf")
        return CpuWeight("F32", (rows, n), dense)

    # -- compute -----------------------------------------------------------------------------

    @property
    def groups_experts(self) -> bool:
        """Whether forward_many runs a multi-expert request's experts in one C call (the C kernels)."""
        return self._c_variant is not None

    def _fused_c(self, prepared: CpuExpert, x: np.ndarray) -> bool:
        return self._c_variant is not None and x.shape[0] <= self.fused_max_rows and _fused_expert(prepared)

    @staticmethod
    def _c_item(prepared: CpuExpert, x: np.ndarray) -> tuple[tuple[Any, ...], np.ndarray]:
        """_quant_matmul's arguments for one fused expert over x f32 [t, d_model], and its output y."""
        (gu,), down, act = prepared.gate_up, prepared.down, prepared.activation
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty((x.shape[0], down.shape[0]), dtype=np.float32)
        return (gu.ggml_type, gu.data, down.ggml_type, down.data, down.shape[0], prepared.d_ff, x, x.shape[0], y,
                _C_GLU[act.kind], act.alpha or 1.0, act.limit or 0.0, prepared.gate_up_bias, prepared.down_bias), y

    def forward_many(self, items: list[tuple[CpuExpert, np.ndarray]]) -> list[np.ndarray]:
        """[forward(prepared, x) for each item], bit for bit: a holder's multi-expert request. The experts
        the C kernels fuse run in one call, whose pool workers wake twice for all of them instead of
        twice per expert, with no Python in between; the others one by one."""
        out: list[np.ndarray | None] = [None] * len(items)
        for group in _scratch_groups([(i, prepared, x) for i, (prepared, x) in enumerate(items)
                                      if self._fused_c(prepared, x)]):
            if len(group) < 2:
                continue  # one expert: forward() below
            calls = [self._c_item(*items[i]) for i in group]
            _quant_matmul.experts(self._c_variant, self._threads, _C_MIN_MACS_PER_THREAD, [a for a, _ in calls])
            for i, (_, y) in zip(group, calls, strict=True):
                out[i] = y
        return [y if y is not None else self.forward(*item) for y, item in zip(out, items, strict=True)]

    def forward(self, prepared: CpuExpert, x: np.ndarray) -> np.ndarray:
        d_ff = prepared.d_ff
        if self._fused_c(prepared, x):
            # the whole expert in one C call: x quantized once for gate and up, silu·up in C
            args, y = self._c_item(prepared, x)
            _quant_matmul.expert(*args[:9], self._c_variant, self._threads, _C_MIN_MACS_PER_THREAD, *args[9:])
            return y
        if len(prepared.gate_up) == 1:
            gu = self.matmul(x, prepared.gate_up[0])  # [t, 2·d_ff], fresh, so ours to overwrite
            if prepared.gate_up_bias is not None:
                gu += prepared.gate_up_bias
            g, u = gu[:, :d_ff], gu[:, d_ff:]
        else:
            g, u = (self.matmul(x, w) for w in prepared.gate_up)
            if prepared.gate_up_bias is not None:
                g += prepared.gate_up_bias[:d_ff]
                u += prepared.gate_up_bias[d_ff:]
        y = _c_order(self.matmul(_glu(prepared.activation, g, u), prepared.down))
        if prepared.down_bias is not None:
            y += prepared.down_bias
        return y

    def matmul(self, x: np.ndarray, w: CpuWeight) -> np.ndarray:
        """f32 [t, n] · Wᵀ -> f32 [t, m]; the dense and tiled paths return an F-order view (of yᵀ
        from BLAS). x: f32 in either order; the fused kernels copy it to C order if needed."""
        if w.ggml_type == "F32":
            # (W·xᵀ)ᵀ rather than x·Wᵀ: OpenBLAS runs the tall-skinny product with W as the
            # row-major A operand ~25% faster at batches 8-64 (measured). Returns an F-order
            # view; the caller's elementwise ops and the next product accept it.
            return (w.data @ x.T).T
        t = x.shape[0]
        m, n = w.shape
        if t > self.fused_max_rows or (self._c_variant is None and self._kernels is None):
            return self._tiled(x, w)  # BLAS takes x in either order: no copy
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self._c_variant is not None:
            y = np.empty((t, m), dtype=np.float32)
            threads = max(1, min(self._threads, t * m * n // _C_MIN_MACS_PER_THREAD))
            # no lock: each calling thread has its own scratch, and the GIL is released inside
            _quant_matmul.matmul(w.ggml_type, w.data, m, n, x, t, y, self._c_variant, threads)
            return y
        y = np.empty((t, m), dtype=np.float32)
        with self._kernel_lock:
            # Q8_0's kernel reads the blocks as int8 (a view, see numba_matmul.q8_0_matmul)
            data = w.data.view(np.int8) if w.ggml_type == "Q8_0" else w.data
            self._kernels.MATMUL[w.ggml_type](data, x, self._lut, y)
        return y

    def _tiled(self, x: np.ndarray, w: CpuWeight) -> np.ndarray:
        """Dequantize row tiles into a reused f32 buffer and sgemm each into yᵀ; returns y [t, m]
        as an F-order view of yᵀ, like the dense path (so the same elementwise ops follow)."""
        m, n = w.shape
        x = np.asarray(x, dtype=np.float32)
        rows = _tile_rows(m, n)
        tile = self._tile_buffer(rows * n)
        y_t = np.empty((m, x.shape[0]), dtype=np.float32)
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            buf = tile[: (r1 - r0) * n].reshape(r1 - r0, n)
            self._dequant_rows(w, r0, buf)
            # written in place into contiguous rows of yᵀ: no copy of the product
            np.matmul(buf, x.T, out=y_t[r0:r1])
        return y_t.T

    def _tile_buffer(self, size: int) -> np.ndarray:
        """f32[size], one per calling thread, kept for its next call: a fresh multi-MiB buffer
        page-faults every page on first touch, a cost of the order of the dequantize itself at
        Qwen3 dims. Holds at most _TILE_BYTES (plus one row) per thread that ran a large batch."""
        buf = getattr(self._tiles, "buf", None)
        if buf is None or buf.size < size:
            buf = self._tiles.buf = np.empty(size, dtype=np.float32)
        return buf

    def _dequant_rows(self, w: CpuWeight, r0: int, out: np.ndarray) -> None:
        if self._c_variant is not None:
            # the C dequantizer on the pool (GIL released, bit-identical to gguf's)
            m, n = w.shape
            _quant_matmul.dequantize(w.ggml_type, w.data, m, n, r0, r0 + out.shape[0], out, self._c_variant,
                             self._threads)
            return
        if self._kernels is not None:
            with self._kernel_lock:
                self._kernels.DEQUANT_ROWS[w.ggml_type](w.data, r0, self._lut, out)
            return
        from core.quantization.registry import dequantize

        r1 = r0 + out.shape[0]
        out[...] = dequantize(w.data[r0:r1], w.ggml_type, (r1 - r0, w.shape[1]))

