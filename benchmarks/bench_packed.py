"""Packed Paillier rounds: the old path against the new one, interleaved.

Runs HyFDCA's message-level engine (:func:`hyfl.runtime.protocol.run_protocol`)
on ijcnn1 split ``grid:3x3`` (9 clients, each sample held by 3 of them) with
full participation and 2048-bit packed Paillier, and times every outer
iteration (wall and process CPU time, which includes every thread: the
encryption workers and the obfuscator pool's filler). Paths:

* ``old``: one thread, no obfuscator pool, every message in the fixed layout
  (``make_cipher("packed", workers=1, pool_size=0)``,
  ``run_protocol(..., compact=False)``): the protocol before this change;
* ``threads``: the compact layouts and every usable core, no pool;
* ``new``: the defaults (compact layouts, every usable core, the pool).

Each repetition runs the paths one after another (``old threads new old
threads new ...``), so a change in the machine's load hits every path
alike; all use the same key pair. Per round it also records the
encryptions, decryptions and additions, and the slot fill of each kind of
message: the values a message is meant to carry over the slots of the
ciphertexts that carry them.

Cases:

* ``safe``: the setting of the issue's 68 s figure -- the safe step rule,
  IIC 0.5, SecureInnerProduct scoped to the drawn samples;
* ``cocoa``: today's default ``HyFDCA()`` (each client visits all its
  samples every round, so every message is already full).

Usage::

    python benchmarks/bench_packed.py                       # both cases, 2 x 3 runs, ~25 min
    python benchmarks/bench_packed.py --cases safe --repeats 2 --rounds 2
    python benchmarks/bench_packed.py --quick               # 512-bit keys, seconds
    python benchmarks/bench_packed.py --json out.json --markdown out.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hyfdca import environment  # noqa: E402

PATHS = {
    "old": dict(workers=1, pool_size=0, compact=False),
    "threads": dict(workers=None, pool_size=0, compact=True),
    "new": dict(workers=None, pool_size=None, compact=True),
}


def _cpu() -> float:
    """CPU seconds of this process so far, every thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _caller(depth: int = 2) -> str:
    """Name of the protocol method that called the instrumented function."""
    frame = sys._getframe(depth)
    while frame.f_code.co_name.startswith("<"):  # comprehensions
        frame = frame.f_back
    return frame.f_code.co_name


class FillMeter:
    """Counts values and slots of every encrypted message, by the method that makes it.

    Wraps the protocol's ``encrypt_samples`` (messages up) and the server's
    ``_select`` (messages down) while installed.
    """

    UP = {"setup_messages": "norms (set-up)", "inner_products": "inner products up",
          "dual_steps": "dual steps up", "new_duals": "dual changes up",
          "cocoa_proposals": "proposals up", "cocoa_commit": "dual changes up",
          "cocoa_direction": "totals up"}
    DOWN = {"sum_inner_products": "inner products down", "aggregate_duals": "duals down",
            "cocoa_inner_products": "inner products down", "cocoa_aggregate": "duals down",
            "configure": "stale duals down", "setup": "norms down (set-up)"}

    def __init__(self):
        self.counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def install(self):
        import hyfl.algorithms.hyfdca_parties as parties

        self._parties = parties
        self._encrypt, self._select = parties.encrypt_samples, parties.Server._select
        meter = self

        def encrypt_samples(cipher, layout, samples, values):
            vec = meter._encrypt(cipher, layout, samples, values)
            kind = meter.UP.get(_caller(), _caller())
            if getattr(layout, "base", np.empty(2)).size == 1:  # one pseudo-sample: sums
                kind = "totals up"
            meter.add(kind, len(samples) * layout.n_outputs, len(vec) * layout.slots)
            return vec

        def select(server, store, layout, samples):
            vec = meter._select(server, store, layout, samples)
            kind = meter.DOWN.get(_caller(), _caller())
            meter.add(kind, len(samples) * layout.n_outputs, len(vec) * layout.slots)
            return vec

        parties.encrypt_samples, parties.Server._select = encrypt_samples, select
        return self

    def remove(self):
        self._parties.encrypt_samples, self._parties.Server._select = self._encrypt, self._select

    def add(self, kind: str, values: int, slots: int):
        self.counts[kind][0] += values
        self.counts[kind][1] += slots

    def take(self) -> dict[str, dict]:
        """The counts since the last take, with the fill of each kind."""
        out = {kind: {"values": v, "slots": s, "fill": v / s if s else 1.0}
               for kind, (v, s) in sorted(self.counts.items())}
        self.counts.clear()
        return out


