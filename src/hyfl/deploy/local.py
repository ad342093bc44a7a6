"""A whole deployment on one machine: SuperLink, one SuperNode per party, ``flwr run``.

:class:`LocalDeployment` starts Flower's processes on loopback (insecure),
each in its own process group, submits the job with ``flwr run`` and stops
everything again -- also when the job fails or the user presses Ctrl-C (the
process groups are terminated, then killed, until none of their processes is
left). Each Flower command runs under a watchdog (:func:`reaped`,
:mod:`hyfl.deploy._reaper`), so its processes die with this one even when
it is killed with SIGKILL, and a SuperNode's helpers die with the SuperNode.
``hyfl deploy local`` and the tests use it; the same pieces
(:func:`write_app`, :func:`write_connection`, :func:`flower_env`) serve
``hyfl deploy run`` against a remote SuperLink.

Flower 1.41 needs, besides the installed packages:

* a Flower App project: :func:`write_app` writes the one ``hyfl deploy app``
  writes (:mod:`hyfl.deploy.flower_app`), whose components re-export hyfl's;
* ``$FLWR_HOME/config.toml`` naming the SuperLink connection for ``flwr run``
  (:func:`write_connection`); every deployment gets its own ``FLWR_HOME``;
* the interpreter's ``bin`` folder on ``PATH``: SuperLink and SuperNodes
  start ``flower-superexec``, ``flwr-serverapp`` and ``flwr-clientapp`` by name.

**Who else can reach it.** Every port listens on 127.0.0.1 only (the
SuperLink's one HTTP port, each SuperNode's Runtime API; Flower's legacy
gRPC servers, which would listen on 0.0.0.0, stay off), so no other machine
can. Of the other users of *this* machine: the SuperLink's Control API (what
``flwr run`` calls, which submits jobs that run as the deploying user) admits
only requests bearing a token of this deployment (:mod:`hyfl.deploy.superlink`;
open-source Flower has no authentication of its own there), which only the
deploying user holds (``FLWR_HOME/credentials.yaml``, 0600 in a 0700 folder,
:meth:`LocalDeployment.write_control_credentials`). The same port's Fleet API
lets anyone join as one more SuperNode (without the parties' key it cannot
make a party's announcement, so at most it stops the run; a party's SuperNode
signs its requests with a key pair held in its memory, so nobody can act as
it), and its Runtime API (the ServerApp's)
hands a run's task only to the deployment's own SuperExec, which shares a secret
with the SuperLink (:func:`hyfl.deploy.superlink.own_superexec`), and whose
ServerApps get their token as an in-memory file, on no command line
(:mod:`hyfl.deploy.superexec`).
Each party's Runtime API hands its tasks only to its worker, which holds the
party's secret (:func:`hyfl.deploy.supernode.runtime_api_secret`); with
``worker=False`` it hands them to anyone. :data:`REACHABLE` says so in the
deployment's output; docs/deployment.md ("Who can reach a local deployment")
has the details.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyfl._io import check_results_folder, read_npz
from hyfl._private_files import (
    open_private,
    private_folder,
    private_write,
    write_private_json,
    write_private_text,
)
from hyfl.deploy.coordinator import LATEST_WEIGHTS
from hyfl.deploy.flower_app import APP_COMPONENTS, write_flower_app
from hyfl.deploy.flower_app import toml_value as _toml_value
from hyfl.deploy.superlink import TOKEN_OPTION
from hyfl.errors import HyflError, fail

__all__ = [
    "APP_COMPONENTS",
    "LocalDeployment",
    "assemble",
    "reaped",
    "compare_with_protocol",
    "LocalRun",
    "run_local",
    "deployment_metrics",
    "flower_env",
    "party_file_nodes",
    "read_results",
    "write_app",
    "write_connection",
    "write_metrics",
]

CONNECTION = "hyfl-local"
#: Said at the start of every local deployment (format with ``address``).
REACHABLE = ("SuperLink on {address} (loopback only: no other machine can reach it). Control "
             "API (flwr run: jobs run as you): owner only, each request needs this "
             "deployment's token, kept in {credentials} (mode 0600). Fleet API (same port): "
             "any local user can join as one more SuperNode; without the parties' key it cannot "
             "make a party's announcement (at most it stops the run), nor act as an existing "
             "party's SuperNode. ServerAppIo API (same port): owner only, a run's task goes "
             "only to this deployment's SuperExec (a secret shared with the SuperLink), and "
             "its token is on no command line.")
#: Flower 1.41's switches for its legacy gRPC servers, which listen on 0.0.0.0.
_LEGACY_GRPC = ("FLWR_INTERNAL_GRPC_CONTROL_API", "FLWR_INTERNAL_GRPC_FLEET_API")


def write_app(app_dir: str | os.PathLike, defaults: Mapping[str, Any] | None = None) -> Path:
    """Write the Flower App a deployment submits, into a working folder of its own.

    The project of ``hyfl deploy app`` (:func:`~hyfl.deploy.flower_app.write_flower_app`),
    its run config defaults :data:`~hyfl.deploy.config.RUN_DEFAULTS` updated with
    ``defaults``; its files are replaced if the folder has them already.
    """
    return write_flower_app(app_dir, defaults, overwrite=True)


def write_connection(flwr_home: str | os.PathLike, address: str, *, name: str = CONNECTION,
                     root_certificates: str | os.PathLike | None = None) -> Path:
    """Write ``$FLWR_HOME/config.toml`` with one SuperLink connection (the default).

    Without ``root_certificates`` the connection is insecure (loopback tests);
    with it, TLS against that CA certificate (an absolute path is written).
    """
    home = private_folder(flwr_home)
    lines = ["[superlink]", f"default = {_toml_value(name)}", "", f"[superlink.{name}]",
             f"address = {_toml_value(address)}"]
    if root_certificates is None:
        lines.append("insecure = true")
    else:
        ca = Path(root_certificates).resolve()
        if not ca.is_file():
            raise fail(f"CA certificate {ca}", "does not exist",
                       "Pass the certificate of the CA that signed the SuperLink's certificate.")
        lines.append(f"root-certificates = {_toml_value(str(ca))}")
    return write_private_text(home / "config.toml", "\n".join(lines) + "\n")


def quiet_flower_import():
    """A context that imports Flower without protobuf's gencode-version UserWarnings (its
    generated ``flwr/proto`` modules are one major version older than the installed runtime,
    which works with them: nine lines of noise at every ``hyfl deploy local``). Only those
    warnings, raised by ``google.protobuf.runtime_version``, are silenced; every other
    warning shows."""
    import contextlib
    import warnings

    @contextlib.contextmanager
    def quiet():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Protobuf gencode version ",
                                    category=UserWarning, module=r"google\.protobuf\.")
            yield

    return quiet()


def write_control_credentials(flwr_home: str | os.PathLike, address: str, token: bytes) -> Path:
    """``token`` as the Control API access token of ``address`` in Flower's credential store
    of ``flwr_home`` (``credentials.yaml``), where ``flwr`` looks for an OIDC login's:
    Flower's CLI then sends it as ``Authorization: Bearer`` with every Control API request
    (:mod:`hyfl.deploy.superlink` checks it). The store is written 0600 in a 0700 folder."""
    import base64

    import yaml

    with quiet_flower_import():
        from flwr.cli.constant import (
            ACCESS_TOKEN_STORE_KEY,
            AUTHN_TYPE_STORE_KEY,
            REFRESH_TOKEN_STORE_KEY,
        )
        from flwr.common.constant import AuthnType

    path = private_folder(flwr_home) / "credentials.yaml"
    stored = {}
    if path.is_file():
        stored = yaml.safe_load(path.read_text()) or {}
    # (Flower's FileCredentialStore format: base64 values; the "refresh token" is never
    # used, the SuperLink's token does not expire, but the CLI wants one)
    for key, value in ((AUTHN_TYPE_STORE_KEY, AuthnType.OIDC.encode()),
                       (ACCESS_TOKEN_STORE_KEY, token), (REFRESH_TOKEN_STORE_KEY, token)):
        stored[key % address] = base64.b64encode(value).decode()
    return write_private_text(path, yaml.safe_dump(stored))


def _token_file(token: bytes) -> Path:
    """``token`` in a new 0600 file in a new 0700 folder, for the SuperLink to read (it
    removes the folder at once, :func:`hyfl.deploy.superlink.read_token`)."""
    from hyfl._private_files import write_private_bytes
    from hyfl.deploy.supernode import private_temp_folder

    return write_private_bytes(private_temp_folder("hyfl-superlink-", None) / "control-token",
                               token)


def flower_env(flwr_home: str | os.PathLike, superexec_poll: float = 0.1) -> dict[str, str]:
    """Environment for Flower's processes: private ``FLWR_HOME``, this Python's ``bin`` first."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["FLWR_HOME"] = str(Path(flwr_home).resolve())
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    # SuperExec looks for new tasks every second by default; each message waits for it.
    env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(superexec_poll)
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def flower_command(name: str, env: Mapping[str, str]) -> str:
    """Full path of a Flower executable, or a clear error if Flower is missing."""
    found = shutil.which(name, path=env.get("PATH"))
    if found is None:
        raise fail(f"{name!r}", "was not found", "Install Flower with pip install 'hyfl[flower]'.")
    return found


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _live_processes() -> dict[int, tuple[int, int, str]]:
    """Live (non-zombie) processes: pid -> (parent pid, process group, command line)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            table[int(entry)] = (int(fields[1]), int(fields[2]), cmdline)
    return table


def _group_members(pgid: int) -> list[int]:
    """Live processes of a process group, from /proc."""
    return [pid for pid, (_, group, _) in _live_processes().items() if group == pgid]


def _descendants(root: int) -> dict[int, tuple[int, str]]:
    """Live descendants of ``root``: pid -> (parent pid, command line), from /proc."""
    table = {pid: (parent, cmdline) for pid, (parent, _, cmdline) in _live_processes().items()}
    found, frontier = {}, {root}
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier}
        found.update({pid: table[pid] for pid in frontier})
    return found


REAPER = Path(__file__).with_name("_reaper.py")


def reaped(command: list[str], watch_parent: bool = True) -> list[str]:
    """``command`` run under :mod:`hyfl.deploy._reaper`: it and all it starts die with us.

    The reaper is a small stdlib-only script watching this process; when this
    process dies (SIGKILL included; not with ``watch_parent=False``), when
    the command exits, or when the reaper is told to stop, it kills
    everything the command started (Linux: the whole process tree, also what
    Flower detaches; elsewhere: the process group). On Windows the command is
    returned unchanged.
    """
    if os.name != "posix":
        return list(command)
    parent = str(os.getpid()) if watch_parent else "0"
    return [sys.executable, "-I", "-S", str(REAPER), parent, "--", *command]


def _stop_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """Terminate a process group started with ``start_new_session``; kill what stays."""
    pgid = process.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if process.poll() is None:
                time.sleep(0.1)
                continue
            if not _group_members(pgid):
                return
            time.sleep(0.1)
    process.poll()


def _with_home(home: str) -> list[int]:
    """Live processes whose environment has ``FLWR_HOME=home`` (this deployment's)."""
    found, marker = [], f"FLWR_HOME={home}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if marker in environ and not zombie:
            found.append(int(entry))
    return found


def _stop_stragglers(home: str, grace: float = 10.0) -> None:
    """Terminate, then kill, what is left of a deployment (see :func:`_with_home`)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        left = _with_home(home)
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait
        while left and time.monotonic() < end:
            time.sleep(0.2)
            left = _with_home(home)
        if not left:
            return


class LocalDeployment:
    """SuperLink and SuperNodes on loopback, one per party, in their own process groups.

    Parameters
    ----------
    node_configs : sequence of mapping
        One node config per party (``party``, ``key``, ``data``, ``out``...).
    workdir : path-like
        Folder for ``FLWR_HOME``, the app, node configs and logs.
    log : callable, optional
        Progress lines (default: none).
    superexec_poll : float, default 0.1
        SuperExec's task poll in seconds (Flower's default is 1).
    node_poll : float or None, default 0.1
        Start the SuperNodes through :mod:`hyfl.deploy.supernode` with this
        idle poll in seconds (Flower's is 3 s); None starts plain
        ``flower-supernode`` (Flower's own ClientApp process per message).
    worker : bool, default True
        With ``node_poll`` set: each party's messages are handled by its
        long-lived worker (:mod:`hyfl.deploy.worker`), not by a new ClientApp
        process per message.
    separate_worker : bool, default False
        With ``worker``: the worker runs in a process of its own, which its
        SuperNode restarts when it dies, instead of in the SuperNode's process
        (about half the time a message: see :mod:`hyfl.deploy.supernode`).

    Use it as a context manager (``with LocalDeployment(...) as local:``):
    leaving the block stops every process, also on errors and Ctrl-C.
    """

    def __init__(self, node_configs: Sequence[Mapping[str, Any]], workdir: str | os.PathLike,
                 *, log: Callable[[str], None] | None = None, superexec_poll: float = 0.1,
                 node_poll: float | None = 0.1, worker: bool = True,
                 separate_worker: bool = False):
        self.node_configs = [dict(c) for c in node_configs]
        self.workdir = Path(workdir)
        self.log = log or (lambda line: None)
        self.superexec_poll = superexec_poll
        self.node_poll = node_poll
        self.worker = worker and node_poll is not None
        if separate_worker and not self.worker:
            raise fail("separate_worker", "needs the worker (worker=True and a node_poll)",
                       "Drop --worker-process, or --per-message / --node-poll 0.")
        self.separate_worker = separate_worker
        self.superlink: subprocess.Popen | None = None
        self.supernodes: dict[int, subprocess.Popen] = {}
        self.runtime_apis: dict[int, str] = {}  # party -> its SuperNode's Runtime API
        self.runs: list[subprocess.Popen] = []

    # -- start and stop ------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> LocalDeployment:
        """Start the SuperLink, wait until it is healthy, start one SuperNode per party."""
        # Logs, configs and Flower's state of the parties' run: owner only.
        private_folder(self.workdir)
        self.home = self.workdir / "flwr_home"
        self.env = flower_env(self.home, self.superexec_poll)
        for name in _LEGACY_GRPC:  # they would listen on 0.0.0.0: loopback only here
            self.env.pop(name, None)
        self.logs = private_folder(self.workdir / "logs")
        # The SuperNodes' workers keep their parties' states in the private runtime folder
        # (hyfl.deploy.supernode.worker_state_folder): this deployment's own, removed when
        # it stops, so a SuperNode that Flower ends before its clean-up leaves nothing.
        self.runtime = private_folder(self.workdir / "runtime")
        self.env["XDG_RUNTIME_DIR"] = str(self.runtime.resolve())
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        write_connection(self.home, self.address)
        self.app = write_app(self.workdir / "app")
        # The Control API submits jobs that run as this user: only this user's token is
        # admitted (hyfl.deploy.superlink); flwr run finds it in FLWR_HOME's credentials.
        self.control_token = secrets.token_hex(32).encode()
        credentials = self.write_control_credentials(self.home)
        flower_command("flower-superlink", self.env)  # Flower is installed
        self.superlink = self._spawn("superlink", [
            sys.executable, "-m", "hyfl.deploy.superlink", TOKEN_OPTION,
            str(_token_file(self.control_token)), "--insecure", "--host", "127.0.0.1",
            "--port", str(self.port), "--disable-runtime-dependency-installation",
        ])
        self._wait(lambda: _healthy(f"http://{self.address}/health"), timeout, "the SuperLink")
        self.log(REACHABLE.format(address=self.address, credentials=credentials))
        for config in self.node_configs:
            self.start_party(int(config["party"]))
        return self

    def write_control_credentials(self, flwr_home: str | os.PathLike) -> Path:
        """Let ``flwr`` with this ``FLWR_HOME`` use the SuperLink's Control API: its token
        in Flower's credential store there (``credentials.yaml``, mode 0600, as for an
        OIDC login); returns that file."""
        return write_control_credentials(flwr_home, self.address, self.control_token)

    def start_party(self, party: int) -> None:
        """Start (or restart) the SuperNode of ``party``."""
        config = next(c for c in self.node_configs if int(c["party"]) == party)
        node_file = self.workdir / "nodes" / f"party-{party}.toml"
        write_private_text(node_file, "".join(f"{k} = {_toml_value(v)}\n"
                                              for k, v in config.items()))
        if self.node_poll is None:
            supernode = [flower_command("flower-supernode", self.env)]
        else:
            self.env["HYFL_SUPERNODE_POLL"] = str(self.node_poll)
            supernode = [sys.executable, "-m", "hyfl.deploy.supernode",
                         *([] if not self.worker else ["--hyfl-worker-process"]
                           if self.separate_worker else ["--hyfl-worker"])]
        self.runtime_apis[party] = f"127.0.0.1:{_free_port()}"
        self.supernodes[party] = self._spawn(f"party-{party}", [
            *supernode, "--insecure", "--superlink", self.address, "--host", "127.0.0.1",
            "--port", self.runtime_apis[party].rpartition(":")[2], "--node-config",
            str(node_file),
        ])
        self.log(f"SuperNode of {_party_label(party, config)} started, its Runtime API on "
                 f"{self.runtime_apis[party]} "
                 + ("(tasks only for its worker, which holds the party's secret)"
                    if self.worker else "(open to every user of this machine: its tasks and "
                    "the party's saved state; use the worker to close it)"))

    def worker_pid(self, party: int) -> int | None:
        """The process id of a party's worker (None if it has none right now, or it runs in
        its SuperNode's process: ``separate_worker=False``)."""
        supernode = self.supernodes[party]
        for pid, (_, cmdline) in _descendants(supernode.pid).items():
            if "hyfl.deploy.worker" in cmdline:
                return pid
        return None

    def kill_party(self, party: int, sig: int = signal.SIGKILL) -> None:
        """Kill a party's SuperNode and its children (a machine that dies)."""
        process = self.supernodes[party]
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    def stop(self) -> None:
        """Stop runs, SuperNodes, then the SuperLink; no process of theirs stays."""
        for process in [*self.runs, *self.supernodes.values()]:
            _stop_group(process)
        if self.superlink is not None:
            _stop_group(self.superlink)
        # Some of Flower's helpers (the SuperLink's SuperExec, a ServerApp) start in
        # process groups of their own; they all carry this deployment's FLWR_HOME.
        if hasattr(self, "home"):
            _stop_stragglers(str(self.home.resolve()))
        if hasattr(self, "runtime"):  # the parties' last states: nothing reads them now
            shutil.rmtree(self.runtime, ignore_errors=True)

    def __enter__(self) -> LocalDeployment:
        try:
            return self.start()
        except BaseException:  # Ctrl-C or an error while starting: nothing may stay behind
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- runs -------------------------------------------------------------------------
    def submit(self, run_config: Mapping[str, Any], name: str = "run") -> subprocess.Popen:
        """Start ``flwr run --stream`` for one job; returns the process (its log: logs/NAME.log)."""
        overrides = self.workdir / f"{name}-config.toml"
        write_private_text(overrides, "".join(f"{k} = {_toml_value(v)}\n"
                                              for k, v in run_config.items()))
        process = self._spawn(name, [
            flower_command("flwr", self.env), "run", str(self.app), CONNECTION, "--stream",
            "--run-config", str(overrides),
        ])
        self.runs.append(process)
        return process

    def run(self, run_config: Mapping[str, Any], *, timeout: float | None = None,
            on_progress: Callable[[dict], None] | None = None) -> dict:
        """Submit a job, wait for it, return its results (``deploy.json`` in ``out``)."""
        out = Path(str(run_config["out"]))
        process = self.submit(run_config)
        try:
            return wait_for_results(process, out, self.logs / "run.log", timeout=timeout,
                                    on_progress=on_progress)
        except HyflError as error:
            # A party's reason stays out of its reply (it may quote its files), but on one
            # machine its log is the user's own: name the log and quote the reason.
            told = with_party_reasons(str(error), self.logs)
            if told == str(error):
                raise
            raise HyflError(told) from None

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        # A party's log quotes the errors of its messages: owner only.
        log = open_private(self.logs / f"{name}.log", "ab")
        try:
            return subprocess.Popen(reaped(command), stdout=log, stderr=subprocess.STDOUT,
                                    env=self.env, cwd=self.workdir, start_new_session=True)
        finally:
            log.close()

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not ready():
            if self.superlink is not None and self.superlink.poll() is not None:
                raise fail(what, "exited at start-up", f"See {self.logs / 'superlink.log'}.")
            if time.monotonic() > end:
                raise fail(what, f"did not start within {timeout:g} s",
                           f"See the logs in {self.logs}.")
            time.sleep(0.2)


def wait_for_results(process: subprocess.Popen, out: Path, log_file: Path, *,
                     timeout: float | None = None,
                     on_progress: Callable[[dict], None] | None = None,
                     poll: float = 0.5, fresh_after: float | None = None) -> dict:
    """Wait for ``flwr run`` to end; report new rounds; return the job's results.

    Parameters
    ----------
    process : subprocess.Popen
        ``flwr run`` (anything with ``poll()``).
    out : path
        The job's results folder, where the coordinator rewrites ``deploy.json``
        after every round (so this runs on the coordinator's machine).
    log_file : path
        The run's log, quoted when the run fails.
    timeout : float, optional
        Give up after this many seconds.
    on_progress : callable, optional
        Called with each new round's record of ``deploy.json``, in order, as
        soon as it appears.
    poll : float, default 0.5
        Seconds between looks at ``deploy.json``.
    fresh_after : float, optional
        A ``time.time()``: a ``deploy.json`` last written before it is an earlier
        run's and is ignored (a job resubmitted into the same folder).

    Raises
    ------
    HyflError
        If the run did not complete (its error and the log's last lines).
    """
    end = None if timeout is None else time.monotonic() + timeout
    seen = 0
    while True:
        done = process.poll() is not None
        results = read_results(out, missing_ok=True, fresh_after=fresh_after)
        rounds = results.get("rounds", []) if results else []
        if on_progress is not None:
            for record in rounds[seen:]:
                on_progress(record)
        seen = max(seen, len(rounds))
        if done:
            break
        if end is not None and time.monotonic() > end:
            raise fail("the deployed run", f"did not finish within {timeout:g} s",
                       f"See {log_file} and the logs beside it.")
        time.sleep(poll)
    results = read_results(out, missing_ok=True, fresh_after=fresh_after)
    if results is None or results.get("status") != "completed":
        error = results.get("error") if results else None
        if error:  # the coordinator's own message says what and how to fix it
            raise HyflError(f"the deployed run failed: {str(error).rstrip('.')}. "
                            f"Details in {log_file}.")
        raise HyflError(f"the deployed run failed: no results were written to {out}. "
                        f"See {log_file} (last lines: {_tail(log_file)})")
    return results


def read_results(out: str | os.PathLike, missing_ok: bool = False,
                 fresh_after: float | None = None) -> dict | None:
    """The ``deploy.json`` the ServerApp writes into ``out`` (None if absent and allowed;
    with ``fresh_after``, a file last written before that ``time.time()`` counts as absent)."""
    path = Path(out) / "deploy.json"
    try:
        # File times come from the kernel's coarse clock, which lags time.time() by
        # up to a tick: allow a second (an earlier run's file is far older).
        if fresh_after is not None and path.stat().st_mtime < fresh_after - 1.0:
            raise FileNotFoundError(path)
        return json.loads(path.read_text())
    except FileNotFoundError:
        if missing_ok:
            return None
        raise fail(f"results {path}", "do not exist", "Run the job first.") from None
    except (ValueError, RecursionError):
        return None if missing_ok else {}


def start_line(parties: int, iterations: int, cipher: str, step_rule: str,
               intercept: float | None, standardize: bool) -> str:
    """What a local deployment runs, said as it starts: with the intercept and the scaling,
    whose defaults (none) are not ``hyfl run``'s."""
    bias = f"intercept {intercept:g}" if intercept else "no intercept"
    scaled = "standardized" if standardize else "not standardized"
    return (f"{parties} parties on loopback; running {iterations} rounds (cipher {cipher}, "
            f"step rule {step_rule}, {bias}, {scaled})")


def with_party_reasons(message: str, logs: Path) -> str:
    """``message`` (a failed run's) with, for each party it says failed (``party K
    failed on``), that party's log and the last reason the party's worker logged there
    (``hyfl worker: message failed: ...``, which its reply leaves out)."""
    import re

    notes = []
    for k in sorted({int(k) for k in re.findall(r"party (\d+) failed on", message)}):
        path = logs / f"party-{k}.log"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        reasons = [line.split("message failed:", 1)[1].strip() for line in lines
                   if "hyfl worker: message failed:" in line]
        notes.append(f"Party {k}'s log {path} says: {reasons[-1]}" if reasons
                     else f"Party {k}'s log: {path}.")
    return " ".join([message.rstrip(), *notes])


def _tail(path: Path, lines: int = 8) -> str:
    """The log's last ``lines`` lines of text, one line: without terminal colour codes or
    a traceback's frames (``Traceback ...``, ``File "...", line``, the source lines it
    quotes and its ``^^^`` markers), which the log keeps for who reads it there."""
    import re

    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    ansi = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
    kept, in_frame = [], False
    for raw in text:
        line = ansi.sub("", raw).replace("\x1b", "").strip()
        if line.startswith("Traceback (most recent call last)") or line.startswith('File "'):
            in_frame = True  # a frame's next lines quote its source
            continue
        if in_frame and (raw.startswith("    ") or set(line) <= set("^~ ")):
            continue
        in_frame = False
        if line:
            kept.append(line)
    return " | ".join(kept[-lines:]) or "(empty)"


def _party_label(party: int, config: Mapping[str, Any]) -> str:
    """``party 1 (hospital)`` for a party with its own party file, else ``party 1``."""
    from hyfl.deploy.party_files import is_party_file

    data = str(config.get("data", ""))
    if data and is_party_file(data):
        from hyfl.data.parties import party_name

        return f"party {party} ({party_name(Path(data))})"
    return f"party {party}"


def party_names(data: str, party_data: str | os.PathLike | None = None) -> list[str] | None:
    """The parties' names of ``hyfl deploy local --data PARTY-SPEC`` (``hospital``, ``lab``,
    ... in party order, as ``hyfl run`` names them); None for other data."""
    from hyfl.data import is_party_spec

    if party_data is not None or not data or not is_party_spec(data):
        return None
    try:
        from hyfl.data.party_spec import parse_party_spec

        return [str(name) for name in parse_party_spec(data)[0]]
    except HyflError:  # run_local reports it
        return None


# ----------------------------------------------------------------------------- metrics

#: Columns of a deployment's metrics.csv (cumulative where the simulation's are).
DEPLOY_COLUMNS = (
    "iteration", "primal", "relative_loss", "train_accuracy", "train_auc", "model_round",
    "round_relative_loss", "round_trips", "round_seconds",
    "bytes_up", "bytes_down", "encryptions", "decryptions", "additions",
    "payload_bytes_up", "payload_bytes_down", "messages", "active_clients", "absent_clients",
    "attempts", "accepted", "beta",
)


def deployment_metrics(results: dict, weights: np.ndarray, problem=None, optimum=None,
                       train_labels=None) -> list[dict[str, float]]:
    """Metrics rows of a deployed run, like the engines' (``metrics.csv``).

    Costs are cumulative over rounds as in the simulation's metrics (set-up
    excluded, as there); ``round_seconds`` is the deployment's wall time.
    With ``problem`` (the pooled data, available when everything runs on one
    machine) the objective is evaluated from the server's weights of each
    round (``round_relative_loss``) and, as the engines do, the row reports
    the best weights seen so far, the zero model of the start included
    (``primal``, ``relative_loss``, ``train_accuracy``, ``train_auc`` of round
    ``model_round``): what the run returns never gets worse. Without
    ``problem`` those columns are NaN. The duals stay with the parties, so
    ``dual`` and ``gap`` are not reported.
    """
    from hyfl.runtime.simulation import evaluate

    cumulative = ("round_trips", "round_seconds", "bytes_up", "bytes_down", "encryptions",
                  "decryptions", "additions", "payload_bytes_up", "payload_bytes_down",
                  "messages")
    totals = dict.fromkeys(cumulative, 0.0)
    rows = []
    best: dict[str, float] | None = None
    for t in range(len(weights)):
        row: dict[str, float] = {"iteration": float(t)}
        if problem is not None:
            values = evaluate(problem, weights[t], None, optimum, None, train_labels)
            if best is None or values["primal"] <= best["primal"]:
                best = {k: values[k] for k in ("primal", "relative_loss", "train_accuracy",
                                               "train_auc")}
                best["model_round"] = float(t)
            row.update(best, round_relative_loss=values["relative_loss"])
        else:
            row.update(primal=np.nan, relative_loss=np.nan, train_accuracy=np.nan,
                       train_auc=np.nan, model_round=np.nan, round_relative_loss=np.nan)
        if t > 0:
            record = results["rounds"][t - 1]
            for key in cumulative:
                totals[key] += float(record.get(key, 0.0))
            row.update(totals)
            row.update(active_clients=float(len(record["active"])),
                       absent_clients=float(len(record["absent"])),
                       attempts=float(record["attempts"]), accepted=float(record["accepted"]),
                       beta=np.nan if record.get("beta") is None else float(record["beta"]))
        else:
            row.update(totals)
            row.update(active_clients=np.nan, absent_clients=np.nan, attempts=np.nan,
                       accepted=np.nan, beta=np.nan)
        rows.append(row)
    return rows


def write_metrics(rows: list[dict[str, float]], path: str | os.PathLike) -> Path:
    """Write metrics rows as CSV (columns :data:`DEPLOY_COLUMNS`)."""
    path = Path(path)
    with private_write(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=DEPLOY_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None or (isinstance(v, float) and np.isnan(v))
                                 else repr(float(v))) for k, v in row.items()})
    return path


