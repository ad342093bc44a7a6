"""Result files: written atomically, as strict JSON, never over earlier results unasked;
``.npz`` files read back with bounded memory.

A results folder is the user's record of a run, so a crash or Ctrl-C while writing must
leave the previous version of each file whole (write a temporary file next to it, flush
it to disk, then rename it over the old one: :func:`atomic_write`), JSON must be JSON
(NaN and infinities become ``null``: :func:`dumps_json`), and a new run must not replace
an earlier one unless asked (:func:`check_results_folder`).

Model files, checkpoints and data blocks come back from disk, possibly from someone
else: :func:`read_npz` reads an ``.npz`` member by member, each only after its ``.npy``
header has been checked against the size the archive declares for it and against a
byte cap (:func:`max_file_bytes`), so a small file cannot make hyfl allocate gigabytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import zipfile
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hyfl.errors import fail

__all__ = ["MAX_FILE_BYTES", "MAX_FILE_BYTES_VARIABLE", "atomic_write", "check_results_folder",
           "dumps_json", "max_file_bytes", "read_header", "read_npz", "strict_json", "write_json",
           "write_text"]

#: Default cap on the bytes of the arrays of one ``.npz`` file hyfl reads (4 GiB: a
#: checkpoint or data block of a few million samples); the environment variable
#: :data:`MAX_FILE_BYTES_VARIABLE` raises it.
MAX_FILE_BYTES = 4 << 30
MAX_FILE_BYTES_VARIABLE = "HYFL_MAX_FILE_BYTES"
#: hyfl writes ``.npz`` members uncompressed; a compressed one (written by other tools)
#: may expand at most this many times (a zip bomb expands a thousandfold) ...
MAX_EXPANSION = 32
#: ... unless it is this small anyway.
_SMALL_MEMBER = 1 << 20


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, permissions: int | None = None,
                 newline: str | None = None, durable: bool = True) -> Iterator[Any]:
    """Open a temporary file next to ``path``; on success it replaces ``path`` at once.

    On an exception the temporary file is removed and ``path`` keeps its old content.
    ``permissions`` (e.g. ``0o600`` for a private key) are set before any byte is written.
    ``durable=False`` skips the fsync: the file survives the process, not a crash
    of the machine.
    """
    path = Path(path)
    tmp, fd = _create_temporary(path, permissions or 0o666)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"newline": newline})) as f:
            yield f
            f.flush()
            if durable:
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


def max_file_bytes() -> int:
    """The cap :func:`read_npz` applies: ``$HYFL_MAX_FILE_BYTES`` or :data:`MAX_FILE_BYTES`."""
    return bytes_setting(MAX_FILE_BYTES_VARIABLE, MAX_FILE_BYTES)


def bytes_setting(variable: str, default: int) -> int:
    """A byte count from the environment (a positive integer), else ``default``."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise fail(f"${variable}", f"is {text!r}, not a positive number of bytes",
                   f"Set it to a byte count such as {default}, or unset it.")
    return value


