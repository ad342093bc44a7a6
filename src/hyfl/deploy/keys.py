"""Key files for a deployment: the parties' private key, the server's public key.

In a deployment every party encrypts and decrypts with one shared key pair
and the server only adds ciphertexts, so the key material splits into two
files written by :func:`generate_keys` (``hyfl deploy keys``):

``private-key.json``
    The modulus ``n`` and its factors ``p`` and ``q``. Every party needs it;
    the server must never see it. Written with permissions 0600.
``public-key.json``
    The modulus ``n`` only: what the server needs to add ciphertexts.

A ``ckks`` key pair (``hyfl deploy keys --cipher ckks``) has the same two
files: the private one holds the TenSEAL/SEAL context with its secret key,
the public one the same context without it (public key only: enough to add
and to encrypt, never to decrypt); both as base64 in the JSON record of
format :data:`CKKS_KEY_FORMAT`.

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

import base64
import hashlib
import json
import os
from pathlib import Path

from phe import paillier as _phe

from hyfl._io import write_json
from hyfl._private_files import private_folder, write_private_json
from hyfl.errors import check_choice, fail
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
    "load_ckks_key",
    "load_key",
    "paillier_bits",
    "party_cipher",
    "server_cipher",
]

KEY_FORMAT = "hyfl-paillier-key"
CKKS_KEY_FORMAT = "hyfl-ckks-key"
#: The key scheme of each cipher that needs keys.
KEY_SCHEMES = {"paillier": "paillier", "packed": "paillier", "ckks": "ckks"}
PRIVATE_KEY_FILE = "private-key.json"
PUBLIC_KEY_FILE = "public-key.json"
#: The public key is handed out, so others may read it; never write it (a swapped public
#: key would have the server encrypt under someone else's key).
PUBLIC_KEY_MODE = 0o644
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
                  *, overwrite: bool = False, insecure_test_keys: bool = False,
                  cipher: str = "paillier") -> tuple[Path, Path]:
    """Generate a key pair into ``out_dir``: Paillier (``paillier``, ``packed``) or CKKS.

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
    cipher : str, default "paillier"
        A cipher of :data:`KEY_SCHEMES`; ``ckks`` ignores ``key_bits`` (its
        parameters are fixed at 128-bit security).

    Returns
    -------
    (private_path, public_path)
    """
    scheme = check_choice("cipher", cipher, KEY_SCHEMES)
    if KEY_SCHEMES[scheme] == "paillier":
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
    private_folder(out)  # a new key folder: 0700 from its mkdir
    if KEY_SCHEMES[scheme] == "ckks":
        private, public = _ckks_records()
        write_private_json(private_path, private, indent=1)
        write_json(public_path, public, indent=1, permissions=PUBLIC_KEY_MODE)
        return private_path, public_path
    public_key, private_key = _phe.generate_paillier_keypair(n_length=bits)
    n = int(public_key.n)
    common = {"format": KEY_FORMAT, "version": 1, "key_bits": n.bit_length(),
              "fingerprint": fingerprint(n), "n": hex(n)}
    private = {**common, "kind": "private", "p": hex(int(private_key.p)),
               "q": hex(int(private_key.q))}
    # The private key is created 0600 from the start, never world-readable.
    write_private_json(private_path, private, indent=1)
    write_json(public_path, {**common, "kind": "public"}, indent=1,
               permissions=PUBLIC_KEY_MODE)
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
    if record.get("format") == CKKS_KEY_FORMAT:
        raise fail(f"key file {where}", "holds a ckks key, but the cipher is Paillier",
                   "Use the key files of the cipher you run (hyfl deploy keys --cipher ...).")
    _kind(record, where, private)
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


def _kind(record: dict, where: Path, private: bool) -> str:
    """The file's kind, refused if it is not the one the reader needs."""
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
    return kind


def _ckks_records() -> tuple[dict, dict]:
    """A fresh CKKS key pair as the private and the public key file records."""
    from hyfl.privacy.lattice import make_ckks

    cipher = make_ckks()
    common = {"format": CKKS_KEY_FORMAT, "version": 1, "fingerprint": cipher.fingerprint(),
              **{k: cipher.describe()[k] for k in ("poly_modulus_degree", "modulus_bits",
                                                   "security_bits")}}
    return ({**common, "kind": "private",
             "context": base64.b64encode(cipher.context_bytes(secret=True)).decode("ascii")},
            {**common, "kind": "public",
             "context": base64.b64encode(cipher.context_bytes(secret=False)).decode("ascii")})


