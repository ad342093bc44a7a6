"""Wall and CPU time of a whole ``hyfl run`` per cipher, interleaved on one machine.

The Encryption issue's acceptance command, for each cipher::

    hyfl run --algorithm hyfdca --data ijcnn1 --partition grid:3x3 \\
        --participation 1.0 --iterations 2 --cipher CIPHER [--key-bits 2048]

Each repetition runs every cipher once, in a rotating order (A B, B A, ...), so
drifting load on a shared machine hits every cipher alike. Per run it records
the wall time, the CPU time of the child process (user + system, from
``resource.getrusage``), the measured cryptography seconds (``he_seconds_measured``
in ``metrics.csv``) and the final primal objective; it then prints the median of
each cipher, the ratio of its median wall time to ``none``'s, and the largest
relative difference of its primal objectives from ``none``'s.

Usage::

    python benchmarks/bench_cipher_rounds.py                       # none and ckks, 3 repeats
    python benchmarks/bench_cipher_rounds.py --ciphers none,ckks,packed --repeats 1
    python benchmarks/bench_cipher_rounds.py --markdown out.md
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model, git

COMMAND = ["run", "--algorithm", "hyfdca", "--data", "ijcnn1", "--partition", "grid:3x3",
           "--participation", "1.0", "--iterations", "2"]


def hyfl() -> list[str]:
    """The hyfl command of this interpreter's environment."""
    found = Path(sys.executable).with_name("hyfl")
    return [str(found)] if found.exists() else [sys.executable, "-m", "hyfl.cli"]


def run_once(cipher: str, key_bits: int, out: Path, extra: list[str]) -> dict:
    """One ``hyfl run`` with ``cipher``: wall and CPU seconds, crypto seconds, primal."""
    shutil.rmtree(out, ignore_errors=True)
    args = [*hyfl(), *COMMAND, "--cipher", cipher, "--out", str(out), *extra]
    if cipher in ("paillier", "packed"):
        args += ["--key-bits", str(key_bits)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tic = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - tic
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        "cipher": cipher,
        "wall": wall,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "crypto": float(rows[-1].get("he_seconds_measured") or 0.0),
        "primal": [float(r["primal"]) for r in rows],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ciphers", default="none,ckks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("extra", nargs="*", help="more hyfl run flags (after --)")
    args = parser.parse_args(argv)
    ciphers = args.ciphers.split(",")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = ciphers if r % 2 == 0 else ciphers[::-1]
            for cipher in order:
                run = run_once(cipher, args.key_bits, Path(tmp) / cipher, args.extra)
                runs.append(run)
                print(f"repeat {r + 1}: {cipher:8s} wall {run['wall']:7.2f} s  cpu "
                      f"{run['cpu']:7.2f} s  crypto {run['crypto']:6.2f} s", flush=True)
    base = [r for r in runs if r["cipher"] == "none"]
    base_wall = statistics.median(r["wall"] for r in base) if base else None
    reference = base[0]["primal"] if base else None
    lines = [
        f"Machine: {cpu_model()}, {os.cpu_count()} cores; {datetime.date.today()}; "
        f"commit {git('rev-parse', '--short', 'HEAD')}; {args.repeats} interleaved repeats.",
        f"Command: hyfl {' '.join(COMMAND)} --cipher CIPHER"
        + (f" (--key-bits {args.key_bits} for Paillier)" if {"paillier", "packed"} & set(ciphers)
           else ""),
        "",
        "| cipher | wall s (median) | CPU s (median) | crypto s | wall / none | "
        "max rel. primal diff. vs none |",
        "|---|---|---|---|---|---|",
    ]
    for cipher in ciphers:
        mine = [r for r in runs if r["cipher"] == cipher]
        wall = statistics.median(r["wall"] for r in mine)
        cpu = statistics.median(r["cpu"] for r in mine)
        crypto = statistics.median(r["crypto"] for r in mine)
        ratio = f"{wall / base_wall:.2f}x" if base_wall else "-"
        diff = "-"
        if reference is not None:
            diff = f"{max(abs(a - b) / abs(b) for a, b in zip(mine[0]['primal'], reference)):.1e}"
        lines.append(f"| {cipher} | {wall:.2f} | {cpu:.2f} | {crypto:.2f} | {ratio} | {diff} |")
    text = "\n".join(lines)
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
