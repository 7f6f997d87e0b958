"""Every secret file a node writes is 0600 and its data dir 0700 (docs/security.md, "Files")."""

import stat

from apps.node.identity import load_or_create_identity
from core.env import private_dir, read_or_create_secret


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_are_0600_in_a_0700_data_dir(tmp_path) -> None:
    data = tmp_path / "fresh" / "node"
    token = read_or_create_secret(data / "operator.token")
    assert mode(data) == 0o700 and mode(data / "operator.token") == 0o600
    assert read_or_create_secret(data / "operator.token") == token  # created once, then read
    assert len(read_or_create_secret(data / "django.secret", nbytes=48)) >= 50  # check --deploy wants 50+
    assert mode(data / "django.secret") == 0o600
    load_or_create_identity(tmp_path / "other")
    assert mode(tmp_path / "other") == 0o700
    assert mode(tmp_path / "other" / "node.key") == mode(tmp_path / "other" / "quic-key.pem") == 0o600


def test_an_existing_directory_is_left_to_the_supervisor(tmp_path) -> None:
    """private_dir() never loosens or tightens a directory it did not create; the supervisor
    chmods the data dir to 0700 at every start (apps/node/supervisor.py, Supervisor.prepare)."""
    (tmp_path / "d").mkdir(mode=0o755)
    assert mode(private_dir(tmp_path / "d")) == 0o755
