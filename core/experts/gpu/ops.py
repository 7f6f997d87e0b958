"""What a GPU device must provide to the GPU backend (core/experts/gpu/backend.py).

A device module (cuda.py, wgsl.py) exposes ``open_device() -> DeviceOps`` and raises
DeviceUnavailable, with a reason an operator can act on, when its library, driver or device
is missing. The backend owns everything device-independent: the host copy of each expert
(the CPU backend's form, kept for fallback), the device-memory budget and its LRU, the lock
that serializes device work, and the fallback to the CPU when an op raises DeviceError.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from core.experts.backends import CpuExpert


class DeviceUnavailable(RuntimeError):
    """This backend cannot run here; str(exc) says why ("cupy is not installed …")."""


class DeviceError(RuntimeError):
    """A device op failed. fatal: the device is unusable (lost, driver failure) and the backend
    stops using it; not fatal (out of device memory, a transient launch failure): this request
    runs on the CPU and the next one tries the device again."""

    def __init__(self, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.fatal = fatal


class DeviceOps(Protocol):
    """One opened device. Calls are serialized by the backend (one at a time per device).

    kind: "cuda" | "wgsl".
    device_name: what the driver calls the device ("NVIDIA H200", "llvmpipe (LLVM 15.0.6, 256 bits)").
    memory_total_bytes: device memory the driver reports, None where the API cannot say (WebGPU).
    software: a CPU-emulated adapter (lavapipe/llvmpipe, SwiftShader): auto-detection skips it.

    `types` is the payload's ggml_type of (gate, up, down) ("F32", "F16", "BF16" or one of
    `block_types`); `host` is the CPU backend's form of the same expert (dense widened to f32, blocks
    raw, gate|up stacked when they share a format), which the upload reads.
    """

    kind: str
    device_name: str
    memory_total_bytes: int | None
    software: bool
    block_types: tuple[str, ...]  # the block formats its kernels read; an expert in another stays on the CPU

    def device_bytes(self, host: CpuExpert, types: tuple[str, str, str]) -> int:
        """Bytes of device memory `upload` would take for this expert (the budget checks it first)."""
        ...

    def upload(self, host: CpuExpert, types: tuple[str, str, str]) -> Any:
        """Copy an expert's weights to the device in the form the kernels read; returns a handle.
        Raises DeviceError."""
        ...

    def forward(self, handle: Any, x: np.ndarray) -> np.ndarray:
        """x f32 [t, d_model] C-contiguous, finite, t >= 1 -> f32 [t, d_model] (host numpy)
        = down(silu(gate·x) ⊙ up·x), intermediates kept on the device. Raises DeviceError."""
        ...

    def release(self, handle: Any) -> None:
        """Free the handle's device memory. Never raises."""
        ...

    def close(self) -> None:
        """Release the device (at shutdown or after a fatal error). Never raises."""
        ...
