"""Party files: a hybrid partition described by one table per client.

Each party (client) brings one CSV or Parquet file: its rows are the samples
it holds, keyed by an ID column, and its other columns are the features it
holds for those samples, plus optionally a label column.

File format
-----------
* **Formats**, chosen by extension: ``.csv`` (also ``.csv.gz``, ``.csv.bz2``,
  ``.csv.xz``, ``.csv.zip``) with one header line, or ``.parquet``/``.pq``.
  CSVs are UTF-8 (a byte order mark is fine; UTF-16 and Latin-1 are refused).
  Empty files and files with a header but no rows are errors.
* **ID column** (default ``"id"``): the sample key shared across parties
  (a patient number, a user id, ...). Every row needs one and it must be
  unique within the file. IDs are compared as text after stripping
  surrounding spaces: CSV IDs are always read as text (``"007"`` stays
  ``"007"``), integer IDs in Parquet become their decimal text (``7`` and
  ``"7"`` are the same sample), whole-number float IDs are read as integers.
* **Label column** (default ``"label"``), optional per file: numbers
  (``-1``/``1``, ``0``/``1``, class numbers ``0..9``, real targets) or text
  (``"spam"``/``"ham"``). Every sample needs a label from at least one party
  that holds it; parties that both label a sample must agree. A file may hold
  labels and no features (a label-only party: it is aligned like the others
  but is not a client, since it holds no block of X).
* **Weight column** (only with ``weight_column``, spec option ``weight=``),
  optional per file: each sample's loss weight, a number > 0. Once a file has
  it every sample needs a weight from a party holding it, and parties that
  weigh the same sample must agree. The weights become a weighted mean (scaled
  to mean 1), so a sample of weight 3 counts as three copies of it.
* **Feature columns**: every other column. Values must be numbers (booleans
  count as 0/1); an empty cell, NaN or inf is an error (write 0 for "absent"),
  and so is a value beyond ``|v| <= MAX_ABS_VALUE`` (1e150, whose square
  still fits float64; :func:`hyfl.data.loaders.check_values`, as for labels).
  A feature column name used by several parties means the *same* feature
  (one column of the global matrix): the parties then hold the same feature
  for their own samples. Feature order in X: a declared feature list's order,
  else first appearance (files in party order, columns in file order).
* **Likely mistakes**: a column held by one party whose name is a near miss of
  another party's column (``mean raduis`` and ``mean radius``; the same name but
  for case and separators; names that differ only in their numbers, ``x10`` and
  ``x11``, never count) is read as its own feature but warned about
  (:class:`~hyfl.errors.PartyFileWarning`, also in ``meta["notices"]``). A file
  without the label column is an unlabelled party, which is fine, unless it has a
  column whose name is a near miss of the label's (``Outcome``) or a text column
  (``result`` holding ``benign``/``malignant``): that is the label misnamed, an
  error naming the file and the column.

Building the data set and the partition
---------------------------------------
Sample IDs are aligned with private set intersection
(:func:`hyfl.privacy.psi.align`, or plain matching with ``psi=False``; both
number samples the same way): the first party's rows become samples
``0 .. n_0 - 1`` in file order, then each later party's new IDs follow in its
file order. Party order is the order of the mapping (or list) of files, and it
is also the client order of the :class:`~hyfl.partition.Partition`.

When the parties do not all hold the same feature columns (a vertical or
hybrid split, or a labels-only party), at least ``min_common`` sample IDs
(default 1; spec option ``min_common=``) must occur in two or more files:
files that share no ID would otherwise train on a block-diagonal ``X``. The
error names every party with its number of IDs and of shared IDs;
``meta["shared_ids"]`` records the shared count per party.

Entry (sample i, feature m) of the global CSR matrix is owned by the party
whose file holds it. Where several parties hold the same cell (they share the
sample and the feature), their values must agree (up to a relative 1e-12);
the first party in party order owns it and the others hold the feature
without that cell. Without such overlaps the partition is rectangular
(:func:`~hyfl.partition.from_blocks`); with them, it carries an explicit
``entry_owner``. Cells no party holds are 0.

Labels: numbers with two values give a binary task (smaller -> -1, larger ->
+1), more integer values a multiclass task (``0..C-1`` by value), other numbers
regression; text labels with two values give a binary task (first class in
``classes``, or in sorted order, -> -1), more a multiclass task. Pass ``task``
and/or ``classes`` to insist: a label outside them is an error naming the file
and line.

``--data`` specs (:func:`is_party_spec`, :func:`load_party_spec`)
----------------------------------------------------------------
::

    parties:<entry>[,<entry>...][;<option>=<value>...]
    <entry>  = [<party>=]<path>     a CSV/Parquet file, or a folder: all its
                                    party files, sorted by file name
    options  = id=<ID column>  label=<label column>
               task=binary|multiclass|regression  classes=<c1>|<c2>|...
               features=<text file, one feature name per line> | <f1>|<f2>|... | <count>
               unlabeled=error|drop  psi=yes|no  name=<data set name>
               min_common=<minimum number of shared sample IDs, default 1>
               scope=shared|party  (party: a column name belongs to its file, so
                                    equal names in two files are two features,
                                    named <party>.<column>; FATE's guest/host
                                    files both name theirs x0, x1, ...)

e.g. ``parties:hospital=a.csv,lab=b.parquet;id=patient;label=outcome``. A
bare folder holding party files, or a single ``.csv``/``.parquet`` path, is a
party spec too (without options). Party names default to the file name
without its extensions. Paths may not contain ``,`` or ``;``.
"""

from __future__ import annotations

import difflib
import os
import re
import unicodedata
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl._io import check_csv_shape, open_bounded, read_parquet
from hyfl.data.dataset import Dataset
from hyfl.data.loaders import check_values, clean_csr, map_labels
from hyfl.errors import HyflError, PartyFileWarning, check_choice, check_int, fail
from hyfl.partition import Partition, from_blocks

__all__ = ["PARTY_SUFFIXES", "check_files_agree", "load_parties", "party_name", "party_suffix",
           "read_party_file"]

#: File name endings read as party files.
PARTY_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zip", ".parquet", ".pq")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_MAX_NAMED = 5
_VALUE_RTOL = 1e-12
_TASKS = ("binary", "multiclass", "regression")
_UNLABELED = ("error", "drop")


# --------------------------------------------------------------------------- reading


@dataclass
class _Table:
    """One party file, read and checked."""

    party: str
    path: Path
    parquet: bool
    ids: list[str]
    features: list[str]
    values: np.ndarray  # (n_rows, n_features) float64, finite
    labels: np.ndarray | None  # float64 or object (str); None: no label column
    label_known: np.ndarray | None  # bool per row
    weights: np.ndarray | None = None  # float64 > 0 per row; None: no weight column

    @property
    def culprit(self) -> str:
        return f"party file {self.path} (party {self.party!r})"

    def where(self, row: int) -> str:
        return _where(self.parquet, row)


def _where(parquet: bool, row: int) -> str:
    """Human position of data row ``row`` (0-based): CSV line or 1-based Parquet row."""
    return f"row {row + 1}" if parquet else f"line {row + 2}"


def party_suffix(name: str) -> str | None:
    lower = name.lower()
    for suffix in PARTY_SUFFIXES:
        if lower.endswith(suffix):
            return suffix
    return None


