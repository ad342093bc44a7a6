"""Each patch of :mod:`hyfl.deploy.flower_patches` against the installed Flower.

For every patch: its target exists and is what the patch expects before it is
applied (Flower's own object), Flower's code looks the name up as a module global
at call time (a ``LOAD_GLOBAL`` in one of the module's functions, not a value bound
as a default argument at import), and once patched the patched value is what a
call gets. A Flower release that renames, moves or rebinds a target fails here,
instead of the deployment's speed-ups silently switching off. Every patch is
undone after its test (monkeypatch registers the originals first).
"""

from __future__ import annotations

import dis
import functools
import importlib
import inspect
import subprocess
import sys
import time
import types

import pytest

flwr = pytest.importorskip("flwr")

from hyfl.deploy import flower_patches as patches  # noqa: E402

pytestmark = pytest.mark.skipif(flwr.__version__ != patches.PATCHED_VERSION,
                                reason=f"the patches target Flower {patches.PATCHED_VERSION}")

OBJECT_PULL_MODULES = ("flwr.supernode.start_client_internal", "flwr.superlink.grid.http_grid",
                       "flwr.supernode.runtime.run_clientapp")


def _code_objects(module: types.ModuleType):
    """The code of every function (nested ones and methods too) defined in ``module``."""
    stack = [value.__code__ for value in vars(module).values()
             if inspect.isfunction(value) and value.__module__ == module.__name__]
    for value in vars(module).values():
        if inspect.isclass(value) and value.__module__ == module.__name__:
            stack += [f.__code__ for f in vars(value).values() if inspect.isfunction(f)]
    while stack:
        code = stack.pop()
        yield code
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]


def _reads_global(module: types.ModuleType, name: str) -> bool:
    """Whether a function of ``module`` looks ``name`` up as a global when it runs."""
    return any(ins.opname == "LOAD_GLOBAL" and ins.argval == name
               for code in _code_objects(module) for ins in dis.get_instructions(code))


def _bound_at_import(module: types.ModuleType, value) -> bool:
    """Whether a function of ``module`` holds ``value`` as a default argument."""
    for f in vars(module).values():
        if inspect.isfunction(f) and f.__module__ == module.__name__:
            defaults = (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values())
            if any(d is value for d in defaults):
                return True
    return False


def test_the_supernodes_poll_sleeps_are_capped(monkeypatch):
    internal = importlib.import_module("flwr.supernode.start_client_internal")
    assert internal.time is time  # Flower's own module, before the patch
    assert inspect.isfunction(internal._pull_and_store_message)
    assert internal._pull_and_store_message.__module__ == internal.__name__
    assert _reads_global(internal, "time") and _reads_global(internal, "_pull_and_store_message")
    calls = []
    monkeypatch.setattr(internal, "time", internal.time)  # restored after the test
    monkeypatch.setattr(internal, "_pull_and_store_message", lambda *a, **k: 7)
    monkeypatch.setattr(patches, "ON_MESSAGE", [calls.append])  # given the NodeState
    assert patches.cap_supernode_polls(0.05, 0.002)
    assert isinstance(internal.time, patches.CappedTime)
    started = time.perf_counter()
    internal.time.sleep(3)  # Flower's idle poll: backed off from a millisecond
    internal.time.sleep(0.5)  # its wait for the ClientApp's reply: capped
    assert time.perf_counter() - started < 0.5
    node_state = object()
    assert internal._pull_and_store_message(state=node_state) == 7 and calls == [node_state]
    assert internal.time.monotonic() > 0  # the rest of the time module passes through
    assert not patches.cap_supernode_polls(0.05)  # applied once only


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_superexec_dies_with_the_supernode(monkeypatch):
    internal = importlib.import_module("flwr.supernode.start_client_internal")
    assert internal.subprocess is subprocess and _reads_global(internal, "subprocess")
    monkeypatch.setattr(internal, "subprocess", internal.subprocess)
    assert patches.die_with_supernode()
    assert isinstance(internal.subprocess, patches.DyingSubprocess)
    # A child started through the patched name has SIGKILL (9) as its parent-death signal.
    probe = ("import ctypes, signal; libc = ctypes.CDLL(None); v = ctypes.c_int(); "
             "libc.prctl(2, ctypes.byref(v)); print(v.value)")  # PR_GET_PDEATHSIG
    child = internal.subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE,
                                      text=True)
    out, _ = child.communicate(timeout=60)
    assert int(out) == 9


