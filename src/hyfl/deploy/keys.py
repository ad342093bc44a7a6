"""Paillier key files for a deployment: the parties' private key, the server's public key.

In a deployment every party encrypts and decrypts with one shared key pair
and the server only adds ciphertexts, so the key material splits into two
files written by :func:`generate_keys` (``hyfl deploy keys``):

``private-key.json``
    The modulus ``n`` and its factors ``p`` and ``q``. Every party needs it;
    the server must never see it. Written with permissions 0600.
``public-key.json``
    The modulus ``n`` only: what the server needs to add ciphertexts.

Both carry a fingerprint of ``n`` (SHA-256) so that parties and server can
check at start-up that they use the same key without sending the key.

The cipher scheme and its encoding (``paillier`` or ``packed``, precision
bits, value bound, guard bits) are run parameters, not key material:
:func:`party_cipher` and :func:`server_cipher` build the clients' cipher and
the server's public view from a key file and those parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from phe import paillier as _phe

from hyfl.errors import fail
from hyfl.privacy.ciphers import (
    DEFAULT_GUARD_BITS,
    Cipher,
    check_keybits,
    make_cipher,
)

__all__ = [
    "KEY_FORMAT",
    "PRIVATE_KEY_FILE",
    "PUBLIC_KEY_FILE",
    "fingerprint",
    "generate_keys",
    "load_key",
    "party_cipher",
    "server_cipher",
]

KEY_FORMAT = "hyfl-paillier-key"
PRIVATE_KEY_FILE = "private-key.json"
PUBLIC_KEY_FILE = "public-key.json"
DEFAULT_DEPLOY_KEY_BITS = 2048


def fingerprint(n: int) -> str:
    """SHA-256 of the modulus (hex, first 32 characters): names a key without revealing it."""
    data = int(n).to_bytes((int(n).bit_length() + 7) // 8, "big")
    return hashlib.sha256(data).hexdigest()[:32]


def generate_keys(out_dir: str | os.PathLike, key_bits: int = DEFAULT_DEPLOY_KEY_BITS,
                  *, overwrite: bool = False) -> tuple[Path, Path]:
    """Generate a Paillier key pair into ``out_dir``.

    Parameters
    ----------
    out_dir : path-like
        Folder for ``private-key.json`` (mode 0600) and ``public-key.json``;
        created if missing.
    key_bits : int, default 2048
        Modulus size (even, >= 128; 1024 or less only for tests).
    overwrite : bool, default False
        Replace existing key files (otherwise an error: a new key would lock
        out parties that still hold the old one).

    Returns
    -------
    (private_path, public_path)
    """
    bits = check_keybits(key_bits)
    out = Path(out_dir)
    private_path, public_path = out / PRIVATE_KEY_FILE, out / PUBLIC_KEY_FILE
    for path in (private_path, public_path):
        if path.exists() and not overwrite:
            raise fail(
                f"key file {path}",
                "already exists",
                "Pass another folder, or overwrite=True (--overwrite) to replace the key pair; "
                "every party then needs the new private key.",
            )
    out.mkdir(parents=True, exist_ok=True)
    public_key, private_key = _phe.generate_paillier_keypair(n_length=bits)
    n = int(public_key.n)
    common = {"format": KEY_FORMAT, "version": 1, "key_bits": n.bit_length(),
              "fingerprint": fingerprint(n), "n": hex(n)}
    private = {**common, "kind": "private", "p": hex(int(private_key.p)),
               "q": hex(int(private_key.q))}
    # The private key is created 0600 from the start, never world-readable.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(private, f, indent=1)
    public_path.write_text(json.dumps({**common, "kind": "public"}, indent=1))
    return private_path, public_path


def load_key(path: str | os.PathLike, *, private: bool) -> tuple:
    """Read a key file: ``(public_key, private_key or None)`` as python-paillier objects.

    Parameters
    ----------
    path : path-like
    private : bool
        Whether the private key is required (parties) or must not be used
        (server: a private key file is accepted, but only its public part is read).
    """
    where = Path(path)
    role = "private key (node config key=...)" if private else "public key (run config public-key)"
    if not str(path) or not where.is_file():
        raise fail(
            f"{role} file {str(path)!r}",
            "does not exist" if str(path) else "is not set",
            "Generate a key pair with `hyfl deploy keys --out DIR` and give each party "
            f"DIR/{PRIVATE_KEY_FILE}, the server DIR/{PUBLIC_KEY_FILE}.",
        )
    try:
        record = json.loads(where.read_text())
        ok = isinstance(record, dict) and record.get("format") == KEY_FORMAT
        n = int(record["n"], 16) if ok else 0
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise fail(
            f"key file {where}",
            f"is not a {KEY_FORMAT} file",
            "Pass a file written by `hyfl deploy keys`.",
        )
    if fingerprint(n) != record.get("fingerprint"):
        raise fail(f"key file {where}", "has a fingerprint that does not match its modulus",
                   "The file was altered; copy it again from where `hyfl deploy keys` wrote it.")
    public_key = _phe.PaillierPublicKey(n)
    if not private:
        return public_key, None
    if record.get("kind") != "private":
        raise fail(
            f"key file {where}",
            "holds only the public key, but a party needs the private key",
            f"Give the party {PRIVATE_KEY_FILE} (keep it off the server).",
        )
    p, q = int(record["p"], 16), int(record["q"], 16)
    if p * q != n:
        raise fail(f"key file {where}", "has factors that do not multiply to its modulus",
                   "The file was altered; copy it again from where `hyfl deploy keys` wrote it.")
    return public_key, _phe.PaillierPrivateKey(public_key, p, q)


def _paillier_cipher(name: str, keypair, precision_bits, bound, guard_bits) -> Cipher:
    """Cipher ``name`` over a key pair (``(public, None)``: the public view)."""
    options = {"precision_bits": precision_bits}
    if bound is not None:
        options["bound"] = bound
    if name == "packed":
        options["guard_bits"] = DEFAULT_GUARD_BITS if guard_bits is None else guard_bits
    return make_cipher(name, keypair=keypair, **options)


def party_cipher(name: str, key_file: str | os.PathLike | None, *,
                 precision_bits: int | None = None, bound: float | None = None,
                 guard_bits: int | None = None) -> Cipher:
    """A party's cipher (with the private key) from its key file.

    ``name`` is ``paillier``, ``packed`` or ``none`` (no key file needed: the
    plaintext pass-through, for tests only). The encoding parameters must be
    the same for every party and the server (they come from the run config).
    """
    if name == "none":
        return make_cipher("none")
    keypair = load_key(key_file, private=True)
    return _paillier_cipher(name, keypair, precision_bits, bound, guard_bits)


def server_cipher(name: str, key_file: str | os.PathLike | None, *,
                  precision_bits: int | None = None, bound: float | None = None,
                  guard_bits: int | None = None) -> Cipher:
    """The server's public view of the cipher from the public key file (no private key)."""
    if name == "none":
        return make_cipher("none").public()
    keypair = load_key(key_file, private=False)
    return _paillier_cipher(name, keypair, precision_bits, bound, guard_bits)


def cipher_fingerprint(cipher: Cipher) -> str:
    """The key fingerprint of a Paillier cipher ("" for ``none``)."""
    key = getattr(cipher, "_key", None)
    return "" if key is None else fingerprint(int(key.n))