def party_name(path: Path) -> str:
    suffix = party_suffix(path.name)
    return path.name[: -len(suffix)] if suffix else path.stem


def _read_frame(path: Path, parquet: bool, id_column: str, culprit: str):
    import pandas as pd

    if not path.exists():
        raise fail(culprit, "does not exist", "Check the path of the party file.")
    if path.is_dir():
        raise fail(culprit, "is a directory", "Pass a CSV or Parquet file.")
    if path.stat().st_size == 0:
        raise fail(
            culprit,
            "is empty (0 bytes)",
            "Write a header line and one row per sample, or leave the party out.",
        )
    if parquet:
        # Bounded by the file's size, checked from its metadata before any page is read.
        frame = read_parquet(path, culprit, "Save it again from its source, or as .csv.")
        names = [str(c).strip() for c in frame.columns]
    else:
        if path.name.lower().endswith(".csv"):
            with open(path, "rb") as f:
                head = f.read(4096)
            if head[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in head:
                raise fail(
                    culprit,
                    "is not UTF-8 text (it looks UTF-16 encoded or binary)",
                    "Save it as a UTF-8 CSV (e.g. 'CSV UTF-8' in a spreadsheet program).",
                )
        fix = ("Write one header line and rows with as many comma-separated fields as the "
               "header.")
        try:
            # Columns x rows against the file's size first (a compressed one is bounded
            # while it streams): pandas fills every short row to the header's width.
            check_csv_shape(path, culprit, fix)
            with open_bounded(path, culprit, fix) as f:
                header = pd.read_csv(f, header=None, nrows=1, dtype=str, keep_default_na=False)
            with open_bounded(path, culprit, fix) as f:
                frame = pd.read_csv(f, dtype={id_column: str})
        except HyflError:
            raise
        except pd.errors.EmptyDataError as error:
            raise fail(
                culprit,
                "is empty (no header line)",
                "Write a header line and one row per sample, or leave the party out.",
            ) from error
        except UnicodeDecodeError as error:
            raise fail(
                culprit,
                f"is not UTF-8 text (it holds byte {error.object[error.start]:#04x}, "
                "which UTF-8 cannot decode; Latin-1 or Windows-1252 perhaps)",
                "Save it as a UTF-8 CSV (e.g. 'CSV UTF-8' in a spreadsheet program).",
            ) from error
        except (ValueError, OSError, pd.errors.ParserError) as error:
            raise fail(
                culprit,
                f"is not a valid CSV: {' '.join(str(error).split())}",
                "Write one header line and rows with as many comma-separated fields as the "
                "header (quote fields that contain commas).",
            ) from error
        # pandas renames duplicate headers ("f1", "f1.1"); check the raw header.
        names = [str(c).strip() for c in header.iloc[0].tolist()]
        if len(names) != frame.shape[1]:
            names = [str(c).strip() for c in frame.columns]
    seen: dict[str, int] = {}
    for position, name in enumerate(names):
        if name in seen:
            raise fail(
                culprit,
                f"has column {name!r} twice (columns {seen[name] + 1} and {position + 1})",
                "Give every column a distinct name; a feature may appear once per file.",
            )
        seen[name] = position
    frame.columns = names
    return frame


def _canonical_ids(column, parquet: bool, culprit: str, id_column: str) -> list[str]:
    import pandas as pd

    fix = "Give every row an ID (the sample key shared across parties), or delete the row."
    missing = column.isna().to_numpy()
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise fail(culprit, f"has no ID in column {id_column!r} at {_where(parquet, row)}", fix)
    if pd.api.types.is_bool_dtype(column):
        raise fail(
            culprit,
            f"has True/False values in ID column {id_column!r}",
            "Use text or integer sample IDs.",
        )
    if pd.api.types.is_integer_dtype(column):
        return [str(int(v)) for v in column.to_numpy()]
    if pd.api.types.is_float_dtype(column):
        values = column.to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values)))
        if bad.size:
            row = int(bad[0])
            raise fail(
                culprit,
                f"has ID {float(values[row])!r} at {_where(parquet, row)}, which is not a whole "
                "number",
                "Use text or integer sample IDs.",
            )
        return [str(int(v)) for v in values]
    ids = []
    for row, value in enumerate(column.tolist()):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        text = text.strip()
        if not text:
            raise fail(
                culprit, f"has an empty ID in column {id_column!r} at {_where(parquet, row)}", fix
            )
        ids.append(text)
    return ids


def _check_unique(ids: list[str], culprit: str, parquet: bool) -> None:
    first: dict[str, int] = {}
    for row, key in enumerate(ids):
        earlier = first.setdefault(key, row)
        if earlier != row:
            raise fail(
                culprit,
                f"has ID {key!r} twice ({_where(parquet, earlier)} and {_where(parquet, row)})",
                "Keep one row per sample in each party file: merge or delete the duplicate rows.",
            )


def _read_labels(column, parquet: bool, culprit: str, label_column: str):
    """(labels, known) with labels float64 (numbers) or object array of str (text)."""
    import pandas as pd

    known = ~column.isna().to_numpy()
    if pd.api.types.is_bool_dtype(column) or pd.api.types.is_numeric_dtype(column):
        labels = column.to_numpy(dtype=np.float64, na_value=np.nan)
        check_values(
            np.where(known, labels, 0.0),
            culprit,
            lambda row: f"in column {label_column!r} at {_where(parquet, row)}",
            "label",
        )
        return labels, known
    labels = np.empty(len(column), dtype=object)
    for row, value in enumerate(column.tolist()):
        if not known[row]:
            labels[row] = None
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        text = text.strip()
        known[row] = bool(text)
        labels[row] = text if text else None
    return labels, known


def _read_features(frame, names: list[str], parquet: bool, culprit: str) -> np.ndarray:
    import pandas as pd

    n = frame.shape[0]
    values = np.empty((n, len(names)), dtype=np.float64)
    fix_type = (
        "Make every feature column numeric (encode categories as numbers or one-hot "
        "columns), or remove the column"
    )
    for position, name in enumerate(names):
        column = frame[name]
        if pd.api.types.is_bool_dtype(column) or pd.api.types.is_numeric_dtype(column):
            values[:, position] = column.to_numpy(dtype=np.float64, na_value=np.nan)
            continue
        if pd.api.types.is_datetime64_any_dtype(column) or pd.api.types.is_timedelta64_dtype(
            column
        ):
            bad = np.flatnonzero(column.notna().to_numpy())[:1]
        else:
            parsed = pd.to_numeric(column.astype(object), errors="coerce")
            bad = np.flatnonzero(parsed.isna().to_numpy() & column.notna().to_numpy())
        if bad.size:
            row = int(bad[0])
            raise fail(
                culprit,
                f"has non-numeric value {column.iloc[row]!r} in feature column {name!r} at "
                f"{_where(parquet, row)}",
                f"{fix_type}; if {name!r} is the ID or label column, pass id_column/"
                "label_column (spec options id=, label=).",
            )
        values[:, position] = parsed.to_numpy(dtype=np.float64, na_value=np.nan)
    nan = np.isnan(values)
    if nan.any():
        row, position = (int(v) for v in np.argwhere(nan)[0])
        raise fail(
            culprit,
            f"feature column {names[position]!r} is empty (or NaN) at {_where(parquet, row)}",
            "Every feature value must be a finite number: fill it in (0 for absent) or "
            "remove the row or the column.",
        )
    width = max(len(names), 1)
    check_values(
        values,
        culprit,
        lambda flat: f"in feature column {names[flat % width]!r} at "
        f"{_where(parquet, flat // width)}",
        "feature value",
    )
    return values


