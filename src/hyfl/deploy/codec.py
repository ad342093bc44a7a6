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
``ckks`` ciphertexts are SEAL's serialized vectors back to back (uint8) with
their byte lengths and addend counts, read back against the receiver's
context. The ``none`` cipher's "ciphertexts" are float64 values. Decoding stamps the
receiver's cipher on the ciphertexts (its in-process tag), so a ciphertext
from another key is caught when it is added or decrypted.

No pickle: arrays are numeric or bool, and the description is JSON.

Everything received is untrusted. :func:`decode` checks the description
against the arrays -- nesting depth (:data:`MAX_DEPTH`), known tags only,
array references that exist, numeric dtypes, one-dimensional id and
ciphertext arrays of matching sizes -- and :func:`check_fields` checks the
fields a receiver reads (present, no unknown ones, of the expected type and
shape). Each problem is a :class:`~hyfl.errors.HyflError` naming the sender
and the field, never a ``KeyError`` or a ``RecursionError``.

Decoding is bounded by what was received: each array may be referenced once
(a description naming one array a hundred times would otherwise copy it a
hundred times), ciphertext widths and counts are checked against the arrays
that carry them before any ciphertext object is built, and one message or
state may decode to at most :func:`max_message_bytes` (its arrays, what its
JSON description may cost parsed, and the Python objects of its ciphertexts), and
at most :func:`hyfl._io.decoded_cap` of its own received bytes (the rule every
reader follows).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from gmpy2 import mpz

from hyfl._io import bytes_setting, check_decoded, decoded_cap
from hyfl.errors import HyflError, fail, is_finite
from hyfl.privacy.ciphers import Cipher, PaillierCiphertext
from hyfl.privacy.lattice import LatticeCiphertext
from hyfl.privacy.layout import EncryptedVector

__all__ = ["MAX_DEPTH", "MAX_MESSAGE_BYTES", "MAX_MESSAGE_BYTES_VARIABLE", "bundle",
           "check_fields", "decode", "encode", "encoded_bytes", "max_message_bytes",
           "unbundle"]

#: Deepest nesting of a received description (messages and states nest < 10 deep).
MAX_DEPTH = 32
#: Default cap on what one message or saved state may decode to, in bytes (1 GiB). Real
#: ones weigh far less: covtype (581,012 samples, 3 parties, ckks) sends at most 19 MB and
#: keeps party states of 99 MB (with the data block); 2048-bit Paillier would send about
#: 530 bytes per sample, 230 MB for covtype's largest message. The environment variable
#: :data:`MAX_MESSAGE_BYTES_VARIABLE` raises it (set it for the SuperNodes and the
#: SuperLink's ServerApp alike).
MAX_MESSAGE_BYTES = 1 << 30
MAX_MESSAGE_BYTES_VARIABLE = "HYFL_MAX_MESSAGE_BYTES"
#: Bytes charged per character of a JSON description (or bundle layout): parsed, ``[{},``
#: becomes a dict and a list slot, about 20 bytes per character at worst.
_JSON_COST = 32
#: Bytes charged per received ciphertext beyond its own bytes: its Python objects (a
#: gmpy2 integer or a TenSEAL vector, the ciphertext object, its addend count).
_CIPHERTEXT_COST = 256
_GARBLED = ("Both sides must run the same hyfl version; if they do, the message was garbled "
            "or forged.")
_VECTOR_KEYS = {"paillier": {"e", "kind", "width", "ct", "addends"}, "float": {"e", "kind", "ct"},
                "lattice": {"e", "kind", "ct", "sizes", "addends"}, "empty": {"e", "kind"}}


