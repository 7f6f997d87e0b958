"""Whether the GPU backends can run in this test process, and why not.

The WGSL backend must run wherever `make test` runs: the Makefile installs wgpu and Mesa's
lavapipe and sets TENZRO_TEST_REQUIRE_WGSL=1, and then a missing adapter is an error, not a
skip. CUDA tests skip where no NVIDIA device exists (the only skip the suite permits).
"""

from __future__ import annotations

import functools
import os


@functools.cache
def wgsl_unavailable() -> str | None:
    """None when a WebGPU adapter opens here, else the reason (DeviceUnavailable's message).
    Raises RuntimeError instead when TENZRO_TEST_REQUIRE_WGSL is set."""
    from core.experts.gpu.ops import DeviceUnavailable
    from core.experts.gpu.wgsl import open_device

    try:
        open_device(allow_software=True).close()
    except DeviceUnavailable as exc:
        if os.environ.get("TENZRO_TEST_REQUIRE_WGSL"):
            raise RuntimeError(f"TENZRO_TEST_REQUIRE_WGSL is set but the WGSL backend cannot run: {exc}") from exc
        return f"WGSL backend unavailable: {exc} (make test installs wgpu and mesa-vulkan-drivers)"
    return None


@functools.cache
def cuda_unavailable() -> str | None:
    """None when CuPy sees an NVIDIA device, else why the CUDA tests skip."""
    from core.experts.gpu.cuda import open_device
    from core.experts.gpu.ops import DeviceUnavailable

    try:
        open_device().close()
    except DeviceUnavailable as exc:
        return f"no CUDA device: {exc}"
    return None
