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
:func:`load_key` checks a file before using it (structure, ``p * q == n``,
fingerprint, at least :data:`SECURE_KEY_BITS` bits unless insecure test keys
are allowed) and refuses the wrong kind: a public file where the private key
is needed, a private file where the server expects the public one.

The cipher scheme (``paillier``, ``packed``, ``none``) of a party is its own
policy (node config); the encoding (precision bits, value bound, guard bits)
is a run parameter, not key material: :func:`party_cipher` and
:func:`server_cipher` build the clients' cipher and the server's public view
from a key file and those parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from phe import paillier as _phe

from hyfl._io import write_json
from hyfl.errors import fail
from hyfl.privacy.ciphers import (
    DEFAULT_GUARD_BITS,
    Cipher,
    check_keybits,
    make_cipher,
)

__all__ = [
    "INSECURE_FLAG",
    "KEY_FORMAT",
    "PRIVATE_KEY_FILE",
    "PUBLIC_KEY_FILE",
    "SECURE_KEY_BITS",
    "check_key_size",
    "fingerprint",
    "generate_keys",
    "insecure_warning",
    "load_key",
    "party_cipher",
    "server_cipher",
]

KEY_FORMAT = "hyfl-paillier-key"
PRIVATE_KEY_FILE = "private-key.json"
PUBLIC_KEY_FILE = "public-key.json"
DEFAULT_DEPLOY_KEY_BITS = 2048
#: The smallest Paillier modulus a deployment accepts without the insecure flag:
#: 1024-bit moduli are within reach of factoring, and factoring n is decrypting.
SECURE_KEY_BITS = 2048
#: The command-line flag (node config and run config: ``insecure-test-keys=true``)
#: that admits smaller keys, for tests only.
INSECURE_FLAG = "--insecure-test-keys"
_STALE_FIX = "The file was altered; copy it again from where `hyfl deploy keys` wrote it."


