"""Review of the party worker in the SuperNode's process (commit e5a1f7f).

These tests drive :func:`hyfl.deploy.supernode.run_in_process`'s hook
(:data:`hyfl.deploy.flower_patches.ON_MESSAGE`) against a real Flower 1.41
``NodeState`` and ``ObjectStore``, with messages stored exactly as the
SuperNode's ``_pull_and_store_message`` stores them (a task created, then the
message and its objects): no SuperLink, no HTTP, seconds per test. The
hostile-server tests (tests/test_hostile_server.py) call ``handle_message``
directly, so they do not cover what the in-process worker does with a failing
message; these do.
"""

from __future__ import annotations

import hashlib
import inspect
import time

import pytest

flwr = pytest.importorskip("flwr")

RUN = 5


# ----------------------------------------------------------------------------- harness


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from flwr.cli.build import build_fab_from_disk

    from hyfl.deploy.flower_app import write_flower_app

    folder = tmp_path_factory.mktemp("app")
    return build_fab_from_disk(write_flower_app(folder / "app", {"parties": 2,
                                                                 "cipher": "none"}))


def _run_config():
    from hyfl.deploy.config import run_config_for

    return run_config_for(parties=2, cipher="none", partition="horizontal:2")


def _node(tmp_path, **more):
    # breast_cancer ships with scikit-learn: the data-dir is not read for it.
    return {"party": 0, "cipher": "none", "data": "breast_cancer", "data-dir": str(tmp_path),
            **more}


class _Node:
    """A SuperNode's NodeState and ObjectStore with hyfl's app stored for some runs."""

    def __init__(self, bundle: bytes, node_config: dict, run_config: dict):
        from flwr.supercore.object_store import ObjectStoreFactory
        from flwr.supernode.nodestate import NodeStateFactory

        factory = ObjectStoreFactory()
        self.state = NodeStateFactory(objectstore_factory=factory).state()
        self.store = factory.store()
        self.state.set_node_id(1)
        self.bundle, self.node_config, self.run_config = bundle, node_config, run_config

    def add_run(self, run_id: int) -> None:
        from flwr.app import Context, RecordDict
        from flwr.supercore.constant import TaskType
        from flwr.supercore.fab import Fab
        from flwr.supercore.run import Run

        digest = hashlib.sha256(self.bundle).hexdigest()
        run = Run.create_empty(run_id)
        run.fab_id, run.fab_version, run.fab_hash = "hyfl/hyfl-app", "1.0", digest
        run.primary_task_type, run.series_id = TaskType.SERVER_APP, run_id
        self.state.store_run(run)
        self.state.store_fab(Fab(digest, self.bundle, {}))
        self.state.set_run_series_context(run_id, Context(
            run_id=run_id, node_id=1, node_config=self.node_config, state=RecordDict(),
            run_config=self.run_config))

    def deliver(self, message_type: str, content, run_id: int = RUN):
        """Store a message as Flower's ``_pull_and_store_message`` does: task, then message."""
        from flwr.app import Message
        from flwr.supercore.constant import TaskType
        from flwr.supercore.task_identity import TaskIdentity
        from flwr.supernode.start_client_internal import _insert_message

        if self.state.get_run(run_id) is None:
            self.add_run(run_id)
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 0, run_id, 0
        message = Message(content, dst_node_id=1, message_type=message_type)
        message.metadata.__dict__["_src_node_id"] = 0
        message.metadata.created_at = time.time()
        task_id = self.state.create_task(task_type=TaskType.CLIENT_APP, run_id=run_id,
                                         fab_hash=self.state.get_run(run_id).fab_hash)
        _insert_message(message, self.state, self.store)
        return message, task_id

    def exchange(self, hook, message_type: str, content, run_id: int = RUN):
        """Deliver, call the SuperNode's hook, return (reply, task status, sub-status)
        and clear the pair as Flower's ``_push_messages`` does."""
        message, task_id = self.deliver(message_type, content, run_id)
        hook(self.state)
        replies = self.state.get_messages_legacy(is_reply=True)
        (task,) = self.state.get_tasks(task_ids=[task_id])
        self.state.delete_messages(message_ids=[m.metadata.message_id for m in replies]
                                   + [message.metadata.message_id])
        assert len(replies) <= 1
        return (replies[0] if replies else None), task.status.status, task.status.sub_status


