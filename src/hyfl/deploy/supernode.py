"""``flower-supernode`` for a hyfl party: a long-lived worker, shorter polls (Flower 1.41.0).

``python -m hyfl.deploy.supernode [--hyfl-worker | --hyfl-worker-process]
[flower-supernode options]`` starts the ordinary SuperNode with these changes:

* ``--hyfl-worker``: the SuperNode runs in ``--isolation process`` and the
  party's long-lived worker, :mod:`hyfl.deploy.worker`, runs in this very
  process (:func:`run_in_process`): each message the SuperNode stores is
  handled at once, through the handlers of Flower's own Runtime API called
  directly (:class:`hyfl.deploy.worker.InProcessRuntime`), instead of Flower
  starting a ClientApp process per message. This saves the HTTP hop between
  the SuperNode and a worker process (about ten requests and two copies of
  the message's bytes each way) and the worker's wake-up: measured, a
  deployed round of ijcnn1 grid:2x2 with ckks takes half the time of a
  worker in its own process (docs/deployment.md, "Long-lived party workers").
  A crash that kills the process (not an exception: a message that fails is
  answered with an error) then takes the SuperNode with it.
* ``--hyfl-worker-process``: the same worker in a process of its own, which
  this process starts against the SuperNode's Runtime API
  (``--host``/``--port``) and restarts when it dies: a worker that crashes or
  hangs leaves the SuperNode registered, and the party rejoins seconds later.
  In both modes the SuperNode gives up on a task whose worker stopped
  sending heartbeats after ``TASK_PATIENCE`` seconds instead of 60 (the
  message gets Flower's "ClientApp crashed" reply, which the server counts as
  an absence), so a restarted worker is back within seconds.
  The Runtime API is then closed to other local users: a new random secret
  (:func:`runtime_api_secret`, a 0600 file in a new 0700 folder, removed as
  soon as Flower has read it) is given to Flower's
  ``--superexec-auth-secret-file`` and (``--hyfl-worker-process``), through a
  pipe, to each worker; the SuperNode's HTTP Runtime API hands out tasks
  (``AcquireTask``, which returns a task's token, the key to its message and
  ``context.state``) only to requests signed with it.
  ``--superexec-auth-secret-file FILE`` uses that file instead (it must be
  readable by its owner only, and is left in place).
* A SuperNode with nothing to do asks the SuperLink for new messages every
  3 s, and waits for its ClientApp's reply in steps of 0.5 s; both intervals
  are hard-coded in ``flwr.supernode.start_client_internal`` (1.41.0). Each
  HyFDCA message therefore waits 1.5 s on average before a party even starts
  on it. This module caps those sleeps at ``$HYFL_SUPERNODE_POLL`` seconds
  (default 0.2). The cost is more idle requests to the SuperLink.

The patches (all in :mod:`hyfl.deploy.flower_patches`) replace names seen by
single Flower modules, so they are tied to
the pinned Flower version: with any other version the SuperNode starts
unmodified (a worker needs the patched version and is then not started).

On Linux it also starts the SuperNode's SuperExec (the one process the
SuperNode starts, from its main thread; it starts the ClientApp processes)
with ``SIGKILL`` as its parent-death signal (``die_with_supernode``):
killing the SuperNode, even with SIGKILL, ends its SuperExec at once
instead of leaving it re-parented to init. The ClientApp processes it had
started then stop through Flower's own ``--parent-pid`` monitor; under
:mod:`hyfl.deploy._reaper` (``hyfl deploy local``, ``hyfl deploy party``)
the reaper kills them as well. The worker arms the same parent-death signal
itself as it starts (:func:`hyfl.deploy._reaper.die_with_parent`).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import stat
import subprocess as _subprocess
import sys
import tempfile
import threading
from pathlib import Path

from hyfl.deploy.flower_patches import (
    ON_MESSAGE,
    PATCHED_VERSION,
    cap_supernode_polls,
    die_with_supernode,
    forget_secret_once_loaded,
    lean_http_middleware,
    quick_object_pulls,
    shorten_task_patience,
)

#: Seconds between two looks for the worker's reply (Flower: 0.5).
REPLY_POLL = 0.002
#: Seconds between two starts of a worker that keeps dying.
RESTART_DELAY = 1.0


def _option(argv: list[str], name: str, default: str) -> str:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


#: The secret's file name in its private folder (:func:`runtime_api_secret`).
SECRET_NAME = "superexec-auth-secret"


def _private_runtime_dir() -> str | None:
    """``$XDG_RUNTIME_DIR`` if it is this user's own private folder, else None."""
    folder = os.environ.get("XDG_RUNTIME_DIR", "")
    try:
        info = os.stat(folder) if folder else None
    except OSError:
        return None
    if (info is None or not stat.S_ISDIR(info.st_mode) or info.st_mode & 0o077
            or info.st_uid != os.getuid()):
        return None
    return folder