def encode(tree: Any) -> tuple[dict[str, np.ndarray], str]:
    """A tree of payload values -> ``(arrays, spec)`` (see the module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    spec = _encode(tree, arrays)
    return arrays, json.dumps(spec, separators=(",", ":"))


def decode(arrays: dict[str, np.ndarray], spec: str, cipher: Cipher | None = None, *,
           sender: str = "") -> Any:
    """Rebuild the tree :func:`encode` described; ``cipher`` receives any ciphertexts.

    Parameters
    ----------
    arrays : dict of str to ndarray
    spec : str
        The JSON description.
    cipher : Cipher, optional
        The receiver's cipher (stamped on received ciphertexts).
    sender : str, optional
        Who sent it (``"party 2"``, ``"the server"``), named in every error.

    Raises
    ------
    HyflError
        For any malformed message: unreadable or too deeply nested
        description, unknown tags, missing arrays, wrong dtypes or sizes.
    """
    where = f"message from {sender}" if sender else "message"
    if not isinstance(spec, str):
        raise fail(where, f"has a description of type {type(spec).__name__}, not JSON text",
                   _GARBLED)
    if not isinstance(arrays, Mapping):
        raise fail(where, f"has arrays of type {type(arrays).__name__}, not a mapping", _GARBLED)
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
            raise fail(where, f"has array {name!r} of type "
                       f"{getattr(array, 'dtype', type(array).__name__)}, not numeric", _GARBLED)
    budget = _Budget(where, encoded_bytes(arrays, spec))
    # The arrays may each be referenced once: all of them is the most a description can use.
    budget.charge(sum(int(a.nbytes) for a in arrays.values()) + _JSON_COST * len(spec),
                  f"{len(arrays)} arrays and a description of {len(spec)} characters")
    try:
        description = json.loads(spec)
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        raise fail(where, "has no readable description (not JSON)", _GARBLED) from None
    return _decode(description, arrays, cipher, where, "", 0, budget)


def max_message_bytes() -> int:
    """The cap on one decoded message or state: ``$HYFL_MAX_MESSAGE_BYTES`` or the default."""
    return bytes_setting(MAX_MESSAGE_BYTES_VARIABLE, MAX_MESSAGE_BYTES)


class _Budget:
    """What one message may still decode to, and the arrays its description has used."""

    def __init__(self, where: str, received: int):
        # Two bounds: the absolute cap, and the rule every reader of hyfl follows (a file
        # or message decodes to at most hyfl._io.decoded_cap of its own size).
        self.where, self.cap, self.received = where, max_message_bytes(), received
        self.relative = decoded_cap(received)
        self.left, self.used = min(self.cap, self.relative), set()

    def charge(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` about to be allocated; refuse the message past the cap."""
        self.left -= nbytes
        if self.left < 0 and self.relative < self.cap:
            check_decoded(self.where, self.relative - self.left, self.received, _GARBLED, what)
        if self.left < 0:
            raise fail(self.where, f"would decode to more than {self.cap} bytes ({what})",
                       f"{_GARBLED} If a genuine run needs more, raise "
                       f"${MAX_MESSAGE_BYTES_VARIABLE} (a byte count) on every node.")

    def take(self, arrays: dict[str, np.ndarray], ref: Any, field: str) -> np.ndarray:
        """The array ``ref`` names, which no other field may name."""
        if not isinstance(ref, str) or ref not in arrays:
            raise fail(self.where, f"{field} refers to array {_short(ref)}, which the message "
                       "does not hold", _GARBLED)
        if ref in self.used:
            raise fail(self.where, f"{field} refers to array {ref!r} again (each array is "
                       "referenced once; a description that reuses one would copy it each "
                       "time)", _GARBLED)
        self.used.add(ref)
        return arrays[ref]


def encoded_bytes(arrays: dict[str, np.ndarray], spec: str) -> int:
    """Bytes of an encoded tree: its arrays plus its description."""
    return int(sum(a.nbytes for a in arrays.values())) + len(spec)


