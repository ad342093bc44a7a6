"""Local channels of a deployment: who on this machine can talk to a party's processes.

* A party's SuperNode, started the way ``hyfl deploy local`` / ``hyfl deploy
  party`` start it, hands its tasks (``AcquireTask``: a task's token, the key to
  its message and the party's ``context.state``) only to requests signed with
  the party's secret: another local user's client without it is refused, the
  party's worker with it runs.
* The secret is a 0600 file in a 0700 folder, and only its path is on the
  worker's command line.
* Every port of a local deployment listens on 127.0.0.1 only.
* The worker arms its own parent-death signal (no ``preexec_fn`` in the
  threaded SuperNode): it dies with the process that started it, and does not
  start at all if that process is already gone.

Seconds each: one SuperLink and one SuperNode with its worker, no job.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_deploy import _alive, _wait_for

LINUX = Path("/proc/self/stat").exists()
ACQUIRE = "/flwr.proto.Runtime/AcquireTask"


def _runtime_client(address: str, secret: bytes | None = None, token: str | None = None):
    """A Runtime API client as another local user would write one (Flower's own pieces)."""
    from flwr.supercore.constant import TASK_TOKEN_HEADER
    from flwr.supercore.interceptors import (
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )
    from flwr.supercore.interceptors.http.utils import add_headers
    from flwr.supercore.runtime import RuntimeHttpClient

    class Token:
        def intercept(self, context, call_next):
            add_headers(context.request, {TASK_TOKEN_HEADER: token})
            return call_next(context)

    interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        interceptors.append(SuperExecAuthHttpInterceptor(master_secret=secret,
                                                         protected_methods={ACQUIRE}))
    if token is not None:
        interceptors.append(Token())
    return RuntimeHttpClient.from_server_address(address, insecure=True,
                                                 root_certificates=None,
                                                 interceptors=interceptors)


def _status(call) -> int:
    import httpx

    try:
        call()
    except httpx.HTTPStatusError as err:
        return err.response.status_code
    return 200


def _healthy(address: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=2):
            return True
    except OSError:
        return False


def _listening(pids: set[int]) -> list[str]:
    """``HOST:PORT`` (hex, as in /proc/net/tcp*) of every TCP socket these processes listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found


def _deployment_processes(home: Path) -> set[int]:
    marker = f"FLWR_HOME={home.resolve()}".encode()
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.add(int(pid))
        except OSError:
            continue
    return found


def test_a_runtime_api_secret_is_a_private_file_in_a_private_folder(tmp_path):
    from hyfl.deploy.supernode import check_private, runtime_api_secret

    first, second = runtime_api_secret(tmp_path), runtime_api_secret(tmp_path)
    for path in (first, second):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert os.listdir(path.parent) == [path.name]  # no temporary file left
        assert len(bytes.fromhex(path.read_text())) == 32  # 256 random bits
        assert check_private(str(path)) is None
    assert first.parent != second.parent and first.read_bytes() != second.read_bytes()
    first.chmod(0o644)
    assert "readable by others" in check_private(str(first))


def test_the_secret_file_goes_once_flower_has_read_it(tmp_path):
    import importlib

    from hyfl.deploy.flower_patches import forget_secret_once_loaded
    from hyfl.deploy.supernode import runtime_api_secret

    path = runtime_api_secret(tmp_path)
    secret = path.read_bytes()
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    original = cli.load_superexec_auth_secret
    try:
        assert forget_secret_once_loaded(path)
        assert cli.load_superexec_auth_secret(secret_file=str(path)) == secret
    finally:
        cli.load_superexec_auth_secret = original
    assert not path.parent.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not LINUX, reason="needs Linux /proc")
@pytest.mark.parametrize("separate_worker", [False, True], ids=["in-process", "process"])
def test_a_partys_runtime_api_hands_its_tasks_only_to_its_worker(tmp_path, monkeypatch,
                                                                 separate_worker):
    """The attack, on a deployment as ``hyfl deploy local`` starts it: another local user's
    client calls the party's Runtime API. Without the party's secret (or with a wrong
    one) ``AcquireTask`` is refused (401), and so is a task call with a guessed token;
    a worker in its own process, holding the secret, polls the same API without an
    error (one in the SuperNode's process calls Flower's handlers directly). The
    secret's file is gone once Flower has read it; every port is on 127.0.0.1."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest, PullTaskInputRequest
    from flwr.supercore.constant import TaskType

    from hyfl.deploy.local import LocalDeployment

    private = tmp_path / "run"  # where the SuperNode writes its secret's folder
    private.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private))
    lines: list[str] = []
    work = tmp_path / "flower"
    with LocalDeployment([{"party": 0}], work, log=lines.append,
                         separate_worker=separate_worker) as local:
        assert any("Control API (flwr run: jobs run as you): owner only" in line for line in lines)
        if separate_worker:
            worker = _wait_for(lambda: local.worker_pid(0), 60, "party 0's worker")
            supernode = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1]
                            .split()[1])
            argv = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"--parent-pid") + 1] == str(supernode).encode()
            assert b"--superexec-auth-secret-fd" in argv  # from a pipe, not a file
            assert b"--superexec-auth-secret-file" not in argv
        # The SuperNodes' runtime folder is the deployment's own (removed when it stops).
        private = work / "runtime"
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        # The secret's folder was made here, and removed once Flower had read the file;
        # what stays is the worker's folder for the party's states (mode 0700, its own).
        # (The state folder is made after the secret's: once it is there, so was that.)
        _wait_for(lambda: any(p.name.startswith("hyfl-party-state-") for p in private.iterdir()),
                  30, "the party-state folder")
        _wait_for(lambda: not any(p.name.startswith("hyfl-supernode-")
                                  for p in private.iterdir()), 30, "the secret's folder to go")
        (states,) = private.iterdir()
        assert states.name.startswith("hyfl-party-state-")
        assert stat.S_IMODE(states.stat().st_mode) == 0o700

        address = local.runtime_apis[0]
        _wait_for(lambda: _healthy(address), 60, "party 0's Runtime API")
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        for key in (None, b"not the party's secret"):
            stranger = _runtime_client(address, secret=key)
            assert _status(lambda c=stranger: c.AcquireTask(request)) == 401
            stranger.close()
        guesser = _runtime_client(address, token="a-guessed-task-token")
        assert _status(lambda: guesser.PullTaskInput(PullTaskInputRequest())) == 401
        guesser.close()

        # The worker polls with the secret: it keeps running (a refused poll would end
        # it, and its SuperNode would start another) and logs no error. In the
        # SuperNode's process it needs no secret and there is no worker process.
        time.sleep(3.0)
        assert local.worker_pid(0) == (worker if separate_worker else None)
        log = (work / "logs" / "party-0.log").read_text()
        assert "exited with code" not in log and "Authentication failed" not in log

        listening = _listening(_deployment_processes(work / "flwr_home"))
        assert len(listening) == 2, listening  # the SuperLink's port, the Runtime API's
        assert all(entry.startswith("0100007F:") for entry in listening), listening


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in "ZX":
            found.append(int(entry))
    return found


