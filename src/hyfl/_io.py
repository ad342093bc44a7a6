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

One rule bounds every reader of hyfl by the file it reads (stated here, once): what
one file or message decodes to -- its arrays, table cells, text -- is at most
:data:`DECODED_RATIO` times its size on disk plus :data:`DECODED_SLACK`
(:func:`decoded_cap`), checked from what the file declares *before* anything is
decoded. ``$HYFL_MAX_EXPANSION`` raises the ratio for a genuine file that compresses
better. :func:`read_npz` applies it to zip members (declared and actual sizes),
:func:`open_bounded` to compressed text (``.gz``, ``.bz2``, ``.xz``, ``.zip``),
:func:`check_csv_shape` to CSV tables (columns x rows) and :func:`read_parquet` to
Parquet files (row groups' sizes and value widths from the metadata).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import lzma
import math
import os
import secrets
import zipfile
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hyfl.errors import HyflError, fail

__all__ = ["DECODED_RATIO", "DECODED_RATIO_VARIABLE", "DECODED_SLACK", "MAX_FILE_BYTES",
           "MAX_FILE_BYTES_VARIABLE", "atomic_write", "check_csv_shape", "check_decoded",
           "check_results_folder", "csv_text", "decoded_cap", "dumps_json", "max_file_bytes",
           "open_bounded", "read_header", "read_npz", "read_parquet", "strict_json",
           "write_json", "write_text"]

#: Default cap on the bytes of the arrays of one ``.npz`` file hyfl reads (4 GiB: a
#: checkpoint or data block of a few million samples); the environment variable
#: :data:`MAX_FILE_BYTES_VARIABLE` raises it.
MAX_FILE_BYTES = 4 << 30
MAX_FILE_BYTES_VARIABLE = "HYFL_MAX_FILE_BYTES"
#: The rule every reader follows: one file (or message) decodes to at most this many
#: times its bytes on disk ... hyfl's own files decode to about their size (``.npz``
#: members are stored, CSV cells are at least two characters for eight bytes of
#: float64, a Python string of a short id is under 64 bytes); a zip or Parquet bomb
#: expands a thousandfold or more, a CSV header of 20,000 columns over one-character
#: rows 8,000-fold.
DECODED_RATIO = 64
#: ... plus this much, so that tiny files (a header, a few rows) always read.
DECODED_SLACK = 16 << 20
#: Raises :data:`DECODED_RATIO` (a whole number) for a genuine file that compresses better.
DECODED_RATIO_VARIABLE = "HYFL_MAX_EXPANSION"


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


#: What a spreadsheet takes for the start of a formula (OWASP, "CSV Injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: Any) -> Any:
    """A CSV cell as OWASP advises against formula injection: text that a spreadsheet
    would run as a formula (starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
    return) gets a leading single quote; anything else is returned unchanged.

    Names taken from files -- a party's column, a class label, a data set's or an
    algorithm's name, an error's text -- reach ``predictions.csv``, ``summary.csv`` and
    ``trials.csv``; ``=HYPERLINK(...)`` there would run when the file is opened. Numbers
    stay numbers: a number (``-1``, ``-0.5``, ``+3e2``) starts no formula and is kept, so
    numeric columns read back as numbers. The :mod:`csv` writer then quotes whatever
    holds a comma, a quote or a line break.

    Parameters
    ----------
    value : object
        The cell; only a ``str`` is changed.

    Returns
    -------
    object
        ``value``, or ``"'" + value`` for text that would start a formula.
    """
    if not isinstance(value, str) or not value.startswith(_FORMULA_START):
        return value
    if value[0] in "\t\r":  # never a number as hyfl writes one
        return "'" + value
    try:
        float(value)
    except ValueError:
        return "'" + value
    return value


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
    return positive_setting(variable, default, "a positive number of bytes", "a byte count")


def positive_setting(variable: str, default: int, what: str = "a positive whole number",
                     example: str = "a value") -> int:
    """A positive integer from the environment variable ``variable``, else ``default``;
    anything else is an error naming the variable (``what`` it must be, ``example``)."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise fail(f"${variable}", f"is {text!r}, not {what}",
                   f"Set it to {example} such as {default}, or unset it.")
    return value


def decoded_ratio() -> int:
    """How many times its size a file may decode to: ``$HYFL_MAX_EXPANSION`` or
    :data:`DECODED_RATIO`."""
    return positive_setting(DECODED_RATIO_VARIABLE, DECODED_RATIO, example="a ratio")


def decoded_cap(size: int) -> int:
    """The most a file (or message) of ``size`` bytes may decode to (the module's rule)."""
    return decoded_ratio() * max(int(size), 0) + DECODED_SLACK


def check_decoded(culprit: str, decoded: int, size: int, fix: str, what: str = "") -> None:
    """Refuse a file of ``size`` bytes that would decode to ``decoded`` bytes, beyond
    :func:`decoded_cap`; called with what the file *declares*, before decoding it.

    Parameters
    ----------
    culprit : str
        Names the file in the error.
    decoded : int
        What reading it would allocate (declared sizes, cells times their width).
    size : int
        Its bytes on disk (or on the wire).
    fix : str
        What to do about a hostile or broken file.
    what : str, optional
        Where the bytes come from (``"20001 columns x 100000 rows"``), for the error.

    Raises
    ------
    HyflError
        ``decoded`` exceeds the cap; the message names the way to raise it.
    """
    cap = decoded_cap(size)
    if decoded > cap:
        ratio = decoded_ratio()
        detail = f" ({what})" if what else ""
        raise fail(culprit, f"would decode to {decoded:,} bytes{detail} from {size:,} bytes, "
                   f"more than hyfl reads from a file of its size ({ratio} times it plus "
                   f"{DECODED_SLACK:,}): a decompression bomb or a forged size?",
                   f"{fix} If the file is genuine, raise ${DECODED_RATIO_VARIABLE} (now "
                   f"{ratio}) to read it.".strip())


class _Bounded(io.RawIOBase):
    """A binary stream that refuses to yield more than ``cap`` bytes (decompressed text)."""

    def __init__(self, raw, cap: int, culprit: str, size: int, fix: str, cost: int):
        self.raw, self.cap, self.culprit, self.size, self.fix = raw, cap, culprit, size, fix
        self.total, self.cost = 0, max(int(cost), 1)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        # Read at most one byte past the cap: enough to know it was crossed, never more.
        view = memoryview(buffer)[:max(0, min(len(buffer), self.cap + 1 - self.total))]
        data = self.raw.read(len(view)) if len(view) else b""
        view[:len(data)] = data
        self.total += len(data)
        if self.total > self.cap:
            check_decoded(self.culprit, self.total * self.cost, self.size, self.fix,
                          f"{self.total:,} bytes of text at {self.cost} bytes each, counted "
                          "while reading")
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.close()
        super().close()


_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


@contextlib.contextmanager
def open_bounded(path: str | os.PathLike, culprit: str, fix: str, *,
                 cost: int = 1) -> Iterator[io.BufferedReader]:
    """``path`` opened for reading bytes, decompressed by its suffix (``.gz``, ``.bz2``,
    ``.xz``, ``.zip`` of one member; gzip also by its magic bytes) and bounded by
    :func:`decoded_cap` of its size.

    A compressed file expands while it is read, so its size cannot be checked first: the
    stream counts what it yields and raises a :class:`~hyfl.errors.HyflError` naming the
    file as soon as the cap is crossed (a gzip bomb stops after ``cap`` bytes, not after
    gigabytes). A zip member's declared size is checked before it is opened.

    Parameters
    ----------
    path : path-like
    culprit : str
        Names the file in errors.
    fix : str
        What to do about a file that fails the check.
    cost : int, default 1
        What one byte of the text may cost its parser (a LIBSVM sample of six
        characters becomes about 28 bytes of arrays: 8): the text is cut at the cap
        divided by it, so that what is decoded from it stays within the cap.

    Yields
    ------
    io.BufferedReader
    """
    path = Path(path)
    size = path.stat().st_size
    cap = decoded_cap(size) // max(int(cost), 1)
    suffix = path.suffix.lower()
    archive = None
    try:
        if suffix == ".zip":
            archive = zipfile.ZipFile(path)
            members = [i for i in archive.infolist() if not i.is_dir()]
            if len(members) != 1:
                raise fail(culprit, f"is a zip archive of {len(members)} files, not of one",
                           "Zip one CSV file alone, or pass the CSV itself.")
            check_decoded(culprit, members[0].file_size, size, fix,
                          f"member {members[0].filename!r} as declared")
            raw = archive.open(members[0])
        else:
            opener = _OPENERS.get(suffix)
            if opener is None:  # gzip without its suffix (downloads keep their names)
                with open(path, "rb") as f:
                    opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
            raw = opener(path, "rb")
    except (OSError, zipfile.BadZipFile, EOFError, lzma.LZMAError) as err:
        if archive is not None:
            archive.close()
        raise fail(culprit, f"could not be opened ({type(err).__name__}: {err})",
                   f"{fix} Check that its suffix matches its compression.".strip()) from None
    stream = io.BufferedReader(_Bounded(raw, cap, culprit, size, fix, cost), 1 << 16)
    try:
        yield stream
    finally:
        stream.close()
        if archive is not None:
            archive.close()


#: What pandas spends on one column of a table besides its cells (its arrays, Series,
#: index entry and parser state): 2.3 kB measured for ``pd.read_csv``, 5.2 kB for a party
#: file read whole; a header of 200,000 columns over one row (1.9 MB) took 856 MB.
CSV_COLUMN_BYTES = 8 << 10


def check_csv_shape(path: str | os.PathLike, culprit: str, fix: str, *,
                    cell_bytes: int = 8) -> tuple[int, int]:
    """Columns of ``path``'s header and an upper bound on its rows, checked against
    :func:`decoded_cap` before a CSV parser fills its table.

    pandas fills every short row up to the header's width: a header of 20,000 columns
    over rows of one character each (160 kB) would become gigabytes of NaN. Columns
    times rows times ``cell_bytes`` (a float64 cell), plus :data:`CSV_COLUMN_BYTES` per
    column (a wide header over few rows costs pandas per column), must fit the cap. The header is
    the first CSV record (quoted line breaks included); rows are counted as line
    breaks (``\n`` or ``\r``: an upper bound), in one streaming pass of bounded memory
    (:func:`open_bounded`, so a compressed file is bounded too).

    Parameters
    ----------
    path : path-like
    culprit : str
    fix : str
    cell_bytes : int, default 8
        What one cell costs parsed.

    Returns
    -------
    (int, int)
        Header columns and the bound on data rows.

    Raises
    ------
    HyflError
        The table would exceed the cap, a header field is longer than a CSV field may
        be, or the file is not text.
    """
    import csv

    size = Path(path).stat().st_size
    with open_bounded(path, culprit, fix) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
        try:
            header = next(csv.reader(text), [])
        except csv.Error as err:  # a field beyond csv.field_size_limit() (128 kB)
            raise fail(culprit, f"has an unreadable header line ({err})", fix) from None
        columns = max(len(header), 1)
        check_decoded(culprit, CSV_COLUMN_BYTES * columns, size, fix, f"{columns} columns x "
                      f"{CSV_COLUMN_BYTES:,} bytes, what pandas spends per column")
        # The rest in chunks of bounded size (the text wrapper read ahead of the header).
        breaks, last = 0, "\n"
        chunk = text.read(1 << 16)
        while chunk:
            breaks += chunk.count("\n") + chunk.count("\r")
            last = chunk[-1]
            check_decoded(culprit, columns * (cell_bytes * breaks + CSV_COLUMN_BYTES), size,
                          fix, f"{columns} columns x at least {breaks} rows")
            chunk = text.read(1 << 16)
    rows = breaks + (last not in "\r\n")
    check_decoded(culprit, columns * (cell_bytes * rows + CSV_COLUMN_BYTES), size, fix,
                  f"{columns} columns x up to {rows} rows")
    return columns, rows


#: What reading a Parquet column costs besides its values (Arrow's column readers, pandas).
PARQUET_COLUMN_BYTES = 32 << 10


def read_parquet(path: str | os.PathLike, culprit: str, fix: str):
    """A Parquet file as a pandas DataFrame, read only after its metadata was checked
    against :func:`decoded_cap`.

    Parquet stores a column of one repeated value in a few bytes (run-length and
    dictionary encoding, then compression): an 870 kB file held 100 million rows and
    took 10 GB to read. From the footer, before any data page is read: the row groups'
    uncompressed page sizes in all, and their values times each column's decoded
    width (8 bytes for numbers, 64 for a Python string object, plus a fixed-length
    value's own bytes). The strings' own bytes are then counted from the columns read
    dictionary-encoded (each distinct value once, an index per row), and only then is
    the table decoded.

    Parameters
    ----------
    path : path-like
    culprit : str
    fix : str

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    HyflError
        Not a readable Parquet file, or beyond the cap.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    size = Path(path).stat().st_size
    try:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        # A nested cell (list, struct, map) becomes a Python object per row in pandas (a
        # 2.8 MB file of 5 million empty lists took 1.1 GB), and hyfl's tables hold one
        # number or text per cell: refused from the schema, before any page is read.
        arrow = parquet.schema_arrow
        for field in arrow:
            if pa.types.is_nested(field.type):
                raise fail(culprit, f"has column {field.name!r} of nested type {field.type} "
                           "(each cell would be a Python object)",
                           f"{fix} Save one number or text per cell.".strip())
        # Dates, times and decimals become Python objects too: counted as strings are.
        objects = {i for i, field in enumerate(arrow) if pa.types.is_date(field.type)
                   or pa.types.is_time(field.type) or pa.types.is_decimal(field.type)}
        pages = values = 0
        strings, schema = set(), parquet.schema
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                pages += max(int(column.total_uncompressed_size), 0)
                count = max(int(column.num_values), int(group.num_rows), 0)
                kind = column.physical_type
                if kind in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"):
                    strings.add(column.path_in_schema.split(".")[0])
                width = 64 if kind == "BYTE_ARRAY" or c in objects else 8
                if kind == "FIXED_LEN_BYTE_ARRAY":
                    width = 64 + max(int(getattr(schema.column(c), "length", 0) or 0), 0)
                values += count * width
        check_decoded(culprit, pages, size, fix, "uncompressed pages, as its metadata declares")
        # Arrow's readers and pandas spend about 32 kB on each column besides its values
        # (a file of 50,000 one-row columns, 7.3 MB, took 1.6 GB).
        values += PARQUET_COLUMN_BYTES * meta.num_columns
        check_decoded(culprit, values, size, fix,
                      f"{meta.num_rows:,} rows x {meta.num_columns} columns, as declared")
        top = set(arrow.names)  # (``schema_arrow`` is rebuilt per use: 50,000 columns, hours)
        strings &= top
        if strings:
            # Each distinct string once, an int32 index per row: bounded by the checks above.
            coded = pq.ParquetFile(path, read_dictionary=sorted(strings)).read(
                columns=sorted(strings))
            lengths = 0
            for column in coded.columns:
                for chunk in column.chunks:
                    if isinstance(chunk, pa.DictionaryArray):
                        per_value = pc.binary_length(chunk.dictionary).fill_null(0).to_numpy(
                            zero_copy_only=False)
                        index = chunk.indices.drop_null().to_numpy(zero_copy_only=False)
                        lengths += int(per_value[index.astype(np.int64)].sum(dtype=np.int64))
                    else:
                        lengths += int(chunk.nbytes)
            del coded
            check_decoded(culprit, values + lengths, size, fix,
                          "its string values included, counted dictionary-encoded")
        return parquet.read(use_pandas_metadata=True).to_pandas()
    except HyflError:
        raise
    except (OSError, ValueError, pa.ArrowException) as err:
        raise fail(culprit, f"could not be read as Parquet: {err}",
                   f"{fix} Check that the file is a complete Parquet file.".strip()) from None


def read_npz(path: str | os.PathLike, culprit: str, what: str, fix: str, *,
             kinds: str = "biuf", expect: Mapping[str, tuple[str, int | None]] | None = None,
             only: Collection[str] | None = None,
             known: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, each read only after its header was checked.

    ``np.load`` allocates what a member's ``.npy`` header declares and inflates
    what its zip entry holds before anything can be checked: a 1 MB file could
    take a gigabyte. Here every member is checked first -- an ``.npy`` header
    (format 1 or 2) whose dtype is of ``kinds`` (never objects), whose array fills
    exactly the size the zip directory declares for the member, and arrays of at
    most :func:`max_file_bytes` in all -- and the archive as a whole first
    (:func:`_check_zip_sizes`): every member's stored bytes inside the file, apart
    from every other member's, a stored member as large as it declares, and all
    declared sizes together within :func:`decoded_cap` of the file's size. It is read
    only then, so reading allocates no more than the checked sizes (a zip member
    never inflates beyond its declared size: :mod:`zipfile` stops there).

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
        Read only these members (the others' sizes are checked, their headers not).
    known : collection of str, optional
        The only member names (without ``.npy``) the file may hold; any other is
        refused unread.

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
        size = Path(path).stat().st_size
        with zipfile.ZipFile(path) as archive:
            _check_zip_sizes(archive, size, culprit, fix, known=known)
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


#: Bytes of a zip local file header before its name and extra field.
_LOCAL_HEADER = 30


def _check_zip_sizes(archive: zipfile.ZipFile, size: int, culprit: str, fix: str, *,
                     known: Collection[str] | None = None) -> None:
    """Refuse an archive whose directory declares more than its ``size`` bytes hold.

    The central directory's sizes are the attacker's to write: a stored member
    declaring 1.6 GB over 1 MB of data made :func:`read_npz` allocate the 1.6 GB
    before finding the data short, and entries that share one compressed stream
    (overlapping members) inflate it once per entry. So, before any member is opened:
    every member's compressed bytes lie inside the file and apart from every other
    member's, a stored member declares the size it stores, no member's name is
    outside ``known``, and the declared sizes sum to at most :func:`decoded_cap`.
    """
    infos = archive.infolist()
    if known is not None:
        allowed = {f"{name}.npy" for name in known}
        unknown = [i.filename for i in infos if i.filename not in allowed]
        if unknown:
            raise _Refused(f"it holds member {unknown[0]!r}, which this kind of file never "
                           "holds")
    if not infos:
        return
    # Zip64 sizes are 64-bit and the attacker's: checked as Python integers first (a sum
    # of int64 would wrap: two members declaring 2**63 each cancelled a third's 1.5 GB).
    for i in infos:
        if i.header_offset + _LOCAL_HEADER + i.compress_size > size:
            raise _Refused(f"member {i.filename!r} declares {i.compress_size} bytes at offset "
                           f"{i.header_offset}, past the file's end ({size} bytes): a forged "
                           "size?")
    check_decoded(culprit, sum(i.file_size for i in infos), size, fix,
                  f"{len(infos)} members' sizes as its zip directory declares")
    start = np.array([i.header_offset for i in infos], dtype=np.int64)
    # The local header's name is as long as the directory's (zipfile checks they match);
    # its extra field is not known before it is opened, so it is not counted (a lower
    # bound on the member's end keeps the check sound).
    end = start + _LOCAL_HEADER + np.array([len(i.orig_filename.encode("utf-8", "replace"))
                                            + i.compress_size for i in infos], dtype=np.int64)
    stored = np.array([i.compress_type == zipfile.ZIP_STORED for i in infos])
    declared = np.array([i.file_size for i in infos], dtype=np.int64)
    packed = np.array([i.compress_size for i in infos], dtype=np.int64)
    beyond = np.flatnonzero(end > size)
    if beyond.size:
        i = infos[beyond[0]]
        raise _Refused(f"member {i.filename!r} declares {i.compress_size} bytes at offset "
                       f"{i.header_offset}, past the file's end ({size} bytes): a forged size?")
    lying = np.flatnonzero(stored & (declared != packed))
    if lying.size:
        i = infos[lying[0]]
        raise _Refused(f"stored member {i.filename!r} declares {i.file_size} bytes but holds "
                       f"{i.compress_size}: a forged size?")
    order = np.argsort(start, kind="stable")
    overlap = np.flatnonzero(start[order][1:] < end[order][:-1])
    if overlap.size:
        i = infos[order[overlap[0] + 1]]
        raise _Refused(f"member {i.filename!r} overlaps another member's bytes (one stream "
                       "inflated for several members: a zip bomb?)")


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