def fingerprint(n: int) -> str:
    """SHA-256 of the modulus (hex, first 32 characters): names a key without revealing it."""
    data = int(n).to_bytes((int(n).bit_length() + 7) // 8, "big")
    return hashlib.sha256(data).hexdigest()[:32]


def check_key_size(bits: int, *, insecure_test_keys: bool = False,
                   culprit: str = "the Paillier key") -> int:
    """Refuse a modulus below :data:`SECURE_KEY_BITS` unless test keys are explicitly allowed.

    Parameters
    ----------
    bits : int
        The modulus size.
    insecure_test_keys : bool, default False
        Admit smaller keys (tests; the caller must then show :func:`insecure_warning`).
    culprit : str
        Names the key in the error.
    """
    if bits < SECURE_KEY_BITS and not insecure_test_keys:
        raise fail(
            culprit,
            f"has {bits} bits, fewer than the {SECURE_KEY_BITS} a deployment needs "
            "(a smaller modulus can be factored, which decrypts everything)",
            f"Generate a {SECURE_KEY_BITS}-bit key pair with `hyfl deploy keys`; for tests only, "
            f"pass {INSECURE_FLAG} (node and run config: insecure-test-keys=true).",
        )
    return bits


def insecure_warning(bits: int) -> str:
    """The line every output of a run with small test keys repeats."""
    return (f"WARNING: insecure test keys: the Paillier modulus has {bits} bits (< "
            f"{SECURE_KEY_BITS}); never use such a run for real data")


def generate_keys(out_dir: str | os.PathLike, key_bits: int = DEFAULT_DEPLOY_KEY_BITS,
                  *, overwrite: bool = False, insecure_test_keys: bool = False
                  ) -> tuple[Path, Path]:
    """Generate a Paillier key pair into ``out_dir``.

    Parameters
    ----------
    out_dir : path-like
        Folder for ``private-key.json`` (mode 0600) and ``public-key.json``;
        created if missing.
    key_bits : int, default 2048
        Modulus size (even, >= 2048; smaller only with ``insecure_test_keys``).
    overwrite : bool, default False
        Replace existing key files (otherwise an error: a new key would lock
        out parties that still hold the old one).
    insecure_test_keys : bool, default False
        Allow a modulus below :data:`SECURE_KEY_BITS` (tests only).

    Returns
    -------
    (private_path, public_path)
    """
    bits = check_key_size(check_keybits(key_bits), insecure_test_keys=insecure_test_keys,
                          culprit="key_bits (--key-bits)")
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
    write_json(private_path, private, indent=1, permissions=0o600)
    write_json(public_path, {**common, "kind": "public"}, indent=1)
    return private_path, public_path


def load_key(path: str | os.PathLike, *, private: bool, insecure_test_keys: bool = False
             ) -> tuple:
    """Read and check a key file: ``(public_key, private_key or None)`` (python-paillier).

    Parameters
    ----------
    path : path-like
    private : bool
        Whether the private key is required (parties: a public key file is
        refused) or must not be there (server: a private key file is refused,
        the server must never hold it).
    insecure_test_keys : bool, default False
        Admit a modulus below :data:`SECURE_KEY_BITS`.

    Every problem -- not JSON, missing or mistyped fields, ``n <= 0``, a
    ``key_bits`` or fingerprint that does not match ``n``, ``p * q != n``, a
    small key -- is a :class:`~hyfl.errors.HyflError` naming the file.
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
    record = _read_record(where)
    kind = record.get("kind")
    if kind not in ("private", "public"):
        raise fail(f"key file {where}", f"has kind {kind!r}, neither 'private' nor 'public'",
                   "Pass a file written by `hyfl deploy keys`.")
    if private and kind != "private":
        raise fail(
            f"key file {where}",
            "holds only the public key, but a party needs the private key",
            f"Give the party {PRIVATE_KEY_FILE} (keep it off the server).",
        )
    if not private and kind == "private":
        raise fail(
            f"key file {where}",
            "holds the private key, but the server must only ever hold the public key",
            f"Give the server {PUBLIC_KEY_FILE} (from the same `hyfl deploy keys` folder) and "
            f"keep {PRIVATE_KEY_FILE} on the parties' machines only.",
        )
    n = _hex_field(record, "n", where)
    if record.get("key_bits") != n.bit_length():
        raise fail(f"key file {where}", f"says key_bits {record.get('key_bits')!r}, but its "
                   f"modulus has {n.bit_length()} bits", _STALE_FIX)
    if fingerprint(n) != record.get("fingerprint"):
        raise fail(f"key file {where}", "has a fingerprint that does not match its modulus",
                   _STALE_FIX)
    check_key_size(n.bit_length(), insecure_test_keys=insecure_test_keys,
                   culprit=f"key file {where}")
    public_key = _phe.PaillierPublicKey(n)
    if not private:
        return public_key, None
    p, q = _hex_field(record, "p", where), _hex_field(record, "q", where)
    if p == 1 or q == 1 or p * q != n:
        raise fail(f"key file {where}", "has factors that do not multiply to its modulus",
                   _STALE_FIX)
    try:
        return public_key, _phe.PaillierPrivateKey(public_key, p, q)
    except (ArithmeticError, ValueError):  # p == q, or factors without inverses: not primes
        raise fail(f"key file {where}", "has factors p and q that are not two distinct primes",
                   _STALE_FIX) from None


def _read_record(where: Path) -> dict:
    """The JSON object of a key file, or a clear error."""
    try:
        record = json.loads(where.read_text())
    except OSError as err:
        raise fail(f"key file {where}", f"cannot be read ({err.strerror})",
                   "Check the path and its permissions.") from None
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        record = None
    if not isinstance(record, dict) or record.get("format") != KEY_FORMAT:
        raise fail(f"key file {where}", f"is not a {KEY_FORMAT} file",
                   "Pass a file written by `hyfl deploy keys`.")
    return record


def _hex_field(record: dict, name: str, where: Path) -> int:
    """A positive integer written as hex (``"0x..."``), or a clear error."""
    text = record.get(name)
    try:
        value = int(text, 16) if isinstance(text, str) and len(text) <= 4096 else 0
    except ValueError:
        value = 0
    if value <= 0:
        raise fail(f"key file {where}", f"has no valid {name!r} (a positive hex integer)",
                   _STALE_FIX)
    return value


def _paillier_cipher(name: str, keypair, precision_bits, bound, guard_bits) -> Cipher:
    """Cipher ``name`` over a key pair (``(public, None)``: the public view)."""
    options = {"precision_bits": precision_bits}
    if bound is not None:
        options["bound"] = bound
    if name == "packed":
        options["guard_bits"] = DEFAULT_GUARD_BITS if guard_bits is None else guard_bits
        # A party's cipher lives for one message (see hyfl.deploy.party): obfuscators
        # precomputed in the background would be thrown away with it.
        options["pool_size"] = 0
    return make_cipher(name, keypair=keypair, **options)


def party_cipher(name: str, key_file: str | os.PathLike | None, *,
                 precision_bits: int | None = None, bound: float | None = None,
                 guard_bits: int | None = None, insecure_test_keys: bool = False) -> Cipher:
    """A party's cipher (with the private key) from its key file.

    ``name`` is ``paillier``, ``packed`` or ``none`` (no key file needed: the
    plaintext pass-through, for tests only). In a deployment the name comes
    from the party's own node config, never from the job. The encoding
    parameters must be the same for every party and the server (they come
    from the run config). ``insecure_test_keys`` admits keys below
    :data:`SECURE_KEY_BITS`.
    """
    if name == "none":
        return make_cipher("none")
    keypair = load_key(key_file, private=True, insecure_test_keys=insecure_test_keys)
    return _paillier_cipher(name, keypair, precision_bits, bound, guard_bits)


def server_cipher(name: str, key_file: str | os.PathLike | None, *,
                  precision_bits: int | None = None, bound: float | None = None,
                  guard_bits: int | None = None, insecure_test_keys: bool = False) -> Cipher:
    """The server's public view of the cipher from the public key file (a private key file
    is refused)."""
    if name == "none":
        return make_cipher("none").public()
    keypair = load_key(key_file, private=False, insecure_test_keys=insecure_test_keys)
    return _paillier_cipher(name, keypair, precision_bits, bound, guard_bits)


def cipher_fingerprint(cipher: Cipher) -> str:
    """The key fingerprint of a Paillier cipher ("" for ``none``)."""
    key = getattr(cipher, "_key", None)
    return "" if key is None else fingerprint(int(key.n))
