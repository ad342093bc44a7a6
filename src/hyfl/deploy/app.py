"""The Flower app of deployed HyFDCA: ``server_app`` and ``client_app`` (Message API).

Components for Flower's ``[tool.flwr.app.components]``::

    serverapp = "hyfl.deploy.app:server_app"
    clientapp = "hyfl.deploy.app:client_app"

(``hyfl deploy app`` writes a Flower App project whose components re-export
these: :mod:`hyfl.deploy.flower_app`). This module
imports ``flwr`` (the ``hyfl[flower]`` extra); nothing else in hyfl imports it.

The ServerApp runs :class:`~hyfl.deploy.coordinator.Coordinator` with a
:class:`FlowerTransport` over Flower's ``Grid``; the ClientApp registers one
handler per message kind of :mod:`hyfl.deploy.party` (``query.hello``,
``train.setup``, ``train.round``, ``train.weights``, ``train.steps``,
``train.duals``, ``query.verdict``, ``train.commit``, ``query.ping``,
``query.finish``). Payloads and the party's state are encoded by
:mod:`hyfl.deploy.codec` into one ``ConfigRecord`` (``"hyfl"``: the arrays as
one byte bundle, their layout and the JSON description, see :func:`pack`); the
party's state lives in ``context.state`` as the same record (``"hyfl.state"``).

Flower's ``Grid.send_and_receive`` polls for replies every 3 s; the transport
pushes and pulls itself with a short poll (run config ``poll``) and matches
replies to requests by ``reply_to_message_id`` (error replies of the SuperLink
come from node 1, not from the party).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from hyfl._io import read_npz
from hyfl.deploy.codec import bundle, decode, encode, encoded_bytes, unbundle
from hyfl.deploy.flower_patches import HELD_PULL, held_replies
from hyfl.deploy.party import KINDS, QUERY_KINDS, handle_message, server_text
from hyfl.errors import HyflError, fail

__all__ = ["AUDIT_DIR_VARIABLE", "FlowerTransport", "check_not_refused", "client_app",
           "load_state", "pack", "read_received", "refuse_run", "run_server", "save_state",
           "server_app", "unpack"]

# A party's app raised (a configuration error or a bug): stop the run and say so.
# Every other error reply (node unavailable, app crashed, message lost) means
# the party is absent for the round.
_FATAL_CODES = (ErrorCode.LOAD_CLIENT_APP_EXCEPTION, ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                ErrorCode.INVALID_FAB)
#: The record of a message's content (:func:`pack`) and of the party's saved state.
_CONTENT, _STATE = "hyfl", "hyfl.state"
#: Set in ``context.state`` once the party failed or refused a message of the run: an
#: honest server stops a run at a party's error, so a party answers nothing more of it
#: (a refusal must not be a question the server can ask again).
_REFUSED = "hyfl.refused"
#: With this environment variable set to a folder, the ServerApp keeps every reply it
#: receives there as it arrived (``PID-SEQ-PARTY-KIND.npz``: the encoded arrays plus the
#: description under ``__spec__``); :func:`read_received` reads them back. For audits.
AUDIT_DIR_VARIABLE = "HYFL_AUDIT_DIR"


def pack(arrays: dict, spec: str) -> RecordDict:
    """An encoded tree as a message's content: one record of a byte bundle and two JSON
    strings.

    Flower moves every object of a message's tree (message, record dict, each
    record, each array and each 5 MiB chunk of it) with an HTTP request of its
    own, at every hop: ServerApp -> SuperLink -> SuperNode -> worker and back.
    One config record holding the bundle's bytes makes a message three objects
    (it was six as an array record plus a config record), so a message costs
    three requests fewer at each of its six hops (docs/deployment.md, "Per message").
    """
    buffer, layout = bundle(arrays)
    return RecordDict({_CONTENT: ConfigRecord({"spec": spec, "layout": layout,
                                               "bundle": buffer.tobytes()})})


def unpack(content: RecordDict, sender: str) -> tuple[dict, str]:
    """The ``(arrays, spec)`` of a message's content; a clear error if it is not hyfl's."""
    try:
        record = content[_CONTENT]
        buffer = np.frombuffer(record["bundle"], dtype=np.uint8)
        spec, layout = str(record["spec"]), str(record["layout"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise fail(f"message from {sender}", f"is not a hyfl message ({type(err).__name__}: "
                   f"{err})", "Run the server and every party with the same hyfl version.") \
            from None
    return unbundle(buffer, layout, sender=sender), spec


# ----------------------------------------------------------------------------- client


def _process_start() -> float:
    """Wall-clock start of this process (Linux), to measure Flower's process start-up."""
    try:
        with open("/proc/self/stat", encoding="utf-8") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="utf-8") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def check_not_refused(context: Context) -> None:
    """Raise if the party failed or refused an earlier message of this run (:func:`refuse_run`)."""
    if _REFUSED in context.state:
        raise fail("the party", "failed or refused an earlier message of this run and answers "
                   "no more of it", "Start a new run (the party's log says what went wrong).")


