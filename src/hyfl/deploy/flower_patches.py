"""Every place where hyfl changes Flower's internals (Flower 1.41.0), in one module.

Flower has no public hooks for what the deployment needs, so these functions
replace names inside single Flower modules. Each checks ``flwr.__version__``
first and, with any other version than :data:`PATCHED_VERSION`, changes nothing
and returns False (the SuperNode then runs unmodified, and a party worker, which
needs them, is not started). ``tests/test_flower_patches.py`` asserts, for each,
that its target exists in the installed Flower and that Flower reads the patched
value at call time, so a Flower release that renames or rebinds a target fails a
test instead of silently turning a speed-up off.

:func:`cap_supernode_polls`
    Touches ``flwr.supernode.start_client_internal.time`` (the module global
    ``time``) and ``._pull_and_store_message``. ``time`` becomes a
    :class:`CappedTime` whose ``sleep`` backs the idle poll of the SuperLink
    (``time.sleep(3)`` in Flower) off from a millisecond to the cap and caps the
    0.5 s waits for the ClientApp's reply; the pull is wrapped to reset that
    backoff and wake the worker (:data:`ON_MESSAGE`) when a message came. Why:
    both intervals are hard-coded, and each message waited 1.5 s on average
    before a party even started on it. Another version (or a ``time`` that is
    not the ``time`` module): no change, False.
:func:`die_with_supernode`
    Touches ``flwr.supernode.start_client_internal.subprocess``: a
    :class:`DyingSubprocess` whose ``Popen`` gives the SuperExec SIGKILL as its
    parent-death signal (Linux). Why: a killed SuperNode otherwise leaves its
    SuperExec re-parented to init. Another version, another ``subprocess`` or
    not Linux: no change, False.
:func:`shorten_task_patience`
    Writes ``flwr.supercore.corestate.in_memory_corestate.HEARTBEAT_DEFAULT_INTERVAL``
    (imported there by name from ``flwr.common.constant``) so that a task whose
    worker sends no heartbeat expires after :data:`TASK_PATIENCE` s
    (``HEARTBEAT_PATIENCE`` intervals), not 60. Why: a restarted worker is back
    within seconds, and the message gets Flower's "ClientApp crashed" reply
    (an absence) instead of holding the round for a minute. Another version or
    no ``HEARTBEAT_PATIENCE``: no change, False.
:func:`quick_object_pulls`
    Rebinds ``pull_objects`` and ``pull_and_inflate_object_from_tree`` (those of
    ``flwr.supercore.inflatable.inflatable_utils``) as bound in one of
    ``flwr.supernode.start_client_internal``, ``flwr.superlink.grid.http_grid``
    and ``flwr.supernode.runtime.run_clientapp``, to partials with
    :data:`OBJECT_PULL_BACKOFF`. Why: both ends store a message before its
    objects, so the first pull often came too early and waited Flower's 1 s
    backoff. Another version: no change, False; a name bound to something
    else is left alone.
:func:`forget_secret_once_loaded`
    Touches ``flwr.supernode.cli.flower_supernode.load_superexec_auth_secret``:
    wrapped to remove the Runtime API secret's private folder as soon as Flower
    has read it. Why: no copy of the secret stays on disk, even if the
    SuperNode is killed later. Another version or no such name: no change,
    False (the folder then goes when the process exits).
:func:`require_control_token`
    Touches ``flwr.superlink.cli.flower_superlink.load_control_authn_plugin``
    (imported there by name from ``flwr.superlink.config_loader``): it returns
    :func:`owner_token_authn`'s plugin, which admits a Control API request only with
    ``Authorization: Bearer <token>`` of a secret only the deploying user holds.
    Why: open-source Flower's Control API (what ``flwr run`` calls) has no
    authentication (its OIDC plugin is Flower Enterprise's), so any local user
    could submit a job to ``hyfl deploy local``'s SuperLink and run code as the
    deploying user. ``flwr run`` sends the token from its own credential store
    (``$FLWR_HOME/credentials.yaml``, 0600 in a 0700 folder) as it would an
    OIDC access token. Another version or no such name: no change, False (and
    :mod:`hyfl.deploy.superlink` then refuses to start: this patch is not a
    speed-up that may be missing).
:func:`superexec_through_hyfl`
    Touches ``flwr.superlink.cli.flower_superlink._get_superexec_command``: the
    SuperLink starts its SuperExec as ``python -m hyfl.deploy.superexec``. Why: the
    next patch must run in that process. Another version: no change, False (and
    :mod:`hyfl.deploy.superlink` refuses to start).
:func:`tokens_off_command_lines`
    Replaces ``SubprocessExecutor.launch`` (``flwr.supercore.superexec.executor.
    subprocess_executor``): a task process gets ``--token-file /dev/fd/N`` (a memfd
    passed as a descriptor) instead of ``--token TOKEN``. Why: a command line is
    readable by every local user in ``/proc/PID/cmdline``, and the ServerApp's task
    token lets its holder act as the run's server. Another version or no
    ``memfd_create``: no change, False (and :mod:`hyfl.deploy.superexec` refuses to
    start).
:func:`lean_http_middleware`
    Touches ``flwr.superlink.main._get_middleware`` (the SuperLink) or
    ``flwr.supernode.main.app.user_middleware`` (a SuperNode's Runtime API): each
    of Flower's ``BaseHTTPMiddleware`` layers runs only on the requests it acts on
    (:class:`_OnlyWhere`). Why: the SuperLink wrapped every request in nine of
    them, most for the Control API only; a Fleet request needs three. Another
    version: no change, False.
:func:`hold_pulls`
    Touches ``pull_messages`` and ``push_messages`` of
    ``flwr.superlink.servicer.fleet.fleet_handlers`` and of ``...runtime.runtime_handlers``,
    and ``flwr.superlink.main._get_middleware``: a SuperNode's pull that finds no
    message is answered when the ServerApp pushes one, or after :data:`PULL_HOLD` s
    (a long poll), and the SuperNode then asks again at once (:func:`cap_supernode_polls`
    sees that the pull was held); the ServerApp's pulls of an exchange's replies are
    held the same way when they carry :data:`HOLD_HEADER` (:func:`ask_for_held_reply_pulls`
    touches the grid's ``httpx.Client`` in the ServerApp). Why: each message waited
    for an idle poller's next poll, and the polls were most of the SuperLink's
    requests. Another version: no change, False.
"""

