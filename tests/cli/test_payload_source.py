"""Which way `tenzro moe load-expert --file` sends a payload: a node on this host reads the file."""

import pytest

from cli.moe import _node_on_this_host


@pytest.mark.parametrize(("url", "local"), [
    ("http://127.0.0.1:8000", True), ("http://localhost:8000", True), ("http://127.0.0.2:9", True),
    ("http://[::1]:8000", True), ("https://node.example.org", False), ("http://10.0.0.7:8000", False),
    ("http://[2001:db8::1]:8000", False),
])
def test_node_on_this_host(url: str, local: bool) -> None:
    assert _node_on_this_host(url) is local