@pytest.fixture
def in_process(monkeypatch, tmp_path, capsys):
    """The hook :func:`hyfl.deploy.supernode.run_in_process` installs (and its log)."""
    import hyfl.deploy.flower_patches as patches
    from hyfl.deploy import supernode

    hooks: list = []
    monkeypatch.setattr(supernode, "ON_MESSAGE", hooks)
    lines = _Lines(capsys)
    folder = tmp_path / "worker-state"
    folder.mkdir(mode=0o700)
    supernode.run_in_process(folder)
    (hook,) = hooks
    assert patches.ON_MESSAGE is not hooks  # the real list was left alone
    return hook, lines, folder


class _Lines:
    """The worker's log lines so far (its stderr, as captured by pytest)."""

    def __init__(self, capsys):
        self.capsys, self.lines = capsys, []

    def __iter__(self):
        err = self.capsys.readouterr().err
        self.lines += [line for line in err.splitlines() if line.startswith("hyfl worker:")]
        return iter(list(self.lines))

    def __repr__(self):
        return repr(list(self))


def _hello():
    from hyfl.deploy.app import pack
    from hyfl.deploy.codec import encode

    return pack(*encode({"cipher": "none", "fingerprint": ""}))


def _ping():
    from hyfl.deploy.app import pack
    from hyfl.deploy.codec import encode

    return pack(*encode({}))


# ----------------------------------------------------------------------------- point 1


def test_a_message_that_fails_in_process_gets_an_error_reply_and_the_node_goes_on(
        bundle, tmp_path, in_process):
    """A hostile server's malformed payload, an unknown message kind: each raises inside the
    party; in the SuperNode's process the hook returns normally (the SuperNode lives), the
    message gets Flower's error reply with hyfl's generic text (nothing of the cause), the
    task is FAILED, the run is refused from then on, and another run is still served."""
    from flwr.app import ConfigRecord, RecordDict

    hook, lines, _ = in_process
    node = _Node(bundle, _node(tmp_path), _run_config())
    reply, status, sub = node.exchange(hook, "query.hello", _hello())
    assert not reply.has_error() and (status, sub) == ("finished", "completed")

    hostile = RecordDict({"not-hyfl": ConfigRecord({"x": 1})})
    reply, status, sub = node.exchange(hook, "train.round", hostile)
    assert reply.has_error() and (status, sub) == ("finished", "failed")
    assert "could not handle the server's 'round' message" in reply.error.reason
    assert "KeyError" not in reply.error.reason  # the cause stays in the party's log
    assert any("is not a hyfl message" in line for line in lines)

    # The run is refused from now on (as with the worker in its own process).
    reply, status, _ = node.exchange(hook, "query.hello", _hello())
    assert reply.has_error() and status == "finished"
    assert any("answers no more of it" in line for line in lines)

    # An unknown kind, in a new run: an error reply, not an exception out of the hook.
    reply, status, sub = node.exchange(hook, "query.no_such_kind", _hello(), run_id=RUN + 1)
    assert reply is not None and reply.has_error() and (status, sub) == ("finished", "failed")

    # And a third run is served normally: nothing was left broken in the process.
    reply, status, sub = node.exchange(hook, "query.hello", _hello(), run_id=RUN + 2)
    assert not reply.has_error() and (status, sub) == ("finished", "completed")


def test_a_job_that_is_not_hyfls_app_is_refused_in_process(bundle, tmp_path, in_process):
    """A bundle other than hyfl's is refused with LoadClientAppError's reply, in process too
    (its code never runs in the process that holds the party's key)."""
    hook, _, _ = in_process
    node = _Node(b"PK\x05\x06" + b"\0" * 18, _node(tmp_path), _run_config())  # an empty zip
    reply, status, sub = node.exchange(hook, "query.hello", _hello())
    assert reply.has_error() and (status, sub) == ("finished", "failed")
    assert "this SuperNode runs hyfl's party worker" in reply.error.reason


