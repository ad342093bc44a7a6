"""Shared test set-up: the HE cost cache lives in a temporary folder; JAX keeps its
compiled programs on disk for the run.

``--he-costs auto`` (the default) calibrates a real cipher once and caches the
figures in ``$HYFL_CACHE/he-costs.json``; tests must not read or write the
user's cache, so each test session gets its own.

The neural tests run the same small models many times (each run builds its own
jitted functions, so JAX's in-memory cache misses); XLA compilation was about a
third of their CPU time. JAX's persistent compilation cache, in a temporary
folder shared by the xdist workers of one run and removed at its end, compiles
each distinct program once. A hit returns the executable XLA built for the same
program, so the numbers are the same.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_JAX_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_jax_cache_made: str | None = None


def pytest_configure(config):
    """In the controller (or a run without xdist), before any worker starts and before
    JAX is imported: a fresh cache folder in the environment that the workers inherit."""
    global _jax_cache_made
    if hasattr(config, "workerinput") or _JAX_CACHE_VARIABLE in os.environ:
        return  # an xdist worker (inherits the folder), or the user chose a cache
    _jax_cache_made = tempfile.mkdtemp(prefix="hyfl-test-jax-cache-")
    os.environ[_JAX_CACHE_VARIABLE] = _jax_cache_made
    # Cache every program, however quick to compile or small (the defaults skip those).
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
    global _jax_cache_made
    if _jax_cache_made is not None:
        shutil.rmtree(_jax_cache_made, ignore_errors=True)
        os.environ.pop(_JAX_CACHE_VARIABLE, None)
        _jax_cache_made = None


@pytest.fixture(autouse=True, scope="session")
def _isolated_he_cost_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    if "HYFL_CACHE" not in __import__("os").environ:
        mp.setenv("HYFL_CACHE", str(tmp_path_factory.mktemp("hyfl-cache")))
    yield
    mp.undo()


def _shared_data():
    """$HYFL_DATA, else the shared folder beside the repository (CI has ../shared)."""
    from pathlib import Path

    candidates = [Path(p) for p in (os.environ.get("HYFL_DATA"),) if p]
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    return next((p for p in candidates if (p / "README.md").is_file()), None)


@pytest.fixture
def shared_data():
    """The real data sets' folder; the test is skipped where it is absent."""
    folder = _shared_data()
    if folder is None:
        pytest.skip("shared/data folder not available")
    return folder


@pytest.fixture
def x64():
    """JAX in float64 for the test (finite differences), restored afterwards."""
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)