def assemble(block_files: Sequence[str | os.PathLike], loss: str, lam: float):
    """The pooled problem and partition of block files (where all of them are, e.g. loopback).

    Every stored entry of the data matrix belongs to exactly one party's block,
    so the blocks put back together give ``X`` and, entry by entry, its owner
    (an explicit ``entry_owner`` partition: each party's block is exactly its
    file's). Labels are taken from the holders of each sample.

    Returns
    -------
    (problem, partition)
    """
    import scipy.sparse as sp

    from hyfl.deploy.blocks import read_block
    from hyfl.losses import get_loss
    from hyfl.partition import Partition
    from hyfl.problem import Problem

    blocks = [read_block(path, k) for k, path in enumerate(block_files)]
    N, M = blocks[0].n_samples, blocks[0].n_features
    rows, cols, values, owners = [], [], [], []
    Y = np.zeros((N, blocks[0].Y.shape[1]))
    for k, b in enumerate(blocks):
        coo = b.X.tocoo()
        rows.append(b.samples[coo.row])
        cols.append(b.features[coo.col])
        values.append(coo.data)
        owners.append(np.full(coo.nnz, k, dtype=np.int64))
        Y[b.samples] = b.Y
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    order = np.lexsort((cols, rows))
    indptr = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=N), out=indptr[1:])
    X = sp.csr_matrix((np.concatenate(values)[order], cols[order], indptr), shape=(N, M))
    partition = Partition(N, M, tuple(b.samples for b in blocks),
                          tuple(b.features for b in blocks),
                          entry_owner=np.concatenate(owners)[order], name="blocks")
    return Problem(X=X, Y=Y, loss=get_loss(loss), lam=float(lam)), partition


