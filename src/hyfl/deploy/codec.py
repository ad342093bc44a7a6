"""Messages and party state as NumPy arrays plus one JSON description (the one codec).

The parties of :mod:`hyfl.algorithms.hyfdca_parties` exchange plain Python
trees: dicts, lists and tuples of NumPy arrays,
:class:`~hyfl.privacy.layout.EncryptedVector`, numbers, strings and ``None``.
:func:`encode` turns such a tree into ``(arrays, spec)``: a dict of NumPy
arrays and a JSON string describing the structure; :func:`decode` rebuilds
the tree. Everything that crosses the network, and every client's state kept
between messages, goes through this pair (:mod:`hyfl.deploy.app` wraps the
result into Flower's ``ArrayRecord`` and ``ConfigRecord``).

Ciphertexts travel as bytes. A Paillier ciphertext is an integer modulo
``n**2``: an :class:`EncryptedVector` becomes its chunk ids (int64), the
ciphertexts as fixed-width big-endian bytes back to back (one uint8 array)
and, for each, the number of fresh encryptions summed into it (int64; the
packed cipher needs it to decode, and both Paillier ciphers check it). The
``none`` cipher's "ciphertexts" are float64 values. Decoding stamps the
receiver's cipher on the ciphertexts (its in-process tag), so a ciphertext
from another key is caught when it is added or decrypted.

No pickle: arrays are numeric or bool, and the description is JSON.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from gmpy2 import mpz

from hyfl.errors import fail
from hyfl.privacy.ciphers import Cipher, PaillierCiphertext
from hyfl.privacy.layout import EncryptedVector

__all__ = ["decode", "encode", "encoded_bytes"]


def encode(tree: Any) -> tuple[dict[str, np.ndarray], str]:
    """A tree of payload values -> ``(arrays, spec)`` (see the module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    spec = _encode(tree, arrays)
    return arrays, json.dumps(spec, separators=(",", ":"))


def decode(arrays: dict[str, np.ndarray], spec: str, cipher: Cipher | None = None) -> Any:
    """Rebuild the tree :func:`encode` described; ``cipher`` receives any ciphertexts."""
    try:
        description = json.loads(spec)
    except (TypeError, ValueError):
        raise fail("message", "has no readable description",
                   "Both sides must run the same hyfl version.") from None
    return _decode(description, arrays, cipher)


def encoded_bytes(arrays: dict[str, np.ndarray], spec: str) -> int:
    """Bytes of an encoded tree: its arrays plus its description."""
    return int(sum(a.nbytes for a in arrays.values())) + len(spec)


def _put(arrays: dict[str, np.ndarray], value: np.ndarray) -> str:
    name = str(len(arrays))
    arrays[name] = value
    return name


def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if value is None or isinstance(value, (str, bool)):
        return {"v": value}
    if isinstance(value, np.bool_):
        return {"v": bool(value)}
    if isinstance(value, (int, np.integer)):
        return {"v": int(value)}
    if isinstance(value, (float, np.floating)):
        return {"v": float(value)}
    if isinstance(value, EncryptedVector):
        return _encode_vector(value, arrays)
    if isinstance(value, np.ndarray):
        if value.dtype == object or value.dtype.kind not in "biuf":
            raise fail("message value", f"is an array of dtype {value.dtype}",
                       "Only numeric and bool arrays (and EncryptedVector) can be sent.")
        return {"a": _put(arrays, np.ascontiguousarray(value))}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise fail("message key", f"{key!r} is not a string", "Use string keys.")
        return {"d": {key: _encode(item, arrays) for key, item in value.items()}}
    if isinstance(value, (list, tuple)):
        tag = "t" if isinstance(value, tuple) else "l"
        return {tag: [_encode(item, arrays) for item in value]}
    raise fail("message value", f"of type {type(value).__name__} cannot be sent",
               "Send arrays, numbers, strings, None, EncryptedVector, dicts and lists.")


def _encode_vector(vector: EncryptedVector, arrays: dict[str, np.ndarray]) -> dict:
    chunks = np.asarray(vector.chunks, dtype=np.int64)
    cts = list(vector.ciphertexts)
    out = {"e": _put(arrays, chunks)}
    if cts and all(isinstance(c, PaillierCiphertext) for c in cts):
        ints = [int(c.c) for c in cts]
        width = max((x.bit_length() + 7) // 8 for x in ints) or 1
        blob = b"".join(x.to_bytes(width, "big") for x in ints)
        out.update(kind="paillier", width=width,
                   ct=_put(arrays, np.frombuffer(blob, dtype=np.uint8)),
                   addends=_put(arrays, np.array([c.addends for c in cts], dtype=np.int64)))
    elif cts:
        try:
            values = np.array(cts, dtype=np.float64)
        except (TypeError, ValueError):
            raise fail("ciphertexts", f"of type {type(cts[0]).__name__} cannot be sent",
                       "Send ciphertexts of the paillier, packed or none cipher.") from None
        out.update(kind="float", ct=_put(arrays, values))
    else:
        out.update(kind="empty")
    return out


def _decode(spec: Any, arrays: dict[str, np.ndarray], cipher: Cipher | None) -> Any:
    if not isinstance(spec, dict) or len(spec) == 0:
        raise fail("message", "has a malformed description", "Both sides must run the same hyfl.")
    if "v" in spec:
        return spec["v"]
    if "a" in spec:
        return np.array(arrays[spec["a"]])  # a writable copy: parties update arrays in place
    if "d" in spec:
        return {key: _decode(item, arrays, cipher) for key, item in spec["d"].items()}
    if "l" in spec:
        return [_decode(item, arrays, cipher) for item in spec["l"]]
    if "t" in spec:
        return tuple(_decode(item, arrays, cipher) for item in spec["t"])
    if "e" in spec:
        return _decode_vector(spec, arrays, cipher)
    raise fail("message", "has a malformed description", "Both sides must run the same hyfl.")


def _decode_vector(spec: dict, arrays: dict[str, np.ndarray], cipher: Cipher | None):
    chunks = np.asarray(arrays[spec["e"]], dtype=np.int64)
    kind = spec.get("kind")
    out = np.empty(chunks.size, dtype=object)
    if kind == "paillier":
        tag = getattr(cipher, "_tag", None)
        if tag is None:
            raise fail("received ciphertexts", "are Paillier ciphertexts, but this party's cipher "
                       "is not Paillier", "Run every party and the server with the same cipher.")
        width = int(spec["width"])
        blob = np.asarray(arrays[spec["ct"]], dtype=np.uint8).tobytes()
        addends = np.asarray(arrays[spec["addends"]], dtype=np.int64)
        if len(blob) != width * chunks.size or addends.size != chunks.size:
            raise fail("received ciphertexts", "are truncated",
                       "Both sides must run the same hyfl version.")
        out[:] = [
            PaillierCiphertext(mpz(int.from_bytes(blob[i * width:(i + 1) * width], "big")),
                               int(addends[i]), tag)
            for i in range(chunks.size)
        ]
    elif kind == "float":
        if getattr(cipher, "name", "none") != "none":
            raise fail("received ciphertexts", "are plaintext floats (cipher none), but this "
                       f"party uses cipher {cipher.name!r}",
                       "Run every party and the server with the same cipher.")
        out[:] = np.asarray(arrays[spec["ct"]], dtype=np.float64).tolist()
    elif kind != "empty":
        raise fail("message", "has a malformed description", "Both sides must run the same hyfl.")
    return EncryptedVector(chunks, out)
