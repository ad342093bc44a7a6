"""The simulated clock charges work, not Numba's compilation (issue 27, point 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

from hyfl.work_clock import compiling_seconds, work_clock

ROOT = Path(__file__).resolve().parents[1]


def test_the_work_clock_stops_while_numba_compiles():
    @numba.njit
    def fresh(x):  # defined here: never compiled before, not cached on disk
        return x * 2.0 + 1.0

    compiled_before = compiling_seconds()
    wall, work = time.perf_counter(), work_clock()
    assert fresh(1.0) == 3.0
    wall, work = time.perf_counter() - wall, work_clock() - work
    compiling = compiling_seconds() - compiled_before
    assert compiling > 0.005  # it compiled
    assert work < 0.5 * wall and abs(wall - work - compiling) < 0.05 + 0.1 * wall
    compiled_before, work = compiling_seconds(), work_clock()
    fresh(2.0)  # compiled now: nothing to take out
    assert compiling_seconds() == compiled_before and work_clock() - work >= 0.0


_RUN = """
import json, sys
import numba.core.event
import numpy as np
compiled = []
class Compiles(numba.core.event.Listener):
    def on_start(self, event):
        pass
    def on_end(self, event):
        compiled.append(event.data["dispatcher"].py_func.__name__)
numba.core.event.register("numba:compile", Compiles())
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.data import default_lambda, load_data
from hyfl.partition import grid
from hyfl.participation import RandomFraction
from hyfl.problem import make_problem
from hyfl.runtime.simulation import simulate
problem = make_problem(load_data("breast_cancer"), "hinge", default_lambda("breast_cancer"))
partition = grid(problem.n_samples, problem.n_features, 3, 3, seed=0)
result = simulate(HyFDCA(), problem, partition, RandomFraction(9, 0.5), 10, seed=0)
charged = np.diff(result.column("time_client") + result.column("time_server"))
print(json.dumps(charged.tolist()))
print(json.dumps(compiled))
"""


def test_a_runs_simulated_time_does_not_depend_on_a_warm_cache(tmp_path):
    """A new process with an empty Numba cache compiles HyFDCA's kernels in its first
    rounds (charged 1.9 s on breast cancer 3x3 before; a round's work is milliseconds,
    and a warm cache's loading 0.65 s). It is not charged: the first rounds cost what
    the later ones do."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    charged, compiled = map(json.loads, out.stdout.strip().splitlines()[-2:])
    charged = np.array(charged)
    assert {"solve", "holder_rows"} <= set(compiled)  # the cache was empty
    assert charged[:5].sum() < 0.5, charged  # compiling took seconds
    assert charged[:5].sum() < charged[5:].sum() + 0.3, charged

    # The next process loads every kernel from the cache (each used to be compiled again
    # in every process, 3-4 s: closures and a function argument gave new cache keys).
    again = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True,
                           text=True, timeout=300, check=True)
    assert json.loads(again.stdout.strip().splitlines()[-1]) == []