def load_ckks_key(path: str | os.PathLike, *, private: bool, **cipher_options) -> Cipher:
    """The ``ckks`` cipher of a key file: with the secret key (parties) or public (server).

    The file is checked like a Paillier one (kind, fingerprint of the public key it
    holds, the secret key present exactly in a private file); ``cipher_options``
    (``precision_bits``, ``bound``) are the run's encoding.
    """
    from hyfl.privacy.lattice import make_ckks

    where = Path(path)
    role = "private key (node config key=...)" if private else "public key (run config public-key)"
    if not str(path) or not where.is_file():
        raise fail(f"{role} file {str(path)!r}", "does not exist" if str(path) else "is not set",
                   "Generate a key pair with `hyfl deploy keys --cipher ckks --out DIR`.")
    record = _read_record(where, CKKS_KEY_FORMAT, (CKKS_KEY_FORMAT,))
    _kind(record, where, private)
    try:
        blob = base64.b64decode(record.get("context", ""), validate=True)
    except (ValueError, TypeError):
        blob = b""
    if not blob:
        raise fail(f"key file {where}", "has no valid 'context' (base64)", _STALE_FIX)
    cipher = make_ckks(context=blob, **cipher_options)
    if cipher.has_private_key != private:
        raise fail(f"key file {where}", "says kind "
                   f"{record['kind']!r} but {'lacks' if private else 'holds'} the secret key",
                   _STALE_FIX)
    if cipher.fingerprint() != record.get("fingerprint"):
        raise fail(f"key file {where}", "has a fingerprint that does not match its key",
                   _STALE_FIX)
    return cipher


def _read_record(where: Path, expected: str = KEY_FORMAT,
                 accepted: tuple[str, ...] = (KEY_FORMAT, CKKS_KEY_FORMAT)) -> dict:
    """The JSON object of a key file, or a clear error."""
    try:
        record = json.loads(where.read_text())
    except OSError as err:
        raise fail(f"key file {where}", f"cannot be read ({err.strerror})",
                   "Check the path and its permissions.") from None
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        record = None
    # A file of the other scheme is read (its reader says which cipher it belongs to);
    # anything else is not a key file of the expected kind.
    if not isinstance(record, dict) or record.get("format") not in accepted:
        raise fail(f"key file {where}", f"is not a {expected} file",
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
    if name == "ckks":
        return load_ckks_key(key_file, private=True, **_ckks_options(precision_bits, bound))
    keypair = load_key(key_file, private=True, insecure_test_keys=insecure_test_keys)
    return _paillier_cipher(name, keypair, precision_bits, bound, guard_bits)


def server_cipher(name: str, key_file: str | os.PathLike | None, *,
                  precision_bits: int | None = None, bound: float | None = None,
                  guard_bits: int | None = None, insecure_test_keys: bool = False) -> Cipher:
    """The server's public view of the cipher from the public key file (a private key file
    is refused)."""
    if name == "none":
        return make_cipher("none").public()
    if name == "ckks":
        return load_ckks_key(key_file, private=False, **_ckks_options(precision_bits, bound))
    keypair = load_key(key_file, private=False, insecure_test_keys=insecure_test_keys)
    return _paillier_cipher(name, keypair, precision_bits, bound, guard_bits)


def _ckks_options(precision_bits, bound) -> dict:
    return {k: v for k, v in (("precision_bits", precision_bits), ("bound", bound))
            if v is not None}


def cipher_fingerprint(cipher: Cipher) -> str:
    """The key fingerprint of a cipher ("" for ``none``)."""
    if cipher.name == "ckks":
        return cipher.fingerprint()
    key = getattr(cipher, "_key", None)
    return "" if key is None else fingerprint(int(key.n))


def paillier_bits(cipher: Cipher) -> int | None:
    """The Paillier modulus size of a cipher (None for ``none`` and ``ckks``, whose
    parameters are fixed at 128-bit security): what the insecure-key warning checks."""
    key = getattr(cipher, "_key", None)
    return None if key is None else int(key.key_bits)
