"""A party's side of deployed HyFDCA: one message in, one reply out, state carried along.

Flower starts a fresh ClientApp process for every message, so nothing of a
party survives in memory between messages. :func:`handle_message` therefore
takes everything it needs each time -- the message, the party's state from
the previous message (Flower keeps it per run as ``context.state``), the node
config (party index, key file, data) and the run config -- rebuilds the
party's :class:`~hyfl.algorithms.hyfdca_parties.Client`, lets it handle the
message and returns the reply and the new state. The HyFDCA mathematics is
the ``Client``'s, unchanged; this module only restores, dispatches and saves.

State (a tree for :mod:`hyfl.deploy.codec`):

``block``
    The party's data (loaded once, at ``hello``), so later messages do not
    reload the data set.
``public``
    What every party knows (:class:`~hyfl.algorithms.hyfdca_parties.Public`
    without the hyperparameters, which come from the run config), from ``setup``.
``run``
    The run's identity (:func:`~hyfl.privacy.tags.run_identity` of every
    party's set-up nonce, checked under its tag), which keys the run's tags;
    absent without a private key.
``client``
    :meth:`Client.get_state`: duals and weights copies, the round's draws,
    for the cocoa rule its memory of past rounds and its last step...
``open`` and ``snapshot``
    The round the party is in (0: none) and a copy of the client's state
    when that round began. A round is closed by the server: with the
    per-sample rules by its commit (the verdict and the new weights), with the
    cocoa rule, whose commit the party answers within the round, by a
    ``closed`` delivery once every participant has answered. If the server
    abandons a round -- another party did not answer in time -- it sends the
    same round again, or a later one, and the party first restores the
    snapshot: the abandoned round leaves no trace.

Security policy. The party's cipher, key and minimum key size come from its
node config (:class:`~hyfl.deploy.config.NodeSettings`), never from the job:
a job whose run config asks for another cipher -- ``none`` included -- is
refused before anything is decoded, and so is a ``hello`` announcing a
public key with another fingerprint (see :func:`own_cipher`). Only such
refusals of the job go back to the server word for word; every other error
reaches it as a generic text (:func:`server_text`), its details stay in the
party's log: they may quote the party's files or tell what it decrypted.

The private key is read from the key file for every message; it is never
part of the state. Commits and the set-up's row norms travel as
``deliveries``: piggybacked on the party's next message instead of a round
trip of their own (each round trip costs a new process on the party's side).

Message kinds by step rule: the per-sample rules (``safe``, ``theory``,
``paper``) run ``round`` (with ``weights`` for returning parties),
``steps``, ``duals``, ``verdict`` and ``commit``; the ``cocoa`` rule runs
``round`` (and ``weights``), ``proposals``, ``image``, ``direction``,
``step`` (one party) and ``changes``, the messages of
:func:`hyfl.runtime.protocol._cocoa_round`. A party refuses a kind of the
other rule.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl._private_files import private_folder, private_write
from hyfl.algorithms.hyfdca_round import COCOA, PER_SAMPLE, PHASES, POSTS, answer, deliver
from hyfl.deploy.codec import check_fields, decode, encode
from hyfl.deploy.config import DeployConfig, NodeSettings, structure_blocks
from hyfl.deploy.guard import (
    FORGED_FIX,
    Guard,
    announcement_tag,
    check_announcements,
    check_coef,
)
from hyfl.deploy.party_files import (
    ALIGN_KINDS,
    check_numbering,
    is_party_file,
    numbering_record,
    on_align,
    on_block,
    on_labels,
    open_file,
)
from hyfl.deploy.scoring import SCORE_FIELDS, SCORE_KINDS, on_score, on_scores
from hyfl.errors import HyflError, JobRefused, fail
from hyfl.privacy.tags import cipher_secret, run_identity

__all__ = ["KINDS", "QUERY_KINDS", "Party", "handle_message", "open_party", "own_cipher",
           "server_text"]

#: The round's message kinds, from the round script (hyfl.algorithms.hyfdca_round).
ROUND_KINDS = tuple(PHASES)
#: Message kinds a party handles (Flower message types ``train.<kind>`` or ``query.<kind>``).
KINDS = ("hello", "align", "labels", "block", "setup", *ROUND_KINDS, "ping", "finish",
         *SCORE_KINDS)
#: Kinds sent as ``query.*`` (they change no model state); the rest are ``train.*``.
QUERY_KINDS = ("hello", "ping", *(name for name, p in PHASES.items() if p.query), "finish")
#: Kinds of one step rule only: the per-sample rules', the cocoa rule's.
PER_SAMPLE_KINDS = tuple(name for name, p in PHASES.items() if p.rule == PER_SAMPLE)
COCOA_KINDS = tuple(name for name, p in PHASES.items() if p.rule == COCOA)
#: Kinds that belong to the round the party is in (a ``round`` message opened it).
_IN_ROUND = tuple(name for name in ROUND_KINDS if name not in ("round", "commit"))

#: The fields of each message kind a party reads (types of :func:`~hyfl.deploy.codec.check_fields`).
MESSAGE_FIELDS: dict[str, dict[str, str]] = {
    "hello": {"cipher": "str?", "fingerprint": "str?"},
    # The alignment of parties with their own files (hyfl.deploy.party_files).
    "align": {"peers": "matrix", "peer_counts": "ids", "channels": "matrix",
              "nonces": "matrix", "tags": "matrix?", "column_keys": "matrix",
              "column_counts": "ids", "task": "str", "classes": "list"},
    # With the job's standardize: the party's columns' global ids, for its masked sums.
    "labels": {"shared_rows": "ids", "peer_rows": "ids", "shared_counts": "ids",
               "doubles": "matrix", "double_tags": "matrix?", "samples": "ids",
               "n_samples": "int", "moments_features": "ids?", "n_features": "int?"},
    "block": {"samples": "ids", "features": "ids", "n_samples": "int", "n_features": "int",
              "sealed": "dict?", "moments": "matrix?", "moments_check": "ids?"},
    "setup": {"n_samples": "int", "n_features": "int", "n_outputs": "int", "lam": "number",
              "samples": "ids", "sample_counts": "ids", "features": "ids",
              "feature_counts": "ids", "nonces": "matrix?", "tags": "matrix?",
              "lam_defaults": "floats?"},
    # The round's messages (their fields are part of the round script).
    **{name: dict(phase.sends) for name, phase in PHASES.items()},
    "ping": {},
    "finish": {"deliveries": "dict?"},
    # Scoring new rows after the alignment (hyfl.deploy.scoring), instead of block.
    **SCORE_FIELDS,
}
_CONFIGURE_FIELDS = {"t": "int", "updated_local": "ids", "reports_local": "mask",
                     "n_draws": "int", "stale": "vector?", "drawn_local": "ids?",
                     "order_local": "ids?", "beta": "number?", "compact_steps": "bool?",
                     "drawn_by_local": "mask?", "limit": "number?", "certificate": "ids?",
                     "checkpoint_duals": "vector?", "stale_contexts": "ids?",
                     "checkpoint_contexts": "ids?", "active": "ids?"}
_DELIVERY_FIELDS = {"norms": "vector?", "commit": "dict?"}
_COMMIT_FIELDS = dict(POSTS["commit"].sends)


def handle_message(kind: str, message: tuple[dict, str], state: tuple[dict, str] | None,
                   node_config: Mapping[str, Any], run_config: Mapping[str, Any],
                   timing: Mapping[str, float] | None = None
                   ) -> tuple[tuple[dict, str], tuple[dict, str]]:
    """Handle one message as the party ``node_config`` describes (nothing kept in memory).

    What Flower's own per-message ClientApp runs: the party is rebuilt from
    ``state``, handles the message, and its new state is returned to be saved.
    The long-lived worker (:mod:`hyfl.deploy.worker`) keeps the
    :class:`Party` of :func:`open_party` instead.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    message, state : (arrays, spec)
        The encoded message and the party's encoded state (``None`` before
        the first message), see :mod:`hyfl.deploy.codec`.
    node_config, run_config : mapping
        Flower's node config and run config.
    timing : mapping, optional
        The transport's own timings of this message (seconds), returned in
        the reply as ``timing`` for the server's statistics.

    Returns
    -------
    (reply, state)
        Both encoded. The reply carries ``ops``: the homomorphic operations
        this message cost the party (``delivery_ops`` for the deliveries).
    """
    party = open_party(node_config, run_config, state)
    reply = party.receive(kind, message, timing)
    return reply, party.saved_state()


def open_party(node_config: Mapping[str, Any], run_config: Mapping[str, Any],
               state: tuple[dict, str] | None = None) -> Party:
    """The party ``node_config`` describes, for the job ``run_config``, at ``state``.

    Both configs are validated and the job is checked against the party's
    policy before its key is read (the job cannot choose the cipher).
    ``state`` is what :meth:`Party.saved_state` returned (``None`` for a
    party that has not seen ``hello``); a state saved without its block has
    the block loaded again from the party's data (and checked to be the same).
    """
    try:
        config = DeployConfig.from_run_config(run_config)
    except HyflError as err:  # the job's own settings: its submitter must hear why
        raise JobRefused(str(err)) from None
    node = NodeSettings.from_node_config(node_config, config.parties)
    node.check_job(config)  # before the key is even read: the job cannot choose the cipher
    cipher = own_cipher(node, config)
    tree = decode(*state, cipher, sender="the party's own saved state") if state else {}
    party = Party(config, node, cipher, tree)
    if "block_ids" in tree:
        party.reload_block()
    return party


def server_text(err: BaseException, kind: str) -> str:
    """What the server hears of a party's error on a ``kind`` message.

    A :class:`~hyfl.errors.JobRefused` (the job asked for something the
    party's policy refuses) word for word; anything else as one generic
    sentence. The details stay with the party (its log): an error may quote
    the party's files (a data file's first bad token), name its paths, or
    tell the server something about a value it decrypted.
    """
    if isinstance(err, JobRefused):
        return str(err)
    return (f"the party could not handle the server's {kind!r} message; the reason is in the "
            "party's own log (it is not sent: it may quote the party's files or data)")


def own_cipher(node: NodeSettings, config: DeployConfig):
    """The party's cipher, built from its own node config (the job gives only the encoding).

    The key must be at least 2048 bits unless the node config admits insecure
    test keys, and must have the pinned fingerprint if the node config pins one.
    """
    from hyfl.deploy.keys import cipher_fingerprint, party_cipher

    cipher = party_cipher(node.cipher, node.key, insecure_test_keys=node.insecure_test_keys,
                          **config.cipher_options())
    own = cipher_fingerprint(cipher)
    if node.fingerprint and own != node.fingerprint:
        raise fail(f"party {node.party}", f"has key {node.key} with fingerprint {own}, but its "
                   f"node config pins fingerprint {node.fingerprint}",
                   "Install the private key the pin names, or update the pin.")
    return cipher


class Party:
    """A party between messages: its settings, cipher, state and live ``Client``.

    Built by :func:`open_party`. Flower's per-message ClientApp builds one per
    message (:func:`handle_message`); the long-lived worker keeps one per run,
    so the ``Client`` and the cipher stay in memory between messages.
    """

    def __init__(self, config: DeployConfig, node: NodeSettings, cipher, state: dict):
        self.config, self.node, self.cipher, self.state = config, node, cipher, dict(state)
        self._live = None  # the Client, built from the state at first use

    def receive(self, kind: str, message: tuple[dict, str],
                timing: Mapping[str, float] | None = None) -> tuple[dict, str]:
        """Decode one message, handle it, return the encoded reply.

        Everything the server sent is untrusted: a failure while handling it is
        a :class:`~hyfl.errors.HyflError` naming the message and the cause.
        After an error the party's state is undefined: drop this object.
        """
        if kind not in KINDS:
            raise fail(f"message kind {kind!r}", "is not known",
                       f"Known kinds: {', '.join(KINDS)}.")
        payload = decode(*message, self.cipher, sender="the server")
        try:
            reply = self.handle(kind, payload)
        except HyflError:
            raise
        except Exception as err:  # noqa: BLE001 (what the server sent is untrusted input)
            if kind == "hello":  # it reads only the checked fingerprint: a failure is ours
                raise
            # The fields were checked, but their values may still not fit together (an
            # index beyond the party's samples, counts that do not add up).
            raise fail(f"party {self.node.party}", f"could not handle the server's {kind!r} "
                       f"message ({type(err).__name__}: {err})",
                       "The message is malformed (garbled, forged, or from another hyfl "
                       "version); restart the run with matching versions.") from err
        if timing is not None:
            reply["timing"] = dict(timing)
        return encode(reply)

    def saved_state(self, with_block: bool = True) -> tuple[dict, str]:
        """The encoded state; ``with_block=False`` leaves the data out (only their ids),
        for a party that can load its block again (:meth:`reload_block`)."""
        if self._live is not None and "client" in self.state:
            self.state["client"] = _client_state(self._live)
        if with_block or "block" not in self.state or "aligned" in self.state:
            # (a party file's block needs the alignment: it cannot be loaded again)
            return encode(self.state)
        tree = {key: value for key, value in self.state.items() if key != "block"}
        block = self.state["block"]
        tree["block_ids"] = {"samples": block["samples"], "features": block["features"]}
        return encode(tree)

    def reload_block(self) -> None:
        """Load the block again from the party's data after a state saved without it."""
        ids = self.state.pop("block_ids")
        self.state["block"] = self._load_block()[0]
        block = self.state["block"]
        if not (np.array_equal(ids["samples"], block["samples"])
                and np.array_equal(ids["features"], block["features"])):
            raise fail(f"party {self.node.party}", "found other data than before its restart",
                       "Keep the party's data unchanged during a run, or start a new run.")

    def handle(self, kind: str, payload: dict) -> dict:
        check_fields(payload, MESSAGE_FIELDS[kind], self._from_server(kind))
        if kind == "hello":
            return self.hello(payload)
        if kind in ALIGN_KINDS:
            return self.align(kind, payload)
        if kind in SCORE_KINDS:
            return self.score(kind, payload)
        if "block" not in self.state:
            raise fail(f"party {self.node.party}", f"got a {kind!r} message before 'hello'",
                       "The server starts every run with hello; restart the run.")
        if kind == "ping":  # (says which party: a restarted SuperNode is found by it)
            return {"party": self.node.party}
        if kind == "setup":
            return self.setup(payload)
        if "client" not in self.state:
            raise fail(f"party {self.node.party}", f"got a {kind!r} message before 'setup'",
                       "The server sets every party up first; restart the run.")
        self._check_kind(kind)
        counts = self.cipher.counts
        client = self._client()
        start = counts.snapshot()
        self._deliver(client, payload.get("deliveries") or {})
        self._guard.admit(kind)
        middle = counts.snapshot()
        tic = time.perf_counter()
        reply = getattr(self, "_" + kind)(client, payload)
        self._guard.answered(kind)
        reply["seconds"] = time.perf_counter() - tic
        reply["ops"] = _ops(counts - middle)
        reply["delivery_ops"] = _ops(middle - start)
        self.state["client"] = _client_state(client)
        return reply

    # -- hello and set-up --------------------------------------------------------
    def hello(self, payload: dict) -> dict:
        """Check the server's key; load the block; report ids, sizes, cipher and key."""
        from hyfl.deploy.keys import cipher_fingerprint

        own = cipher_fingerprint(self.cipher)
        self.node.check_key(own, payload.get("fingerprint"))
        guard = self.state.get("guard", {})
        Guard(guard, self.node.party).hello()
        self._live = None
        if is_party_file(self.node.data):  # its block's ids come from the alignment
            aligning, announce = open_file(self.node, self.config, cipher_secret(self.cipher),
                                           self._log)
            self.state = {"party": self.node.party, "alignment": aligning, "guard": guard}
            return {"party": self.node.party, "fingerprint": own, "cipher": self.node.cipher,
                    "key_bits": int(self.cipher.key_bits), "slots": int(self.cipher.slots),
                    "name": aligning["name"], "align": announce}
        tree, block = self._load_block()
        self.state = {"party": self.node.party, "block": tree, "guard": guard}
        return self._announce(block, own)

    def _announce(self, block, own: str) -> dict:
        """The ``hello`` reply of a party with its block: its ids, sizes, cipher and key."""
        guard = self.state["guard"]
        reply = {"party": self.node.party, "n_samples": block.n_samples,
                 "n_features": block.n_features, "n_outputs": int(block.Y.shape[1]),
                 "samples": block.samples, "features": block.features,
                 "lam_default": block.lam_default, "fingerprint": own,
                 "cipher": self.node.cipher, "key_bits": int(self.cipher.key_bits),
                 "slots": int(self.cipher.slots), "name": block.name}
        secret = cipher_secret(self.cipher)
        if secret is not None:  # the announcement the set-up must relay unchanged
            nonce = secrets.token_bytes(16)
            guard["nonce"] = nonce.hex()
            sizes = (block.n_samples, block.n_features, int(block.Y.shape[1]))
            tag = announcement_tag(secret, self.node.party, sizes, float(block.lam_default),
                                   block.samples, block.features, nonce)
            reply["nonce"] = np.frombuffer(nonce, dtype=np.uint8).copy()
            reply["tag"] = np.frombuffer(tag, dtype=np.uint8).copy()
        return reply

    def align(self, kind: str, payload: dict) -> dict:
        """The alignment's messages (:mod:`hyfl.deploy.party_files`), once each, in order."""
        aligning = self.state.get("alignment")
        if aligning is None:
            raise fail(f"party {self.node.party}", f"got an {kind!r} message, but its data "
                       "are not a party file (or it was already aligned)", FORGED_FIX)
        done = aligning.setdefault("done", [])
        expected = ALIGN_KINDS[len(done)] if len(done) < len(ALIGN_KINDS) else None
        if kind != expected:
            raise fail(f"party {self.node.party}", f"got the alignment's {kind!r} message "
                       f"where {expected!r} was due", FORGED_FIX)
        done.append(kind)
        party, secret = self.node.party, cipher_secret(self.cipher)
        if kind == "align":
            return on_align(aligning, payload, party, secret, self._log)
        if kind == "labels":
            return on_labels(aligning, payload, party)
        block = on_block(aligning, payload, self.node, self._log, self.config)
        self.state["numbering"] = numbering_record(aligning)  # checked at setup
        del self.state["alignment"]
        self.state["block"], self.state["aligned"] = _block_tree(block), True
        from hyfl.deploy.keys import cipher_fingerprint

        return self._announce(block, cipher_fingerprint(self.cipher))

    def score(self, kind: str, payload: dict) -> dict:
        """Scoring new rows (:mod:`hyfl.deploy.scoring`): after the alignment's ``labels``,
        ``score`` once, then (the asker only) ``scores`` once."""
        aligning = self.state.get("alignment")
        done = [] if aligning is None else aligning.setdefault("done", [])
        due = ["align", "labels"] if kind == "score" else ["align", "labels", "score"]
        if done != due:
            raise fail(f"party {self.node.party}", f"got a {kind!r} message after "
                       f"{done or 'no alignment'}, not after {due}", FORGED_FIX)
        done.append(kind)
        if kind == "score":
            return on_score(aligning, payload, self.node.party, self.node.out)
        return on_scores(aligning, payload, self.node.party, self.node.out, self.config.loss)

    def _log(self, line: str) -> None:
        print(f"party {self.node.party}: {line}", flush=True)

    def _load_block(self):
        """The party's block from its data, as a state tree and as loaded."""
        from hyfl.deploy.blocks import load_block

        block = load_block(self.node, self.config)
        return _block_tree(block), block

    def setup(self, payload: dict) -> dict:
        """Learn who holds what (the public layout); send the encrypted row norms."""
        from hyfl.algorithms.hyfdca_parties import public_info

        k = self.node.party
        self._guard.setup()
        samples = np.split(payload["samples"], np.cumsum(payload["sample_counts"])[:-1])
        features = np.split(payload["features"], np.cumsum(payload["feature_counts"])[:-1])
        if len(samples) != self.config.parties or len(features) != self.config.parties:
            # (each relayed announcement verifies alone: one left out would go unseen)
            raise fail(self._from_server("setup"), f"holds a partition of {len(samples)} "
                       f"parties, not the job's {self.config.parties}", FORGED_FIX)
        block = self.state["block"]
        if not (np.array_equal(samples[k], block["samples"])
                and np.array_equal(features[k], block["features"])):
            raise fail(f"party {k}", "was sent a partition in which its block differs from its "
                       "data", "Restart the run; every party must keep its data during a run.")
        check_numbering(self.state.get("numbering"), samples, k, int(payload["n_samples"]))
        if payload["n_outputs"] != block["Y"].shape[1]:
            raise fail(self._from_server("setup"), f"sets {payload['n_outputs']} outputs, but "
                       f"this party's labels have {block['Y'].shape[1]}", FORGED_FIX)
        secret = cipher_secret(self.cipher)
        self.state.pop("run", None)
        if secret is not None:
            check_announcements(secret, k, bytes.fromhex(self.state["guard"]["nonce"]), payload,
                                samples, features, self.config.lam)
            # The run's identity, computed here from the nonces just checked (each party's
            # under its tag, this party's own fresh one among them): every tag of the run
            # is keyed with it, so nothing of another run verifies (issue 42, point 3).
            run = run_identity([bytes(row) for row in payload["nonces"].astype(np.uint8)])
            self.state["run"] = np.frombuffer(run, dtype=np.uint8).copy()
        blocks = structure_blocks(payload["n_samples"], payload["n_features"], samples, features)
        public = public_info(self.config.algorithm, blocks, payload["n_outputs"], payload["lam"],
                             self.cipher.slots)
        self.state["public"] = _public_to_tree(public)
        self.state.pop("client", None)
        self._live = None
        client = self._client()
        self.state["client"] = _client_state(client)
        self.state["open"], self.state["snapshot"] = 0, None
        tic = time.perf_counter()
        counts = self.cipher.counts.snapshot()
        reply = client.setup_messages()
        reply["seconds"] = time.perf_counter() - tic
        reply["ops"] = _ops(self.cipher.counts - counts)
        return reply

    # -- rounds ------------------------------------------------------------------
    def _round(self, client, payload: dict) -> dict:
        """Configure; unless returning or told to wait, answer at once (:meth:`_with_weights`).

        With the cocoa rule, when some party returns, every party computes its
        inner products only with the refreshed weights (``wait``: they follow).
        """
        where = self._from_server("round") + " field configure"
        configure = check_fields(payload["configure"], _CONFIGURE_FIELDS, where)
        _check_local_ids(configure, client.samples.size, where)
        order = "order_local" if self._cocoa else "drawn_local"
        if configure.get(order) is None:
            raise fail(where, f"has no field {order!r} (the step rule is "
                       f"{self.config.algorithm.step_rule!r})", "Both sides must run the same "
                       "hyfl version and job; the message may be garbled.")
        if (payload.get("wait") or payload.get("model") is not None) and not self._cocoa:
            raise fail(self._from_server("round"), "has cocoa fields (wait, model), but the "
                       f"step rule is {self.config.algorithm.step_rule!r}",
                       "Both sides must run the same hyfl version and job.")
        self._close_abandoned(client)
        self._guard.open_round(int(configure["t"]), configure.get("stale") is not None,
                               self.config.parties, self.config.iterations)
        self.state["open"] = int(configure["t"])
        # Everything the round may change, copied (the cocoa rule's memory and last step
        # too): an abandoned round is undone from it.
        self.state["snapshot"] = _copied(_client_state(client))
        # The attempt the party counted (its tags name it; every party of an attempt was in
        # all the attempts of the round before it, so they count alike).
        payload = {**payload, "configure": {**configure,
                                            "attempt": self._guard.state["attempts"]}}
        if configure.get("stale") is not None or payload.get("wait"):
            # returning, or waiting for a returning party's refresh: the weights follow
            self._guard.expect_weights()
            return answer(client, "round", payload)
        return self._with_model(client, payload, "round")

    def _weights(self, client, payload: dict) -> dict:
        self._checked_weights(client, payload["w"], "weights", "w")
        if payload.get("model") is not None and not self._cocoa:
            raise fail(self._from_server("weights"), "has a cocoa model, but the step rule is "
                       f"{self.config.algorithm.step_rule!r}",
                       "Both sides must run the same hyfl version and job.")
        return self._with_model(client, payload, "weights")

    def _with_model(self, client, payload: dict, kind: str) -> dict:
        """Answer ``kind`` once the party has this round's weights: its encrypted inner
        products, or, if the cocoa subproblem's model came along (horizontal data: the
        server has nothing to sum first), its proposals at once."""
        model = payload.get("model")
        if model is None:
            return answer(client, kind, payload)
        check_fields(model, MESSAGE_FIELDS["proposals"], self._from_server(kind) + " field model")
        self._check_model(client, model, kind)
        self._guard.admit("proposals")
        reply = answer(client, kind, payload)
        self._guard.answered("proposals")
        return reply

    def _steps(self, client, payload: dict) -> dict:
        return answer(client, "steps", payload)

    def _duals(self, client, payload: dict) -> dict:
        return answer(client, "duals", payload)

    def _verdict(self, client, payload: dict) -> dict:
        self._check_range(np.array([payload["dw_sq"]]), 0.0, np.inf, "verdict", "dw_sq")
        return answer(client, "verdict", payload)

    def _commit(self, client, payload: dict) -> dict:
        return answer(client, "commit", payload)  # the optional second SecureInnerProduct

    # -- the cocoa rule's round (hyfl.runtime.protocol._cocoa_round) ------------------------
    def _proposals(self, client, payload: dict) -> dict:
        """The round's inner products and directions' Gram matrix -> encrypted proposals."""
        self._check_model(client, payload, "proposals")
        return answer(client, "proposals", payload)

    def _check_model(self, client, payload: dict, kind: str) -> None:
        """The subproblem's model as an honest server sends it (shapes, the scaling)."""
        depth = client.memory.slots.size
        self._check_shape(payload["grams"], (self._outputs, depth * (depth + 1) // 2),
                          kind, "grams")
        if payload.get("towards_w") is not None:
            self._check_shape(payload["towards_w"], (self._outputs, depth), kind, "towards_w")
        check_coef(payload["coef"], self.config.parties, client.public.n_samples,
                   client.public.lam, kind, self.node.party)

    def _image(self, client, payload: dict) -> dict:
        """The proposals' sums (a returning party: also its samples' last steps) -> the
        primal image."""
        return answer(client, "image", payload)

    def _direction(self, client, payload: dict) -> dict:
        """The momentum coefficient -> the direction's primal image, encrypted sums."""
        self._check_shape(payload["mu"], (self._outputs,), "direction", "mu")
        self._check_range(payload["mu"], 0.0, self.config.algorithm.momentum, "direction", "mu")
        return answer(client, "direction", payload)

    def _step(self, client, payload: dict) -> dict:
        """The summed line-search sums -> the step, taken at once: the encrypted changes of
        the reported duals (the judge also returns the step and the coherence).

        The round stays open (its snapshot kept) until the server's commit arrives: if
        another party misses this message, the server restarts the round.
        """
        for name in ("dw_sq", "coherence"):
            self._check_shape(payload[name], (self._outputs,), "step", name)
            self._check_range(payload[name], 0.0, np.inf, "step", name)
        if not 1 <= payload["updated"] <= client.public.n_samples:
            raise fail(self._from_server("step"), f"field updated is {payload['updated']}, "
                       f"not a number of samples in 1..{client.public.n_samples}", FORGED_FIX)
        if payload.get("dw") is not None:  # the move of its weights: the next round's sums
            self._checked_weights(client, payload["dw"], "step", "dw")
        return answer(client, "step", payload)

    def _certify(self, client, payload: dict) -> dict:
        """(One party, for all) decide on a checkpoint (hyfl.algorithms.hyfdca_certify)."""
        self._check_shape(payload["w_sq"], (2,), "certify", "w_sq")
        self._check_range(payload["w_sq"], 0.0, np.inf, "certify", "w_sq")
        return answer(client, "certify", payload)

    def _finish(self, client, payload: dict) -> dict:
        """End of the run: close any abandoned round, write the party's state if asked."""
        self._close_abandoned(client)
        self._guard.finish()
        if self.node.out:
            # Its final duals, whose signs are its labels: owner only from creation.
            out = private_folder(Path(self.node.out))
            block = self.state["block"]
            with private_write(out / f"party-{self.node.party}.npz", "wb") as f:
                np.savez(f, samples=block["samples"], features=block["features"],
                         alpha=client.alpha, w=client.w)
        return {"written": bool(self.node.out)}

    # -- helpers -------------------------------------------------------------------------
    def _from_server(self, kind: str) -> str:
        return f"the server's {kind!r} message to party {self.node.party}"

    @property
    def _cocoa(self) -> bool:
        return self.config.algorithm.rule.subproblem

    @property
    def _outputs(self) -> int:
        return int(self.state["public"]["n_outputs"])

    def _check_kind(self, kind: str) -> None:
        """A message of the job's step rule, and of an open round where it belongs."""
        other = PER_SAMPLE_KINDS if self._cocoa else COCOA_KINDS
        if kind in other:
            raise fail(f"party {self.node.party}", f"got a {kind!r} message, but the job's step "
                       f"rule is {self.config.algorithm.step_rule!r}",
                       "Both sides must run the same hyfl version and job; the message may be "
                       "forged.")
        if kind in _IN_ROUND and not self.state.get("open"):
            raise fail(f"party {self.node.party}", f"got a {kind!r} message outside a round",
                       "The server opens every round with a 'round' message; the message may "
                       "be out of order or forged.")

    @property
    def _guard(self) -> Guard:
        return Guard(self.state.setdefault("guard", {}), self.node.party)

    def _check_range(self, value: np.ndarray, low: float, high: float, kind: str,
                     field: str) -> None:
        """Numbers the honest server sends within [low, high] (finite), refused otherwise."""
        value = np.asarray(value, dtype=float)
        if not (np.all(np.isfinite(value)) and np.all(value >= low) and np.all(value <= high)):
            raise fail(self._from_server(kind), f"field {field} holds {value.tolist()!r}, "
                       f"outside [{low:g}, {high:g}]", FORGED_FIX)

    def _check_shape(self, value: np.ndarray, shape: tuple, kind: str, field: str) -> None:
        if value.shape != shape:
            raise fail(self._from_server(kind), f"field {field} has shape {value.shape}, not "
                       f"{shape}", "Both sides must run the same hyfl version; the message may "
                       "be garbled.")

    def _deliver(self, client, deliveries: dict) -> None:
        """Apply what the server piggybacked: the row norms, the last round's commit (its
        verdict and the new weights), which closes the round."""
        where = self._from_server("delivery") + " field deliveries"
        check_fields(deliveries, _DELIVERY_FIELDS, where)
        if deliveries.get("norms") is not None:
            client.learn_norms(deliveries["norms"])
        commit = deliveries.get("commit")
        if commit is not None:
            check_fields(commit, _COMMIT_FIELDS, where + ".commit")
            self._checked_weights(client, commit["w"], "delivery", "deliveries.commit.w")
        # Only the round still open may be committed; a repeated commit is ignored.
        if commit is not None and int(commit["round"]) == self.state.get("open"):
            if self._cocoa and "step" not in self._guard.state["done"]:
                raise fail(where, f"commits round {commit['round']} before the party took "
                           "its step", FORGED_FIX)
            deliver(client, "commit", commit)
            self._guard.closed(self.state["open"])
            self.state["open"], self.state["snapshot"] = 0, None

    def _checked_weights(self, client, w: np.ndarray, kind: str, field: str) -> np.ndarray:
        """Weights for this party's features: shape (|M_k|, C), finite."""
        if w.shape != client.w.shape or not np.all(np.isfinite(w)):
            raise fail(self._from_server(kind), f"field {field} has shape {w.shape} (or "
                       f"non-finite values), not this party's weights {client.w.shape}",
                       "Both sides must run the same hyfl version; the message may be garbled.")
        return w

    def _close_abandoned(self, client) -> None:
        """An open round the server did not close (commit, or with the cocoa rule
        ``closed``) was abandoned by the server: undo it."""
        if self.state.get("open"):
            _set_client_state(client, self.state["snapshot"])
            self.state["open"], self.state["snapshot"] = 0, None

    def _client(self):
        """The live ``Client``: built from the state once, then kept (its state is the
        party's until :meth:`saved_state` copies it out)."""
        from hyfl.algorithms.hyfdca_parties import Client
        from hyfl.losses import get_loss

        if self._live is not None:
            return self._live
        block = self.state["block"]
        X = sp.csr_matrix((block["data"], block["indices"], block["indptr"]),
                          shape=tuple(block["shape"]))
        public = _public_from_tree(self.state["public"], self.config.algorithm)
        run = self.state.get("run")
        client = Client(self.node.party, public, block["samples"], block["features"], X,
                        block["Y"], get_loss(self.config.loss), self.cipher,
                        run=None if run is None else bytes(np.asarray(run, dtype=np.uint8)))
        if "client" in self.state:
            _set_client_state(client, self.state["client"])
        self._live = client
        return client


def _block_tree(block) -> dict:
    """A :class:`~hyfl.deploy.blocks.Block` as a state tree."""
    X = block.X.tocsr()
    return {"samples": block.samples, "features": block.features, "data": X.data,
            "indices": X.indices, "indptr": X.indptr, "shape": list(X.shape), "Y": block.Y}


def _client_state(client) -> dict:
    """The client's changing state as codec values (not copied).

    :meth:`Client.get_state`, the cocoa rule's memory as its arrays
    (:attr:`~hyfl.algorithms.hyfdca_local.ClientMemory.STATE`: the inner products
    and weights of the ``depth`` slots it lists, the slots, their rounds and columns).
    """
    state = client.get_state()
    memory = state.get("memory")
    if memory is not None:
        state["memory"] = {key: getattr(memory, key) for key in memory.STATE}
    return state


def _set_client_state(client, state: dict) -> None:
    """Restore what :func:`_client_state` returned (its arrays become the client's)."""
    state = dict(state)
    memory = state.pop("memory", None)
    ring = getattr(client, "memory", None)
    if ring is not None:  # the cocoa rule: its memory is checked before anything is set
        fix = ("Start a new run (the state is from another job or hyfl version, or "
               "was damaged).")
        if not isinstance(memory, dict):
            raise fail("the party's saved state", "has no cocoa memory (or not as "
                       "arrays)", fix)
        problem = ring.problem_with(memory)
        if problem is not None:
            raise fail("the party's saved state", problem, fix)
    client.set_state(state)
    if ring is not None:
        for key in ring.STATE:
            setattr(ring, key, np.asarray(memory[key], dtype=getattr(ring, key).dtype))


def _copied(tree: Any) -> Any:
    """``tree`` with every array copied; ciphertexts, never changed in place, are shared."""
    if isinstance(tree, np.ndarray):
        return tree.copy()
    if isinstance(tree, dict):
        return {key: _copied(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_copied(value) for value in tree)
    return tree


def _check_local_ids(configure: dict, n_local: int, where: str) -> None:
    """The round's local sample indices must index this party's samples (ascending, once)."""
    for name in ("updated_local", "drawn_local", "order_local"):
        ids = configure.get(name)
        if ids is None:
            continue
        if ids.size and (ids.min() < 0 or ids.max() >= n_local
                         or (name == "updated_local" and np.any(np.diff(ids) <= 0))):
            raise fail(where, f"field {name} holds indices outside 0...{n_local - 1} (or not "
                       "ascending)", "Both sides must run the same hyfl version; the message "
                       "may be garbled or forged.")
    if configure["reports_local"].size != configure["updated_local"].size:
        raise fail(where, f"field reports_local has {configure['reports_local'].size} flags for "
                   f"{configure['updated_local'].size} updated samples",
                   "Both sides must run the same hyfl version; the message may be garbled.")


def _ops(counts) -> dict[str, int]:
    return {"encryptions": int(counts.encryptions), "decryptions": int(counts.decryptions),
            "additions": int(counts.additions)}


def _public_to_tree(public) -> dict:
    """Public without the hyperparameters (the run config has them), as plain values."""
    out = {}
    for f in dataclasses.fields(public):
        value = getattr(public, f.name)
        if f.name == "hyfdca":
            continue
        if dataclasses.is_dataclass(value):
            value = {g.name: getattr(value, g.name) for g in dataclasses.fields(value)}
        out[f.name] = value
    return out


def _public_from_tree(tree: dict, hyfdca):
    from hyfl.algorithms.hyfdca_parties import Public
    from hyfl.privacy.layout import SlotLayout

    values = dict(tree)
    for name in ("layout", "norm_layout"):
        values[name] = SlotLayout(**values[name])
    return Public(hyfdca=hyfdca.validated(), **values)
