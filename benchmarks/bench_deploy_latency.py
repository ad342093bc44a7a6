"""Seconds per deployed round against network latency: parties and SuperLink on separate
(emulated) hosts.

Each run uses ``tests/netns_harness.py``: the SuperLink, its ServerApp and the
job in one network namespace, each party's SuperNode and worker in its own,
TLS and SuperNode authentication on, every link through the latency relay
(``tests/latency_relay.py``: a one-way delay on every chunk and a bandwidth
limit, both directions). Every party holds the named data set and cuts its
block with the job's partition spec (node config ``data=NAME``). For each
cipher and each one-way latency it runs ``--iterations`` rounds of HyFDCA's
defaults (``cocoa``, full participation) and reports, over rounds 2..N (round
1 includes warm-ups):

* the median wall seconds per round (from ``deploy.json``),
* the median CPU seconds per round of every process of the deployment
  (SuperLink, ServerApp, SuperNodes, workers, relay; from ``/proc`` at each
  round's end),
* the mean round trip of a message as the server saw it, and messages per
  round.

Latencies alternate within each cipher (0, 20, 100, ...), so drifting load
hits all alike. Needs root (network namespaces); says why not otherwise.

Usage::

    sudo python benchmarks/bench_deploy_latency.py                     # paillier,ckks x 0,20,100 ms
    python benchmarks/bench_deploy_latency.py --ciphers ckks --delays 0,100 --markdown out.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model, git

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from netns_harness import NetnsDeployment, netns_unavailable  # noqa: E402


def run_once(cipher: str, delay_ms: float, args, keys: Path | None, work: Path) -> dict:
    from hyfl.deploy.config import run_config_for
    from hyfl.deploy.keys import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE

    parties = args.parties
    policy = ({"cipher": "none"} if keys is None else
              {"cipher": cipher, "key": str(keys / PRIVATE_KEY_FILE),
               "insecure-test-keys": args.key_bits < 2048})
    nodes = [{"party": k, **policy, "data": args.data, "out": str(work / f"party-{k}")}
             for k in range(parties)]
    run_config = run_config_for(
        parties=parties, iterations=args.iterations, cipher=cipher, partition=args.partition,
        seed=args.seed, out=str(work / "results"), reply_timeout=600.0,
        public_key="" if keys is None else str(keys / PUBLIC_KEY_FILE),
        insecure_test_keys=keys is not None and args.key_bits < 2048)
    load_before = os.getloadavg()[0]
    deployment = NetnsDeployment(nodes, work / "netns", delay_ms=delay_ms,
                                 rate_mbit=args.rate_mbit, timeout=args.timeout)
    cpu_at: list[float] = []
    tic = time.perf_counter()
    with deployment:
        started = time.perf_counter() - tic
        results = deployment.run(run_config, timeout=args.timeout,
                                 on_progress=lambda record: cpu_at.append(
                                     deployment.cpu_seconds()))
        relay = deployment.stop_relay()
    rounds = results["rounds"]
    if len(rounds) != args.iterations or any(r["absent"] for r in rounds):
        raise SystemExit(f"{cipher} {delay_ms} ms: not every party took part in every round: "
                         f"{[(r['active'], r['absent']) for r in rounds]}")
    later = rounds[1:] or rounds
    cpu = [b - a for a, b in zip(cpu_at, cpu_at[1:])] or [float("nan")]
    return {
        "cipher": cipher, "delay_ms": delay_ms, "rate_mbit": args.rate_mbit,
        "wall_s": statistics.median(r["round_seconds"] for r in later),
        "cpu_s": statistics.median(cpu),
        "round_trip_s": statistics.mean(r["round_trip_mean"] for r in later),
        "messages": statistics.median(r["messages"] for r in later),
        "round_seconds": [r["round_seconds"] for r in rounds],
        "start_s": started, "load_before": load_before, "load_after": os.getloadavg()[0],
        "relay_bytes": sum(r["bytes_up"] + r["bytes_down"] for r in relay["routes"]),
    }


def markdown(rows: list[dict], args) -> str:
    lines = [
        f"{args.data} `{args.partition}` ({args.parties} parties), HyFDCA defaults (`cocoa`), "
        f"{args.iterations} rounds (medians over rounds 2-{args.iterations}), "
        f"{args.rate_mbit:g} Mbit/s per link and direction; {cpu_model()}, "
        f"{datetime.date.today()}, git {git()}",
        "",
        "| cipher | one-way latency | s per round (median) | CPU s per round (median) | "
        "round trip s (mean) | messages per round | load average (before, after) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['cipher']} | {r['delay_ms']:g} ms | {r['wall_s']:.2f} | "
                     f"{r['cpu_s']:.2f} | {r['round_trip_s']:.2f} | {r['messages']:g} | "
                     f"{r['load_before']:.1f}, {r['load_after']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ciphers", default="paillier,ckks")
    parser.add_argument("--delays", default="0,20,100", help="one-way latencies in ms")
    parser.add_argument("--rate-mbit", type=float, default=100.0, help="0: unlimited")
    parser.add_argument("--data", default="breast_cancer")
    parser.add_argument("--partition", default="grid:2x2")
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--key-bits", type=int, default=2048, help="Paillier modulus")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reason = netns_unavailable()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    from hyfl.deploy.keys import generate_keys

    rows = []
    with tempfile.TemporaryDirectory(prefix="hyfl-bench-latency-") as tmp:
        root = Path(tmp)
        for cipher in args.ciphers.split(","):
            keys = None
            if cipher != "none":
                keys = root / f"keys-{cipher}"
                generate_keys(keys, args.key_bits, cipher=cipher,
                              insecure_test_keys=args.key_bits < 2048)
            for delay in (float(d) for d in args.delays.split(",")):
                work = root / f"{cipher}-{delay:g}"
                row = run_once(cipher, delay, args, keys, work)
                rows.append(row)
                print(json.dumps(row), flush=True)
    table = markdown(rows, args)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
