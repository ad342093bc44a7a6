"""Per-iteration time of every registered algorithm in the Core issue's three settings.

Settings (participation 0.9, hinge loss, the paper's lambdas): ijcnn1 on a
12x12 grid (the paper's Covtype (12,12,0.9)), MNIST train with 5,000 clients
by the quadrant split, and reuters on a 12x12 grid (the paper's News20
(12,12,0.9)). Hyperparameters are the paper's tuned values for those settings
(Tables 2-4). Algorithms that do not apply to a hybrid grid (FedBCD needs a
vertical split, FedHybrid a horizontal one and a smooth loss) are listed with
the reason they refuse.

    python benchmarks/bench_algorithms.py [--rounds 200] [--warmup 20] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from hyfl.algorithms import ALGORITHMS, make_algorithm
from hyfl.data import load_dataset
from hyfl.errors import HyflError
from hyfl.participation import RandomFraction
from hyfl.partition import parse_partition, stack
from hyfl.problem import make_problem
from hyfl.runtime.simulation import random_streams

CASES = {
    "ijcnn1 grid:12x12": dict(
        data="ijcnn1",
        lam=5e-5,
        partition="grid:12x12",
        hyper={
            "hyfdca": {"iic": 7.434e-4},
            "fedavg": {"iic": 0.2494, "a": 11.93, "b": 0.05131},
            "hyfem": {"iic": 0.05226, "a": 2.41, "b": 0.0142, "mu": 0.06684},
            "hyfem-avg": {"iic": 0.05226, "a": 2.41, "b": 0.0142},
        },
    ),
    "mnist quadrant:5000": dict(
        data="mnist",
        lam=1e-3,
        partition="quadrant:5000",
        hyper={
            "hyfdca": {"iic": 0.02195},
            "fedavg": {"iic": 1.618, "a": 0.003995, "b": 0.8498},
            "hyfem": {"iic": 0.05594, "a": 0.0004672, "b": 0.05344, "mu": 2.797},
            "hyfem-avg": {"iic": 0.05594, "a": 0.0004672, "b": 0.05344},
        },
    ),
    "reuters grid:12x12": dict(
        data="reuters",
        lam=1e-5,
        partition="grid:12x12",
        hyper={
            "hyfdca": {"iic": 0.07564},
            "fedavg": {"iic": 4.542, "a": 3.792, "b": 0.1815},
            "hyfem": {"iic": 4.542, "a": 3.792, "b": 0.1815, "mu": 1.0},
            "hyfem-avg": {"iic": 4.542, "a": 3.792, "b": 0.1815},
        },
    ),
}


def time_rounds(algorithm, problem, blocks, n_clients, rounds, warmup, seed=0):
    state = algorithm.setup(problem, blocks)
    participation = RandomFraction(n_clients, 0.9)
    participation_rng, algorithm_rng = random_streams(seed)
    times = []
    for t in range(1, warmup + rounds + 1):
        active = participation.active(t, participation_rng)
        start = time.perf_counter()
        state = algorithm.round(state, active, algorithm_rng)
        if t > warmup:
            times.append(time.perf_counter() - start)
    return np.array(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()

    lines = [
        "| setting | algorithm | H | median ms / round | p10-p90 ms |",
        "|---|---|---|---|---|",
    ]
    refusals = []
    for case, spec in CASES.items():
        data = load_dataset(spec["data"])
        problem = make_problem(data, "hinge", spec["lam"])
        partition = parse_partition(spec["partition"], problem.X, seed=0, meta=data.meta)
        blocks = stack(partition, problem.X)
        for name in ALGORITHMS:
            hyper = spec["hyper"].get(name, {})
            algorithm = make_algorithm(name, hyper)
            try:
                times = 1e3 * time_rounds(
                    algorithm, problem, blocks, partition.n_clients, args.rounds, args.warmup
                )
            except HyflError as err:
                refusals.append(f"- {case}, `{name}`: {err}")
                continue
            steps = getattr(algorithm, "steps_per_client", None)
            H = steps(problem.n_samples, partition.n_clients) if steps else "-"
            row = (
                f"| {case} | {name} | {H} | {np.median(times):.2f} | "
                f"{np.percentile(times, 10):.2f}-{np.percentile(times, 90):.2f} |"
            )
            print(row, flush=True)
            lines.append(row)
    text = "\n".join(lines) + "\n\nNot applicable (the algorithm refuses, as it should):\n\n"
    text += "\n".join(refusals) + "\n"
    text += f"\n{args.rounds} timed rounds after {args.warmup} warm-up rounds; "
    text += f"Python {platform.python_version()}, NumPy {np.__version__}.\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
