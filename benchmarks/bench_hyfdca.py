"""Performance benchmark of HyFDCA on the stacked-block simulation engine.

For each case (a real dataset in the paper's setting, and HyFDCA's
hyperparameters: the safe step rule with the paper's tuned IIC or one local
step, or the default cocoa rule) it measures

* the wall time of ``HyFDCA.round`` alone per outer iteration (median, p10,
  p90) over ``--rounds`` rounds after ``--warmup`` rounds (fewer for the
  slow cases that cap them), with participation and the algorithm's draws
  taken from ``random_streams(seed)`` exactly as
  :func:`hyfl.runtime.simulation.simulate` does, beside its process CPU time
  (on a busy machine wall > CPU) and the time per local draw;
* the time of one evaluation (``evaluate``: primal, dual, gap), separately;
* the time per round of the slow per-client reference implementation
  (``tests/reference_hyfdca.py``) on the same problem, partition and
  participation, and the speed-up of the engine over it;
* Python's ``tracemalloc`` peak during ``stack`` + ``setup`` + all rounds (a
  separate pass, so tracing does not slow the timed pass) against the size
  of the training matrix (and, for the cocoa rule, the share of its ring of
  remembered inner products, ``SpanHistory.z``), and the process's max RSS;
* the set-up time of ``stack`` (and of ``setup``).

Every case runs in fresh subprocesses (one for the engine, one for the
reference) so that max RSS and memory figures do not leak between cases.

Usage::

    python benchmarks/bench_hyfdca.py                      # every case
    python benchmarks/bench_hyfdca.py --cases covtype,covtype-half --no-reference
    python benchmarks/bench_hyfdca.py --markdown results.md
    python benchmarks/bench_hyfdca.py --quick              # smoke run, seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from machine import cpu_model, git

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    """One benchmark setting (the paper's setting it stands for in ``paper``).

    ``algorithm`` holds the ``HyFDCA`` keyword arguments. ``max_rounds`` and
    ``max_warmup`` cap ``--rounds`` and ``--warmup`` for cases whose rounds
    take seconds; ``reference`` says whether the slow per-client reference
    runs (it would need minutes per round on full Covtype).
    """

    name: str
    dataset: str
    lam: float
    partition: str
    participation: float
    algorithm: dict[str, Any]
    target_ms: float = math.nan  # NaN: no target
    paper: str = ""
    paper_seconds: float = math.nan
    reference: bool = True
    max_rounds: int | None = None
    max_warmup: int | None = None

    def rounds(self, args) -> tuple[int, int]:
        """(warm-up, timed) rounds of this case under the command line's ``args``."""
        warmup = args.warmup if self.max_warmup is None else min(args.warmup, self.max_warmup)
        rounds = args.rounds if self.max_rounds is None else min(args.rounds, self.max_rounds)
        return warmup, rounds


SAFE = {"step_rule": "safe"}  # the per-sample rule of the first measurements (then the default)

CASES = {
    "ijcnn1": Case(
        name="ijcnn1",
        dataset="ijcnn1",
        lam=5e-5,
        partition="grid:12x12",
        participation=0.9,
        algorithm={**SAFE, "iic": 7.434e-4},
        target_ms=5.0,
        paper="Covtype (12,12,0.9), T8",
        paper_seconds=0.5341,
    ),
    "mnist": Case(
        name="mnist",
        dataset="mnist",
        lam=1e-3,
        partition="quadrant:5000",
        participation=0.9,
        algorithm={**SAFE, "iic": 0.02195},
        target_ms=50.0,
        paper="MNIST (5000,0.9), T6",
        paper_seconds=13.62,
    ),
    "reuters": Case(
        name="reuters",
        dataset="reuters",
        lam=1e-5,
        partition="grid:12x12",
        participation=0.9,
        algorithm={**SAFE, "iic": 0.07564},
        target_ms=5.0,
        paper="News20 (12,12,0.9), T7",
        paper_seconds=0.4683,
    ),
    # Full Covtype (581,012 x 54, 7.0 million stacked rows): a round must cost the rows it
    # touches (about 130 draws), not the size of the data.
    "covtype": Case(
        name="covtype",
        dataset="covtype",
        lam=5e-5,
        partition="grid:12x12",
        participation=0.9,
        algorithm={**SAFE, "local_steps": 1},
        target_ms=4.0,
        paper="Covtype (12,12,0.9), T8",
        paper_seconds=0.5341,
        reference=False,
    ),
    "covtype-half": Case(
        name="covtype-half",
        dataset="covtype",
        lam=5e-5,
        partition="grid:12x12",
        participation=0.5,
        algorithm={**SAFE, "local_steps": 1},
        target_ms=4.0,
        reference=False,
    ),
    # The default cocoa rule: SecureInnerProduct for every sample of every active client
    # (its model remembers them), so a round costs the active clients' blocks.
    "ijcnn1-cocoa": Case(
        name="ijcnn1-cocoa",
        dataset="ijcnn1",
        lam=5e-5,
        partition="grid:12x12",
        participation=0.9,
        algorithm={"iic": 7.434e-4},
        max_rounds=100,
        max_warmup=10,
    ),
    "covtype-cocoa1": Case(
        name="covtype-cocoa1",
        dataset="covtype",
        lam=5e-5,
        partition="grid:12x12",
        participation=0.9,
        algorithm={"local_steps": 1},
        reference=False,
        max_rounds=10,
        max_warmup=2,
    ),
    "covtype-cocoa": Case(  # HyFDCA(): one pass over each active client's samples
        name="covtype-cocoa",
        dataset="covtype",
        lam=5e-5,
        partition="grid:12x12",
        participation=0.9,
        algorithm={},
        reference=False,
        max_rounds=4,
        max_warmup=1,
    ),
}

PEAK_TARGET = 3.0  # tracemalloc peak <= 3x the training matrix
SPEEDUP_TARGET = 10.0


# --------------------------------------------------------------------------- helpers


def _max_rss_mb() -> float:
    # Linux reports kilobytes, macOS bytes.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0


def _build(case: Case, seed: int):
    """Problem, partition, participation schedule and algorithm of a case."""
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.data import load_dataset
    from hyfl.participation import RandomFraction
    from hyfl.partition import parse_partition
    from hyfl.problem import make_problem

    data = load_dataset(case.dataset)
    problem = make_problem(data, "hinge", case.lam)
    partition = parse_partition(case.partition, problem.X, seed=seed, meta=data.meta)
    participation = RandomFraction(partition.n_clients, case.participation)
    return problem, partition, participation, HyFDCA(**case.algorithm)


def _run_rounds(
    alg, state, participation, rounds, part_rng, alg_rng, start=1, times=None, cpu_times=None,
    draws=None,
):
    """Run rounds ``start .. start + rounds - 1`` as ``simulate`` does.

    ``times`` collects the wall time of each ``alg.round``; ``cpu_times`` its
    process CPU time (a contention check: on a busy machine wall > CPU);
    ``draws`` its number of local draws (samples drawn by the active clients).
    """
    for t in range(start, start + rounds):
        active = participation.active(t, part_rng)
        if draws is not None:
            draws.append(int(state.counts[active].sum()))
        cpu = time.process_time()
        tic = time.perf_counter()
        state = alg.round(state, active, alg_rng)
        toc = time.perf_counter()
        if times is not None:
            times.append(toc - tic)
        if cpu_times is not None:
            cpu_times.append(time.process_time() - cpu)
    return state


# --------------------------------------------------------------------------- workers


def engine_worker(case: Case, args) -> dict:
    """Time the engine, then measure its memory in a second, traced pass."""
    from hyfl.partition import stack
    from hyfl.runtime.simulation import evaluate, random_streams

    problem, partition, participation, alg = _build(case, args.seed)
    X = problem.X
    data_bytes = int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)
    warmup, rounds = case.rounds(args)

    # Timed pass.
    tic = time.perf_counter()
    blocks = stack(partition, X)
    stack_s = time.perf_counter() - tic
    tic = time.perf_counter()
    state = alg.setup(problem, blocks)
    setup_s = time.perf_counter() - tic
    part_rng, alg_rng = random_streams(args.seed)
    times: list[float] = []  # warm-up rounds are timed too, but not in the statistics
    cpu_times: list[float] = []
    draws: list[int] = []
    total = warmup + rounds
    state = _run_rounds(
        alg, state, participation, total, part_rng, alg_rng, 1, times, cpu_times, draws
    )
    all_ms = np.array(times) * 1e3
    ms = all_ms[warmup:]
    cpu_ms = np.array(cpu_times[warmup:]) * 1e3
    mean_draws = float(np.mean(draws[warmup:]))
    local = getattr(state, "local", None)  # the cocoa rule's ring of inner products
    ring_bytes = int(local.history.z.nbytes) if local is not None else 0
    eval_times = []
    for _ in range(5):
        tic = time.perf_counter()
        metrics = evaluate(problem, alg.weights(state), alg.duals(state), None, None)
        eval_times.append(time.perf_counter() - tic)
    n_clients = blocks.n_clients
    H = alg.steps_per_client(problem.n_samples, n_clients)  # None: every local sample
    accepted = state.stats.get("accepted", math.nan)
    del blocks, state
    gc.collect()

    # Traced pass: stack + setup + warm-up and timed rounds, same seed. The peak
    # is reset between phases to see which one sets it; the overall peak is the
    # largest (each phase's peak includes what the earlier phases retained).
    phase_peaks = {}
    tracemalloc.start()
    tracemalloc.reset_peak()
    blocks = stack(partition, X)
    phase_peaks["stack"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    state = alg.setup(problem, blocks)
    phase_peaks["setup"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    part_rng, alg_rng = random_streams(args.seed)
    state = _run_rounds(alg, state, participation, total, part_rng, alg_rng)
    retained, phase_peaks["rounds"] = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak = max(phase_peaks.values())

    profile = None
    if args.profile:
        profile = _profile_rounds(problem, partition, participation, alg, warmup, rounds, args)

    return {
        "case": case.name,
        "n_samples": int(problem.n_samples),
        "n_features": int(problem.n_features),
        "n_outputs": int(problem.n_outputs),
        "nnz": int(X.nnz),
        "clients": int(n_clients),
        "H": None if H is None else int(H),
        "rounds": int(rounds),
        "warmup": int(warmup),
        "draws_per_round": mean_draws,
        "median_ms": float(np.median(ms)),
        "p10_ms": float(np.percentile(ms, 10)),
        "p90_ms": float(np.percentile(ms, 90)),
        "mean_ms": float(np.mean(ms)),
        "cpu_median_ms": float(np.median(cpu_ms)),
        "us_per_draw": float(np.median(ms)) * 1e3 / mean_draws,
        "cpu_us_per_draw": float(np.median(cpu_ms)) * 1e3 / mean_draws,
        # Engine over rounds 1..reference_rounds, the rounds the reference is timed on.
        "same_rounds_median_ms": float(np.median(all_ms[: args.reference_rounds])),
        "eval_ms": float(np.median(eval_times) * 1e3),
        "stack_s": stack_s,
        "setup_s": setup_s,
        "data_bytes": data_bytes,
        "peak_bytes": int(peak),
        "peak_ratio": peak / data_bytes,
        "phase_peak_bytes": {k: int(v) for k, v in phase_peaks.items()},
        "retained_bytes": int(retained),
        "retained_ratio": retained / data_bytes,
        "ring_bytes": ring_bytes,
        "ring_ratio": ring_bytes / data_bytes,
        "max_rss_mb": _max_rss_mb(),
        "final_gap": float(metrics["gap"]),
        "last_accepted": float(accepted),
        "profile": profile,
    }


def _profile_rounds(problem, partition, participation, alg, warmup, rounds, args) -> str:
    """cProfile of the timed rounds (after warm-up); top functions by cumulative time."""
    import cProfile
    import io
    import pstats

    from hyfl.partition import stack
    from hyfl.runtime.simulation import random_streams

    state = alg.setup(problem, stack(partition, problem.X))
    part_rng, alg_rng = random_streams(args.seed)
    state = _run_rounds(alg, state, participation, warmup, part_rng, alg_rng)
    profiler = cProfile.Profile()
    profiler.enable()
    _run_rounds(alg, state, participation, rounds, part_rng, alg_rng, warmup + 1)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.profile)
    return out.getvalue()


def reference_worker(case: Case, args) -> dict:
    """Time rounds of the slow per-client reference (set-up not timed)."""
    from hyfl.runtime.simulation import random_streams

    sys.path.insert(0, str(REPO / "tests"))
    from reference_hyfdca import ReferenceHyFDCA

    problem, partition, participation, alg = _build(case, args.seed)
    tic = time.perf_counter()
    ref = ReferenceHyFDCA(problem, partition, alg)
    setup_s = time.perf_counter() - tic
    part_rng, alg_rng = random_streams(args.seed)
    times: list[float] = []
    cpu_times: list[float] = []
    budget = args.reference_budget
    for t in range(1, args.reference_rounds + 1):
        active = participation.active(t, part_rng)
        cpu = time.process_time()
        tic = time.perf_counter()
        ref.round(active, alg_rng)
        times.append(time.perf_counter() - tic)
        cpu_times.append(time.process_time() - cpu)
        # Stop early if the next round would overrun the time budget.
        if sum(times) + float(np.median(times)) > budget and t < args.reference_rounds:
            break
    return {
        "case": case.name,
        "ref_rounds": len(times),
        "ref_rounds_requested": int(args.reference_rounds),
        "ref_median_ms": float(np.median(times) * 1e3),
        "ref_cpu_median_ms": float(np.median(cpu_times) * 1e3),
        "ref_setup_s": setup_s,
        "ref_max_rss_mb": _max_rss_mb(),
    }


def _spawn(kind: str, case: str, args) -> dict:
    """Run one worker in a fresh interpreter; it prints one JSON line last."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        kind,
        "--cases",
        case,
        "--rounds",
        str(args.rounds),
        "--warmup",
        str(args.warmup),
        "--reference-rounds",
        str(args.reference_rounds),
        "--seed",
        str(args.seed),
        "--reference-budget",
        str(args.reference_budget),
        "--profile",
        str(args.profile),
    ]
    if args.quick:
        command.append("--quick")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"{kind} worker for {case} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- reporting


def _fmt_ms(v: float) -> str:
    return f"{v:.3g}" if v < 100 else f"{v:,.0f}"


def _rule(case: Case) -> str:
    """The step rule and the draws of a case, e.g. ``safe, IIC 0.07564`` or ``cocoa, H=1``."""
    params = case.algorithm
    rule = params.get("step_rule", "cocoa")
    if "local_steps" in params:
        return f"{rule}, H={params['local_steps']}"
    if "iic" in params:
        return f"{rule}, IIC {params['iic']:g}"
    return f"{rule} (default)"


def table_rows(results: list[dict]) -> tuple[list[str], list[list[str]]]:
    header = [
        "case",
        "step rule",
        "clients",
        "H",
        "rounds (warm-up)",
        "median ms/round (CPU)",
        "p10-p90 ms",
        "us/draw (CPU)",
        "target ms",
        "paper per-iteration",
        "reference ms/round",
        "speed-up",
        "eval ms",
        "stack s",
        "peak traced / data",
        "max RSS MB",
    ]
    rows = []
    for r in results:
        case = CASES[r["case"]]
        ref = (
            f"{_fmt_ms(r['ref_median_ms'])} ({r['ref_rounds']} rounds)"
            if "ref_median_ms" in r
            else "-"
        )
        speedup = f"{r['ref_median_ms'] / r['median_ms']:,.0f}x" if "ref_median_ms" in r else "-"
        target = "-"
        if not math.isnan(case.target_ms):
            met = "met" if r["median_ms"] <= case.target_ms else "MISSED"
            target = f"<= {case.target_ms:g} ({met})"
        paper = f"{case.paper_seconds:g} s ({case.paper})" if case.paper else "-"
        memory = (
            f"{r['peak_ratio']:.2f}x ({'met' if r['peak_ratio'] <= PEAK_TARGET else 'MISSED'}; "
            f"{r['peak_bytes'] / 2**20:.1f} / {r['data_bytes'] / 2**20:.1f} MiB; "
            f"retained {r['retained_ratio']:.2f}x"
        )
        if r.get("ring_bytes"):
            memory += f"; inner-product ring {r['ring_ratio']:.2f}x"
        rows.append(
            [
                f"{case.name} ({r['n_samples']:,} x {r['n_features']:,}"
                + (f", {r['n_outputs']} classes" if r["n_outputs"] > 1 else "")
                + f"), {case.partition}, p={case.participation:g}",
                _rule(case),
                f"{r['clients']:,}",
                "all" if r["H"] is None else str(r["H"]),
                f"{r['rounds']} ({r['warmup']})",
                f"{_fmt_ms(r['median_ms'])} ({_fmt_ms(r['cpu_median_ms'])})",
                f"{_fmt_ms(r['p10_ms'])}-{_fmt_ms(r['p90_ms'])}",
                f"{r['us_per_draw']:,.1f} ({r['cpu_us_per_draw']:,.1f})",
                target,
                paper,
                ref,
                speedup,
                _fmt_ms(r["eval_ms"]),
                f"{r['stack_s']:.3f}",
                memory + ")",
                f"{r['max_rss_mb']:.0f}",
            ]
        )
    return header, rows


def markdown_table(results: list[dict]) -> str:
    header, rows = table_rows(results)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def print_table(results: list[dict]) -> None:
    header, rows = table_rows(results)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain fallback
        print(" | ".join(header))
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(title="HyFDCA simulation engine: time per outer iteration")
    for name in header:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(width=max(160, shutil.get_terminal_size().columns)).print(table)


def _loads(values) -> str:
    return "/".join(f"{v:.2f}" for v in values)


def environment() -> dict:
    import numpy
    import scipy

    cpu = cpu_model()
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = int(line.split()[1]) / 2**20
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": ram,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "load_average": os.getloadavg(),
        "commit": git("rev-parse", "--short", "HEAD"),
        # Uncommitted changes to the measured code, if any.
        "dirty": git(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            "src",
            "tests/reference_hyfdca.py",
        ),
    }


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default=None, help=f"comma-separated, from {','.join(CASES)} (default: all)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (>= 200)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds first")
    parser.add_argument("--reference-rounds", type=int, default=None)
    parser.add_argument(
        "--reference-budget",
        type=float,
        default=120.0,
        help="seconds of reference rounds per case before stopping early",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", default=None, help="write the results table here")
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument("--no-reference", action="store_true", help="skip the slow reference")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        help="cProfile the timed rounds and print this many top functions (cumulative)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (few rounds)")
    parser.add_argument("--worker", choices=("engine", "reference"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = {"cases": "ijcnn1", "rounds": 10, "warmup": 2, "reference_rounds": 1}
    full = {"cases": ",".join(CASES), "rounds": 300, "warmup": 30, "reference_rounds": 20}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not args.quick and args.rounds < 200:
        parser.error("--rounds must be >= 200 (use --quick for a smoke run)")
    if args.rounds < 1 or args.warmup < 0 or args.reference_rounds < 1:
        parser.error("--rounds and --reference-rounds must be >= 1, --warmup >= 0")
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown or not names:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    args.case_names = names
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.worker:
        case = CASES[args.case_names[0]]
        worker = engine_worker if args.worker == "engine" else reference_worker
        print(json.dumps(worker(case, args)))
        return []

    results = []
    load_before = os.getloadavg()
    for name in args.case_names:
        warmup, rounds = CASES[name].rounds(args)
        print(f"[{name}] engine: {warmup} warm-up + {rounds} timed rounds", flush=True)
        result = _spawn("engine", name, args)
        if result.get("profile"):
            print(result["profile"])
        if not args.no_reference and CASES[name].reference:
            print(f"[{name}] reference: {args.reference_rounds} rounds ...", flush=True)
            result.update(_spawn("reference", name, args))
            if result["ref_rounds"] < result["ref_rounds_requested"]:
                print(
                    f"[{name}] reference stopped after {result['ref_rounds']} rounds "
                    f"(time budget {args.reference_budget:g} s)"
                )
        results.append(result)
        env = _write_outputs(args, results, load_before)  # after every case

    print_table(results)
    print(
        f"{env['cpu']}, {env['cores']} cores, Python {env['python']}, "
        f"NumPy {env['numpy']}, SciPy {env['scipy']}; load average (1/5/15 min) "
        f"before {_loads(load_before)}, after {_loads(env['load_average'])}; "
        f"hyfl at {env['commit']}" + (" with uncommitted changes" if env["dirty"] else "")
    )
    return results


def _write_outputs(args, results: list[dict], load_before) -> dict:
    env = environment()
    env["load_average_before"] = load_before
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(results))
    if args.json:
        payload = {"environment": env, "argv": sys.argv, "results": results}
        Path(args.json).write_text(json.dumps(payload, indent=2))
    return env


if __name__ == "__main__":
    main()
