"""HyFDCA's default rule on a generated dense table of many rows: memory, time a round, rounds.

Issue 45's scale case: ``--rows 10000000`` x 30 dense features, ``grid:12x12``, p = 0.5,
the defaults (hinge, lam 1e-4, no intercept). The table is generated in place (standard
normal features, labels from a random linear model with 10% of them flipped), stored as
the CSR matrix hyfl keeps every data set in (12 bytes an entry). Reported: the data's
bytes, the process's peak resident memory during training above what it held before
(Linux's ``VmHWM``, reset just before the run, so liblinear's reference solve and the
table itself are not counted), CPU
and wall a round, the round at which the relative loss to liblinear's ``P*`` settles
below ``--level``, and liblinear's own CPU at its defaults::

    HYFL_THREADS=1 python benchmarks/bench_scale.py --rows 2000000 --out scale.json

Peak memory is resident pages (every allocator: NumPy, Numba, BLAS), not tracemalloc's
Python-visible peak that ``bench_hyfdca.py`` reports.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def generated_table(rows: int, features: int, seed: int):
    """A dense ``rows x features`` binary task as hyfl's Dataset (CSR, built without a copy)."""
    from hyfl.data.dataset import Dataset

    rng = np.random.default_rng(seed)
    data = np.empty(rows * features)
    truth = rng.standard_normal(features)
    y = np.empty(rows)
    block = 1_000_000
    for start in range(0, rows, block):  # in blocks: no second full-size temporary
        stop = min(rows, start + block)
        part = rng.standard_normal((stop - start, features))
        data[start * features:stop * features] = part.ravel()
        y[start:stop] = np.where(part @ truth >= 0, 1.0, -1.0)
    flip = rng.random(rows) < 0.1
    y[flip] = -y[flip]
    index = np.int32 if rows * features < 2**31 else np.int64
    indptr = np.arange(0, rows * features + 1, features, dtype=index)
    indices = np.tile(np.arange(features, dtype=np.int32), rows)
    X = sp.csr_matrix((data, indices, indptr), shape=(rows, features))
    return Dataset(X=X, y=y, name=f"generated {rows:,} x {features}", task="binary")


def _status_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since :func:`_reset_peak`) of this process, MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_peak() -> None:
    """Start ``VmHWM`` afresh (Linux: liblinear's own peak before the run is not ours)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=30)
    parser.add_argument("--partition", default="grid:12x12")
    parser.add_argument("--participation", type=float, default=0.5)
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--rounds", type=int, default=150, help="most rounds")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--level", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the figures here (JSON)")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_convergence import TimedAlgorithm, liblinear_at_its_defaults
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.participation import RandomFraction
    from hyfl.partition import parse_partition
    from hyfl.problem import make_problem, solve_centralized
    from hyfl.runtime.simulation import settled_round_below, simulate

    tic = time.perf_counter()
    data = generated_table(args.rows, args.features, args.seed)
    problem = make_problem(data, "hinge", args.lam)
    X = problem.X
    data_mb = (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 2**20
    print(f"generated {args.rows:,} x {args.features} ({data_mb:,.0f} MiB as CSR) in "
          f"{time.perf_counter() - tic:.1f} s", flush=True)
    default_cpu, default_loss = liblinear_at_its_defaults(problem)
    optimum = solve_centralized(problem, cache=False)
    print(f"P* = {optimum.primal:.10g} ({optimum.method}); liblinear at its defaults "
          f"{default_cpu:.2f} s CPU", flush=True)
    partition = parse_partition(args.partition, X, seed=args.seed)
    _reset_peak()
    before_mb = _status_mb("VmRSS")
    algorithm = TimedAlgorithm(HyFDCA().validated())
    started = time.perf_counter()

    def progress(row: dict) -> None:
        print(f"round {int(row['iteration'])}: relative loss {row['relative_loss']:.3g}, "
              f"{time.perf_counter() - started:.0f} s, peak RSS {_status_mb('VmHWM'):,.0f} MB",
              flush=True)

    result = simulate(algorithm, problem, partition,
                      RandomFraction(partition.n_clients, args.participation), args.rounds,
                      seed=args.seed, eval_every=args.eval_every, optimum=optimum,
                      on_evaluate=progress)
    settled = settled_round_below(result.column("iteration"), result.column("relative_loss"),
                                  args.level)
    figures = {
        "rows": args.rows, "features": args.features, "partition": args.partition,
        "participation": args.participation, "lam": args.lam,
        "data_mib": data_mb,
        "rss_before_run_mb": before_mb,
        "rss_peak_mb": _status_mb("VmHWM"),
        "run_peak_over_data": (_status_mb("VmHWM") - before_mb) / data_mb,
        "setup_cpu_s": algorithm.setup_cpu,
        "round_cpu_s_median": float(np.median(algorithm.round_cpu)),
        "round_wall_s_median": float(np.median(algorithm.round_wall)),
        "rounds_done": len(algorithm.round_cpu),
        f"settled_round_{args.level:g}": settled,
        "final_relative_loss": float(result.column("relative_loss")[-1]),
        "liblinear_default_cpu_s": default_cpu,
        "liblinear_default_relative_loss": (default_loss - optimum.primal) / abs(optimum.primal),
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
