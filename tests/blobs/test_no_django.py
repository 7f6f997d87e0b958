"""The catalog and blob cores are pure: importing them loads no Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cores_import_no_django():
    code = (
        "import sys\n"
        "import apps.catalog.shapes, apps.catalog.checkpoint, apps.catalog.slicing, apps.blobs.store\n"
        "assert 'django' not in sys.modules, sorted(m for m in sys.modules if m.startswith('django'))\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
