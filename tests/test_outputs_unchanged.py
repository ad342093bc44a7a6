"""``hyfl run`` and ``hyfl compare`` write what they wrote before the package was
reorganized (issue "One place for each idea").

``tests/data/golden/`` holds the outputs of the two commands below as the code
of 2026-11-28 (commit b65cf06, before the split of ``experiments/runner.py``,
``partition.py`` and the cipher and data modules) wrote them: every metric
column that does not measure time (times are the machine's), the summary, the
keys of ``run.json`` and the files. A refactoring that changes a number, a
column, a key or a file fails here.

One deliberate change since: the last row of ``run-metrics.csv`` counts the
checkpoint duals a returning client is sent as the protocol sends them (the
samples that changed after its last sync), not by comparing values, which
rounding made machine-dependent (``bytes_down`` 1,004,860 -> 1,004,248 and
``decryptions`` 42,899 -> 42,865; see
``tests/test_protocol.py::test_checkpoint_traffic_is_counted_as_the_protocol_sends_it``).

And one since (issue "A real cross-organisation job"): a random-fraction round that drew no
client activates one drawn uniformly (``hyfl.participation.RandomFraction``); both commands'
traces had such an empty round (before round 10 and 15), so the rows from there on
changed, and ``run.json`` records HyFDCA's new ``local_passes`` option.

And one since (issue "HyFDCA's round written once"): the cocoa rule's line-search sums go
to every active client, which takes the step itself, instead of to one judge and then
the step to all (``hyfl.algorithms.hyfdca_round``): a round is one round trip fewer
(``round_trips``), and every active client receives and decrypts the summed sums
(``bytes_down``, ``floats_down``, ``ids_down``, ``decryptions``); the iterates are the same.
And after a round in which every client took part, the clients send the next round's
inner products with their step (``hyfl.algorithms.hyfdca_parties.Server.sends_ahead``):
those rounds' ``round_trips``, ``bytes_up``, ``bytes_down``, ``encryptions`` and
``floats_down`` move (the ``run`` command's trace has such rounds). Each party is told the
round's participants and the commit names the judge's step (an active server's review):
``bytes_down``, ``floats_down`` and ``ids_down``.
And ``run.json`` records HyFDCA's ``history_window`` option (issue "The round at its cost").
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from hyfl.cli import TRIVIAL_EXIT_CODE, app

GOLDEN = Path(__file__).parent / "data" / "golden"
#: Columns that measure time: they differ from run to run.
TIMED = ("round_seconds", "sim_time", "time_", "server_seconds", "median_round_ms")
RUN = ["run", "--data", "breast_cancer", "--partition", "grid:2x2", "--iterations", "30",
       "--eval-every", "5", "--seed", "1", "--val-fraction", "0.2", "--no-progress"]
COMPARE = ["compare", "--algorithms", "hyfdca,fedavg", "--data", "breast_cancer",
           "--partition", "grid:2x2", "--iterations", "20", "--eval-every", "5", "--seed", "2",
           "--no-progress"]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("outputs")
    for args, folder in ((RUN, "run"), (COMPARE, "cmp")):
        done = CliRunner().invoke(app, [*args, "--out", str(out / folder)])
        assert done.exit_code in (0, TRIVIAL_EXIT_CODE), done.output
    return out


def _keys(tree, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return set()
    return {k for key, value in tree.items()
            for k in {prefix + key} | _keys(value, f"{prefix}{key}.")}


@pytest.mark.parametrize("name, path", [
    ("run-metrics.csv", "run/metrics.csv"),
    ("compare-hyfdca-metrics.csv", "cmp/hyfdca/metrics.csv"),
    ("compare-fedavg-metrics.csv", "cmp/fedavg/metrics.csv"),
    ("compare-summary.csv", "cmp/summary.csv"),
])
def test_the_numbers_are_the_ones_written_before(written, name, path):
    before = pd.read_csv(GOLDEN / name)
    now = pd.read_csv(written / path)
    assert [c for c in now.columns if not c.startswith(TIMED)] == list(before.columns)
    pd.testing.assert_frame_equal(now[before.columns], before, check_exact=False, rtol=1e-9,
                                  atol=1e-12, check_dtype=False)  # 1.0 reads back as 1


def test_the_files_and_run_record_keys_are_the_ones_written_before(written):
    before = json.loads((GOLDEN / "outputs.json").read_text())
    files = sorted(str(p.relative_to(written)) for p in written.rglob("*") if p.is_file())
    assert files == before["files"]
    record = json.loads((written / "run" / "run.json").read_text())
    assert sorted(_keys(record)) == before["run_json_keys"]
