"""What a deployed run reports: its defaults, its progress per round, its summary, and
whether it learned (``hyfl deploy local`` and ``hyfl deploy run``)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import tomllib
from rich.console import Console
from typer.testing import CliRunner

import hyfl.deploy.local as local_module
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.cli import app
from hyfl.deploy.config import RUN_DEFAULTS, DeployConfig, run_config_for
from hyfl.deploy.coordinator import Coordinator
from hyfl.deploy.keys import server_cipher
from hyfl.deploy.local import wait_for_results
from hyfl.deploy.report import (
    NO_PROGRESS_EXIT,
    RoundDisplay,
    judge_progress,
    round_line,
    summarize,
    summary_table,
)
from test_deploy import InProcessTransport

runner = CliRunner()


def test_an_empty_hyper_is_hyfdcas_defaults():
    # Every step rule is deployed: an empty hyper is HyFDCA's own defaults (cocoa).
    assert RUN_DEFAULTS["hyper"] == ""
    config = DeployConfig.from_run_config(run_config_for(parties=4, cipher="none"))
    assert config.algorithm == HyFDCA()
    assert config.algorithm.step_rule == "cocoa" and config.iterations == 10
    chosen = DeployConfig.from_run_config(run_config_for(parties=4, cipher="none",
                                                         hyper="step_rule=safe"))
    assert chosen.algorithm == dataclasses.replace(HyFDCA(), step_rule="safe")


# ----------------------------------------------------------------------------- judgement


def _round(t, *, accepted=True, active=(0, 1), absent=(), seconds=2.0, attempts=1):
    """A round record as the coordinator writes it into deploy.json (the fields used here)."""
    return {"iteration": t, "scheduled": sorted({*active, *absent}), "active": list(active),
            "absent": list(absent), "accepted": accepted, "attempts": attempts,
            "round_seconds": seconds, "payload_bytes_up": 120_000.0 * t,
            "payload_bytes_down": 2_500_000.0, "bytes_up": 100_000.0, "bytes_down": 2e6,
            "encryptions": 1000, "decryptions": 800, "additions": 5000, "messages": 7}


def _results(rounds, rule="theory", participation="full", **hyper):
    return {"status": "completed", "rounds": rounds, "parties": {"0": {}, "1": {}},
            "cipher": {"name": "paillier"}, "seconds": {"total": 12.5},
            "config": {"participation": participation, "hyper": {"step_rule": rule, **hyper},
                       "algorithm": {"name": "hyfdca", "step_rule": rule}}}


def test_judgement_of_runs_that_learned():
    results = _results([_round(1), _round(2)])
    assert judge_progress(results, [3.65, 3.6, 3.5]).progressed
    assert judge_progress(results).progressed  # hyfl deploy run: the objective is unknown
    assert judge_progress(results).message() == ""
    some = _results([_round(1, accepted=False), _round(2)], rule="safe")
    assert judge_progress(some, [3.65, 3.65, 3.2]).progressed


def test_judgement_of_runs_without_progress_says_what_to_change():
    rejected = _results([_round(t, accepted=False) for t in (1, 2, 3)], rule="safe")
    for losses in (None, [3.65] * 4):  # judged alike by hyfl deploy run and local
        judgement = judge_progress(rejected, losses)
        assert not judgement.progressed
        message = judgement.message()
        assert message.startswith("no progress: no round was accepted (all 3 rounds")
        for fix in ("--iterations 10", "--param local_steps=5", "--param step_rule=cocoa"):
            assert fix in message
    worse = judge_progress(_results([_round(1), _round(2)]), [3.65, 3.7, 3.66])
    assert not worse.progressed
    assert ("the objective overshot and is falling again (highest at round 1: 3.7): relative "
            "loss 3.65 at the start, 3.66 after 2 rounds (2 accepted)") in worse.message()
    assert "--iterations 10" in worse.advice and "local_steps=N" in worse.advice
    same = judge_progress(_results([_round(1)], participation="0.5", gamma=0.5), [3.65, 3.65])
    assert not same.progressed and "--participation full" in same.advice
    assert "--param gamma=1" in same.advice
    paper = judge_progress(_results([_round(1)], rule="paper"), [3.65, 22.9])
    assert "diverges" in paper.advice and "--param step_rule=cocoa" in paper.advice
    safe = judge_progress(_results([_round(1)], rule="safe"), [3.65, 8.6])
    assert "beta adapts" in safe.advice and "step_rule=cocoa" in safe.advice
    # Below the start at some round: the best weights seen are returned, the run learned.
    assert judge_progress(_results([_round(1), _round(2)], rule="cocoa"), [3.65, 0.3, 4.5]
                          ).progressed
    overshoot = judge_progress(_results([_round(1), _round(2)], rule="cocoa"), [3.65, 4.5, 3.9])
    assert overshoot.reason.startswith("the objective overshot and is falling again (highest "
                                       "at round 1: 4.5): relative loss 3.65 at the start, 3.9")
    assert "overshoot" in overshoot.advice and "--iterations 10" in overshoot.advice
    rising = judge_progress(_results([_round(1), _round(2)], rule="cocoa"), [3.65, 3.9, 4.5])
    assert rising.reason.startswith("the objective is rising")
    assert "overshoot" not in rising.advice and "step_rule=safe" in rising.advice
    nan = judge_progress(_results([_round(1)]), [3.65, float("nan")])
    assert "the objective is not finite" in nan.reason
    absent = judge_progress(_results([_round(1, active=(), absent=(0, 1))]))
    assert absent.reason == "no party took part in any of the 1 rounds"
    assert "Parties 0, 1 did not answer" in absent.advice and "--reply-timeout" in absent.advice
    left_out = judge_progress(_results([_round(1, active=())], participation="cyclic:2"))
    assert "(cyclic:2) left every party out" in left_out.advice
    assert not judge_progress(_results([])).progressed


# ----------------------------------------------------------------------------- display


def _console(width=80) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)


def test_round_display_prints_one_plain_line_per_round_without_a_terminal():
    console = _console(width=40)  # narrower than a line: plain lines do not wrap
    records = [_round(1), _round(2, absent=(2,), attempts=2),
               _round(3, accepted=False, seconds=0.25), _round(4, active=())]
    with RoundDisplay(console, total=12, show_loss=True) as display:
        for record, loss in zip(records, (3.6, 3.51, None, float("nan")), strict=True):
            display.show(record, loss)
    lines = console.file.getvalue().splitlines()
    assert lines == [
        "round  1/12  parties 0,1  absent -  accepted  rel. loss 3.6  2 s  up 120 kB  down 2.5 MB",
        "round  2/12  parties 0,1  absent 2  accepted  rel. loss 3.51  2 s  up 240 kB  down "
        "2.5 MB  2 attempts",
        "round  3/12  parties 0,1  absent -  rejected  rel. loss -  250 ms  up 360 kB  down 2.5 MB",
        "round  4/12  parties -  absent -  no parties  rel. loss -  2 s  up 480 kB  down 2.5 MB",
    ]
    # hyfl deploy run: the coordinator has no data, so no loss column at all.
    assert round_line(_round(1)) == "round 1  parties 0,1  absent -  accepted  2 s  up 120 kB  " \
        "down 2.5 MB"


def test_summary_table_fits_80_columns():
    results = _results([_round(t) for t in range(1, 6)])
    summary = summarize(results, [3.65, 3.63, 3.6, 3.58, 3.56, 3.53])
    assert summary["rounds"] == 5 and summary["accepted"] == 5
    assert summary["payload_bytes_up"] == 1_800_000 and summary["encryptions"] == 5000
    comparison = {"rounds": 5, "protocol_accepted": 5, "protocol_relative_loss": 3.53,
                  "protocol_round_seconds_median": 0.012, "max_abs_weight_difference": 0.0,
                  "protocol_totals": {"bytes_up": 5e5, "bytes_down": 1e7, "encryptions": 5000,
                                      "decryptions": 4000, "additions": 25000}}
    for compared in (None, comparison):
        console = _console()
        console.print(summary_table(summarize(results, [3.65, 3.53], compared)))
        text = console.file.getvalue()
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 80
        assert "hyfdca on Flower, 2 parties" in text and "theory, paillier" in text
        for needle in ("rounds (accepted)", "5 (5)", "3.65 -> 3.53", "2 s", "1.8 MB", "500 kB",
                       "12.5 MB", "5,000", "bytes up (HyFDCA's count)"):
            assert needle in text, needle
        assert ("in-process" in text) == (compared is not None)
        if compared is not None:
            assert "max |w difference|" in text and "12 ms" in text and "25,000" in text
    unknown = _console()  # hyfl deploy run: no relative loss row
    unknown.print(summary_table(summarize(results)))
    assert "relative loss" not in unknown.file.getvalue()


# ----------------------------------------------------------------------------- CLI


class _ThreadRun:
    """A deployed job run by the coordinator in a thread, seen as ``flwr run`` would be:
    ``poll()`` is None until it ends; its results appear in ``out`` round by round.

    In-process rounds take milliseconds, deployed ones seconds: after writing a round
    the coordinator waits until :meth:`seen` reports it (as a deployed run, whose
    follower reads every round before the next one ends), so the test is deterministic.
    """

    def __init__(self, run_config, nodes, lockstep=True):
        config = DeployConfig.from_run_config(run_config)
        cipher = server_cipher(config.cipher, config.public_key or None,
                               **config.cipher_options(),
                               insecure_test_keys=config.insecure_test_keys)
        transport = InProcessTransport(nodes, run_config, cipher)
        self.coordinator = Coordinator(config, transport, cipher, log=lambda line: None)
        self.shown, self.changed = 0, threading.Condition()
        write = self.coordinator._write

        def write_and_wait(final=False):
            write(final)
            rounds = len(self.coordinator.results["rounds"])
            with self.changed:
                self.changed.wait_for(lambda: final or self.shown >= rounds, timeout=30)

        if lockstep:
            self.coordinator._write = write_and_wait
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def seen(self, record):
        with self.changed:
            self.shown = int(record["iteration"])
            self.changed.notify_all()

    def _run(self):
        try:
            self.coordinator.run()
        except Exception:  # noqa: BLE001 (recorded in deploy.json, as by the ServerApp)
            pass

    def poll(self):
        return None if self.thread.is_alive() else 0

    def terminate(self):
        pass

    def wait(self, timeout=None):
        self.thread.join(timeout)
        return 0


class InProcessDeployment:
    """Stands in for LocalDeployment: no Flower processes, the same coordinator and parties
    (real codec and state handling) in this process; results through ``wait_for_results``."""

    def __init__(self, node_configs, workdir, **options):
        self.nodes, self.workdir = [dict(c) for c in node_configs], Path(workdir)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, run_config, *, timeout=None, on_progress=None):
        self.workdir.mkdir(parents=True, exist_ok=True)
        job = _ThreadRun(run_config, self.nodes)

        def progress(record):
            if on_progress is not None:
                on_progress(record)
            job.seen(record)

        return wait_for_results(job, Path(run_config["out"]), self.workdir / "run.log",
                                timeout=timeout, on_progress=progress, poll=0.02)


@pytest.fixture
def in_process_local(monkeypatch):
    """``hyfl deploy local`` with the in-process deployment (cipher none: tests only)."""
    monkeypatch.setattr(local_module, "LocalDeployment", InProcessDeployment)


def _local(tmp_path, *args):
    return runner.invoke(app, ["deploy", "local", "--cipher", "none", "--partition", "grid:2x2",
                               "--out", str(tmp_path / "out"), *args])


def test_local_with_the_defaults_learns_and_shows_every_round(tmp_path, in_process_local):
    """No --param, no --iterations: HyFDCA's defaults (cocoa rule) for 5 rounds, and the
    relative loss falls; each round is shown as it ends, then the summary."""
    result = _local(tmp_path, "--compare")
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "out" / "deploy.json").read_text())
    assert results["config"]["algorithm"] == HyFDCA().config()
    assert len(results["rounds"]) == 5
    metrics = (tmp_path / "out" / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    column = {name: [float(line.split(",")[header.index(name)]) for line in metrics[1:]]
              for name in ("relative_loss", "round_relative_loss", "model_round")}
    loss = column["round_relative_loss"]  # each round's w (cocoa may overshoot on the way)
    best = column["relative_loss"]  # the best w seen: never rises, never above the start
    assert best[0] == loss[0] and best[-1] < best[0]
    assert all(b <= a for a, b in zip(best, best[1:]))
    assert best == [min(loss[:t + 1]) for t in range(len(loss))]
    lines = result.output.splitlines()
    shown = [line for line in lines if line.startswith("round ")]
    assert len(shown) == 5 and shown[0].startswith("round 1/5  parties 0,1,2,3  absent -  "
                                                   f"accepted  rel. loss {loss[1]:.3g} (")
    text = " ".join(result.output.split())
    assert f"{best[0]:.3g} -> {best[-1]:.3g}" in text and "in-process" in text
    assert "no progress" not in text
    assert re.search(r"max \|w difference\| *│ *│ *0 │", result.output)
    from hyfl.model_file import load_model

    model = load_model(tmp_path / "out" / "model.npz")  # the best weights, as a model file
    with np.load(tmp_path / "out" / "weights.npz") as f:
        kept = np.asarray(f["w"][int(column["model_round"][-1])])
        np.testing.assert_array_equal(model.weights, kept.reshape(30, -1))
    assert model.n_features == 30 and list(model.labels) == [0.0, 1.0]


def test_local_without_progress_exits_3_and_says_what_to_change(tmp_path, in_process_local):
    # The printed paper rule diverges here: accepted rounds, the objective rises.
    result = _local(tmp_path, "--param", "step_rule=paper", "--iterations", "2")
    assert result.exit_code == NO_PROGRESS_EXIT, result.output
    text = " ".join(result.output.split())
    assert "no progress: the objective is rising (the last round's is the highest since the " \
        "start): relative loss 3.65 at the start" in text
    assert "--param step_rule=cocoa" in text
    for name in ("deploy.json", "weights.npz", "metrics.csv"):  # the results are written
        assert (tmp_path / "out" / name).exists(), name
    assert len([line for line in result.output.splitlines() if line.startswith("round ")]) == 2
    # The safe rule rejects its first rounds with HyFDCA's default draws.
    result = _local(tmp_path, "--param", "step_rule=safe", "--iterations", "2", "--overwrite")
    assert result.exit_code == NO_PROGRESS_EXIT, result.output
    text = " ".join(result.output.split())
    assert "no progress: no round was accepted" in text and "--param local_steps=5" in text
    assert [line.split("  ")[3] for line in result.output.splitlines()
            if line.startswith("round ")] == ["rejected", "rejected"]
    assert re.search(r"rounds \(accepted\) *│ *2 \(0\) │", result.output)


class _FakeFlwrRun(_ThreadRun):
    """``subprocess.Popen`` for ``flwr run APP CONNECTION --stream --run-config FILE``:
    the job runs in this process against in-process parties (no lockstep: the command
    shows no objective, and every round of deploy.json is shown even if read late)."""

    nodes: list = []

    def __init__(self, command, **options):
        with open(command[command.index("--run-config") + 1], "rb") as f:
            run_config = tomllib.load(f)
        super().__init__(run_config, self.nodes, lockstep=False)


def test_run_follows_the_job_and_exits_3_when_no_round_is_accepted(tmp_path, monkeypatch):
    """``hyfl deploy run`` on the coordinator: rounds from deploy.json as they appear; only
    "no round accepted" can be judged there (the coordinator has no data)."""
    monkeypatch.setattr(_FakeFlwrRun, "nodes", [{"party": k, "cipher": "none",
                                                 "data": "breast_cancer"} for k in range(4)])
    monkeypatch.setattr(subprocess, "Popen", _FakeFlwrRun)
    out = tmp_path / "out"
    out.mkdir()
    (out / "deploy.json").write_text('{"status": "completed", "rounds": [{"iteration": 9}]}')
    os.utime(out / "deploy.json", (0, 0))  # an earlier run's: ignored
    common = ["deploy", "run", "--superlink", "127.0.0.1:1", "--insecure", "--parties", "4",
              "--cipher", "none", "--partition", "grid:2x2",
              "--iterations", "2", "--out", str(out)]
    result = runner.invoke(app, [*common, "--param", "step_rule=safe"])
    assert result.exit_code == NO_PROGRESS_EXIT, result.output
    shown = [line for line in result.output.splitlines() if line.startswith("round ")]
    assert [line.split("  ")[3] for line in shown] == ["rejected", "rejected"]
    assert "rel. loss" not in result.output  # unknown on the coordinator
    assert "no progress: no round was accepted" in " ".join(result.output.split())
    result = runner.invoke(app, common)  # the default rule: every round accepted
    assert result.exit_code == 0, result.output
    assert re.search(r"rounds \(accepted\) *│ *2 \(2\) │", result.output)


def test_local_no_better_than_the_majority_class_exits_3(tmp_path, in_process_local,
                                                         shared_data):
    """ijcnn1 (training split) is 90.3% one class: one round of the theory rule's small
    steps lowers the objective below the zero model's but still predicts the majority class
    everywhere."""
    result = _local(tmp_path, "--data", "ijcnn1", "--param", "step_rule=theory",
                    "--iterations", "1")
    assert result.exit_code == NO_PROGRESS_EXIT, result.output
    text = " ".join(result.output.split())
    assert "no progress: no better than a trivial model: training accuracy 0.903 <= majority " \
        "class 0.903" in text
    assert "--iterations 10" in text