def test_a_silent_task_expires_after_task_patience(monkeypatch):
    corestate = importlib.import_module("flwr.supercore.corestate.in_memory_corestate")
    constant = importlib.import_module("flwr.common.constant")
    assert corestate.HEARTBEAT_DEFAULT_INTERVAL == constant.HEARTBEAT_DEFAULT_INTERVAL
    assert _reads_global(corestate, "HEARTBEAT_DEFAULT_INTERVAL")
    assert not _bound_at_import(corestate, corestate.HEARTBEAT_DEFAULT_INTERVAL)
    monkeypatch.setattr(corestate, "HEARTBEAT_DEFAULT_INTERVAL",
                        corestate.HEARTBEAT_DEFAULT_INTERVAL)
    assert patches.shorten_task_patience(10.0)
    assert corestate.HEARTBEAT_PATIENCE * corestate.HEARTBEAT_DEFAULT_INTERVAL == \
        pytest.approx(10.0)
    # The SuperNode's state (Flower's own class) gives a running task that much patience.
    from flwr.supercore.constant import TaskType
    from flwr.supercore.date import now
    from flwr.supernode.nodestate import InMemoryNodeState

    state = InMemoryNodeState(None)
    task = state.create_task(TaskType.CLIENT_APP, 1)
    started = now()
    assert state.claim_task(task) and state.activate_task(task)
    assert state.acknowledge_task_heartbeat(task)
    patience = (state.task_token_store[task].active_until - started).total_seconds()
    assert 10.0 <= patience < 11.0


@pytest.mark.parametrize("module_name", OBJECT_PULL_MODULES)
def test_early_object_pulls_retry_after_milliseconds(monkeypatch, module_name):
    from flwr.supercore.inflatable import inflatable_utils

    module = importlib.import_module(module_name)
    bound = [n for n in ("pull_objects", "pull_and_inflate_object_from_tree")
             if getattr(module, n, None) is getattr(inflatable_utils, n)]
    assert bound, f"{module_name} binds neither pull function"
    for name in bound:
        assert _reads_global(module, name)
        assert {"initial_backoff", "backoff_cap"} <= set(
            inspect.signature(getattr(inflatable_utils, name)).parameters)
        monkeypatch.setattr(module, name, getattr(module, name))
    assert patches.quick_object_pulls(module_name)
    initial, cap = patches.OBJECT_PULL_BACKOFF
    for name in bound:
        patched = getattr(module, name)
        assert isinstance(patched, functools.partial)
        assert patched.func is getattr(inflatable_utils, name)
        assert patched.keywords == {"initial_backoff": initial, "backoff_cap": cap}


def test_the_runtime_api_secret_is_forgotten_once_loaded(monkeypatch, tmp_path):
    from flwr.supercore.auth import superexec_secret

    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    assert cli.load_superexec_auth_secret is superexec_secret.load_superexec_auth_secret
    assert _reads_global(cli, "load_superexec_auth_secret")
    monkeypatch.setattr(cli, "load_superexec_auth_secret", cli.load_superexec_auth_secret)
    folder = tmp_path / "private"
    folder.mkdir()
    secret = folder / "secret"
    secret.write_bytes(b"ab" * 32)
    assert patches.forget_secret_once_loaded(secret)
    assert cli.load_superexec_auth_secret(secret)  # Flower's call, through the patch
    assert not folder.exists()