def _read_table(
    party: str,
    path: Path,
    *,
    id_column: str,
    label_column: str | None,
    declared_columns: Sequence[str] | None,
    unlabeled: str,
    weight_column: str | None = None,
) -> _Table:
    parquet = path.name.lower().endswith(_PARQUET_SUFFIXES)
    culprit = f"party file {path} (party {party!r})"
    frame = _read_frame(path, parquet, id_column, culprit)
    columns = list(frame.columns)
    if id_column not in columns:
        close = [c for c in columns if c.lower() == id_column.lower()]
        hint = f" (there is {close[0]!r}: names are case-sensitive)" if close else ""
        separator = next((sep for sep in (";", "\t", "|") if any(sep in c for c in columns)), None)
        if not parquet and not close and separator is not None:
            hint = f" (the header seems separated by {separator!r}; party CSVs use commas)"
        raise fail(
            culprit,
            f"has no ID column {id_column!r}{hint}; its columns are {columns[:10]}"
            f"{' ...' if len(columns) > 10 else ''}",
            "Add the ID column, or name the column that holds the sample IDs with "
            "id_column=<name> (spec option id=<name>).",
        )
    if frame.shape[0] == 0:
        raise fail(
            culprit,
            "has a header but no data rows",
            "Add one row per sample the party holds, or leave the party out.",
        )
    ids = _canonical_ids(frame[id_column], parquet, culprit, id_column)
    _check_unique(ids, culprit, parquet)
    has_labels = label_column is not None and label_column in columns
    has_weights = weight_column is not None and weight_column in columns
    features = [c for c in columns if c != id_column and not (has_labels and c == label_column)
                and not (has_weights and c == weight_column)]
    if declared_columns is not None:
        declared = [str(c) for c in declared_columns]
        extra = [c for c in features if c not in declared]
        absent = [c for c in declared if c not in features]
        if extra or absent:
            parts = []
            if absent:
                parts.append(f"lacks declared feature columns {absent[:_MAX_NAMED]}")
            if extra:
                parts.append(f"has undeclared columns {extra[:_MAX_NAMED]}")
            raise fail(
                culprit,
                " and ".join(parts) + f" (declared: {declared[:10]}"
                f"{' ...' if len(declared) > 10 else ''})",
                "Make the file's feature columns exactly the declared ones, or fix the "
                "declaration (columns=...).",
            )
    if label_column is not None and not has_labels:
        _check_label_near_miss(frame, features, label_column, id_column, culprit)
    if not features and not has_labels:
        raise fail(
            culprit,
            f"has only the ID column {id_column!r}: no features and no labels",
            f"Add the party's feature columns (or a {label_column!r} column), or leave it out.",
        )
    values = _read_features(frame, features, parquet, culprit)
    labels = known = None
    if has_labels:
        labels, known = _read_labels(frame[label_column], parquet, culprit, label_column)
        if unlabeled == "error" and not known.all():
            row = int(np.flatnonzero(~known)[0])
            raise fail(
                culprit,
                f"has no label in column {label_column!r} at {_where(parquet, row)} "
                f"(ID {ids[row]!r})",
                "Fill in every label, delete the row, or drop the label column if another "
                "party labels these samples; pass unlabeled='drop' (spec option "
                "unlabeled=drop) to leave out samples nobody labels.",
            )
    weights = None
    if has_weights:
        weights = _read_features(frame, [weight_column], parquet, culprit)[:, 0]
        if not np.all(weights > 0):
            row = int(np.flatnonzero(~(weights > 0))[0])
            raise fail(
                culprit,
                f"has weight {weights[row]:g} in column {weight_column!r} at "
                f"{_where(parquet, row)} (ID {ids[row]!r})",
                "Give every sample a weight > 0; delete the rows of samples that should not "
                "count.",
            )
    return _Table(party, path, parquet, ids, features, values, labels, known, weights)


def _squeezed(name: str) -> str:
    """A column name without case, spaces, ``_``, ``-`` and ``.``: ``Mean_Radius`` is
    ``meanradius``."""
    return re.sub(r"[\s_.\-]+", "", name).casefold()


def _edits(a: str, b: str, limit: int) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) from ``a`` to ``b``; any
    count above ``limit`` is returned as ``limit + 1``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before, row = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (ca != cb))
            if (before is not None and i > 1 and j > 1 and ca == b[j - 2]
                    and a[i - 2] == cb):
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        before, row = row, current
    return min(row[-1], limit + 1)


def _near_miss(a: str, b: str) -> bool:
    """Whether two distinct column names look like one name mistyped.

    The same name but for case and separators (``Outcome``, ``outcome``;
    ``mean radius``, ``mean_radius``), or one or two typing slips in a longer name
    (``mean raduis``: ``difflib`` ratio >= 0.85 and at most 2 edits, 1 below 7
    characters). Names that differ only in their numbers (``x10``, ``x11``) are
    a numbered series, never a slip.
    """
    if a == b:
        return False
    if _squeezed(a) == _squeezed(b):
        return True
    if re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b):
        return False
    x, y = a.casefold(), b.casefold()
    if difflib.SequenceMatcher(None, x, y).ratio() < 0.85:
        return False
    limit = 1 if min(len(x), len(y)) < 7 else 2
    return _edits(x, y, limit) <= limit


def _is_text(column) -> bool:
    """Whether a column holds values that are not numbers (it cannot be a feature)."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(column) or pd.api.types.is_numeric_dtype(column):
        return False
    if pd.api.types.is_datetime64_any_dtype(column) or pd.api.types.is_timedelta64_dtype(
        column
    ):
        return False
    parsed = pd.to_numeric(column.astype(object), errors="coerce")
    return bool((parsed.isna() & column.notna()).any())


def _mostly_text(column) -> bool:
    """Whether most of a column's values are not numbers (labels, not a typo in numbers)."""
    import pandas as pd

    if not _is_text(column):
        return False
    given = column.notna()
    parsed = pd.to_numeric(column[given].astype(object), errors="coerce")
    return bool(parsed.isna().sum() * 2 > int(given.sum()))