# ----------------------------------------------------------------------------- point 2


def _slow_party(monkeypatch, seconds: float):
    """The party's handling of a message busies the (main) thread for ``seconds`` of pure
    Python, which holds the GIL but for the interpreter's switch interval."""
    from hyfl.deploy.worker import Worker

    real = Worker._hyfl

    def slow(self, message, context, started):
        end = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < end:
            n += 1
        return real(self, message, context, started)

    monkeypatch.setattr(Worker, "_hyfl", slow)


@pytest.fixture
def short_patience(monkeypatch):
    """The SuperNode's task patience cut to 1.5 s (TASK_PATIENCE is 10 s), the worker's
    heartbeats to 0.25 s (HEARTBEAT_SECONDS is 2 s): the same ratios, a faster test."""
    import flwr.supercore.corestate.in_memory_corestate as corestate

    from hyfl.deploy import worker

    monkeypatch.setattr(corestate, "HEARTBEAT_DEFAULT_INTERVAL",
                        1.5 / corestate.HEARTBEAT_PATIENCE)
    monkeypatch.setattr(worker, "HEARTBEAT_SECONDS", 0.25)
    return 1.5


def test_a_task_longer_than_the_patience_is_kept_alive_by_in_process_heartbeats(
        bundle, tmp_path, in_process, short_patience, monkeypatch):
    """The main thread (the SuperNode's own loop) is busy with the task for twice the
    SuperNode's patience; the heartbeat thread's InProcessRuntime.SendTaskHeartbeat keeps
    the task's token alive, and the party's reply (not Flower's "ClientApp crashed")
    is what the SuperNode finds."""
    hook, lines, _ = in_process
    node = _Node(bundle, _node(tmp_path), _run_config())
    _slow_party(monkeypatch, 2 * short_patience)
    reply, status, sub = node.exchange(hook, "query.hello", _hello())
    assert not reply.has_error(), reply.error
    assert (status, sub) == ("finished", "completed")
    assert not any("could not finish a task" in line for line in lines), lines


def test_without_heartbeats_the_same_task_expires(bundle, tmp_path, in_process,
                                                  short_patience, monkeypatch):
    """The control of the test above: with the heartbeats switched off, the same long task
    expires (Flower's own error reply), and the worker logs and goes on."""
    from hyfl.deploy import worker

    class _NoHeartbeat:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(worker, "_Heartbeat", _NoHeartbeat)
    hook, lines, _ = in_process
    node = _Node(bundle, _node(tmp_path), _run_config())
    _slow_party(monkeypatch, 2 * short_patience)
    reply, status, _ = node.exchange(hook, "query.hello", _hello())
    assert reply is not None and reply.has_error() and status == "finished"
    assert any("could not finish a task" in line for line in lines), lines


# ----------------------------------------------------------------------------- point 4


def test_in_process_a_state_dir_is_written_after_every_message(bundle, tmp_path, in_process):
    """With a node config ``state-dir`` the in-process worker writes the party's state after
    each message (a restarted SuperNode rejoins from it); without one it writes nothing per
    message into its own folder (the party stays in memory)."""
    hook, _, folder = in_process
    kept = tmp_path / "state-dir"
    node = _Node(bundle, _node(tmp_path, **{"state-dir": str(kept)}), _run_config())
    name = f"run-{RUN}-party-0.npz"
    reply, _, _ = node.exchange(hook, "query.hello", _hello())
    assert not reply.has_error()
    first = (kept / name).read_bytes()
    reply, _, _ = node.exchange(hook, "query.ping", _ping())
    assert not reply.has_error(), reply.error
    assert (kept / name).is_file() and (kept / name).stat().st_mode & 0o077 == 0
    assert list(folder.iterdir()) == []  # the state-dir wins over the worker's folder
    assert first  # (written at the first message already)

    plain = _Node(bundle, _node(tmp_path / "other"), _run_config())
    reply, _, _ = plain.exchange(hook, "query.hello", _hello(), run_id=RUN + 10)
    assert not reply.has_error()
    assert list(folder.iterdir()) == []  # spill mode: nothing per message


