"""The runtime core is pure: importing it (and every module of apps.experts) loads no Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_runtime_imports_no_django():
    code = (
        "import sys\n"
        "import apps.experts.runtime, apps.experts.kernels, apps.experts.backends\n"
        "assert 'django' not in sys.modules, sorted(m for m in sys.modules if m.startswith('django'))\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
