"""The quantization core is a pure module: importing it must not import Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quantization_package_does_not_import_django():
    code = (
        "import sys\n"
        "import apps.quantization.registry, apps.quantization.payload, apps.quantization.presets\n"
        "import apps.quantization.activations, apps.quantization.baseline\n"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
