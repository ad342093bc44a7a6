"""An attacker's review of hyfl's file readers (issue 42, points 4 and 6): cases the
earlier tests did not try, against docs/privacy.md's "Hostile files" rule (a file
decodes to at most 64 times its size plus 16 MiB, checked before decoding).

Each memory attack runs in a subprocess limited to its imports plus 1 GiB
(:func:`tests.test_bounded_readers.read_bounded`), never in the test's own process.
What each took on the code before its fix is in its docstring.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from typer.testing import CliRunner

from test_bounded_readers import assert_refused, read_bounded

# ----------------------------------------------------------------------------- zip64


def _npy(shape, dtype="|u1") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False,
                                               "shape": tuple(shape)})
    return out.getvalue()


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def zip64(path, members) -> None:
    """A zip64 archive of ``(name, payload, method, declared size, crc)`` members whose
    directory declares any 64-bit size (what zipfile reads; nothing else checks it)."""
    out, central = bytearray(), bytearray()
    for name, payload, method, declared, crc in members:
        n, offset = name.encode(), len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, method, 0, 0, crc,
                           0xFFFFFFFF, 0xFFFFFFFF, len(n), 20) + n
        out += struct.pack("<HHQQ", 1, 16, declared, len(payload)) + payload
        extra = struct.pack("<HHQQQ", 1, 24, declared, len(payload), offset)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, method, 0, 0, crc,
                               0xFFFFFFFF, 0xFFFFFFFF, len(n), len(extra), 0, 0, 0, 0,
                               0xFFFFFFFF) + n + extra
    directory, count = len(out), len(members)
    out += central
    end64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, len(central),
                       directory)
    out += struct.pack("<IIQI", 0x07064B50, 0, end64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    path.write_bytes(bytes(out))


def wrapping_npz(path, size: int = 1_500_000_000) -> None:
    """``__header__.npy`` declaring ``size`` bytes (a consistent .npy header, a short
    stream with its CRC) and two tiny members whose declared sizes, summed as int64,
    wrap the total back to ``size - size`` = 0. With the member a real deflated stream of
    zeros (1.46 MB on disk), reading took 2.76 GB resident."""
    header = _npy((size - 128,))
    assert len(header) == 128
    head = header + bytes(1000)
    tiny = _deflate(b"x")
    zip64(path, [("__header__.npy", _deflate(head), 8, size, zlib.crc32(head)),
                 ("b.npy", tiny, 8, 2**63 - 1, zlib.crc32(b"x")),
                 ("c.npy", tiny, 8, 2**63 - 1 - size + 2, zlib.crc32(b"x"))])


def test_zip64_sizes_that_wrap_an_int64_sum_are_refused_before_allocating(tmp_path):
    """`hyfl predict` reads a model file's kind first (only its header member): the
    members it skips were counted in an int64 sum that two of them wrapped, and the
    header member's 1.5 GB was allocated (MemoryError under the limit; 2.76 GB resident
    with a real stream)."""
    path = tmp_path / "model.npz"
    wrapping_npz(path)
    assert path.stat().st_size < 4096
    out = read_bounded(f"read_npz({str(path)!r}, 'model file x', 'a hyfl model', 'Retrain.', "
                       "only=('__header__',), expect={'__header__': ('u', 1)})",
                       "from hyfl._io import read_npz")
    assert_refused(out, "model file x", "would decode to 18,446,744,073,709,551,616 bytes",
                   "HYFL_MAX_EXPANSION")
    out = read_bounded(f"assert read_kind({str(path)!r}) is None",
                       "from hyfl.model_container import read_kind")
    assert out["error"] is None, out


def test_a_zip64_size_beyond_int64_is_a_clear_error(tmp_path):
    """A member declaring 2**64 - 1 bytes: an OverflowError traceback from building the
    sizes as int64, not an error naming the file."""
    path = tmp_path / "model.npz"
    zip64(path, [("weights.npy", _deflate(b"x"), 8, 2**64 - 1, zlib.crc32(b"x"))])
    out = read_bounded(f"load_model({str(path)!r})", "from hyfl.model_file import load_model")
    assert_refused(out, str(path), "would decode to 18,446,744,073,709,551,615 bytes")


def test_a_member_named_outside_the_archive_is_refused_unread(tmp_path):
    """Attack that failed: a model member named ``../../weights.npy`` (path traversal) is
    never extracted anywhere and is refused as a member the kind never holds."""
    import zipfile

    from hyfl.errors import HyflError
    from hyfl.model_file import load_model

    path = tmp_path / "model.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__header__.npy", _npy((2,)) + b"{}")
        z.writestr("../../weights.npy", _npy((2,), "<f8") + bytes(16))
    with pytest.raises(HyflError, match="'../../weights.npy', which this kind of file never"):
        load_model(path)
    assert not (tmp_path.parent.parent / "weights.npy").exists()


# ----------------------------------------------------------------------------- tables


def test_a_party_csv_of_a_wide_header_over_one_row_is_refused(tmp_path):
    """100,001 columns over one row (0.9 MB): every cell was within the rule (columns x
    rows x 8 bytes), but pandas spends kilobytes per column: 200,001 columns (1.9 MB)
    took 856 MB resident and 85 s."""
    path = tmp_path / "bank.csv"
    n = 100_000
    path.write_text("id," + ",".join(f"c{i}" for i in range(n)) + "\na,"
                    + ",".join("1" for _ in range(n)) + "\n")
    assert path.stat().st_size < 1 << 20
    out = read_bounded(f"read_party_file({str(path)!r}, party='bank')",
                       "from hyfl.data.parties import read_party_file")
    assert_refused(out, str(path), "100001 columns", "HYFL_MAX_EXPANSION")


def test_a_party_parquet_of_nested_cells_is_refused_from_its_schema(tmp_path):
    """5 million empty lists (2.8 MB with a padded footer): each value counted at 8
    bytes, each row a NumPy array in pandas: 1.1 GB resident before."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bank.parquet"
    n = 5_000_000
    lists = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)),
                                     pa.array([], pa.float64()))
    table = pa.table({"id": pa.array(np.zeros(n, dtype=np.int64)), "x": lists})
    table = table.replace_schema_metadata({"pad": os.urandom(600_000).hex()})
    pq.write_table(table, path, compression="zstd", row_group_size=1 << 20)
    assert path.stat().st_size < 4 << 20
    out = read_bounded(f"read_party_file({str(path)!r}, party='bank')",
                       "from hyfl.data.parties import read_party_file")
    assert_refused(out, str(path), "column 'x' of nested type list")
    # A struct column too; plain columns read as before.
    from hyfl._io import read_parquet
    from hyfl.errors import HyflError

    struct_path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"s": pa.StructArray.from_arrays(
        [pa.array([1.0]), pa.array([2.0])], names=["a", "b"])}), struct_path)
    with pytest.raises(HyflError, match="nested type struct"):
        read_parquet(struct_path, "party file s", "")
    pq.write_table(pa.table({"id": ["a"], "x": [1.5]}), tmp_path / "ok.parquet")
    assert read_parquet(tmp_path / "ok.parquet", "party file ok", "")["x"].tolist() == [1.5]