def load_state(context: Context, folder: str | os.PathLike | None = None
               ) -> tuple[dict, str] | None:
    """The party's encoded state of this run (None before its first message).

    From ``context.state`` if the state was kept there (:func:`save_state`
    without ``folder``), else from the run's file in ``folder`` or in the node
    config's ``state-dir``: a SuperNode that restarted has an empty context,
    and the long-lived worker keeps the state in a file (see :func:`save_state`).
    """
    check_not_refused(context)
    if _STATE in context.state:
        return unpack(RecordDict({_CONTENT: context.state[_STATE]}), "the party's saved state")
    path = _state_file(context, folder)
    if path is None or not path.is_file():
        return None
    arrays = read_npz(path, f"the party's saved state {path}", "a saved party state",
                      "Delete the file: the party then takes no further part in that run.",
                      kinds="biufU", expect={"__spec__": ("U", 0)})
    return arrays, str(arrays.pop("__spec__"))


def refuse_run(context: Context) -> None:
    """Mark the run refused in ``context.state`` (Flower keeps it with the error reply)."""
    context.state[_REFUSED] = ConfigRecord({"refused": True})


def save_state(context: Context, state: tuple[dict, str],
               folder: str | os.PathLike | None = None) -> None:
    """Keep the party's encoded state of this run where :func:`load_state` finds it.

    Without ``folder`` (Flower's own ClientApp process): in ``context.state``,
    which the SuperNode holds per run, and, with a node config ``state-dir``,
    also in a file of the run there (private to the party's user), so that a
    restarted SuperNode rejoins the run where it left it.

    With ``folder`` (the long-lived worker, :mod:`hyfl.deploy.worker`): only in
    the run's file there (the node config's ``state-dir`` wins when set).
    ``context.state`` travels with every message twice (the worker pushes it
    with its reply, the SuperNode hands it back with the next message), which
    for ijcnn1's 8 MB states cost 0.2 s of a 0.5 s message round trip; the
    worker needs it only after it restarted. A ``folder`` that is not the
    ``state-dir`` is not fsynced: it outlives the worker, not the machine.
    """
    if folder is None:
        context.state[_STATE] = pack(*state)[_CONTENT]
    path = _state_file(context, folder)
    if path is not None:
        from hyfl._private_files import savez_private

        # 0600 from its creation (a chmod afterwards left it readable meanwhile).
        arrays, spec = state
        savez_private(path, durable=path.parent == state_dir(context),
                      __spec__=np.array(spec), **arrays)


def state_dir(context: Context) -> Path | None:
    """The node config's ``state-dir`` (None without one)."""
    folder = str(context.node_config.get("state-dir", "") or "")
    return Path(folder) if folder else None


def _state_file(context: Context, folder: str | os.PathLike | None = None) -> Path | None:
    """Where the party keeps its state of this run: in the node config's ``state-dir``,
    else in ``folder`` (None without either)."""
    where = state_dir(context) or (Path(folder) if folder else None)
    if where is None:
        return None
    return where / f"run-{context.run_id}-party-{context.node_config.get('party')}.npz"


def _handler(kind: str):
    def handle(msg: Message, context: Context) -> Message:
        started = time.time()
        process = _process_start()
        # Where a message's time goes on the party's side: waiting for the SuperNode to
        # pull it and SuperExec to start a process, then starting Python, Flower and hyfl.
        timing = {"until_handler": started - msg.metadata.created_at,
                  "until_process": process - msg.metadata.created_at,
                  "process_start": started - process}
        try:
            reply, new_state = handle_message(kind, unpack(msg.content, "the server"),
                                              load_state(context), context.node_config,
                                              context.run_config, timing)
        except Exception as err:  # noqa: BLE001 (the details stay here, see server_text)
            from flwr.common.logger import log

            log(logging.ERROR, "hyfl party, %r message: %s: %s", kind, type(err).__name__, err)
            refuse_run(context)
            raise HyflError(server_text(err, kind)) from None
        save_state(context, new_state)  # only after success: an exception keeps the old one
        return Message(pack(*reply), reply_to=msg)

    handle.__name__ = f"hyfl_{kind}"
    return handle


client_app = ClientApp()
for _kind in KINDS:
    (client_app.query if _kind in QUERY_KINDS else client_app.train)(_kind)(_handler(_kind))


# ----------------------------------------------------------------------------- server