def _best_relative_loss(problem, history: list[np.ndarray], optimum) -> float:
    """The relative loss the deployment reports (:func:`deployment_metrics`): of the best ``w``
    seen, the zero model of the start included -- not the engines' best *certified*
    model, which is another ``w``."""
    from hyfl.runtime.simulation import evaluate

    values = [evaluate(problem, w, None, optimum, None)
              for w in (np.zeros_like(history[0]), *history)]
    return float(min(values, key=lambda v: v["primal"])["relative_loss"])


def compare_with_protocol(results: dict, weights: np.ndarray, problem, partition, cipher,
                          optimum=None) -> dict[str, Any]:
    """Run the in-process engine with the deployment's seed and participants; compare.

    The participation is the trace of the parties that actually took part in
    each round (the schedule's, minus absences), so the two runs must agree
    exactly: same draws, same messages, same fixed-point sums.

    Returns the largest weight difference, both engines' seconds per round,
    whether the bytes agree, and the in-process run's accepted rounds,
    totals (``protocol_totals``: bytes and HE operations, set-up excluded)
    and, with ``optimum``, its final relative loss.
    """
    from hyfl.algorithms import make_algorithm
    from hyfl.participation import Trace
    from hyfl.runtime.protocol import run_protocol

    config = results["config"]
    algorithm = make_algorithm(config["algorithm"]["name"], config["hyper"])
    K = len(results["parties"])
    rounds = results["rounds"]
    trace = Trace(np.array([[k in r["active"] for k in range(K)] for r in rounds], dtype=bool))
    history: list[np.ndarray] = []
    result = run_protocol(algorithm, problem, partition, trace, len(rounds), cipher,
                          seed=int(config["seed"]), monitor_duals=False, optimum=optimum,
                          on_round=lambda server, clients: history.append(server.w.copy()))
    diff = float(np.max(np.abs(np.stack(history) - weights[1:]))) if history else 0.0
    deployed = np.array([r["round_seconds"] for r in rounds])
    final = result.final
    return {
        "max_abs_weight_difference": diff,
        "rounds": len(rounds),
        "deploy_round_seconds_median": float(np.median(deployed)),
        "protocol_round_seconds_median": float(np.median(result.round_times)),
        "deploy_round_seconds": deployed.tolist(),
        "protocol_round_seconds": result.round_times.tolist(),
        "bytes_equal": bool(np.allclose(np.cumsum([r["bytes_up"] for r in rounds]),
                                        result.column("bytes_up")[1:])),
        "protocol_accepted": int(np.nansum(result.column("accepted")[1:])),
        "protocol_relative_loss": (_best_relative_loss(problem, history, optimum)
                                   if optimum is not None and history else None),
        "protocol_totals": {key: float(final[key]) for key in (
            "bytes_up", "bytes_down", "encryptions", "decryptions", "additions")},
    }