from __future__ import annotations

import contextlib
import contextvars
import shutil
import signal
import subprocess as _subprocess
import time as _time
from pathlib import Path

from hyfl.deploy.backoff import Backoff

__all__ = ["CappedTime", "DyingSubprocess", "OBJECT_PULL_BACKOFF", "ON_MESSAGE",
           "PATCHED_VERSION", "TASK_PATIENCE", "ask_for_held_reply_pulls", "cap_supernode_polls",
           "die_with_supernode", "forget_secret_once_loaded", "held_replies", "hold_pulls",
           "lean_http_middleware", "owner_token_authn", "quick_object_pulls",
           "require_control_token", "shorten_task_patience"]


PATCHED_VERSION = "1.41.0"


#: Seconds without a heartbeat after which the SuperNode gives up on a worker's task.
TASK_PATIENCE = 10.0


class CappedTime:
    """The ``time`` module with ``sleep`` capped: the idle poll (3 s in Flower) backs off
    from a millisecond to ``limit`` seconds, the shorter waits (for the ClientApp's
    reply, 0.5 s in Flower) are capped at ``reply_limit``."""

    def __init__(self, limit: float, reply_limit: float | None = None):
        self.idle = Backoff(limit)
        self.reply_limit = limit if reply_limit is None else reply_limit

    def __getattr__(self, name):
        return getattr(_time, name)

    def sleep(self, seconds: float) -> None:
        _time.sleep(self.idle.next() if seconds >= 1.0 else min(seconds, self.reply_limit))