def test_another_flower_version_is_left_unmodified(monkeypatch, tmp_path):
    internal = importlib.import_module("flwr.supernode.start_client_internal")
    corestate = importlib.import_module("flwr.supercore.corestate.in_memory_corestate")
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    pulls = [importlib.import_module(m) for m in OBJECT_PULL_MODULES]

    def targets():
        return (internal.time, internal.subprocess, internal._pull_and_store_message,
                corestate.HEARTBEAT_DEFAULT_INTERVAL, cli.load_superexec_auth_secret,
                *[getattr(m, n, None) for m in pulls
                  for n in ("pull_objects", "pull_and_inflate_object_from_tree")])

    before = targets()
    secret = tmp_path / "private" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(b"ab" * 32)
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    assert not patches.cap_supernode_polls(0.05)
    assert not patches.die_with_supernode()
    assert not patches.shorten_task_patience()
    assert not any(patches.quick_object_pulls(m) for m in OBJECT_PULL_MODULES)
    assert not patches.forget_secret_once_loaded(secret)
    assert targets() == before
    assert secret.exists()


def test_the_control_api_admits_only_the_owners_token(monkeypatch):
    """``load_control_authn_plugin`` is Flower's own (the no-op plugin in open-source
    Flower), read as a global when the SuperLink parses its options; once patched, that
    call gets the owner-token plugin; another version changes nothing."""
    from flwr.common.constant import ACCESS_TOKEN_KEY
    from flwr.superlink import config_loader
    from flwr.superlink.auth_plugin import NoOpControlAuthnPlugin

    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")
    assert cli.load_control_authn_plugin is config_loader.load_control_authn_plugin
    assert isinstance(cli.load_control_authn_plugin(), NoOpControlAuthnPlugin)
    assert _reads_global(cli, "load_control_authn_plugin")
    monkeypatch.setattr(cli, "load_control_authn_plugin", cli.load_control_authn_plugin)
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    before = cli.load_control_authn_plugin
    assert not patches.require_control_token(b"t" * 64)
    assert cli.load_control_authn_plugin is before
    monkeypatch.setattr(flwr, "__version__", patches.PATCHED_VERSION)
    assert patches.require_control_token(b"t" * 64)
    plugin = cli.load_control_authn_plugin()
    assert plugin.validate_tokens_in_metadata([(ACCESS_TOKEN_KEY, "t" * 64)])[0]
    assert plugin.validate_tokens_in_metadata([]) == (False, None)


#: Requests whose responses must not change when the middleware is lean: the health
#: route, Fleet requests (malformed, unsigned, of another type), a malformed Control request, a
#: Runtime request without a task token, and an unknown path.
_REQUESTS = [("GET", "/health", b"", {}),
             ("POST", "/v1/fleet/pull-messages", b"\x01\x02",
              {"content-type": "application/protobuf"}),
             ("POST", "/v1/fleet/pull-messages", b"", {"content-type": "application/protobuf"}),
             ("POST", "/v1/fleet/pull-messages", b"", {"content-type": "text/plain"}),
             ("POST", "/v1/control/list-runs", b"\x01\x02",
              {"content-type": "application/protobuf"}),
             ("POST", "/v1/runtime/get-nodes", b"", {"content-type": "application/protobuf"}),
             ("POST", "/v1/fleet/nonexistent", b"", {})]


def _responses(app) -> list:
    from starlette.testclient import TestClient

    client = TestClient(app)
    answers = []
    for method, path, body, headers in _REQUESTS:
        reply = client.request(method, path, content=body, headers=headers)
        answers.append((reply.status_code, reply.content, sorted(reply.headers.items())))
    return answers


def _layers(app) -> list:
    """The app's middleware, outermost first: each layer's class and, for a lean layer,
    the class it runs only where it acts."""
    return [(item.cls, getattr(item.kwargs.get("middleware"), "cls", None))
            for item in app.user_middleware]


def test_the_superlinks_middleware_runs_only_where_it_acts(monkeypatch):
    """``create_app`` reads ``_get_middleware`` as a global; once patched, every Flower
    layer but the error translator runs only where it acts, and the SuperLink answers
    every request exactly as before (status, body, headers); another version changes
    nothing."""
    from starlette.middleware.base import BaseHTTPMiddleware

    main = importlib.import_module("flwr.superlink.main")
    assert _reads_global(main, "_get_middleware")
    monkeypatch.setattr(main, "_get_middleware", main._get_middleware)
    before_app = main.create_app()
    known = set(patches._middleware_tests())
    assert {cls for cls, _ in _layers(before_app)} <= known | {BaseHTTPMiddleware}
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    assert not patches.lean_http_middleware("superlink")
    assert _layers(main.create_app()) == _layers(before_app)
    monkeypatch.setattr(flwr, "__version__", patches.PATCHED_VERSION)
    assert patches.lean_http_middleware("superlink")
    lean_app = main.create_app()
    assert [inner or cls for cls, inner in _layers(lean_app)] == [cls for cls, _ in
                                                                  _layers(before_app)]
    assert [cls for cls, _ in _layers(lean_app)].count(BaseHTTPMiddleware) == 1
    assert _responses(lean_app) == _responses(before_app)


