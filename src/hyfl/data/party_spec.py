"""Party specs: the ``--data "parties:..."`` text that names party files and options.

``parties:hospital=a.csv,lab=b.parquet;id=patient;label=outcome`` (or a folder of
party files, or a comma list of them) names one file per party and
:func:`hyfl.data.parties.load_parties` options after ``;``. :func:`is_party_spec`
tells such a value from a dataset name or a LIBSVM file, :func:`parse_party_spec`
reads it, :func:`load_party_spec` loads it, and :func:`load_party_data` adds the
validation data (a config's ``[data] parties`` table is read the same way). The
files themselves are :mod:`hyfl.data.parties`'.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyfl.data.dataset import Dataset
from hyfl.data.parties import PARTY_SUFFIXES, load_parties, party_name, party_suffix
from hyfl.errors import fail
from hyfl.partition import Partition

__all__ = ["PARTY_OPTIONS", "is_party_spec", "load_party_data", "load_party_spec",
           "parse_party_spec"]

#: File name endings read as party files.
_SPEC_PREFIX = "parties:"


_OPTION_KEYS = (
    "id",
    "label",
    "task",
    "classes",
    "features",
    "unlabeled",
    "psi",
    "name",
    "min_common",
    "scope",
)


_ENTRY_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _is_registered(text: str) -> bool:
    from hyfl.data.registry import parse_dataset_name

    return parse_dataset_name(text)[0] is not None


def _party_files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and party_suffix(p.name))


def is_party_spec(value: Any) -> bool:
    """Whether a ``--data`` value describes party files rather than a data set or LIBSVM file.

    True for ``"parties:..."``, for a path ending in a party-file extension
    (``.csv``, ``.parquet``, ...; existing or not, so that loading it gives a
    clear error) and for an existing folder holding party files. False for
    registered data set names.
    """
    if not isinstance(value, str | os.PathLike):
        return False
    text = os.fspath(value).strip()
    if text.startswith(_SPEC_PREFIX):
        return True
    if not text or _is_registered(text):
        return False
    path = Path(text).expanduser()
    if party_suffix(path.name):
        return True
    try:
        return path.is_dir() and bool(_party_files_in(path))
    except OSError:
        return False


def _parse_bool(key: str, value: str) -> bool:
    lower = value.strip().lower()
    if lower in ("1", "yes", "true", "on"):
        return True
    if lower in ("0", "no", "false", "off"):
        return False
    raise fail(f"party spec option {key}", f"is {value!r}", "Use yes or no.")


def _parse_features(value: str) -> list[str] | int:
    value = value.strip()
    if value.isdigit():
        return int(value)
    path = Path(value).expanduser()
    if "|" not in value and path.is_file():
        names = [line.strip() for line in path.read_text().splitlines()]
        names = [n for n in names if n and not n.startswith("#")]
        if not names:
            raise fail(
                f"feature list file {path}",
                "holds no feature names",
                "Write one feature name per line.",
            )
        return names
    if "|" not in value and (os.sep in value or value.endswith(".txt")):
        raise fail(
            f"feature list file {path}",
            "does not exist",
            "Give an existing text file (one name per line), names as f1|f2|..., or a count.",
        )
    return [n.strip() for n in value.split("|") if n.strip()]


def parse_party_spec(value: str | os.PathLike) -> tuple[dict[str, Path], dict[str, Any]]:
    """Split a party spec into ``{party: path}`` and :func:`load_parties` keyword arguments.

    Parameters
    ----------
    value : str or path-like
        ``"parties:[name=]path,...;key=value;..."``, a folder of party files or
        one party file (see the module docstring).

    Returns
    -------
    files : dict of str to Path
    options : dict
        Keyword arguments for :func:`load_parties`.
    """
    text = os.fspath(value).strip()
    body = text[len(_SPEC_PREFIX) :] if text.startswith(_SPEC_PREFIX) else text
    head, *option_parts = body.split(";")
    options: dict[str, Any] = {}
    keywords = {
        "id": "id_column",
        "label": "label_column",
        "weight": "weight_column",
        "task": "task",
        "classes": "classes",
        "features": "features",
        "unlabeled": "unlabeled",
        "psi": "psi",
        "name": "name",
        "min_common": "min_common",
        "scope": "scope",
    }
    for part in option_parts:
        if not part.strip():
            continue
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in keywords:
            raise fail(
                f"party spec option {part.strip()!r}",
                "is not known" if sep else "is not key=value",
                f"Use options {', '.join(k + '=...' for k in _OPTION_KEYS)} after ';'.",
            )
        raw = raw.strip()
        if key == "psi":
            options["psi"] = _parse_bool(key, raw)
        elif key == "min_common":
            try:
                options["min_common"] = int(raw)
            except ValueError:
                raise fail(
                    "party spec option min_common", f"is {raw!r}", "Use a whole number >= 0."
                ) from None
        elif key == "classes":
            options["classes"] = [c.strip() for c in raw.split("|") if c.strip()]
        elif key == "features":
            options["features"] = _parse_features(raw)
        elif key == "label" and raw.lower() in ("", "none"):
            options["label_column"] = None
        else:
            options[keywords[key]] = raw
    entries = [e.strip() for e in head.split(",") if e.strip()]
    if not entries:
        raise fail(
            f"party spec {text!r}",
            "names no party files",
            "Write parties:<file>,<file>,... or give a folder of CSV/Parquet files.",
        )
    files: dict[str, Path] = {}

    def add(party: str, path: Path) -> None:
        if party in files:
            raise fail(
                f"party spec {text!r}",
                f"has two parties called {party!r} ({files[party]} and {path})",
                "Name them explicitly: parties:a=<file>,b=<file>.",
            )
        files[party] = path

    for entry in entries:
        party, sep, rest = entry.partition("=")
        if sep and _ENTRY_NAME.match(party.strip()) and not Path(entry).expanduser().exists():
            party, path = party.strip(), Path(rest.strip()).expanduser()
        else:
            party, path = "", Path(entry).expanduser()
        if path.is_dir():
            found = _party_files_in(path)
            if not found:
                raise fail(
                    f"folder {path}",
                    "holds no party files",
                    f"Put one file per party in it ({', '.join(PARTY_SUFFIXES)}).",
                )
            if party:
                raise fail(
                    f"party spec entry {entry!r}",
                    "names a folder, which holds several parties",
                    "Name files, not folders (parties are named after their files).",
                )
            for file in found:
                add(party_name(file), file)
        else:
            add(party or party_name(path), path)
    return files, options


def load_party_spec(value: str | os.PathLike, **overrides: Any) -> tuple[Dataset, Partition]:
    """Load the party files a ``--data`` value names (see :func:`is_party_spec`).

    Parameters
    ----------
    value : str or path-like
        A party spec (module docstring).
    **overrides
        :func:`load_parties` keyword arguments that win over the spec's options.

    Returns
    -------
    (Dataset, Partition)
        As from :func:`load_parties`.
    """
    files, options = parse_party_spec(value)
    options.update(overrides)
    return load_parties(files, **options)


PARTY_OPTIONS = (
    "id_column",
    "label_column",
    "weight_column",
    "psi",
    "features",
    "columns",
    "task",
    "classes",
    "unlabeled",
    "name",
    "min_common",
    "scope",
)


def _load_source(source: Any, **overrides: Any) -> tuple[Dataset, Partition]:
    """Party data from a spec string/path, or from a mapping ``{"files": ..., **options}``."""
    if isinstance(source, Mapping):
        options = dict(source)
        if "files" not in options:
            raise fail(
                "[data] parties",
                "has no files",
                'Add files = { hospital = "a.csv", lab = "b.parquet" } (or a list of paths).',
            )
        unknown = sorted(set(options) - {"files", *PARTY_OPTIONS})
        if unknown:
            raise fail(
                "[data] parties",
                f"has unknown key(s) {', '.join(unknown)}",
                f"Use files and any of: {', '.join(PARTY_OPTIONS)}.",
            )
        files = options.pop("files")
        return load_parties(files, **{**options, **overrides})
    return load_party_spec(source, **overrides)


def load_party_data(
    source: Any,
    val: Any = None,
    val_fraction: float | None = None,
    seed: int = 0,
) -> tuple[Dataset, Dataset | None, Partition]:
    """Party files as training data, validation data and the partition they define.

    Parameters
    ----------
    source : str, path-like or mapping
        A party spec (:func:`is_party_spec`) or a mapping with ``files`` (as
        for :func:`load_parties`) and :func:`load_parties` options by name
        (a config's ``[data] parties`` table).
    val : str, path-like or mapping, optional
        Validation parties, in the same forms: read with the training
        features (same columns, same order) and the training label classes.
        Their partition is not used: validation scores the global model.
    val_fraction : float in (0, 1), optional
        Hold out this fraction of the aligned samples instead (seeded by
        ``seed``); every party keeps its features and loses the held-out rows.
    seed : int, default 0

    Returns
    -------
    train : Dataset
    validation : Dataset or None
    partition : Partition
        The parties' partition of ``train.X`` (restricted to the training
        rows when ``val_fraction`` holds some out).
    """
    from hyfl.data.holdout import holdout_rows, split_rows
    from hyfl.partition import restrict_samples

    if val is not None and val_fraction is not None:
        raise fail("val and val_fraction", "were both given", "Give only one of them.")
    train, partition = _load_source(source)
    if val_fraction is not None:
        train_rows, val_rows = holdout_rows(train.n_samples, val_fraction, seed)
        partition = restrict_samples(partition, train.X, train_rows)
        train, validation = split_rows(train, train_rows, val_rows, val_fraction, seed)
        partition.validate(train.X)
        return train, validation, partition
    if val is None:
        return train, None, partition
    overrides: dict[str, Any] = {"features": list(train.meta["feature_names"]), "task": train.task}
    if train.task != "regression":
        overrides["classes"] = list(train.meta["classes"])
    validation, _ = _load_source(val, **overrides)
    return train, validation, partition