def bundle(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    """The arrays of an encoded tree as one byte buffer and its JSON layout.

    Flower moves every array of a message as an object of its own (one
    request each way), so a message of thirty small arrays would cost thirty
    requests; bundled into the bytes of one record (:func:`hyfl.deploy.app.pack`)
    they cost none of their own. :func:`unbundle` reverses it.
    """
    layout = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        if array.dtype.kind not in "biuf":
            raise fail("message value", f"{name!r} is an array of dtype {array.dtype}",
                       "Only numeric arrays travel.")
        layout.append([name, array.dtype.str, list(array.shape)])
    parts = [np.ascontiguousarray(a).view(np.uint8).ravel() for a in arrays.values()]
    buffer = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    return buffer, json.dumps(layout, separators=(",", ":"))


def unbundle(buffer: np.ndarray, layout: str, *, sender: str = "") -> dict[str, np.ndarray]:
    """The arrays :func:`bundle` packed; a clear error when the layout does not fit."""
    where = f"message from {sender}" if sender else "message"
    if not isinstance(layout, str):
        raise fail(where, f"has a bundle layout of type {type(layout).__name__}, not JSON "
                   "text", _GARBLED)
    data = np.asarray(buffer, dtype=np.uint8).ravel()
    # Its arrays are copied out of the buffer, whole (the layout must account for every byte).
    _Budget(where, int(data.size) + len(layout)).charge(int(data.size) + _JSON_COST * len(layout),
                          f"a bundle of {data.size} bytes and a layout of {len(layout)} "
                          "characters")
    try:
        entries = json.loads(layout)
        arrays, offset = {}, 0
        for name, dtype_str, shape in entries:
            dtype = np.dtype(dtype_str)
            if dtype.kind not in "biuf" or not all(isinstance(n, int) and n >= 0
                                                   for n in shape):
                raise ValueError(f"array {name!r}: dtype {dtype_str}, shape {shape}")
            if str(name) in arrays:
                raise ValueError(f"array {name!r} twice")
            size = math.prod(shape) * dtype.itemsize
            if offset + size > data.size:
                raise ValueError(f"array {name!r} runs past the end of the buffer")
            arrays[str(name)] = data[offset:offset + size].view(dtype).reshape(shape).copy()
            offset += size
        if offset != data.size:
            raise ValueError(f"{data.size - offset} bytes left over")
        return arrays
    except (ValueError, TypeError, OverflowError, RecursionError) as err:
        raise fail(where, f"has a garbled array bundle ({type(err).__name__}: {err})",
                   _GARBLED) from None


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
    if cts and all(isinstance(c, LatticeCiphertext) for c in cts):
        # Serialized vectors back to back, with their byte lengths (0: the public zero).
        blobs = [b"" if c.vector is None else c.vector.serialize() for c in cts]
        out.update(kind="lattice",
                   ct=_put(arrays, np.frombuffer(b"".join(blobs) or b"\0", dtype=np.uint8)),
                   sizes=_put(arrays, np.array([len(b) for b in blobs], dtype=np.int64)),
                   addends=_put(arrays, np.array([c.addends for c in cts], dtype=np.int64)))
    elif cts and all(isinstance(c, PaillierCiphertext) for c in cts):
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
                       "Send ciphertexts of the paillier, packed, ckks or none cipher.") from None
        out.update(kind="float", ct=_put(arrays, values))
    else:
        out.update(kind="empty")
    return out


