"""The neural issue's targets: the two MNIST commands, their accuracy and their time.

Runs, each in its own process, with the algorithms' defaults::

    hyfl run --algorithm hyfem-nn --data mnist --partition quadrant:8 \\
        --participation 0.5 --iterations 20
    hyfl run --algorithm fedbcd-nn --data mnist --partition vertical:2 \\
        --participation full --iterations 20

and prints, per command, the final and best accuracy on MNIST's test set, the
first iteration at 0.95, the wall time and the CPU time of the whole process
(``getrusage`` of the child: data loading, compilation and every evaluation
included). The target is >= 0.95 within 15 minutes on 2 cores. ``--repeats``
alternates the commands (A B A B), so load drifting on a shared machine hits
both alike. Needs the neural extra and MNIST in ``shared/data`` (or ``--data-dir``).

Usage::

    python benchmarks/bench_neural.py                 # ~1 min on 2 cores
    python benchmarks/bench_neural.py --repeats 2 --markdown out.md
"""

from __future__ import annotations

import argparse
import csv
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "hyfem-nn": ["--partition", "quadrant:8", "--participation", "0.5"],
    "fedbcd-nn": ["--partition", "vertical:2", "--participation", "full"],
}
TARGET_ACCURACY = 0.95
TARGET_SECONDS = 15 * 60


def run_one(algorithm: str, out: Path, data_dir: str | None) -> dict:
    command = [sys.executable, "-m", "hyfl.cli", "run", "--algorithm", algorithm,
               "--data", "mnist", *COMMANDS[algorithm], "--iterations", "20",
               "--out", str(out), "--quiet"]
    if data_dir:
        command += ["--data-dir", data_dir]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    accuracy = [float(r["val_accuracy"]) for r in rows]
    first = next((int(float(r["iteration"])) for r, a in zip(rows, accuracy)
                  if a >= TARGET_ACCURACY), None)
    return {"algorithm": algorithm, "final": accuracy[-1], "best": max(accuracy),
            "first_0.95": first, "wall": wall, "cpu": cpu,
            "met": accuracy[-1] >= TARGET_ACCURACY and wall <= TARGET_SECONDS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args()
    lines = ["| command | final acc. | best acc. | first iteration at 0.95 | wall s | CPU s "
             "| target met |", "| --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for algorithm in COMMANDS:
                r = run_one(algorithm, Path(tmp) / f"{algorithm}-{repeat}", args.data_dir)
                line = (f"| {algorithm} | {r['final']:.4f} | {r['best']:.4f} | "
                        f"{r['first_0.95']} | {r['wall']:.1f} | {r['cpu']:.1f} | "
                        f"{'yes' if r['met'] else 'NO'} |")
                lines.append(line)
                print(line, flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