class FlowerTransport:
    """The coordinator's :class:`~hyfl.deploy.coordinator.Transport` over a Flower ``Grid``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    cipher : Cipher
        The server's cipher (decodes the ciphertexts in replies).
    poll : float
        Seconds between two pulls while waiting for replies.
    ttl : float
        Lifetime of a message on the SuperLink (a party that comes back much
        later does not work through stale messages).
    """

    def __init__(self, grid: Grid, cipher, poll: float = 0.05, ttl: float = 3600.0):
        self.grid, self.cipher, self.poll_seconds, self.ttl = grid, cipher, poll, ttl
        self.nodes: dict[int, int] = {}
        self.sent_bytes = 0
        self.received_bytes = 0
        self.audit_dir = os.environ.get(AUDIT_DIR_VARIABLE, "")
        self.recorded = 0
        self._probes: dict[str, int] = {}  # ping message id -> unknown node asked who it is
        self._strangers: set[int] = set()  # nodes that are no absent party of this run

    def _message(self, node: int, kind: str, payload: dict) -> Message:
        arrays, spec = encode(payload)
        self.sent_bytes += encoded_bytes(arrays, spec)
        category = "query" if kind in QUERY_KINDS else "train"
        return Message(pack(arrays, spec), dst_node_id=node, message_type=f"{category}.{kind}",
                       ttl=self.ttl)

    def _push(self, messages: list[Message]) -> list[str]:
        ids = list(self.grid.push_messages(messages))
        if len(ids) != len(messages) or any(not i for i in ids):
            raise fail("the SuperLink", f"accepted {sum(bool(i) for i in ids)} of "
                       f"{len(messages)} messages", "See the ServerApp log (payload too large?).")
        return ids

    def _read(self, reply: Message, party: Any, kind: str) -> dict | None:
        """A reply's payload, or None when the party is unavailable; raises on app errors."""
        if reply.has_error():
            if reply.error.code in _FATAL_CODES:
                raise fail(f"party {party}", f"failed on {kind!r}: {reply.error.reason}",
                           "Fix the party's configuration (see its SuperNode log) and start "
                           "the run again.")
            return None
        arrays, spec = unpack(reply.content, f"party {party}")
        self.received_bytes += encoded_bytes(arrays, spec)
        if self.audit_dir:
            self._record(party, kind, arrays, spec)
        return decode(arrays, spec, self.cipher, sender=f"party {party}")

    def _record(self, party: Any, kind: str, arrays: dict, spec: str) -> None:
        """Keep a reply as it arrived (for the privacy audit of the tests; ``$HYFL_AUDIT_DIR``)."""
        from hyfl._private_files import savez_private

        self.recorded += 1
        name = str(party).replace(" ", "-")
        savez_private(Path(self.audit_dir) / f"{os.getpid()}-{self.recorded:06d}-{name}-{kind}.npz",
                      durable=False, __spec__=np.array(spec), **arrays)

    def connect(self, n_parties: int, timeout: float, hello: dict) -> dict[int, dict]:
        deadline = time.monotonic() + timeout
        asked: dict[str, int] = {}  # hello message id -> node id
        answered: set[int] = set()
        hellos: dict[int, dict] = {}
        while len(hellos) < n_parties:
            new = [n for n in self.grid.get_node_ids() if n not in asked.values()
                   and n not in answered]
            if new:
                ids = self._push([self._message(n, "hello", hello) for n in new])
                asked.update(zip(ids, new))
            if asked:
                for reply in self.grid.pull_messages(list(asked)):
                    node = asked.pop(reply.metadata.reply_to_message_id, None)
                    if node is None:
                        continue
                    hello = self._read(reply, f"on node {node}", "hello")
                    if hello is None:
                        continue  # gone again; asked anew if it reappears
                    answered.add(node)
                    k = int(hello["party"])
                    if k in hellos:
                        raise fail(f"nodes {self.nodes[k]} and {node}", f"both say they are "
                                   f"party {k}", "Give every SuperNode its own party=K.")
                    hellos[k], self.nodes[k] = {**hello, "node": node}, node
            if len(hellos) >= n_parties:
                break
            if time.monotonic() > deadline:
                missing = sorted(set(range(n_parties)) - set(hellos))
                raise fail(f"part{'ies' if len(missing) > 1 else 'y'} "
                           f"{', '.join(map(str, missing))}",
                           f"did not connect within {timeout:g} s",
                           "Start a SuperNode for every party (hyfl deploy party ...) against "
                           "this SuperLink, or raise connect-timeout.")
            time.sleep(max(self.poll_seconds, 0.2))
        return hellos

    def exchange(self, messages: dict[int, tuple[str, dict]], timeout: float
                 ) -> tuple[dict[int, dict], set[int]]:
        parties = sorted(messages)
        from hyfl.deploy.backoff import Backoff

        ids = self._push([self._message(self.nodes[k], *messages[k]) for k in parties])
        pushed = time.monotonic()
        pending = dict(zip(ids, parties))
        replies: dict[int, dict] = {}
        missing: set[int] = set()
        deadline = pushed + timeout
        wait = Backoff(self.poll_seconds)
        while pending:
            asked = time.monotonic()
            with held_replies():  # a SuperLink of hyfl's answers when a reply comes
                pulled = list(self.grid.pull_messages(list(pending)))
            for reply in pulled:
                k = pending.pop(reply.metadata.reply_to_message_id, None)
                if k is None:
                    continue
                payload = self._read(reply, k, messages[k][0])
                if payload is None:
                    missing.add(k)
                    continue
                # Where the time of a message goes: its round trip, and of that what
                # the party did not spend on HyFDCA (transport, polls, codec).
                round_trip = time.monotonic() - pushed
                timing = payload.setdefault("timing", {})
                timing["round_trip"] = round_trip
                timing["overhead"] = round_trip - float(payload.get("seconds", 0.0))
                replies[k] = payload
            if not pending or time.monotonic() > deadline:
                break
            if time.monotonic() - asked < HELD_PULL:  # not held: poll
                time.sleep(wait.next())
        missing.update(pending.values())
        return replies, missing

    def post(self, party: int, kind: str, payload: dict) -> str:
        return self._push([self._message(self.nodes[party], kind, payload)])[0]

    def rediscover(self, absent: set[int]) -> list[int]:
        """Absent parties whose SuperNode came back under a new node id (a restart without
        node authentication, which would keep its id): every unknown node is asked who it
        is (a ``ping``); one that answers as an absent party -- which it can only do from
        the state it kept of this run -- takes that party's place. Never waits."""
        known = set(self.nodes.values()) | set(self._probes.values()) | self._strangers
        new = [node for node in self.grid.get_node_ids() if node not in known]
        if new:
            ids = self._push([self._message(node, "ping", {}) for node in new])
            self._probes.update(zip(ids, new))
        back = []
        if self._probes:
            for reply in self.grid.pull_messages(list(self._probes)):
                node = self._probes.pop(reply.metadata.reply_to_message_id, None)
                if node is None:
                    continue
                payload = None if reply.has_error() else self._read(reply, f"on node {node}",
                                                                     "ping")
                party = (payload or {}).get("party")
                if isinstance(party, int) and party in absent:
                    self.nodes[party] = node
                    back.append(party)
                else:
                    self._strangers.add(node)
        return back

    def poll(self, handle: str) -> str:
        for reply in self.grid.pull_messages([handle]):
            if reply.metadata.reply_to_message_id == handle:
                return "failed" if reply.has_error() else "replied"
        return "pending"


