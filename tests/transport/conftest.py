import pytest

from apps.node.identity import load_or_create_identity


@pytest.fixture
def identity(tmp_path):
    """A node identity whose certificate the test's QUIC servers present."""
    return load_or_create_identity(tmp_path / "server")
