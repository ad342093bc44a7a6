"""Cost of the additively homomorphic ciphers (``none``, ``paillier``, ``packed``).

With one key pair of ``--key-bits`` (2048 by default) it measures

* key generation time (python-paillier with gmpy2; median of several keys);
* for each cipher, the mean seconds per ciphertext and per value of encrypt,
  decrypt and add (:func:`hyfl.privacy.ciphers.calibrate`, median of
  ``--repeats`` runs of ``--ops`` ciphertexts each), on the clients' cipher
  and, for encryption, on the server's public view (which encrypts without the
  key's factors);
* for reference, python-paillier's own float API (``public_key.encrypt``,
  ``private_key.decrypt``, ``EncryptedNumber.__add__``) on the same key;
* ciphertext bytes and slots, and the per-value speed-up of ``packed`` over
  ``paillier`` (target >= 20x for encrypt and decrypt).

Usage::

    python benchmarks/bench_ciphers.py                      # 2048-bit keys
    python benchmarks/bench_ciphers.py --markdown results.md --json results.json
    python benchmarks/bench_ciphers.py --quick              # smoke run, seconds
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPEEDUP_TARGET = 20.0


# --------------------------------------------------------------------------- measurements


def time_keygen(key_bits: int, repeats: int) -> tuple[list[float], tuple]:
    """Seconds of each of ``repeats`` key generations, and the first key pair."""
    from phe import paillier

    times, first = [], None
    for _ in range(repeats):
        tic = time.perf_counter()
        pair = paillier.generate_paillier_keypair(n_length=key_bits)
        times.append(time.perf_counter() - tic)
        first = first or pair
    return times, first


def median_calibration(cipher, ops: int, repeats: int, seed: int) -> dict:
    """Per-operation medians over ``repeats`` calls of ``calibrate``."""
    from hyfl.privacy.ciphers import calibrate

    runs = [calibrate(cipher, n_values=ops, seed=seed + r) for r in range(repeats)]
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            out[key] = float(np.median([run[key] for run in runs]))
    return out


def time_phe_reference(keypair, ops: int, seed: int) -> dict:
    """python-paillier's own float API (EncodedNumber with its floating exponent)."""
    public_key, private_key = keypair
    values = np.random.default_rng(seed).uniform(-1.0, 1.0, ops).tolist()
    public_key.encrypt(values[0])  # warm-up
    tic = time.perf_counter()
    cts = [public_key.encrypt(v) for v in values]
    encrypt = (time.perf_counter() - tic) / ops
    tic = time.perf_counter()
    for c in cts:
        private_key.decrypt(c)
    decrypt = (time.perf_counter() - tic) / ops
    tic = time.perf_counter()
    for c in cts:
        c + c  # noqa: B018 (timed for its cost)
    add = (time.perf_counter() - tic) / ops
    return {
        "cipher": "phe float API",
        "key_bits": public_key.n.bit_length(),
        "slots": 1,
        "encrypt": encrypt,
        "decrypt": decrypt,
        "add": add,
        "encrypt_per_value": encrypt,
        "decrypt_per_value": decrypt,
        "add_per_value": add,
    }


def run(args) -> dict:
    from hyfl.privacy.ciphers import make_cipher

    print(f"key generation: {args.keygen_repeats} x {args.key_bits}-bit ...", flush=True)
    keygen, keypair = time_keygen(args.key_bits, args.keygen_repeats)
    rows = []
    for name in ("none", "paillier", "packed"):
        options = {} if name == "none" else {"keypair": keypair}
        cipher = make_cipher(name, **options)
        print(f"[{name}] {args.repeats} x {args.ops} ciphertexts ...", flush=True)
        row = median_calibration(cipher, args.ops, args.repeats, args.seed)
        row["label"] = name
        row["ciphertext_bytes"] = cipher.ciphertext_bytes
        row["describe"] = cipher.describe()
        rows.append(row)
        if name != "none":
            server = median_calibration(cipher.public(), args.ops, 1, args.seed)
            rows[-1]["server_encrypt"] = server["encrypt"]
            rows[-1]["server_encrypt_per_value"] = server["encrypt_per_value"]
    print(f"[phe float API] {args.phe_ops} values ...", flush=True)
    ref = time_phe_reference(keypair, args.phe_ops, args.seed)
    ref["label"] = "phe float API (reference)"
    ref["ciphertext_bytes"] = (2 * args.key_bits + 7) // 8
    rows.append(ref)
    by_name = {r["label"]: r for r in rows}
    speedup = {
        op: by_name["paillier"][f"{op}_per_value"] / by_name["packed"][f"{op}_per_value"]
        for op in ("encrypt", "decrypt", "add")
    }
    return {
        "key_bits": args.key_bits,
        "keygen_seconds": keygen,
        "rows": rows,
        "speedup_packed_over_paillier": speedup,
    }


# --------------------------------------------------------------------------- reporting


def _us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us:.3g}" if us < 1000 else f"{us:,.0f}"


