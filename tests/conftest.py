"""Shared test set-up: the HE cost cache lives in a temporary folder.

``--he-costs auto`` (the default) calibrates a real cipher once and caches the
figures in ``$HYFL_CACHE/he-costs.json``; tests must not read or write the
user's cache, so each test session gets its own.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_he_cost_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    if "HYFL_CACHE" not in __import__("os").environ:
        mp.setenv("HYFL_CACHE", str(tmp_path_factory.mktemp("hyfl-cache")))
    yield
    mp.undo()


@pytest.fixture
def x64():
    """JAX in float64 for the test (finite differences), restored afterwards."""
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)
