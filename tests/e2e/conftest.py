"""The fault log of the end-to-end tests, and its summary table at the end of the run."""

from __future__ import annotations

import pytest

from testkit.faults import Fault, FaultLog, summary_lines

_FAULTS = pytest.StashKey[list[Fault]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_FAULTS] = []


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> FaultLog:
    """Open an entry per fault a test injects (`faults.inject(...)`), close it when it survived."""
    return FaultLog(test=request.node.nodeid, faults=request.config.stash[_FAULTS])


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    faults = config.stash.get(_FAULTS, [])
    if not faults:
        return
    terminalreporter.section("faults injected")
    for line in summary_lines(faults):
        terminalreporter.write_line(line)
