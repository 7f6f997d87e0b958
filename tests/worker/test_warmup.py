"""The worker's kernel warm-up: it runs (so compiles) every compute path before the doors open."""

from __future__ import annotations

import pytest

from apps.worker.warmup import warm_kernels
from core.experts.backends import BLOCK_TYPES, CpuBackend


def test_every_weight_format_and_the_wire_are_run() -> None:
    seconds = warm_kernels(CpuBackend(use_numba=False))  # the numpy reference path: no compiler needed
    assert set(seconds) == {"F32", *BLOCK_TYPES, "wire"}
    assert all(s >= 0 for s in seconds.values())


def test_the_numba_kernels_are_compiled_by_it() -> None:
    numba_matmul = pytest.importorskip("core.experts.numba_matmul")
    from apps.receipts import topk_kernel

    warm_kernels(CpuBackend(c_variant="off", fused_max_rows=4))  # numba for the fused and the tiled paths
    for kernel in (numba_matmul.q8_0_matmul, numba_matmul.q4_k_matmul, numba_matmul.q6_k_matmul,
                   numba_matmul.q8_0_dequant_rows, numba_matmul.q4_k_dequant_rows,
                   numba_matmul.q6_k_dequant_rows,
                   *([topk_kernel._sketch_q8_0] if topk_kernel.sketch_variant() == "numba" else [])):  # else C
        assert kernel.signatures, f"{kernel.__name__} was not compiled"
