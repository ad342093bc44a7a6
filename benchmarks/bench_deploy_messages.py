"""Where a deployed message's time goes, and deployed against in-process rounds, per cipher.

Two measurements, each run once per source tree given (``--src A --src B``:
e.g. a worktree of the commit before a change and one after), interleaved
A B A B so that drifting load hits both alike. Every figure is printed with
the CPU seconds beside the wall seconds (the machine is shared).

``stages`` (default): the deployed protocol in one process, every message
through the same steps as over Flower but without the network, each step's CPU
time summed by stage: the server's codec (encode, pack, unpack, decode), one
Flower hop's object work (message ids, deflate: every object's SHA-256; the
SuperLink and the SuperNode each do it again), the party's worker (its
handler, its state saved into ``context.state`` and serialised as
``PushTaskOutput`` does, the state read back as ``PullTaskInput`` does),
and the server's per-round snapshot (``copy.deepcopy``). Bytes are per
message: the payload and the party's saved state.

``deploy``: ``hyfl deploy local --data D --partition P --participation p
--cipher C --iterations N --compare``, reading ``deploy.json`` and
``comparison.json``: median deployed round, median in-process round
(``run_protocol``, same seed and keys), the mean message round trip and its
overhead, the max weight difference (must be 0), and the CPU of every
process of the run.

Usage::

    python benchmarks/bench_deploy_messages.py --ciphers ckks,none
    python benchmarks/bench_deploy_messages.py --mode deploy --ciphers ckks,none \\
        --src /tmp/wt-before/src --src src --iterations 6
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import REPO, cpu_model, git

# ----------------------------------------------------------------------------- stages


def stages(cipher: str, data: str, partition: str, parties: int, participation: str,
           iterations: int, key_bits: int) -> dict:
    """One in-process run with every message's steps timed (CPU) by stage."""
    import copy
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    from flwr.app import Context, Message, RecordDict
    from flwr.common.serde import context_from_proto, context_to_proto
    from flwr.proto.message_pb2 import Context as ProtoContext
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        no_object_id_recompute,
    )
    from flwr.supercore.task_identity import TaskIdentity

    import hyfl.deploy.coordinator as coordinator_module
    from hyfl.deploy.app import load_state, pack, save_state, unpack
    from hyfl.deploy.codec import decode, encode, encoded_bytes
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.coordinator import Coordinator
    from hyfl.deploy.keys import generate_keys, server_cipher
    from hyfl.deploy.worker import Sessions

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    # The worker before it decoded the saved state lazily: it decoded it every message.
    import inspect

    lazy = "callable(state)" in inspect.getsource(Sessions.handle)
    table = collections.defaultdict(lambda: [0, 0.0, 0])  # stage -> [count, CPU s, bytes]

    def clock(stage, work, nbytes=0):
        tic = time.process_time()
        out = work()
        entry = table[stage]
        entry[0] += 1
        entry[1] += time.process_time() - tic
        entry[2] += nbytes
        return out

    tmp = Path(tempfile.mkdtemp(prefix="hyfl-bench-messages-"))
    keys, insecure = {}, cipher in ("paillier", "packed") and key_bits < 2048
    if cipher != "none":
        private, public = generate_keys(tmp / "keys", 2048 if cipher == "ckks" else key_bits,
                                        insecure_test_keys=insecure,
                                        cipher="ckks" if cipher == "ckks" else "paillier")
        keys = {"private": str(private), "public": str(public)}
    run = run_config_for(parties=parties, iterations=iterations, cipher=cipher,
                         public_key=keys.get("public", ""), participation=participation,
                         partition=partition, out=str(tmp / "out"),
                         insecure_test_keys=insecure)
    config = DeployConfig.from_run_config(run)
    nodes = []
    for k in range(config.parties):
        node = {"party": k, "cipher": cipher, "data": data, "out": str(tmp / "parties"),
                "unchecked-rules": True}
        if cipher != "none":
            node.update({"key": keys["private"], "insecure-test-keys": insecure})
        nodes.append(node)
    server = server_cipher(config.cipher, config.public_key, insecure_test_keys=insecure,
                           **config.cipher_options())

    def flower_hop(content):  # what each hop does to a message: ids (SHA-256), deflate
        message = Message(content, dst_node_id=1, message_type="train.x", ttl=100)
        with no_object_id_recompute():  # as Flower's senders do: each object deflated once
            return {k: o.deflate() for k, o in get_all_nested_objects(message).items()}

    class Transport:
        sent_bytes = received_bytes = 0

        def __init__(self):
            self.workers = {k: Sessions() for k in range(config.parties)}
            self.states = dict.fromkeys(range(config.parties))
            self.contexts = {}

        def deliver(self, k, kind, payload):
            message = clock("server: encode", lambda: encode(payload))
            content = clock("server: pack", lambda: pack(*message))
            clock("flower: ids+deflate, one hop (payload)", lambda: flower_hop(content),
                  encoded_bytes(*message))
            received = clock("party: unpack", lambda: unpack(content, "the server"))
            proto = self.contexts.get(k)
            if proto is not None:  # PullTaskInput: the context the last message left
                context = clock("party: state from proto (PullTaskInput)",
                                lambda: context_from_proto(ProtoContext.FromString(proto)))
            else:
                context = Context(run_id=1, node_id=1, node_config=nodes[k],
                                  state=RecordDict(), run_config=run)
            saved = (lambda: load_state(context)) if lazy else clock(
                "party: load_state (decode)", lambda: load_state(context))
            reply, state = clock(f"party: handle {kind} (+ state encode)",
                                 lambda: self.workers[k].handle(1, kind, received, saved,
                                                                nodes[k], run))
            clock("party: save_state (pack)", lambda: save_state(context, state))
            self.contexts[k] = clock("party: state to proto (PushTaskOutput)",
                                     lambda: context_to_proto(context).SerializeToString(),
                                     encoded_bytes(*state))
            content = clock("party: pack reply", lambda: pack(*reply))
            clock("flower: ids+deflate, one hop (payload)", lambda: flower_hop(content),
                  encoded_bytes(*reply))
            arrays, spec = clock("server: unpack", lambda: unpack(content, f"party {k}"))
            return clock("server: decode", lambda: decode(arrays, spec, server))

        def connect(self, n, timeout, hello):
            return {k: self.deliver(k, "hello", hello) for k in range(n)}

        def exchange(self, messages, timeout):
            return {k: self.deliver(k, kind, p) for k, (kind, p) in messages.items()}, set()

        def post(self, k, kind, payload):
            return self.deliver(k, kind, payload) is not None

        def poll(self, handle):
            return "replied"

    deepcopy = copy.deepcopy

    class _Copy:  # the coordinator's copy module, its deepcopy timed (outermost call)
        def __getattr__(self, name):
            return getattr(copy, name)

        @staticmethod
        def deepcopy(*args, **kwargs):
            return clock("server: round snapshot (deepcopy)", lambda: deepcopy(*args, **kwargs))

    coordinator_module.copy = _Copy()
    try:
        tic, wall = time.process_time(), time.perf_counter()
        results = Coordinator(config, Transport(), server, log=lambda line: None).run()
        cpu, wall = time.process_time() - tic, time.perf_counter() - wall
    finally:
        coordinator_module.copy = copy
    rounds = results["rounds"]
    return {"cipher": cipher, "cpu": cpu, "wall": wall, "rounds": len(rounds),
            "messages": int(sum(r["messages"] for r in rounds)),
            "round_cpu_median": float(np.median([r["round_seconds"] for r in rounds])),
            "stages": {name: {"n": n, "cpu": s, "bytes": b} for name, (n, s, b) in table.items()}}