def _check_label_near_miss(frame, features: list[str], label_column: str, id_column: str,
                           culprit: str) -> None:
    """Raise if a file without the label column has a column that must be it misnamed.

    A file without the label column is a party without labels (a clinic holding
    only features), which is fine. But a column whose name is a near miss of the
    label's (``Outcome`` for ``outcome``), or a text column (``result`` holding
    ``benign``/``malignant``: text cannot be a feature), is the label under
    another name: read as a feature it would leak the label into X, or fail as
    text with a hint (pass label=) that would break the files that do use
    ``label_column``.
    """
    close = [c for c in features if _near_miss(c, label_column)]
    # Text that is no label: numbers with a stray word (the feature's error names the
    # cell) or a copy of the ID column (``Patient`` beside ``patient``).
    text = [c for c in features if c not in close and _mostly_text(frame[c])
            and not _near_miss(c, id_column)]
    if not close and not text:
        return
    shown = []
    for c in (close + text)[:_MAX_NAMED]:
        values = [str(v).strip() for v in frame[c].dropna().unique()[:3].tolist()]
        kind = "text column" if _is_text(frame[c]) else "column"
        shown.append(f"{kind} {c!r} (values {', '.join(map(repr, values))}"
                     f"{', ...' if frame[c].nunique() > 3 else ''})")
    first = (close + text)[0]
    problem = (f"has no label column {label_column!r}, but its {' and '.join(shown)} "
               f"{'looks' if len(shown) == 1 else 'look'} like labels "
               f"({'a name close to ' + repr(label_column) if close else 'text, not a feature'})")
    texts = [_is_text(frame[c]) for c in close + text]
    if not any(texts):
        otherwise = "rename the column so that it does not look like the label"
    elif all(texts):
        otherwise = "encode the column as numbers or remove it (features are numbers)"
    else:
        otherwise = "rename those columns, encoding text ones as numbers (features are numbers)"
    fix = (f"If {first!r} holds this party's labels, rename it to {label_column!r} in this "
           "file (every party that labels names its label column alike), or, if every file "
           f"calls it {first!r}, pass label_column={first!r} (spec option label={first}). "
           f"A party without labels is fine: then {otherwise}.")
    raise fail(culprit, problem, fix)


def _column_notices(tables: list[_Table]) -> list[str]:
    """Columns held by one party whose name is a near miss of another party's column.

    A misspelt header (``mean raduis`` in one file, ``mean radius`` in the others)
    is not an error: it becomes a feature of its own, held by that party alone, and
    the model learns two half-empty columns. Each such pair is named once, with
    both files, so that the user can rename one.
    """
    holders: dict[str, list[int]] = {}
    for k, t in enumerate(tables):
        for name in t.features:
            holders.setdefault(name, []).append(k)
    if len(holders) > 2000:  # pairwise names: keep the check cheap on wide data
        return []
    notices, seen = [], set()
    for name, (k, *others) in holders.items():
        if others:
            continue
        for other, where in holders.items():
            pair = frozenset((name, other))
            if k in where or pair in seen or not _near_miss(name, other):
                continue
            seen.add(pair)
            near = tables[where[0]]
            also = f" and {len(where) - 1} more" if len(where) > 1 else ""
            notices.append(
                f"column {name!r} of {tables[k].culprit} is held by no other party, but "
                f"{near.culprit}{also} has {other!r}: if they are one feature, rename one of "
                "them (a misspelt name becomes a feature of its own, which the other parties' "
                "samples lack)"
            )
    return notices


def read_party_file(path: str | os.PathLike, *, party: str, id_column: str = "id",
                    label_column: str | None = "label") -> _Table:
    """One party's file, read and checked alone (a deployed party reads only its own).

    Rows without a label are kept (``label_known`` is False there): another
    party may label those samples.
    """
    return _read_table(party, Path(path), id_column=id_column, label_column=label_column,
                       declared_columns=None, unlabeled="drop")


#: An ID that is a whole number as text: its sign and digits without leading zeros.
_WHOLE_ID = re.compile(r"\s*(-?)\+?0*(\d+)(?:\.0*)?\s*")


def _id_key(text: str) -> str:
    """An ID as spellings of one sample compare: the whole number it spells (``007``,
    ``7.0`` and ``7`` alike), else its text in one Unicode form (NFKC) and case."""
    match = _WHOLE_ID.fullmatch(text)
    if match is None:
        return unicodedata.normalize("NFKC", text).casefold()
    sign, digits = match.groups()
    return ("" if digits == "0" else sign) + digits


def _check_id_spelling(tj: _Table, tk: _Table) -> None:
    """Refuse two files whose IDs are one sample spelt two ways: one number (``007``,
    ``7``), one text in other case or Unicode form (``p001``, ``P001``; ``é`` composed or
    not)."""
    in_j, in_k = set(tj.ids), set(tk.ids)
    spelt: dict[str, str] = {}
    for key in tj.ids:
        if key not in in_k:
            spelt.setdefault(_id_key(key), key)
    pairs = [(spelt[n], key) for key in tk.ids if key not in in_j
             and (n := _id_key(key)) in spelt]
    if pairs:
        a, b = pairs[0]
        raise fail(
            tk.culprit,
            f"has ID {b!r} where {tj.culprit} has {a!r} ({len(pairs)} such ID"
            f"{'s' if len(pairs) > 1 else ''}): IDs are matched as text, so each would be "
            "two samples, each without the other file's features (read as zeros)",
            "Spell the IDs alike in every file (all with or all without leading zeros, whole "
            "numbers without '.0', letters in one case), e.g. by saving the ID column as "
            "text in both.",
        )


