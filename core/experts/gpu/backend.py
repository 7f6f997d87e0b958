"""GpuBackend: a compute backend that runs experts on a device and never loses a request to it.

Tiers, from the fastest: device memory (this module, budget `device_budget_bytes`) above the
host memory tier and the disk tier (core/experts/tiered_cache.py). The device tier is inclusive:
an expert on the device also keeps its host form (the CPU backend's), because that is what a
request falls back to when the device fails, and what the device copy is rebuilt from after an
eviction. The host tier therefore budgets the host form (`GpuExpert.nbytes`), and the device
tier budgets what the upload takes on the device (`DeviceOps.device_bytes`).

- An expert is uploaded when it is prepared (loaded or promoted) if it fits in the free device
  budget, else on its first forward, evicting the least recently used experts. An expert larger
  than the whole budget, in a block format the device's kernels do not read
  (`DeviceOps.block_types`: not MXFP4), or with biases or another GLU than SiLU (gpt-oss) runs on
  the CPU.
- An expert dropped from the host tier is dropped from the device too: a weakref finalizer
  queues its handle, released by the next device call (never from the finalizer itself, which
  may run on any thread, mid-call, under the device lock).
- Device calls are serialized by one lock: a device has one queue, and wgpu/CuPy handles are
  not shared across threads safely. CPU fallbacks run outside it.
- A DeviceError that is not fatal (out of device memory, say) runs that request on the CPU; a
  fatal one (device lost) also marks the device failed: every later request runs on the CPU,
  `is_gpu` turns False (so the provider record stops advertising `moe_gpu`) and `on_state_change`
  fires so the worker publishes it at once. A restart re-probes the device.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.experts.backends import DENSE_TYPES, CpuBackend, CpuExpert, TensorIn
from core.experts.gpu.ops import DeviceError, DeviceOps

log = logging.getLogger(__name__)

_tokens = itertools.count(1)


@dataclass(eq=False)
class GpuExpert:
    """An expert as the GPU backend holds it: the host form, its payload types, a device token."""

    host: CpuExpert
    types: tuple[str, str, str]  # payload ggml_type of gate, up, down
    token: int = field(default_factory=lambda: next(_tokens))

    @property
    def nbytes(self) -> int:
        """Host bytes (the host memory tier budgets these; device bytes are budgeted above)."""
        return self.host.nbytes


def _as_device_error(exc: Exception) -> DeviceError:
    """A device op's failure as a DeviceError. Anything else a device module raises (a bug in its
    layout code, a library error it did not map) is logged with its traceback and costs the
    request nothing either: the host copy answers it, and the device is kept for the next one."""
    if isinstance(exc, DeviceError):
        return exc
    log.error("unexpected error from the device module, this request runs on the CPU", exc_info=exc)
    return DeviceError(f"{type(exc).__name__}: {exc}", fatal=False)


@dataclass
class _Resident:
    handle: Any
    nbytes: int


class GpuBackend:
    """Experts on `ops`'s device within `device_budget_bytes`, on `cpu` when the device cannot."""

    is_gpu_backend = True
    activations = CpuBackend.activations  # the others than silu run on the host copy
    biases = True

    def __init__(self, ops: DeviceOps, *, cpu: CpuBackend, device_budget_bytes: int,
                 on_state_change: Callable[[], None] | None = None) -> None:
        if device_budget_bytes <= 0:
            raise ValueError(f"device memory budget must be positive, got {device_budget_bytes}")
        self.ops = ops
        self.cpu = cpu
        self.name = ops.kind
        self.cpu_kernel = cpu.cpu_kernel
        self.fused_max_rows = cpu.fused_max_rows  # warmup runs the CPU fallback's paths too
        self.device_budget_bytes = int(device_budget_bytes)
        self.on_state_change = on_state_change
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._resident: collections.OrderedDict[int, _Resident] = collections.OrderedDict()
        self._dropped: collections.deque[int] = collections.deque()  # appended by finalizers, drained under _lock
        self._used = 0
        self.failed: str | None = None  # why the device was given up, once a fatal DeviceError came
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_error: str | None = None

    # -- seam ------------------------------------------------------------------------------------

    @property
    def is_gpu(self) -> bool:
        """True while the device serves: what `gpu_backend_active` and the record's `moe_gpu` say."""
        return self.failed is None

    def prepare_expert(self, gate: TensorIn, up: TensorIn, down: TensorIn, **glu: Any) -> GpuExpert:
        """glu: the CPU backend's `activation` and `biases`; an expert with either stays on the CPU."""
        expert = GpuExpert(host=self.cpu.prepare_expert(gate, up, down, **glu),
                           types=(gate.ggml_type, up.ggml_type, down.ggml_type))
        if self.failed is None:
            weakref.finalize(expert, self._dropped.append, expert.token)
            with self._lock:
                self._drain()
                try:
                    self._upload(expert, evict=False)
                except Exception as exc:  # any failure: see _as_device_error
                    self._device_error(_as_device_error(exc), "upload")
        return expert

    def forward(self, prepared: GpuExpert, x: np.ndarray) -> np.ndarray:
        if self.failed is None:
            with self._lock:
                self._drain()
                try:
                    resident = self._resident.get(prepared.token) or self._upload(prepared, evict=True)
                    if resident is not None:
                        self._resident.move_to_end(prepared.token)
                        y = self.ops.forward(resident.handle, x)
                        self.counts["device_rows"] += x.shape[0]
                        return y
                    self.counts["too_large" if self._device_reads(prepared) else "cpu_format"] += 1
                except Exception as exc:  # any failure: see _as_device_error
                    self._device_error(_as_device_error(exc), "forward")
        with self._count_lock:  # CPU rows run outside the device lock, on several threads at once
            self.counts["cpu_rows"] += x.shape[0]
        return self.cpu.forward(prepared.host, x)

    @property
    def groups_experts(self) -> bool:
        """Whether forward_many runs several experts as one device call: a device with a grouped
        forward (CUDA's grouped launch, WGSL's single submission), while it serves."""
        return self.failed is None and hasattr(self.ops, "forward_group")

    def forward_many(self, items: list[tuple[GpuExpert, np.ndarray]]) -> list[np.ndarray]:
        """[forward(prepared, x) for each item]: a holder's multi-expert request. Where the device
        has a grouped forward and every expert is on it, they run as one device call, else
        one by one. A device error runs the whole group through `forward`, expert by expert."""
        if self.groups_experts and len(items) > 1:
            with self._lock:
                self._drain()
                try:
                    handles = self._resident_handles([prepared for prepared, _ in items])
                    if handles is not None:
                        ys = self.ops.forward_group(handles, [x for _, x in items])
                        self.counts["device_rows"] += sum(x.shape[0] for _, x in items)
                        return ys
                except Exception as exc:  # any failure: see _as_device_error
                    self._device_error(_as_device_error(exc), "forward")
        return [self.forward(prepared, x) for prepared, x in items]

    # -- device tier (under _lock) ----------------------------------------------------------------

    def _resident_handles(self, experts: list[GpuExpert]) -> list[Any] | None:
        """The device handles of `experts`, uploading those not on the device; None when one of
        them cannot be there (its format, its size) or when uploading the later ones would evict
        an earlier one of the same group."""
        tokens = {e.token for e in experts}
        if len(tokens) < len(experts):
            return None  # an expert twice: the caller's frame is refused before this, but stay simple
        handles = []
        for expert in experts:
            resident = self._resident.get(expert.token)
            if resident is None:
                if any(t in tokens for t in self._lru_victims(expert)):
                    return None
                resident = self._upload(expert, evict=True)
                if resident is None:
                    return None
            self._resident.move_to_end(expert.token)
            handles.append(resident.handle)
        return handles

    def _lru_victims(self, expert: GpuExpert) -> list[int]:
        """Tokens of the experts uploading `expert` would evict, least recently used first."""
        if not self._device_reads(expert):
            return []
        need = self.ops.device_bytes(expert.host, expert.types) - (self.device_budget_bytes - self._used)
        victims = []
        for token, resident in self._resident.items():
            if need <= 0:
                break
            victims.append(token)
            need -= resident.nbytes
        return victims

    def _device_reads(self, expert: GpuExpert) -> bool:
        """Whether the device kernels compute this expert: its formats, plain SiLU, no biases."""
        host = expert.host
        return all(t in DENSE_TYPES or t in self.ops.block_types for t in expert.types) and (
            host.activation.kind == "silu" and host.gate_up_bias is None and host.down_bias is None)

    def _upload(self, expert: GpuExpert, *, evict: bool) -> _Resident | None:
        """Upload `expert` if its device bytes fit (evicting LRU experts when `evict`); None if not."""
        if expert.token in self._resident:
            return self._resident[expert.token]
        if not self._device_reads(expert):
            return None  # the device kernels do not compute it (MXFP4, gpt-oss's GLU): it runs on the CPU
        need = self.ops.device_bytes(expert.host, expert.types)
        if need > self.device_budget_bytes:
            return None
        if self._used + need > self.device_budget_bytes and not evict:
            return None
        while self._used + need > self.device_budget_bytes:
            _, old = self._resident.popitem(last=False)
            self._release(old)
            self.counts["evictions"] += 1
        started = time.perf_counter()
        handle = self.ops.upload(expert.host, expert.types)
        self.counts["uploads"] += 1
        self.counts["upload_ms"] += round((time.perf_counter() - started) * 1000)
        resident = self._resident[expert.token] = _Resident(handle, need)
        self._used += need
        return resident

    def _release(self, resident: _Resident) -> None:
        self.ops.release(resident.handle)
        self._used -= resident.nbytes

    def _drain(self) -> None:
        """Release the device copies of experts the host tier has dropped."""
        while self._dropped:
            resident = self._resident.pop(self._dropped.popleft(), None)
            if resident is not None:
                self._release(resident)

    def _device_error(self, exc: DeviceError, during: str) -> None:
        self.counts["device_errors"] += 1
        self.last_error = f"{during}: {exc}"
        if not exc.fatal:
            log.warning("%s device error during %s, this request runs on the CPU: %s", self.name, during, exc)
            return
        log.error("%s device failed during %s; every expert now runs on the CPU until restart: %s",
                  self.name, during, exc)
        self.failed = f"{during}: {exc}"
        self._resident.clear()
        self._used = 0
        self.ops.close()
        if self.on_state_change is not None:
            try:
                self.on_state_change()
            except Exception:  # a listener's failure must not turn a fallback into a lost request
                log.exception("device state listener failed")

    # -- reporting -------------------------------------------------------------------------------

    def device_status(self) -> dict[str, Any]:
        """The device tier and its health, for tenzro_moeExpertStatus's `compute.device`. Never waits
        for a device call in flight (a status read must not queue behind a large batch): the figures
        are read as they stand, and dropped experts are released only if the device is idle."""
        if self.failed is None and self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()
        return {
            "kind": self.ops.kind, "name": self.ops.device_name, "software": self.ops.software,
            "state": "ok" if self.failed is None else "failed", "failed": self.failed,
            "memory_total_bytes": self.ops.memory_total_bytes,
            "memory_budget_bytes": self.device_budget_bytes, "memory_used_bytes": self._used,
            "experts": len(self._resident), "last_error": self.last_error,
            "counts": {k: int(self.counts[k]) for k in ("uploads", "evictions", "device_rows", "cpu_rows",
                                                        "too_large", "cpu_format", "device_errors", "upload_ms")},
        }

    def close(self) -> None:
        with self._lock:
            for resident in self._resident.values():
                self.ops.release(resident.handle)
            self._resident.clear()
            self._used = 0
            self.ops.close()
