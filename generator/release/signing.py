"""ed25519 signatures of a release's manifest.json (the `cryptography` package)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ColibriError
from .bundle import MANIFEST, SIGNATURE


def _read_key_file(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ColibriError(f"cannot read key {path}: {e.strerror}") from None


def load_private_key(path: Path):
    """An ed25519 private key: PEM (PKCS#8, as `openssl genpkey -algorithm ed25519` writes) or
    OpenSSH (`ssh-keygen -t ed25519`), unencrypted."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read_key_file(path)
    key = None
    for loader in (serialization.load_pem_private_key, serialization.load_ssh_private_key):
        try:
            key = loader(data, password=None)
            break
        except TypeError:
            raise ColibriError(f"{path}: the key is encrypted; give an unencrypted ed25519 key") from None
        except Exception:  # cryptography raises ValueError or UnsupportedAlgorithm for another format
            continue
    if key is None:
        raise ColibriError(f"{path}: not a PEM or OpenSSH private key")
    if not isinstance(key, Ed25519PrivateKey):
        raise ColibriError(f"{path}: not an ed25519 key (releases are signed with ed25519)")
    return key


def load_public_key(path: Path):
    """An ed25519 public key: PEM (`openssl pkey -pubout`), an OpenSSH line (`ssh-ed25519 …`), or
    the private key itself (its public half is used)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    data = _read_key_file(path)
    key = None
    for loader in (serialization.load_pem_public_key, serialization.load_ssh_public_key):
        try:
            key = loader(data)
            break
        except Exception:  # cryptography raises ValueError or UnsupportedAlgorithm
            continue
    if key is None:
        try:
            key = load_private_key(path).public_key()
        except ColibriError:
            raise ColibriError(f"{path}: not a PEM or OpenSSH ed25519 public key") from None
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise ColibriError(f"{path}: not an ed25519 key (releases are signed with ed25519)")
    return key


def sign_manifest(manifest: bytes, key_path: Path) -> bytes:
    """ed25519 over the bytes of manifest.json: 64 raw bytes (deterministic for a key and manifest)."""
    return load_private_key(key_path).sign(manifest)


def signature_problem(signature: bytes | None, manifest: bytes | None, key_path: Path) -> str | None:
    """Why `signature` is not a valid signature of `manifest` by the key at key_path (None when it
    is): the bytes as verify-release read them once, so what is checked is what is used."""
    from cryptography.exceptions import InvalidSignature

    key = load_public_key(key_path)
    if signature is None:
        return f"{SIGNATURE} is missing: the bundle is not signed"
    if manifest is None:
        return f"{MANIFEST} is missing, so its signature cannot be checked"
    try:
        key.verify(signature, manifest)
    except InvalidSignature:
        return (
            f"{SIGNATURE}: the signature does not verify with {Path(key_path).name} "
            f"({MANIFEST} was changed after signing, or signed with another key)"
        )
    return None


def generate_signing_key(private_path: Path, public_path: Path) -> None:
    """Write a new ed25519 key pair: PKCS#8 PEM private key (mode 0600) and PEM public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    Path(public_path).write_bytes(public)
