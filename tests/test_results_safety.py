"""Results are never lost: existing folders are refused unless asked, files are replaced
atomically, and every JSON file is strict JSON (no bare NaN)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from hyfl._io import atomic_write, check_results_folder, dumps_json, write_json
from hyfl.cli import app
from hyfl.errors import HyflError

runner = CliRunner()
RUN = ["run", "--data", "breast_cancer", "--partition", "grid:2x2", "--iterations", "3",
       "--no-progress"]


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_an_existing_results_folder_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "run"
    first = runner.invoke(app, [*RUN, "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = (out / "run.json").read_text()
    again = runner.invoke(app, [*RUN, "--out", str(out), "--seed", "1"])
    assert again.exit_code == 2
    text = " ".join(again.output.split())
    assert "exists and is not empty" in text and "--overwrite" in text
    assert "--resume" not in text  # single runs have no --resume (experiment configs do)
    assert "Traceback" not in again.output
    assert (out / "run.json").read_text() == before  # nothing was touched
    replaced = runner.invoke(app, [*RUN, "--out", str(out), "--seed", "1", "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert json.loads((out / "run.json").read_text())["spec"]["seed"] == 1


def test_compare_refuses_an_existing_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["compare", "--data", "breast_cancer", "--iterations", "2",
                                 "--algorithms", "hyfdca", "--out", str(tmp_path),
                                 "--no-progress"])
    assert result.exit_code == 2 and "exists and is not empty" in " ".join(result.output.split())
    assert "--resume" not in result.output
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_check_results_folder_rules(tmp_path):
    assert check_results_folder(tmp_path / "new") == tmp_path / "new"
    assert check_results_folder(tmp_path) == tmp_path  # exists but empty
    (tmp_path / "keys").mkdir()
    assert check_results_folder(tmp_path, allow=("keys",)) == tmp_path
    with pytest.raises(HyflError, match="not empty"):
        check_results_folder(tmp_path)
    assert check_results_folder(tmp_path, resume=True) == tmp_path
    assert check_results_folder(tmp_path, overwrite=True) == tmp_path
    (tmp_path / "file").write_text("x")
    with pytest.raises(HyflError, match="not a folder"):
        check_results_folder(tmp_path / "file")


def test_every_json_a_run_writes_is_strict_json(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, [*RUN, "--out", str(out)])
    assert result.exit_code == 0, result.output
    files = list(out.rglob("*.json"))
    assert files
    for path in files:
        _strict(path.read_text())


def test_nan_and_inf_become_null():
    import numpy as np

    record = {"a": float("nan"), "b": [np.float64("inf"), 1.5], "c": np.int64(3),
              "d": np.array([np.nan, 2.0])}
    assert _strict(dumps_json(record)) == {"a": None, "b": [None, 1.5], "c": 3, "d": [None, 2.0]}


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "run.json"
    write_json(path, {"round": 1})
    with pytest.raises(RuntimeError), atomic_write(path) as f:
        f.write('{"round": 2, "half')
        raise RuntimeError("killed mid-write")
    assert _strict(path.read_text()) == {"round": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left


def test_a_private_key_is_never_world_readable(tmp_path):
    path = tmp_path / "private.json"
    write_json(path, {"p": "0x5"}, permissions=0o600)
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_planted_temporary_file_or_symlink_is_never_written_through(tmp_path, monkeypatch):
    """Another local user who guesses the temporary name and plants a symlink there (to a
    file of theirs, or to one they want overwritten) gets nothing: the write takes a fresh
    name, and the private key is still 0600."""
    from hyfl import _io

    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    path = tmp_path / "private.json"
    names = iter(["planted", "planted", "fresh"])
    monkeypatch.setattr(_io.secrets, "token_hex", lambda n: next(names))
    planted = tmp_path / ".private.json.planted.tmp"
    planted.symlink_to(victim)
    # The name an earlier version used (the process id) is no use either.
    (tmp_path / f".private.json.{os.getpid()}.tmp").symlink_to(victim)
    write_json(path, {"p": "0x5"}, permissions=0o600)
    assert victim.read_text() == "untouched"
    assert path.stat().st_mode & 0o777 == 0o600 and not path.is_symlink()
    assert _strict(path.read_text()) == {"p": "0x5"}
    assert planted.is_symlink()  # left as it was, not followed or removed
