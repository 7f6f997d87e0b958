"""Fixtures shared by the whole suite: real node processes for multi-process tests."""

import dataclasses
import importlib
import itertools

import pytest

from testkit.faults import Fault, FaultLog, summary_lines
from testkit.nodes import NodeProcess, stop_all

# Redis databases 1-14 are for e2e nodes (0: `make run`, 15: in-process tests).
_redis_dbs = itertools.cycle(range(1, 15))


@pytest.fixture(autouse=True)
def _genesis_policy(request):
    """Every database holds the genesis policy, as the data migration leaves it.

    A transactional test flushes the database when it ends, the migration's row with it.
    pytest-django runs such tests after all the others, but a pytest-xdist worker runs the
    files it is sent in the order they come, so a later file may find the table empty.
    """
    marker = request.node.get_closest_marker("django_db")
    if marker is None or marker.kwargs.get("transaction") or (marker.args and marker.args[0]):
        return  # no database, or a transactional test: serialized_rollback restores its rows
    request.getfixturevalue("db")
    from django.apps import apps

    importlib.import_module("apps.governance.migrations.0002_seed_default_policy").seed(apps, None)


@pytest.fixture
def start_node(tmp_path):
    """Start real nodes; every node started is stopped at teardown."""
    started: list[NodeProcess] = []
    counter = itertools.count()

    def start(*, env: dict[str, str] | None = None, **kwargs) -> NodeProcess:
        node = NodeProcess(data_dir=tmp_path / f"node{next(counter)}", redis_db=next(_redis_dbs), **kwargs)
        started.append(node)
        return node.start(**(env or {}))

    yield start
    stop_all(started)


@pytest.fixture(scope="module")
def start_module_node(tmp_path_factory):
    """Like start_node, for nodes shared by the tests of one module."""
    started: list[NodeProcess] = []

    def start(*, env: dict[str, str] | None = None, **kwargs) -> NodeProcess:
        root = tmp_path_factory.mktemp("module-node")
        node = NodeProcess(data_dir=root / "node", redis_db=next(_redis_dbs), **kwargs)
        started.append(node)
        return node.start(**(env or {}))

    yield start
    stop_all(started)


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory):
    """One node shared by the read-mostly tests of a module (starting one costs seconds)."""
    node = NodeProcess(data_dir=tmp_path_factory.mktemp("shared") / "node", redis_db=next(_redis_dbs))
    node.start()
    yield node
    node.stop()


# The fault log of the end-to-end tests and its summary table at the end of the run. Under
# pytest-xdist each worker keeps its own log and hands it to the controller when it finishes
# (workeroutput), and the controller prints the table: these hooks live in this top conftest
# because the controller loads no other.
_FAULTS = pytest.StashKey[list[Fault]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_FAULTS] = []


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> FaultLog:
    """Open an entry per fault a test injects (`faults.inject(...)`), close it when it survived."""
    return FaultLog(test=request.node.nodeid, faults=request.config.stash[_FAULTS])


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its faults travel to the controller
        workeroutput["tenzro_faults"] = [dataclasses.asdict(f) for f in session.config.stash[_FAULTS]]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    node.config.stash[_FAULTS].extend(Fault(**f) for f in getattr(node, "workeroutput", {}).get("tenzro_faults", []))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    faults = config.stash.get(_FAULTS, [])
    if not faults:
        return
    terminalreporter.section("faults injected")
    for line in summary_lines(faults):
        terminalreporter.write_line(line)
