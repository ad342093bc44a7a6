"""Cost of the additively homomorphic ciphers (every cipher of ``CIPHERS``).

With one key pair of ``--key-bits`` (2048 by default) for the Paillier ciphers
(a cipher that takes no key size, such as a lattice scheme, uses its own
parameters) it measures

* key generation time (python-paillier with gmpy2; median of several keys);
* for each cipher, wall and CPU seconds per ciphertext and per value of
  encrypt, decrypt and add on ``--ops`` ciphertexts, and, for encryption, on
  the server's public view (which encrypts without the key's factors);
* for reference, python-paillier's own float API (``public_key.encrypt``,
  ``private_key.decrypt``, ``EncryptedNumber.__add__``) on the same key;
* ciphertext bytes and slots, and the per-value speed-up of every cipher over
  ``--baseline`` (``paillier``), with ``packed``'s target of >= 20x for encrypt
  and decrypt.

The ciphers are timed **interleaved**: repetition r times every cipher once
(A B C, then C B A, ...), so a change in the machine's load hits all of them
alike, and each speed-up is computed per repetition from the pair timed side by
side. Both wall time (``time.perf_counter``) and CPU time (``time.process_time``,
all threads of this process) are reported, as medians with their range over the
repetitions. A target counts as met or missed only when the whole range of the
paired ratios is on one side of it; otherwise (or with fewer than three
repetitions) the verdict says the spread straddles it instead of guessing from
one noisy sample.

Usage::

    python benchmarks/bench_ciphers.py                      # 2048-bit keys
    python benchmarks/bench_ciphers.py --markdown results.md --json results.json
    python benchmarks/bench_ciphers.py --quick              # smoke run, seconds
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPEEDUP_TARGETS = {"packed": 20.0}
"""Per-value speed-up over the baseline each cipher should reach (encrypt and decrypt)."""
TARGET_KEY_BITS = 2048
MIN_BLOCK_SECONDS = 0.02  # a cheap operation is repeated until this much wall time is timed
OPS = ("encrypt", "decrypt", "add")
MIN_REPEATS_FOR_VERDICT = 3


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


def build_ciphers(names, key_bits: int, keypair) -> tuple[dict, dict[str, str]]:
    """The ciphers to time, built generically from the registry; and those that failed.

    A factory that accepts ``keypair`` gets the shared Paillier pair; one that takes
    a key size gets ``key_bits``; others are built with their own parameters.
    """
    from hyfl.errors import HyflError
    from hyfl.privacy.ciphers import CIPHERS, make_cipher

    built, skipped = {}, {}
    for name in names:
        params = inspect.signature(CIPHERS[name][0]).parameters
        options = {"keypair": keypair} if "keypair" in params else {}
        try:
            if options:
                built[name] = make_cipher(name, **options)
            else:
                try:
                    built[name] = make_cipher(name, key_bits=key_bits)
                except HyflError:  # fixed parameters (e.g. a lattice ring): its own
                    built[name] = make_cipher(name)
        except (HyflError, ImportError, OSError) as err:
            skipped[name] = str(err)
    return built, skipped


def _timed(fn, ops: int) -> tuple[float, float]:
    """Wall and CPU seconds per operation of ``fn`` (``ops`` operations a call).

    ``fn`` is called until at least :data:`MIN_BLOCK_SECONDS` of wall time passed.
    """
    calls = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while True:
        fn()
        calls += 1
        wall = time.perf_counter() - wall0
        if wall >= MIN_BLOCK_SECONDS:
            break
    cpu = time.process_time() - cpu0
    return wall / (calls * ops), cpu / (calls * ops)


def time_block(cipher, chunks: np.ndarray, server=None) -> dict[str, tuple[float, float] | None]:
    """One timed block of every operation: ``{op: (wall, cpu) per ciphertext}``."""
    n = len(chunks)
    saved = cipher.counts.snapshot()
    out: dict[str, tuple[float, float] | None] = {}
    try:
        store = {}

        def encrypt():
            store["cts"] = cipher.encrypt(chunks)

        out["encrypt"] = _timed(encrypt, n)
        cts = store["cts"]
        out["decrypt"] = _timed(lambda: cipher.decrypt(cts), n) if cipher.has_private_key else None
        out["add"] = _timed(lambda: cipher.add(cts, cts), n)
    finally:
        cipher.counts._restore(saved)
    if server is not None:
        saved = server.counts.snapshot()
        try:
            out["server_encrypt"] = _timed(lambda: server.encrypt(chunks), n)
        finally:
            server.counts._restore(saved)
    return out


def interleaved(ciphers: dict, ops: int, repeats: int, seed: int) -> dict[str, list[dict]]:
    """``repeats`` rounds, each timing every cipher once, the order reversed every round."""
    rng = np.random.default_rng(seed)
    data, servers = {}, {}
    for name, cipher in ciphers.items():
        bound = getattr(getattr(cipher, "fixed_point", None), "bound", 1.0)
        data[name] = rng.uniform(-1.0, 1.0, size=(ops, cipher.slots)) * min(1.0, bound)
        servers[name] = cipher.public() if name != "none" else None
        warm = cipher.encrypt(data[name][:1])  # warm-up (caches, lazy set-up)
        cipher.add(warm, warm)
        cipher.decrypt(warm)
    samples: dict[str, list[dict]] = {name: [] for name in ciphers}
    order = list(ciphers)
    for r in range(repeats):
        print(f"  repetition {r + 1}/{repeats}: {' '.join(order)}", flush=True)
        for name in order:
            samples[name].append(time_block(ciphers[name], data[name], servers[name]))
        order.reverse()
    return samples


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max()),
            "n": int(a.size)}


def summarize(cipher, samples: list[dict]) -> dict:
    """Medians (with ranges) of wall and CPU seconds per ciphertext and per value."""
    row = {"cipher": cipher.name, "key_bits": getattr(cipher, "key_bits", None),
           "slots": int(cipher.slots), "ciphertext_bytes": int(cipher.ciphertext_bytes),
           "describe": cipher.describe()}
    for op in (*OPS, "server_encrypt"):
        got = [s[op] for s in samples if s.get(op) is not None]
        if not got:
            row[op] = None
            continue
        wall = _stats([w for w, _ in got])
        cpu = _stats([c for _, c in got])
        row[op] = {"wall": wall, "cpu": cpu}
        row[f"{op}_per_value"] = wall["median"] / cipher.slots
        row[f"{op}_cpu_per_value"] = cpu["median"] / cipher.slots
    return row


def speedups(samples: dict[str, list[dict]], ciphers: dict, baseline: str) -> dict:
    """Per-value speed-up of each cipher over ``baseline``, paired repetition by repetition."""
    out = {}
    base = ciphers[baseline]
    for name, cipher in ciphers.items():
        if name in (baseline, "none"):
            continue
        per_op = {}
        for op in OPS:
            pairs = [(b[op], c[op]) for b, c in zip(samples[baseline], samples[name])
                     if b.get(op) is not None and c.get(op) is not None]
            if not pairs:
                continue
            per_op[op] = {
                clock: _stats([(b[i] / base.slots) / (c[i] / cipher.slots) for b, c in pairs])
                for i, clock in enumerate(("wall", "cpu"))
            }
        out[name] = per_op
    return out


def verdict(ratio: dict[str, float], target: float, key_bits: int) -> str:
    """met / missed only when the whole range is on one side of the target."""
    if key_bits != TARGET_KEY_BITS:
        return f"target is for {TARGET_KEY_BITS} bits"
    if ratio["n"] < MIN_REPEATS_FOR_VERDICT:
        return f"{ratio['n']} repetition(s): too few to judge"
    if ratio["min"] >= target:
        return "met"
    if ratio["max"] < target:
        return "missed"
    return "spread straddles the target: inconclusive"


def time_phe_reference(keypair, ops: int, seed: int) -> dict:
    """python-paillier's own float API (EncodedNumber with its floating exponent)."""
    public_key, private_key = keypair
    values = np.random.default_rng(seed).uniform(-1.0, 1.0, ops).tolist()
    public_key.encrypt(values[0])  # warm-up
    row = {"cipher": "phe float API", "key_bits": public_key.n.bit_length(), "slots": 1}
    store = {}

    def encrypt():
        store["cts"] = [public_key.encrypt(v) for v in values]

    def decrypt():
        for c in store["cts"]:
            private_key.decrypt(c)

    def add():
        for c in store["cts"]:
            c + c  # noqa: B018 (timed for its cost)

    for op, fn in (("encrypt", encrypt), ("decrypt", decrypt), ("add", add)):
        wall, cpu = _timed(fn, ops)
        row[op] = {"wall": _stats([wall]), "cpu": _stats([cpu])}
        row[f"{op}_per_value"] = wall
        row[f"{op}_cpu_per_value"] = cpu
    row["server_encrypt"] = None
    return row


