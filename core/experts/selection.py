"""Choosing the compute backend at start, and saying why.

`choice` (TENZRO_EXPERT_BACKEND, `tenzro node run --expert-backend`):
- "auto" (default): CUDA if CuPy sees an NVIDIA device, else WGSL if wgpu finds a hardware
  adapter, else the CPU backend. A software adapter (Mesa's lavapipe, SwiftShader) is never
  picked by auto: it emulates a GPU on the same cores the CPU backend uses, more slowly.
- "cuda" / "wgsl": that device or an error at start naming what is missing: an operator who
  asked for a GPU is told at once rather than finding a CPU node later. A software adapter is
  accepted when forced (CI runs the WGSL backend on lavapipe this way).
- "cpu", "cpu-numba", "cpu-numpy": the CPU backend (C kernels, numba only, numpy only); no
  device is probed.

Every candidate's outcome goes into `BackendChoice.candidates` ({name, available, active,
reason}), which tenzro_moeExpertStatus reports under `compute` and the worker logs at start.
A default install has neither CuPy nor wgpu: both probes then say "not installed" in microseconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.experts.backend_names import CHOICES, CPU_CHOICES, GPU_CHOICES
from core.experts.backends import ComputeBackend, CpuBackend
from core.experts.gpu.ops import DeviceOps, DeviceUnavailable

# What a device tier may hold when the budget is not set: a share of what the device reports,
# leaving room for workspaces, the CUDA context and other processes; WebGPU reports no size.
DEVICE_BUDGET_SHARE = 0.8
DEVICE_BUDGET_UNKNOWN_BYTES = 2 << 30


class BackendUnavailable(RuntimeError):
    """The forced backend cannot run here (the message says why and what to install)."""


@dataclass
class BackendChoice:
    backend: ComputeBackend
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        """One log line: 'expert backend wgsl (forced); cuda: cupy is not installed …'."""
        parts = [f"{c['name']}: {c['reason']}" for c in self.candidates if not c["active"]]
        active = next(c for c in self.candidates if c["active"])
        return f"expert backend {active['name']} ({active['reason']})" + ("; " + "; ".join(parts) if parts else "")


def open_device(kind: str, *, device_index: int = 0, allow_software: bool = True) -> DeviceOps:
    """Open the `kind` ("cuda" | "wgsl") device; raises DeviceUnavailable saying why not."""
    if kind == "cuda":
        from core.experts.gpu import cuda

        return cuda.open_device(device_index=device_index)
    from core.experts.gpu import wgsl

    return wgsl.open_device(allow_software=allow_software)


def cpu_backend(choice: str | None = None) -> CpuBackend:
    """The CPU backend `choice` names ("cpu-numba", "cpu-numpy"; anything else: the default one)."""
    choice = (choice or os.environ.get("TENZRO_EXPERT_BACKEND") or "cpu").lower()
    if choice == "cpu-numpy":
        return CpuBackend(use_numba=False)
    if choice == "cpu-numba":
        return CpuBackend(c_variant="off")
    return CpuBackend()


def device_budget(ops: DeviceOps, configured: int | None) -> int:
    """The device tier's budget: `configured` when set (> 0), else a share of the device's memory."""
    if configured:
        return int(configured)
    if ops.memory_total_bytes:
        return int(ops.memory_total_bytes * DEVICE_BUDGET_SHARE)
    return DEVICE_BUDGET_UNKNOWN_BYTES


def choose_backend(*, choice: str | None = None, device_budget_bytes: int | None = None, device_index: int = 0,
                   on_state_change: Callable[[], None] | None = None) -> BackendChoice:
    """Open the backend `choice` (default $TENZRO_EXPERT_BACKEND, else "auto") names; see the module
    docstring. Raises ValueError for an unknown choice, BackendUnavailable for a forced one that cannot run."""
    choice = (choice or os.environ.get("TENZRO_EXPERT_BACKEND") or "auto").lower()
    if choice not in CHOICES:
        raise ValueError(f"unknown expert backend {choice!r} (known: {', '.join(CHOICES)})")
    candidates: list[dict[str, Any]] = []
    ops: DeviceOps | None = None
    for kind in GPU_CHOICES:
        if choice in CPU_CHOICES or (choice in GPU_CHOICES and choice != kind):
            candidates.append({"name": kind, "available": None, "active": False,
                               "reason": f"not probed (TENZRO_EXPERT_BACKEND={choice})"})
            continue
        if ops is not None:
            candidates.append({"name": kind, "available": None, "active": False,
                               "reason": f"not probed ({ops.kind} was found first)"})
            continue
        try:
            opened = open_device(kind, device_index=device_index, allow_software=choice == kind)
        except DeviceUnavailable as exc:
            if choice == kind:
                raise BackendUnavailable(f"TENZRO_EXPERT_BACKEND={kind}, but {exc}") from exc
            candidates.append({"name": kind, "available": False, "active": False, "reason": str(exc)})
            continue
        ops = opened
        how = "forced" if choice == kind else "auto-detected"
        candidates.append({"name": kind, "available": True, "active": True,
                           "reason": f"{how}: {opened.device_name}" + (" (software)" if opened.software else "")})
    cpu = cpu_backend(choice if choice in CPU_CHOICES else "cpu")
    if ops is None:
        why = "forced" if choice in CPU_CHOICES else "no GPU backend available"
        candidates.append({"name": "cpu", "available": True, "active": True, "reason": f"{why}; {cpu.cpu_kernel}"})
        return BackendChoice(cpu, candidates)
    from core.experts.gpu.backend import GpuBackend

    backend = GpuBackend(ops, cpu=cpu, device_budget_bytes=device_budget(ops, device_budget_bytes),
                         on_state_change=on_state_change)
    candidates.append({"name": "cpu", "available": True, "active": False,
                       "reason": f"fallback when the device fails; {cpu.cpu_kernel}"})
    return BackendChoice(backend, candidates)


def select_backend(*, prefer: str | None = None) -> ComputeBackend:
    """The backend `prefer` names (see choose_backend), without the report."""
    return choose_backend(choice=prefer).backend
