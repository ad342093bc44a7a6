"""The file every hyfl model is stored in: numeric arrays, a JSON header, a checksum.

A model file is an ``.npz`` of plain numeric arrays (read with
``allow_pickle=False``: nothing in it can run code) plus ``__header__``, the
header's JSON as uint8 bytes. The header names the model's ``kind`` (linear:
:data:`hyfl.model_file.MODEL_KIND`; neural:
:data:`hyfl.neural.model_file.NEURAL_MODEL_KIND`) and ``format``, and carries
``content_sha256``: the SHA-256 of the arrays and the rest of the header, so that
an edited or damaged file is refused (a check against accidents, not a
signature; each kind also checks every field on its own).

This module writes and reads the container; what the arrays and header mean is
the kinds' business (:mod:`hyfl.model_file`, :mod:`hyfl.neural.model_file`), and
:mod:`hyfl.predict` loads either by its kind.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hyfl._io import read_header, read_npz
from hyfl._private_files import private_write
from hyfl.errors import HyflError, fail

__all__ = ["HEADER", "check_content", "content_sha256", "read_container", "read_kind",
           "write_container"]

#: The member holding the header's JSON bytes.
HEADER = "__header__"
_WHAT = "a hyfl model"


def content_sha256(arrays: dict[str, np.ndarray], header: dict, *,
                   names: Sequence[str] | None = None) -> str:
    """The checksum a model file carries: SHA-256 of its arrays and header.

    ``names`` given (linear models): those arrays, in that order, as float64,
    each hashed as name, shape and bytes. ``names`` None (neural models): every
    array in name order, each as name, dtype, shape and bytes. Then the header
    without ``content_sha256``, as sorted JSON.
    """
    h = hashlib.sha256()
    for name in (names if names is not None else sorted(arrays)):
        if names is not None:
            array = np.ascontiguousarray(arrays[name], dtype="<f8")
            h.update(name.encode())
        else:
            array = np.ascontiguousarray(arrays[name])
            h.update(name.encode() + str(array.dtype).encode())
        h.update(np.asarray(array.shape, dtype="<i8").tobytes() + array.tobytes())
    body = {k: v for k, v in header.items() if k != "content_sha256"}
    h.update(json.dumps(body, sort_keys=True, default=str).encode())
    return h.hexdigest()


def write_container(path: str | os.PathLike, arrays: dict[str, np.ndarray], header: dict, *,
                    names: Sequence[str] | None = None) -> Path:
    """Write ``arrays`` and ``header`` (given its ``content_sha256``) to ``path``, atomically.

    ``names``: the checksum's rule (:func:`content_sha256`).
    """
    header = {**header, "content_sha256": content_sha256(arrays, header, names=names)}
    blob = json.dumps(header, sort_keys=True, default=str).encode()
    path = Path(path)
    # Weights and feature scales (the parties' column statistics): owner only.
    with private_write(path, "wb") as f:
        np.savez(f, **arrays, **{HEADER: np.frombuffer(blob, dtype=np.uint8)})
    return path


def read_container(path: str | os.PathLike, missing_fix: str,
                   fix: str = "Pass a model.npz written by hyfl (it never holds pickled "
                   "objects).", *, known: Sequence[str] | None = None
                   ) -> tuple[dict, dict[str, np.ndarray], str]:
    """The header and arrays of the model file at ``path``, and the name errors use for it.

    Nothing is unpickled, and every member's size is checked before it is read
    (:func:`hyfl._io.read_npz`). The checksum is not checked here: its rule is
    the kind's (:func:`check_content`). ``known``: the only array names the kind
    holds (any other member is refused unread).

    Raises
    ------
    HyflError
        The file is missing (``missing_fix`` says what to pass), not an ``.npz``,
        holds objects or members larger than declared, or has no readable header.
    """
    path = Path(path)
    culprit = f"model file {path}"
    if not path.is_file():
        raise fail(culprit, "does not exist", missing_fix)
    arrays = read_npz(path, culprit, _WHAT, fix, expect={HEADER: ("u", 1)},
                      known=None if known is None else (*known, HEADER))
    header = read_header(arrays.pop(HEADER), culprit, _WHAT, "Pass a model.npz written by hyfl.")
    return header, arrays, culprit


def check_content(culprit: str, header: dict, arrays: dict[str, np.ndarray], *,
                  names: Sequence[str] | None = None) -> None:
    """Refuse a file whose arrays or header do not match its ``content_sha256``."""
    if header.get("content_sha256") != content_sha256(arrays, header, names=names):
        raise fail(culprit, "does not match its checksum (it was edited or damaged)",
                   "Retrain, or restore the file the run wrote.")


def read_kind(path: str | os.PathLike) -> str | None:
    """The ``kind`` a model file's header names (None when it is no readable model file);
    reads the header only."""
    try:
        arrays = read_npz(path, "model file", _WHAT, "", only=(HEADER,),
                          expect={HEADER: ("u", 1)})
        header = read_header(arrays[HEADER], "model file", _WHAT, "")
    except HyflError:
        return None
    kind = header.get("kind")
    return kind if isinstance(kind, str) else None
