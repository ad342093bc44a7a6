"""Downloading registered dataset files into hyfl's cache, verified by sha256.

A named dataset's files are first looked for on disk (see
:mod:`hyfl.data.registry`). Only when a file is in none of the searched
places, and downloads are allowed, is it fetched from its published
addresses (:attr:`DataFile.urls`, tried in order) into
``<cache>/data``, where ``<cache>`` is ``$HYFL_CACHE``, else
``$XDG_CACHE_HOME/hyfl``, else ``~/.cache/hyfl``.

* Downloads are allowed unless ``HYFL_OFFLINE`` is set to ``1`` (or
  ``true``/``yes``/``on``).
* A file is written to a temporary name in the target folder and renamed
  into place only once complete and verified, so a reader never sees half a
  file and an interrupted download leaves nothing behind.
* Its sha256 is compared with :attr:`DataFile.sha256`. On a mismatch the
  download is deleted and the next address is tried; if none gives the right
  bytes, a :class:`~hyfl.errors.HyflError` names the file, the addresses, the
  expected and received checksums and what to do. A file with no known
  checksum (``sha256=None``) is accepted as downloaded, with a logged warning.
* Only :mod:`urllib` is used, with a short socket timeout
  (:data:`TIMEOUT_SECONDS` per blocking read, not for the whole file).
  Tests replace the module attribute ``_urlopen`` and never touch the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hyfl.errors import fail

__all__ = [
    "DataFile",
    "TIMEOUT_SECONDS",
    "cache_dir",
    "download",
    "download_dir",
    "downloads_allowed",
    "sha256_of",
]

logger = logging.getLogger("hyfl.data")

#: Seconds a connection attempt or a single read may block before giving up.
TIMEOUT_SECONDS = 20.0
_CHUNK = 1 << 20
_OFF_VALUES = ("1", "true", "yes", "on")

# The opener, a module attribute so that tests can replace it (no network in tests).
_urlopen = urllib.request.urlopen


@dataclass(frozen=True)
class DataFile:
    """One file of a registered dataset, as published.

    Attributes
    ----------
    name : str
        File name, as looked for in the data folders and written by a download.
    sha256 : str or None
        Hex sha256 of the file's bytes (compressed, as published). None when
        no checksum is known; a download is then accepted unverified.
    urls : tuple of str
        Addresses to download it from, tried in order (canonical first where
        it is reliable, otherwise mirrors of the same bytes). Empty: the file
        cannot be downloaded (it must be put in a data folder by hand).
    size : int, optional
        Size in bytes, for information and as a check when sha256 is unknown.
    origin : str
        Where the file, its checksum and its addresses come from.
    """

    name: str
    sha256: str | None
    urls: tuple[str, ...] = ()
    size: int | None = None
    origin: str = ""


def cache_dir() -> Path:
    """hyfl's user cache: ``$HYFL_CACHE``, else ``$XDG_CACHE_HOME/hyfl``, else ``~/.cache/hyfl``."""
    explicit = os.environ.get("HYFL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hyfl"


def download_dir() -> Path:
    """Where downloaded dataset files go: ``<cache>/data`` (also a searched folder)."""
    return cache_dir() / "data"


def downloads_allowed() -> bool:
    """False when ``HYFL_OFFLINE`` is ``1``/``true``/``yes``/``on``, else True."""
    return os.environ.get("HYFL_OFFLINE", "").strip().lower() not in _OFF_VALUES


def sha256_of(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _WrongBytes(Exception):
    """A download arrived complete but is not the published file."""


def _download_one(url: str, file: DataFile, target: Path, timeout: float) -> Path:
    request = urllib.request.Request(url, headers={"User-Agent": "hyfl (dataset download)"})
    handle, temporary = tempfile.mkstemp(dir=target, prefix=f".{file.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(handle, "wb") as out, _urlopen(request, timeout=timeout) as response:
            status = getattr(response, "status", None) or 200
            if status != 200:
                raise OSError(f"HTTP status {status}")
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if size == 0:
            raise _WrongBytes("the server sent an empty file")
        if file.sha256 is not None and got != file.sha256.lower():
            raise _WrongBytes(
                f"sha256 {got} of the {size} bytes received differs from the published "
                f"{file.sha256}"
            )
        if file.sha256 is None:
            if file.size is not None and size != file.size:
                raise _WrongBytes(f"{size} bytes received, expected {file.size}")
            logger.warning(
                "%s has no known sha256; accepted unverified from %s (sha256 %s)",
                file.name,
                url,
                got,
            )
        destination = target / file.name
        os.replace(temporary, destination)
        temporary = None
        return destination
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def download(
    file: DataFile, target: str | os.PathLike | None = None, *, timeout: float = TIMEOUT_SECONDS
) -> Path:
    """Download ``file`` into ``target`` (default :func:`download_dir`) and verify it.

    Parameters
    ----------
    file : DataFile
        What to get; its ``urls`` are tried in order.
    target : path-like, optional
        Folder to write into (created if needed).
    timeout : float
        Socket timeout in seconds for connecting and for each read.

    Returns
    -------
    Path
        ``target / file.name``, complete and verified.

    Raises
    ------
    HyflError
        The file has no address, the folder cannot be written, or no address
        gave the published bytes (network errors, HTTP errors, checksum
        mismatches); the message lists what happened at each address.

    Notes
    -----
    This does not look at ``HYFL_OFFLINE``: callers decide whether
    downloading is allowed (:func:`downloads_allowed`).
    """
    target = Path(target) if target is not None else download_dir()
    manual = f"put {file.name} in {target} (or any folder hyfl searches)"
    if not file.urls:
        raise fail(
            f"dataset file {file.name}",
            "has no download address",
            f"Get it yourself and {manual}.",
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise fail(
            f"download folder {target}",
            f"cannot be created: {error}",
            f"Set HYFL_CACHE to a writable folder, or download the file yourself and {manual}.",
        ) from error
    problems: list[str] = []
    wrong_bytes = False
    for url in file.urls:
        logger.info("downloading %s from %s", file.name, url)
        try:
            return _download_one(url, file, target, timeout)
        except _WrongBytes as error:
            wrong_bytes = True
            problems.append(f"{url}: {error} (deleted)")
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as error:
            reason = getattr(error, "reason", None) or error
            problems.append(f"{url}: {reason}")
    checksum = f"sha256 {file.sha256}" if file.sha256 else "no published sha256"
    if wrong_bytes:
        fix = (
            "The published file may have changed or a mirror may be corrupt. Download it "
            f"yourself from {file.urls[0]}, check it ({checksum}), and {manual}."
        )
    else:
        fix = (
            f"Check the network and retry, or download it yourself from {file.urls[0]} "
            f"({checksum}) and {manual}; set HYFL_OFFLINE=1 to stop hyfl from trying."
        )
    raise fail(
        f"download of {file.name}",
        f"failed from every address ({'; '.join(problems)})",
        fix,
    )