def _decode(spec: Any, arrays: dict[str, np.ndarray], cipher: Cipher | None, where: str,
            path: str, depth: int, budget: _Budget) -> Any:
    """One node of the description; ``path`` names it in errors (``configure.stale``)."""
    field = f"field {path or '(top)'}"
    if depth > MAX_DEPTH:
        raise fail(where, f"{field} is nested deeper than {MAX_DEPTH} levels", _GARBLED)
    if not isinstance(spec, dict) or not spec:
        raise fail(where, f"{field} has a malformed description {_short(spec)}", _GARBLED)
    tag = "e" if "e" in spec else next(iter(spec))
    if tag != "e" and len(spec) != 1:
        raise fail(where, f"{field} has extra keys {sorted(spec)} in its description", _GARBLED)
    value = spec[tag]
    if tag == "v":
        if value is not None and not isinstance(value, (str, bool, int, float)):
            raise fail(where, f"{field} has a value of type {type(value).__name__}, not a "
                       "number, string, bool or null", _GARBLED)
        return value
    if tag == "a":
        return np.array(budget.take(arrays, value, field))  # a writable copy: updated in place
    if tag == "d" and isinstance(value, dict):
        return {key: _decode(item, arrays, cipher, where, f"{path}.{key}" if path else key,
                             depth + 1, budget) for key, item in value.items()}
    if tag in ("l", "t") and isinstance(value, list):
        items = [_decode(item, arrays, cipher, where, f"{path}[{i}]", depth + 1, budget)
                 for i, item in enumerate(value)]
        return tuple(items) if tag == "t" else items
    if tag == "e":
        _check_vector(spec, arrays, where, field, budget)
        try:
            return _decode_vector(spec, arrays, cipher)
        except HyflError as err:  # its checks of the ciphertexts: say whose and where
            raise HyflError(f"{where} {field}: {err}") from None
    raise fail(where, f"{field} has a malformed description {_short(spec)}", _GARBLED)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_vector(spec: dict, arrays: dict[str, np.ndarray], where: str, field: str,
                  budget: _Budget) -> None:
    """The structure of an encrypted vector: known kind and keys, 1-D arrays of one size.

    Its ciphertexts' Python objects are charged to ``budget`` before any is built.
    """
    kind = spec.get("kind")
    if kind not in _VECTOR_KEYS or set(spec) != _VECTOR_KEYS[kind]:
        raise fail(where, f"{field} is an encrypted vector with kind {_short(kind)} and keys "
                   f"{sorted(spec)}", _GARBLED)
    chunks = budget.take(arrays, spec["e"], field)
    if chunks.ndim != 1 or chunks.dtype.kind not in "iu" or (chunks.size and chunks.min() < 0):
        raise fail(where, f"{field} has chunk ids that are not a 1-D array of non-negative "
                   f"integers (dtype {chunks.dtype}, shape {chunks.shape})", _GARBLED)
    if kind == "empty":
        if chunks.size:
            raise fail(where, f"{field} names {chunks.size} chunks but holds no ciphertexts",
                       _GARBLED)
        return
    ct = budget.take(arrays, spec["ct"], field)
    budget.charge(_CIPHERTEXT_COST * chunks.size, f"{field}: {chunks.size} ciphertexts")
    if kind == "float":
        if ct.ndim != 1 or ct.size != chunks.size:
            raise fail(where, f"{field} has {ct.size} values of shape {ct.shape} for "
                       f"{chunks.size} chunks", _GARBLED)
        return
    if kind == "lattice":
        sizes, addends = (budget.take(arrays, spec[k], field) for k in ("sizes", "addends"))
        if (ct.dtype != np.uint8 or ct.ndim != 1 or sizes.ndim != 1 or addends.ndim != 1
                or sizes.dtype.kind not in "iu" or addends.dtype.kind not in "iu"
                or sizes.size != chunks.size or addends.size != chunks.size):
            raise fail(where, f"{field} has lattice ciphertext bytes, sizes or addend counts "
                       "that are not 1-D uint8 and integer arrays, one per chunk", _GARBLED)
        # Python integers: an int64 sum of forged sizes could wrap around and pass.
        # (When every ciphertext is the empty public zero, one placeholder byte travels.)
        lengths = sizes.tolist()
        if min(lengths, default=0) < 0 or ct.size != (sum(lengths) or 1):
            raise fail(where, f"{field} has ciphertext sizes that do not add up to its "
                       f"{ct.size} bytes", _GARBLED)
        return
    width, addends = spec["width"], budget.take(arrays, spec["addends"], field)
    if isinstance(width, bool) or not isinstance(width, int) or not 0 < width <= 1 << 16:
        raise fail(where, f"{field} has ciphertext width {_short(width)}, not a byte count",
                   _GARBLED)
    if ct.dtype != np.uint8 or ct.ndim != 1 or addends.ndim != 1 \
            or addends.dtype.kind not in "iu":
        raise fail(where, f"{field} has ciphertext bytes of dtype {ct.dtype} or addend counts "
                   f"of dtype {addends.dtype} (expected 1-D uint8 and integers)", _GARBLED)
    if ct.size != width * chunks.size or addends.size != chunks.size:
        raise fail(where, f"{field} has {ct.size} ciphertext bytes and {addends.size} addend "
                   f"counts for {chunks.size} ciphertexts of {width} bytes", _GARBLED)


