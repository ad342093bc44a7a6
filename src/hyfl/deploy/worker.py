"""A party's long-lived worker: Flower carries the messages, the party stays in memory.

Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message
(Python, Flower, ``import hyfl``, the party's state decoded and its ``Client``
rebuilt: 2-7 s a message on loopback, against milliseconds of HyFDCA work).
The worker replaces that process, not Flower's transport:

* the party's SuperNode runs with ``--isolation process``, so it starts no
  SuperExec and no ClientApp processes of its own; it pulls messages from
  the SuperLink and pushes replies as always;
* the worker is the one process that takes the SuperNode's ClientApp tasks
  from its Runtime API (``AcquireTask``, what ``flower-superexec`` polls), and
  runs each one in memory, through the same Runtime API calls as
  ``flwr-clientapp`` (pull the task's message and context, push the reply
  and the context, task heartbeats while it works);
* it serves hyfl's own installed ClientApp (:data:`hyfl.deploy.app.client_app`)
  through :class:`Sessions`: one :class:`~hyfl.deploy.party.Party` per run,
  kept between messages with its cipher and ``Client``. It never installs or
  imports a job's app bundle: the worker holds the party's private key in
  memory, where the bundle's code could read it. The bundle is read as data
  and must be hyfl's app unchanged (:func:`hyfl.deploy.flower_app.check_bundle`);
  any other is refused.

After every message the party's state -- without its data block, which the
party can load again -- is saved in a file of the run in ``--state-folder``
(a private folder its SuperNode's process makes and removes,
:func:`hyfl.deploy.supernode.worker_state_folder`; the node config's
``state-dir`` when the party keeps one), not in Flower's ``context.state``,
which would travel with every message twice (:func:`hyfl.deploy.app.save_state`).
A worker that dies (a crash, SIGKILL) is started again by ``hyfl deploy party``
(and :class:`~hyfl.deploy.local.LocalDeployment`); the message it was working
on gets no reply, so the server counts the party absent for that round, and
its next message finds the state of the last message that was answered: the
party rejoins as a returning party.

By default the worker runs inside the SuperNode's own process
(``python -m hyfl.deploy.supernode --hyfl-worker``): it then calls the handlers
of the SuperNode's Runtime API directly (:class:`InProcessRuntime`, the same
calls without HTTP) and, since its memory and its state folder end together,
writes a party's state only when it drops the party for newer runs (or, with
a node config ``state-dir``, after every message, as always).

In a process of its own (``--hyfl-worker-process``), run as
``python -m hyfl.deploy.worker --runtime-api-address HOST:PORT
[--superexec-auth-secret-file FILE | --superexec-auth-secret-fd FD] [--parent-pid
PID] [--state-folder DIR]``: with the secret of a SuperNode started with
``--superexec-auth-secret-file FILE``, which then gives its tasks to no one
else (:mod:`hyfl.deploy.supernode` does both, the secret through a pipe).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Sessions", "Worker"]

#: Runs a worker keeps in memory; older runs are dropped (their state stays in its file).
MAX_RUNS = 4
#: Longest wait between two task polls while the SuperNode has nothing for the worker
#: (the waits start at a millisecond after each message and grow to this).
DEFAULT_POLL = 0.1
#: Longest wait between two task polls of a worker that its SuperNode wakes per message.
WOKEN_POLL = 1.0
#: Seconds between two heartbeats of a task (well inside the SuperNode's patience,
#: :data:`hyfl.deploy.flower_patches.TASK_PATIENCE`).
HEARTBEAT_SECONDS = 2.0


class Sessions:
    """The parties a worker serves: one :class:`~hyfl.deploy.party.Party` per run.

    A party is opened at its run's first message -- from its saved state, if
    any (a restarted worker) -- and kept until ``finish``, an error,
    or :data:`MAX_RUNS` newer runs. Transport-free: the worker and the tests'
    in-process transport use it alike.
    """

    def __init__(self, log: Callable[[str], None] | None = None) -> None:
        self.parties: OrderedDict[Any, tuple[Any, tuple]] = OrderedDict()
        self.opened = 0  # parties built from a state (or none): starts and restarts
        self.log = log or (lambda line: None)

    def handle(self, run: Any, kind: str, message: tuple[dict, str],
               state: tuple[dict, str] | None | Callable[[], tuple[dict, str] | None],
               node_config: Mapping[str, Any], run_config: Mapping[str, Any],
               timing: Mapping[str, float] | None = None,
               spill: Callable[[tuple[dict, str]], None] | None = None
               ) -> tuple[tuple[dict, str], tuple[dict, str] | None]:
        """Like :func:`~hyfl.deploy.party.handle_message`, with the party kept in memory.

        ``state`` is the saved state, or a function returning it: it is called only
        when the party is opened (a new run, a restarted worker), not for a party in
        memory (decoding a saved state costs as much as saving it: 0.2 s a message
        for ijcnn1's 40-67 MB states with ckks).
        Returns the encoded reply and the state to save (without the data block).

        With ``spill`` the state is not encoded after each message (None is
        returned for it): the party stays in memory, and only when it is dropped for
        newer runs is ``spill`` called with its state. For a worker in the
        SuperNode's own process (:func:`hyfl.deploy.supernode.run_in_process`),
        whose memory and state folder end together: encoding and writing an
        ijcnn1 party's state cost 20-40 ms of every message.
        """
        from hyfl.deploy.party import open_party

        configs = (dict(node_config), dict(run_config))
        kept = self.parties.pop(run, None)
        if kept is not None and kept[1] == configs:
            party = kept[0]
        else:  # a new run, a restarted worker, or configs that changed: validate anew
            party = open_party(node_config, run_config, state() if callable(state) else state)
            self.opened += 1
        # An error leaves the party undefined: it is not kept (the next message starts
        # from the state saved after the last good one).
        reply = party.receive(kind, message, timing)
        saved = party.saved_state(with_block=False) if spill is None else None
        if kind != "finish":
            self.parties[run] = (party, configs, spill)
            while len(self.parties) > MAX_RUNS:
                dropped_run, (dropped, _, dropped_spill) = self.parties.popitem(last=False)
                if dropped_spill is not None:
                    try:
                        dropped_spill(dropped.saved_state(with_block=False))
                    except Exception as err:  # noqa: BLE001 (a full disk, say: the message
                        # being answered is another run's, which must not fail for it)
                        self.log(f"run {dropped_run}: could not keep the state of the party "
                                 f"dropped for newer runs ({type(err).__name__}: {err}); "
                                 "that run cannot go on here")
        return reply, saved


# ----------------------------------------------------------------------------- Flower


class _TaskToken:
    """Runtime API interceptor adding the current task's token (one client for all tasks)."""

    def __init__(self) -> None:
        self.token = ""

    def intercept(self, context, call_next):
        from flwr.supercore.constant import TASK_TOKEN_HEADER
        from flwr.supercore.interceptors.http.utils import add_headers

        add_headers(context.request, {TASK_TOKEN_HEADER: self.token})
        return call_next(context)


class _Heartbeat:
    """Task heartbeats while a message is handled (Flower expires silent tasks).

    Unlike Flower's own sender it never signals the process: a task the
    SuperNode gave up on simply gets no reply, and the worker goes on.
    """

    def __init__(self, client, interval: float):
        self.client, self.interval = client, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest  # noqa: PLC0415

        while not self._stop.wait(self.interval):
            try:
                self.client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
            except Exception:  # noqa: BLE001 (a missed heartbeat is retried next time)
                pass


class Worker:
    """Takes the SuperNode's ClientApp tasks and runs them in this process.

    Parameters
    ----------
    runtime_api_address : str
        The SuperNode's Runtime API (``flower-supernode --host/--port``).
    poll : float, default :data:`DEFAULT_POLL`
        Longest wait between two polls while there is no task (see
        :class:`~hyfl.deploy.backoff.Backoff`).
    root_certificates : bytes, optional
        CA certificate when the Runtime API serves TLS; insecure otherwise.
    wake : int, optional
        A file descriptor on which the SuperNode's process writes a byte for each
        message it stores (:func:`hyfl.deploy.supernode.supervise_worker`): the
        worker then sleeps on it and looks for a task at once when woken, and at
        the latest every ``poll`` seconds; end of file means the SuperNode is gone.
    log : callable, optional
        Receives one line per event (start, restore, errors).
    superexec_auth_secret : bytes, optional
        The secret of a SuperNode started with ``--superexec-auth-secret-file``
        (:func:`hyfl.deploy.supernode.runtime_api_secret`): the worker signs its
        task requests with it as ``flower-superexec`` does (Flower's own
        ``SuperExecAuthHttpInterceptor``); such a SuperNode refuses unsigned ones.
    """

    def __init__(self, runtime_api_address: str, *, poll: float = DEFAULT_POLL,
                 root_certificates: bytes | None = None, wake: int | None = None,
                 log: Callable[[str], None] | None = None,
                 superexec_auth_secret: bytes | None = None, state_folder: str | None = None,
                 save_each_message: bool = True):
        self.address, self.poll, self.wake = runtime_api_address, poll, wake
        self.state_folder, self.save_each_message = state_folder, save_each_message
        self.root_certificates = root_certificates
        self.superexec_auth_secret = superexec_auth_secret or None
        self.log = log or (lambda line: None)
        self.sessions = Sessions(self.log)
        self.apps: dict[str, Any] = {}  # SHA-256 of a checked bundle -> hyfl's ClientApp
        self.token: _TaskToken | None = None

    def _client(self, component: str, *extra):
        from flwr.supercore.interceptors import (
            RuntimeVersionHttpInterceptor,
            SuperExecAuthHttpInterceptor,
        )
        from flwr.supercore.runtime import RuntimeHttpClient

        interceptors = [RuntimeVersionHttpInterceptor(component_name=component), *extra]
        if self.superexec_auth_secret is not None:
            # What flower-superexec signs (Flower 1.41: AcquireTask), signed the same way.
            try:
                from flwr.supercore.superexec.run_superexec import (
                    _SUPEREXEC_AUTH_METHODS as methods,
                )
            except ImportError:
                methods = frozenset({"/flwr.proto.Runtime/AcquireTask"})
            interceptors.append(SuperExecAuthHttpInterceptor(
                master_secret=self.superexec_auth_secret, protected_methods=methods))
        return RuntimeHttpClient.from_server_address(
            server_address=self.address, insecure=self.root_certificates is None,
            root_certificates=self.root_certificates, interceptors=interceptors,
            retry_invoker=_retry_invoker())

    def serve(self, stop: threading.Event | None = None) -> None:
        """Poll for tasks and run them, until ``stop`` is set (or forever)."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        from hyfl.deploy.backoff import Backoff
        from hyfl.deploy.flower_patches import quick_object_pulls

        quick_object_pulls("flwr.supernode.runtime.run_clientapp")
        stop = stop or threading.Event()
        acquire = self._client("SuperExec")
        self.token = _TaskToken()
        self.task_client = self._client("flwr-clientapp", self.token)
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        self.log(f"hyfl party worker on the SuperNode's Runtime API {self.address}")
        idle = Backoff(self.poll)
        try:
            while not stop.is_set():
                response = acquire.AcquireTask(request)
                if response.HasField("task") and response.token:
                    self.run_task(response.token)
                    idle.reset()
                elif self.wake is None:
                    stop.wait(idle.next())
                elif not _wait_for_wake(self.wake, self.poll):
                    self.log("the SuperNode is gone (end of the wake-up pipe); stopping")
                    return
        finally:
            acquire.close()
            self.task_client.close()

    def run_pending(self, state) -> int:
        """Run every ClientApp task waiting in ``state``, the SuperNode's own ``NodeState``,
        in this (the SuperNode's) process, through :class:`InProcessRuntime`; the number run.

        What :func:`hyfl.deploy.supernode.main` calls each time the SuperNode has stored
        a message, so that the reply is ready when the SuperNode looks for it.
        """
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        if self.token is None:
            from hyfl.deploy.flower_patches import quick_object_pulls

            quick_object_pulls("flwr.supernode.runtime.run_clientapp")
            self.token = _TaskToken()
        self.task_client = InProcessRuntime(state, self.token)
        acquire = InProcessRuntime(state)
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        done = 0
        while True:
            response = acquire.AcquireTask(request)
            if not (response.HasField("task") and response.token):
                return done
            self.run_task(response.token)
            done += 1

    def run_task(self, token: str) -> None:
        """One message: pull it, handle it in memory, push the reply and the context."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supernode.runtime.run_clientapp import (
            pull_task_input,
            push_message,
            push_task_output,
        )

        self.token.token = token
        client = self.task_client
        message = context = reply = None
        status, details = SubStatus.FAILED, "the hyfl party worker failed"
        try:
            # Heartbeats while the task is ours; they stop before its output is pushed
            # (which ends the task and its token).
            with _Heartbeat(client, HEARTBEAT_SECONDS):
                try:
                    message, context, run, fab = pull_task_input(client)
                    started = time.time()
                    self._check_app(run, fab)
                    reply = self._hyfl(message, context, started)
                    status, details = SubStatus.COMPLETED, ""
                except Exception as err:  # noqa: BLE001 (reported to the server, as Flower does)
                    from flwr.clientapp.client_app import LoadClientAppError

                    from hyfl.deploy.party import server_text
                    from hyfl.errors import HyflError

                    code = (ErrorCode.LOAD_CLIENT_APP_EXCEPTION
                            if isinstance(err, LoadClientAppError)
                            else ErrorCode.CLIENT_APP_RAISED_EXCEPTION)
                    # The job's own bundle may be named; other details stay in this log.
                    kind = (message.metadata.message_type.partition(".")[2]
                            if message is not None else "?")
                    shown = (err if isinstance(err, LoadClientAppError)
                             else HyflError(server_text(err, kind)))
                    details = f"{type(shown)}:<'{shown}'>"
                    self.log(f"message failed: {type(err).__name__}: {err}")
                    if message is not None:
                        reply = Message(Error(code=code, reason=details), reply_to=message)
                if reply is not None and context is not None:
                    push_message(client, reply, context)
            push_task_output(client=client, context=context, sub_status=status,
                             details=details)
        except Exception as err:  # noqa: BLE001 (the SuperNode gave up on the task)
            # E.g. its token expired (no heartbeat within the SuperNode's patience on a
            # starved machine): the server counts the party absent; the worker goes on.
            self.log(f"could not finish a task ({type(err).__name__}: {err}); going on")

    def _check_app(self, run, fab) -> None:
        """Only hyfl's ClientApp runs here, and nothing of the job's bundle.

        The worker holds the party's private key in memory: code from a job's
        bundle running in this process could read it. So the bundle is never
        installed or imported; :func:`~hyfl.deploy.flower_app.check_bundle`
        reads it as data and the worker serves hyfl's installed ClientApp.
        Checked once per bundle (by its SHA-256, not the hash the job names).
        """
        import hashlib

        from flwr.clientapp.client_app import LoadClientAppError

        from hyfl.deploy.flower_app import check_bundle
        from hyfl.errors import HyflError

        content = fab.content
        digest = hashlib.sha256(content).hexdigest() if isinstance(content, bytes) else ""
        if digest in self.apps:
            return
        try:
            check_bundle(content, f"app {run.fab_id} {run.fab_version}")
        except HyflError as err:
            raise LoadClientAppError(
                f"{err} (this SuperNode runs hyfl's party worker; other apps need a SuperNode "
                "without it: flower-supernode)") from None
        self.apps[digest] = _hyfl_client_app()

    def _hyfl(self, message, context, started: float):
        """hyfl's ClientApp, with the party kept in :attr:`sessions`."""
        from flwr.app import Message

        from hyfl.deploy.app import (
            check_not_refused,
            load_state,
            pack,
            refuse_run,
            save_state,
            state_dir,
            unpack,
        )

        kind = message.metadata.message_type.partition(".")[2]
        timing = {"until_handler": started - message.metadata.created_at}
        before = self.sessions.opened
        folder = self.state_folder
        # A state-dir is kept to survive a restart of the SuperNode: written every time.
        spill = (None if self.save_each_message or state_dir(context) is not None
                 else lambda state: save_state(context, state, folder))
        try:
            check_not_refused(context)  # (also for a party in memory: cheap)
            reply, state = self.sessions.handle(
                context.run_id, kind, unpack(message.content, "the server"),
                lambda: load_state(context, folder), context.node_config, context.run_config,
                timing, spill)
        except Exception:
            refuse_run(context)  # pushed with the error reply: the run gets no more answers
            raise
        if self.sessions.opened != before and kind != "hello":
            self.log(f"run {context.run_id}: party restored from its saved state at {kind!r}")
        if state is not None:
            save_state(context, state, folder)
        return Message(pack(*reply), reply_to=message)


class InProcessRuntime:
    """A SuperNode's Runtime API called from inside the SuperNode's own process.

    The same calls as Flower's ``RuntimeHttpClient`` (``PullTaskInput``,
    ``PullMessages``, ``PullObject``, ``PushMessages``, ...), answered by the very
    handlers Flower's Runtime API router calls, on the SuperNode's own
    ``NodeState``: the task is found by its token as the router finds it, and a
    handler's ``FlowerError`` reaches the caller as the HTTP client's error would.
    What goes away is the HTTP hop between two processes on one machine (about
    ten requests a message, each message's bytes serialized and parsed twice).
    ``AcquireTask`` needs no secret here: only code of the SuperNode's process
    calls it; the HTTP Runtime API still refuses it without the secret.
    """

    #: Runtime API call -> (module of its handler, handler name), as Flower 1.41's router.
    CALLS = {
        "PullTaskInput": ("supernode", "pull_task_input"),
        "PullMessages": ("supernode", "pull_messages"),
        "PullObject": ("supernode", "pull_object"),
        "ConfirmMessageReceived": ("supernode", "confirm_message_received"),
        "PushMessages": ("supernode", "push_messages"),
        "PushObject": ("supernode", "push_object"),
        "PushTaskOutput": ("supernode", "push_task_output"),
        "SendTaskHeartbeat": ("core", "send_task_heartbeat"),
    }

    def __init__(self, state, token: _TaskToken | None = None) -> None:
        self.state, self.token = state, token

    def AcquireTask(self, request):  # noqa: N802 (Flower's name)
        from flwr.supernode.servicer.runtime import runtime_handlers

        return runtime_handlers.acquire_task(request, self.state)

    def __getattr__(self, name: str):
        if name not in self.CALLS:
            raise AttributeError(name)
        from flwr.supercore.error import ApiErrorCode, FlowerError
        from flwr.supercore.servicer.runtime import runtime_handlers as core
        from flwr.supernode.servicer.runtime import runtime_handlers as supernode

        where, handler = self.CALLS[name]
        function = getattr(supernode if where == "supernode" else core, handler)

        def call(request):
            token = self.token.token if self.token is not None else ""
            task = self.state.get_task_by_token(token) if token else None
            if task is None:  # as the router's authenticate_task
                raise FlowerError(ApiErrorCode.RUNTIME_AUTHENTICATION_FAILED,
                                  "Runtime task-token authentication failed.")
            return function(request, self.state, task)

        return call

    def close(self) -> None:
        pass


def _retry_invoker():
    """Retries for the Runtime API: transport errors and 502/503/504, with backoff.

    Not Flower's ``make_simple_http_retry_invoker``: on a 401 (a task token that
    expired or was revoked) it sends SIGINT to its own process, which ends a
    one-message ``flwr-clientapp`` but would end this long-lived worker. Here
    every other HTTP error is raised to the caller.
    """
    import httpx
    from flwr.supercore.retry.http_retry import (
        _RETRYABLE_STATUS_CODES,
        _RETRYABLE_TRANSPORT_ERRORS,
    )
    from flwr.supercore.retry.retry_invoker import RetryInvoker, exponential

    def give_up(err: Exception) -> bool:
        return (isinstance(err, httpx.HTTPStatusError)
                and err.response.status_code not in _RETRYABLE_STATUS_CODES)

    return RetryInvoker(
        wait_gen_factory=lambda: exponential(max_delay=5.0),
        recoverable_exceptions=(*_RETRYABLE_TRANSPORT_ERRORS, httpx.HTTPStatusError),
        max_tries=None, max_time=60.0, should_giveup=give_up)


def _wait_for_wake(fd: int, timeout: float) -> bool:
    """Sleep until woken on ``fd`` or ``timeout``; False at end of file (the writer died)."""
    import select

    ready, _, _ = select.select([fd], [], [], timeout)
    if ready:
        try:
            if not os.read(fd, 4096):  # drain: one look for tasks serves every wake-up
                return False
        except BlockingIOError:
            pass
    return True


def _hyfl_client_app():
    from hyfl.deploy.app import client_app

    return client_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hyfl.deploy.worker",
        description="hyfl's long-lived party worker for a SuperNode in process isolation.")
    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperNode's Runtime API, HOST:PORT")
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL,
                        help=f"seconds between task polls when idle (default {DEFAULT_POLL})")
    parser.add_argument("--root-certificates", default=None,
                        help="CA certificate of a Runtime API served with TLS")
    parser.add_argument("--wake-on-stdin", action="store_true",
                        help="the SuperNode's process writes a byte on stdin per message "
                             "(and closes it when it ends)")
    parser.add_argument("--superexec-auth-secret-file", default=None,
                        help="the secret file of a SuperNode started with the same option: "
                             "task requests are signed with it")
    parser.add_argument("--superexec-auth-secret-fd", type=int, default=None,
                        help="the same secret, read from this inherited file descriptor "
                             "(a pipe; read to its end, then closed)")
    parser.add_argument("--state-folder", default=None,
                        help="a private folder for the party's state of each run (default: "
                             "Flower's context.state)")
    parser.add_argument("--parent-pid", type=int, default=0,
                        help="die with this parent process (Linux: SIGKILL as the parent-death "
                             "signal); exit at once if it is not the parent any more")
    args = parser.parse_args(argv)
    from hyfl.deploy._reaper import die_with_parent

    if not die_with_parent(args.parent_pid):
        sys.exit(f"hyfl worker: the parent process {args.parent_pid} is gone; not starting")
    secret = None
    if args.superexec_auth_secret_fd is not None:
        with os.fdopen(args.superexec_auth_secret_fd, "rb") as pipe:
            secret = pipe.read()
        if not secret:
            sys.exit("hyfl worker: the Runtime API secret (--superexec-auth-secret-fd) is empty")
    elif args.superexec_auth_secret_file:
        from flwr.supercore.auth import load_superexec_auth_secret

        try:
            secret = load_superexec_auth_secret(args.superexec_auth_secret_file)
        except ValueError as err:
            sys.exit(f"hyfl worker: {err}")
    certificates = None
    if args.root_certificates:
        with open(args.root_certificates, "rb") as f:
            certificates = f.read()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

    def log(line: str) -> None:
        print(f"hyfl worker: {line}", file=sys.stderr, flush=True)

    wake = None
    if args.wake_on_stdin:
        wake = sys.stdin.fileno()
        os.set_blocking(wake, False)
    # Woken per message, the worker's own poll is only a safety net.
    poll = args.poll if wake is None else max(args.poll, WOKEN_POLL)
    Worker(args.runtime_api_address, poll=poll, root_certificates=certificates, wake=wake,
           log=log, superexec_auth_secret=secret, state_folder=args.state_folder).serve()


if __name__ == "__main__":
    main()
