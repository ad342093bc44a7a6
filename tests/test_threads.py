"""The one thread setting (hyfl._threads): the command line, the environment, a block."""

import os

import pytest

from hyfl._threads import THREADS_VARIABLE, limit_threads, thread_count, usable_cores
from hyfl.errors import HyflError


def test_the_default_is_every_usable_core_and_the_environment_overrides_it(monkeypatch):
    monkeypatch.delenv(THREADS_VARIABLE, raising=False)
    assert thread_count() == usable_cores() >= 1
    monkeypatch.setenv(THREADS_VARIABLE, "3")
    assert thread_count() == 3
    with limit_threads(1):  # a block narrows it, and restores it after
        assert thread_count() == 1
    assert thread_count() == 3


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_in_the_environment_is_named(monkeypatch, value):
    monkeypatch.setenv(THREADS_VARIABLE, value)
    with pytest.raises(HyflError, match=r"\$HYFL_THREADS"):
        thread_count()


@pytest.mark.parametrize("value", [0, -1, 1.5, "x", True])
def test_a_bad_thread_count_for_a_block_is_refused(value):
    with pytest.raises(HyflError, match="threads"), limit_threads(value):
        pass


def test_hyfl_threads_sets_the_count_for_the_process_and_its_children(monkeypatch):
    from typer.testing import CliRunner

    from hyfl.cli import app

    monkeypatch.setenv(THREADS_VARIABLE, "1")  # (recorded: restored after the test)
    monkeypatch.delenv(THREADS_VARIABLE)
    result = CliRunner().invoke(app, ["--threads", "2", "algorithms"])
    assert result.exit_code == 0, result.output
    assert os.environ[THREADS_VARIABLE] == "2" and thread_count() == 2
    refused = CliRunner().invoke(app, ["--threads", "0", "algorithms"])
    assert refused.exit_code != 0 and "--threads" in refused.output


@pytest.mark.parametrize("wanted", ["all", "most", "some"])
def test_the_draws_are_the_same_for_any_thread_count(monkeypatch, wanted):
    # A full local pass sorts every client's random keys, on several threads when there
    # are many (hyfl.algorithms.base._sort_runs); each run's order must not depend on it.
    import numpy as np

    from hyfl.algorithms import base

    monkeypatch.setattr(base, "MIN_KEYS_PER_THREAD", 1_000)
    sizes = np.array([5_000, 1, 0, 7_000, 3_000, 40, 9_000])
    counts = {"all": sizes, "most": (sizes * 3) // 4, "some": np.minimum(sizes, 60)}[wanted]
    draws = {}
    for threads in (1, 2, 3, 8):
        with limit_threads(threads):
            draws[threads] = base.draw_local_samples(np.random.default_rng(4), sizes, counts)
    for threads in (2, 3, 8):
        np.testing.assert_array_equal(draws[threads], draws[1])
    ends = np.cumsum(counts)
    for k, (end, count) in enumerate(zip(ends, counts)):
        mine = draws[1][end - count:end]
        assert np.unique(mine).size == count and (mine < max(sizes[k], 1)).all()
