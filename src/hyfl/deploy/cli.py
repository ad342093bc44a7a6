"""``hyfl deploy``: HyFDCA on Flower, one party per process or machine.

The commands only parse flags, start Flower's programs and print; the work is
in :mod:`hyfl.deploy`. See ``docs/deployment.md`` for a multi-machine recipe.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.markup import escape

from hyfl._names import CIPHER_NAMES, KEY_SCHEME_NAMES, LOSS_NAMES
from hyfl.errors import HyflError, fail

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run HyFDCA on Flower: keys, party blocks, SuperLink, parties, jobs, or all of it "
    "on loopback (`hyfl deploy local`).",
    pretty_exceptions_show_locals=False,  # key records and party data stay out of tracebacks
)
console = Console(emoji=False)  # an error quoting a user's text shows it as typed

# Job options shared by `run` and `local`.
Iterations = Annotated[int, typer.Option(help="Outer iterations (rounds).")]
Participation = Annotated[str, typer.Option(help="full | fraction p | cyclic:C | trace:FILE.")]
Seed = Annotated[int, typer.Option(help="Seed of the participation schedule and the draws.")]
# Click choices: --help lists them, shells complete them, a typo gets Click's error.
# (a short metavar and the choices in the help: see hyfl.cli's Loss)
Loss = Annotated[str, typer.Option(click_type=click.Choice(list(LOSS_NAMES)), metavar="LOSS",
                                   help=f"Loss function: {', '.join(LOSS_NAMES)}.")]
Lam = Annotated[float, typer.Option(help="Regularization; 0 = the data's default.")]
Param = Annotated[
    list[str] | None,
    typer.Option(help="HyFDCA hyperparameter KEY=VALUE (local_steps, iic, step_rule, and "
                 "others); "
                 "repeatable. Without it: HyFDCA's defaults (step_rule=cocoa)."),
]
Cipher = Annotated[str, typer.Option(click_type=click.Choice(list(CIPHER_NAMES)),
                                     metavar="CIPHER", help=f"Cipher: {', '.join(CIPHER_NAMES)} "
                                     "(none: no encryption, tests).")]
ReplyTimeout = Annotated[
    float, typer.Option(help="Seconds a party has to answer a message before it counts as absent "
                        "for the round.")
]
Insecure = Annotated[bool, typer.Option("--insecure", help="No TLS (loopback and tests only).")]
RootCerts = Annotated[
    Path | None, typer.Option(help="CA certificate that signed the SuperLink's TLS certificate.")
]
DeployIntercept = Annotated[
    str | None, typer.Option(metavar="S|off", help="Bias: a constant feature of value S, held "
                             "by each sample's first holder (as hyfl run --intercept S) "
                             "(default off; block files: as they were split).", show_default=False)
]
DeployStandardize = Annotated[
    bool, typer.Option("--standardize", help="Divide every feature by its standard deviation, "
                       "from a secure sum of the parties' column sums (reveals each feature's "
                       "mean and deviation to all).")
]
InsecureKeys = Annotated[
    bool, typer.Option("--insecure-test-keys", help="Admit Paillier keys below 2048 bits (tests "
                       "only; every output then carries a warning).")
]


def _fail(err: HyflError) -> None:
    console.print(f"[bold red]error:[/] {escape(str(err))}")
    raise typer.Exit(code=2)


def _named(names: list[str], k) -> str:
    """Party ``k``'s name (its file's), or ``k`` itself if it has none."""
    try:
        return names[int(k)]
    except (IndexError, TypeError, ValueError):
        return str(k)


def _warn(line: str) -> None:
    console.print(f"[bold yellow]{escape(line)}[/]")


def _hyper(params: list[str] | None) -> str:
    for item in params or []:
        if "=" not in item:
            raise fail(f"--param {item!r}", "is not KEY=VALUE", "Write e.g. --param local_steps=2.")
    return ",".join(params or [])


def _quoted(path: str | Path) -> str:
    text = str(path)
    if "'" in text:
        raise fail(f"path {text!r}", "contains a single quote", "Use a path without quotes.")
    return f"'{text}'"


def _exec(command: list[str], env: dict[str, str]) -> None:
    """Replace this process by a Flower program (signals then go straight to it)."""
    console.print(f"[dim]{escape(' '.join(command))}[/]")
    sys.stdout.flush()
    os.execve(command[0], command, env)


# ----------------------------------------------------------------------------- keys, split


@app.command()
def keys(
    out: Annotated[Path, typer.Option(help="Folder for private-key.json and public-key.json.")] =
    Path("hyfl-keys"),
    key_bits: Annotated[int, typer.Option(help="Paillier modulus size (>= 2048; smaller only "
                                          "with --insecure-test-keys).")] = 2048,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing keys.")] = False,
    insecure_test_keys: InsecureKeys = False,
    cipher: Annotated[str, typer.Option(click_type=click.Choice(list(KEY_SCHEME_NAMES)),
                                        help="Key scheme: packed uses paillier keys; ckks "
                                        "ignores --key-bits (128-bit parameters).")] =
    "paillier",
):
    """Generate a key pair: private-key.json for every party, public-key.json for the server."""
    from hyfl.deploy.keys import KEY_SCHEMES, SECURE_KEY_BITS, generate_keys, insecure_warning

    try:
        private, public = generate_keys(out, key_bits, overwrite=overwrite,
                                        insecure_test_keys=insecure_test_keys, cipher=cipher)
    except HyflError as err:
        _fail(err)
    if KEY_SCHEMES[cipher] == "paillier" and key_bits < SECURE_KEY_BITS:
        _warn(insecure_warning(key_bits))
    console.print(f"private key (give to every party, never to the server): {private}")
    console.print(f"public key (give to the server): {public}")


@app.command()
def split(
    data: Annotated[str, typer.Option(help="Dataset name, LIBSVM file or parties:... spec.")],
    out: Annotated[Path, typer.Option(help="Folder for party-K.npz.")] = Path("hyfl-parties"),
    partition: Annotated[str | None, typer.Option(help="Partition spec, e.g. grid:2x2 (party "
                                                  "files bring their own).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the partition's sample permutation.")] = 0,
    loss: Loss = "hinge",
    data_dir: Annotated[str | None, typer.Option(help="Folder with dataset files.")] = None,
    intercept: DeployIntercept = None,
    standardize: DeployStandardize = False,
):
    """Write one block file per party (its samples, features, block and labels): all a party's
    machine needs of the data."""
    from hyfl.data import fallback_lambda, is_party_spec, lambda_for, load_data, load_party_spec
    from hyfl.data.dataset import parse_intercept
    from hyfl.deploy.blocks import prepare_data, write_blocks

    try:
        if is_party_spec(data):
            if partition is not None:
                raise fail("--partition", "was given, but party files bring their own",
                           "Leave --partition out with party files.")
            dataset, parts = load_party_spec(data)
            lam = fallback_lambda(dataset.X.shape[0])
        else:
            if partition is None:
                raise fail("--partition", "is not set", "Pass a spec such as grid:2x2.")
            dataset, parts = load_data(data, data_dir), None
            lam = lambda_for(data, dataset.X.shape[0])
        bias = parse_intercept(intercept or "off") or 0.0
        dataset, problem, parts, scale = prepare_data(
            dataset, loss, lam, partition=parts, spec=partition or "", seed=seed,
            intercept=bias, standardize=standardize)
        paths = write_blocks(problem, parts, out, name=dataset.name, lam_default=lam,
                             intercept=bias, scale=scale)
    except HyflError as err:
        _fail(err)
    for path in paths:
        console.print(str(path))
    console.print(f"{len(paths)} parties, {problem.n_samples} samples, {problem.n_features} "
                  f"features; start the run with parties={len(paths)}")


# ----------------------------------------------------------------------------- server side


@app.command()
def superlink(
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0: all).")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="The one port of parties, CLI and ServerApp.")] = 8000,
    insecure: Insecure = False,
    ssl_ca_certfile: Annotated[Path | None, typer.Option(help="CA certificate.")] = None,
    ssl_certfile: Annotated[Path | None, typer.Option(help="The SuperLink's certificate.")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="The SuperLink's private key.")] = None,
    enable_supernode_auth: Annotated[bool, typer.Option(
        "--enable-supernode-auth", help="Admit only SuperNodes whose public key was registered "
        "with `flwr supernode register` (needs TLS).")] = False,
    database: Annotated[Path | None, typer.Option(help="SQLite file for the SuperLink's state "
                                                  "(registered SuperNodes, runs); default: in "
                                                  "memory, lost on restart.")] = None,
):
    """Start Flower's SuperLink (the coordinator's server), with TLS or --insecure."""
    from hyfl.deploy.local import flower_command, flower_env

    try:
        env = flower_env(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
        command = [flower_command("flower-superlink", env), "--host", host, "--port", str(port),
                   "--disable-runtime-dependency-installation"]
        if database is not None:
            command += ["--database", str(database.resolve())]
        tls = [ssl_ca_certfile, ssl_certfile, ssl_keyfile]
        if enable_supernode_auth:
            if insecure or not all(tls):
                raise fail("--enable-supernode-auth", "needs TLS",
                           "Pass --ssl-ca-certfile, --ssl-certfile and --ssl-keyfile (Flower "
                           "authenticates SuperNodes only over TLS).")
            command.append("--enable-supernode-auth")
        if insecure:
            command.append("--insecure")
        elif all(tls):
            command += ["--ssl-ca-certfile", str(ssl_ca_certfile.resolve()),
                        "--ssl-certfile", str(ssl_certfile.resolve()),
                        "--ssl-keyfile", str(ssl_keyfile.resolve())]
        else:
            raise fail("TLS", "is not configured",
                       "Pass --ssl-ca-certfile, --ssl-certfile and --ssl-keyfile, or --insecure "
                       "on loopback (see docs/deployment.md for the certificates).")
    except HyflError as err:
        _fail(err)
    _exec(command, env)


@app.command()
def party(
    party: Annotated[int, typer.Option(help="This party's index, from 0.")],
    superlink: Annotated[str, typer.Option(help="The SuperLink's HOST:PORT.")],
    key: Annotated[Path | None, typer.Option(help="private-key.json (from hyfl deploy keys).")] =
    None,
    cipher: Annotated[str | None, typer.Option(help="This party's cipher policy: paillier "
                                               "(default with --key) | packed | ckks | none (no "
                                               "key; tests). Jobs asking for another are "
                                               "refused.")] =
    None,
    fingerprint: Annotated[str | None, typer.Option(help="Pin the key fingerprint this party "
                                                    "accepts (from public-key.json).")] = None,
    insecure_test_keys: InsecureKeys = False,
    data: Annotated[str | None, typer.Option(help="This party's own file (CSV or Parquet with "
                                             "an id column; the parties align their files "
                                             "over the network), its block file "
                                             "(party-K.npz), or a dataset name (with the job's "
                                             "partition spec): the only data the party reads.")
                    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder with dataset files, for a "
                                                  "dataset name.")] = None,
    id_column: Annotated[str, typer.Option(help="The party file's sample id column.")] = "id",
    label_column: Annotated[str, typer.Option(help="The party file's label column, if it has "
                                              "one.")] = "label",
    out: Annotated[Path | None, typer.Option(help="Folder for the party's final duals and "
                                             "weights (party-K.npz).")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="Folder where the party keeps its "
                                                   "state of each run (private to you), so "
                                                   "that it rejoins its run after a restart "
                                                   "of its SuperNode.")] = None,
    unchecked_rules: Annotated[bool, typer.Option(
        "--unchecked-rules", help="Admit jobs with a per-sample step rule (safe, theory, "
        "paper), whose stored duals this party cannot check against a dishonest server.")
    ] = False,
    insecure: Insecure = False,
    root_certificates: RootCerts = None,
    port: Annotated[int, typer.Option(help="Local port of this SuperNode's own API (one per "
                                      "SuperNode on a machine).")] = 9094,
    poll: Annotated[float | None, typer.Option(help="Longest idle poll of the SuperNode in "
                                               "seconds (Flower: 3; patched, Flower 1.41.0 "
                                               "only; default 0.1 with the worker).")] = None,
    per_message: Annotated[bool, typer.Option(
        "--per-message", help="Handle each message in a new Flower ClientApp process instead "
        "of this party's long-lived worker (the default).")] = False,
    # --worker names the default; hidden, as the pair's second column cut the help's
    # descriptions below 26 characters at 80 columns.
    worker: Annotated[bool, typer.Option("--worker", hidden=True)] = False,
    worker_process: Annotated[bool, typer.Option(
        "--worker-process", help="Run the worker in a process of its own, restarted if it "
        "dies, instead of in the SuperNode's process, where a crash (a native fault, out of "
        "memory) ends the SuperNode too; slower.")] = False,
    node_key: Annotated[Path | None, typer.Option(
        help="This SuperNode's ECDSA key (ssh-keygen -t ecdsa -b 384) for a SuperLink with "
        "supernode auth; register its .pub with `flwr supernode register`.")] = None,
    # Flower's name for --node-key, accepted too; hidden, as its length cut the help's flag
    # column at 80 columns.
    auth_supernode_private_key: Annotated[Path | None, typer.Option(hidden=True)] = None,
):
    """Start one party: a Flower SuperNode with this party's node config, and the party's
    long-lived worker that handles its messages (in the SuperNode's process; with
    --worker-process in its own, restarted if it dies)."""
    from hyfl.deploy.config import NodeSettings
    from hyfl.deploy.keys import KEY_SCHEMES, party_cipher
    from hyfl.deploy.local import flower_command, flower_env

    try:
        env = flower_env(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
        node = [f"party={party}"]
        if key is not None:
            if not key.is_file():
                raise fail(f"--key {key}", "does not exist",
                           "Pass the private-key.json from `hyfl deploy keys`.")
            # Check the key file now (its scheme: Paillier unless --cipher ckks).
            party_cipher(cipher if cipher in KEY_SCHEMES else "paillier", key,
                         insecure_test_keys=insecure_test_keys)
            node.append(f"key={_quoted(key.resolve())}")
        policy = {"cipher": cipher, "fingerprint": fingerprint}
        node += [f"{name}={_quoted(value)}" for name, value in policy.items() if value]
        if insecure_test_keys:
            node.append("insecure-test-keys=true")
            _warn("this party admits insecure test keys (< 2048 bits): tests only")
        if unchecked_rules:
            node.append("unchecked-rules=true")
            _warn("this party admits the per-sample step rules, whose stored duals it cannot "
                  "check: trust the server")
        NodeSettings.from_node_config({"party": party, "key": str(key or ""),
                                       "cipher": cipher or "", "fingerprint": fingerprint or ""})
        if data is not None:
            resolved = Path(data)
            node.append(f"data={_quoted(resolved.resolve() if resolved.exists() else data)}")
        if data_dir is not None:
            node.append(f"data-dir={_quoted(data_dir.resolve())}")
        node += [f"id-column={_quoted(id_column)}", f"label-column={_quoted(label_column)}"]
        if out is not None:
            node.append(f"out={_quoted(out.resolve())}")
        if state_dir is not None:
            node.append(f"state-dir={_quoted(state_dir.resolve())}")
        if worker and per_message:
            raise fail("--worker and --per-message", "were both given", "Give one of them.")
        if worker_process and per_message:
            raise fail("--worker-process and --per-message", "were both given",
                       "Give one of them.")
        worker = not per_message
        if not worker:
            _warn("--per-message: every user of this machine can take this party's tasks and "
                  "saved state from its Runtime API (Flower's subprocess isolation takes no "
                  "secret); the worker (the default) closes it")
        if worker:
            env["HYFL_SUPERNODE_POLL"] = str(0.1 if poll is None else poll)
            command = [sys.executable, "-m", "hyfl.deploy.supernode",
                       "--hyfl-worker-process" if worker_process else "--hyfl-worker"]
        elif poll is None:
            command = [flower_command("flower-supernode", env)]
        else:
            env["HYFL_SUPERNODE_POLL"] = str(poll)
            command = [sys.executable, "-m", "hyfl.deploy.supernode"]
        command += ["--superlink", superlink, "--port", str(port), "--node-config", " ".join(node)]
        if node_key is not None and auth_supernode_private_key is not None:
            raise fail("--node-key and --auth-supernode-private-key", "were both given",
                       "Give one (they are the same option).")
        node_key = node_key if node_key is not None else auth_supernode_private_key
        if node_key is not None:
            if not node_key.is_file():
                raise fail(f"--node-key {node_key}",
                           "does not exist", "Create it with ssh-keygen -t ecdsa -b 384 -N '' "
                           "-f supernode-key and register supernode-key.pub.")
            command += ["--auth-supernode-private-key", str(node_key.resolve())]
        if insecure:
            command.append("--insecure")
        elif root_certificates is not None:
            command += ["--root-certificates", str(root_certificates.resolve())]
        else:
            raise fail("TLS", "is not configured",
                       "Pass --root-certificates CA.crt (the CA of the SuperLink's certificate), "
                       "or --insecure on loopback.")
    except HyflError as err:
        _fail(err)
    from hyfl.deploy.local import reaped

    # Under the reaper: a SuperNode that dies takes its SuperExec and ClientApps along.
    _exec(reaped(command, watch_parent=False), env)


@app.command()
def run(
    superlink: Annotated[str, typer.Option(help="The SuperLink's HOST:PORT.")],
    parties: Annotated[int, typer.Option(help="Number of parties.")],
    out: Annotated[Path, typer.Option(help="Results folder, on the SuperLink's machine "
                                      "(deploy.json, weights.npz).")],
    public_key: Annotated[Path | None, typer.Option(help="public-key.json, on the SuperLink's "
                                                    "machine.")] = None,
    iterations: Iterations = 10,
    participation: Participation = "full",
    seed: Seed = 0,
    loss: Loss = "hinge",
    lam: Lam = 0.0,
    param: Param = None,
    cipher: Cipher = "paillier",
    partition: Annotated[str, typer.Option(help="Partition spec, for parties whose node config "
                                           "names a dataset.")] = "",
    intercept: DeployIntercept = None,
    standardize: DeployStandardize = False,
    reply_timeout: ReplyTimeout = 120.0,
    insecure: Insecure = False,
    root_certificates: RootCerts = None,
    insecure_test_keys: InsecureKeys = False,
):
    """Submit a HyFDCA job to a running SuperLink and follow it round by round.

    Run it on the coordinator's machine: the ServerApp writes OUT/deploy.json there
    after every round, and this command shows each round from it (flwr run's own
    output goes to OUT/flwr-run.log). Exit code 0 when the run learned; 3 when it
    completed without progress (no round accepted: the objective needs the data, which
    the coordinator does not have); 1 when it failed, 2 on bad input.
    """
    import subprocess
    import time

    from hyfl._private_files import open_private, private_folder, write_private_text
    from hyfl.data.dataset import parse_intercept
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.flower_app import toml_value
    from hyfl.deploy.local import (
        CONNECTION,
        flower_command,
        flower_env,
        wait_for_results,
        write_app,
        write_connection,
    )
    from hyfl.deploy.report import RoundDisplay, judge_progress, summarize

    try:
        if not insecure and root_certificates is None:
            raise fail("TLS", "is not configured",
                       "Pass --root-certificates CA.crt, or --insecure on loopback.")
        out = out.resolve()
        config = run_config_for(
            parties=parties, iterations=iterations, participation=participation, seed=seed,
            loss=loss, lam=lam, hyper=_hyper(param), cipher=cipher, partition=partition,
            intercept=parse_intercept(intercept or "off") or 0.0, standardize=standardize,
            reply_timeout=reply_timeout, out=str(out),
            public_key=str(public_key.resolve()) if public_key is not None else "",
            insecure_test_keys=insecure_test_keys,
        )
        job = DeployConfig.from_run_config(config)  # fail here rather than on the SuperLink
        try:
            # The server's weights and flwr run's log: owner only (hyfl._private_files).
            private_folder(out)
        except OSError as err:
            raise fail(f"--out {out}", f"cannot be created ({err.strerror})",
                       "Pass a folder on this machine (the coordinator's) that you can write "
                       "to.") from None
        work = Path(tempfile.mkdtemp(prefix="hyfl-deploy-run-"))
        env = flower_env(work / "flwr_home")
        write_connection(work / "flwr_home", superlink,
                         root_certificates=None if insecure else root_certificates)
        write_app(work / "app")
        overrides = work / "run-config.toml"
        write_private_text(overrides, "".join(f"{k} = {toml_value(v)}\n"
                                              for k, v in config.items()))
        command = [flower_command("flwr", env), "run", str(work / "app"), CONNECTION, "--stream",
                   "--run-config", str(overrides)]
    except HyflError as err:
        _fail(err)
    log_file = out / "flwr-run.log"
    console.print(f"{parties} parties, {iterations} rounds, step rule "
                  f"{job.algorithm.step_rule}, cipher {cipher}; flwr run's output: {log_file}")
    submitted = time.time()
    try:
        with open_private(log_file, "ab") as log, RoundDisplay(console, iterations) as display:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                results = wait_for_results(process, out, log_file, on_progress=display.show,
                                           fresh_after=submitted)
            finally:
                if process.poll() is None:  # Ctrl-C or an error here: stop following
                    process.terminate()
                    try:
                        process.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        process.kill()
    except HyflError as err:
        console.print(f"[bold red]error:[/] {escape(str(err))}")
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: no longer following the run (the SuperLink "
                      "may still be running it)")
        raise typer.Exit(code=130) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(summarize(results), judge_progress(results), results.get("warnings", []),
            [f"results in {out} (deploy.json, weights.npz)"])


def _report(summary: dict, judgement, warnings: list[str], notes: list[str]) -> None:
    """Print the summary table, warnings and notes; exit 3 if the run did not learn."""
    from hyfl.deploy.report import NO_PROGRESS_EXIT, summary_table

    console.print(summary_table(summary))
    for line in warnings:
        _warn(line)
    for line in notes:
        console.print(escape(line))
    if not judgement.progressed:
        console.print(f"[bold yellow]{escape(judgement.message())}[/]")
        raise typer.Exit(code=NO_PROGRESS_EXIT)


# ----------------------------------------------------------------------------- app


def _server_path(path: Path | None) -> str | None:
    """A path for the run config: absolute (the ServerApp does not run in this folder)."""
    return None if path is None else str(path.resolve())


@app.command("app")
def flower_app(
    out: Annotated[Path, typer.Argument(help="Folder for the Flower App project.")],
    parties: Annotated[int | None, typer.Option(min=1, help="Number of parties K (else set "
                                                "at flwr run).")] = None,
    iterations: Annotated[int | None, typer.Option(help="Outer iterations (rounds).")] = None,
    participation: Annotated[str | None, typer.Option(help="full | fraction p | cyclic:C | "
                                                      "trace:FILE.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the schedule and the draws.")] = None,
    loss: Annotated[str | None, typer.Option(help="hinge | logistic | squared | "
                                             "smoothed_hinge.")] = None,
    lam: Annotated[float | None, typer.Option(help="Regularization; 0 = the data's "
                                              "default.")] = None,
    param: Param = None,
    cipher: Annotated[str | None, typer.Option(help="paillier | packed | ckks | none (none: "
                                               "no encryption, tests).")] = None,
    public_key: Annotated[Path | None, typer.Option(help="public-key.json, on the SuperLink's "
                                                    "machine.")] = None,
    partition: Annotated[str | None, typer.Option(help="Partition spec, for parties whose "
                                                  "node config names a dataset.")] = None,
    results: Annotated[Path | None, typer.Option(help="Results folder (run config out), on "
                                                 "the SuperLink's machine.")] = None,
    reply_timeout: Annotated[float | None, typer.Option(help="Seconds a party has to answer "
                                                        "a message.")] = None,
    insecure_test_keys: InsecureKeys = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Write into a non-empty "
                                            "folder (replaces the generated files).")] = False,
):
    """Write a Flower App project (pyproject.toml, hyfl_app/, README.md) to run with
    `flwr run OUT CONNECTION`; flags set its run config defaults."""
    from hyfl.deploy.flower_app import write_flower_app

    try:
        # None leaves a key at its default (RUN_DEFAULTS); flwr run --run-config overrides.
        folder = write_flower_app(out, {
            "parties": parties, "iterations": iterations, "participation": participation,
            "seed": seed, "loss": loss, "lam": lam, "hyper": _hyper(param) if param else None,
            "cipher": cipher, "public-key": _server_path(public_key),
            "partition": partition, "out": _server_path(results), "reply-timeout": reply_timeout,
            "insecure-test-keys": insecure_test_keys or None,
        }, overwrite=overwrite)
    except HyflError as err:
        _fail(err)
    if insecure_test_keys:
        _warn("this app admits insecure test keys (< 2048 bits): tests only")
    console.print(f"Flower App in {folder} (pyproject.toml, hyfl_app/, README.md); run it with")
    console.print(f'  flwr run {folder} CONNECTION --stream --run-config "key=value ..."')
    console.print("(CONNECTION: a SuperLink in $FLWR_HOME/config.toml; see README.md)")


# ----------------------------------------------------------------------------- local


@app.command()
def local(
    parties: Annotated[int | None, typer.Option(help="Number of parties (default: one per "
                                                "block file, or the partition's clients).")] = None,
    data: Annotated[str, typer.Option(help="Dataset every party cuts its block from, or party "
                                      "files: a party spec as hyfl run --data takes it "
                                      "(parties:FOLDER or parties:a.csv,b.parquet, options "
                                      ";id=COL ;label=COL and others; each party aligns "
                                      "its own file over the network).")] =
    "breast_cancer",
    partition: Annotated[str | None, typer.Option(help="Partition spec (K*Q = parties), "
                                                  "e.g. grid:2x2 [default: grid:(N/2)x2 "
                                                  "for an even N >= 4, else vertical:N].",
                                                  show_default=False)] = None,
    party_data: Annotated[Path | None, typer.Option(help="Folder of block files party-K.npz "
                                                    "(from hyfl deploy split) instead of "
                                                    "--data/--partition.")] = None,
    iterations: Iterations = 5,
    participation: Participation = "full",
    seed: Seed = 0,
    loss: Loss = "hinge",
    lam: Lam = 0.0,
    param: Param = None,
    intercept: DeployIntercept = None,
    standardize: DeployStandardize = False,
    # ckks: about 1.2x the plaintext's time where per-value Paillier takes minutes a round,
    # and no raw decryption reaches the server (docs/deployment.md, "Which cipher").
    cipher: Annotated[str, typer.Option(click_type=click.Choice(list(CIPHER_NAMES)),
                                        metavar="CIPHER",
                                        help="Cipher: ckks (the default: fast, 128-bit "
                                        "lattice), packed or paillier (Paillier, exact; "
                                        "slower), none (no encryption, tests).")] = "ckks",
    key_bits: Annotated[int, typer.Option(help="Paillier key size of a generated key pair "
                                          "(>= 2048; smaller only with "
                                          "--insecure-test-keys).")] = 2048,
    keys_dir: Annotated[Path | None, typer.Option("--keys", help="Use this key folder instead "
                                                  "of OUT/keys.")] = None,
    insecure_test_keys: InsecureKeys = False,
    reply_timeout: ReplyTimeout = 120.0,
    out: Annotated[Path, typer.Option(help="Folder for results, logs and keys (OUT/keys is "
                                      "reused if it exists).")] = Path("hyfl-deploy"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the results of an "
                                            "earlier run in OUT (its keys are kept).")] = False,
    compare: Annotated[bool, typer.Option("--compare", help="Also run the in-process protocol "
                                          "engine with the same seed and compare iterates and "
                                          "time per round.")] = False,
    node_poll: Annotated[float, typer.Option(help="Longest SuperNode idle poll in seconds "
                                             "(0: Flower's own 3 s and its ClientApp process "
                                             "per message).")] = 0.1,
    worker: Annotated[bool, typer.Option("--worker/--per-message", help="Each party's messages "
                                         "go to its long-lived worker (default), or to a new "
                                         "Flower ClientApp process each.")] = True,
    worker_process: Annotated[bool, typer.Option(
        "--worker-process", help="Run each party's worker in a process of its own, restarted "
        "if it dies (a crash then spares the SuperNode), instead of in its SuperNode's "
        "process (about half the time a message).")] = False,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] =
    None,
):
    """Start a SuperLink and one SuperNode per party on loopback, run a job, write results
    (deploy.json, weights.npz, metrics.csv, model.npz) and stop every process again.

    Shows each round as it ends (with the relative loss of its w: the data are on this
    machine) and a summary. Exit code 0 when the run learned; 3 when it completed
    without progress (no round accepted, or the objective did not fall; the results are
    written all the same, and the message says what to change); 2 on errors.
    """
    from hyfl.data.dataset import parse_intercept
    from hyfl.deploy.local import party_names, run_local
    from hyfl.deploy.report import RoundDisplay

    def interrupted(signum, frame):  # leave through the clean-up below, whatever the signal
        raise KeyboardInterrupt

    # Flower's processes run in sessions of their own (a Ctrl-C reaches only this
    # process), so this process must stop them: on SIGINT and SIGTERM alike.
    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    names = party_names(data, party_data)  # party files: shown by their names, not numbers
    try:
        with RoundDisplay(console, iterations, show_loss=True) as display:
            def show(record, loss):
                if names:
                    record = {**record, **{key: [_named(names, k) for k in record.get(key, [])]
                                           for key in ("active", "absent")}}
                display.show(record, loss)

            if worker_process and not worker:
                raise fail("--worker-process and --per-message", "were both given",
                           "Give one of them.")
            if worker_process and node_poll <= 0:
                raise fail("--worker-process and --node-poll 0", "were both given",
                           "--node-poll 0 runs Flower's own ClientApp process per message: "
                           "give one of them.")
            outcome = run_local(
                out=out, parties=parties, data=data, partition=partition,
                party_data=party_data, iterations=iterations, participation=participation,
                seed=seed, loss=loss, lam=lam, hyper=_hyper(param), cipher=cipher,
                intercept=parse_intercept(intercept) if intercept is not None else None,
                standardize=standardize,
                key_bits=key_bits, keys_dir=keys_dir, insecure_test_keys=insecure_test_keys,
                overwrite=overwrite, reply_timeout=reply_timeout, compare=compare,
                node_poll=node_poll if node_poll > 0 else None, worker=worker,
                separate_worker=worker_process, timeout=timeout,
                log=lambda line: console.print(escape(line)), on_round=show,
            )
    except HyflError as err:
        _fail(err)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: every Flower process was stopped")
        raise typer.Exit(code=130) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    written = "deploy.json, weights.npz, metrics.csv, model.npz, parties/"
    _report(outcome.summary, outcome.judgement, outcome.warnings,
            [f"results in {outcome.out} ({written}"
             f"{', comparison.json' if outcome.comparison else ''})"])


# ----------------------------------------------------------------------------- predict


@app.command()
def predict(
    model: Annotated[Path, typer.Argument(help="A model.npz trained on party files (hyfl run "
                                          "or deploy local --data parties:...).",
                                          metavar="MODEL", show_default=False)],
    data: Annotated[str, typer.Option(help="The parties' files of new rows, one per party "
                                      "(parties:a.csv,b.parquet;id=patient or a folder), "
                                      "labels optional.", show_default=False)],
    asker: Annotated[int, typer.Option(help="The party (its place in --data) that gets the "
                                       "scores of the rows it holds.")] = 0,
    cipher: Annotated[str, typer.Option(click_type=click.Choice(list(CIPHER_NAMES)),
                                        metavar="CIPHER", help="The parties' cipher policy; "
                                        "its key authenticates the alignment by the parties' "
                                        "shared secret. none: unauthenticated, an active "
                                        "server could read the parts (trials only).")] = "ckks",
    keys_dir: Annotated[Path | None, typer.Option("--keys", help="Key folder of hyfl deploy "
                                                  "keys (default: OUT/keys, made when "
                                                  "absent, as hyfl deploy local).")] = None,
    insecure_test_keys: InsecureKeys = False,
    reply_timeout: ReplyTimeout = 120.0,
    out: Annotated[Path, typer.Option(help="Folder of the parties' outputs: the asker writes "
                                      "OUT/party-K/predictions.csv.")] = Path("hyfl-predict"),
    flower: Annotated[bool, typer.Option("--flower/--in-process", help="Run the parties over "
                                         "Flower on loopback (a SuperLink, one SuperNode "
                                         "process per party, as hyfl deploy local), or in "
                                         "this process (each with only its own file and "
                                         "state).")] = False,
    timeout: Annotated[float | None, typer.Option(help="With --flower: give up after this "
                                                  "many seconds.")] = None,
):
    """Score new rows with the parties' own files, without pooling them.

    The parties align their files as for training (blinded ids, pairwise channel keys),
    then each computes its part of every margin of the asker's rows (its cells times its
    block of the weights), masks it with pairwise masks that cancel only in the sum of
    all parties' parts and seals it for the asker; the server relays the sealed parts.
    The asker adds them up and writes, per row it holds, its id, the prediction (the
    label's own value), the score and for a logistic model the class probabilities:
    the rows ``hyfl predict`` writes for the pooled files. The server sees no score, no
    part and no id. The parties run in this process, each with only its own file and
    state, every message through the deployment's codec, or with --flower as separate
    processes over Flower on loopback (docs/deployment.md, "Scoring new rows").
    """
    from hyfl.deploy.scoring_local import predict_local

    try:
        done = predict_local(model, data, out, asker=asker, cipher=cipher, keys_dir=keys_dir,
                             reply_timeout=reply_timeout, insecure_test_keys=insecure_test_keys,
                             flower=flower, timeout=timeout,
                             log=lambda line: console.print(escape(line)))
    except HyflError as err:
        _fail(err)
    console.print(escape(f"party {done['asker']} wrote {done['predictions']} ({done['rows']} "
                         f"predictions of {done['n_samples']} aligned samples)"))
