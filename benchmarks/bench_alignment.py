"""Time and bytes of aligning party files (hyfl.privacy.alignment), against openmined-psi.

The deployment's alignment (docs/deployment.md, "Parties with their own files")
costs each party one X25519 operation per own id and per peer id, and the
server one sort of the doubly blinded ids per pair. This script runs those
steps for two parties of ``n`` ids each, half of them shared, in one process
(each party's part timed on its own: on separate machines they run side by
side), and, as the established reference, openmined-psi's ECDH-PSI (P-256) on
the same ids (one direction, as ``hyfl.privacy.psi.intersect``). CPU seconds
beside wall seconds; the variants alternate (ours, reference, ours, ...).

Run::

    python benchmarks/bench_alignment.py --ids 100000 --repeats 2
    python benchmarks/bench_alignment.py --ids 1000000 --repeats 1 --no-reference
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from hyfl.privacy.alignment import POINT_BYTES, BlindingKey, hash_ids, join, number_samples


def _timed(fn, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def ours(ids_a: list[str], ids_b: list[str]) -> dict[str, float]:
    a, b = BlindingKey(), BlindingKey()
    single_a, wall_a1, cpu_a1 = _timed(lambda: a.apply(hash_ids(ids_a)))
    single_b, wall_b1, cpu_b1 = _timed(lambda: b.apply(hash_ids(ids_b)))
    double_b, wall_a2, cpu_a2 = _timed(a.apply, single_b)  # party a blinds b's list
    double_a, wall_b2, cpu_b2 = _timed(b.apply, single_a)
    (rows, _), wall_s, cpu_s = _timed(join, double_a, double_b, ("a", "b"))
    _, wall_n, cpu_n = _timed(number_samples, [len(ids_a), len(ids_b)],
                              {(0, 1): (rows, _)}, np.random.default_rng(0))
    # Party a's critical path: its own blinding, then the peer's list.
    return {"party_wall": max(wall_a1 + wall_a2, wall_b1 + wall_b2),
            "party_cpu": max(cpu_a1 + cpu_a2, cpu_b1 + cpu_b2),
            "server_wall": wall_s + wall_n, "server_cpu": cpu_s + cpu_n,
            "shared": int(rows.size),
            # each list goes up blinded once, down to the peer, up blinded again
            "bytes": 3 * POINT_BYTES * (len(ids_a) + len(ids_b))}


def reference(ids_a: list[str], ids_b: list[str]) -> dict[str, float]:
    import private_set_intersection.python as psi

    encoded_a = [i.encode() for i in ids_a]
    encoded_b = [i.encode() for i in ids_b]
    client = psi.client.CreateWithNewKey(True)
    server = psi.server.CreateWithNewKey(True)
    request, wall_c1, cpu_c1 = _timed(client.CreateRequest, encoded_a)
    setup, wall_s1, cpu_s1 = _timed(server.CreateSetupMessage, 1e-9, len(encoded_a), encoded_b,
                                    psi.DataStructure.RAW)
    response, wall_s2, cpu_s2 = _timed(server.ProcessRequest, request)
    found, wall_c2, cpu_c2 = _timed(client.GetIntersection, setup, response)
    return {"party_wall": max(wall_c1 + wall_c2, wall_s1 + wall_s2),
            "party_cpu": max(cpu_c1 + cpu_c2, cpu_s1 + cpu_s2),
            "server_wall": 0.0, "server_cpu": 0.0, "shared": len(found),
            "bytes": sum(len(m.SerializeToString()) for m in (request, setup, response))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, nargs="+", default=[100_000])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.machine()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {open('/proc/loadavg').read().split()[0]}")
    print("| ids per party | method | party wall s | party CPU s | server CPU s | shared | "
          "MB on the wire | ids/s per party |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.ids:
        ids_a = [f"user-{i}" for i in range(n)]
        ids_b = [f"user-{i}" for i in range(n // 2, n + n // 2)]
        methods = [("hyfl X25519 join", ours)] + (
            [] if args.no_reference else [("openmined-psi (P-256)", reference)])
        for _ in range(args.repeats):
            for name, method in methods:  # interleaved
                r = method(ids_a, ids_b)
                print(f"| {n:,} | {name} | {r['party_wall']:.1f} | {r['party_cpu']:.1f} | "
                      f"{r['server_cpu']:.2f} | {r['shared']:,} | {r['bytes'] / 1e6:.1f} | "
                      f"{2 * n / r['party_cpu']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