def load(seed: int = 0):
    from hyfl.data import load_dataset
    from hyfl.partition import parse_partition
    from hyfl.problem import make_problem

    data = load_dataset("ijcnn1")
    problem = make_problem(data, "hinge", 5e-5)
    partition = parse_partition("grid:3x3", problem.X, seed=seed, meta=data.meta)
    return problem, partition


def algorithm(case: str):
    from hyfl.algorithms.hyfdca import HyFDCA

    if case == "safe":
        return HyFDCA(iic=0.5, sip_scope="drawn", step_rule="safe")
    return HyFDCA()


def run(case: str, path: str, problem, partition, keypair, rounds: int, seed: int = 0) -> dict:
    """One run of ``rounds`` outer iterations; per-round wall, CPU, operations and fill."""
    import hyfl.runtime.protocol as protocol
    from hyfl.participation import Full
    from hyfl.privacy.ciphers import DEFAULT_POOL_SIZE, make_cipher

    options = dict(PATHS[path])
    compact = options.pop("compact")
    if options["workers"] is None:
        del options["workers"]  # the default: every usable core
    if options["pool_size"] is None:
        options["pool_size"] = DEFAULT_POOL_SIZE
    cipher = make_cipher("packed", keypair=keypair, **options)
    meter = FillMeter().install()
    rounds_out: list[dict] = []
    one_round = protocol._one_round
    counts = cipher.counts

    def timed_round(server, clients, *args):
        pool = getattr(cipher._key, "_pool", None)
        before = {"wall": time.perf_counter(), "cpu": _cpu(), "ops": counts.snapshot(),
                  "pool": len(pool) if pool is not None else 0}
        meter.take()  # drop the set-up's (or last round's monitoring) counts
        accepted = one_round(server, clients, *args)
        ops = counts - before["ops"]
        rounds_out.append({
            "wall_s": time.perf_counter() - before["wall"],
            "cpu_s": _cpu() - before["cpu"],
            "pool_at_start": before["pool"],
            "client_encryptions": ops.encryptions, "client_decryptions": ops.decryptions,
            "fill": meter.take(),
        })
        return accepted

    protocol._one_round = timed_round
    tic, cpu = time.perf_counter(), _cpu()
    try:
        result = protocol.run_protocol(
            algorithm(case), problem, partition, Full(partition.n_clients), rounds, cipher,
            seed=seed, eval_every=rounds, monitor_duals=False, compact=compact)
    finally:
        protocol._one_round = one_round
        meter.remove()
        if getattr(cipher._key, "_pool", None) is not None:
            cipher._key._pool.close()
    total_wall, total_cpu = time.perf_counter() - tic, _cpu() - cpu
    final = result.final
    for r in rounds_out:  # the run's mean per round (rounds of one run send alike)
        r.update(encryptions=final["encryptions"] / rounds,
                 decryptions=final["decryptions"] / rounds, additions=final["additions"] / rounds)
    return {
        "case": case, "path": path, "workers": cipher.workers, "pool_size": cipher.pool_size,
        "compact": compact, "slots": cipher.slots, "key_bits": cipher.key_bits,
        "rounds": rounds_out, "run_wall_s": total_wall, "run_cpu_s": total_cpu,
        "setup": result.config["setup"], "primal": final["primal"],
    }