# ----------------------------------------------------------------------------- deploy


def hyfl_command() -> list[str]:
    found = Path(sys.executable).with_name("hyfl")
    return [str(found)] if found.exists() else [sys.executable, "-m", "hyfl.cli"]


def deploy(cipher: str, args, src: str, out: Path) -> dict:
    command = [*hyfl_command(), "deploy", "local", "--data", args.data, "--partition",
               args.partition, "--participation", args.participation, "--cipher", cipher,
               "--iterations", str(args.iterations), "--compare", "--out", str(out),
               "--timeout", "7200"]
    if cipher in ("paillier", "packed"):
        command += ["--key-bits", str(args.key_bits)]
        if args.key_bits < 2048:
            command.append("--insecure-test-keys")
    env = {**os.environ, "PYTHONPATH": src, "PYTHONWARNINGS": "ignore"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tic = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    by_role = cpu_by_role(process)
    stdout, stderr = process.communicate()
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    wall = time.perf_counter() - tic
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not (out / "comparison.json").exists():
        raise SystemExit(f"{cipher} ({src}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    comparison = json.loads((out / "comparison.json").read_text())
    rounds = json.loads((out / "deploy.json").read_text())["rounds"]

    def mean(key):
        values = [r[key] for r in rounds if key in r]
        return statistics.fmean(values) if values else float("nan")

    return {"cipher": cipher, "src": src, "wall": wall,
            "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "deployed": comparison["deploy_round_seconds_median"],
            "in_process": comparison["protocol_round_seconds_median"],
            "max_weight_difference": comparison["max_abs_weight_difference"],
            "round_trip": mean("round_trip_mean"), "overhead": mean("overhead_mean"),
            "until_handler": mean("until_handler_mean"), "messages": mean("messages"),
            "exchanges": mean("exchanges"),  # sequential exchanges a round (since e9162bb)
            "exit_code": done.returncode, "load": os.getloadavg()[0], "cpu_by_role": by_role}


#: A process of a local deployment, by what its command line contains (first match).
ROLES = (("superlink", "flower-superlink"), ("worker", "hyfl.deploy.worker"),
         ("supernode", "hyfl.deploy.supernode"), ("serverapp", "flwr-serverapp"),
         ("superexec", "flower-superexec"), ("reaper", "_reaper.py"))
# The hyfl command itself counts as "hyfl cli": with --compare it runs the in-process
# protocol too.


def cpu_by_role(process: subprocess.Popen, every: float = 0.5) -> dict[str, float]:
    """CPU seconds of every process of the run, summed by role, until ``process`` exits.

    Read from ``/proc`` every ``every`` seconds (the last reading of each
    process counts: what it used between that reading and its end is missed).
    """
    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[int, tuple[str, float]] = {}
    while process.poll() is None:
        parents, cpu, commands = {}, {}, {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    commands[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
        family, grew = {process.pid}, True
        while grew:
            new = {pid for pid, parent in parents.items() if parent in family} - family
            family |= new
            grew = bool(new)
        for pid in sorted(family & cpu.keys()):
            role = next((name for name, mark in ROLES if mark in commands[pid]), "hyfl cli")
            if parents[pid] in seen and seen[parents[pid]][0] == "superexec":
                role = "serverapp"  # (Flower blanks its command line: it held a token)
            if pid in seen and role == "hyfl cli":  # a zombie's command line is empty
                role = seen[pid][0]
            seen[pid] = (role, cpu[pid])
        time.sleep(every)
    totals: dict[str, float] = collections.defaultdict(float)
    for role, seconds in seen.values():
        totals[role] += seconds
    return {role: round(seconds, 1) for role, seconds in sorted(totals.items())}


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("stages", "deploy"), default="stages")
    parser.add_argument("--ciphers", default="ckks,packed,paillier,none")
    parser.add_argument("--src", action="append", default=None,
                        help="source tree (PYTHONPATH) of a variant; repeat to interleave")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--data", default="ijcnn1")
    parser.add_argument("--partition", default="grid:2x2")
    parser.add_argument("--parties", type=int, default=4, help="the partition's parties")
    parser.add_argument("--participation", default="0.5")
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one stages run, in this process (PYTHONPATH chose the variant)
        print(json.dumps(stages(args.child, args.data, args.partition, args.parties,
                                args.participation, args.iterations, args.key_bits)))
        return
    sources = args.src or [str(REPO / "src")]
    print(f"# {datetime.date.today()}, {cpu_model()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f} at the start, commit {git('rev-parse', '--short', 'HEAD')}; "
          f"{args.data} {args.partition} participation {args.participation}, "
          f"{args.iterations} rounds", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for cipher in args.ciphers.split(","):
                order = sources if repeat % 2 == 0 else sources[::-1]
                for i, src in enumerate(order):
                    if args.mode == "deploy":
                        row = deploy(cipher, args, src, Path(tmp) / f"{cipher}-{i}-{repeat}")
                        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                          for k, v in row.items()}), flush=True)
                        continue
                    env = {**os.environ, "PYTHONPATH": src, "PYTHONWARNINGS": "ignore"}
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", cipher, "--data", args.data,
                         "--partition", args.partition, "--parties", str(args.parties),
                         "--participation",
                         args.participation, "--iterations", str(args.iterations),
                         "--key-bits", str(args.key_bits)],
                        capture_output=True, text=True, env=env)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    if done.returncode:
                        raise SystemExit(done.stderr[-3000:])
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                    print(f"\n## {cipher}, src {src}: {row['rounds']} rounds, {row['messages']} "
                          f"messages, run CPU {row['cpu']:.1f} s (wall {row['wall']:.1f} s; "
                          f"process with set-up {cpu:.1f} s CPU)")
                    print("| stage | calls | CPU ms per call | CPU s per round | MB per call |")
                    print("|---|---|---|---|---|")
                    for name, s in sorted(row["stages"].items(), key=lambda x: -x[1]["cpu"]):
                        print(f"| {name} | {s['n']} | {s['cpu'] / s['n'] * 1e3:.1f} | "
                              f"{s['cpu'] / row['rounds']:.3f} | "
                              f"{s['bytes'] / s['n'] / 1e6:.2f} |", flush=True)


if __name__ == "__main__":
    main()