def run(args) -> dict:
    from hyfl.privacy.ciphers import CIPHERS

    names = args.ciphers or list(CIPHERS)
    unknown = sorted(set(names) - set(CIPHERS))
    if unknown:
        raise SystemExit(f"unknown cipher(s) {unknown}; known: {', '.join(CIPHERS)}")
    print(f"key generation: {args.keygen_repeats} x {args.key_bits}-bit ...", flush=True)
    keygen, keypair = time_keygen(args.key_bits, args.keygen_repeats)
    ciphers, skipped = build_ciphers(names, args.key_bits, keypair)
    for name, why in skipped.items():
        print(f"[{name}] skipped: {why}", flush=True)
    print(f"{args.repeats} interleaved repetitions x {args.ops} ciphertexts of "
          f"{', '.join(ciphers)} ...", flush=True)
    samples = interleaved(ciphers, args.ops, args.repeats, args.seed)
    rows = []
    for name, cipher in ciphers.items():
        row = summarize(cipher, samples[name])
        row["label"] = name
        rows.append(row)
    print(f"[phe float API] {args.phe_ops} values ...", flush=True)
    ref = time_phe_reference(keypair, args.phe_ops, args.seed)
    ref["label"] = "phe float API (reference)"
    ref["ciphertext_bytes"] = (2 * args.key_bits + 7) // 8
    rows.append(ref)
    baseline = args.baseline if args.baseline in ciphers else None
    return {
        "key_bits": args.key_bits,
        "keygen_seconds": keygen,
        "repeats": args.repeats,
        "ops": args.ops,
        "rows": rows,
        "baseline": baseline,
        "speedups": speedups(samples, ciphers, baseline) if baseline else {},
        "skipped": skipped,
    }