def summary(rows: list[dict]) -> list[dict]:
    """Median wall and CPU seconds per round, per (case, path), and the speed-up over old."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        medians = {}
        for path in PATHS:
            runs = [r for r in rows if r["case"] == case and r["path"] == path]
            if not runs:
                continue
            rounds = [x for r in runs for x in r["rounds"]]
            kinds = defaultdict(lambda: [0, 0])
            for x in rounds:
                for kind, f in x["fill"].items():
                    kinds[kind][0] += f["values"]
                    kinds[kind][1] += f["slots"]
            medians[path] = {
                "case": case, "path": path, "rounds": len(rounds),
                "wall_s": float(np.median([x["wall_s"] for x in rounds])),
                "cpu_s": float(np.median([x["cpu_s"] for x in rounds])),
                "wall_each": [round(x["wall_s"], 2) for x in rounds],
                "encryptions": runs[0]["rounds"][0]["encryptions"],
                "decryptions": runs[0]["rounds"][0]["decryptions"],
                "additions": runs[0]["rounds"][0]["additions"],
                "fill": {k: v / s for k, (v, s) in kinds.items() if s},
                "overall_fill": (sum(v for v, _ in kinds.values())
                                 / max(1, sum(s for _, s in kinds.values()))),
            }
        for m in medians.values():
            if "old" in medians:
                m["speedup_wall"] = medians["old"]["wall_s"] / m["wall_s"]
                m["speedup_cpu"] = medians["old"]["cpu_s"] / m["cpu_s"]
            out.append(m)
    return out


def markdown(table: list[dict], env: dict, args) -> str:
    lines = [
        f"Machine: {env['cpu']}, {env['cores']} cores, Python {env['python']}; commit "
        f"{env['commit']}{' (dirty)' if env['dirty'] else ''}; {time.strftime('%Y-%m-%d %H:%M')}; "
        f"load average before {env['load_average'][0]:.1f}; {args.key_bits}-bit keys, "
        f"{args.repeats} interleaved repetitions of {args.rounds} rounds per path.",
        "",
        "| case | path | rounds | median wall s / round | median CPU s / round | speed-up wall "
        "(CPU) | enc / dec / add per round | fill (all messages) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in table:
        speed = (f"{m['speedup_wall']:.2f}x ({m['speedup_cpu']:.2f}x)"
                 if "speedup_wall" in m else "-")
        lines.append(
            f"| {m['case']} | {m['path']} | {m['rounds']} | {m['wall_s']:.2f} | {m['cpu_s']:.2f} "
            f"| {speed} | {m['encryptions']:.0f} / {m['decryptions']:.0f} / {m['additions']:.0f} "
            f"| {m['overall_fill']:.1%} |")
    lines += ["", "Slot fill per message kind (values carried / slots sent):", "",
              "| case | path | " + " | ".join(sorted({k for m in table for k in m["fill"]})) + " |"]
    kinds = sorted({k for m in table for k in m["fill"]})
    lines.append("|---|---|" + "---|" * len(kinds))
    for m in table:
        lines.append(f"| {m['case']} | {m['path']} | "
                     + " | ".join(f"{m['fill'][k]:.1%}" if k in m["fill"] else "-" for k in kinds)
                     + " |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="safe,cocoa")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--rounds", type=int, default=2, help="rounds per run")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs per path")
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="512-bit keys, 1 round, 1 repeat")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.key_bits, args.rounds, args.repeats = 512, 1, 1
    from phe import paillier

    env = environment()
    problem, partition = load(args.seed)
    keypair = paillier.generate_paillier_keypair(n_length=args.key_bits)
    rows = []
    for case in args.cases.split(","):
        for repeat in range(args.repeats):
            for path in args.paths.split(","):
                row = run(case, path, problem, partition, keypair, args.rounds, args.seed)
                row["repeat"] = repeat
                rows.append(row)
                each = ", ".join(f"{r['wall_s']:.1f} s (CPU {r['cpu_s']:.1f} s)"
                                 for r in row["rounds"])
                print(f"{case} {path} #{repeat}: rounds {each}; load {os.getloadavg()[0]:.1f}",
                      flush=True)
                if args.json:
                    args.json.write_text(json.dumps({"environment": env, "runs": rows},
                                                    indent=1, default=float))
    table = summary(rows)
    env["load_average_after"] = os.getloadavg()
    text = markdown(table, env, args)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "runs": rows, "summary": table},
                                        indent=1, default=float))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return table


if __name__ == "__main__":
    main()