#: Seconds after which an empty pull counts as held by the SuperLink (:func:`hold_pulls`).
HELD_PULL = 0.5


#: Called (in the SuperNode's process, with its ``NodeState``) each time the SuperNode has
#: stored a message with its objects: :func:`hyfl.deploy.supernode.main` runs the party's
#: task through it, or :func:`~hyfl.deploy.supernode.supervise_worker` wakes the worker.
ON_MESSAGE: list = []


def cap_supernode_polls(limit: float, reply_limit: float | None = None) -> bool:
    """Cap the SuperNode's poll sleeps; False (and no change) if Flower is not 1.41.0."""
    import flwr
    import flwr.supernode.start_client_internal as internal

    if flwr.__version__ != PATCHED_VERSION or getattr(internal, "time", None) is not _time:
        return False
    capped = CappedTime(limit, reply_limit)
    pull = internal._pull_and_store_message

    def pull_and_reset(*args, **kwargs):  # a message came: poll quickly for the next one
        asked = _time.monotonic()
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            capped.idle.reset()
            for hook in ON_MESSAGE:
                hook(kwargs.get("state"))
        elif _time.monotonic() - asked >= HELD_PULL:  # the SuperLink held it (hold_pulls):
            capped.idle.reset()  # it waits for us, so ask again at once
        return run_id

    internal.time, internal._pull_and_store_message = capped, pull_and_reset
    return True


class DyingSubprocess:
    """The ``subprocess`` module whose ``Popen`` children get SIGKILL when their parent dies."""

    def __getattr__(self, name):
        return getattr(_subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs):  # noqa: N802 (the module's name)
        from hyfl.deploy._reaper import PR_SET_PDEATHSIG, prctl

        if "preexec_fn" not in kwargs:
            kwargs["preexec_fn"] = lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        return _subprocess.Popen(*args, **kwargs)


def die_with_supernode() -> bool:
    """Linux: the SuperExec the SuperNode starts dies with it; False (no change) elsewhere."""
    import flwr
    import flwr.supernode.start_client_internal as internal

    from hyfl.deploy._reaper import LINUX

    if (not LINUX or flwr.__version__ != PATCHED_VERSION
            or getattr(internal, "subprocess", None) is not _subprocess):
        return False
    internal.subprocess = DyingSubprocess()
    return True


def shorten_task_patience(seconds: float = TASK_PATIENCE) -> bool:
    """Expire a silent task after ``seconds`` (Flower: 60); False (no change) if not 1.41.0."""
    import flwr
    import flwr.supercore.corestate.in_memory_corestate as corestate

    if flwr.__version__ != PATCHED_VERSION or not hasattr(corestate, "HEARTBEAT_PATIENCE"):
        return False
    corestate.HEARTBEAT_DEFAULT_INTERVAL = seconds / corestate.HEARTBEAT_PATIENCE
    return True


#: Backoff of a pull of a message's objects that are not there yet (Flower: 1 s, doubling
#: to 10 s). Both ends store a message before its objects, so the first pull often
#: comes too early: each message waited about a second for nothing.
OBJECT_PULL_BACKOFF = (0.002, 0.05)


def quick_object_pulls(module_name: str) -> bool:
    """Retry early object pulls in ``module_name`` after milliseconds, not seconds.

    ``module_name`` is one of the Flower 1.41.0 modules that pull a message's
    objects: ``flwr.supernode.start_client_internal`` (SuperNode from
    SuperLink), ``flwr.superlink.grid.http_grid`` (ServerApp from SuperLink),
    ``flwr.supernode.runtime.run_clientapp`` (ClientApp from SuperNode).
    False (and no change) with another Flower version.
    """
    import functools
    import importlib

    import flwr
    from flwr.supercore.inflatable import inflatable_utils

    if flwr.__version__ != PATCHED_VERSION:
        return False
    module = importlib.import_module(module_name)
    initial, cap = OBJECT_PULL_BACKOFF
    for name in ("pull_objects", "pull_and_inflate_object_from_tree"):
        original = getattr(inflatable_utils, name)
        if getattr(module, name, None) is original:
            setattr(module, name, functools.partial(original, initial_backoff=initial,
                                                    backoff_cap=cap))
    return True