def runtime_api_secret(folder: str | os.PathLike | None = None) -> Path:
    """A new random secret for a SuperNode's Runtime API, in a file only this user can read.

    The file (mode 0600 from its creation, :mod:`hyfl._private_files`) is the
    only one in a new folder of mode 0700 (``tempfile.mkdtemp``) in ``folder``,
    by default ``$XDG_RUNTIME_DIR`` when that is this user's private folder (a
    tmpfs on most Linux systems), else the temporary folder. :func:`main`
    removes the folder as soon as Flower has read the file
    (:func:`forget_secret_once_loaded`); at the latest it goes when this process
    exits. 256 random bits, as 64 hexadecimal digits: Flower reads the file's
    bytes as they are.
    """
    from hyfl._private_files import write_private_bytes

    path = private_temp_folder("hyfl-supernode-", folder) / SECRET_NAME
    return write_private_bytes(path, secrets.token_hex(32).encode())


def check_private(path: str) -> str | None:
    """Why a secret file given by the user is not private (None: it is)."""
    try:
        info = os.stat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        return (f"is readable by others (mode {stat.S_IMODE(info.st_mode):04o}, owner uid "
                f"{info.st_uid}); chmod 600 it")
    return None


def worker_state_folder(folder: str | os.PathLike | None = None) -> Path:
    """A new folder (mode 0700) where this SuperNode's workers keep their parties' states.

    In ``folder``, by default ``$XDG_RUNTIME_DIR`` when that is this user's
    private folder (a tmpfs on most Linux systems), else the temporary folder;
    removed when this process exits. It outlives a worker, so a restarted
    worker finds the state of its run's last answered message (as Flower's
    ``context.state``, which the SuperNode keeps in memory, would).
    """
    return private_temp_folder("hyfl-party-state-", folder)


def private_temp_folder(prefix: str, folder: str | os.PathLike | None) -> Path:
    """A new folder of mode 0700 (``tempfile.mkdtemp``) in ``folder`` (default: the
    user's private runtime folder, else the temporary folder), removed at exit."""
    private = Path(tempfile.mkdtemp(prefix=prefix,
                                    dir=folder if folder is not None else _private_runtime_dir()))
    atexit.register(shutil.rmtree, private, True)
    # Flower's processes stop on SIGTERM through flwr_exit, whose force-exit timer ends in
    # os._exit (no atexit): the folder then stayed, with the parties' last states in it
    # (tests/test_review_alignment.py::test_a_stopped_deployment_leaves_no_party_state).
    try:
        from flwr.supercore.exit import add_exit_handler
    except ImportError:  # another Flower: atexit only
        pass
    else:
        add_exit_handler(lambda: shutil.rmtree(private, True), run_before_force_exit=True)
    return private


def supervise_worker(runtime_api_address: str, stop: threading.Event,
                     secret: bytes | None = None,
                     state_folder: str | os.PathLike | None = None) -> threading.Thread:
    """Keep one :mod:`hyfl.deploy.worker` running until ``stop``; restart it when it dies
    (a crash, SIGKILL), not when it is told to stop (SIGTERM, SIGINT: the party stops).

    The worker's stdin is a pipe from this process: each message the SuperNode
    stores wakes the worker at once (:data:`ON_MESSAGE`), so it need not poll
    often; when this process dies, the worker reads end-of-file and exits.

    The worker is told this process's id (``--parent-pid``) and arms ``SIGKILL``
    as its own parent-death signal (Linux), so it never outlives this process.
    ``secret`` is the Runtime API's secret (:func:`runtime_api_secret`): each
    worker reads it from a pipe this process fills and closes
    (``--superexec-auth-secret-fd``; neither command line nor environment
    holds it) and signs its task requests with it. ``state_folder``
    (:func:`worker_state_folder`) is where the workers keep their parties' states.
    """
    command = [sys.executable, "-m", "hyfl.deploy.worker", "--runtime-api-address",
               runtime_api_address, "--parent-pid", str(os.getpid())]
    if state_folder is not None:
        command += ["--state-folder", str(state_folder)]

    current: list = []

    def wake(state=None) -> None:
        """Tell the worker a message is waiting: one byte on its stdin (never blocks)."""
        if current:
            try:
                os.write(current[0].stdin.fileno(), b"\n")
            except (BlockingIOError, BrokenPipeError, OSError):
                pass  # a full pipe already says so; a dead worker is restarted below

    ON_MESSAGE.append(wake)

    def run() -> None:
        while not stop.is_set():
            extra, fds = [], ()
            if secret is not None:  # at most PIPE_BUF bytes: written whole, no reader yet
                read, write = os.pipe()
                os.write(write, secret)
                os.close(write)
                extra, fds = ["--superexec-auth-secret-fd", str(read)], (read,)
            # No preexec_fn (unsafe in this threaded process): the worker arms its own
            # parent-death signal.
            try:
                worker = _subprocess.Popen(  # noqa: S603 (our own interpreter and module)
                    [*command, *extra, "--wake-on-stdin"], stdin=_subprocess.PIPE,
                    pass_fds=fds)
            finally:
                for fd in fds:
                    os.close(fd)
            os.set_blocking(worker.stdin.fileno(), False)
            current[:] = [worker]
            code = worker.wait()
            current.clear()
            worker.stdin.close()
            if code in (-signal.SIGTERM, -signal.SIGINT):  # an orderly stop (of the party)
                # Its last states: nothing reads them any more (only a folder of
                # worker_state_folder's; a party's own state-dir is never passed here).
                if state_folder is not None and Path(state_folder).name.startswith(
                        "hyfl-party-state-"):
                    shutil.rmtree(state_folder, ignore_errors=True)
                return
            if not stop.is_set():
                print(f"hyfl: the party worker (pid {worker.pid}) exited with code {code}; "
                      "starting it again", file=sys.stderr, flush=True)
                stop.wait(RESTART_DELAY)

    # The thread that starts the worker must live as long as the worker should: the
    # parent-death signal follows the starting *thread*.
    thread = threading.Thread(target=run, name="hyfl-worker-supervisor", daemon=True)
    thread.start()
    return thread


