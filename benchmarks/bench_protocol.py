"""Cost of HyFDCA outer iterations with real homomorphic encryption.

Runs the message-level engine (:func:`hyfl.runtime.protocol.run_protocol`,
separate parties, the server holding only the public key) on ijcnn1 split
3 x 3 (a hybrid grid: 9 clients, each sample held by 3 clients, each feature
by 3), with 2048-bit keys, and reports per outer iteration: wall time, time
spent in real cryptography, encryptions, decryptions, additions, bytes each
way, and the simulated time charged with the per-operation costs measured
here by :func:`hyfl.privacy.ciphers.calibrate`.

Cases (all with IIC 0.5, the default):

* ``full``: full participation, SecureInnerProduct scoped to the drawn
  samples (section 7.1's count);
* ``partial``: half the clients per round, every client re-sends all its
  inner products (Algorithm 2).

Each case runs for real with packed Paillier, and once more with the ``none``
cipher, whose counts are per value: multiplied by per-value Paillier's costs
measured here they give what per-value Paillier would take per round (running
it for real would take 10-20 minutes per round on this machine, plus as long
again to exchange the squared row norms at set-up).

Usage::

    python benchmarks/bench_protocol.py                  # all cases (~3 minutes)
    python benchmarks/bench_protocol.py --quick          # 512-bit keys, seconds
    python benchmarks/bench_protocol.py --markdown out.md --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hyfdca import environment  # noqa: E402

CASES = {
    "full": dict(fraction=1.0, scope="drawn", iic=0.5),
    "partial": dict(fraction=0.5, scope="all", iic=0.5),
}


def run_case(name: str, cipher_name: str, key_bits: int, rounds: int, seed: int = 0) -> dict:
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.costs import CostModel, HECosts
    from hyfl.data import load_dataset
    from hyfl.participation import Full, RandomFraction
    from hyfl.partition import parse_partition
    from hyfl.privacy.ciphers import calibrate, make_cipher
    from hyfl.problem import make_problem
    from hyfl.runtime.protocol import run_protocol

    case = CASES[name]
    data = load_dataset("ijcnn1")
    problem = make_problem(data, "hinge", 5e-5)
    partition = parse_partition("grid:3x3", problem.X, seed=seed, meta=data.meta)
    K = partition.n_clients
    participation = Full(K) if case["fraction"] == 1.0 else RandomFraction(K, case["fraction"])
    tic = time.perf_counter()
    cipher = make_cipher(cipher_name, key_bits=key_bits)
    keygen = time.perf_counter() - tic
    measured = calibrate(cipher if cipher_name != "none" else make_cipher(
        "paillier", key_bits=key_bits), n_values=50)
    model = CostModel(he=HECosts(measured["encrypt"], measured["decrypt"], measured["add"],
                                 source="measured"))
    hyfdca = HyFDCA(iic=case["iic"], sip_scope=case["scope"])
    tic = time.perf_counter()
    result = run_protocol(hyfdca, problem, partition, participation, rounds, cipher, seed=seed,
                          eval_every=rounds, cost_model=model, monitor_duals=False)
    total = time.perf_counter() - tic
    final = result.final
    per = {k: final[k] / rounds for k in (
        "encryptions", "decryptions", "additions", "bytes_up", "bytes_down", "sim_time",
        "time_client", "time_server", "time_encryption", "he_seconds_measured")}
    return {
        "case": name,
        "cipher": cipher_name,
        **case,
        "key_bits": key_bits,
        "slots": cipher.slots,
        "clients": K,
        "samples": problem.n_samples,
        "rounds": rounds,
        "keygen_s": keygen,
        "setup": result.config["setup"],
        "round_s": float(np.mean(result.round_times)),
        "round_s_each": result.round_times.tolist(),
        "total_s": total,
        **{f"per_round_{k}": v for k, v in per.items()},
        "measured_costs": measured,
    }


def markdown(rows: list[dict], env: dict) -> str:
    lines = [
        f"Machine: {env['cpu']}, {env['cores']} cores, Python {env['python']}; "
        f"commit {env['commit']}{' (dirty)' if env['dirty'] else ''}; "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "| case | cipher (slots) | participation | IIC | wall s / round | crypto s / round "
        "| enc / round | dec / round | add / round | MB up / down per round "
        "| sim. s / round (client + server + HE at measured costs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["cipher"] == "none":  # counts per value, charged at per-value Paillier's costs
            r = {**r, "cipher": "paillier (estimated)", "round_s": float("nan"),
                 "per_round_he_seconds_measured": r["per_round_time_encryption"]}
        lines.append(
            f"| {r['case']} | {r['cipher']} ({r['slots']}) | {r['fraction']:.1f} ({r['scope']}) "
            f"| {r['iic']} | {r['round_s']:.2f} | {r['per_round_he_seconds_measured']:.2f} "
            f"| {r['per_round_encryptions']:.0f} | {r['per_round_decryptions']:.0f} "
            f"| {r['per_round_additions']:.0f} "
            + (f"| {r['per_round_bytes_up'] / 1e6:.2f} / {r['per_round_bytes_down'] / 1e6:.2f} "
               if r["cipher"] == "packed" else "| - ")
            + f"| {r['per_round_sim_time']:.2f} ({r['per_round_time_client']:.3f} + "
            f"{r['per_round_time_server']:.3f} + {r['per_round_time_encryption']:.2f}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="512-bit keys, 1 round")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = args.cases.split(",")
    if args.quick:
        args.key_bits, args.rounds = 512, 1
    env = environment()
    rows = []
    for name in names:
        for cipher_name in ("packed", "none"):
            row = run_case(name, cipher_name, args.key_bits, args.rounds)
            rows.append(row)
            print(f"{name} {cipher_name}: {row['round_s']:.2f} s/round, "
                  f"{row['per_round_encryptions']:.0f} enc, "
                  f"{row['per_round_decryptions']:.0f} dec", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"environment": env, "results": rows}, indent=2))
    table = markdown(rows, env)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return rows


if __name__ == "__main__":
    main()
