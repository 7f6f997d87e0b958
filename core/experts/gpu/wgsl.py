"""WGSL device via wgpu-py (Vulkan, Metal, D3D12): compute shaders for dense and block-quantized experts.

Device layout of an expert (uploaded once, freed by `release`):
  * dense (F32/F16/BF16 payloads, already f32 in the host form): f32 [m, n] row-major.
  * block formats (Q8_0, Q4_K, Q6_K): transcoded on the host (core/experts/gpu/wgsl_layout.py)
    to int8 quants packed 4 per u32 plus per sub-block of G values an f32 scale a (and for
    Q4_K an f32 offset b): w = a*q - b, bit-identical to gguf's dequantizer in f32.
  * a matrix whose bytes exceed the device's max storage binding (or 65535 rows, the
    dispatch limit) is split by rows into several buffers, one dispatch each.
  * gate|up write one [t, 2·d_ff] activation buffer (gate rows then up rows), whether
    stacked in one matrix or two of different formats.

Kernels (core/experts/gpu/shaders/): matmul_f32.wgsl and matmul_q.wgsl (one workgroup of
64 invocations per weight row and chunk of TC tokens, TC = 1, 2, 4 or 8 by batch size: the
invocations stride over the row, coalesced, so each weight is read once per token chunk; TC
partial sums per invocation, summed in workgroup memory), silu_mul.wgsl. One forward = one
command submission: gate|up matmul(s) -> silu·mul -> down matmul(s) -> copy to a mapped
buffer, one readback. A grouped forward (forward_group: a holder's multi-expert request) puts
every expert's passes in one submission, each between a copy of its rows into the workspace
and a copy of its answer out, with one readback for all. Activation buffers (the workspace)
are reused between calls and grow with the batch.

Error bound against the CPU backend's exact path (same f32 weights, sgemm): both sum n
products in f32 in different orders, so each output differs by at most
2·γ(n+16)·Σ_k M[r,k]·|x[t,k]|, γ(k) = k·u/(1 - k·u), u = 2^-24, where M = |w| (dense) or
|a·q| + |b| (the shader's a·Σqx - b·Σx cancels for Q4_K), propagated through silu·mul and
down; tests/experts/test_gpu_wgsl.py derives it. Typical relative-to-norm differences
are ~sqrt(n)·u (1e-7 - 1e-6).

DeviceError: out of memory and validation errors are not fatal (this request runs on the
CPU); a lost or destroyed device, an internal (driver) error or a closed device are.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib import resources
from typing import Any

import numpy as np

from core.experts.backends import BLOCK_TYPES, DENSE_TYPES, CpuExpert, CpuWeight
from core.experts.gpu.ops import DeviceError, DeviceUnavailable
from core.experts.gpu.wgsl_buffers import Pass, Staging, WgslExpert, Workspace, destroy_all, make_buffers
from core.experts.gpu.wgsl_layout import SUB_BLOCK, transcode

# TC in the matmul shaders: tokens whose partial sums an invocation keeps. A batch of t takes
# the smallest of these >= min(t, 8), so batch 1 (decode) does no work for padding tokens.
TOKEN_CHUNKS = (1, 2, 4, 8)
TOKENS_PER_GROUP = TOKEN_CHUNKS[-1]
_MAX_GROUPS = 65535  # maxComputeWorkgroupsPerDimension (WebGPU's default and usual limit)
_WORKSPACE_MAX = 64 << 20  # bytes per activation buffer; larger batches take several submissions
_LOST = ("device is lost", "device lost", "destroyed", "device is invalid", "invalid device")


def open_device(*, allow_software: bool = True) -> WgslOps:
    """The high-performance WebGPU adapter as a WgslOps, with the adapter's own max buffer sizes.

    allow_software=False refuses a CPU-emulated adapter (lavapipe, SwiftShader). Raises
    DeviceUnavailable saying what is missing."""
    if not os.environ.get("XDG_RUNTIME_DIR"):  # Mesa's Vulkan loader warns on every start without it
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tenzro-wgpu-")
    try:
        import wgpu
    except ImportError as exc:
        raise DeviceUnavailable("wgpu is not installed (pip install -r requirements-gpu-wgsl.txt)") from exc
    no_adapter = ("no WebGPU adapter: no Vulkan, Metal or D3D12 driver found "
                  "(on Debian: apt install mesa-vulkan-drivers)")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:  # wgpu-native raises RuntimeError when no backend has an adapter
        raise DeviceUnavailable(f"{no_adapter}: {exc}") from exc
    if adapter is None:
        raise DeviceUnavailable(no_adapter)
    info = adapter.info
    software = info.get("adapter_type") == "CPU"
    name = info.get("device") or info.get("description") or info.get("vendor") or "unknown WebGPU adapter"
    if software and not allow_software:
        raise DeviceUnavailable(f"the only WebGPU adapter is a software one ({name}): it emulates a GPU on "
                                "the CPU, slower than the CPU backend (force it with TENZRO_EXPERT_BACKEND=wgsl)")
    limits = {k: adapter.limits[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size")}
    try:
        device = adapter.request_device_sync(required_limits=limits)
    except Exception as exc:
        raise DeviceUnavailable(f"WebGPU adapter {name} refused a device: {exc}") from exc
    return WgslOps(wgpu, device, name, software)


class WgslOps:
    """DeviceOps over one wgpu device. Not thread-safe: the GPU backend serializes calls."""

    kind = "wgsl"
    block_types = ("Q8_0", "Q4_K", "Q6_K")  # wgsl_layout.SUB_BLOCK's formats

    def __init__(self, wgpu: Any, device: Any, name: str, software: bool) -> None:
        self._wgpu = wgpu
        self._device = device
        self.device_name = name
        self.memory_total_bytes: int | None = None  # WebGPU cannot say
        self.software = software
        # bytes one binding (and so one buffer) may hold; tests lower it to exercise the row split
        self.max_binding = int(min(device.limits["max-storage-buffer-binding-size"], device.limits["max-buffer-size"]))
        self._pipelines: dict[tuple[str, int], Any] = {}  # (kernel, TC) -> pipeline
        self._layouts: dict[int, Any] = {}  # bindings -> bind group layout (shared by TC variants)
        self._ws: Workspace | None = None
        self._staged: Staging | None = None
        self._fatal: str | None = None  # why the device is unusable, once it is

    # -- sizes -----------------------------------------------------------------------------

    def _rows_per_buffer(self, w: CpuWeight) -> int:
        m, n = w.shape
        # dense: 4n bytes a row; blocks: n quant bytes, the scales n/4 at most (G 16 or 32 with offset)
        row = 4 * n if w.ggml_type == "F32" else n
        rows = min(m, _MAX_GROUPS, self.max_binding // row)
        if rows < 1:
            raise DeviceError(f"a {w.ggml_type} row of {row} bytes exceeds the device's max binding "
                              f"({self.max_binding} bytes)", fatal=False)
        return rows

    def _weight_bytes(self, w: CpuWeight) -> int:
        m, n = w.shape
        chunks = -(-m // self._rows_per_buffer(w))
        if w.ggml_type == "F32":
            data = 4 * m * n
        else:
            group, offset = SUB_BLOCK[w.ggml_type]
            data = m * n + 4 * m * (n // group) * (2 if offset else 1)
        return data + 16 * chunks  # + one 16-byte uniform per buffer chunk

    def device_bytes(self, host: CpuExpert, types: tuple[str, str, str]) -> int:
        _check(host, types)
        return sum(self._weight_bytes(w) for w in (*host.gate_up, host.down)) + 16  # + silu's uniform

    # -- upload / release --------------------------------------------------------------------

    def upload(self, host: CpuExpert, types: tuple[str, str, str]) -> WgslExpert:
        _check(host, types)
        d_ff, d_model = host.d_ff, host.down.shape[0]
        buffers: list[Any] = []
        try:
            with self._guard("upload"):
                gate_up: list[Pass] = []
                for i, w in enumerate(host.gate_up):  # stacked: one weight at row 0; else gate 0, up d_ff
                    gate_up += self._upload_weight(w, 2 * d_ff, i * d_ff, buffers)
                down = self._upload_weight(host.down, d_model, 0, buffers)
                silu = self._buffer(np.array([d_ff, 0, 0, 0], np.uint32), uniform=True, into=buffers)
                for kernel in {p.kernel for p in gate_up + down}:
                    for tc in TOKEN_CHUNKS:  # compiled once per device, at the first upload using them
                        self._pipeline(kernel, tc)
                self._pipeline("silu", 1)
        except BaseException:
            destroy_all(buffers)
            raise
        return WgslExpert(d_model, d_ff, gate_up, down, silu, self.device_bytes(host, types), buffers)

    def _upload_weight(self, w: CpuWeight, m_out: int, y_row0: int, into: list[Any]) -> list[Pass]:
        m, n = w.shape
        rows = self._rows_per_buffer(w)
        passes = []
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            if w.ggml_type == "F32":
                arrays: tuple[np.ndarray, ...] = (w.data[r0:r1],)
            else:  # transcoded a chunk at a time: the host copy stays chunk-sized
                layout = transcode(w.ggml_type, w.data[r0:r1], (r1 - r0, n))
                arrays = (layout.quants, layout.meta)
            weights = tuple(self._buffer(a, into=into) for a in arrays)
            params = self._buffer(np.array([n, m_out, y_row0 + r0, 0], np.uint32), uniform=True, into=into)
            passes.append(Pass(w.ggml_type, r1 - r0, params, weights))
        return passes

    def release(self, handle: WgslExpert) -> None:
        handle.released = True
        handle.bind_groups = None
        destroy_all(handle.buffers)
        handle.buffers = []

    def close(self) -> None:
        self._fatal = self._fatal or "the device was closed"
        if self._ws is not None:
            destroy_all([self._ws.x, self._ws.gu, self._ws.h, self._ws.y, self._ws.readback, self._ws.tokens])
            self._ws = None
        if self._staged is not None:
            destroy_all([self._staged.x, self._staged.tokens, self._staged.readback])
            self._staged = None
        with suppress(Exception):  # close never raises; the device is gone either way
            self._device.destroy()

    # -- forward -----------------------------------------------------------------------------

    def forward(self, handle: WgslExpert, x: np.ndarray) -> np.ndarray:
        x = self._checked(handle, x)
        t, cap = x.shape[0], self._token_cap(handle)
        out = np.empty((t, handle.d_model), dtype=np.float32)
        with self._guard("forward"):
            for t0 in range(0, t, cap):
                t1 = min(t, t0 + cap)
                out[t0:t1] = self._submit(handle, x[t0:t1])
        return out

    @staticmethod
    def _checked(handle: WgslExpert, x: np.ndarray) -> np.ndarray:
        if handle.released:
            raise DeviceError("forward on a released expert handle", fatal=False)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] != handle.d_model:
            raise ValueError(f"x must be f32 [t >= 1, {handle.d_model}], received {x.shape}")
        return x

    def _token_cap(self, handle: WgslExpert) -> int:
        """Tokens one submission takes for this expert (its largest activation within a binding)."""
        widest = 4 * max(handle.d_model, 2 * handle.d_ff)  # bytes per token of the largest activation
        return min(max(1, min(_WORKSPACE_MAX, self.max_binding) // widest), _MAX_GROUPS * TOKENS_PER_GROUP)

    def _submit(self, handle: WgslExpert, x: np.ndarray) -> np.ndarray:
        """One command submission for x [t, d_model] (t within the workspace cap)."""
        dev = self._device
        t, d_model = x.shape[0], handle.d_model
        ws = self._workspace(4 * t * d_model, 8 * t * handle.d_ff, 4 * t * handle.d_ff)
        dev.queue.write_buffer(ws.x, 0, x)
        dev.queue.write_buffer(ws.tokens, 0, np.array([t, 0, 0, 0], np.uint32))
        enc = dev.create_command_encoder()
        self._encode(enc, handle, ws, t)
        size = 4 * t * d_model
        enc.copy_buffer_to_buffer(ws.y, 0, ws.readback, 0, size)
        dev.queue.submit([enc.finish()])
        return self._read(ws.readback, size).reshape(t, d_model)

    def forward_group(self, handles: list[WgslExpert], xs: list[np.ndarray]) -> list[np.ndarray]:
        """Several experts, each over its own rows (a holder's multi-expert request), as
        [forward(h, x) for each], in one command submission and one readback: per expert, its
        rows and token count are copied from one staging upload into the workspace, its passes
        run, and its y is copied into its place in one readback buffer (commands of one
        encoder run in order). A batch larger than one submission holds, or rows more than one
        buffer holds in all, runs the experts one by one."""
        if len(handles) != len(xs):
            raise ValueError(f"{len(handles)} experts but {len(xs)} batches")
        xs = [self._checked(h, x) for h, x in zip(handles, xs, strict=True)]
        if (any(len(x) > self._token_cap(h) for h, x in zip(handles, xs, strict=True))
                or 4 * sum(x.size for x in xs) > self.max_binding):  # the staging holds every row at once
            return [self.forward(h, x) for h, x in zip(handles, xs, strict=True)]
        dev = self._device
        t_max = max(len(x) for x in xs)
        with self._guard("forward"):
            ws = self._workspace(4 * t_max * max(h.d_model for h in handles),
                                 8 * t_max * max(h.d_ff for h in handles), 4 * t_max * max(h.d_ff for h in handles))
            rows = np.concatenate([x.reshape(-1) for x in xs])
            staged = self._staging(4 * len(rows), 16 * len(xs))
            dev.queue.write_buffer(staged.x, 0, rows)
            dev.queue.write_buffer(staged.tokens, 0, np.array([[len(x), 0, 0, 0] for x in xs], np.uint32))
            enc = dev.create_command_encoder()
            offset = 0
            for i, (h, x) in enumerate(zip(handles, xs, strict=True)):
                enc.copy_buffer_to_buffer(staged.x, offset, ws.x, 0, 4 * x.size)
                enc.copy_buffer_to_buffer(staged.tokens, 16 * i, ws.tokens, 0, 16)
                self._encode(enc, h, ws, len(x))
                enc.copy_buffer_to_buffer(ws.y, 0, staged.readback, offset, 4 * x.size)
                offset += 4 * x.size
            dev.queue.submit([enc.finish()])
            out = self._read(staged.readback, offset)
        ends = np.cumsum([x.size for x in xs])
        return [part.reshape(x.shape) for part, x in zip(np.split(out, ends[:-1]), xs, strict=True)]

    def _encode(self, enc: Any, handle: WgslExpert, ws: Workspace, t: int) -> None:
        """One compute pass of an expert over the t token rows in ws.x (ws.tokens says t):
        gate|up matmul(s) -> silu·mul -> down matmul(s) into ws.y."""
        if handle.bind_groups is None or handle.bind_groups[0] != ws.gen:
            handle.bind_groups = (ws.gen, self._bind(handle, ws))
        groups = iter(handle.bind_groups[1])
        tc = next(c for c in TOKEN_CHUNKS if c >= min(t, TOKENS_PER_GROUP))
        chunks = -(-t // tc)
        cp = enc.begin_compute_pass()
        for p in handle.gate_up:
            cp.set_pipeline(self._pipelines[p.kernel, tc])
            cp.set_bind_group(0, next(groups))
            cp.dispatch_workgroups(p.rows, chunks)
        cp.set_pipeline(self._pipelines["silu", 1])
        cp.set_bind_group(0, next(groups))
        cp.dispatch_workgroups(min(_MAX_GROUPS, -(-t * handle.d_ff // 256)))
        for p in handle.down:
            cp.set_pipeline(self._pipelines[p.kernel, tc])
            cp.set_bind_group(0, next(groups))
            cp.dispatch_workgroups(p.rows, chunks)
        cp.end()

    def _read(self, readback: Any, size: int) -> np.ndarray:
        """The first `size` bytes of a mapped-read buffer as f32 (waits for the queue)."""
        readback.map_sync(self._wgpu.MapMode.READ, 0, size)
        try:
            return np.frombuffer(readback.read_mapped(0, size), dtype=np.float32)
        finally:
            readback.unmap()

    def _bind(self, handle: WgslExpert, ws: Workspace) -> list[Any]:
        """Bind groups in dispatch order: gate|up passes, silu, down passes."""
        def group(kernel: str, *buffers: Any) -> Any:
            layout = self._layout(len(buffers))
            entries = [{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(buffers)]
            return self._device.create_bind_group(layout=layout, entries=entries)

        groups = [group(p.kernel, p.params, ws.tokens, ws.x, ws.gu, *p.weights) for p in handle.gate_up]
        groups.append(group("silu", handle.silu_params, ws.tokens, ws.gu, ws.h))
        groups += [group(p.kernel, p.params, ws.tokens, ws.h, ws.y, *p.weights) for p in handle.down]
        return groups

    def _workspace(self, xy: int, gu: int, h: int) -> Workspace:
        """Activation buffers holding at least these byte counts, reused while large enough."""
        ws = self._ws
        if ws is not None and xy <= ws.sizes[0] and gu <= ws.sizes[1] and h <= ws.sizes[2]:
            return ws
        old = ws.sizes if ws is not None else (0, 0, 0)
        # at least double the old ones (amortized growth), 16-byte multiples (vec4 bindings)
        grow = min(_WORKSPACE_MAX, self.max_binding)
        sizes = tuple(max(need, min(2 * had, grow), 16) + 15 & ~15
                      for need, had in zip((xy, gu, h), old, strict=True))
        if ws is not None:
            self._ws = None
            destroy_all([ws.x, ws.gu, ws.h, ws.y, ws.readback, ws.tokens])
        usage = self._wgpu.BufferUsage
        io = usage.STORAGE | usage.COPY_DST | usage.COPY_SRC
        made = make_buffers(self._device, [(sizes[0], io), (sizes[1], io), (sizes[2], io), (sizes[0], io),
                                           (sizes[0], usage.MAP_READ | usage.COPY_DST),
                                           (16, usage.UNIFORM | usage.COPY_DST)])
        self._ws = Workspace((ws.gen + 1) if ws else 1, *made, sizes)
        return self._ws

    def _staging(self, x_bytes: int, token_bytes: int) -> Staging:
        """The grouped forward's staging buffers, at least these sizes (grown to twice, 16-byte
        multiples, as the workspace is)."""
        st = self._staged
        if st is not None and x_bytes <= st.sizes[0] and token_bytes <= st.sizes[1]:
            return st
        old = st.sizes if st is not None else (0, 0)
        sizes = tuple(max(need, 2 * had, 16) + 15 & ~15 for need, had in zip((x_bytes, token_bytes), old, strict=True))
        if st is not None:
            self._staged = None
            destroy_all([st.x, st.tokens, st.readback])
        usage = self._wgpu.BufferUsage
        copies = usage.COPY_SRC | usage.COPY_DST
        made = make_buffers(self._device, [(sizes[0], copies), (sizes[1], copies),
                                           (sizes[0], usage.MAP_READ | usage.COPY_DST)])
        self._staged = Staging(*made, sizes)
        return self._staged

    # -- device plumbing ---------------------------------------------------------------------

    def _buffer(self, data: np.ndarray, *, into: list[Any], uniform: bool = False) -> Any:
        usage = self._wgpu.BufferUsage
        buf = self._device.create_buffer_with_data(
            data=np.ascontiguousarray(data), usage=(usage.UNIFORM if uniform else usage.STORAGE) | usage.COPY_DST)
        into.append(buf)
        return buf

    def _layout(self, bindings: int) -> Any:
        """Bind group layout: two uniforms (params, tokens), the input, the output, then the
        read-only weight buffers; 4 bindings silu, 5 dense, 6 block formats."""
        if bindings not in self._layouts:
            compute = self._wgpu.ShaderStage.COMPUTE
            kinds = ["uniform", "uniform", "read-only-storage", "storage"] + ["read-only-storage"] * (bindings - 4)
            self._layouts[bindings] = self._device.create_bind_group_layout(entries=[
                {"binding": i, "visibility": compute, "buffer": {"type": k}} for i, k in enumerate(kinds)])
        return self._layouts[bindings]

    def _pipeline(self, kernel: str, tc: int) -> Any:
        """The compute pipeline for "F32", a block format or "silu" with TC tokens per
        invocation, compiled on first use."""
        if (kernel, tc) not in self._pipelines:
            if kernel == "silu":
                code, bindings = _shader("silu_mul.wgsl"), 4
            elif kernel == "F32":
                code, bindings = _shader("matmul_common.wgsl") + _shader("matmul_f32.wgsl"), 5
            else:
                group, offset = SUB_BLOCK[kernel]
                code = (_shader("matmul_common.wgsl") + _shader("matmul_q.wgsl")).replace(
                    "$META", "vec2<f32>" if offset else "f32").replace("$WPS", str(group // 4)).replace(
                    "$SCALE", "m.x" if offset else "m").replace(
                    "$OFFSET", "- m.y * (xv.x + xv.y + xv.z + xv.w)" if offset else "")
                bindings = 6
            code = code.replace("$TC", str(tc)).replace("$RED", str(tc * 64))
            module = self._device.create_shader_module(label=f"tenzro-{kernel}-{tc}", code=code)
            layout = self._device.create_pipeline_layout(bind_group_layouts=[self._layout(bindings)])
            self._pipelines[kernel, tc] = self._device.create_compute_pipeline(
                layout=layout, compute={"module": module, "entry_point": "main"})
        return self._pipelines[kernel, tc]

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Map whatever wgpu raises to DeviceError (fatal for a lost device or driver failure)."""
        if self._fatal is not None:
            raise DeviceError(f"wgpu {what}: device unusable ({self._fatal})", fatal=True)
        try:
            yield
        except DeviceError:
            raise
        except Exception as exc:
            text = str(exc).lower()
            fatal = any(s in text for s in _LOST) or isinstance(exc, self._wgpu.GPUInternalError)
            if fatal:
                self._fatal = str(exc).strip().splitlines()[-1].strip() if str(exc).strip() else type(exc).__name__
            kind = "out of device memory" if isinstance(exc, self._wgpu.GPUOutOfMemoryError) else type(exc).__name__
            raise DeviceError(f"wgpu {what} failed ({kind}): {exc}", fatal=fatal) from exc


def _shader(name: str) -> str:
    return resources.files("core.experts.gpu").joinpath("shaders", name).read_text(encoding="utf-8")


def _check(host: CpuExpert, types: tuple[str, str, str]) -> None:
    """The host form must be what the CPU backend makes of a payload of these types."""
    want = tuple("F32" if t in DENSE_TYPES else t for t in types)
    if any(t not in DENSE_TYPES + BLOCK_TYPES for t in types):
        raise ValueError(f"unsupported ggml types {types} (supported {DENSE_TYPES + BLOCK_TYPES})")
    have = tuple(w.ggml_type for w in host.gate_up)
    expect = (want[0],) if want[0] == want[1] else want[:2]
    if have != expect or host.down.ggml_type != want[2]:
        raise ValueError(f"host expert holds {have} + {host.down.ggml_type}, not the form of types {types}")