# ----------------------------------------------------------------------------- text


def test_a_config_or_run_record_nested_thousands_deep_is_a_clear_error(tmp_path):
    """TOML arrays and a run.json nested 100,000 deep: a RecursionError traceback from
    `hyfl run` and `hyfl report`, not an error naming the file."""
    from hyfl.cli import app

    config = tmp_path / "deep.toml"
    config.write_text("[experiment]\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "o")])
    assert isinstance(result.exception, SystemExit), result.exception
    text = result.output.replace("\n", "")  # the terminal's width breaks lines anywhere
    assert "nested too deeply" in " ".join(result.output.split()) and "deep.toml" in text

    run = tmp_path / "results" / "hyfdca"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("iteration,rel_loss\n1,0.5\n2,0.25\n")
    (run / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "results")])
    assert isinstance(result.exception, SystemExit), result.exception
    assert "is not valid JSON" in result.output and "run.json" in result.output.replace("\n", "")


def test_the_markdown_report_keeps_hostile_names_on_their_line_without_html(tmp_path):
    """A results folder's ``[experiment] name`` or a run's label reaches report.md: a line
    break in it ended the table (or heading) and the rest became Markdown and raw HTML of
    the folder's choosing (an ``<img>`` a viewer fetches, a fake section)."""
    from hyfl.experiments.report import _Heading, _markdown, _Para, _Table

    hostile = 'x\n\n<img src="http://evil.example/t.png">\n\n# Approved | by audit'
    page = _markdown([_Heading(1, hostile), _Para(hostile),
                      _Table([hostile, "b"], [[(hostile, True), ("1", False)]], note=hostile)],
                     "files")
    assert "<img" not in page and "&lt;img" in page
    assert "\n# Approved" not in page  # no heading of the folder's own
    table = [line for line in page.splitlines() if line.startswith("|")]
    assert len(table) == 3 and all(line.count(" | ") == 1 for line in table[::2])