def table_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    header = [
        "cipher",
        "slots",
        "bytes / ciphertext",
        "bytes / value",
        "encrypt us/value",
        "decrypt us/value",
        "add us/value",
        "encrypt us/ciphertext",
        "decrypt us/ciphertext",
        "add us/ciphertext",
        "server encrypt us/value",
    ]
    rows = []
    for r in result["rows"]:
        rows.append(
            [
                r["label"],
                str(r["slots"]),
                f"{r['ciphertext_bytes']:,}",
                f"{r['ciphertext_bytes'] / r['slots']:.3g}",
                _us(r["encrypt_per_value"]),
                _us(r["decrypt_per_value"]),
                _us(r["add_per_value"]),
                _us(r["encrypt"]),
                _us(r["decrypt"]),
                _us(r["add"]),
                _us(r.get("server_encrypt_per_value")),
            ]
        )
    return header, rows


def summary_lines(result: dict) -> list[str]:
    s = result["speedup_packed_over_paillier"]
    keygen = result["keygen_seconds"]
    packed = next(r for r in result["rows"] if r["label"] == "packed")["describe"]

    def met(v):
        if result["key_bits"] != 2048:
            return "target is for 2048 bits"
        return "met" if v >= SPEEDUP_TARGET else "MISSED"

    return [
        f"Per-value speed-up of packed over paillier at {result['key_bits']} bits: "
        f"encrypt {s['encrypt']:.1f}x ({met(s['encrypt'])}), "
        f"decrypt {s['decrypt']:.1f}x ({met(s['decrypt'])}), add {s['add']:.1f}x "
        f"(target >= {SPEEDUP_TARGET:g}x for encrypt and decrypt).",
        f"Key generation ({result['key_bits']} bits, {len(keygen)} keys): median "
        f"{np.median(keygen):.3f} s (min {min(keygen):.3f}, max {max(keygen):.3f}).",
        f"packed: {packed['slots']} slots of {packed['slot_bits']} bits, precision "
        f"2**-{packed['precision']['precision_bits']}, |value| <= {packed['bounds']['value']:g}, "
        f"<= 2**{packed['guard_bits']} addends per ciphertext.",
    ]


def markdown(result: dict) -> str:
    header, rows = table_rows(result)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n\n" + "\n".join(summary_lines(result)) + "\n"


def print_table(result: dict) -> None:
    header, rows = table_rows(result)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain fallback
        print(" | ".join(header))
        for row in rows:
            print(" | ".join(row))
    else:
        table = Table(title=f"Homomorphic ciphers at {result['key_bits']}-bit keys")
        for name in header:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console(width=max(160, shutil.get_terminal_size().columns)).print(table)
    for line in summary_lines(result):
        print(line)


def environment() -> dict:
    """The machine description of the HyFDCA benchmark plus the big-integer libraries."""
    import gmpy2
    import phe

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_hyfdca import environment as machine

    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        **machine(),
        "phe": phe.__version__,
        "gmpy2": gmpy2.version(),
        "phe_uses_gmpy2": bool(phe.util.HAVE_GMP),
    }


def _loads(values) -> str:
    return "/".join(f"{v:.2f}" for v in values)


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key-bits", type=int, default=None, help="Paillier modulus bits")
    parser.add_argument("--ops", type=int, default=None, help="ciphertexts timed per operation")
    parser.add_argument("--repeats", type=int, default=None, help="calibrations per cipher")
    parser.add_argument("--keygen-repeats", type=int, default=None, help="keys generated")
    parser.add_argument("--phe-ops", type=int, default=None, help="values for the phe reference")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", default=None, help="write the results table here")
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument("--quick", action="store_true", help="1024-bit smoke run (seconds)")
    args = parser.parse_args(argv)
    quick = {"key_bits": 1024, "ops": 20, "repeats": 1, "keygen_repeats": 1, "phe_ops": 10}
    full = {"key_bits": 2048, "ops": 200, "repeats": 3, "keygen_repeats": 5, "phe_ops": 100}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.ops, args.repeats, args.keygen_repeats, args.phe_ops) < 1:
        parser.error("--ops, --repeats, --keygen-repeats and --phe-ops must be >= 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    load_before = os.getloadavg()
    result = run(args)
    env = environment()
    env["load_average_before"] = load_before
    print_table(result)
    print(
        f"{env['date']}; {env['cpu']}, {env['cores']} cores, Python {env['python']}, "
        f"NumPy {env['numpy']}, phe {env['phe']} (gmpy2 {env['gmpy2']}, used: "
        f"{env['phe_uses_gmpy2']}); load average (1/5/15 min) before {_loads(load_before)}, "
        f"after {_loads(env['load_average'])}; hyfl at {env['commit']}"
        + (" with uncommitted changes" if env["dirty"] else "")
    )
    if args.markdown:
        Path(args.markdown).write_text(markdown(result))
    if args.json:
        payload = {"environment": env, "argv": sys.argv, "result": result}
        Path(args.json).write_text(json.dumps(payload, indent=2))
    return result


if __name__ == "__main__":
    main()
