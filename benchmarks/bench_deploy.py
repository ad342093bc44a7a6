"""Seconds per round of ``hyfl deploy local`` against the in-process engine, by parties.

For each number of parties K (breast_cancer, ``grid:(K/2)x2`` for even K >= 4,
else ``vertical:K``) and each party mode -- ``worker`` (each party's long-lived
worker) and ``per-message`` (Flower's ClientApp process per message) -- it runs::

    hyfl deploy local --data breast_cancer --partition P --iterations N \\
        --cipher paillier --key-bits B --compare --out OUT [--per-message]

and reads from ``deploy.json`` and ``comparison.json``: the median seconds per
deployed round, the median seconds per round of ``run_protocol`` with the same
seed and keys (the in-process engine: every party in one process, one after
the other), the largest weight difference (must be 0), the mean round trip of
a message as the server saw it and what of it the party did not spend on
HyFDCA (``overhead``: transport, polls, codec, state saving), and the CPU
seconds of the whole deployment (every process, from ``getrusage``). Modes
alternate within each K (worker, per-message, worker, ...), so drifting load
hits both alike.

Usage::

    python benchmarks/bench_deploy.py                                  # K = 1 2 4 8, worker only
    python benchmarks/bench_deploy.py --parties 4 --modes worker,per-message --key-bits 2048
    python benchmarks/bench_deploy.py --markdown out.md
"""

from __future__ import annotations

import argparse
import datetime
import json
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


def hyfl() -> list[str]:
    found = Path(sys.executable).with_name("hyfl")
    return [str(found)] if found.exists() else [sys.executable, "-m", "hyfl.cli"]


def partition_for(parties: int) -> str:
    if parties >= 4 and parties % 2 == 0:
        return f"grid:{parties // 2}x2"
    return f"vertical:{parties}"


def run_once(parties: int, mode: str, args, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = [*hyfl(), "deploy", "local", "--data", args.data, "--partition",
               partition_for(parties), "--iterations", str(args.iterations), "--cipher",
               args.cipher, "--compare", "--out", str(out), "--timeout", "3600"]
    if args.cipher in ("paillier", "packed"):
        command += ["--key-bits", str(args.key_bits)]
        if args.key_bits < 2048:
            command.append("--insecure-test-keys")
    if mode == "per-message":
        command.append("--per-message")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tic = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - tic
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not (out / "comparison.json").exists():
        raise SystemExit(f"K={parties} {mode} failed:\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-2000:]}")
    comparison = json.loads((out / "comparison.json").read_text())
    if comparison["max_abs_weight_difference"] != 0.0 or not comparison["bytes_equal"]:
        # The deployment must be the in-process engine exactly, at every scale.
        raise SystemExit(f"K={parties} {mode}: the deployed run differs from run_protocol "
                         f"(weights by {comparison['max_abs_weight_difference']}, bytes "
                         f"equal: {comparison['bytes_equal']}); see {out}")
    rounds = json.loads((out / "deploy.json").read_text())["rounds"]

    def mean(key: str) -> float:
        values = [r[key] for r in rounds if key in r]
        return statistics.fmean(values) if values else float("nan")

    return {
        "parties": parties, "mode": mode, "wall": wall,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "deployed": comparison["deploy_round_seconds_median"],
        "in_process": comparison["protocol_round_seconds_median"],
        "max_weight_difference": comparison["max_abs_weight_difference"],
        "round_trip": mean("round_trip_mean"), "overhead": mean("overhead_mean"),
        "messages": mean("messages"), "exit_code": done.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parties", default="1,2,4,8")
    parser.add_argument("--modes", default="worker")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--data", default="breast_cancer")
    parser.add_argument("--cipher", default="paillier")
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    modes = args.modes.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for parties in map(int, args.parties.split(",")):
            for repeat in range(args.repeats):
                order = modes if repeat % 2 == 0 else modes[::-1]
                for mode in order:
                    row = run_once(parties, mode, args, Path(tmp) / f"k{parties}-{mode}")
                    rows.append(row)
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                      for k, v in row.items()}), flush=True)
    commit = git("rev-parse", "--short", "HEAD")
    lines = [
        f"{datetime.date.today()}, {cpu_model()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f} at the end, commit {commit}; {args.data}, cipher "
        f"{args.cipher} ({args.key_bits} bits), {args.iterations} rounds, median of rounds",
        "",
        "| parties | partition | mode | deployed s/round | in-process s/round | difference | "
        "message round trip s | of it overhead s | messages/round | CPU s (all processes) | "
        "max weight diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['parties']} | {partition_for(row['parties'])} | {row['mode']} | "
            f"{row['deployed']:.2f} | {row['in_process']:.2f} | "
            f"{row['deployed'] - row['in_process']:+.2f} | {row['round_trip']:.3f} | "
            f"{row['overhead']:.3f} | {row['messages']:.0f} | {row['cpu']:.0f} | "
            f"{row['max_weight_difference']:g} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