# ----------------------------------------------------------------------------- IDX, Parquet


def test_an_idx_header_whose_int64_size_wraps_is_a_clear_error(tmp_path):
    """IDX images declaring 2**31 x 2**31 x 4 over no data: the int64 product of the
    dimensions wrapped to 0 bytes, "as many as the file holds", and reshaping raised a
    ValueError traceback; 0 x (2**32 - 1)**2 too."""
    for name, dims in (("wrap", (2**31, 2**31, 4)), ("zero", (0, 2**32 - 1, 2**32 - 1))):
        images, labels = tmp_path / f"{name}-images.idx", tmp_path / f"{name}-labels.idx"
        images.write_bytes(struct.pack(">IIII", 2051, *dims))
        labels.write_bytes(struct.pack(">II", 2049, dims[0] % 2**32))
        out = read_bounded(f"load_idx({str(images)!r}, {str(labels)!r})",
                           "from hyfl.data.loaders import load_idx")
        assert_refused(out, str(images), "values per sample")


def test_a_parquet_footer_that_understates_its_rows_reads_only_what_it_declares(tmp_path):
    """Attack that failed: a footer rewritten to declare 1,000 rows and 1,000 bytes over
    a page of 20 million values (thrift varints replaced, footer length fixed). Arrow
    reads the rows the footer declares, so the file reads as 1,000 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def varint(v: int) -> bytes:
        out = bytearray()
        while True:
            byte, v = v & 0x7F, v >> 7
            out.append(byte | (0x80 if v else 0))
            if not v:
                return bytes(out)

    path = tmp_path / "bank.parquet"
    n, claim = 20_000_000, 1000
    pq.write_table(pa.table({"x": pa.array(np.zeros(n, dtype=np.int8))}), path,
                   compression="zstd", use_dictionary=False, data_page_size=1 << 31,
                   row_group_size=n, write_statistics=False)
    raw = path.read_bytes()
    length = struct.unpack("<I", raw[-8:-4])[0]
    footer, body = raw[-8 - length:-8], raw[:-8 - length]
    meta = pq.ParquetFile(path).metadata
    group, column = meta.row_group(0), meta.row_group(0).column(0)
    for value in {column.total_uncompressed_size, meta.num_rows, column.num_values,
                  group.total_byte_size}:
        footer = footer.replace(varint(value << 1), varint(claim << 1))  # zigzag
    path.write_bytes(body + footer + struct.pack("<I", len(footer)) + b"PAR1")
    assert pq.ParquetFile(path).metadata.num_rows == claim
    out = read_bounded(f"assert read_parquet({str(path)!r}, 'party file x', '').shape == "
                       f"({claim}, 1)", "from hyfl._io import read_parquet")
    assert out["error"] is None and out["growth"] < 200 << 20, out


def test_a_party_parquet_of_many_one_row_columns_is_refused_quickly(tmp_path):
    """20,000 one-row columns (3 MB): each column's readers cost Arrow and pandas about
    32 kB (50,000 columns, 7.3 MB, took 1.6 GB resident), and reading the schema once per
    column made the check quadratic (5,000 columns 26 s; 50,000 would take most of an
    hour). Refused from the footer, in seconds."""
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bank.parquet"
    pq.write_table(pa.table({f"c{i}": pa.array([1.0]) for i in range(20_000)}), path,
                   compression="zstd", write_statistics=False)
    start = time.monotonic()
    out = read_bounded(f"read_party_file({str(path)!r}, party='bank', id_column='c0')",
                       "from hyfl.data.parties import read_party_file")
    assert_refused(out, str(path), "20000 columns", "HYFL_MAX_EXPANSION")
    assert time.monotonic() - start < 60