def forget_secret_once_loaded(path: Path) -> bool:
    """Remove the secret's folder as soon as Flower's SuperNode has read the secret.

    The SuperNode keeps it in memory; the workers get it through a pipe
    (:func:`hyfl.deploy.supernode.supervise_worker`), so no copy stays on disk, even if
    the SuperNode is killed later. False (the folder stays until exit) if Flower reads it
    elsewhere (or is not 1.41.0).
    """
    import importlib

    import flwr

    if flwr.__version__ != PATCHED_VERSION:
        return False
    # (``import ... as`` would give the function the package re-exports under this name)
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    load = getattr(cli, "load_superexec_auth_secret", None)
    if load is None:
        return False

    def load_and_forget(secret_file):
        try:
            return load(secret_file)
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)

    cli.load_superexec_auth_secret = load_and_forget
    return True


def _owner_token_authn_class():
    """The plugin class of :func:`owner_token_authn`, built on Flower's
    ``ControlAuthnPlugin`` (imported here: importing this module must not import Flower)."""
    import hmac

    from flwr.common.constant import ACCESS_TOKEN_KEY, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
    from flwr.supercore.auth.typing import AccountInfo
    from flwr.supercore.error import ApiErrorCode, FlowerError
    from flwr.superlink.auth_plugin import ControlAuthnPlugin

    class _OwnerTokenAuthn(ControlAuthnPlugin):
        """Admits a Control API request only with the deploying user's bearer token.

        The account it returns is Flower's no-auth account: the SuperLink's (no-op)
        federation has that one member, and runs belong to it as without a plugin.
        """

        def __init__(self, token: bytes = b""):
            if len(token) < 32:
                raise ValueError("the Control API token must have at least 32 bytes")
            self.token = bytes(token)

        def get_login_details(self):
            return None  # no login: the token is handed to flwr through its own store

        def validate_tokens_in_metadata(self, metadata):
            given = [v for k, v in metadata if k == ACCESS_TOKEN_KEY]
            value = given[0] if len(given) == 1 else b""
            value = value.encode() if isinstance(value, str) else bytes(value)
            if value and hmac.compare_digest(value, self.token):
                return True, AccountInfo(flwr_aid=NOOP_FLWR_AID, account_name=NOOP_ACCOUNT_NAME)
            return False, None

        def get_auth_tokens(self, device_code):
            raise FlowerError(ApiErrorCode.NO_ACCOUNT_AUTH,
                              "This SuperLink admits only its owner's token; there is no login.")

        def refresh_tokens(self, metadata):
            return None, None  # nothing to refresh: the token does not expire

    return _OwnerTokenAuthn


def owner_token_authn(token: bytes):
    """A Flower ``ControlAuthnPlugin`` admitting only requests bearing ``token``."""
    return _owner_token_authn_class()(token)


def require_control_token(token: bytes) -> bool:
    """Admit only Control API requests bearing ``token``; False (no change) if Flower is not
    1.41.0 or reads its Control authentication plugin elsewhere."""
    import importlib

    import flwr

    if flwr.__version__ != PATCHED_VERSION:
        return False
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")
    if not callable(getattr(cli, "load_control_authn_plugin", None)):
        return False
    plugin = owner_token_authn(token)
    cli.load_control_authn_plugin = lambda: plugin
    return True


#: The module the SuperLink starts its SuperExec through (:func:`superexec_through_hyfl`).
SUPEREXEC_MODULE = "hyfl.deploy.superexec"