# ----------------------------------------------------------------------------- point 5


def test_flower_hands_the_supernodes_state_to_the_hook_by_keyword():
    """:func:`cap_supernode_polls` gives the hook ``kwargs.get("state")``; the in-process
    hook ignores None, and the SuperNode would then wait for a reply forever (a PENDING
    task never expires). Flower 1.41's only call passes ``state=`` by keyword: if a
    release passes it positionally, this fails instead of parties hanging."""
    import flwr.supernode.start_client_internal as internal

    source = inspect.getsource(internal.start_client_internal)
    call = source[source.index("_pull_and_store_message("):]
    call = call[:call.index(")")]
    assert "state=state" in call


def test_the_hook_runs_the_task_before_flower_looks_for_its_reply(bundle, tmp_path,
                                                                  in_process):
    """Through the real patched pull (:func:`cap_supernode_polls`' wrapper), the hook
    runs in the SuperNode's thread before ``_pull_and_store_message`` returns: the
    reply is in the state when Flower's ``_push_messages`` first looks."""
    import flwr.supernode.start_client_internal as internal

    import hyfl.deploy.flower_patches as patches

    hook, _, _ = in_process
    node = _Node(bundle, _node(tmp_path), _run_config())
    seen = {}

    def pull(**kwargs):  # Flower's pull: stores a message, returns its run
        node.deliver("query.hello", _hello())
        return RUN

    original_time, original_pull = internal.time, internal._pull_and_store_message
    try:
        internal.time, internal._pull_and_store_message = patches._time, pull
        saved, patches.ON_MESSAGE[:] = list(patches.ON_MESSAGE), [hook]
        try:
            assert patches.cap_supernode_polls(0.05, 0.002)
            assert internal._pull_and_store_message(state=node.state) == RUN
            seen["replies"] = node.state.get_messages_legacy(is_reply=True)
        finally:
            patches.ON_MESSAGE[:] = saved
    finally:
        internal.time, internal._pull_and_store_message = original_time, original_pull
    (reply,) = seen["replies"]
    assert not reply.has_error()


# ----------------------------------------------------------------------------- point 6


def test_deploy_local_refuses_per_message_with_worker_process(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import hyfl.deploy.local as local_module
    from hyfl.cli import app

    called = []

    def run_local(**kwargs):
        called.append(kwargs)
        raise KeyboardInterrupt  # never deploy in this test

    monkeypatch.setattr(local_module, "run_local", run_local)
    result = CliRunner().invoke(app, ["deploy", "local", "--data", "breast_cancer", "--out",
                                      str(tmp_path / "out"), "--per-message",
                                      "--worker-process"])
    output = " ".join(result.output.split())
    assert not called, called  # refused before anything starts
    assert result.exit_code != 0 and "were both given" in output


# ----------------------------------------------------------------------------- spill


def test_a_failed_spill_of_a_dropped_party_does_not_refuse_the_new_run(
        bundle, tmp_path, in_process, monkeypatch):
    import errno

    import hyfl._private_files as private_files
    from hyfl.deploy import worker as worker_module

    hook, lines, _ = in_process
    node = _Node(bundle, _node(tmp_path), _run_config())
    for run_id in range(1, 1 + worker_module.MAX_RUNS):
        reply, _, _ = node.exchange(hook, "query.hello", _hello(), run_id=run_id)
        assert not reply.has_error()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(private_files, "savez_private", full)
    newest = 1 + worker_module.MAX_RUNS  # drops run 1, whose state cannot be written
    reply, status, sub = node.exchange(hook, "query.hello", _hello(), run_id=newest)
    assert not reply.has_error(), (reply.error, list(lines))
    assert (status, sub) == ("finished", "completed")
    assert any("could not keep the state of the party dropped" in line for line in lines)


def test_a_separate_worker_without_the_worker_is_refused(tmp_path):
    from hyfl.deploy.local import LocalDeployment
    from hyfl.errors import HyflError

    for options in ({"worker": False}, {"node_poll": None}):
        with pytest.raises(HyflError, match="separate_worker"):
            LocalDeployment([{"party": 0}], tmp_path, separate_worker=True, **options)