def read_npz(path: str | os.PathLike, culprit: str, what: str, fix: str, *,
             kinds: str = "biuf", expect: Mapping[str, tuple[str, int | None]] | None = None,
             only: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, each read only after its header was checked.

    ``np.load`` allocates what a member's ``.npy`` header declares and inflates
    what its zip entry holds before anything can be checked: a 1 MB file could
    take a gigabyte. Here every member is checked first -- an ``.npy`` header
    (format 1 or 2) whose dtype is of ``kinds`` (never objects), whose array fills
    exactly the size the zip directory declares for the member, a member that
    expands at most :data:`MAX_EXPANSION`-fold if it is compressed, and arrays of
    at most :func:`max_file_bytes` in all -- and read only then, so reading
    allocates no more than the checked sizes.

    Parameters
    ----------
    path : path-like
    culprit : str
        Names the file in errors (``"model file m.npz"``).
    what : str
        What it should be (``"a hyfl model"``): errors say it "cannot be read as" that.
    fix : str
        What to do about a file that fails a check (``"Retrain, or restore it."``).
    kinds : str, default "biuf"
        Accepted dtype kinds (``numpy.dtype.kind``; add ``"U"`` for strings).
    expect : mapping of str to (str, int or None), optional
        Members that must be present, with their dtype kinds and number of dimensions
        (None: any).
    only : collection of str, optional
        Read only these members (the others are not even checked).

    Returns
    -------
    dict of str to ndarray
        By member name (without ``.npy``).

    Raises
    ------
    HyflError
        The file is missing or not a zip archive, a member is not a plain ``.npy``
        array of an accepted dtype, or it is larger than declared or allowed.
    """
    cap = max_file_bytes()
    try:
        with zipfile.ZipFile(path) as archive:
            members = _npz_members(archive, kinds, dict(expect or {}), only, cap)
            arrays = {}
            for name, (info, dtype, shape, fortran) in members.items():
                with archive.open(info) as f:
                    _npy_header(f, name)  # skip it (checked above)
                    data = bytearray(dtype.itemsize * math.prod(shape))
                    if f.readinto(data) != len(data):
                        raise _Refused(f"member {name!r} is cut short")
                arrays[name] = np.frombuffer(data, dtype=dtype).reshape(
                    shape, order="F" if fortran else "C")
    except _TooLarge as err:
        raise fail(culprit, f"cannot be read as {what} ({err})",
                   f"{fix} If the file is genuine, raise ${MAX_FILE_BYTES_VARIABLE} (a byte "
                   f"count, now {cap}) to read it.") from None
    except (_Refused, OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError,
            NotImplementedError, RuntimeError) as err:  # RuntimeError: an encrypted member
        detail = str(err) if isinstance(err, _Refused) else f"{type(err).__name__}: {err}"
        raise fail(culprit, f"cannot be read as {what} ({detail})", fix) from None
    return arrays


def read_header(blob: np.ndarray, culprit: str, what: str, fix: str) -> dict:
    """The JSON object an ``.npz`` keeps as uint8 bytes (``__header__``), or a clear error."""
    try:
        header = json.loads(blob.tobytes())
    except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deep
        raise fail(culprit, f"cannot be read as {what} (its header is not JSON: "
                   f"{type(err).__name__})", fix) from None
    if not isinstance(header, dict):
        raise fail(culprit, f"cannot be read as {what} (its header is a "
                   f"{type(header).__name__}, not a JSON object)", fix)
    return header


class _Refused(Exception):
    """A member :func:`read_npz` does not read (the message says why)."""


class _TooLarge(_Refused):
    """Arrays beyond the cap (the message says how large)."""


def _npz_members(archive: zipfile.ZipFile, kinds: str,
                 expect: dict[str, tuple[str, int | None]],
                 only: Collection[str] | None, cap: int) -> dict[str, tuple]:
    """Every member's zip entry, dtype, shape and order, checked; nothing read but headers."""
    members: dict[str, tuple] = {}
    total = 0
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if only is not None and name not in only:
            continue
        if not info.filename.endswith(".npy") or name in members:
            raise _Refused(f"member {info.filename!r} is not one array of its own: .npz files "
                           "hold NAME.npy members, once each")
        if (info.compress_type != zipfile.ZIP_STORED
                and info.file_size > max(MAX_EXPANSION * info.compress_size, _SMALL_MEMBER)):
            raise _Refused(f"member {name!r} of {info.compress_size} compressed bytes would "
                           f"expand to {info.file_size}: a zip bomb?")
        with archive.open(info) as f:
            dtype, shape, fortran = _npy_header(f, name)
            header = f.tell()
        kind, ndim = expect.get(name, (kinds, len(shape)))
        if dtype.hasobject or dtype.kind not in kind or dtype.kind not in kinds \
                or not dtype.itemsize:
            raise _Refused(f"member {name!r} has dtype {dtype}, not of the dtype kinds "
                           f"{kind!r}")
        if ndim is not None and len(shape) != ndim:
            raise _Refused(f"member {name!r} has shape {shape}, not {ndim}-D")
        size = dtype.itemsize * math.prod(shape)
        if header + size != info.file_size:
            raise _Refused(f"member {name!r} declares {size} bytes (shape {shape}), but the "
                           f"archive holds {info.file_size - header}")
        total += size
        if total > cap:
            raise _TooLarge(f"its arrays hold more than {cap} bytes, the cap")
        members[name] = (info, dtype, shape, fortran)
    missing = sorted(set(expect) - set(members))
    if missing:
        raise _Refused(f"it lacks member {missing[0]!r}")
    return members


def _npy_header(f, name: str) -> tuple[np.dtype, tuple, bool]:
    """Dtype, shape and Fortran order of the ``.npy`` file ``f``, left at its data."""
    try:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"format version {version}")
        shape, fortran, dtype = read(f)
    except (ValueError, TypeError, SyntaxError, EOFError) as err:
        raise _Refused(f"member {name!r} is not a readable .npy array: {err}") from None
    return dtype, tuple(int(n) for n in shape), bool(fortran)