# --------------------------------------------------------------------------- reporting


def _us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us:.3g}" if us < 1000 else f"{us:,.0f}"


def _range_us(entry, slots: int, clock: str = "wall") -> str:
    """``median (min-max)`` in microseconds per value."""
    if not entry:
        return "-"
    s = entry[clock]
    if s["n"] == 1:
        return _us(s["median"] / slots)
    return f"{_us(s['median'] / slots)} ({_us(s['min'] / slots)}-{_us(s['max'] / slots)})"


def table_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    header = [
        "cipher",
        "slots",
        "bytes / ciphertext",
        "bytes / value",
        "encrypt us/value wall (range)",
        "encrypt us/value CPU",
        "decrypt us/value wall (range)",
        "decrypt us/value CPU",
        "add us/value wall (range)",
        "add us/value CPU",
        "encrypt us/ciphertext",
        "server encrypt us/value",
    ]
    rows = []
    for r in result["rows"]:
        slots = r["slots"]
        cpu = {op: _us(r.get(f"{op}_cpu_per_value")) for op in OPS}
        rows.append(
            [
                r["label"],
                str(slots),
                f"{r['ciphertext_bytes']:,}",
                f"{r['ciphertext_bytes'] / slots:.3g}",
                _range_us(r.get("encrypt"), slots),
                cpu["encrypt"],
                _range_us(r.get("decrypt"), slots),
                cpu["decrypt"],
                _range_us(r.get("add"), slots),
                cpu["add"],
                _us((r.get("encrypt") or {}).get("wall", {}).get("median")),
                _range_us(r.get("server_encrypt"), slots),
            ]
        )
    return header, rows


def _ratio(s: dict) -> str:
    if s["n"] == 1:
        return f"{s['median']:.1f}x"
    return f"{s['median']:.1f}x ({s['min']:.1f}-{s['max']:.1f})"


def summary_lines(result: dict) -> list[str]:
    lines = []
    base = result["baseline"]
    for name, per_op in result["speedups"].items():
        target = SPEEDUP_TARGETS.get(name)
        parts = []
        for op, clocks in per_op.items():
            text = f"{op} wall {_ratio(clocks['wall'])}, CPU {_ratio(clocks['cpu'])}"
            if target is not None and op in ("encrypt", "decrypt"):
                # judged on CPU time, which a busy machine disturbs least; wall beside it
                text += f" [{verdict(clocks['cpu'], target, result['key_bits'])}]"
            parts.append(text)
        goal = f" (target >= {target:g}x for encrypt and decrypt)" if target else ""
        lines.append(
            f"Per-value speed-up of {name} over {base} at {result['key_bits']} bits, median "
            f"(range) of {result['repeats']} interleaved pairs: {'; '.join(parts)}{goal}."
        )
    keygen = result["keygen_seconds"]
    lines.append(
        f"Key generation ({result['key_bits']} bits, {len(keygen)} keys): median "
        f"{np.median(keygen):.3f} s (min {min(keygen):.3f}, max {max(keygen):.3f})."
    )
    packed = next((r for r in result["rows"] if r["label"] == "packed"), None)
    if packed is not None:
        d = packed["describe"]
        lines.append(
            f"packed: {d['slots']} slots of {d['slot_bits']} bits, precision "
            f"2**-{d['precision']['precision_bits']}, |value| <= {d['bounds']['value']:g}, "
            f"<= 2**{d['guard_bits']} addends per ciphertext."
        )
    for name, why in result.get("skipped", {}).items():
        lines.append(f"{name}: not measured ({why}).")
    return lines


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
        table = Table(title=f"Homomorphic ciphers at {result['key_bits']}-bit keys "
                      f"({result['repeats']} interleaved repetitions of {result['ops']})")
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
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved repetitions (every cipher timed once in each)")
    parser.add_argument("--keygen-repeats", type=int, default=None, help="keys generated")
    parser.add_argument("--phe-ops", type=int, default=None, help="values for the phe reference")
    parser.add_argument("--ciphers", nargs="+", default=None,
                        help="ciphers to time (default: every cipher of CIPHERS)")
    parser.add_argument("--baseline", default="paillier", help="speed-ups are over this cipher")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", default=None, help="write the results table here")
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument("--quick", action="store_true", help="1024-bit smoke run (seconds)")
    args = parser.parse_args(argv)
    quick = {"key_bits": 1024, "ops": 20, "repeats": 3, "keygen_repeats": 1, "phe_ops": 10}
    full = {"key_bits": 2048, "ops": 100, "repeats": 7, "keygen_repeats": 5, "phe_ops": 100}
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
