"""The server's side of deployed HyFDCA: rounds, absences and results, over any transport.

:class:`Coordinator` drives HyFDCA's :class:`~hyfl.algorithms.hyfdca_parties.Server`
(public key only) through the same message sequence as the in-process engine
(:func:`hyfl.runtime.protocol.run_protocol`), with the same seed streams, so
a run without absences reproduces that engine's iterates exactly. It talks to
the parties through a :class:`Transport` (Flower's Grid in
:mod:`hyfl.deploy.app`), which addresses parties by index and returns their
replies, or reports the ones that did not come back in time.

A round is the round script of :mod:`hyfl.algorithms.hyfdca_round` (its message
order is written there once), played over the transport: each exchange sends
one message per addressed party and waits for all their replies. Posted
messages -- the set-up's row norms, a round's commit (its verdict and each
party's new weights) -- wait in the party's *mail* and travel as
``deliveries`` with its next ``round`` (or ``commit``, ``finish``) message.
With the cocoa rule a round stands once every participant has answered its
``step`` message (with its dual changes); the commit delivered with the next
message tells the party it may drop the round's snapshot.

Absence. A participant that has not replied within ``reply_timeout`` (or whose
node the SuperLink reports unavailable) makes the whole round *void*: the
server restores its whole state from the start of the round (a copy: its
random generator, so the draws are those of a run in which that party was
absent, and with the cocoa rule its history, momentum and line-search memory),
marks the party absent and runs the round again without it; the other parties
discard the abandoned round when they receive the new ``round`` message (see
:mod:`hyfl.deploy.party`). HyFDCA then uses the absent party's stale blocks
(its last inner products and primal part), exactly as for a party the
schedule left out. An absent party is pinged in the background every round;
once it answers it takes part again (as a returning party, refreshed with the
duals it missed). A round is therefore always a complete HyFDCA round of some
set of parties, never a half-applied one, and the run equals
``run_protocol`` with the participation trace of the parties that actually
took part (recorded per round).

Why restart the round rather than just dropping the late party's messages:
the server's draws and the other parties' steps of step 2 already include the
late party (its samples were drawn, the dual aggregation expects its steps),
and HyFDCA's dual updates over shared samples are averaged over their
holders, so continuing without it would apply a different algorithm than
the one whose iterates the parties agreed to. Restarting costs the abandoned
attempt's messages per absence and is exact.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hyfl._private_files import private_folder, private_write, write_private_json
from hyfl.algorithms.hyfdca_round import PHASES, Exchange, Post, one_round, play_round
from hyfl.deploy.codec import check_fields
from hyfl.deploy.config import DeployConfig, structure_blocks
from hyfl.errors import HyflError, clause, fail
from hyfl.losses import get_loss
from hyfl.privacy.layout import TaggedLayout

__all__ = ["LATEST_WEIGHTS", "REPLY_FIELDS", "Coordinator", "PartyMissing", "Transport",
           "write_failure"]

#: File in ``out`` with the server's ``w`` after the latest round (``iteration``, ``w``).
LATEST_WEIGHTS = "weights-latest.npz"

#: Replies' metadata besides the payload, and its types (see check_fields).
_META_FIELDS = {"seconds": "number?", "ops": "counts?", "delivery_ops": "counts?",
                "timing": "numbers?"}
_META = tuple(_META_FIELDS)
#: The fields of each kind of reply the coordinator reads (besides the metadata).
_HELLO_COMMON = {"party": "int", "fingerprint": "str", "cipher": "str", "key_bits": "int",
                 "slots": "int", "name": "str?", "node": "int?"}
_HELLO_BLOCK = {**_HELLO_COMMON, "n_samples": "int", "n_features": "int", "n_outputs": "int",
                "samples": "ids", "features": "ids", "lam_default": "number", "nonce": "ids?",
                "tag": "ids?"}
REPLY_FIELDS: dict[str, dict[str, str]] = {
    "hello": _HELLO_BLOCK,
    # A party with its own file (hyfl.deploy.party_files): aligned before its block is known.
    "hello (party file)": {**_HELLO_COMMON, "align": "dict"},
    "align": {"reblinded": "matrix", "tags": "matrix?"},
    "labels": {"sealed": "dict", "moments": "matrix?", "moments_check": "ids?"},
    "block": _HELLO_BLOCK,
    "setup": {"norms": "vector"},
    # The round's messages: their replies are part of the round script.
    **{name: dict(phase.replies) for name, phase in PHASES.items()},
    "ping": {"party": "int?"},
    "finish": {"written": "bool"},
}
#: Which optional fields a reply must hold depends on the round (a returning party, the
#: step rule, horizontal data): they are checked where they are read (hyfdca_round.reply_field).


class PartyMissing(Exception):
    """Parties that did not reply in time (the round is void)."""

    def __init__(self, parties, kind: str):
        super().__init__(f"no reply to {kind!r} from parties {sorted(parties)}")
        self.parties, self.kind = set(parties), kind


class Transport(Protocol):
    """How the coordinator reaches the parties (see :class:`hyfl.deploy.app.FlowerTransport`)."""

    sent_bytes: int
    received_bytes: int

    def connect(self, n_parties: int, timeout: float, hello: dict) -> dict[int, dict]:
        """Send ``hello`` (the server's cipher and key fingerprint) to the parties as they
        appear; their replies by party index."""

    def exchange(self, messages: dict[int, tuple[str, dict]], timeout: float
                 ) -> tuple[dict[int, dict], set[int]]:
        """Send ``{party: (kind, payload)}``; ``(replies, missing)`` after at most ``timeout``."""

    def post(self, party: int, kind: str, payload: dict) -> Any:
        """Send without waiting; a handle for :meth:`poll`."""

    def poll(self, handle: Any) -> str:
        """``"pending"``, ``"replied"`` or ``"failed"`` for a posted message."""


class Coordinator:
    """Runs one deployed HyFDCA job.

    Parameters
    ----------
    config : DeployConfig
    transport : Transport
    cipher : hyfl.privacy.ciphers.Cipher
        The server's public view (no private key).
    log : callable, optional
        Receives one line of progress at a time (default: print).
    """

    def __init__(self, config: DeployConfig, transport: Transport, cipher,
                 log: Callable[[str], None] | None = None):
        self.config, self.transport, self.cipher = config, transport, cipher
        self.log = log or (lambda line: print(line, flush=True))

    # -- the run ---------------------------------------------------------------------
    def run(self) -> dict:
        """Connect, set up, run the rounds, finish; returns (and writes) the results."""
        started = time.perf_counter()
        self.results: dict[str, Any] = {
            "status": "running", "error": None, "engine": "flower",
            "config": _config_record(self.config), "cipher": self.cipher.describe(),
            "warnings": self._warnings(), "parties": {}, "setup": {}, "rounds": [],
            "seconds": {},
        }
        for line in self.results["warnings"]:
            self.log(line)
        self.weights: list[np.ndarray] = []
        self.setup_record: dict[str, Any] = {}
        try:
            tic = time.perf_counter()
            self._connect()
            self.results["seconds"]["connect"] = time.perf_counter() - tic
            tic = time.perf_counter()
            self._setup()
            self.results["seconds"]["setup"] = time.perf_counter() - tic
            tic = time.perf_counter()
            for t in range(1, self.config.iterations + 1):
                self._round(t)
                self._write()
            self.results["seconds"]["rounds"] = time.perf_counter() - tic
            tic = time.perf_counter()
            self._finish()
            self.results["seconds"]["finish"] = time.perf_counter() - tic
            self.results["status"] = "completed"
        except HyflError as err:
            # Without its final period: readers quote it inside a sentence ("failed: ...").
            self.results.update(status="failed", error=clause(err))
            raise
        except Exception as err:
            self.results.update(status="failed", error=clause(f"{type(err).__name__}: {err}"))
            raise
        finally:
            self.results["seconds"]["total"] = time.perf_counter() - started
            self._write(final=True)
        return self.results

    def _warnings(self) -> list[str]:
        """Lines every output of this run repeats (insecure test keys)."""
        from hyfl.deploy.keys import SECURE_KEY_BITS, insecure_warning, paillier_bits

        bits = paillier_bits(self.cipher)
        if bits is not None and bits < SECURE_KEY_BITS:
            return [insecure_warning(bits)]
        return []

    # -- connect and set up ----------------------------------------------------------
    def _connect(self) -> None:
        from hyfl.deploy.keys import cipher_fingerprint

        K = self.config.parties
        self.log(f"waiting for {K} parties (at most {self.config.connect_timeout:g} s)")
        own = cipher_fingerprint(self.cipher)
        hellos = self.transport.connect(K, self.config.connect_timeout,
                                        {"cipher": self.cipher.name, "fingerprint": own})
        for k, hello in hellos.items():
            party_file = isinstance(hello, dict) and hello.get("align") is not None
            self._check_reply(k, "hello (party file)" if party_file else "hello", hello)
            if hello["party"] != k:
                raise fail(f"party {k}", f"says in its hello that it is party {hello['party']}",
                           "Run every party with the same hyfl version.")
        if sorted(hellos) != list(range(K)):
            raise fail(f"the {K} parties' hellos", f"came from parties {sorted(hellos)}",
                       f"Number the parties 0 to {K - 1} (node config party=K).")
        if any(hello.get("align") is not None for hello in hellos.values()):  # party files
            hellos = self._align(hellos)
        _check_sizes(hellos)
        first = hellos[0]
        for k, hello in sorted(hellos.items()):
            for key in ("n_samples", "n_features", "n_outputs"):
                if hello[key] != first[key]:
                    raise fail(f"party {k}", f"has {key} = {hello[key]}, party 0 {first[key]}",
                               "Give every party a block of the same data set and partition.")
            if hello["cipher"] != self.cipher.name:
                raise fail(f"party {k}", f"runs cipher {hello['cipher']!r} (its node config), "
                           f"but the job asks for {self.cipher.name!r}",
                           f"Submit the job with cipher={hello['cipher']}; a party's cipher is "
                           "its own policy.")
            if hello["fingerprint"] != own:
                raise fail(f"party {k}", "holds a different key than the server's public key",
                           "Give every party the private-key.json and the server the "
                           "public-key.json written together by `hyfl deploy keys`.")
            if hello["slots"] != self.cipher.slots:
                raise fail(f"party {k}", f"packs {hello['slots']} values per ciphertext, the "
                           f"server {self.cipher.slots}",
                           "Run every party with the same hyfl version and cipher settings.")
        lam = self.config.lam
        if lam == 0:
            defaults = {float(h["lam_default"]) for h in hellos.values()}
            if len(defaults) != 1:
                raise fail("run config lam", "is 0 (the data's default), but the parties report "
                           f"different defaults {sorted(defaults)}", "Set lam explicitly.")
            lam = defaults.pop()
        self.lam = lam
        self.hellos = hellos
        self.results["parties"] = {
            str(k): {"samples": int(len(h["samples"])), "features": int(len(h["features"])),
                     "node": h.get("node"), **({"name": h["name"]} if h.get("name") else {})}
            for k, h in sorted(hellos.items())
        }
        self.results["lam"] = lam
        self.results["n_samples"] = int(first["n_samples"])
        self.results["n_features"] = int(first["n_features"])
        self.log(f"parties connected: {', '.join(str(k) for k in sorted(hellos))}")

    def _align(self, hellos: dict[int, dict]) -> dict[int, dict]:
        """Parties with their own files: align them first (:mod:`hyfl.deploy.party_files`)."""
        from hyfl.deploy.party_files import align_parties

        files = sorted(k for k, hello in hellos.items() if hello.get("align") is not None)
        others = sorted(set(hellos) - set(files))
        if others:
            raise fail(f"part{'ies' if len(others) > 1 else 'y'} {', '.join(map(str, others))}",
                       f"bring a block file or a dataset, while parties {files} bring their "
                       "own party files", "Give every party its own party file (node config "
                       "data='....csv'), or every party a block from `hyfl deploy split`.")
        tally = _Tally(self.transport)

        def exchange(messages: dict[int, tuple[str, dict]]) -> dict[int, dict]:
            try:
                return self._exchange(messages, tally)
            except PartyMissing as missing:
                raise fail(f"part{'ies' if len(missing.parties) > 1 else 'y'} "
                           f"{', '.join(map(str, sorted(missing.parties)))}",
                           f"did not answer the alignment's {missing.kind!r} message within "
                           f"{self.config.reply_timeout:g} s", "Every party takes part in the "
                           "alignment; check its SuperNode log, raise reply-timeout for large "
                           "files, and start the run again.") from None

        aligned, record = align_parties(hellos, exchange, self.config, self.log)
        self.results["alignment"] = {**record, **tally.record()}
        return aligned

    def _setup(self) -> None:
        from hyfl.algorithms.hyfdca_parties import Server, public_info
        from hyfl.runtime.protocol import Wire
        from hyfl.runtime.simulation import random_streams

        K, first = self.config.parties, self.hellos[0]
        samples = [np.asarray(self.hellos[k]["samples"], dtype=np.int64) for k in range(K)]
        features = [np.asarray(self.hellos[k]["features"], dtype=np.int64) for k in range(K)]
        blocks = structure_blocks(first["n_samples"], first["n_features"], samples, features)
        C = int(first["n_outputs"])
        self.public = public_info(self.config.algorithm, blocks, C, self.lam, self.cipher.slots)
        self.participation = self.config.participation_schedule()
        self.participation_rng, algorithm_rng = random_streams(self.config.seed)
        self.server = Server(self.public, samples, features, self.cipher, algorithm_rng)
        self.was_active = np.zeros(K, dtype=bool)
        self.mail: dict[int, dict] = {k: {} for k in range(K)}
        self.absent: dict[int, dict] = {}
        self.weights.append(self.server.w.copy())

        payload = {
            "n_samples": int(first["n_samples"]), "n_features": int(first["n_features"]),
            "n_outputs": C, "lam": float(self.lam),
            "samples": np.concatenate(samples),
            "sample_counts": np.array([s.size for s in samples]),
            "features": np.concatenate(features),
            "feature_counts": np.array([f.size for f in features]),
        }
        if all(self.hellos[k].get("tag") is not None for k in range(K)):
            # Each party's announcement, relayed unchanged: a party checks the partition
            # against them (hyfl.deploy.guard.check_announcements).
            payload.update(
                nonces=np.stack([self.hellos[k]["nonce"] for k in range(K)]).astype(np.uint8),
                tags=np.stack([self.hellos[k]["tag"] for k in range(K)]).astype(np.uint8),
                lam_defaults=np.array([float(self.hellos[k]["lam_default"])
                                       for k in range(K)]))
        wire = Wire(int(self.cipher.ciphertext_bytes))
        tally = _Tally(self.transport)
        before = self.cipher.counts.snapshot()
        self.setup_record: dict[str, Any] = {}
        try:
            replies = self._exchange({k: ("setup", payload) for k in range(K)}, tally)
        except PartyMissing as missing:
            raise fail(f"part{'ies' if len(missing.parties) > 1 else 'y'} "
                       f"{', '.join(map(str, sorted(missing.parties)))}",
                       f"did not answer the set-up within {self.config.reply_timeout:g} s",
                       "Every party must take part in the set-up (the server sums the row "
                       "norms of all of them); check its SuperNode log and start the run "
                       "again.") from None
        norms = self.server.setup([wire.up(k, "setup", {"norms": replies[k]["norms"]})
                                   for k in range(K)])
        for k, vec in enumerate(norms):
            self.mail[k]["norms"] = wire.down(k, "norms", vec)
        tally.add_ops(_ops(self.cipher.counts - before))
        self.setup_record.update({**tally.record(), "bytes_up": wire.bytes()[0],
                                  "bytes_down": wire.bytes()[1]})
        self.results["setup"] = self.setup_record
        self.log(f"set-up done: {K} parties, {first['n_samples']} samples, "
                 f"{first['n_features']} features, cipher {self.cipher.name}")

    # -- rounds ------------------------------------------------------------------------
    def _round(self, t: int) -> None:
        started = time.perf_counter()
        scheduled = np.asarray(self.participation.active(t, self.participation_rng), dtype=bool)
        self._check_absent()
        attempts = 0
        while True:
            active = scheduled.copy()
            active[list(self.absent)] = False
            self.config.algorithm.check_participation(active, t)
            attempts += 1
            # The server's state at the start of the round, its generator included:
            # an abandoned round is undone as if it never happened.
            saved = copy.deepcopy(self.server, memo={id(self.public): self.public,
                                                     id(self.cipher): self.cipher})
            self.server.attempt = attempts  # what the parties count (their guard's)
            try:
                record = self._attempt(t, active)
                break
            except PartyMissing as missing:
                self.server = saved
                for k in missing.parties:
                    self.absent[k] = {"since": t, "ping": None}
                self.log(f"round {t}: no reply to {missing.kind!r} from part"
                         f"{'ies' if len(missing.parties) > 1 else 'y'} "
                         f"{', '.join(map(str, sorted(missing.parties)))} within "
                         f"{self.config.reply_timeout:g} s; treated as absent, round restarted")
        newcomers = active & ~self.was_active
        self.was_active = active.copy()
        hy = self.public.hyfdca
        record.update({
            "iteration": t,
            "scheduled": np.flatnonzero(scheduled).tolist(),
            "active": np.flatnonzero(active).tolist(),
            "absent": np.flatnonzero(scheduled & ~active).tolist(),
            "attempts": attempts,
            "round_trips": hy.round_trips(refreshed=bool(newcomers.any() and t > 1),
                                          horizontal=self.public.horizontal,
                                          ahead=self.server.used_ahead)
            + float(getattr(self.server, "decisions", 0)),  # the certificate's judges
            "updated_samples": int(self.server.updated.size),
            "beta": float(self.server.beta) if hy.rule.tests_round else None,
            "sigma": float(self.server.sigma) if hy.rule.subproblem else None,
            "round_seconds": time.perf_counter() - started,
        })
        # The round start's objective, dual, gap and accuracy, from secure sums (cocoa rule;
        # empty where an absent holder makes them inexact).
        certificate = dict(getattr(self.server, "evaluation", {}) or {})
        if certificate and not get_loss(self.config.loss).classification:
            certificate.pop("accuracy")
        record["certificate"] = certificate or None
        self.results["rounds"].append(record)
        self.weights.append(self.server.w.copy())
        absent = f", absent {record['absent']}" if record["absent"] else ""
        self.log(f"round {t}: parties {record['active']}{absent}, "
                 f"{'accepted' if record['accepted'] else 'rejected'}, "
                 f"{record['round_seconds']:.1f} s")

    def _attempt(self, t: int, active: np.ndarray) -> dict:
        """One try at round ``t`` with the ``active`` parties (raises PartyMissing): the
        round script (:mod:`hyfl.algorithms.hyfdca_round`) over the transport."""
        from hyfl.runtime.protocol import Wire

        wire = Wire(int(self.cipher.ciphertext_bytes))
        tally = _Tally(self.transport)
        before = self.cipher.counts.snapshot()

        def exchange(step: Exchange) -> dict[int, dict]:
            phase = PHASES[step.phase]
            messages = {}
            for k, payload in step.messages.items():
                payload = dict(wire.down(k, step.phase, payload))
                if phase.delivers:
                    payload["deliveries"] = self.mail[k]
                messages[k] = (step.phase, payload)
            if phase.stands:
                replies = self._exchange_committed(messages, tally)
            else:
                replies = self._exchange(messages, tally)
            if phase.delivers:
                for k in replies:  # applied by the party (even if this round is abandoned)
                    self.mail[k] = {}
            return {k: wire.up(k, step.phase, reply) for k, reply in replies.items()}

        def post(step: Post) -> None:
            for k, payload in step.messages.items():
                payload = wire.down(k, step.phase, payload)
                self.mail[k][step.phase] = payload

        accepted, exchanges = play_round(one_round(self.server, active, self.was_active),
                                         exchange, post)
        tally.add_ops(_ops(self.cipher.counts - before))
        bytes_up, bytes_down = wire.bytes()
        return {"accepted": accepted, "exchanges": exchanges, **tally.record(),
                "bytes_up": bytes_up, "bytes_down": bytes_down,
                **{k: float(v) for k, v in wire.counts.items()}}

    def _exchange_committed(self, messages: dict[int, tuple[str, dict]],
                            tally: _Tally) -> dict[int, dict]:
        """An exchange after the round's commit: a party that does not answer is absent
        from the next round on, but the round stands (its stored parts stay older)."""
        replies, missing = self._send(messages)
        tally.count(messages, replies)
        self._count_deliveries(replies)
        for k in missing:
            self.absent[k] = {"since": len(self.results["rounds"]) + 1, "ping": None}
        return {k: tally.strip(replies[k]) for k in sorted(replies)}

    def _check_absent(self) -> None:
        """Ping absent parties in the background; those that answered take part again,
        also from a new node after their SuperNode restarted (:meth:`rediscover`)."""
        rediscover = getattr(self.transport, "rediscover", None)
        if rediscover is not None and self.absent:
            for k in rediscover(set(self.absent)):
                del self.absent[k]
                self.log(f"party {k} is back on a new node (its SuperNode restarted): it takes "
                         "part from now on")
        for k in sorted(self.absent):
            entry = self.absent[k]
            if entry["ping"] is not None:
                status = self.transport.poll(entry["ping"])
                if status == "replied":
                    del self.absent[k]
                    self.log(f"party {k} answers again: it takes part from now on")
                    continue
                if status == "pending":
                    continue
            entry["ping"] = self.transport.post(k, "ping", {})

    def _exchange(self, messages: dict[int, tuple[str, dict]], tally: _Tally) -> dict[int, dict]:
        if not messages:
            return {}
        replies, missing = self._send(messages)
        tally.count(messages, replies)
        self._count_deliveries(replies)
        if missing:
            raise PartyMissing(missing, next(iter(messages.values()))[0])
        return {k: tally.strip(replies[k]) for k in sorted(replies)}

    def _send(self, messages: dict[int, tuple[str, dict]]) -> tuple[dict[int, dict], set[int]]:
        """The transport's exchange, every reply checked (:meth:`_check_reply`)."""
        replies, missing = self.transport.exchange(messages, self.config.reply_timeout)
        for k, reply in replies.items():
            if k not in messages:
                raise fail(f"party {k}", "replied to a message it was not sent",
                           "Check the transport; every reply must answer one message.")
            self._check_reply(k, messages[k][0], reply)
        return replies, missing

    def _check_reply(self, k: int, kind: str, reply: Any) -> None:
        """A party's reply is untrusted input: its fields, types, chunk ids and shapes.

        Raises a HyflError naming the party, the message kind and the field
        rather than letting a malformed reply reach the server's arithmetic.
        """
        where = f"party {k}'s reply to {kind!r}"
        check_fields(reply, {**REPLY_FIELDS[kind], **_META_FIELDS}, where)
        public = getattr(self, "public", None)
        if public is None:  # hello: nothing to compare with yet
            return
        # The proposals travel in the round's compact layout, the row norms in their own.
        layouts = {"norms": TaggedLayout(public.norm_layout),
                   "proposals": self.server.proposal_layout}
        if public.hyfdca.rule.subproblem:  # the duals' states, a tag chunk each
            layouts["changes"] = TaggedLayout(public.layout, per_chunk=True)
            layouts["inner_products"] = self.server.ip_layout
        for name in ("norms", "inner_products", "steps", "changes", "proposals"):
            layout = layouts.get(name, public.layout)
            chunks = getattr(reply.get(name), "chunks", None)
            if chunks is not None and chunks.size and (chunks.max() >= layout.n_chunks
                                                       or np.unique(chunks).size < chunks.size):
                raise fail(where, f"field {name!r} names chunk ids outside 0..."
                           f"{layout.n_chunks - 1} or twice", "Run every party with the same "
                           "hyfl version; the reply may be garbled or forged.")
        shapes = {"primal_part": (self.server.client_features[k].size, public.n_outputs),
                  "step": (public.n_outputs,), "coherence": (public.n_outputs,),
                  "evaluation": (2 * public.n_outputs + 1,)}
        for name, expected in shapes.items():
            value = reply.get(name)
            if value is not None and value.shape != expected:
                raise fail(where, f"field {name!r} has shape {value.shape}, not {expected}",
                           "Run every party with the same hyfl version; the reply may be "
                           "garbled.")

    def _count_deliveries(self, replies: dict[int, dict]) -> None:
        """Decrypting the delivered row norms is set-up work (as in run_protocol)."""
        for reply in replies.values():
            for key, value in reply.get("delivery_ops", {}).items():
                self.setup_record[key] = self.setup_record.get(key, 0) + int(value)

    # -- finish ------------------------------------------------------------------------
    def _finish(self) -> None:
        present = [k for k in range(self.config.parties) if k not in self.absent]
        messages = {k: ("finish", {"deliveries": self.mail[k]}) for k in present}
        replies, missing = self._send(messages)
        self._count_deliveries(replies)
        for k in replies:
            self.mail[k] = {}
        self.results["final"] = {
            "absent": sorted(set(self.absent) | set(missing)),
            "finished": sorted(replies),
        }
        self.log(f"done: {len(self.results['rounds'])} rounds; parties finished: "
                 f"{sorted(replies)}; absent at the end: {self.results['final']['absent']}")

    # -- results -------------------------------------------------------------------------
    def _write(self, final: bool = False) -> None:
        if not self.config.out:
            return
        out = private_folder(self.config.out)  # a model of the parties' data: owner only
        if final and self.weights:
            with private_write(out / "weights.npz", "wb") as f:
                np.savez(f, w=np.stack(self.weights))
        elif len(self.weights) > 1:
            # The latest round's w alone (rewriting the whole history every round would
            # cost O(rounds^2 x features)), before deploy.json: whoever sees round t
            # there finds w of round t or later here (hyfl deploy local shows the
            # objective of each round as it ends).
            with private_write(out / LATEST_WEIGHTS, "wb") as f:
                np.savez(f, iteration=len(self.weights) - 1, w=self.weights[-1])
        _atomic_json(out / "deploy.json", self.results)


class _Tally:
    """Messages, measured payload bytes, parties' compute time and operations of one phase."""

    def __init__(self, transport):
        self.transport = transport
        self.sent0, self.received0 = transport.sent_bytes, transport.received_bytes
        self.messages = 0
        self.ops = {"encryptions": 0, "decryptions": 0, "additions": 0}
        self.setup_ops = {"encryptions": 0, "decryptions": 0, "additions": 0}
        self.party_seconds: dict[int, float] = {}
        self.timing: dict[str, list[float]] = {}

    def count(self, messages: dict, replies: dict) -> None:
        self.messages += len(messages)
        for k, reply in replies.items():
            self.add_ops(reply.get("ops", {}))
            self.party_seconds[k] = self.party_seconds.get(k, 0.0) + float(reply.get("seconds", 0))
            for key, value in reply.get("timing", {}).items():
                self.timing.setdefault(key, []).append(float(value))

    def strip(self, reply: dict) -> dict:
        """The protocol payload of a reply (metadata removed)."""
        return {key: value for key, value in reply.items() if key not in _META}

    def add_ops(self, ops: dict) -> None:
        for key in self.ops:
            self.ops[key] += int(ops.get(key, 0))

    def record(self) -> dict:
        return {
            "messages": self.messages,
            "payload_bytes_down": self.transport.sent_bytes - self.sent0,
            "payload_bytes_up": self.transport.received_bytes - self.received0,
            "party_seconds_max": max(self.party_seconds.values(), default=0.0),
            **{f"{key}_mean": float(np.mean(values)) for key, values in self.timing.items()},
            **self.ops,
        }


def _check_sizes(hellos: dict[int, dict]) -> None:
    """The parties' ids fit their sizes, and the sizes are no larger than the ids held.

    A size is allocated for (the server's arrays are ``n_samples`` long), so a
    forged ``n_samples`` of 10**12 must not get that far.
    """
    for axis, ids in (("n_samples", "samples"), ("n_features", "features")):
        held = sum(h[ids].size for h in hellos.values())
        for k, hello in sorted(hellos.items()):
            size, values = hello[axis], hello[ids]
            if not 1 <= size <= held or (values.size and (values.min() < 0
                                                          or values.max() >= size)):
                raise fail(f"party {k}'s hello", f"reports {axis} = {size} with {ids} ids "
                           f"outside 0...{size - 1} (or more {ids} than the parties hold, "
                           f"{held})", "Run every party with the same hyfl version and a "
                           "block of the same partition.")
    for k, hello in sorted(hellos.items()):
        if not 1 <= hello["n_outputs"] <= hello["n_samples"]:
            raise fail(f"party {k}'s hello", f"reports n_outputs = {hello['n_outputs']}",
                       "Run every party with the same hyfl version.")


def write_failure(out: str, err: BaseException) -> None:
    """Record a run that failed before it started (bad run config, missing key file)."""
    if isinstance(out, str) and out.strip():
        path = private_folder(out.strip())
        _atomic_json(path / "deploy.json", {"status": "failed", "error": clause(err),
                                            "engine": "flower", "rounds": []})


def _ops(counts) -> dict[str, int]:
    return {"encryptions": int(counts.encryptions), "decryptions": int(counts.decryptions),
            "additions": int(counts.additions)}


def _config_record(config: DeployConfig) -> dict:
    record = {}
    for name in config.__dataclass_fields__:
        value = getattr(config, name)
        record[name] = value.config() if name == "algorithm" else value
    return record


def _atomic_json(path: Path, value: Any) -> None:
    write_private_json(path, value, indent=1)


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")
