"""The CUDA device: CuPy (cupy-cuda12x[ctk]), cuBLAS and the kernels of cuda_kernels.cu.

Device layouts (per expert; gate|up stacked into one [2·d_ff, d_model] matrix when the host
form stacks them):
  F32 payload            f32 [m, n]              cuBLAS sgemm for every batch
  F16 payload            f16 bits [m, n] (u16)   2 bytes a weight, exact (the host f32 came from f16)
  BF16 payload           bf16 bits [m, n] (u16)  same; cuBLAS has no bf16 x f32 product, see below
  Q8_0 / Q4_K / Q6_K     the raw GGML blocks, u8 [m, row_bytes], uploaded as they are
  A stacked dense matrix whose halves came from different 16-bit types (F16 gate, BF16 up) is
  kept f32. The f32 -> f16/bf16 narrowing is checked to be exact at upload (ValueError if not:
  the types passed do not describe the host data).

Activations, by batch t: up to SMALL_BATCH (8) tokens, the decode batches, they stay
token-major as the host sends them, X [t, n], and every product writes Y [t, m]: upload x,
gate|up, silu(g)·u over rows, down, one device->host copy (`ndarray.get`, which waits for the
stream), no transpose. Larger batches are transposed on the device, X [n, t] C-contiguous
(column per token), so that each product is W[m, n]·X[n, t] -> Y[m, t] with row tiles
contiguous: upload x, transpose, gate|up, silu(g)·u, down, transpose, one copy back.

Products, by weight format and batch t:
  F32, any t              cupy.cublas.gemm -> cublasSgemm (f32 in, f32 accumulate, f32 out; no
                          TF32: sgemm runs CUBLAS_DEFAULT_MATH, TF32 needs a math mode we never set)
  other, t <= 8           tz_mv<T>_<fmt>, T the smallest of 1, 2, 4, 8 that holds t: fused
                          dequant-mat-vec, a warp per MV_ROWS[T] output rows, each lane decodes
                          its group of a block once per row and dots it with the t token rows of
                          X it loaded once for all of them, MV_UNROLL blocks in flight, shuffle
                          reduction (llama.cpp's dmmv scheme); fmaf accumulation
  group, each t <= 8      forward_group (a holder's multi-expert request): experts of one format
                          and shape go up as one block of rows and come back as one; tz_gmv<T>
                          runs every expert's mat-vec in one launch (blockIdx.y: the expert, its
                          weights' address and row range from a device table), each expert's
                          products bit for bit those of its own tz_mv<T>
  other, t > 8            tz_dq_<fmt> decodes row tiles to an f32 workspace (at most TILE_BYTES =
                          64 MiB, allocated once, reused), cublasSgemm of each tile into rows of Y
F16/BF16 with f32 activations: cublasGemmEx takes A and B of one type, so an f16 GEMM would
round the activations to f16 (2^-11 relative, overflow past 65504) and a bf16 one to bf16
(2^-8); cupy.matmul of two f16 arrays is such a GemmEx (f32 compute, tensor-op math) and
also writes f16 output. Decoding weight tiles to f32 instead keeps the products those of the
CPU path: the f32 bound below, no activation rounding; the cost is the tile decode, small next
to the GEMM at the batches that take this path.

Error bounds (tests/experts/test_gpu_cuda.py derives them; u = 2^-24):
  decode (tile and mat-vec) is bit-identical to gguf-py's dequantize: __fmul_rn/__fsub_rn in
  numpy's order, never contracted to FMA; f16/bf16 widening is exact.
  each length-n dot product: |ŷ - y| <= γ_n · Σ|w_i x_i|, γ_n = n·u/(1 - n·u) (any summation
  order: cuBLAS's, the warp's, the CPU's); silu(g)·u within 4u relative (expf <= 2 ulp, IEEE
  division). The test bounds the whole expert by propagating these through silu and down.

Errors: CuPy/CUDA/cuBLAS exceptions become DeviceError; out of memory (cupy OutOfMemoryError,
cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY, CUBLAS_STATUS_ALLOC_FAILED) is not fatal,
everything else is (illegal address, launch failure, ECC, a lost device leave the context
unusable; a deterministic failure would recur on every request).

open_device compiles the kernels (NVRTC) and runs a self-test on the device: every decoder
against the host decoder bit for bit, every mat-vec and the silu kernel against numpy, so a
kernel that misbehaves on some GPU makes the device unavailable instead of wrong.

Verified where: on an NVIDIA H200 (driver 580, CUDA 13, CuPy 14.2) tests/experts/
test_gpu_cuda.py's GPU tests and the self-test pass, and bench/gpu.py measured the kernels
(docs/performance.md, "The CUDA expert backend on an H200"). Without a GPU (the development
machines): the decoders compiled for the host (g++) match gguf-py bit for bit; nvcc --ptx
(sm_80) compiles the file with no warning and no FMA in the decode kernels; the Python side
(layouts, tiles, launch shapes and argument types, self-test) runs against an emulated cupy in
the tests.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from core.experts.backends import CpuExpert
from core.experts.gpu.cuda_layout import (
    HALF_FORMATS,
    SMALL_BATCH,
    CudaExpert,
    DeviceWeight,
    device_format,
    expert_device_bytes,
    groupable,
    narrow,
    split_types,
)
from core.experts.gpu.ops import DeviceError, DeviceUnavailable

KERNELS_PATH = Path(__file__).with_name("cuda_kernels.cu")
REQUIREMENTS_HINT = "pip install -r requirements-gpu-cuda.txt"
# Fused mat-vec kernels: {T: R}: the kernel for batches up to T tokens computes R output rows per
# warp (the x a lane loads serves R rows); MV_UNROLL: blocks of the k loop a warp has in flight.
# Passed to NVRTC as -D options (cuda_kernels.cu has the same defaults).
MV_ROWS = {1: 1, 2: 2, 4: 2, 8: 4}
MV_UNROLL = 4
TILE_BYTES = 64 << 20  # f32 dequantize workspace for the larger batches, shared by all experts
BLOCK_FORMATS = {"Q8_0": "q8_0", "Q4_K": "q4_k", "Q6_K": "q6_k"}  # ggml type -> kernel suffix
_SUFFIXES = (*BLOCK_FORMATS.values(), *HALF_FORMATS.values())
KERNEL_NAMES = (*(f"tz_{op}{t}_{s}" for op in ("mv", "gmv") for t in MV_ROWS for s in _SUFFIXES),
                *(f"tz_dq_{s}" for s in _SUFFIXES),
                "tz_silu_mul", "tz_silu_mul_rows")
_MV_WARPS = 4  # warps per mat-vec thread block
_GRID_CAP = 1 << 16  # grid-stride kernels: enough blocks to fill any GPU, no more


def _check_rows(handle: CudaExpert, x: np.ndarray) -> None:
    """ValueError unless x is f32 [t >= 1, d_model] for this expert."""
    d_model = handle.down.shape[0]
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] != d_model or x.dtype != np.float32:
        raise ValueError(f"x must be f32 [t >= 1, {d_model}], got {x.dtype} {list(x.shape)}")


def _is_oom(exc: BaseException) -> bool:
    """Whether a CuPy/CUDA/cuBLAS exception means out of device memory (cupy's
    OutOfMemoryError is a MemoryError; status 2 is cudaErrorMemoryAllocation and
    CUDA_ERROR_OUT_OF_MEMORY, 3 is CUBLAS_STATUS_ALLOC_FAILED)."""
    if isinstance(exc, MemoryError):
        return True
    status = getattr(exc, "status", None)
    name = type(exc).__name__
    return (name in ("CUDARuntimeError", "CUDADriverError") and status == 2) or (
        name == "CUBLASError" and status == 3)


def _cuda_errors() -> tuple[type[BaseException], ...]:
    from cupy.cuda import driver, memory, runtime
    from cupy_backends.cuda.libs import cublas

    return (memory.OutOfMemoryError, runtime.CUDARuntimeError, driver.CUDADriverError, cublas.CUBLASError)


class CudaOps:
    """DeviceOps for one CUDA device. Not thread-safe: the GPU backend serializes the calls."""

    kind = "cuda"
    software = False
    block_types = tuple(BLOCK_FORMATS)
    small_batch = SMALL_BATCH

    def __init__(self, device_index: int) -> None:
        import cupy
        import cupy.cublas  # not imported by `import cupy`
        from cupy.cuda import runtime

        self._cp = cupy
        self._gemm = cupy.cublas.gemm
        self._errors = _cuda_errors()
        self.device_index = device_index
        props = runtime.getDeviceProperties(device_index)
        name = props["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.memory_total_bytes: int | None = int(props["totalGlobalMem"])
        self.compute_capability = (int(props["major"]), int(props["minor"]))
        self._device = cupy.cuda.Device(device_index)
        with self._device:
            self._pool = cupy.cuda.MemoryPool()  # ours alone: close() hands all of it back
            self._stream = cupy.cuda.Stream(non_blocking=True)
            module = cupy.RawModule(code=KERNELS_PATH.read_text(), options=kernel_options())
            self._kernels = {name: module.get_function(name) for name in KERNEL_NAMES}  # compiles and loads now
        self._workspace: Any = None
        self._staging: dict[str, np.ndarray] = {}  # "in"/"out"/"meta": page-locked host bytes, grown, reused

    # -- context -----------------------------------------------------------------------------

    def _run(self, what: str, fn: Any, *args: Any) -> Any:
        """fn(*args) on this device, its stream and its memory pool; CUDA errors -> DeviceError."""
        cp = self._cp
        try:
            with self._device, self._stream, cp.cuda.using_allocator(self._pool.malloc):
                return fn(*args)
        except self._errors as exc:
            fatal = not _is_oom(exc)
            raise DeviceError(f"CUDA {what} on {self.device_name}: {type(exc).__name__}: {exc}", fatal=fatal) from exc
        except Exception as exc:  # anything else is a fault of this module: stop using the device, never crash
            raise DeviceError(f"CUDA {what} on {self.device_name} failed: {type(exc).__name__}: {exc}",
                              fatal=True) from exc

    # -- DeviceOps ---------------------------------------------------------------------------

    def device_bytes(self, host: CpuExpert, types: tuple[str, str, str]) -> int:
        return expert_device_bytes(host, types)

    def upload(self, host: CpuExpert, types: tuple[str, str, str]) -> CudaExpert:
        """ValueError when `types` do not match `host` (a caller's bug, not the device's)."""
        parts = []
        for w, kinds in split_types(host, types):
            fmt = device_format(w, kinds)
            parts.append((fmt, w.shape, narrow(w.data, fmt) if fmt in HALF_FORMATS else w.data))

        def put() -> CudaExpert:
            out = [DeviceWeight(fmt, shape, self._cp.asarray(data)) for fmt, shape, data in parts]
            self._stream.synchronize()  # surface any copy error here, not in a later forward
            return CudaExpert(gate_up=tuple(out[:-1]), down=out[-1], d_ff=host.d_ff)

        return self._run("upload", put)

    def forward(self, handle: CudaExpert, x: np.ndarray) -> np.ndarray:
        _check_rows(handle, x)
        return self._run("forward", self._forward, handle, np.ascontiguousarray(x))

    def forward_group(self, handles: list[CudaExpert], xs: list[np.ndarray]) -> list[np.ndarray]:
        """Several experts, each over its own rows (a holder's multi-expert request), as
        [forward(h, x) for each]. Experts of one format and shape (gate|up stacked, not F32) at
        decode batches (t <= SMALL_BATCH) run together: one upload of all rows, one grouped
        launch per product (tz_gmv: blockIdx.y picks the expert), one copy back, each expert's
        products those its own forward computes. Anything else runs expert by expert."""
        if len(handles) != len(xs):
            raise ValueError(f"{len(handles)} experts but {len(xs)} batches")
        for h, x in zip(handles, xs, strict=True):
            _check_rows(h, x)
        if not groupable(handles, xs):
            return [self.forward(h, x) for h, x in zip(handles, xs, strict=True)]
        return self._run("grouped forward", self._forward_group, handles, xs)

    def put_weight(self, fmt: str, shape: tuple[int, int], data: np.ndarray) -> DeviceWeight:
        """One matrix in its device form (u8 blocks, u16 bits or f32) on the device."""
        return self._run("upload", lambda: DeviceWeight(fmt, shape, self._cp.asarray(data)))

    def release(self, handle: CudaExpert) -> None:
        # the arrays go back to our pool when the last reference drops; nothing can fail here
        del handle

    def close(self) -> None:
        try:
            with self._device:
                self._workspace = None
                self._stream.synchronize()
                self._pool.free_all_blocks()
        except Exception:  # after a fatal error the context may refuse even this; nothing to do
            pass

    # -- compute -----------------------------------------------------------------------------

    def _forward(self, e: CudaExpert, x: np.ndarray) -> np.ndarray:
        cp = self._cp
        t = x.shape[0]
        if t <= SMALL_BATCH:  # token-major throughout: no transpose on the device
            x_rows = self._to_device(x)  # [t, d_model]
            if len(e.gate_up) == 1:
                gu = self.matvec(e.gate_up[0], x_rows)  # [t, 2·d_ff]
                g, u, ld = gu, gu[:, e.d_ff :], 2 * e.d_ff
            else:
                (g, u), ld = (self.matvec(w, x_rows) for w in e.gate_up), e.d_ff
            h = cp.empty((t, e.d_ff), dtype=cp.float32)
            self._launch("tz_silu_mul_rows", (min(_GRID_CAP, -(-(t * e.d_ff) // 256)),), (256,),
                         (g, u, h, np.int32(e.d_ff), np.int32(t), np.int64(ld)))
            return self._to_host(self.matvec(e.down, h))
        xt = cp.ascontiguousarray(self._to_device(x).T)  # [d_model, t]
        if len(e.gate_up) == 1:
            gu = self.matmul(e.gate_up[0], xt)  # [2·d_ff, t]
            g, u = gu[: e.d_ff], gu[e.d_ff :]
        else:
            g, u = (self.matmul(w, xt) for w in e.gate_up)
        h = cp.empty((e.d_ff, t), dtype=cp.float32)
        count = e.d_ff * t
        self._launch("tz_silu_mul", (min(_GRID_CAP, -(-count // 256)),), (256,), (g, u, h, np.int64(count)))
        y_t = self.matmul(e.down, h)  # [d_model, t]
        return self._to_host(cp.ascontiguousarray(y_t.T))

    def _pinned(self, which: str, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A page-locked host array of `shape` and `dtype`, a view of one staging buffer ("in",
        "out", "meta"). A copy from pageable memory is staged by the driver and synchronous (tens
        of µs for a few KiB, measured on an H200); from page-locked memory it is one DMA on our
        stream. Reusing the buffers is safe: device calls are serialized and each forward waits
        for its copy back before it returns."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize  # not np.prod: a third of this method's time
        buf = self._staging.get(which)
        if buf is None or buf.size < nbytes:
            import cupyx

            buf = self._staging[which] = cupyx.empty_pinned(max(nbytes, 1 << 18), dtype=np.uint8)
        return buf[:nbytes].view(dtype).reshape(shape)

    def _to_device(self, x: np.ndarray) -> Any:
        """x (f32, C-contiguous) on the device, copied through the "in" staging buffer."""
        staged = self._pinned("in", x.shape)
        np.copyto(staged, x)
        out = self._cp.empty(x.shape, dtype=self._cp.float32)
        out.set(staged, stream=self._stream)
        return out

    def _to_host(self, y: Any) -> np.ndarray:
        """y (f32, C-contiguous, on the device) as a new host array; waits for the stream."""
        staged = self._pinned("out", y.shape)
        y.get(stream=self._stream, out=staged, blocking=True)
        return staged.copy()

    def _forward_group(self, handles: list[CudaExpert], xs: list[np.ndarray]) -> list[np.ndarray]:
        cp = self._cp
        k, first = len(handles), handles[0]
        d_ff, d_model = first.d_ff, first.down.shape[0]
        sizes = [x.shape[0] for x in xs]
        total = sum(sizes)
        meta = self._pinned("meta", (3 * k + 1,), np.int64)  # gate|up addresses, down addresses, row offsets
        meta[:k] = [h.gate_up[0].data.data.ptr for h in handles]
        meta[k : 2 * k] = [h.down.data.data.ptr for h in handles]
        meta[2 * k] = 0
        np.cumsum(sizes, out=meta[2 * k + 1 :])
        meta_dev = cp.empty(meta.shape, dtype=np.int64)
        meta_dev.set(meta, stream=self._stream)
        staged = self._pinned("in", (total, d_model))
        np.concatenate(xs, out=staged)
        x_rows = cp.empty((total, d_model), dtype=cp.float32)
        x_rows.set(staged, stream=self._stream)
        bucket = next(b for b in MV_ROWS if b >= max(sizes))
        offs = meta_dev[2 * k :]
        gu = self._grouped_matvec(first.gate_up[0], bucket, meta_dev[:k], x_rows, offs, k)  # [total, 2·d_ff]
        h = cp.empty((total, d_ff), dtype=cp.float32)
        self._launch("tz_silu_mul_rows", (min(_GRID_CAP, -(-(total * d_ff) // 256)),), (256,),
                     (gu, gu[:, d_ff:], h, np.int32(d_ff), np.int32(total), np.int64(2 * d_ff)))
        y = self._to_host(self._grouped_matvec(first.down, bucket, meta_dev[k : 2 * k], h, offs, k))
        return np.split(y, np.cumsum(sizes)[:-1])

    def _grouped_matvec(self, like: DeviceWeight, bucket: int, addresses: Any, x_rows: Any, offs: Any,
                        k: int) -> Any:
        """tz_gmv over k weights of `like`'s format and shape at `addresses` (device int64 [k])."""
        m, n = like.shape
        y = self._cp.empty((x_rows.shape[0], m), dtype=self._cp.float32)
        suffix = BLOCK_FORMATS.get(like.fmt) or HALF_FORMATS[like.fmt]
        self._launch(f"tz_gmv{bucket}_{suffix}", (-(-m // (_MV_WARPS * MV_ROWS[bucket])), k), (32 * _MV_WARPS,),
                     (addresses, np.int64(like.data.nbytes // m), np.int32(m), np.int32(n), x_rows, offs, y))
        return y

    def _launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: tuple) -> None:
        self._kernels[name](grid, block, args, stream=self._stream)

    def matvec(self, w: DeviceWeight, x_rows: Any) -> Any:
        """W [m, n] · x token-major [t <= SMALL_BATCH, n] -> Y f32 [t, m] on the device (call
        inside _run): the fused mat-vec kernel of the smallest bucket that holds t."""
        cp = self._cp
        m, n = w.shape
        t = x_rows.shape[0]
        y = cp.empty((t, m), dtype=cp.float32)
        if w.fmt == "F32":
            self._gemm("N", "T", x_rows, w.data, out=y)
            return y
        bucket = next(b for b in MV_ROWS if b >= t)
        suffix = BLOCK_FORMATS.get(w.fmt) or HALF_FORMATS[w.fmt]
        self._launch(f"tz_mv{bucket}_{suffix}", (-(-m // (_MV_WARPS * MV_ROWS[bucket])),), (32 * _MV_WARPS,),
                     (w.data, np.int64(w.data.nbytes // m), np.int32(m), np.int32(n), x_rows, np.int32(t), y))
        return y

    def matmul(self, w: DeviceWeight, xt: Any) -> Any:
        """W [m, n] · X [n, t] -> Y f32 [m, t] on the device, for batches above SMALL_BATCH
        (call inside _run): cuBLAS sgemm, of f32 row tiles decoded into the workspace."""
        cp = self._cp
        m, n = w.shape
        t = xt.shape[1]
        y = cp.empty((m, t), dtype=cp.float32)
        if w.fmt == "F32":
            self._gemm("N", "N", w.data, xt, out=y)
            return y
        rows = max(1, min(m, TILE_BYTES // (4 * n)))
        tile = self._tile(rows * n)
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            buf = self.decode(w, r0, r1 - r0, out=tile[: (r1 - r0) * n].reshape(r1 - r0, n))
            self._gemm("N", "N", buf, xt, out=y[r0:r1])  # same stream: runs after the decode
        return y

    def decode(self, w: DeviceWeight, r0: int, rows: int, out: Any = None) -> Any:
        """Rows r0 .. r0+rows of a non-F32 weight as f32 [rows, n] on the device, into `out`
        (a workspace view) when given (call inside _run)."""
        n = w.shape[1]
        if out is None:
            out = self._cp.empty((rows, n), dtype=self._cp.float32)
        suffix = BLOCK_FORMATS.get(w.fmt) or HALF_FORMATS[w.fmt]
        groups = rows * n // 4  # >= half the threads any decode kernel wants: a fine grid either way
        self._launch(f"tz_dq_{suffix}", (max(1, min(_GRID_CAP, -(-groups // 256))),), (256,),
                     (w.data, np.int64(w.data.nbytes // w.shape[0]), np.int32(n), np.int32(r0), np.int32(rows), out))
        return out

    def _tile(self, size: int) -> Any:
        """The f32 workspace, grown to `size` floats once and then reused (stream-ordered: the
        next decode into it queues behind the GEMM that reads it)."""
        if self._workspace is None or self._workspace.size < size:
            self._workspace = None
            self._workspace = self._cp.empty(size, dtype=self._cp.float32)
        return self._workspace


def kernel_options() -> tuple[str, ...]:
    """NVRTC options: C++17 and the mat-vec shapes (MV_ROWS, MV_UNROLL) as -D macros."""
    return ("--std=c++17", *(f"-DTZ_MV_ROWS_{t}={rows}" for t, rows in MV_ROWS.items()),
            f"-DTZ_MV_UNROLL={MV_UNROLL}")


def open_device(*, device_index: int = 0) -> CudaOps:
    """Open CUDA device `device_index`; raises DeviceUnavailable saying what is missing."""
    try:
        import cupy
    except ImportError as exc:
        raise DeviceUnavailable(f"cupy is not installed ({exc}); {REQUIREMENTS_HINT}") from exc
    from cupy.cuda import runtime

    try:
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as exc:
        raise DeviceUnavailable(f"no CUDA device: {exc}") from exc
    if count == 0:
        raise DeviceUnavailable("no CUDA device: cupy reports 0 devices")
    if not 0 <= device_index < count:
        raise DeviceUnavailable(f"no CUDA device {device_index}: cupy reports {count} (0..{count - 1})")
    try:
        from cupy_backends.cuda.libs import cublas  # noqa: F401 - the import loads libcublas
    except ImportError as exc:
        raise DeviceUnavailable(f"cuBLAS not found ({exc}); {REQUIREMENTS_HINT} (cupy-cuda12x[ctk])") from exc
    try:
        ops = CudaOps(device_index)
    except Exception as exc:  # NVRTC missing or failing, a context that cannot be created
        raise DeviceUnavailable(f"CUDA device {device_index} could not start: {type(exc).__name__}: {exc}") from exc
    from core.experts.gpu.cuda_selftest import self_test

    try:
        self_test(ops)
    except (DeviceError, AssertionError) as exc:
        ops.close()
        raise DeviceUnavailable(f"CUDA kernels failed their self-test on {ops.device_name}: {exc}") from exc
    del cupy
    return ops
