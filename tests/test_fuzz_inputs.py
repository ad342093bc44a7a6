"""Fuzzing the file readers: malformed input is a HyflError, never a crash.

Seeded mutations of small valid LIBSVM files, CSV/Parquet party files and
TOML experiment configs (byte flips, truncation, huge/negative/fractional/
garbage indices, NaN/inf/1e308 values, wrong separators, binary junk, empty
files, BOMs, duplicated columns, mismatched ID columns, wrong value types,
unknown keys, broken syntax). Each input must either raise a HyflError with a
message, or, when the mutation left it valid, load into finite, consistent
data. A few go through the CLI too: a clean message, no traceback, exit != 0.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from hyfl.cli import app
from hyfl.data.loaders import MAX_ABS_VALUE, MAX_FEATURES, load_libsvm
from hyfl.data.parties import load_parties
from hyfl.errors import HyflError
from hyfl.experiments.config import load_config

SEED = 20261125
N_LIBSVM = 50
N_PARTIES = 40
N_TOML = 40

VALID_LIBSVM = (
    b"# a comment\n"
    b"1 1:0.5 3:-1.25 7:2\n"
    b"-1 2:1 3:0.75\n"
    b"1 1:-0.5 5:3e-2 7:1\n"
    b"-1 4:1.5 6:-2\n"
    b"1 2:0.25 7:4\n"
)

HOSPITAL = "id,age,weight,label\n1,0.5,1.2,1\n2,-0.3,0.8,0\n3,1.1,-0.4,1\n4,0.2,0.1,0\n"
LAB = "id,glucose\n2,5.1\n3,4.8\n4,6.2\n5,5.5\n"


# --------------------------------------------------------------------------- mutations


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _mutate_token(data: bytes, rng, make) -> bytes:
    lines = _lines(data)
    candidates = [i for i, line in enumerate(lines) if b":" in line and not line.startswith(b"#")]
    i = int(rng.choice(candidates))
    tokens = lines[i].split(b" ")
    j = int(rng.integers(1, len(tokens)))
    tokens[j] = make(tokens[j], rng)
    lines[i] = b" ".join(tokens)
    return b"\n".join(lines)


def _index(text: str):
    return lambda token, rng: text.encode() + b":" + token.partition(b":")[2]


def _value(text: str):
    return lambda token, rng: token.partition(b":")[0] + b":" + text.encode()


def _flip_bytes(data: bytes, rng) -> bytes:
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        buf[int(rng.integers(len(buf)))] = int(rng.integers(256))
    return bytes(buf)


def _truncate(data: bytes, rng) -> bytes:
    return data[: int(rng.integers(0, len(data)))]


def _junk(data: bytes, rng) -> bytes:
    return rng.integers(0, 256, size=int(rng.integers(1, 200)), dtype=np.uint8).tobytes()


def _insert_junk(data: bytes, rng) -> bytes:
    at = int(rng.integers(len(data)))
    return data[:at] + _junk(data, rng) + data[at:]


LIBSVM_MUTATIONS = {
    "flip": _flip_bytes,
    "truncate": _truncate,
    "junk": _junk,
    "insert_junk": _insert_junk,
    "empty": lambda d, r: b"",
    "comments_only": lambda d, r: b"# nothing\n# here\n",
    "utf8_bom": lambda d, r: b"\xef\xbb\xbf" + d,
    "utf16": lambda d, r: d.decode().encode("utf-16"),
    "utf16_no_bom": lambda d, r: d.decode().encode("utf-16-le"),
    "huge_index": lambda d, r: _mutate_token(d, r, _index(str(int(r.integers(2**25, 2**40))))),
    "overflow_index": lambda d, r: _mutate_token(d, r, _index("1" + "0" * 25)),
    "negative_index": lambda d, r: _mutate_token(d, r, _index(str(-int(r.integers(1, 9))))),
    "float_index": lambda d, r: _mutate_token(d, r, _index("2.5")),
    "garbage_index": lambda d, r: _mutate_token(d, r, _index("abc")),
    "nan_value": lambda d, r: _mutate_token(d, r, _value("nan")),
    "inf_value": lambda d, r: _mutate_token(d, r, _value(str(r.choice(["inf", "-inf"])))),
    "1e308_value": lambda d, r: _mutate_token(d, r, _value("1e308")),
    "1e200_value": lambda d, r: _mutate_token(d, r, _value("-1e200")),
    "garbage_value": lambda d, r: _mutate_token(d, r, _value("x1")),
    "no_colon": lambda d, r: _mutate_token(d, r, lambda t, rng: t.replace(b":", b"")),
    "comma_separated": lambda d, r: d.replace(b" ", b","),
    "tab_separated": lambda d, r: d.replace(b" ", b"\t"),
    "nan_label": lambda d, r: d.replace(b"-1 2:1", b"nan 2:1"),
    "huge_label": lambda d, r: d.replace(b"-1 2:1", b"1e300 2:1"),
}


def _check_dataset(data) -> None:
    X = data.X
    assert X.shape[0] == len(data.y) > 0
    assert X.shape[1] <= MAX_FEATURES
    assert np.all(np.isfinite(X.data)) and np.all(np.abs(X.data) <= MAX_ABS_VALUE)
    assert np.all(np.isfinite(np.asarray(data.y, dtype=np.float64)))
    assert np.all(np.isfinite(X.multiply(X).sum(axis=1)))  # row norms do not overflow
    assert X.indices.size == 0 or int(X.indices.max()) < X.shape[1]


def _outcome(load) -> str:
    """ "error" (a HyflError with a message) or "loaded"; anything else fails the test."""
    try:
        load()
    except HyflError as error:
        assert str(error).strip(), "HyflError without a message"
        return "error"
    return "loaded"


def _cases(mutations: dict, n: int, seed: int) -> list[tuple[int, str]]:
    rng = np.random.default_rng(seed)
    names = sorted(mutations)
    # Every mutation at least once, then random ones.
    chosen = names + [str(rng.choice(names)) for _ in range(n - len(names))]
    return list(enumerate(chosen))


# --------------------------------------------------------------------------- LIBSVM


def test_fuzz_libsvm(tmp_path):
    outcomes = {}
    for case, name in _cases(LIBSVM_MUTATIONS, N_LIBSVM, SEED):
        rng = np.random.default_rng([SEED, case])
        content = LIBSVM_MUTATIONS[name](VALID_LIBSVM, rng)
        path = tmp_path / f"case{case}.svm"
        path.write_bytes(content)
        result = {}

        def load(path=path, result=result):
            result["data"] = load_libsvm(path)

        outcome = _outcome(load)
        if outcome == "loaded":
            _check_dataset(result["data"])
        outcomes.setdefault(name, set()).add(outcome)
    # The mutations that can never be valid input must all be refused.
    for name in (
        "empty",
        "comments_only",
        "utf16",
        "utf16_no_bom",
        "huge_index",
        "overflow_index",
        "negative_index",
        "float_index",
        "garbage_index",
        "nan_value",
        "inf_value",
        "1e308_value",
        "1e200_value",
        "garbage_value",
        "nan_label",
        "huge_label",
    ):
        assert outcomes[name] == {"error"}, name
    assert sum(1 for _ in _cases(LIBSVM_MUTATIONS, N_LIBSVM, SEED)) == N_LIBSVM


# --------------------------------------------------------------------------- party files


def _csv_mutation(text_mutation):
    return lambda rng: ({"hospital": text_mutation(HOSPITAL.encode(), rng), "lab": LAB.encode()})


def _cell(value: str):
    def mutate(data: bytes, rng) -> bytes:
        lines = data.decode().split("\n")
        row = int(rng.integers(1, 5))
        cells = lines[row].split(",")
        cells[int(rng.integers(1, 3))] = value
        lines[row] = ",".join(cells)
        return "\n".join(lines).encode()

    return mutate


def _frame(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text), dtype={"id": str})


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    return buffer.getvalue()


def _parquet_mutation(change):
    def make(rng):
        frame = _frame(HOSPITAL)
        frame = change(frame, rng)
        return {"hospital.parquet": _parquet_bytes(frame), "lab": LAB.encode()}

    return make


def _set_cell(value):
    def change(frame, rng):
        frame = frame.astype({"age": str}) if isinstance(value, str) else frame
        frame.loc[int(rng.integers(len(frame))), "age"] = value
        return frame

    return change


PARTY_MUTATIONS = {
    "flip": _csv_mutation(_flip_bytes),
    "truncate": _csv_mutation(_truncate),
    "junk": _csv_mutation(_junk),
    "empty": _csv_mutation(lambda d, r: b""),
    "header_only": _csv_mutation(lambda d, r: d.split(b"\n")[0] + b"\n"),
    "utf8_bom": _csv_mutation(lambda d, r: b"\xef\xbb\xbf" + d),
    "utf16": _csv_mutation(lambda d, r: d.decode().encode("utf-16")),
    "utf16_no_bom": _csv_mutation(lambda d, r: d.decode().encode("utf-16-le")),
    "latin1": _csv_mutation(lambda d, r: d.replace(b"label", "label\xe9".encode("latin-1"))),
    "semicolons": _csv_mutation(lambda d, r: d.replace(b",", b";")),
    "nan_cell": _csv_mutation(_cell("nan")),
    "inf_cell": _csv_mutation(_cell("-inf")),
    "1e308_cell": _csv_mutation(_cell("1e308")),
    "text_cell": _csv_mutation(_cell("abc")),
    "duplicated_column": _csv_mutation(lambda d, r: d.replace(b"weight", b"age")),
    "renamed_id": lambda rng: {
        "hospital": HOSPITAL.encode(),
        "lab": LAB.replace("id", "ID").encode(),
    },
    "disjoint_ids": lambda rng: {
        "hospital": HOSPITAL.encode(),
        "lab": LAB.replace("\n2,", "\n12,")
        .replace("\n3,", "\n13,")
        .replace("\n4,", "\n14,")
        .encode(),
    },
    "duplicated_id": _csv_mutation(lambda d, r: d.replace(b"\n2,", b"\n1,")),
    "parquet_no_rows": _parquet_mutation(lambda f, r: f.iloc[:0]),
    "parquet_nan": _parquet_mutation(_set_cell(np.nan)),
    "parquet_inf": _parquet_mutation(_set_cell(np.inf)),
    "parquet_1e308": _parquet_mutation(_set_cell(1e308)),
    "parquet_text": _parquet_mutation(_set_cell("abc")),
    "parquet_no_id": _parquet_mutation(lambda f, r: f.drop(columns=["id"])),
    "parquet_truncated": lambda rng: {
        "hospital.parquet": _parquet_bytes(_frame(HOSPITAL))[: int(rng.integers(0, 200))],
        "lab": LAB.encode(),
    },
}

ALWAYS_REFUSED_PARTIES = {
    "empty",
    "header_only",
    "utf16",
    "utf16_no_bom",
    "latin1",
    "semicolons",
    "nan_cell",
    "inf_cell",
    "1e308_cell",
    "text_cell",
    "duplicated_column",
    "renamed_id",
    "disjoint_ids",
    "duplicated_id",
    "parquet_no_rows",
    "parquet_nan",
    "parquet_inf",
    "parquet_1e308",
    "parquet_text",
    "parquet_no_id",
    "parquet_truncated",
}


def test_fuzz_party_files(tmp_path):
    outcomes = {}
    for case, name in _cases(PARTY_MUTATIONS, N_PARTIES, SEED + 1):
        rng = np.random.default_rng([SEED + 1, case])
        files = {}
        for party, content in PARTY_MUTATIONS[name](rng).items():
            stem, _, suffix = party.partition(".")
            path = tmp_path / f"case{case}-{stem}.{suffix or 'csv'}"
            path.write_bytes(content)
            files[stem] = path
        result = {}

        def load(files=files, result=result):
            result["data"] = load_parties(files, psi=False, unlabeled="drop")

        outcome = _outcome(load)
        if outcome == "loaded":
            data, partition = result["data"]
            _check_dataset(data)
            partition.validate(data.X)
            assert sum(data.meta["shared_ids"].values()) > 0
        outcomes.setdefault(name, set()).add(outcome)
    for name in ALWAYS_REFUSED_PARTIES:
        assert outcomes[name] == {"error"}, name


# --------------------------------------------------------------------------- TOML configs

VALID_CONFIG = {
    "experiment": {"name": "fuzz", "seeds": [0], "eval_every": 1, "budget": {"iterations": 5}},
    "data": {"dataset": "breast_cancer", "loss": "hinge", "lam": 1e-3},
    "partition": {"spec": "grid:2x2", "participation": "full"},
    "costs": {"cipher": "none", "latency": 0.0},
    "algorithms": {"hyfdca": {"local_steps": 5}, "fedavg": {"a": 0.1, "b": 1.0}},
}
WRONG_VALUES = ["five", [1, 2], True, -3, 0, {"x": 1}, 2.5, "", [], -1e-9, 1e400]


def _set_path(config: dict, path: tuple[str, ...], value) -> dict:
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.items()}
    table = config
    for key in path[:-1]:
        table[key] = dict(table[key])
        table = table[key]
    table[path[-1]] = value
    return config


def _leaf_paths(table, prefix=()):
    for key, value in table.items():
        if isinstance(value, dict) and value:
            yield from _leaf_paths(value, prefix + (key,))
        else:
            yield prefix + (key,)


LEAVES = sorted(_leaf_paths(VALID_CONFIG))


def _toml(config) -> bytes:
    return tomli_w.dumps(config).encode()


def _without(config: dict, section: str) -> dict:
    return {k: v for k, v in config.items() if k != section}


TOML_MUTATIONS = {
    "wrong_type": lambda r: _toml(
        _set_path(
            VALID_CONFIG,
            LEAVES[int(r.integers(len(LEAVES)))],
            WRONG_VALUES[int(r.integers(len(WRONG_VALUES) - 1))],  # 1e400 is not TOML
        )
    ),
    "infinite": lambda r: _toml(_set_path(VALID_CONFIG, ("data", "lam"), float("inf"))),
    "unknown_key": lambda r: _toml(
        _set_path(VALID_CONFIG, LEAVES[int(r.integers(len(LEAVES)))][:-1] + ("bogus",), 1)
    ),
    "unknown_section": lambda r: _toml({**VALID_CONFIG, "extra": {"x": 1}}),
    "unknown_hyper": lambda r: _toml(_set_path(VALID_CONFIG, ("algorithms", "hyfdca", "speed"), 3)),
    "missing_section": lambda r: _toml(
        _without(VALID_CONFIG, str(r.choice(["experiment", "data", "algorithms"])))
    ),
    "flip": lambda r: _flip_bytes(_toml(VALID_CONFIG), r),
    "truncate": lambda r: _truncate(_toml(VALID_CONFIG), r),
    "junk": lambda r: _junk(b"", r),
    "garbage_syntax": lambda r: _toml(VALID_CONFIG).replace(b"=", b":", 1),
    "utf16": lambda r: _toml(VALID_CONFIG).decode().encode("utf-16"),
    "empty": lambda r: b"",
}


def test_fuzz_toml_configs(tmp_path):
    outcomes = {}
    for case, name in _cases(TOML_MUTATIONS, N_TOML, SEED + 2):
        rng = np.random.default_rng([SEED + 2, case])
        path = tmp_path / f"case{case}.toml"
        path.write_bytes(TOML_MUTATIONS[name](rng))
        outcomes.setdefault(name, set()).add(_outcome(lambda path=path: load_config(path)))
    for name in ("infinite", "unknown_key", "unknown_section", "unknown_hyper", "missing_section"):
        assert outcomes[name] == {"error"}, name
    for name in ("garbage_syntax", "utf16", "empty"):
        assert outcomes[name] == {"error"}, name


def test_wrong_type_at_every_config_key_is_refused(tmp_path):
    """Not random: every leaf key with a value of the wrong kind for it."""
    for leaf in LEAVES:
        current = leaf and _get(VALID_CONFIG, leaf)
        for value in ("five", [1, 2], {"x": 1}, True):
            if isinstance(current, str) and value == "five":
                continue  # a string where a string goes may be valid
            if isinstance(current, list) and isinstance(value, list):
                continue
            path = tmp_path / "wrong.toml"
            path.write_bytes(_toml(_set_path(VALID_CONFIG, leaf, value)))
            with pytest.raises(HyflError) as error:
                load_config(path)
            message = str(error.value)
            assert leaf[-1] in message and "wrong.toml" in message, (leaf, value, message)


def _get(table, path):
    for key in path:
        table = table[key]
    return table


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("filename", "content", "args"),
    [
        ("huge.svm", b"1 1:1 2000000000:1\n", ["run", "--data", "{path}", "--iterations", "2"]),
        ("values.svm", b"1 1:1e308\n-1 1:1\n", ["run", "--data", "{path}", "--iterations", "2"]),
        ("utf16.svm", "1 1:1\n".encode("utf-16"), ["run", "--data", "{path}", "--iterations", "2"]),
        (
            "bad.toml",
            b'[experiment]\nbudget = { iterations = 5 }\n[data]\ndataset = "breast_cancer"\n'
            b'[partition]\nspec = "grid:2x2"\n[algorithms.hyfdca]\nlocal_steps = "five"\n',
            ["run", "{path}"],
        ),
        ("syntax.toml", b"[experiment\nname = ", ["run", "{path}"]),
    ],
)
def test_cli_reports_malformed_inputs_without_traceback(tmp_path, filename, content, args):
    path = tmp_path / filename
    path.write_bytes(content)
    args = [a.replace("{path}", str(path)) for a in args] + ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert "error:" in result.output and filename in result.output.replace("\n", "")


def test_cli_reports_party_files_without_common_ids(tmp_path):
    a = tmp_path / "hospital.csv"
    b = tmp_path / "lab.csv"
    a.write_text(HOSPITAL)
    b.write_text("id,glucose\n12,5.1\n13,4.8\n")
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--data",
            f"parties:{a},{b};psi=no",
            "--iterations",
            "2",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert result.exit_code != 0 and "Traceback" not in result.output
    output = " ".join(result.output.split())
    assert "'hospital' (4 IDs, 0 shared)" in output and "'lab' (2 IDs, 0 shared)" in output
