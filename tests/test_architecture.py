"""The layers hold, and the page that describes them names only what exists.

`make lint` checks the import contracts of pyproject.toml on the real tree; these tests plant a
forbidden import in a temporary copy of the code and see lint-imports refuse it, so a contract
that stopped biting (a renamed package, a layer listed twice) fails here rather than letting
everything through. No Django, no services.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("apps", "cli", "core", "tenzro_site", "bench", "tests", "testkit")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The importable code and pyproject.toml, copied (sources only)."""
    root = tmp_path_factory.mktemp("house")
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "results", "screenshots")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    # cwd first on the path, so the copy's packages are the ones analysed, not the installed tree's
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


def test_the_tree_as_it_is_keeps_every_contract(tree_copy: Path) -> None:
    done = _lint(tree_copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "planted", "contract"), [
    # two libraries of one layer: the expert runtime never reads the shard map
    ("core/experts/runtime.py", "from core.shardmap.gossip_view import ProviderView",
     "Django-free libraries, top to bottom"),
    # a library reaching up into a Django app (the import the old contracts let through)
    ("core/experts/runtime.py", "from apps.worker.doors import Door", "The house, top to bottom"),
    # the one-layer forward importing the whole-model generation that drives it
    ("apps/forward/handlers.py", "from apps.generation import handlers as generation",
     "Django apps, top to bottom"),
    # an app reaching up into the roof for a settings helper
    ("apps/node/supervisor.py", "from tenzro_site import celery_app", "The house, top to bottom"),
], ids=["experts-to-shardmap", "core-to-apps", "forward-to-generation", "app-to-roof"])
def test_a_planted_upward_or_sideways_import_fails_lint(tree_copy: Path, module: str, planted: str,
                                                       contract: str) -> None:
    path = tree_copy / module
    original = path.read_text()
    path.write_text(f"{original}\n{planted}  # noqa: E402, F401\n")
    try:
        done = _lint(tree_copy)
    finally:
        path.write_text(original)
    assert done.returncode != 0, done.stdout
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, done.stdout
    target = planted.split()[1]
    assert target.split(".")[0] in broken and module.replace("/", ".").removesuffix(".py") in broken


def test_a_new_package_must_take_a_layer(tree_copy: Path) -> None:
    """The app and library layers are exhaustive: an unlisted package breaks the contract."""
    package = tree_copy / "core" / "newlib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    try:
        done = _lint(tree_copy)
    finally:
        shutil.rmtree(package)
    assert done.returncode != 0 and "core.newlib" in done.stdout, done.stdout


# --- docs/architecture.md ------------------------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
# a path under one of the code's top folders (`core/experts/runtime.py`, `apps/forward/`), or a
# dotted module name (`apps.worker.doors`, `core.formats.wire`)
_PATH = re.compile(r"\b((?:apps|core|cli|tenzro_site|bench|testkit|tests|static|scripts)/[\w./-]*\w/?)")
_MODULE = re.compile(r"`((?:apps|core|cli|tenzro_site)(?:\.\w+)+)`")


def test_architecture_page_names_only_modules_that_exist() -> None:
    text = ARCHITECTURE.read_text()
    paths = set(_PATH.findall(text))
    modules = set(_MODULE.findall(text))
    assert len(paths) >= 40 and len(modules) >= 2, (len(paths), len(modules))  # the page walks the tree
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    missing += sorted(m for m in modules
                      if not (ROOT / m.replace(".", "/")).with_suffix(".py").exists()
                      and not (ROOT / m.replace(".", "/") / "__init__.py").exists()
                      and not _is_attribute(m))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def _is_attribute(dotted: str) -> bool:
    """`apps.worker.doors.METHOD_DOORS`: a name inside a module that exists."""
    module, _, name = dotted.rpartition(".")
    path = (ROOT / module.replace(".", "/")).with_suffix(".py")
    return path.exists() and re.search(rf"^(?:class |def |async def )?{re.escape(name)}\b", path.read_text(),
                                       re.MULTILINE) is not None


def test_every_package_under_apps_and_core_is_on_the_page() -> None:
    text = ARCHITECTURE.read_text()
    for top in ("apps", "core"):
        for package in sorted(p for p in (ROOT / top).iterdir() if (p / "__init__.py").exists()):
            assert f"{top}/{package.name}/" in text, f"docs/architecture.md does not place {top}/{package.name}/"
