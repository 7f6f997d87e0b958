"""Node identity: the ed25519 signing key and the QUIC TLS certificate.

Plain module (no Django): the CLI, the expert worker and the web process all load the
same files from the data dir. The provider id is the hex ed25519 public key; the QUIC
certificate's SHA-256 fingerprint goes into the signed provider record so peers pin it.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from nacl.signing import SigningKey, VerifyKey

from core.transport.pinning import certificate_sha256

KEY_FILE = "node.key"
CERT_FILE = "quic-cert.pem"
CERT_KEY_FILE = "quic-key.pem"
CERT_VALIDITY_DAYS = 3650


@dataclass(frozen=True)
class NodeIdentity:
    signing_key: SigningKey
    cert_path: Path
    cert_key_path: Path
    cert_sha256: str

    @property
    def provider_id(self) -> str:
        """Hex ed25519 public key (64 lowercase hex chars)."""
        return self.signing_key.verify_key.encode().hex()

    def sign(self, message: bytes) -> str:
        """Detached ed25519 signature of `message`, hex."""
        return self.signing_key.sign(message).signature.hex()


def verify_signature(*, provider_id: str, message: bytes, signature_hex: str) -> bool:
    """True when `signature_hex` is provider_id's signature of `message`; never raises on bad input."""
    try:
        VerifyKey(bytes.fromhex(provider_id)).verify(message, bytes.fromhex(signature_hex))
    except Exception:  # nacl raises BadSignatureError, ValueError or TypeError on malformed input
        return False
    return True


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` with mode 0600 and exclusive creation (no window where it is world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _load_or_create_signing_key(path: Path) -> SigningKey:
    if path.exists():
        seed = path.read_bytes()
        if len(seed) != 32:
            raise ValueError(f"{path}: expected a 32-byte ed25519 seed, found {len(seed)} bytes")
        return SigningKey(seed)
    key = SigningKey.generate()
    try:
        _write_private(path, bytes(key))
    except FileExistsError:
        # Another process of this node created it first: use theirs.
        return _load_or_create_signing_key(path)
    return key


def _create_certificate(cert_path: Path, key_path: Path, common_name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=CERT_VALIDITY_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("tenzro-node")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    tmp_key = key_path.with_suffix(".tmp")
    tmp_key.unlink(missing_ok=True)
    _write_private(tmp_key, key_pem)
    cert_path.with_suffix(".tmp").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # Key first, then the certificate: a reader that sees the certificate finds its key.
    os.replace(tmp_key, key_path)
    os.replace(cert_path.with_suffix(".tmp"), cert_path)


def load_or_create_identity(data_dir: Path) -> NodeIdentity:
    """Load this node's key and certificate from `data_dir`, creating them on first start."""
    if not data_dir.is_dir():
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # it will hold the private key
    signing_key = _load_or_create_signing_key(data_dir / KEY_FILE)
    cert_path, key_path = data_dir / CERT_FILE, data_dir / CERT_KEY_FILE
    if not cert_path.exists():
        _create_certificate(cert_path, key_path, signing_key.verify_key.encode().hex()[:32])
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return NodeIdentity(
        signing_key=signing_key,
        cert_path=cert_path,
        cert_key_path=key_path,
        cert_sha256=certificate_sha256(cert.public_bytes(serialization.Encoding.DER)),
    )