def _party_file_nodes(spec: str) -> tuple[list[dict], dict]:
    """Each party's node config data keys and the run config keys of a party spec."""
    from hyfl.data.party_spec import parse_party_spec

    files, options = parse_party_spec(spec)
    # unlabeled: checked against the files by _check_deployable (drop must drop nothing)
    deployed = {"id_column", "label_column", "min_common", "psi", "name", "unlabeled"}
    unsupported = sorted(set(options) - deployed)
    if unsupported:
        raise fail(f"party spec option{'s' if len(unsupported) > 1 else ''} "
                   f"{', '.join(unsupported)}", "cannot be deployed: deployed parties align "
                   "their files themselves (task and classes follow the loss and the labels)",
                   "Leave those options out, or run the files in-process (hyfl run).")
    node = {}
    if "id_column" in options:
        node["id-column"] = str(options["id_column"])
    if options.get("label_column") is not None:
        node["label-column"] = str(options["label_column"])
    nodes = [{**node, "data": str(Path(path).resolve())} for path in files.values()]
    run = {"min_common": int(options["min_common"])} if "min_common" in options else {}
    return nodes, run


def party_file_nodes(spec: str) -> tuple[list[dict], dict]:
    """Each party's node config data keys and the run config keys of a party spec (for a
    job other than ``deploy local``'s: ``hyfl deploy predict``)."""
    return _party_file_nodes(spec)