def test_the_supernodes_middleware_runs_only_where_it_acts(monkeypatch):
    """The SuperNode's Runtime API app is built at import; its middleware list is made
    lean before the first request, with the same answers; once the app serves, the
    patch refuses (Starlette has built the stack)."""
    supernode_main = importlib.import_module("flwr.supernode.main")
    fresh = supernode_main.create_app()
    before = _responses(supernode_main.create_app())
    monkeypatch.setattr(supernode_main, "app", fresh)
    layers = _layers(fresh)
    assert patches.lean_http_middleware("supernode")
    assert [inner or cls for cls, inner in _layers(fresh)] == [cls for cls, _ in layers]
    assert sum(inner is not None for _, inner in _layers(fresh)) == 2  # tracing, protobuf
    assert _responses(fresh) == before
    assert not patches.lean_http_middleware("supernode")  # serving: too late


def test_an_empty_pull_held_by_the_superlink_is_followed_by_another_at_once(monkeypatch):
    """A pull that came back empty after :data:`HELD_PULL` s was held by the SuperLink
    (:func:`hold_pulls`): the SuperNode asks again after a millisecond, not after its
    backed-off idle wait; a quick empty pull (a SuperLink that does not hold) backs off."""
    internal = importlib.import_module("flwr.supernode.start_client_internal")
    monkeypatch.setattr(internal, "time", internal.time)
    monkeypatch.setattr(patches, "HELD_PULL", 0.05)
    answers = iter([None, None])

    def pull(*args, **kwargs):
        if pull.slow:
            time.sleep(0.06)
        return next(answers)

    pull.slow = False
    monkeypatch.setattr(internal, "_pull_and_store_message", pull)
    assert patches.cap_supernode_polls(0.2)
    capped = internal.time
    capped.idle.wait = 0.2  # long idle
    assert internal._pull_and_store_message() is None
    assert capped.idle.wait == 0.2  # answered at once: still backed off
    pull.slow = True
    assert internal._pull_and_store_message() is None
    assert capped.idle.wait == capped.idle.start  # held: ask again at once


