"""Compile, or load from numba's on-disk cache, every kernel an expert worker runs, before it serves.

numba compiles a kernel at its first call. On a cold cache that is seconds per kernel (the
receipt sketch alone takes ~7 s on a 2-core VM), and a worker that compiled on its first
requests would answer its first forwards late: their callers time out
(TENZRO_FORWARD_ATTEMPT_TIMEOUT_S) and fail over, and penalize it, for a node that is only new.
So the worker runs each path once on tiny inputs before it opens its doors: every weight format
through the backend, at batch 1 (fused kernels) and above the backend's fused limit (tiles), each
wire codec both ways, and the receipt sketch of each. With numba's cache warm this takes well
under a second; the worker logs what it took.
"""

from __future__ import annotations

import time

import numpy as np

from apps.receipts.commitment import answer_sketch
from core.experts.backends import BLOCK_TYPES, ComputeBackend, TensorIn
from core.formats.wire import WIRE_CODECS, decode_rows, encode_rows
from core.quantization.registry import quantize
from core.quantization.types import GGMLType

# One K-quant super-block per row (256 values), the smallest shape every format accepts.
_D = 256


def warm_kernels(backend: ComputeBackend, *, receipt_topk: int = 16) -> dict[str, float]:
    """Run every compute path once; returns seconds per path ({"F32": .., "Q8_0": .., "wire": ..})."""
    rng = np.random.default_rng(0)
    # fused_max_rows is the CPU backend's batch limit for its fused kernels; a batch past it takes the tiles
    batches = (1, getattr(backend, "fused_max_rows", 0) + 1)
    x = rng.standard_normal((max(batches), _D)).astype(np.float32)
    weights = [rng.standard_normal((_D, _D)).astype(np.float32) * 0.05 for _ in range(3)]
    seconds: dict[str, float] = {}
    for ggml_type in ("F32", *BLOCK_TYPES):
        started = time.perf_counter()
        tensors = [TensorIn(ggml_type, w.shape, quantize(w, GGMLType(ggml_type))) for w in weights]
        prepared = backend.prepare_expert(*tensors)
        for rows in batches:
            backend.forward(prepared, x[:rows])
        seconds[ggml_type] = time.perf_counter() - started
    started = time.perf_counter()
    for encoding in WIRE_CODECS:
        data = encode_rows(x, encoding)
        decode_rows(data, encoding, tokens=len(x), d_model=_D)
        answer_sketch(data, encoding, tokens=len(x), d_model=_D, k=receipt_topk)
    seconds["wire"] = time.perf_counter() - started
    return seconds