def _check_deployable(dataset) -> None:
    """Refuse, before anything starts, party files that ``hyfl run`` trains on but a
    deployment cannot: a file without feature columns (a label-only party is no client
    in-process; deployed, every party trains), and text labels in one file and numbers in
    another. (``unlabeled=drop``: :func:`_labelled_copies`.)"""
    meta = dataset.meta
    files = {str(name): Path(path).name for name, path in meta["parties"].items()}
    bare = [name for name in files if name not in set(meta["clients"])]
    if bare:
        raise fail(", ".join(f"{files[n]} (party {n!r})" for n in bare),
                   f"hold{'s' if len(bare) == 1 else ''} no feature "
                   "columns (only ids and labels), which hyfl run takes as a label-only party "
                   "but a deployment cannot: every deployed party trains on its own block",
                   "Move those labels into a file with features that holds the same samples, "
                   "or run the files in-process (hyfl run).")
    # hyfl run reads text labels that spell numbers as numbers when another file has number
    # labels; deployed, each party reports its own kind before it sees the others'.
    from hyfl.data.parties import read_party_file

    kinds = {}
    for name, path in meta["parties"].items():
        table = read_party_file(Path(path), party=str(name), id_column=meta["id_column"],
                                label_column=meta["label_column"])
        if table.labels is not None:
            kinds[files[str(name)]] = "text" if table.labels.dtype == object else "number"
    if len(set(kinds.values())) > 1:
        text = [f for f, kind in kinds.items() if kind == "text"]
        numbers = [f for f, kind in kinds.items() if kind == "number"]
        raise fail(f"the label columns of {', '.join(text)}", "hold text while those of "
                   f"{', '.join(numbers)} hold numbers: hyfl run reads such text as numbers, a "
                   "deployment cannot (each party reports its labels' kind alone)",
                   f"Write the labels of {', '.join(text)} as numbers (or those of "
                   f"{', '.join(numbers)} as the same class names).")


