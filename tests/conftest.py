"""Fixtures shared by the whole suite: real node processes for multi-process tests."""

import itertools

import pytest

from testkit.nodes import NodeProcess

# Redis databases 1-14 are for e2e nodes (0: `make run`, 15: in-process tests).
_redis_dbs = itertools.cycle(range(1, 15))


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
    for node in started:
        node.stop()


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
    for node in started:
        node.stop()


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory):
    """One node shared by the read-mostly tests of a module (starting one costs seconds)."""
    node = NodeProcess(data_dir=tmp_path_factory.mktemp("shared") / "node", redis_db=next(_redis_dbs))
    node.start()
    yield node
    node.stop()