def read_received(folder: str | os.PathLike, cipher=None) -> list[tuple[str, str, Any]]:
    """The replies a ServerApp kept in ``$HYFL_AUDIT_DIR``: ``(party, kind, payload)``.

    Payloads are decoded with ``cipher`` (the server's public one) as the
    coordinator decoded them.
    """
    out = []
    for path in sorted(Path(folder).glob("*.npz")):
        _, _, *party, kind = path.stem.split("-")
        arrays = read_npz(path, f"recorded reply {path}", "a recorded reply",
                          f"Remove it from ${AUDIT_DIR_VARIABLE}'s folder.", kinds="biufU",
                          expect={"__spec__": ("U", 0)})
        spec = str(arrays.pop("__spec__"))
        out.append(("-".join(party), kind, decode(arrays, spec, cipher)))
    return out


def run_server(grid: Grid, run_config: dict) -> dict:
    """The ServerApp's work: validate the run config, load the public key, run the job."""
    from hyfl.deploy.config import DeployConfig
    from hyfl.deploy.coordinator import Coordinator, write_failure
    from hyfl.deploy.keys import server_cipher

    try:
        config = DeployConfig.from_run_config(run_config)
        cipher = server_cipher(config.cipher, config.public_key,
                               insecure_test_keys=config.insecure_test_keys,
                               **config.cipher_options())
    except Exception as err:
        write_failure(run_config.get("out", ""), err)
        raise
    from hyfl.deploy.flower_patches import ask_for_held_reply_pulls, quick_object_pulls

    quick_object_pulls("flwr.superlink.grid.http_grid")  # replies are read without a 1 s wait
    ask_for_held_reply_pulls(grid)  # and as they come
    transport = FlowerTransport(grid, cipher, poll=config.poll,
                                ttl=2 * config.reply_timeout + 60.0)
    if config.model:  # scoring new rows (hyfl deploy predict), not training
        from hyfl.deploy.scoring import run_scoring

        return run_scoring(config, transport)
    return Coordinator(config, transport, cipher).run()


server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    run_server(grid, dict(context.run_config))
