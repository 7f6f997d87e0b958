"""The numeric and protocol cores are plain modules: importing them must not import Django.

One subprocess per core, so a module that drags Django in is named by the failing case
(petals' tests/test_aux_functions.py does the same for its heavy imports).
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PURE_CORES = {
    "identity and supervisor": ["apps.node.identity", "apps.node.supervisor", "apps.node.liveness"],
    "transport": ["apps.transport.framing", "apps.transport.quic", "apps.transport.admission"],
    "worker cores": ["apps.worker.doors", "apps.worker.publisher"],
    "errors and files": ["apps.errors", "apps.durable_files", "apps.api.b64", "apps.blobs.references"],
    "quantization": ["apps.quantization.registry", "apps.quantization.payload", "apps.quantization.presets",
                     "apps.quantization.activations", "apps.quantization.baseline"],
    "expert runtime": ["apps.experts.runtime", "apps.experts.numba_matmul", "apps.experts.backends",
                       "apps.experts.gating", "apps.experts.wire", "apps.experts.handlers"],
    "catalog": ["apps.catalog.shapes", "apps.catalog.sources", "apps.catalog.checkpoint", "apps.catalog.slicing",
                "apps.catalog.dense"],
    "blobs": ["apps.blobs.store", "apps.blobs.resolver", "apps.blobs.handlers", "apps.blobs.peers"],
    "provider records and gossip": ["apps.providers.records", "apps.providers.gossip"],
    "shard map and planner": ["apps.shardmap.aggregation", "apps.shardmap.planner"],
    "forward combine and dispatch": ["apps.forward.combine", "apps.forward.hedging", "apps.forward.engine"],
    "settlement split": ["apps.settlement.split"],
    "receipts": ["apps.receipts.commitment", "apps.receipts.topk_kernel", "apps.receipts.sampling",
                 "apps.receipts.verdict"],
    "repair selection": ["apps.repair.selection"],
    "whole-model generation": ["apps.generation.spec", "apps.generation.rope", "apps.generation.attention",
                               "apps.generation.model", "apps.generation.weights"],
}


@pytest.mark.parametrize("modules", PURE_CORES.values(), ids=PURE_CORES.keys())
def test_core_imports_no_django(modules: list[str]) -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