def run_in_process(state_folder: str | os.PathLike | None) -> None:
    """Serve the party in this, the SuperNode's, process: each message the SuperNode stores
    is handled at once, in the SuperNode's thread that stored it (task heartbeats come
    from a thread of their own), through Flower's Runtime API handlers
    (:meth:`hyfl.deploy.worker.Worker.run_pending`), so its reply is stored before the
    SuperNode looks for it."""
    from hyfl.deploy.worker import Worker

    def log(line: str) -> None:
        print(f"hyfl worker: {line}", file=sys.stderr, flush=True)

    # Its parties stay in this process's memory, which ends with the state folder: their
    # states are written only when a party is dropped for newer runs (or to a state-dir).
    worker = Worker(None, log=log, state_folder=None if state_folder is None
                    else str(state_folder), save_each_message=False)

    def handle(state) -> None:
        if state is None:
            return
        try:
            worker.run_pending(state)
        except Exception as err:  # noqa: BLE001 (the SuperNode goes on; the server counts
            log(f"could not take a task ({type(err).__name__}: {err})")  # an absence)

    ON_MESSAGE.append(handle)


def main() -> None:
    argv = sys.argv[1:]
    separate = "--hyfl-worker-process" in argv
    worker = separate or "--hyfl-worker" in argv
    argv = [arg for arg in argv if arg not in ("--hyfl-worker", "--hyfl-worker-process")]
    limit = float(os.environ.get("HYFL_SUPERNODE_POLL", "0.2"))
    die_with_supernode()
    # A worker replies within milliseconds: look for its reply as often.
    patched = cap_supernode_polls(limit, REPLY_POLL if worker else None) and quick_object_pulls(
        "flwr.supernode.start_client_internal") and lean_http_middleware("supernode")
    if not patched:
        print(f"hyfl: Flower is not {PATCHED_VERSION}; starting the SuperNode unmodified",
              file=sys.stderr)
    if worker:
        if not patched or not shorten_task_patience():
            sys.exit(f"hyfl: the party worker needs Flower {PATCHED_VERSION}; install "
                     f"flwr=={PATCHED_VERSION} or start the party without the worker")
        if _option(argv, "--isolation", "process") != "process":
            sys.exit("hyfl: the party worker needs --isolation process (in subprocess "
                     "isolation Flower starts a SuperExec of its own, which the worker would "
                     "compete with, and ignores the Runtime API's secret)")
        if "--isolation" not in argv:
            argv = ["--isolation", "process", *argv]
        host = _option(argv, "--host", "127.0.0.1")
        address = f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:" \
                  f"{_option(argv, '--port', '9094')}"
        given = _option(argv, "--superexec-auth-secret-file", "")
        if given:
            problem = check_private(given)
            if problem is not None:
                sys.exit(f"hyfl: --superexec-auth-secret-file {given} {problem}")
            path = Path(given)
        else:  # Flower's SuperNode and the worker share a new secret
            path = runtime_api_secret()
            forget_secret_once_loaded(path)
            argv = [*argv, "--superexec-auth-secret-file", str(path)]
        secret = path.read_bytes()
        if not 0 < len(secret) <= 4096:  # (handed to each worker through a pipe)
            sys.exit(f"hyfl: --superexec-auth-secret-file {path}: a secret of 1 to 4096 bytes, "
                     f"not {len(secret)}")
        if separate:
            supervise_worker(address, threading.Event(), secret, worker_state_folder())
        else:
            run_in_process(worker_state_folder())
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


if __name__ == "__main__":
    main()