@pytest.mark.skipif(not LINUX, reason="needs Linux /proc")
@pytest.mark.parametrize("mode", ["--hyfl-worker", "--hyfl-worker-process"])
def test_a_partys_secret_signs_the_calls_its_runtime_api_serves(tmp_path, mode):
    """The same SuperNode with a secret file of the user's own (no SuperLink needed: the
    Runtime API starts first): a call signed with it is served, an unsigned one is
    refused; the worker runs with it; the user's file stays, and the secret is on no
    command line and in no environment."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType

    from hyfl.deploy.local import _free_port, flower_env

    secret_file = tmp_path / "secret"
    secret_file.write_bytes(os.urandom(16).hex().encode())
    secret_file.chmod(0o600)
    secret = secret_file.read_bytes()
    port = _free_port()
    node = subprocess.Popen(
        [sys.executable, "-m", "hyfl.deploy.supernode", mode, "--insecure",
         "--superlink", f"127.0.0.1:{_free_port()}", "--host", "127.0.0.1", "--port", str(port),
         "--superexec-auth-secret-file", str(secret_file)],
        env=flower_env(tmp_path / "flwr_home"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(lambda: _healthy(f"127.0.0.1:{port}"), 60, "the SuperNode's Runtime API")
        separate = mode == "--hyfl-worker-process"
        worker = _wait_for(lambda: _children(node.pid), 30, "the worker")[0] if separate else None
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        party = _runtime_client(f"127.0.0.1:{port}", secret=secret)
        assert not party.AcquireTask(request).HasField("task")  # served: no task waits
        party.close()
        stranger = _runtime_client(f"127.0.0.1:{port}")
        assert _status(lambda: stranger.AcquireTask(request)) == 401
        stranger.close()
        time.sleep(2.0)
        # Not restarted (its polls are served); in the SuperNode's process: none at all.
        assert _children(node.pid) == ([worker] if separate else [])
        for pid in (worker, node.pid) if separate else (node.pid,):
            assert secret not in Path(f"/proc/{pid}/cmdline").read_bytes()
            assert secret not in Path(f"/proc/{pid}/environ").read_bytes()
        assert secret_file.read_bytes() == secret  # the user's own file is left alone
    finally:
        os.killpg(node.pid, 9)
        node.wait(timeout=10)


_PARENT = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-m", "hyfl.deploy.worker", "--runtime-api-address",
                           "127.0.0.1:9", "--parent-pid", sys.argv[1] or str(os.getpid())],
                          stderr=subprocess.PIPE, text=True)
print(worker.pid, flush=True)
for line in worker.stderr:  # (Flower's import warnings first)
    if "hyfl party worker on" in line:
        print(line, end="", flush=True)
        break
time.sleep(120)
"""


