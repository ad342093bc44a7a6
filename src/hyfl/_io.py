"""Writing result files: atomically, as strict JSON, never over earlier results unasked.

A results folder is the user's record of a run, so a crash or Ctrl-C while writing must
leave the previous version of each file whole (write a temporary file next to it, flush
it to disk, then rename it over the old one: :func:`atomic_write`), JSON must be JSON
(NaN and infinities become ``null``: :func:`dumps_json`), and a new run must not replace
an earlier one unless asked (:func:`check_results_folder`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hyfl.errors import fail

__all__ = ["atomic_write", "check_results_folder", "dumps_json", "strict_json",
           "write_json", "write_text"]


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, permissions: int | None = None,
                 newline: str | None = None) -> Iterator[Any]:
    """Open a temporary file next to ``path``; on success it replaces ``path`` at once.

    On an exception the temporary file is removed and ``path`` keeps its old content.
    ``permissions`` (e.g. ``0o600`` for a private key) are set before any byte is written.
    """
    path = Path(path)
    tmp, fd = _create_temporary(path, permissions or 0o666)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"newline": newline})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create_temporary(path: Path, mode: int, attempts: int = 100) -> tuple[Path, int]:
    """A new file next to ``path`` under an unguessable name, created by this call.

    ``O_EXCL`` refuses a name that exists (a planted file or symlink: another local user
    could otherwise make a private key readable or send its bytes elsewhere), and the
    random name makes one hard to plant in the first place.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(attempts):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return tmp, os.open(tmp, flags, mode)
        except FileExistsError:
            continue
    raise fail(f"folder {str(path.parent)!r}",
               f"already holds {attempts} temporary files for {path.name!r}",
               "Remove the stale .*.tmp files there (or check who creates them).")


def write_text(path: str | os.PathLike, text: str, **options) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_write(path, "w", **options) as f:
        f.write(text)
    return Path(path)


def strict_json(value: Any) -> Any:
    """``value`` with NumPy values as Python ones and NaN / infinities as ``None``."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return strict_json(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def dumps_json(value: Any, **options) -> str:
    """JSON text of ``value`` that any strict parser reads (NaN and inf as ``null``)."""
    return json.dumps(strict_json(value), allow_nan=False, **options)


def write_json(path: str | os.PathLike, value: Any, *, indent: int | None = 2,
               **options) -> Path:
    """Write ``value`` as strict JSON (see :func:`dumps_json`), atomically."""
    return write_text(path, dumps_json(value, indent=indent) + "\n", **options)


def check_results_folder(out: str | os.PathLike, *, overwrite: bool = False,
                         resume: bool = False, allow: tuple[str, ...] = (),
                         resumable: bool = True, kept: str = "",
                         what: str = "results folder", other: str = "--out") -> Path:
    """Refuse to write into an existing, non-empty results folder unless asked to.

    ``allow`` names entries that may already be there (e.g. ``keys`` for a deployment);
    ``resumable`` says whether the command has ``--resume``; ``kept`` adds what
    ``--overwrite`` keeps to the message; ``what`` names the folder and ``other``
    what to pass instead (e.g. ``"app folder"`` and ``"folder"`` for a command whose
    folder is an argument, not ``--out``).
    """
    out = Path(out)
    if overwrite or resume or not out.exists():
        return out
    if not out.is_dir():
        raise fail(f"{what} {out}", "exists and is not a folder", f"Pass another {other}.")
    existing = sorted(entry.name for entry in out.iterdir() if entry.name not in allow)
    if existing:
        listed = ", ".join(existing[:4]) + (", ..." if len(existing) > 4 else "")
        raise fail(f"{what} {out}", f"exists and is not empty ({listed})",
                   f"Pass another {other}, or pass --overwrite to replace it"
                   + (f" ({kept})" if kept else "")
                   + (" (or --resume to continue it)." if resumable else "."))
    return out