def _label_key(value: Any) -> Any:
    """A label compared across files: text that is a number as that number."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return float(value)


def check_files_agree(tables: Sequence[_Table]) -> None:
    """Refuse party files, read one by one (:func:`read_party_file`), that disagree.

    What :func:`load_parties` refuses between files, for readers that combine the
    files themselves (``hyfl predict``): a cell two files hold with other values,
    a sample two files label differently; and IDs that are one sample spelt two
    ways (``007`` in one file, ``7`` in another; ``p001`` and ``P001``), which would
    silently make two half-empty samples of one.
    """
    for k, tk in enumerate(tables):
        position = {key: row for row, key in enumerate(tk.ids)}
        for tj in tables[:k]:
            _check_id_spelling(tj, tk)
            pairs = [(row, position[key]) for row, key in enumerate(tj.ids) if key in position]
            if not pairs:
                continue
            sj, sk = (np.array(v, dtype=np.int64) for v in zip(*pairs))
            ids = [tj.ids[row] for row in sj]
            column = {name: c for c, name in enumerate(tk.features)}
            shared = [(c, column[name]) for c, name in enumerate(tj.features) if name in column]
            if shared:
                fj, fk = (np.array(v, dtype=np.int64) for v in zip(*shared))
                names = [tj.features[c] for c in fj]
                _check_overlap(tj, tk, sj, sk, fj, fk, ids, names)
            if tj.labels is None or tk.labels is None:
                continue
            for rj, rk in zip(sj.tolist(), sk.tolist()):
                if not (tj.label_known[rj] and tk.label_known[rk]):
                    continue
                a, b = tj.labels[rj], tk.labels[rk]
                if _label_key(a) != _label_key(b):
                    raise fail(
                        f"sample ID {tj.ids[rj]!r}",
                        f"has label {_show(a)} in {tj.culprit} at {tj.where(rj)} but label "
                        f"{_show(b)} in {tk.culprit} at {tk.where(rk)}",
                        "Parties that both label a sample must give the same label: correct "
                        "one of them, or drop the label column from one file.",
                    )


# --------------------------------------------------------------------------- alignment


def _align(tables: list[_Table], psi: bool) -> tuple[list[np.ndarray], int, int | None]:
    """Global sample index of every row of every table, number of samples, PSI bytes."""
    if psi:
        from hyfl.privacy.psi import align

        alignment = align({t.party: t.ids for t in tables})
        return (
            [np.asarray(alignment.global_index[t.party], dtype=np.int64) for t in tables],
            int(alignment.n_samples),
            int(alignment.bytes_exchanged),
        )
    index: dict[str, int] = {}
    result = []
    for t in tables:
        result.append(np.fromiter((index.setdefault(i, len(index)) for i in t.ids), np.int64))
    return result, len(index), None


def _check_common_ids(
    tables: list[_Table], rows: list[np.ndarray], n_aligned: int, min_common: int, id_column: str
) -> dict[str, int]:
    """Per party, how many of its IDs occur in another file; raise if too few overall."""
    holders = np.zeros(n_aligned, dtype=np.int64)
    for g in rows:
        holders[g] += 1
    shared = {t.party: int(np.count_nonzero(holders[g] > 1)) for t, g in zip(tables, rows)}
    n_common = int(np.count_nonzero(holders > 1))
    same_columns = len({tuple(sorted(t.features)) for t in tables}) == 1
    if len(tables) > 1 and not same_columns and n_common < min_common:
        counts = ", ".join(
            f"{t.party!r} ({len(t.ids)} IDs, {shared[t.party]} shared)" for t in tables
        )
        raise fail(
            f"party files {counts}",
            f"share {n_common} sample ID{'' if n_common == 1 else 's'} in column "
            f"{id_column!r}, fewer than min_common={min_common}, although they "
            "hold different columns",
            "Check that every file uses the same ID column and spelling of the IDs; "
            "lower min_common (spec option min_common=, 0 disables the check) only if "
            "the files are meant to share so few samples.",
        )
    return shared


# --------------------------------------------------------------------------- labels


def _unify_label_kinds(tables: list[_Table]) -> None:
    """Make all label columns numbers, or all text; raise when they cannot agree."""
    import pandas as pd

    labelled = [t for t in tables if t.labels is not None]
    numeric = [t for t in labelled if t.labels.dtype != object]
    text = [t for t in labelled if t.labels.dtype == object]
    if not numeric or not text:
        return
    for t in text:
        parsed = pd.to_numeric(pd.Series(t.labels[t.label_known]), errors="coerce").to_numpy()
        if np.isnan(parsed).any():
            example = t.labels[t.label_known][int(np.flatnonzero(np.isnan(parsed))[0])]
            number = numeric[0]
            raise fail(
                f"label column of {t.culprit}",
                f"holds text labels (e.g. {example!r}) but {number.culprit} has number "
                f"labels (e.g. {number.labels[number.label_known][0]:g})",
                "Use one kind of label in every file: all numbers or all the same class names.",
            )
    for t in text:
        converted = np.full(len(t.labels), np.nan)
        converted[t.label_known] = pd.to_numeric(pd.Series(t.labels[t.label_known])).to_numpy(
            dtype=np.float64
        )
        t.labels = converted


def _gather_labels(tables: list[_Table], rows: list[np.ndarray], n: int):
    """Per sample: label, whether known, and (table, row) of its first labeller."""
    labelled = [k for k, t in enumerate(tables) if t.labels is not None]
    text = any(tables[k].labels.dtype == object for k in labelled)
    values = np.empty(n, dtype=object) if text else np.full(n, np.nan)
    known = np.zeros(n, dtype=bool)
    source_table = np.full(n, -1, dtype=np.int64)
    source_row = np.full(n, -1, dtype=np.int64)
    for k in labelled:
        t = tables[k]
        file_rows = np.flatnonzero(t.label_known)
        g = rows[k][file_rows]
        mine = t.labels[file_rows]
        earlier = known[g]
        if earlier.any():
            if text:
                differ = np.array([a != b for a, b in zip(values[g[earlier]], mine[earlier])])
            else:
                differ = values[g[earlier]] != mine[earlier]
            if differ.any():
                position = int(np.flatnonzero(earlier)[np.flatnonzero(differ)[0]])
                sample = int(g[position])
                other = tables[source_table[sample]]
                other_row = int(source_row[sample])
                mine_row = int(file_rows[position])
                raise fail(
                    f"sample ID {t.ids[mine_row]!r}",
                    f"has label {_show(values[sample])} in {other.culprit} at "
                    f"{other.where(other_row)} but label {_show(mine[position])} in "
                    f"{t.culprit} at {t.where(mine_row)}",
                    "Parties that both label a sample must give the same label: correct one "
                    "of them, or drop the label column from one file.",
                )
        new = ~earlier
        values[g[new]] = mine[new]
        known[g[new]] = True
        source_table[g[new]] = k
        source_row[g[new]] = file_rows[new]
    return values, known, source_table, source_row


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{float(value):g}"


def _stray_class_error(
    found: list, counts: np.ndarray, values: np.ndarray, tables, source_table, source_row, why
) -> Exception:
    """Error naming the rarest class and where it first appears."""
    rare = found[int(np.argmin(counts))]
    first = int(np.flatnonzero(_equal(values, rare))[0])
    t = tables[source_table[first]]
    row = int(source_row[first])
    shown = ", ".join(_show(c) for c in found[:10])
    return fail(
        f"labels of the party files ({shown}{' ...' if len(found) > 10 else ''})",
        f"{why}; e.g. {_show(rare)} in {t.culprit} at {t.where(row)} (ID {t.ids[row]!r})",
        "Relabel or remove those rows, or declare the task and classes you mean "
        "(task=..., classes=...).",
    )


def _equal(values: np.ndarray, value: Any) -> np.ndarray:
    if values.dtype == object:
        return np.array([v == value for v in values], dtype=bool)
    return values == value


def _encode_labels(
    values: np.ndarray,
    tables: list[_Table],
    source_table: np.ndarray,
    source_row: np.ndarray,
    task: str | None,
    classes: Sequence | None,
) -> tuple[np.ndarray, str, tuple]:
    text = values.dtype == object
    if classes is not None:
        classes = list(classes)
        if len(set(map(str, classes))) != len(classes) or not classes:
            raise fail(
                "classes", f"is {classes!r}", "Give each class once, e.g. classes=('no', 'yes')."
            )
        if text:
            classes = [str(c).strip() for c in classes]
        else:
            try:
                classes = [float(c) for c in classes]
            except (TypeError, ValueError):
                raise fail(
                    "classes",
                    f"are {classes!r} but the labels in the files are numbers",
                    "Declare the classes as the numbers used in the label columns.",
                ) from None
        inside = np.zeros(len(values), dtype=bool)
        for c in classes:
            inside |= _equal(values, c)
        if not inside.all():
            outside = sorted({v for v in values[~inside]}, key=str)
            counts = np.array([_equal(values, v).sum() for v in outside])
            raise _stray_class_error(
                outside,
                -counts,  # name the most common stray label
                values,
                tables,
                source_table,
                source_row,
                f"include {', '.join(_show(v) for v in outside[:_MAX_NAMED])}, which "
                f"{'is' if len(outside) == 1 else 'are'} not among the declared classes "
                f"{classes}",
            )
    if text:
        if task == "regression":
            raise fail(
                "labels of the party files",
                "are text, which cannot be a regression target",
                "Use numeric labels for regression, or task='binary'/'multiclass'.",
            )
        found = classes if classes is not None else sorted(set(values.tolist()))
        counts = np.array([_equal(values, c).sum() for c in found])
        task = task or ("binary" if len(found) == 2 else "multiclass")
        if len(found) < 2:
            raise fail(
                "labels of the party files",
                f"hold a single class {found[0]!r}, so the two sides are unknown",
                "Declare both classes (classes=('neg', 'pos')) or give samples of both.",
            )
        if task == "binary" and len(found) > 2:
            raise _stray_class_error(
                found,
                counts,
                values,
                tables,
                source_table,
                source_row,
                f"take {len(found)} values but a binary task needs 2",
            )
        position = {c: i for i, c in enumerate(found)}
        index = np.fromiter((position[v] for v in values), np.int64, len(values))
        if task == "binary":
            return np.where(index == 1, 1.0, -1.0), "binary", tuple(found)
        return index, "multiclass", tuple(found)
    values = values.astype(np.float64)
    if classes is None and task == "binary":
        found = sorted(set(values.tolist()))
        if len(found) > 2:
            counts = np.array([np.sum(values == c) for c in found])
            raise _stray_class_error(
                found,
                counts,
                values,
                tables,
                source_table,
                source_row,
                f"take {len(found)} values but a binary task needs 2",
            )
    if task == "multiclass" or (task is None and classes is not None and len(classes) > 2):
        integral = np.all(values == np.round(values))
        if not integral:
            raise fail(
                "labels of the party files",
                "include non-integer numbers, which cannot be classes",
                "Use integer class numbers or text classes, or task='regression'.",
            )
    declared = tuple(sorted(classes)) if classes is not None else None
    return map_labels(values, "labels of the party files", classes=declared, task=task)


# --------------------------------------------------------------------------- building


def _check_overlap(tj: _Table, tk: _Table, sj, sk, fj, fk, ids, names) -> None:
    a = tj.values[np.ix_(sj, fj)]
    b = tk.values[np.ix_(sk, fk)]
    differ = ~np.isclose(a, b, rtol=_VALUE_RTOL, atol=0.0)
    if differ.any():
        r, c = (int(v) for v in np.argwhere(differ)[0])
        raise fail(
            f"sample ID {ids[r]!r}, feature {names[c]!r}",
            f"is {a[r, c]:.17g} in {tj.culprit} at {tj.where(int(sj[r]))} but "
            f"{b[r, c]:.17g} in {tk.culprit} at {tk.where(int(sk[r]))} "
            f"({int(differ.sum())} such cell{'s' if differ.sum() > 1 else ''} in these files)",
            "A cell that several parties hold must have the same value in each: correct one "
            "file, or remove the feature column from one of them; if the files only reuse "
            "the name for different measurements (FATE's x0, x1, ...), give each party its "
            "own names with scope=party (spec option ;scope=party).",
        )


def _global_features(
    tables: list[_Table], features: Sequence[str] | int | None, id_column, label_column
) -> list[str]:
    order = list(dict.fromkeys(name for t in tables for name in t.features))
    if features is None:
        return order
    if isinstance(features, int | np.integer) and not isinstance(features, bool):
        if len(order) != int(features):
            raise fail(
                "party files",
                f"hold {len(order)} distinct feature columns but {int(features)} were declared",
                "Check for missing or misspelt feature columns, or fix the declared count.",
            )
        return order
    if isinstance(features, str):
        raise fail(
            "features",
            f"is the single string {features!r}",
            "Declare the feature names as a list, e.g. features=['f0', 'f1'].",
        )
    declared = [str(f).strip() for f in features]
    seen: set[str] = set()
    for name in declared:
        if name in seen:
            raise fail("features", f"names {name!r} twice", "Declare each feature once.")
        if name in (id_column, label_column):
            raise fail(
                "features",
                f"includes {name!r}, which is the ID or label column",
                "Declare only the feature columns.",
            )
        seen.add(name)
    for t in tables:
        extra = [name for name in t.features if name not in seen]
        if extra:
            raise fail(
                t.culprit,
                f"has columns {extra[:_MAX_NAMED]} that are not among the {len(declared)} "
                "declared features",
                "Remove or rename those columns, add them to the declared feature list, or "
                "name the ID/label columns (id_column=, label_column=).",
            )
    unused = [name for name in declared if name not in set(order)]
    if unused:
        raise fail(
            "party files",
            f"hold {len(order)} of the {len(declared)} declared features; no file has "
            f"{unused[:_MAX_NAMED]}{' ...' if len(unused) > _MAX_NAMED else ''}",
            "Add those feature columns to a party file, or remove them from the declared list.",
        )
    return declared


def _normalise_files(files) -> list[tuple[str, Path]]:
    if isinstance(files, str | os.PathLike):
        files = [files]
    if isinstance(files, Mapping):
        items = [(str(name), Path(path).expanduser()) for name, path in files.items()]
    else:
        try:
            paths = [Path(p).expanduser() for p in files]
        except TypeError:
            raise fail(
                "files",
                f"is a {type(files).__name__}",
                "Pass a mapping from party name to file, or a list of files.",
            ) from None
        names = [party_name(p) for p in paths]
        if len(set(names)) != len(names):
            names = [str(p) for p in paths]
        items = list(zip(names, paths))
    if not items:
        raise fail("files", "is empty", "Pass at least one party file.")
    names = [name for name, _ in items]
    for name in names:
        if not name:
            raise fail("files", "has an empty party name", "Name every party.")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise fail(
            "files",
            f"name party {duplicates[0]!r} more than once",
            "Give every party its own name (name=path in a spec).",
        )
    for name, path in items:
        if party_suffix(path.name) is None and not path.is_dir():
            raise fail(
                f"party file {path} (party {name!r})",
                "has an unknown extension",
                f"Use one of {', '.join(PARTY_SUFFIXES)}.",
            )
    return items


def load_parties(
    files: Mapping[str, str | os.PathLike] | Sequence[str | os.PathLike],
    *,
    id_column: str = "id",
    label_column: str | None = "label",
    psi: bool = True,
    features: Sequence[str] | int | None = None,
    columns: Mapping[str, Sequence[str]] | None = None,
    task: str | None = None,
    classes: Sequence | None = None,
    unlabeled: str = "error",
    name: str = "parties",
    min_common: int = 1,
    scope: str = "shared",
    weight_column: str | None = None,
) -> tuple[Dataset, Partition]:
    """Read one CSV/Parquet file per party and build the data set and its partition.

    See the module docstring for the file format and the rules.

    Parameters
    ----------
    files : mapping of party name to path, or sequence of paths
        Party order is client order. A list names parties by file name
        without extensions.
    id_column : str, default "id"
        Column with the sample IDs (in every file).
    label_column : str or None, default "label"
        Column with labels, in the files that have labels. None ignores all
        label columns, which leaves every sample unlabelled (an error).
    psi : bool, default True
        Align IDs with private set intersection (:func:`hyfl.privacy.psi.align`).
        False matches them in the clear: same numbering, much faster. PSI
        runs elliptic-curve operations for every ID of every pair of
        parties (about 10 s for three parties of 2,500-5,000 IDs), so use
        ``psi=False`` for large simulations.
    features : sequence of str or int, optional
        The declared global feature list (its order is X's column order), or
        just the number of features; the files' feature columns must match.
    columns : mapping of party name to sequence of str, optional
        Each listed party's declared feature columns; its file must have
        exactly these (in any order).
    task : {"binary", "multiclass", "regression"}, optional
        Insist on a task instead of inferring it from the labels.
    classes : sequence, optional
        The allowed class values. For text labels their order decides the
        mapping (binary: first -> -1; multiclass: index); numbers are ordered
        by value.
    unlabeled : {"error", "drop"}, default "error"
        What to do with samples no party labels (and empty label cells):
        raise, or leave those samples out.
    name : str, default "parties"
        The data set's name.
    min_common : int, default 1
        Fewest sample IDs that must occur in two or more files when the
        parties hold different feature columns (0 turns the check off).
    scope : {"shared", "party"}, default "shared"
        ``shared``: a column name is one feature wherever it occurs (cells that
        several parties hold must agree). ``party``: every file's columns are its
        own, named ``<party>.<column>`` (files that reuse names for different
        measurements, such as FATE's ``x0, x1, ...`` in both guest and host).
    weight_column : str, optional
        Column with each sample's loss weight (> 0), in the files that have it
        (spec option ``weight=``): parties that weigh the same sample must agree,
        and every sample needs a weight once any file has the column.

    Returns
    -------
    dataset : Dataset
        ``X`` CSR float64 (n_samples, n_features); ``meta`` holds the party
        files, client names, feature names, sample IDs (``meta["sample_ids"]``,
        in row order), label classes and the PSI traffic.
    partition : Partition
        Client k is the k-th party that has feature columns; it holds its
        samples and features, and owns the cells of its file (the first
        party in order owns a cell several parties hold).

    Raises
    ------
    HyflError
        Any problem in the files (naming the file, the line or row and the
        column) or between them (naming the sample ID, the feature and both
        files).
    """
    min_common = _check_options(id_column, label_column, unlabeled, scope, min_common, task)
    tables = _read_tables(_normalise_files(files), columns, scope, id_column=id_column,
                          label_column=label_column, unlabeled=unlabeled,
                          weight_column=weight_column)
    feature_names = _global_features(tables, features, id_column, label_column)
    notices = _column_notices(tables) if scope == "shared" else []
    for notice in notices:
        warnings.warn(notice, PartyFileWarning, stacklevel=2)
    rows, n_aligned, psi_bytes = _align(tables, psi)
    shared_ids = _check_common_ids(tables, rows, n_aligned, min_common, id_column)
    sample_ids = np.empty(n_aligned, dtype=object)
    for t, g in zip(reversed(tables), reversed(rows)):
        sample_ids[g] = t.ids  # earlier parties overwrite: the first holder's spelling
    values, keep, source_table, source_row = _aligned_labels(tables, rows, n_aligned)
    clients = _feature_holders(tables)
    if unlabeled == "error":
        _check_all_labelled(keep, tables, rows, sample_ids, label_column)
    kept_rows, global_rows = _kept_rows(tables, rows, keep, clients, sample_ids, label_column)
    kept_ids = sample_ids[keep]
    n_samples, M = int(keep.sum()), len(feature_names)
    blocks, owned_masks, overlap = _client_blocks(
        tables, clients, kept_rows, global_rows, feature_names, kept_ids)
    X, owner = _party_matrix(blocks, owned_masks, n_samples, M)
    if overlap:
        partition = Partition(
            n_samples=n_samples,
            n_features=M,
            samples=tuple(np.sort(b[0]) for b in blocks),
            features=tuple(np.sort(b[1]) for b in blocks),
            entry_owner=owner,
            name="parties",
        )
    else:
        partition = from_blocks([(b[0], b[1]) for b in blocks], n_samples, M, name="parties")
    partition.validate(X)

    y, task, found_classes = _encode_labels(
        values[keep], tables, source_table[keep], source_row[keep], task, classes
    )
    dataset = Dataset(
        X=X,
        y=y,
        name=name,
        task=task,
        sample_weight=_gather_weights(tables, rows, n_aligned, keep, sample_ids, weight_column),
        meta={
            "source": "party files",
            "format": "parties",
            "parties": {t.party: str(t.path) for t in tables},
            "clients": tuple(tables[k].party for k in clients),
            "label_parties": tuple(t.party for t in tables if t.labels is not None),
            "id_column": id_column,
            "label_column": label_column,
            "weight_column": weight_column,
            "feature_names": tuple(feature_names),
            "sample_ids": tuple(str(i) for i in kept_ids),
            "classes": tuple(found_classes),
            "psi": bool(psi),
            "psi_bytes": psi_bytes,
            "dropped_unlabeled": int(n_aligned - n_samples),
            "shared_cells": bool(overlap),
            "shared_ids": shared_ids,
            "notices": tuple(notices),
        },
    )
    return dataset, partition


# The steps of load_parties, in its order.


def _check_options(id_column, label_column, unlabeled: str, scope: str, min_common: int,
                   task: str | None) -> int:
    """Check load_parties' options that need no file; return ``min_common`` as an int."""
    check_choice("unlabeled", unlabeled, _UNLABELED)
    check_choice("scope", scope, _SCOPES)
    min_common = check_int("min_common", min_common, minimum=0)
    if task is not None:
        check_choice("task", task, _TASKS)
    if not isinstance(id_column, str) or not id_column:
        raise fail("id_column", f"is {id_column!r}", "Name the ID column, e.g. id_column='id'.")
    if label_column is not None and label_column == id_column:
        raise fail(
            "label_column",
            f"is the ID column {id_column!r}",
            "Name the label column, e.g. label_column='label'.",
        )
    return min_common


def _read_tables(items: list[tuple[str, Path]], columns: Mapping[str, Sequence[str]] | None,
                 scope: str, **options) -> list[_Table]:
    """Read every party's file (``options``: :func:`_read_table`'s, but the declared
    columns); with ``scope="party"``, name each feature ``<party>.<column>``."""
    parties = [party for party, _ in items]
    if columns is not None:
        unknown = [p for p in columns if p not in parties]
        if unknown:
            raise fail(
                "columns",
                f"names parties {unknown} that have no file",
                f"Use the party names {parties}.",
            )
    tables = [
        _read_table(
            party,
            path,
            declared_columns=None if columns is None else columns.get(party),
            **options,
        )
        for party, path in items
    ]
    if scope == "party":
        for table in tables:
            table.features = [f"{table.party}.{column}" for column in table.features]
    return tables


def _aligned_labels(tables: list[_Table], rows: list[np.ndarray], n_aligned: int):
    """``(values, known, source table, source row)`` of each aligned sample's label."""
    _unify_label_kinds(tables)
    if any(t.labels is not None for t in tables):
        return _gather_labels(tables, rows, n_aligned)
    source = np.full(n_aligned, -1, dtype=np.int64)
    return np.full(n_aligned, np.nan), np.zeros(n_aligned, dtype=bool), source, source


def _feature_holders(tables: list[_Table]) -> list[int]:
    """The tables with feature columns (the clients, in party order); at least one."""
    clients = [k for k, t in enumerate(tables) if t.features]
    if not clients:
        raise fail(
            "party files",
            "have no feature columns at all (only IDs and labels)",
            "At least one party must hold features.",
        )
    return clients


def _check_all_labelled(known: np.ndarray, tables: list[_Table], rows: list[np.ndarray],
                        sample_ids: np.ndarray, label_column: str | None) -> None:
    """Raise, naming the first samples and their files, unless every sample has a label."""
    if known.all():
        return
    missing = np.flatnonzero(~known)
    held = []
    for i in missing[:_MAX_NAMED]:
        holders = ", ".join(t.party for t, g in zip(tables, rows) if i in g)
        held.append(f"{sample_ids[i]!r} (in {holders})")
    more = f" and {missing.size - _MAX_NAMED} more" if missing.size > _MAX_NAMED else ""
    without = [t for t in tables if t.labels is None]
    unlabelled = (
        f" ({', '.join(t.culprit for t in without[:_MAX_NAMED])} "
        f"{'has' if len(without) == 1 else 'have'} no {label_column!r} column)"
        if without and len(without) < len(tables) else "")
    raise fail(
        f"sample{'s' if missing.size > 1 else ''} {', '.join(held)}{more}",
        f"{'have' if missing.size > 1 else 'has'} no label: no party that holds "
        f"{'them' if missing.size > 1 else 'it'} has a {label_column!r} column with "
        f"a value for it{unlabelled}",
        "Add a label column with these labels to one of those files, delete these "
        "rows, or pass unlabeled='drop' (spec option unlabeled=drop) to leave them out.",
    )


def _kept_rows(tables: list[_Table], rows: list[np.ndarray], keep: np.ndarray,
               clients: list[int], sample_ids: np.ndarray, label_column: str | None):
    """Per table, the file rows kept (labelled) and their rows of X; every kept sample
    must be held by a client and every client must keep a sample."""
    new_index = np.cumsum(keep) - 1
    n_samples = int(keep.sum())
    if n_samples == 0:
        raise fail(
            "party files",
            "label no sample at all",
            f"Give at least one party a {label_column!r} column.",
        )
    kept_rows = [np.flatnonzero(keep[g]) for g in rows]  # file rows kept, per table
    global_rows = [new_index[g[r]] for g, r in zip(rows, kept_rows)]

    covered = np.zeros(n_samples, dtype=bool)
    for k in clients:
        if global_rows[k].size == 0:
            raise fail(
                tables[k].culprit,
                "has no labelled sample left: every sample it holds is unlabelled",
                "Label some of its samples, or leave the party out.",
            )
        covered[global_rows[k]] = True
    if not covered.all():
        lonely = np.flatnonzero(~covered)
        old = np.flatnonzero(keep)[lonely]
        named = ", ".join(repr(sample_ids[i]) for i in old[:_MAX_NAMED])
        raise fail(
            f"sample ID{'s' if lonely.size > 1 else ''} {named}"
            f"{f' and {lonely.size - _MAX_NAMED} more' if lonely.size > _MAX_NAMED else ''}",
            "appear only in files without feature columns, so no client holds any of "
            "their features",
            "Add these samples to a party file with features, or delete them.",
        )
    return kept_rows, global_rows


def _client_blocks(tables: list[_Table], clients: list[int], kept_rows, global_rows,
                   feature_names: list[str], kept_ids: np.ndarray):
    """Each client's block ``(rows of X, columns of X, values)``, which of its cells it
    owns (not an earlier client's), and whether any cell is held twice (checked equal)."""
    feature_index = {f: m for m, f in enumerate(feature_names)}
    blocks = []
    owned_masks = []
    overlap = False
    for position, k in enumerate(clients):
        t = tables[k]
        t_rows = global_rows[k]
        t_cols = np.array([feature_index[f] for f in t.features], dtype=np.int64)
        t_values = t.values[kept_rows[k]]
        own = np.ones(t_values.shape, dtype=bool)
        for j in clients[:position]:
            tj = tables[j]
            j_cols = np.array([feature_index[f] for f in tj.features], dtype=np.int64)
            shared_f, fj, fk = np.intersect1d(j_cols, t_cols, return_indices=True)
            if shared_f.size == 0:
                continue
            shared_s, sj, sk = np.intersect1d(global_rows[j], t_rows, return_indices=True)
            if shared_s.size == 0:
                continue
            overlap = True
            _check_overlap(
                tj,
                t,
                kept_rows[j][sj],
                kept_rows[k][sk],
                fj,
                fk,
                kept_ids[shared_s],
                [feature_names[m] for m in shared_f],
            )
            own[np.ix_(sk, fk)] = False
        blocks.append((t_rows, t_cols, t_values))
        owned_masks.append(own)
    return blocks, owned_masks, overlap


def _party_matrix(blocks, owned_masks, n_samples: int, M: int):
    """X (CSR) from the clients' owned non-zero cells, and each entry's owning client."""
    entry_rows, entry_cols, entry_values, entry_owner = [], [], [], []
    for client, ((t_rows, t_cols, t_values), own) in enumerate(zip(blocks, owned_masks)):
        r, c = np.nonzero(own & (t_values != 0))
        entry_rows.append(t_rows[r])
        entry_cols.append(t_cols[c])
        entry_values.append(t_values[r, c])
        entry_owner.append(np.full(r.size, client, dtype=np.int64))
    entry_rows = np.concatenate(entry_rows)
    entry_cols = np.concatenate(entry_cols)
    order = np.lexsort((entry_cols, entry_rows))
    indptr = np.zeros(n_samples + 1, dtype=np.int64)
    np.cumsum(np.bincount(entry_rows, minlength=n_samples), out=indptr[1:])
    X = sp.csr_matrix(
        (np.concatenate(entry_values)[order], entry_cols[order], indptr), shape=(n_samples, M)
    )
    X = clean_csr(X)  # already canonical: only narrows the index arrays
    owner = np.concatenate(entry_owner)[order]
    if X.nnz != owner.size:  # pragma: no cover - guards the CSR order assumption
        raise RuntimeError("party data: CSR construction changed the entry order")
    return X, owner


# --------------------------------------------------------------------------- specs

_SCOPES = ("shared", "party")


def _gather_weights(tables, rows, n_aligned: int, keep: np.ndarray, sample_ids,
                    weight_column: str | None) -> np.ndarray | None:
    """Each kept sample's weight from the files with the weight column (None without any)."""
    if not any(t.weights is not None for t in tables):
        return None
    weight = np.full(n_aligned, np.nan)
    given_by = np.full(n_aligned, -1, dtype=np.int64)
    for k, (t, g) in enumerate(zip(tables, rows)):
        if t.weights is None:
            continue
        known = ~np.isnan(weight[g])
        differ = known & (weight[g] != t.weights)
        if differ.any():
            row = int(np.flatnonzero(differ)[0])
            other = tables[int(given_by[g[row]])]
            raise fail(
                f"sample {sample_ids[g[row]]!r}",
                f"has weight {weight[g[row]]:g} in {other.culprit} but {t.weights[row]:g} in "
                f"{t.culprit}",
                f"Give a sample the same {weight_column!r} in every file that weighs it, or "
                "drop the column from all but one of them.",
            )
        weight[g] = t.weights
        given_by[g[~known]] = k
    weight = weight[keep]
    missing = np.flatnonzero(np.isnan(weight))
    if missing.size:
        ids = np.asarray(sample_ids)[np.flatnonzero(keep)[missing[:_MAX_NAMED]]]
        raise fail(
            f"sample{'s' if missing.size > 1 else ''} {', '.join(map(repr, ids))}"
            f"{f' and {missing.size - _MAX_NAMED} more' if missing.size > _MAX_NAMED else ''}",
            f"{'have' if missing.size > 1 else 'has'} no weight: no file that holds "
            f"{'them' if missing.size > 1 else 'it'} has a {weight_column!r} column",
            f"Add {weight_column!r} to a file holding every sample (for example the label "
            "holder's), or leave the weight option out.",
        )
    return weight