@pytest.mark.skipif(not LINUX, reason="needs Linux prctl")
def test_the_worker_dies_with_its_parent_by_its_own_death_signal(tmp_path):
    """Started with no ``preexec_fn`` (as the SuperNode starts it now), the worker arms
    its parent-death signal itself: SIGKILL to its parent ends it at once, although it
    is busy retrying an unreachable Runtime API."""
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), ""], stdout=subprocess.PIPE,
                              text=True)
    try:
        worker = int(parent.stdout.readline())
        assert "hyfl party worker on" in parent.stdout.readline()  # armed, now serving
        assert _alive(worker)
        parent.kill()
        _wait_for(lambda: not _alive(worker), 5, "the worker to die with its parent")
    finally:
        parent.kill()
        parent.wait(timeout=10)


def test_a_worker_whose_parent_is_gone_does_not_start(tmp_path):
    """The race the check closes: a worker told of a parent that is not its parent (it died
    before the worker armed its signal, and the worker was re-parented) stops at once."""
    result = subprocess.run(
        [sys.executable, "-m", "hyfl.deploy.worker", "--runtime-api-address", "127.0.0.1:9",
         "--parent-pid", str(os.getpid() + 1_000_000)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "is gone; not starting" in result.stderr


def test_the_worker_signs_what_flower_superexec_signs():
    """The worker's client signs AcquireTask with Flower's own interceptor, for the methods
    flower-superexec signs; without a secret it signs nothing."""
    from flwr.supercore.interceptors import SuperExecAuthHttpInterceptor

    from hyfl.deploy.worker import Worker

    signed = Worker("127.0.0.1:9", superexec_auth_secret=b"s")._client("SuperExec")
    auth = [i for i in signed._interceptors if isinstance(i, SuperExecAuthHttpInterceptor)]
    assert len(auth) == 1 and ACQUIRE in auth[0]._protected_methods
    plain = Worker("127.0.0.1:9")._client("SuperExec")
    assert not any(isinstance(i, SuperExecAuthHttpInterceptor) for i in plain._interceptors)
    signed.close()
    plain.close()


def test_the_worker_refuses_subprocess_isolation(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hyfl.deploy.supernode", "--hyfl-worker", "--isolation",
         "subprocess", "--insecure", "--superlink", "127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "FLWR_HOME": str(tmp_path)})
    assert result.returncode != 0 and "needs --isolation process" in result.stderr


@pytest.mark.skipif(not LINUX, reason="needs Linux /proc")
def test_a_secret_file_readable_by_others_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x" * 64)
    secret.chmod(0o644)
    result = subprocess.run(
        [sys.executable, "-m", "hyfl.deploy.supernode", "--hyfl-worker", "--insecure",
         "--superlink", "127.0.0.1:9", "--superexec-auth-secret-file", str(secret)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "FLWR_HOME": str(tmp_path)})
    assert result.returncode != 0 and "readable by others" in result.stderr


def test_hyfl_deploy_party_says_per_message_leaves_the_runtime_api_open(monkeypatch):
    from typer.testing import CliRunner

    from hyfl.cli import app

    started = []
    monkeypatch.setattr("hyfl.deploy.cli._exec", lambda command, env: started.append(command))
    party = ["deploy", "party", "--party", "0", "--superlink", "link:8000", "--cipher", "none",
             "--insecure"]
    for mode, warned in (("--worker", False), ("--per-message", True),
                         ("--worker-process", False)):
        result = CliRunner().invoke(app, [*party, mode])
        output = " ".join(result.output.split())  # without rich's line breaks
        assert result.exit_code == 0, output
        assert ("every user of this machine can take" in output) == warned
    worker, per_message, separate = started
    assert "--hyfl-worker" in worker and "--hyfl-worker-process" not in worker
    assert not any(arg.startswith("--hyfl-worker") for arg in per_message)
    assert "--hyfl-worker-process" in separate and "--hyfl-worker" not in separate
    result = CliRunner().invoke(app, [*party, "--per-message", "--worker-process"])
    assert result.exit_code != 0 and "were both given" in " ".join(result.output.split())
