"""CPU per round of ``simulate`` for two source trees, interleaved (A B A B).

The setting of issue 27 by default: ijcnn1, hinge, lam 5e-5, ``grid:12x12``,
participation 0.5, HyFDCA's defaults (the cocoa rule). Each run is a fresh
process that imports hyfl from its tree's ``src``, runs ``--warmup`` rounds
(Numba compiles, caches fill), then times ``--rounds`` rounds of ``simulate``
(one evaluation, at the end) with ``time.process_time`` beside the wall time.
The trees alternate, so a drifting load hits both alike; the final objective
of each run is printed so a change that alters the iterates shows.

Usage (a tree per revision, e.g. with ``git worktree add /tmp/before REV``)::

    python benchmarks/bench_round_ab.py /tmp/before .
    python benchmarks/bench_round_ab.py /tmp/before . --data covtype --partition grid:12x12 \\
        --participation 0.9 --rounds 5 --repeats 2
    # one tree on one thread against two (hyfl --threads, $HYFL_THREADS):
    python benchmarks/bench_round_ab.py . . --threads-a 1 --threads-b 2 --data covtype \\
        --participation 0.9 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

RUN = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.data import load_data
from hyfl.partition import parse_partition
from hyfl.participation import RandomFraction
from hyfl.problem import make_problem
from hyfl.runtime.simulation import simulate
data, spec, p, lam, warmup, rounds = sys.argv[2:8]
dataset = load_data(data)
problem = make_problem(dataset, "hinge", float(lam))
partition = parse_partition(spec, problem.X, seed=0, meta=dataset.meta)  # (quadrant:K needs it)
K = partition.n_clients
simulate(HyFDCA(), problem, partition, RandomFraction(K, float(p)), int(warmup), seed=0,
         progress=False)
cpu, wall = time.process_time(), time.perf_counter()
result = simulate(HyFDCA(), problem, partition, RandomFraction(K, float(p)), int(rounds), seed=0,
                  progress=False, eval_every=int(rounds))
n = int(rounds)
print((time.process_time() - cpu) / n, (time.perf_counter() - wall) / n,
      repr(float(result.column("primal")[-1])))
"""


def _ms(seconds: float) -> str:
    """Milliseconds to three significant digits (a demo round is a few ms)."""
    return f"{seconds * 1e3:.3g}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="source tree A (holds src/hyfl)")
    parser.add_argument("after", type=Path, help="source tree B")
    parser.add_argument("--data", default="ijcnn1")
    parser.add_argument("--partition", default="grid:12x12")
    parser.add_argument("--participation", type=float, default=0.5)
    parser.add_argument("--lam", type=float, default=5e-5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads-a", type=int, default=None,
                        help="$HYFL_THREADS of tree A's runs (default: unset, every core)")
    parser.add_argument("--threads-b", type=int, default=None, help="the same for tree B")
    args = parser.parse_args(argv)
    threads = {"A": args.threads_a, "B": args.threads_b}
    trees = {"A": args.before.resolve() / "src", "B": args.after.resolve() / "src"}
    for name, src in trees.items():
        if not (src / "hyfl").is_dir():
            parser.error(f"tree {name}: {src / 'hyfl'} does not exist")
    times: dict[str, list[tuple[float, float, str]]] = {"A": [], "B": []}
    for _ in range(args.repeats):
        for name, src in trees.items():  # interleaved: A B A B ...
            out = subprocess.run(
                [sys.executable, "-c", RUN, str(src), args.data, args.partition,
                 str(args.participation), str(args.lam), str(args.warmup), str(args.rounds)],
                capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": str(src),
                     **({"HYFL_THREADS": str(threads[name])} if threads[name] else {})})
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            cpu, wall, primal = out.stdout.split()[-3:]
            times[name].append((float(cpu), float(wall), primal))
            print(f"{name} cpu {_ms(float(cpu))} ms/round, wall {_ms(float(wall))} ms,"
                  f" primal {primal}", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{datetime.date.today()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load {load:.1f} at the end; {args.data} {args.partition} "
          f"p={args.participation} lam={args.lam}, {args.rounds} rounds after {args.warmup}\n")
    print("| tree | CPU ms/round (each run) | median CPU | median wall | final primal |")
    print("|---|---|---|---|---|")
    for name, runs in times.items():
        cpus = [c for c, _, _ in runs]
        label = trees[name].parent.name + (f", {threads[name]} threads" if threads[name] else "")
        print(f"| {name} ({label}) | "
              f"{', '.join(_ms(c) for c in cpus)} | "
              f"{_ms(statistics.median(cpus))} | "
              f"{_ms(statistics.median(w for _, w, _ in runs))} | {runs[-1][2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