def _labelled_copies(dataset, nodes: list[dict], folder: Path, log) -> None:
    """``unlabeled=drop`` for a local deployment: each party's file without the samples no
    file labels, as a copy in ``folder`` (the deploying user's, 0700) that its node config
    then names -- the rows ``hyfl run`` leaves out, so the deployed data are its data.
    (Deployed parties number the samples before any label is shared, so across machines
    each party removes those rows from its own file.) Nothing is copied when no sample is
    dropped."""
    import pandas as pd

    from hyfl.data.parties import read_party_file

    meta = dataset.meta
    dropped = int(meta.get("dropped_unlabeled", 0))
    if not dropped:
        return
    kept = set(meta["sample_ids"])
    private_folder(folder)
    for node, (name, path) in zip(nodes, meta["parties"].items()):
        path = Path(path)
        table = read_party_file(path, party=str(name), id_column=meta["id_column"],
                                label_column=meta["label_column"])
        keep = np.array([i in kept for i in table.ids], dtype=bool)
        parquet = path.name.lower().endswith((".parquet", ".pq"))
        frame = (pd.read_parquet(path) if parquet else
                 pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig"))
        if len(frame) != keep.size:  # pragma: no cover - the readers count rows alike
            raise fail(f"party file {path.name}", "reads with another number of rows here",
                       "Delete the unlabelled rows from the files yourself.")
        if parquet:
            copy = folder / f"{name}.parquet"
            with private_write(copy, "wb") as f:
                frame[keep].to_parquet(f, index=False)
        else:  # the cells as the file spells them (read as text), uncompressed
            copy = folder / f"{name}.csv"
            with private_write(copy, "w", newline="") as f:
                frame[keep].to_csv(f, index=False)
        node["data"] = str(copy)
    log(f"unlabeled=drop: {dropped} samples no file labels left out of copies of the files "
        f"in {folder}, which the parties read")


def default_partition(parties: int) -> str:
    """A hybrid split for an even number of parties (two feature groups), else vertical."""
    if parties >= 4 and parties % 2 == 0:
        return f"grid:{parties // 2}x2"
    return f"vertical:{parties}"


#: What ``hyfl deploy local`` writes into its ``out`` folder (besides ``keys/``).
LOCAL_OUTPUTS = ("deploy.json", "weights.npz", LATEST_WEIGHTS, "metrics.csv", "comparison.json",
                 "parties", "flower", "model.npz", "party-files")


def _prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` with anything but ``keys/`` in it, unless ``overwrite``.

    With ``overwrite`` only the outputs of an earlier local run
    (:data:`LOCAL_OUTPUTS`) are removed; keys and unknown files stay.
    """
    check_results_folder(out, overwrite=overwrite, allow=("keys",), resumable=False,
                         kept="the key pair in its keys/ folder is kept and reused")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out}", "is a file", "Pass a folder.")
    for name in LOCAL_OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    # It will hold the private key, the parties' plaintext states and Flower's files:
    # no other local user may read or enter it (a new folder is 0700 from its mkdir,
    # an existing one is restricted before anything is written into it).
    private_folder(out)
    out.chmod(0o700)


def local_keys(out: Path, keys_dir, key_bits: int, insecure_test_keys: bool,
                log: Callable[[str], None], cipher: str = "paillier"
                ) -> tuple[Path, Path, list[str]]:
    """The key pair of a local run: ``keys_dir`` or ``OUT/keys``, reused and checked if it
    exists (never regenerated: it may have been handed out), else generated for ``cipher``.

    Returns ``(private, public, warnings)``.
    """
    from hyfl.deploy.keys import (
        PRIVATE_KEY_FILE,
        PUBLIC_KEY_FILE,
        SECURE_KEY_BITS,
        cipher_fingerprint,
        generate_keys,
        insecure_warning,
        paillier_bits,
        party_cipher,
        server_cipher,
    )

    keys = Path(keys_dir) if keys_dir is not None else out / "keys"
    private, public = keys / PRIVATE_KEY_FILE, keys / PUBLIC_KEY_FILE
    generated = keys_dir is None and not keys.exists()
    if generated:
        generate_keys(keys, key_bits, insecure_test_keys=insecure_test_keys, cipher=cipher)
    own = party_cipher(cipher, private, insecure_test_keys=insecure_test_keys)
    server = server_cipher(cipher, public, insecure_test_keys=insecure_test_keys)
    if cipher_fingerprint(own) != cipher_fingerprint(server):
        raise fail(f"key folder {keys}", "holds a public key of another key pair than its "
                   "private key", f"Run `hyfl deploy keys --out {keys} --overwrite` (or "
                   "delete the folder) for a new pair.")
    if generated:
        log(f"new {cipher} key pair in {keys} (fingerprint {cipher_fingerprint(own)})")
    else:
        log(f"reusing the key pair in {keys} (fingerprint {cipher_fingerprint(own)}); to make "
            f"new ones run `hyfl deploy keys --cipher {cipher} --out {keys} --overwrite` or "
            "delete the folder")
    bits = paillier_bits(server)
    warnings = [insecure_warning(bits)] if bits is not None and bits < SECURE_KEY_BITS else []
    for line in warnings:
        log(line)
    return private, public, warnings


@dataclass
class LocalRun:
    """What :func:`run_local` did: the results it wrote, summed up and judged.

    Attributes
    ----------
    out : Path
        The results folder.
    results : dict
        ``deploy.json``.
    metrics : list of dict
        The rows of ``metrics.csv`` (:func:`deployment_metrics`; row 0 is the start).
    comparison : dict or None
        ``comparison.json`` (with ``compare``).
    summary : dict
        :func:`hyfl.deploy.report.summarize`'s numbers.
    judgement : hyfl.deploy.report.Judgement
        Whether the run learned (if not, the command exits with
        :data:`~hyfl.deploy.report.NO_PROGRESS_EXIT`).
    warnings : list of str
        Lines every output of the run repeats (insecure test keys).
    """

    out: Path
    results: dict
    metrics: list[dict[str, float]]
    comparison: dict[str, Any] | None
    summary: dict[str, Any]
    judgement: Any
    warnings: list[str] = field(default_factory=list)


def _latest_weights(out: Path, iteration: int) -> np.ndarray | None:
    """The server's ``w`` after round ``iteration`` if the coordinator's latest file holds
    that round (a later round may already have replaced it: then None)."""
    try:
        f = _read_weights(out / LATEST_WEIGHTS, iteration=("iu", 0))
    except HyflError:  # not there yet, or being replaced
        return None
    return f["w"] if int(f["iteration"]) == iteration else None


def _read_weights(path: Path, **more: tuple[str, int]) -> dict[str, np.ndarray]:
    """A weights file the ServerApp wrote (``w`` and the ``more`` members)."""
    return read_npz(path, f"weights file {path}", "the ServerApp's weights",
                    "Run the deployment again.", expect={"w": ("f", None), **more})


@dataclass(frozen=True)
class _PooledData:
    """What :func:`run_local` knows of the data, pooled (everything is on this machine):
    the problem for the partition's size, each round's objective and the comparison, and
    what the node configs, the job and the model file say about the data."""

    problem: Any
    parts: Any
    scale: np.ndarray | None
    data_keys: list[dict[str, str]]  # each party's data entries of its node config
    run_data: dict[str, str]  # the job's data entries of the run config
    dataset_meta: dict
    data_name: str
    partition: str | None
    intercept: float | None
    standardize: bool


def _pool_blocks(party_data, partition: str | None, loss: str, lam: float,
                 intercept: float | None, standardize: bool) -> _PooledData:
    """Block files of ``hyfl deploy split`` (``--party-data``): prepared when they were
    split, so ``intercept``/``standardize`` must agree with them or be left out (the
    blocks give the split; ``partition`` is only recorded in the model file)."""
    files = sorted(Path(party_data).glob("party-*.npz"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        raise fail(f"--party-data {party_data}", "holds no party-K.npz files",
                   "Write them with `hyfl deploy split`.")
    from hyfl.deploy.blocks import read_block

    blocks = [read_block(f) for f in files]
    prepared = blocks[0].intercept or None, any(b.scale is not None and not np.all(
        b.scale == 1.0) for b in blocks)
    if intercept is not None and intercept != prepared[0] or standardize and not prepared[1]:
        raise fail("--intercept/--standardize", "differ from how the block files in "
                   f"{party_data} were prepared (intercept {prepared[0] or 'off'}, "
                   f"{'standardized' if prepared[1] else 'not standardized'})",
                   "Leave them out (block files bring their own), or split the data "
                   "again with the options.")
    intercept, standardize = prepared
    problem, parts = assemble(files, loss, lam or blocks[0].lam_default)
    scale = None
    if standardize:  # each file keeps the scales of its features
        scale = np.ones(problem.n_features)
        for b in blocks:
            if b.scale is not None:
                scale[b.features] = b.scale
    return _PooledData(problem, parts, scale, [{"data": str(f.resolve())} for f in files], {},
                       {"intercept_scaling": intercept} if intercept else {}, str(party_data),
                       partition, intercept, standardize)


def _pool_party_files(data: str, out: Path, *, partition: str | None, compare: bool, loss: str,
                      lam: float, seed: int, intercept: float | None, standardize: bool,
                      log: Callable[[str], None]) -> _PooledData:
    """Party files (``--data parties:...``): each party names its own file, and the
    alignment runs deployed; pooled here for the objective, read as ``hyfl run`` reads
    them, so that what ``hyfl run`` refuses (cells two parties give different values,
    ...) is refused before anything starts."""
    from hyfl.data import fallback_lambda, load_party_spec
    from hyfl.deploy.blocks import prepare_data

    if partition is not None:
        raise fail("--partition", f"is set, but {data!r} are party files, whose split is "
                   "their own", "Leave --partition out with party files.")
    if compare:
        raise fail("--compare", "needs a dataset or block files: the in-process engine "
                   "cannot number party files' samples as the deployed alignment did",
                   "Leave --compare out with party files.")
    data_keys, run_data = _party_file_nodes(data)
    dataset, parts = load_party_spec(data, psi=False)
    _check_deployable(dataset)
    _labelled_copies(dataset, data_keys, out / "party-files", log)
    dataset, problem, parts, scale = prepare_data(
        dataset, loss, lam or fallback_lambda(dataset.X.shape[0]), partition=parts, seed=seed,
        intercept=intercept or 0.0, standardize=standardize)
    return _PooledData(problem, parts, scale, data_keys, run_data, dataset.meta, str(data),
                       None, intercept, standardize)


def _pool_dataset(data: str, *, parties: int | None, partition: str | None, loss: str,
                  lam: float, seed: int, intercept: float | None,
                  standardize: bool) -> _PooledData:
    """A dataset (a name or a file) split by ``partition`` (default: ``parties``
    parties, :func:`default_partition`); each party names the dataset in its own node
    config, and the job gives the partition."""
    from hyfl.data import lambda_for, load_data
    from hyfl.deploy.blocks import prepare_data

    if partition is None:
        if parties is None:
            raise fail("--partition", "is not set",
                       "Pass --parties N, a partition spec (grid:KxQ: K*Q parties) or "
                       "--party-data.")
        partition = default_partition(parties)
    dataset = load_data(data)
    dataset, problem, parts, scale = prepare_data(
        dataset, loss, lam or lambda_for(data, dataset.X.shape[0]), spec=partition, seed=seed,
        intercept=intercept or 0.0, standardize=standardize)
    named = str(Path(data).resolve()) if Path(data).is_file() else str(data)
    return _PooledData(problem, parts, scale, [{"data": named} for _ in range(parts.n_clients)],
                       {"partition": partition}, dataset.meta, str(data), partition, intercept,
                       standardize)


def _node_configs(n_parties: int, data_keys: list[dict[str, str]], out: Path, cipher: str,
                  private, insecure_test_keys: bool) -> list[dict]:
    """Each party's node config: its data, its output folder and its own policy (the
    cipher of this run, with the key of this run). The local deployer runs the server
    itself: it admits the per-sample rules."""
    policy = ({"cipher": "none"} if private is None else
              {"key": str(private), "cipher": cipher, "insecure-test-keys": insecure_test_keys,
               "unchecked-rules": True})
    return [{"party": k, **policy, **data_keys[k], "out": str(out / "parties")}
            for k in range(n_parties)]


def _round_reporter(problem, optimum, labels, out: Path,
                    on_round: Callable[[dict, float | None], None] | None
                    ) -> Callable[[dict], None]:
    """The deployment's ``on_progress``: evaluates each round's ``w`` (if still the
    latest) and calls ``on_round`` with the record and the model reported so far (as
    :func:`deployment_metrics` reports it: the best ``w`` seen, the zero model of the
    start included)."""
    from hyfl.runtime.simulation import evaluate

    if on_round is None:
        return lambda record: None
    start = evaluate(problem, np.zeros_like(optimum.w), None, optimum, None, labels)
    kept = {"round": 0, "primal": float(start["primal"]),
            "relative_loss": float(start["relative_loss"])}

    def progress(record: dict) -> None:
        t = int(record["iteration"])
        w = _latest_weights(out, t)
        loss_t = None
        if w is not None:
            values = evaluate(problem, w, None, optimum, None, labels)
            loss_t = float(values["relative_loss"])
            if float(values["primal"]) <= kept["primal"]:
                kept.update(round=t, primal=float(values["primal"]), relative_loss=loss_t)
        on_round({**record, "reported": {"round": kept["round"],
                                         "relative_loss": kept["relative_loss"]}}, loss_t)

    return progress


def _judge_run(results: dict, rows: list[dict], problem, labels, iterations: int,
               participation: str = "full"):
    """Whether the run learned (:func:`hyfl.deploy.report.judge_progress`): below the
    zero model, and above always predicting one class
    (:func:`hyfl.runtime.trivial.judge_trivial`)."""
    from hyfl.deploy.report import Judgement, judge_progress

    judgement = judge_progress(results, [row["round_relative_loss"] for row in rows])
    if judgement.progressed:
        from hyfl.experiments.runner import majority_rate_of
        from hyfl.runtime.trivial import judge_trivial

        trivial = judge_trivial(rows, majority_rate=majority_rate_of(problem, labels))
        if trivial is not None:
            judgement = Judgement(False, f"no better than a trivial model: {trivial.reason}",
                                  f"Run more rounds (--iterations {max(2 * iterations, 10)})"
                                  + ("." if participation == "full"
                                     else ", or try --participation full."))
    return judgement


def run_local(*, out: str | os.PathLike, parties: int | None = None, data: str = "",
              partition: str | None = None, party_data: str | os.PathLike | None = None,
              iterations: int = 5, participation: str = "full", seed: int = 0,
              loss: str = "hinge", lam: float = 0.0, hyper: str = "", cipher: str = "ckks",
              intercept: float | None = None, standardize: bool = False,
              key_bits: int = 2048, keys_dir: str | os.PathLike | None = None,
              insecure_test_keys: bool = False, overwrite: bool = False,
              reply_timeout: float = 120.0, compare: bool = False,
              node_poll: float | None = 0.1, worker: bool = True,
              separate_worker: bool = False,
              timeout: float | None = None, log: Callable[[str], None] | None = None,
              on_round: Callable[[dict, float | None], None] | None = None) -> LocalRun:
    """``hyfl deploy local``: keys, SuperLink and SuperNodes on loopback, one job, results.

    Writes into ``out``: ``keys/`` (unless ``keys_dir``; an existing one is
    checked and reused, never regenerated), ``deploy.json``, ``weights.npz``
    and ``weights-latest.npz`` (the ServerApp's), ``metrics.csv`` (objective of
    each round's weights and of the best seen, costs), ``parties/party-K.npz`` (each party's final
    duals and weights), ``flower/`` (logs, app, FLWR_HOME), ``model.npz`` (the
    best weights seen, see :mod:`hyfl.model_file`) and, with ``compare``,
    ``comparison.json``. An ``out`` holding anything besides
    ``keys/`` is refused unless ``overwrite``. Keys below 2048 bits need
    ``insecure_test_keys`` (then the parties' node configs and the run config
    admit them too, and the output warns).

    ``hyper`` empty runs HyFDCA's defaults (the ``cocoa`` step rule).
    ``intercept`` (the constant column's value; None: none) and ``standardize``
    prepare the data as ``hyfl run`` does (run config keys of the same names);
    block files were prepared when they were split, and bring their own.

    Parameters
    ----------
    log : callable, optional
        Receives lines about keys and processes.
    on_round : callable, optional
        Called as ``on_round(record, relative_loss)`` when a round ends: its
        record of ``deploy.json`` and the relative loss of its ``w``
        (evaluated here, where the data are; None if that round's ``w`` was
        already replaced by the next one's). The record has one more entry,
        ``reported``: ``{"round": r, "relative_loss": x}``, the model the run
        reports so far (the best ``w`` evaluated, the zero model of the start
        included; :func:`hyfl.deploy.report.round_line` shows it).

    Returns
    -------
    LocalRun
        The results, summed up and judged (:func:`hyfl.deploy.report.judge_progress`):
        a run that did not learn is reported there, not raised, so that its
        results are written all the same.
    """
    from hyfl.data import is_party_spec
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.keys import party_cipher
    from hyfl.deploy.report import summarize
    from hyfl.model_file import MODEL_FILE, model_from_problem, save_model
    from hyfl.problem import solve_centralized

    log = log or (lambda line: None)
    out = Path(out).resolve()
    _prepare_out(out, overwrite)
    if party_data is not None:
        pooled = _pool_blocks(party_data, partition, loss, lam, intercept, standardize)
    elif is_party_spec(data):
        pooled = _pool_party_files(data, out, partition=partition, compare=compare, loss=loss,
                                   lam=lam, seed=seed, intercept=intercept,
                                   standardize=standardize, log=log)
    else:
        pooled = _pool_dataset(data, parties=parties, partition=partition, loss=loss, lam=lam,
                               seed=seed, intercept=intercept, standardize=standardize)
    problem, parts, intercept, standardize = (pooled.problem, pooled.parts, pooled.intercept,
                                              pooled.standardize)
    K = parts.n_clients if parties is None else parties
    if K != parts.n_clients:
        raise fail("--parties", f"is {K}, but the data have {parts.n_clients} parties",
                   "Leave --parties out or make it match the partition.")
    private = public = None
    warnings: list[str] = []
    if cipher != "none":
        private, public, warnings = local_keys(out, keys_dir, key_bits, insecure_test_keys, log,
                                                cipher)
    run_config = run_config_for(
        parties=K, iterations=iterations, participation=participation, seed=seed, loss=loss,
        lam=float(lam), hyper=hyper, cipher=cipher, reply_timeout=reply_timeout, out=str(out),
        intercept=float(intercept or 0.0), standardize=bool(standardize),
        public_key=str(public) if public else "", insecure_test_keys=insecure_test_keys,
        **pooled.run_data,
    )
    config = DeployConfig.from_run_config(run_config)  # fail before starting anything
    nodes = _node_configs(K, pooled.data_keys, out, cipher, private, insecure_test_keys)
    # The optimum first: each round's relative loss is shown as the round ends.
    optimum = solve_centralized(problem)
    labels = problem.Y[:, 0] if problem.Y.shape[1] == 1 else None
    progress = _round_reporter(problem, optimum, labels, out, on_round)
    with LocalDeployment(nodes, out / "flower", log=log, node_poll=node_poll,
                         worker=worker, separate_worker=separate_worker) as deployment:
        log(start_line(K, iterations, cipher, config.algorithm.step_rule, intercept,
                       standardize))
        results = deployment.run(run_config, timeout=timeout, on_progress=progress)
    weights = _read_weights(out / "weights.npz")["w"]
    rows = deployment_metrics(results, weights, problem, optimum, labels)
    write_metrics(rows, out / "metrics.csv")
    # The best weights seen (the engines return them too): never worse than the zero model.
    save_model(out / MODEL_FILE, model_from_problem(
        problem, weights[int(rows[-1]["model_round"])], data_meta=pooled.dataset_meta,
        partition=pooled.partition or "party files", algorithm="hyfdca",
        data=pooled.data_name, feature_scale=pooled.scale))
    comparison = None
    if compare:
        own = party_cipher(cipher, private, insecure_test_keys=insecure_test_keys,
                           **config.cipher_options())
        comparison = compare_with_protocol(results, weights, problem, parts, own, optimum)
        write_private_json(out / "comparison.json", comparison, indent=1)
    reported = [row["relative_loss"] for row in rows]
    return LocalRun(out=out, results=results, metrics=rows, comparison=comparison,
                    summary=summarize(results, reported, comparison,
                                      round_relative_loss=[row["round_relative_loss"]
                                                           for row in rows],
                                      model_round=int(rows[-1]["model_round"])),
                    judgement=_judge_run(results, rows, problem, labels, iterations,
                                         participation),
                    warnings=warnings)