def test_held_pulls_answer_when_a_message_is_stored(monkeypatch):
    """The routers look both handlers up per request (module attributes; the runtime
    router's handlers are the ``runtime_handlers`` module); once patched, an empty fleet
    pull waits until the ServerApp's next push (then looks again and answers with it)
    or until the hold ends; with every slot taken it answers at once; another version
    changes nothing."""
    import threading

    fleet = importlib.import_module("flwr.superlink.servicer.fleet.fleet_handlers")
    runtime = importlib.import_module("flwr.superlink.servicer.runtime.runtime_handlers")
    fleet_router = importlib.import_module("flwr.superlink.routers.fleet.router")
    main = importlib.import_module("flwr.superlink.main")
    assert fleet_router.fleet_handlers is fleet and _reads_global(fleet_router, "fleet_handlers")
    assert main._RUNTIME_HANDLERS is runtime
    assert fleet.pull_messages.__module__ == fleet.__name__
    assert runtime.push_messages.__module__ == runtime.__name__
    stored: list = []

    class Response:
        def __init__(self, messages):
            self.messages_list = messages

    monkeypatch.setattr(fleet, "pull_messages", lambda request, state, store:
                        Response(list(stored)))
    monkeypatch.setattr(runtime, "push_messages", lambda request, state, task:
                        stored.append(request) or "pushed")
    replies: list = []
    monkeypatch.setattr(runtime, "pull_messages", lambda request, state, task:
                        Response(list(replies)))
    monkeypatch.setattr(fleet, "push_messages", lambda request, state:
                        replies.append(request) or "pushed")
    monkeypatch.setattr(main, "_get_middleware", main._get_middleware)
    before = (fleet.pull_messages, runtime.push_messages, runtime.pull_messages,
              fleet.push_messages, main._get_middleware)
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    assert not patches.hold_pulls(5.0)
    assert (fleet.pull_messages, runtime.push_messages, runtime.pull_messages,
            fleet.push_messages, main._get_middleware) == before
    monkeypatch.setattr(flwr, "__version__", patches.PATCHED_VERSION)
    assert patches.hold_pulls(5.0)
    assert patches.hold_pulls(5.0)  # once only: not wrapped twice

    started = time.monotonic()
    threading.Timer(0.2, lambda: runtime.push_messages("message", None, None)).start()
    assert fleet.pull_messages(None, None, None).messages_list == ["message"]
    assert 0.15 < time.monotonic() - started < 3.0  # woken by the push, not the hold's end
    assert fleet.pull_messages(None, None, None).messages_list == ["message"]  # at once

    # The ServerApp's pull of replies: at once unless the request asked to be held.
    started = time.monotonic()
    assert runtime.pull_messages(None, None, None).messages_list == []
    assert time.monotonic() - started < 1.0
    threading.Timer(0.2, lambda: fleet.push_messages("reply", None)).start()
    token = patches._HOLD_ASKED.set(True)
    try:
        assert runtime.pull_messages(None, None, None).messages_list == ["reply"]
    finally:
        patches._HOLD_ASKED.reset(token)
    assert 0.15 < time.monotonic() - started < 3.0  # woken by the SuperNode's push
    assert _layers(main.create_app())[0] == (patches._NoteHoldHeader, None)

    stored.clear()
    arrivals = patches._Arrivals(1)
    started = time.monotonic()
    assert arrivals.hold(lambda: Response([]), lambda r: not r.messages_list, 0.3
                         ).messages_list == []
    assert 0.25 < time.monotonic() - started < 3.0  # the hold's end
    assert arrivals.slots.acquire(blocking=False)  # the one slot taken:
    started = time.monotonic()
    arrivals.hold(lambda: Response([]), lambda r: not r.messages_list, 5.0)
    assert time.monotonic() - started < 1.0  # answered at once


def test_the_serverapp_asks_for_held_pulls_only_while_it_waits_for_replies(monkeypatch):
    """The grid's ``httpx.Client`` gets a request hook (once): a pull of replies made
    inside ``held_replies`` carries the header, any other request does not; the
    SuperLink's outermost layer notes the header for the handler's thread."""
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    seen = []

    def record(request):
        seen.append((request.url.path, request.headers.get(patches.HOLD_HEADER)))
        return httpx.Response(200)

    grid = types.SimpleNamespace(_runtime_client=types.SimpleNamespace(
        _client=httpx.Client(transport=httpx.MockTransport(record))))
    assert patches.ask_for_held_reply_pulls(grid)
    assert patches.ask_for_held_reply_pulls(grid)  # (not hooked twice)
    client = grid._runtime_client._client
    assert len(client.event_hooks["request"]) == 1
    client.post("http://link/v1/runtime/pull-messages")
    with patches.held_replies():
        client.post("http://link/v1/runtime/pull-messages")
        client.post("http://link/v1/runtime/pull-object")
    client.post("http://link/v1/runtime/pull-messages")
    assert seen == [("/v1/runtime/pull-messages", None), ("/v1/runtime/pull-messages", "1"),
                    ("/v1/runtime/pull-object", None), ("/v1/runtime/pull-messages", None)]
    assert not patches.ask_for_held_reply_pulls(types.SimpleNamespace())  # another grid
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    assert not patches.ask_for_held_reply_pulls(grid)

    def endpoint(request):  # a sync endpoint: it runs in Starlette's thread pool
        return PlainTextResponse(str(patches._HOLD_ASKED.get()))

    app = patches._NoteHoldHeader(Starlette(routes=[Route("/x", endpoint, methods=["POST"])]))
    test = TestClient(app)
    assert test.post("/x").text == "False"
    assert test.post("/x", headers={patches.HOLD_HEADER: "1"}).text == "True"
