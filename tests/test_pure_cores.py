"""The numeric and protocol cores are plain modules: importing them must not import Django.

The list of pure cores exists once, in pyproject.toml (the import contract `pure-cores`, which
`make lint` checks statically); this test reads it and imports every module it names at run
time, where a lazy or dynamic import would show. One subprocess per package, so a module that
drags Django in is named by the failing case (petals' tests/test_aux_functions.py does the
same for its heavy imports).
"""

import pkgutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from importlib.util import find_spec
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("django", "channels", "celery", "ninja")


def _contract(contract_id: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c.get("id") == contract_id)


def _modules(name: str) -> list[str]:
    """`name` and, for a package, every module below it."""
    spec = find_spec(name)
    assert spec is not None, f"{name} is in the pure-cores contract but does not exist"
    if spec.submodule_search_locations is None:
        return [name]
    return [name, *(m.name for m in pkgutil.walk_packages(spec.submodule_search_locations, prefix=f"{name}."))]


def _groups() -> dict[str, list[str]]:
    """The contract's modules by package: core's libraries one by one, each Django app's pure modules."""
    groups: dict[str, list[str]] = defaultdict(list)
    for source in _contract("pure-cores")["source_modules"]:
        for module in _modules(source):
            parts = module.split(".")
            groups[".".join(parts[:2]) if parts[0] in ("apps", "core") else parts[0]].append(module)
    return dict(groups)


GROUPS = _groups()


def test_every_library_under_core_is_a_pure_core() -> None:
    """A package in the list stands for all its modules: a new file under core/ is checked too."""
    assert {"core.experts", "core.formats", "core.transport", "cli", "apps.worker"} <= set(GROUPS)
    assert "core.experts.runtime" in GROUPS["core.experts"] and "cli.main" in GROUPS["cli"]


@pytest.mark.parametrize("modules", GROUPS.values(), ids=GROUPS.keys())
def test_core_imports_no_django(modules: list[str]) -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