def superexec_through_hyfl() -> bool:
    """Start the SuperLink's SuperExec as ``python -m hyfl.deploy.superexec`` (Flower's
    ``flower-superexec`` with :func:`tokens_off_command_lines`); False (no change) if Flower
    is not 1.41.0 or builds that command elsewhere.

    Touches ``flwr.superlink.cli.flower_superlink._get_superexec_command``. Why: the
    SuperExec, a process of its own, starts each ServerApp with its task token on the
    command line (``flwr-serverapp --token ...``), which every local user reads in
    ``/proc/PID/cmdline``; the patch must run in that process."""
    import importlib
    import sys

    import flwr

    if flwr.__version__ != PATCHED_VERSION:
        return False
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")
    original = getattr(cli, "_get_superexec_command", None)
    if not callable(original) or getattr(original, "_hyfl", False):
        return callable(original)

    def command(*args, **kwargs) -> list[str]:
        flower = original(*args, **kwargs)
        if not flower or flower[0] != "flower-superexec":
            return flower
        return [sys.executable, "-m", SUPEREXEC_MODULE, *flower[1:]]

    command._hyfl = True  # type: ignore[attr-defined]
    cli._get_superexec_command = command
    return True


def tokens_off_command_lines() -> bool:
    """A SuperExec that hands each task's token to its process (``flwr-serverapp``) as
    ``--token-file /dev/fd/N``: an anonymous in-memory file (``memfd_create``) passed as
    an open descriptor, on no command line and on no disk; False (no change) if Flower is
    not 1.41.0 or its subprocess executor builds the command otherwise.

    Touches ``flwr.supercore.superexec.executor.subprocess_executor.SubprocessExecutor``'s
    ``launch``. Flower's task processes read ``--token-file`` with ``Path.read_text`` after
    an ``isfile`` check, which a memfd passes (it is a regular file). Only the process
    itself (and its user, through ``/proc/PID/fd``) can open it."""
    import importlib
    import os
    import subprocess

    import flwr

    if flwr.__version__ != PATCHED_VERSION or not hasattr(os, "memfd_create"):
        return False
    module = importlib.import_module("flwr.supercore.superexec.executor.subprocess_executor")
    executor = getattr(module, "SubprocessExecutor", None)
    launch = getattr(executor, "launch", None)
    if not callable(launch):
        return False
    if getattr(launch, "_hyfl", False):
        return True
    constant = importlib.import_module("flwr.supercore.constant")
    types = importlib.import_module("flwr.supercore.superexec.executor.types")

    def private_launch(self, spec):
        fd = os.memfd_create("flwr-task-token")  # close-on-exec: only pass_fds hands it on
        try:
            os.write(fd, str(spec.token).encode())
            args = [constant.TASK_TYPE_TO_COMMAND[spec.task_type],
                    constant.TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
                    spec.runtime_api_address, "--token-file", f"/dev/fd/{fd}"]
            if spec.insecure:
                args.append("--insecure")
            elif spec.root_certificates_path is not None:
                args.extend(["--root-certificates", spec.root_certificates_path])
            if spec.parent_pid is not None:
                args.extend(["--parent-pid", str(spec.parent_pid)])
            if spec.runtime_dependency_install:
                args.append("--allow-runtime-dependency-installation")
            output = ({"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
                      if spec.suppress_output else {})
            subprocess.Popen(args, pass_fds=(fd,), **output)  # noqa: S603
        finally:
            os.close(fd)
        return types.LaunchResult.accepted()

    private_launch._hyfl = True  # type: ignore[attr-defined]
    executor.launch = private_launch
    return True


class _OnlyWhere:
    """An ASGI middleware that runs ``middleware`` (a Starlette ``Middleware``) around
    ``app`` only for HTTP requests where ``applies(scope)`` holds, and otherwise calls
    ``app`` directly.

    Why: each of Flower's ``BaseHTTPMiddleware`` layers costs a task, two memory
    streams and a re-wrapped body on every request, also on a request it then
    passes straight on (``call_next``); ``applies`` is the layer's own test of
    whether it does anything for the request, written here from its source
    (Flower 1.41.0), so skipping it changes no response."""

    def __init__(self, app, middleware, applies):
        self.app, self.applies = app, applies
        self.wrapped = middleware.cls(app, *middleware.args, **middleware.kwargs)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.applies(scope):
            await self.wrapped(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _middleware_tests() -> dict:
    """Each Flower middleware class whose work depends on the request: when it acts."""
    import importlib
    import os

    control = importlib.import_module("flwr.superlink.routers.control.middlewares")
    fleet = importlib.import_module("flwr.superlink.routers.fleet.middlewares")
    node_auth = importlib.import_module("flwr.superlink.routers.fleet.node_auth")
    translation = importlib.import_module("flwr.supercore.protobuf.translation")
    tracing = importlib.import_module("flwr.supercore.routers.runtime.tracing")

    from starlette.datastructures import URL

    def path(scope) -> str:  # as Flower's middlewares read it (request.url.path)
        return URL(scope=scope).path

    def is_control(scope) -> bool:
        return path(scope).startswith("/v1/control/")

    def is_fleet(scope) -> bool:
        return path(scope).startswith("/v1/fleet/")

    def fleet_logged(scope) -> bool:
        app = scope.get("app")
        return is_fleet(scope) and (
            app is None or getattr(app.state, "fleet_event_log_plugin", None) is not None)

    def is_protobuf(scope) -> bool:
        return (scope["method"], path(scope)) in translation.PROTOBUF_REQUEST_TYPES

    def tracing_on(scope) -> bool:  # read per request, as the middleware does
        return os.getenv("FLWR_TRACING_ENABLED") == "1"

    return {control.ControlSensitiveResponseMiddleware: is_control,
            control.ControlEventLogMiddleware: is_control,
            control.ControlLicenseMiddleware: is_control,
            control.ControlAuthenticationMiddleware: is_control,
            fleet.FleetEventLogMiddleware: fleet_logged,
            node_auth.NodeAuthMiddleware: is_fleet,
            translation.ProtobufTranslationMiddleware: is_protobuf,
            tracing.RuntimeTracingMiddleware: tracing_on}


def _lean(middleware: list, tests: dict) -> list:
    """``middleware`` (Starlette ``Middleware`` items) with each layer of ``tests`` run only
    where it acts; any other layer (the error translator, an extension's) as it is."""
    from starlette.middleware import Middleware

    return [Middleware(_OnlyWhere, middleware=item, applies=tests[item.cls])
            if item.cls in tests else item for item in middleware]


def lean_http_middleware(server: str) -> bool:
    """Run each of Flower's HTTP middleware layers only on the requests it acts on, in the
    SuperLink (``server="superlink"``) or a SuperNode's Runtime API (``"supernode"``);
    False (no change) if Flower is not 1.41.0 or builds its middleware elsewhere.

    Touches ``flwr.superlink.main._get_middleware`` (read by ``create_app`` when the
    SuperLink starts) or ``flwr.supernode.main.app.user_middleware`` (the app is
    built at import; Starlette builds its middleware stack at the first request).
    Why: the SuperLink wraps every request in nine ``BaseHTTPMiddleware`` layers,
    four of them for the Control API only and two active only with tracing or
    event logs configured; a Fleet request needs three of them, a ServerApp's two.
    The SuperLink spent 84% of its time in that stack (docs/deployment.md)."""
    import importlib

    import flwr

    if flwr.__version__ != PATCHED_VERSION:
        return False
    try:
        tests = _middleware_tests()
    except (ImportError, AttributeError):
        return False
    if server == "superlink":
        main = importlib.import_module("flwr.superlink.main")
        original = getattr(main, "_get_middleware", None)
        if not callable(original):
            return False
        if not getattr(original, "_hyfl_lean", False):
            def lean():
                return _lean(original(), tests)

            lean._hyfl_lean = True  # type: ignore[attr-defined]
            main._get_middleware = lean
        return True
    if server == "supernode":
        app = getattr(importlib.import_module("flwr.supernode.main"), "app", None)
        if app is None or getattr(app, "middleware_stack", None) is not None:
            return False  # not a Starlette app, or already serving
        app.user_middleware[:] = _lean(app.user_middleware, tests)
        return True
    raise ValueError(f"server must be 'superlink' or 'supernode', not {server!r}")


#: Seconds the SuperLink holds an empty pull for messages (:func:`hold_pulls`).
PULL_HOLD = 2.0
#: At most this many pulls are held at once (the rest answer at once, as in Flower): each
#: holds one of the 40 threads of Starlette's pool, which every request needs.
HELD_PULLS_AT_ONCE = 16


class _Arrivals:
    """Messages stored in the SuperLink: pulls waiting for one (:func:`hold_pulls`)."""

    def __init__(self, slots: int):
        import threading

        self.stored = threading.Condition()
        self.slots = threading.BoundedSemaphore(slots)
        self.generation = 0  # pushes so far: a pull waits only while no push came since

    def notify(self) -> None:
        with self.stored:
            self.generation += 1
            self.stored.notify_all()

    def hold(self, pull, empty, hold: float):
        """``pull()`` again each time a message is stored, until it is not ``empty`` or
        ``hold`` seconds have passed; at once when every slot is taken."""
        seen = self.generation
        response = pull()
        if not empty(response) or not self.slots.acquire(blocking=False):
            return response
        try:
            deadline = _time.monotonic() + hold
            while empty(response) and (left := deadline - _time.monotonic()) > 0:
                with self.stored:
                    # A push between the pull and here has moved the generation on:
                    # look again at once instead of waiting (no lost wake-up).
                    if self.generation == seen:
                        self.stored.wait(min(left, 0.25))
                    seen = self.generation
                response = pull()
            return response
        finally:
            self.slots.release()


#: The HTTP header with which the ServerApp asks the SuperLink to hold its pull of
#: replies (:func:`ask_for_held_reply_pulls`); only pulls made in :func:`held_replies`.
HOLD_HEADER = "x-hyfl-hold"
#: Set (in the SuperLink) while a request that carries :data:`HOLD_HEADER` is served.
_HOLD_ASKED = contextvars.ContextVar("hyfl_hold_asked", default=False)
#: Set (in the ServerApp) inside :func:`held_replies`.
_ASKING = contextvars.ContextVar("hyfl_asking_hold", default=False)


class _NoteHoldHeader:
    """An ASGI middleware noting (in :data:`_HOLD_ASKED`) that a request asks to be held;
    the context reaches the handler's thread (Starlette's thread pool copies it)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        asked = scope["type"] == "http" and any(
            name == HOLD_HEADER.encode() and value == b"1"
            for name, value in scope.get("headers", ()))
        token = _HOLD_ASKED.set(asked)
        try:
            await self.app(scope, receive, send)
        finally:
            _HOLD_ASKED.reset(token)


def hold_pulls(hold: float = PULL_HOLD) -> bool:
    """Make the SuperLink answer a pull that finds nothing only when something comes or
    after ``hold`` seconds (a long poll): a SuperNode's pull of messages always, the
    ServerApp's pull of replies when it asks (:data:`HOLD_HEADER`); False (no change)
    if Flower is not 1.41.0 or its handlers are elsewhere.

    Touches ``pull_messages`` and ``push_messages`` of
    ``flwr.superlink.servicer.fleet.fleet_handlers`` and of
    ``flwr.superlink.servicer.runtime.runtime_handlers`` (the routers look them up
    as module attributes per request), and ``flwr.superlink.main._get_middleware``
    (an outermost layer notes the header): every push wakes the held pulls, which
    look again. Why: Flower's pollers ask again and again (an idle SuperNode every
    0.2 s, the ServerApp every 50 ms while it waits for replies), so each message
    waited for the next poll, and the polls were most of the SuperLink's requests.
    A pull is answered within ``hold`` s, far inside the clients' 30 s timeout; a
    SuperNode's loop pulls only when it has no reply to push; the ServerApp asks for
    holds only while it waits for the replies of an exchange (a ping's pull must
    never wait); at most :data:`HELD_PULLS_AT_ONCE` pulls are held, so the server
    never runs out of threads."""
    import importlib

    import flwr

    if flwr.__version__ != PATCHED_VERSION:
        return False
    fleet = importlib.import_module("flwr.superlink.servicer.fleet.fleet_handlers")
    runtime = importlib.import_module("flwr.superlink.servicer.runtime.runtime_handlers")
    main = importlib.import_module("flwr.superlink.main")
    names = ("pull_messages", "push_messages")
    targets = [getattr(m, n, None) for m in (fleet, runtime) for n in names]
    middleware = getattr(main, "_get_middleware", None)
    if not all(callable(t) for t in (*targets, middleware)):
        return False
    if getattr(fleet.pull_messages, "_hyfl", False):
        return True
    from starlette.middleware import Middleware

    arrivals = _Arrivals(HELD_PULLS_AT_ONCE)

    def held(pull, always: bool):
        def pull_messages(*args, **kwargs):
            if not (always or _HOLD_ASKED.get()):
                return pull(*args, **kwargs)
            return arrivals.hold(lambda: pull(*args, **kwargs),
                                 lambda response: not response.messages_list, hold)
        return pull_messages

    def waking(push):
        def push_messages(*args, **kwargs):
            try:
                return push(*args, **kwargs)
            finally:
                arrivals.notify()
        return push_messages

    def noting_holds():
        return [Middleware(_NoteHoldHeader), *middleware()]

    patched = [(fleet, "pull_messages", held(fleet.pull_messages, True)),
               (runtime, "pull_messages", held(runtime.pull_messages, False)),
               (fleet, "push_messages", waking(fleet.push_messages)),
               (runtime, "push_messages", waking(runtime.push_messages)),
               (main, "_get_middleware", noting_holds)]
    for module, name, value in patched:
        value._hyfl = True  # type: ignore[attr-defined]
        setattr(module, name, value)
    return True


def ask_for_held_reply_pulls(grid) -> bool:
    """Let the ServerApp's pulls of replies made inside :func:`held_replies` ask the
    SuperLink to hold them (:data:`HOLD_HEADER`, :func:`hold_pulls`); False (no change)
    if Flower is not 1.41.0 or ``grid`` is not its HTTP grid.

    Touches ``grid._runtime_client._client`` (the grid's ``httpx.Client``): a request
    hook adds the header to ``/v1/runtime/pull-messages`` requests while
    :data:`_ASKING` is set. A SuperLink without :func:`hold_pulls` ignores the header
    and answers at once, as before."""
    import flwr
    import httpx

    if flwr.__version__ != PATCHED_VERSION:
        return False
    try:
        client = grid._runtime_client._client
    except Exception:  # noqa: BLE001 (another grid: an in-memory one, a test's)
        return False
    if not isinstance(client, httpx.Client):
        return False
    hooks = client.event_hooks
    if any(getattr(hook, "_hyfl", False) for hook in hooks.get("request", ())):
        return True

    def ask(request):
        if _ASKING.get() and request.url.path.endswith("/v1/runtime/pull-messages"):
            request.headers[HOLD_HEADER] = "1"

    ask._hyfl = True  # type: ignore[attr-defined]
    client.event_hooks = {**hooks, "request": [*hooks.get("request", ()), ask]}
    return True


@contextlib.contextmanager
def held_replies():
    """Inside: the ServerApp's pulls of replies may be held (:func:`ask_for_held_reply_pulls`)."""
    token = _ASKING.set(True)
    try:
        yield
    finally:
        _ASKING.reset(token)