#: Field types :func:`check_fields` knows; a trailing ``?`` allows None or absence.
_TYPES = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                         and is_finite(v)),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "ids": lambda v: isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu",
    "mask": lambda v: isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind == "b",
    "matrix": lambda v: isinstance(v, np.ndarray) and v.ndim == 2 and v.dtype.kind in "iuf",
    "floats": lambda v: (isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iuf"
                         and bool(np.all(np.isfinite(v)))),
    "vector": lambda v: isinstance(v, EncryptedVector),
    "counts": lambda v: isinstance(v, dict) and all(_TYPES["int"](x) for x in v.values()),
    "numbers": lambda v: isinstance(v, dict) and all(_TYPES["number"](x) for x in v.values()),
}
_DESCRIBED = {"int": "an integer", "bool": "true or false", "str": "a string",
              "dict": "a mapping", "list": "a list", "ids": "a 1-D integer array",
              "mask": "a 1-D bool array",
              "matrix": "a 2-D numeric array", "floats": "a 1-D array of finite numbers",
              "vector": "an encrypted vector",
              "counts": "a mapping to integers", "numbers": "a mapping to numbers",
              "number": "a finite number"}


def check_fields(tree: Any, schema: Mapping[str, str], where: str) -> dict:
    """Check the fields a receiver reads: present, of their type, and no unknown ones.

    Parameters
    ----------
    tree : any
        A decoded message (must be a dict).
    schema : mapping of str to str
        Field name -> type (keys of ``_TYPES``: ``int``, ``number``, ``bool``,
        ``str``, ``dict``, ``list``, ``ids``, ``mask``, ``matrix``, ``floats``,
        ``vector``, ``counts``, ``numbers``); a trailing ``?`` makes the field optional
        (absent or None).
    where : str
        Names the message in errors (``"party 2's reply to 'steps'"``).

    Returns
    -------
    dict
        ``tree`` itself.
    """
    if not isinstance(tree, dict):
        raise fail(where, f"is a {type(tree).__name__}, not a mapping of fields", _GARBLED)
    unknown = sorted(set(tree) - set(schema))
    if unknown:
        raise fail(where, f"has unknown field {unknown[0]!r}", f"Expected fields: "
                   f"{', '.join(schema) or 'none'}. {_GARBLED}")
    for name, kind in schema.items():
        optional, kind = kind.endswith("?"), kind.rstrip("?")
        value = tree.get(name)
        if value is None and optional:
            continue
        if name not in tree:
            raise fail(where, f"has no field {name!r}", _GARBLED)
        if not _TYPES[kind](value):
            raise fail(where, f"field {name!r} is {_short(value)}, not "
                       f"{_DESCRIBED[kind]}", _GARBLED)
    return tree


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
        if width > getattr(cipher, "_wire_bytes", width):  # integers mod n^2 of this key
            raise fail("received ciphertexts", f"are {width} bytes wide, wider than any of "
                       "this key", "Run every party and the server with the same key.")
        blob = np.asarray(arrays[spec["ct"]], dtype=np.uint8).tobytes()
        addends = np.asarray(arrays[spec["addends"]], dtype=np.int64)
        out[:] = [
            PaillierCiphertext(mpz(int.from_bytes(blob[i * width:(i + 1) * width], "big")),
                               int(addends[i]), tag)
            for i in range(chunks.size)
        ]
    elif kind == "lattice":
        if not callable(getattr(cipher, "deserialize", None)):
            raise fail("received ciphertexts", "are lattice (ckks) ciphertexts, but this party's "
                       f"cipher is {getattr(cipher, 'name', 'none')!r}",
                       "Run every party and the server with the same cipher.")
        blob = np.asarray(arrays[spec["ct"]], dtype=np.uint8).tobytes()
        sizes = arrays[spec["sizes"]].tolist()  # checked: they add up to the blob's length
        ends = np.cumsum(sizes, dtype=np.int64).tolist()
        out[:] = cipher.deserialize([blob[e - n:e] for e, n in zip(ends, sizes)],
                                    arrays[spec["addends"]].tolist())
    elif kind == "float":
        if getattr(cipher, "name", "none") != "none":
            raise fail("received ciphertexts", "are plaintext floats (cipher none), but this "
                       f"party uses cipher {cipher.name!r}",
                       "Run every party and the server with the same cipher.")
        out[:] = np.asarray(arrays[spec["ct"]], dtype=np.float64).tolist()
    elif kind != "empty":
        raise fail("message", "has a malformed description", "Both sides must run the same hyfl.")
    return EncryptedVector(chunks, out)
