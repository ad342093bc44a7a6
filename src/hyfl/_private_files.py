"""Files and folders only their owner can read, private from the moment they exist.

A party's machine may have other users. Everything a party or a command writes
that holds private material -- block files with raw features and labels, a
party's saved state, its final duals (whose signs are its labels), keys, model
files and checkpoints (weights, feature scales), logs that may quote values,
Flower's credentials -- goes through this module, so that no such file is ever
readable by anyone else, not even for the moment between its creation and a
later ``chmod``:

* a file is written to a temporary file created by ``os.open`` with mode
  ``0o600`` and ``O_EXCL | O_NOFOLLOW`` (never an existing file or a planted
  symlink) in the same folder, then renamed over the target
  (:func:`private_write`); the umask can only take bits away from ``0o600``,
  so a umask of 0 does not open it up;
* a file opened for appending (a process's log) is created ``0o600`` too; an
  existing one others could read is first copied into a new private file
  (:func:`open_private`): a ``chmod`` would not close a descriptor opened
  before it;
* folders this module creates are ``0o700`` from their ``mkdir``
  (:func:`private_folder`); a folder that exists already is the user's choice
  and is left as it is (the files in it are private anyway).

``tests/test_private_files.py`` checks the mode of each kind of file at its
creation, under a umask of 0.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from hyfl.errors import fail

__all__ = ["PRIVATE_FILE", "PRIVATE_FOLDER", "open_private", "private_folder", "private_write",
           "savez_private", "write_private_bytes", "write_private_json", "write_private_text"]

#: Mode of every private file (owner read and write).
PRIVATE_FILE = 0o600
#: Mode of every folder created for private files (owner only).
PRIVATE_FOLDER = 0o700


def private_folder(path: str | os.PathLike) -> Path:
    """``path`` as a folder; each missing part is created with mode 0700 at its ``mkdir``.

    ``Path.mkdir(parents=True)`` would create the parents with the default mode
    (0777 minus the umask: world-readable), hence one ``mkdir`` per missing part.
    """
    path = Path(path)
    missing = []
    for part in (path, *path.parents):
        if part.exists():
            break
        missing.append(part)
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            os.mkdir(part, PRIVATE_FOLDER)
    if not path.is_dir():
        raise fail(f"folder {path}", "is not a folder", "Pass a folder.")
    return path


@contextlib.contextmanager
def private_write(path: str | os.PathLike, mode: str = "wb", *, durable: bool = True,
                  newline: str | None = None) -> Iterator[IO[Any]]:
    """Write ``path`` through a new 0600 temporary file next to it, renamed over it on success.

    The missing folders are made 0700 (:func:`private_folder`). On an exception the
    temporary file is removed and ``path`` keeps its old content. ``durable=False``
    skips the fsync (the file survives the process, not a crash of the machine).
    """
    # atomic_write creates its temporary file with os.open(O_CREAT | O_EXCL |
    # O_NOFOLLOW, permissions): the mode is the file's from its first moment.
    from hyfl._io import atomic_write

    path = Path(path)
    private_folder(path.parent)
    with atomic_write(path, mode, permissions=PRIVATE_FILE, durable=durable,
                      newline=newline) as f:
        yield f


def write_private_bytes(path: str | os.PathLike, data: bytes, **options) -> Path:
    """Write ``data`` to ``path`` privately and atomically (:func:`private_write`)."""
    with private_write(path, "wb", **options) as f:
        f.write(data)
    return Path(path)


def write_private_text(path: str | os.PathLike, text: str, **options) -> Path:
    """Write ``text`` to ``path`` privately and atomically (:func:`private_write`)."""
    with private_write(path, "w", **options) as f:
        f.write(text)
    return Path(path)


def write_private_json(path: str | os.PathLike, value: Any, *, indent: int | None = 2,
                       **options) -> Path:
    """Write ``value`` as strict JSON (:func:`hyfl._io.dumps_json`), privately and atomically."""
    from hyfl._io import dumps_json

    return write_private_text(path, dumps_json(value, indent=indent) + "\n", **options)


def savez_private(path: str | os.PathLike, *, durable: bool = True, **arrays) -> Path:
    """``np.savez(path, **arrays)``, privately and atomically (never through a default-mode
    file: ``np.savez`` on a path would create one)."""
    import numpy as np

    with private_write(path, "wb", durable=durable) as f:
        np.savez(f, **arrays)
    return Path(path)


def open_private(path: str | os.PathLike, mode: str = "ab") -> IO[Any]:
    """Open ``path`` for appending (``"ab"``, ``"a"``) or writing (``"wb"``, ``"w"``), a
    file only its owner can read.

    For files a process keeps open (logs). A new file is created 0600. An existing
    file that others could read is not merely restricted (``chmod`` does not close
    a descriptor someone opened before, which would read every byte appended
    later): for appending its content is copied into a new private file renamed
    over it; for writing it is replaced. ``O_NOFOLLOW``: a symlink planted in its
    place is refused, not followed.
    """
    if mode not in ("ab", "a", "wb", "w"):
        raise ValueError(f"open_private: mode {mode!r} (one of ab, a, wb, w)")
    path = Path(path)
    private_folder(path.parent)
    with contextlib.suppress(FileNotFoundError):
        info = path.lstat()
        if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
            if mode.startswith("a"):
                with private_write(path, "wb") as fresh, open(path, "rb") as old:
                    shutil.copyfileobj(old, fresh)
            else:
                path.unlink()
    flags = (os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
             | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC))
    try:
        fd = os.open(path, flags, PRIVATE_FILE)
    except OSError as err:
        raise fail(f"file {path}", f"cannot be opened ({err.strerror})",
                   "Remove what is there (a symlink is refused) or pass another folder."
                   ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise fail(f"file {path}", "is not a private regular file (it changed while "
                       "it was opened)", "Check who else writes to this folder.")
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise
