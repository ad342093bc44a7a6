"""The cocoa rule with and without its certificate (``HyFDCA(certify=...)``), side by side.

For each case (dataset, grid, participation, lambda, rounds) it runs ``simulate``
twice -- ``certify=False`` then the default ``certify=True`` -- with seed 0 and an
evaluation every 5 rounds, and prints the rounds at which the reported relative loss
settles at 1e-2 / 1e-3 / 1e-4 (every later evaluation at or below), the final
relative loss, the zero model's, how often the reported dual fell between
evaluations, and the CPU seconds of the run. These are the figures of
docs/convergence.md section 6 ("The certificate").

    python benchmarks/bench_certificate.py            # the three documented cases
    python benchmarks/bench_certificate.py --quick    # breast cancer only, seconds
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# (dataset, grid KxQ, participation, lambda, rounds)
CASES = [
    ("ijcnn1", "3x3", 0.5, 5e-5, 250),
    ("ijcnn1", "3x3", 0.1, 5e-5, 600),
    ("breast_cancer", "3x3", 0.5, 1e-3, 500),
]


def run_case(data: str, grid_spec: str, fraction: float, lam: float, rounds: int,
             certify: bool) -> dict:
    from hyfl import HyFDCA, load_data, make_problem, simulate, solve_centralized
    from hyfl.participation import RandomFraction
    from hyfl.partition import grid
    from hyfl.runtime.simulation import settled_round_below

    problem = make_problem(load_data(data), "hinge", lam)
    optimum = solve_centralized(problem)
    K, Q = (int(v) for v in grid_spec.split("x"))
    tic = time.process_time()
    result = simulate(HyFDCA(certify=certify), problem,
                      grid(problem.n_samples, problem.n_features, K, Q),
                      RandomFraction(K * Q, fraction), rounds, seed=0, eval_every=5,
                      optimum=optimum)
    cpu = time.process_time() - tic
    relative, dual = result.column("relative_loss"), result.column("dual")
    rounds_of = result.column("iteration")
    return {
        "settle": [settled_round_below(rounds_of, relative, level)
                   for level in (1e-2, 1e-3, 1e-4)],
        "final": float(relative[-1]),
        "zero": float(relative[0]),
        "dual_falls": int(np.sum(np.diff(dual) < -1e-12 * (1 + np.abs(dual[:-1])))),
        "cpu": cpu,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="breast cancer only")
    args = parser.parse_args(argv)
    cases = CASES[2:] if args.quick else CASES
    print("| case | certify | settled at 1e-2 / 1e-3 / 1e-4 | final (zero model) "
          "| dual falls | CPU s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for data, grid_spec, fraction, lam, rounds in cases:
        for certify in (False, True):
            out = run_case(data, grid_spec, fraction, lam, rounds, certify)
            settle = " / ".join("-" if r is None else str(int(r)) for r in out["settle"])
            print(f"| {data} {grid_spec} p={fraction} lam={lam:g}, {rounds} rounds | {certify} "
                  f"| {settle} | {out['final']:.3g} ({out['zero']:.3g}) | {out['dual_falls']} "
                  f"| {out['cpu']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
