"""Node identity: ed25519 key and QUIC certificate in the data dir (no Django)."""

import stat

from apps.node.identity import load_or_create_identity, verify_signature


def test_identity_is_created_once_and_kept(tmp_path) -> None:
    first = load_or_create_identity(tmp_path)
    second = load_or_create_identity(tmp_path)
    assert first.provider_id == second.provider_id
    assert len(first.provider_id) == 64 and int(first.provider_id, 16) >= 0
    assert first.cert_sha256 == second.cert_sha256
    assert stat.S_IMODE((tmp_path / "node.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "quic-key.pem").stat().st_mode) == 0o600


def test_two_data_dirs_are_two_identities(tmp_path) -> None:
    a = load_or_create_identity(tmp_path / "a")
    b = load_or_create_identity(tmp_path / "b")
    assert a.provider_id != b.provider_id
    assert a.cert_sha256 != b.cert_sha256


def test_signatures_verify_and_forgeries_do_not(tmp_path) -> None:
    identity = load_or_create_identity(tmp_path)
    other = load_or_create_identity(tmp_path / "other")
    signature = identity.sign(b"receipt")
    assert verify_signature(provider_id=identity.provider_id, message=b"receipt", signature_hex=signature)
    assert not verify_signature(provider_id=identity.provider_id, message=b"receipt!", signature_hex=signature)
    assert not verify_signature(provider_id=other.provider_id, message=b"receipt", signature_hex=signature)
    assert not verify_signature(provider_id="zz", message=b"receipt", signature_hex="not hex")
