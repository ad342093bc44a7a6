"""The message-level engine: HyFDCA's parties exchange real (encrypted) messages in-process.

:func:`run_protocol` drives :mod:`hyfl.algorithms.hyfdca_parties` round by
round through a :class:`Wire` that carries every message between the server
and the clients. The wire counts the bytes each way (float64 values, integer
ids, ciphertexts with their chunk ids; scalar ints and booleans are control
fields and not counted) and can record everything the server receives. The
cipher's own counters give the encryptions, decryptions and additions
actually performed, and each party is timed separately, so the simulated
time uses the slowest active client's measured compute (cryptography
excluded: it is charged by the cost model, and reported as measured too).

The same seed gives the same draws as the stacked engine
(:func:`hyfl.runtime.simulation.simulate`), so with the ``none`` cipher both
produce the same iterates up to rounding, and with a real cipher up to the
fixed-point precision.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.algorithms.hyfdca_local import RunningAverage
from hyfl.algorithms.hyfdca_parties import build_parties
from hyfl.algorithms.hyfdca_round import Exchange, Post, answer, deliver, one_round, play_round
from hyfl.costs import COST_COLUMNS, FLOAT_BYTES, ID_BYTES, TIME_COMPONENTS, CostModel
from hyfl.errors import fail
from hyfl.partition import Partition, stack
from hyfl.privacy.cipher_base import OpCounts
from hyfl.privacy.layout import EncryptedVector, decrypt_samples
from hyfl.privacy.tags import run_identity
from hyfl.problem import Optimum, Problem
from hyfl.runtime.budget import Budget, StopWhen
from hyfl.runtime.simulation import (
    METRIC_COLUMNS,
    RunResult,
    Validation,
    best_certified,
    evaluate,
    keep_best,
    random_streams,
)
from hyfl.work_clock import work_clock

__all__ = ["Wire", "run_protocol", "METRIC_COLUMNS"]


class Wire:
    """Carries messages and counts what crosses it.

    Parameters
    ----------
    ciphertext_bytes : int
        Wire size of one ciphertext.
    record : bool, default False
        Keep every message the server receives (``received``) and sends
        (``sent``) for inspection, e.g. by privacy tests.
    """

    def __init__(self, ciphertext_bytes: int, record: bool = False):
        self.ciphertext_bytes = ciphertext_bytes
        self.record = record
        self.received: list[tuple[int, str, Any]] = []
        self.sent: list[tuple[int, str, Any]] = []
        self.reset()

    def reset(self) -> None:
        self.counts = {"floats_up": 0, "floats_down": 0, "ids_up": 0, "ids_down": 0,
                       "ciphertexts_up": 0, "ciphertexts_down": 0}

    def up(self, client: int, kind: str, payload: Any) -> Any:
        """A message from ``client`` to the server."""
        self._count(payload, "up")
        if self.record:
            self.received.append((client, kind, payload))
        return payload

    def down(self, client: int, kind: str, payload: Any) -> Any:
        """A message from the server to ``client``."""
        self._count(payload, "down")
        if self.record:
            self.sent.append((client, kind, payload))
        return payload

    def bytes(self) -> tuple[float, float]:
        c = self.counts
        per_ct = self.ciphertext_bytes + ID_BYTES  # each ciphertext travels with its chunk id
        return (
            FLOAT_BYTES * c["floats_up"] + ID_BYTES * c["ids_up"] + per_ct * c["ciphertexts_up"],
            FLOAT_BYTES * c["floats_down"] + ID_BYTES * c["ids_down"]
            + per_ct * c["ciphertexts_down"],
        )

    def _count(self, payload: Any, direction: str) -> None:
        if payload is None or isinstance(payload, (bool, int, np.bool_, np.integer)):
            return  # control fields
        if isinstance(payload, EncryptedVector):
            self.counts[f"ciphertexts_{direction}"] += len(payload)
        elif isinstance(payload, dict):
            for value in payload.values():
                self._count(value, direction)
        elif isinstance(payload, (list, tuple)):
            for value in payload:
                self._count(value, direction)
        elif isinstance(payload, (float, np.floating)):
            self.counts[f"floats_{direction}"] += 1
        elif isinstance(payload, np.ndarray):
            if payload.dtype == bool:
                return  # flags
            kind = "ids" if np.issubdtype(payload.dtype, np.integer) else "floats"
            self.counts[f"{kind}_{direction}"] += int(payload.size)
        else:
            raise TypeError(f"cannot send {type(payload).__name__} over the wire")


class _Timed:
    """A cipher proxy that adds the seconds spent in cryptography to ``seconds``."""

    def __init__(self, cipher):
        self._cipher, self.seconds = cipher, 0.0

    def __getattr__(self, name):
        return getattr(self._cipher, name)

    def _timed(self, name, *args):
        tic = time.perf_counter()
        try:
            return getattr(self._cipher, name)(*args)
        finally:
            self.seconds += time.perf_counter() - tic

    def encrypt(self, chunks):
        return self._timed("encrypt", chunks)

    def decrypt(self, ciphertexts):
        return self._timed("decrypt", ciphertexts)

    def add(self, a, b):
        return self._timed("add", a, b)


def run_protocol(
    hyfdca: HyFDCA,
    problem: Problem,
    partition: Partition,
    participation,
    iterations: int,
    cipher,
    *,
    seed: int = 0,
    eval_every: int = 1,
    optimum: Optimum | None = None,
    validation: Validation | None = None,
    train_labels: np.ndarray | None = None,
    cost_model: CostModel | None = None,
    wire: Wire | None = None,
    progress: bool = False,
    on_evaluate: Callable[[dict[str, float]], None] | None = None,
    on_round: Callable[[Any, list], None] | None = None,
    monitor_duals: bool = True,
    stop_sim_time: float | None = None,
    stop_when: StopWhen | None = None,
    compact: bool = True,
) -> RunResult:
    """Run HyFDCA with separate parties and real messages (see the module docstring).

    Parameters
    ----------
    hyfdca : HyFDCA
    problem, partition, participation, iterations, seed, eval_every, optimum,
    validation, train_labels, progress, on_evaluate
        As in :func:`hyfl.runtime.simulation.simulate`.
    cipher : hyfl.privacy.ciphers.Cipher
        The clients' cipher (with the private key); the server gets
        ``cipher.public()``.
    cost_model : CostModel, optional
        Latency and per-operation HE costs for ``sim_time``; its
        ``ciphertext_bytes`` is taken from the cipher.
    wire : Wire, optional
        Pass one with ``record=True`` to inspect the messages.
    on_round : callable, optional
        Called as ``on_round(server, clients)`` after every round (tests use it
        to inspect what each party holds).
    monitor_duals : bool, default True
        Decrypt the server's duals at each evaluation (with a client's key,
        outside the protocol and its counts) to report the dual objective and
        the gap. Costs one decryption per ciphertext of the duals; turn off
        for large problems (dual and gap are then NaN).
    stop_sim_time : float, optional
        Simulated-time budget, as in :func:`~hyfl.runtime.simulation.simulate`:
        stop after the round in which the cumulative ``sim_time`` reaches it,
        at most ``iterations`` rounds; ``config["stopped_by"]`` says which.
        (This engine has no checkpoints: an interrupted encrypted run starts
        over.)
    stop_when : callable, optional
        As in :func:`~hyfl.runtime.simulation.simulate`: ``stop_when(row)`` after
        each evaluation of a round; a string ends the run there
        (``config["stopped_by"] == "stop_when"``, the string ``config["stop_reason"]``).
    compact : bool, default True
        Send the values summed within a round in the round's compact layout
        (:meth:`hyfl.privacy.layout.SlotLayout.compact`). ``False`` keeps the
        fixed layout for every message, the protocol before compact layouts:
        for measuring against only, since the stacked engine's accounting
        counts the compact protocol.

    Returns
    -------
    RunResult
        Metrics as from the stacked engine plus ``he_seconds_measured`` (the
        real cryptography time) and, of the last round, ``exchanges`` (the
        sequential exchanges it took, :func:`~hyfl.algorithms.hyfdca_round.play_round`)
        and the wire's counts; ``config["setup"]`` has the set-up costs.
    """
    _check_algorithm(hyfdca)
    budget = Budget(iterations, eval_every, stop_sim_time, stop_when)
    run, participation_rng = _set_up(hyfdca, problem, partition, cipher, seed, cost_model,
                                     wire, compact, monitor_duals)
    run.budget = budget
    run.watch = _Watch(optimum, validation, train_labels, on_evaluate, on_round)
    run.evaluate(0)
    stopped_by, reason = _loop(run, participation, participation_rng, progress)
    return _result(run, seed, optimum, stopped_by, reason)


@dataclass
class _Watch:
    """What a protocol run is watched with: the evaluation's references and the callbacks
    (see :func:`run_protocol`)."""

    optimum: Optimum | None
    validation: Validation | None
    train_labels: np.ndarray | None
    on_evaluate: Callable[[dict[str, float]], None] | None
    on_round: Callable[[Any, list], None] | None


@dataclass
class _Run:
    """One protocol run: its parties, ciphers and wire, and what the rounds add up to
    (the steps of :func:`run_protocol` share it)."""

    hyfdca: HyFDCA
    problem: Problem
    cipher: Any  # the clients' (the monitor decrypts with it)
    private: _Timed
    public_cipher: _Timed
    server: Any
    clients: list
    wire: Wire
    model: CostModel
    monitor_duals: bool
    setup: dict[str, float]
    budget: Budget | None = None
    watch: _Watch | None = None
    metrics: list[dict[str, float]] = field(default_factory=list)
    round_times: list[float] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        (*COST_COLUMNS, *TIME_COMPONENTS, "he_seconds_measured"), 0.0))
    trips: float = 0.0
    last_stats: dict[str, float] = field(default_factory=dict)
    # The cocoa rule's second candidate model: the running average of the iterates.
    # The server averages w itself; the duals' average is kept by the monitor from
    # the clients' own records of what they reported (monitoring, not protocol).
    average_duals: RunningAverage | None = None
    chosen: dict = field(default_factory=dict)  # the weights and duals the result reports
    best: dict | None = None  # see hyfl.runtime.simulation.keep_best

    @property
    def counters(self) -> tuple[OpCounts, OpCounts]:
        """The clients' and the server's operation counts."""
        return self.cipher.counts, self.public_cipher.counts

    def evaluate(self, t: int) -> dict[str, float]:
        """The evaluation record of round ``t`` (:func:`_record`); its monitoring is no
        part of the protocol, so its operations are not counted."""
        snapshots = [counter.snapshot() for counter in self.counters]
        row = _record(self, t)
        for counter, snapshot in zip(self.counters, snapshots):
            counter.restore(snapshot)
        return row


def _check_algorithm(hyfdca) -> None:
    """Only HyFDCA has an encrypted protocol."""
    if not isinstance(hyfdca, HyFDCA):
        raise fail(
            "algorithm",
            f"{getattr(hyfdca, 'name', hyfdca)!r} has no encrypted protocol",
            "Real encryption applies to hyfdca only; run other algorithms with --cipher none",
        )


def _set_up(hyfdca: HyFDCA, problem: Problem, partition: Partition, cipher, seed: int,
            cost_model: CostModel | None, wire: Wire | None, compact: bool,
            monitor_duals: bool) -> tuple[_Run, np.random.Generator]:
    """Check the run, build the parties and run the set-up (encrypted zeros and the full
    row norms, not part of any round). Returns the run and the participation stream."""
    if hyfdca.sip_scope == "paper":
        raise fail(
            "sip_scope",
            "'paper' is the paper's cost-accounting convention for simulations, not a protocol",
            "Use sip_scope='all' (or 'drawn' with full participation) with a real cipher, or "
            "cipher none to reproduce the paper's counts.",
        )
    blocks = stack(partition, problem.X)
    participation_rng, algorithm_rng = random_streams(seed)
    private = _Timed(cipher)
    public_cipher = _Timed(cipher.public())
    # The run's identity, as a deployment's parties compute it from the fresh nonces of
    # their set-up announcements: it keys the tags (hyfl.privacy.tags). The nonces are
    # fresh, not from the seed: two runs of one seed are two runs. They are no part of
    # the rounds' messages (a deployment sends them with hello), so no cost counts them.
    identity = run_identity([secrets.token_bytes(16) for _ in range(blocks.n_clients)])
    server, clients = build_parties(hyfdca, problem, blocks, private, public_cipher, algorithm_rng,
                                    compact=compact, run=identity)
    model = (cost_model or CostModel()).validated()
    wire = wire or Wire(int(cipher.ciphertext_bytes))
    wire.ciphertext_bytes = int(cipher.ciphertext_bytes)

    counters = (cipher.counts, public_cipher.counts)
    before = [c.snapshot() for c in counters]
    wire.reset()
    norms = server.setup([wire.up(c.k, "setup", c.setup_messages()) for c in clients])
    for client, vec in zip(clients, norms):
        client.learn_norms(wire.down(client.k, "norms", vec))
    setup = {**_ops_since(counters, before), "bytes_up": wire.bytes()[0],
             "bytes_down": wire.bytes()[1]}
    run = _Run(hyfdca, problem, cipher, private, public_cipher, server, clients, wire, model,
               monitor_duals, {k: float(v) for k, v in setup.items()})
    if hyfdca.rule.subproblem and monitor_duals:
        run.average_duals = RunningAverage(np.zeros((problem.n_samples, server.w.shape[1])))
    run.chosen = {"weights": server.w, "duals": None}
    return run, participation_rng


def _record(run: _Run, t: int) -> dict[str, float]:
    """Evaluate round ``t``'s candidate models (the last iterate, the average, the
    certified pair) as the stacked engine does, and append the metrics row."""
    problem, server, cipher, watch = run.problem, run.server, run.cipher, run.watch
    row = {"iteration": float(t)}
    # Monitoring only: a client decrypts the server's duals to report the gap.
    duals = _monitor_duals(server, cipher, problem) if run.monitor_duals else None
    candidates = [("last", server.w, duals)]
    cert = getattr(server, "cert", None)
    if cert is not None:  # every weight with the certified duals (as HyFDCA.models)
        if not cert.current and run.monitor_duals:
            duals = _monitor_duals(server, cipher, problem, cert.stored.alpha)
        candidates = [("last", server.w, duals)]
        if t > 0:
            candidates += [("average", server.average_w, duals),
                           ("certified", server.w if cert.current else cert.w, duals)]
    elif run.average_duals is not None and t > 0:
        candidates.append(("average", server.average_w, run.average_duals.value(duals)))
    index, _, w, alpha, primal, dual = best_certified(problem, run.hyfdca, t, candidates)
    if alpha is not None:  # the best weights and duals so far, as the stacked engine
        run.best = keep_best(run.best, t, index, w, alpha, primal, dual)
        index, w, alpha, primal, dual = (run.best[k] for k in
                                         ("index", "w", "alpha", "primal", "dual"))
        row["model_round"] = float(run.best["round"])
    run.chosen.update(weights=w, duals=alpha)
    row.update(evaluate(problem, w, alpha, watch.optimum, watch.validation, watch.train_labels,
                        primal=primal, dual=dual))
    row["model"] = float(index)  # which candidate: 0 the last iterate, 1 the average
    row["round_trips"] = run.trips
    row["round_seconds"] = float(np.sum(run.round_times))
    row.update(run.totals)
    if t > 0:
        row.update(run.last_stats)
    run.metrics.append(row)
    if watch.on_evaluate is not None:
        watch.on_evaluate(row)
    return row


def _loop(run: _Run, participation, participation_rng, progress: bool
          ) -> tuple[str, str | None]:
    """The rounds, until the budget says stop; returns ``(stopped_by, reason)``."""
    budget, hyfdca = run.budget, run.hyfdca
    was_active = np.zeros(len(run.clients), dtype=bool)
    stopped_by, reason = "iterations", None
    label = f"{hyfdca.name} ({run.cipher.name})"
    with budget.progress_bar(progress, label) as advance:
        for t in range(1, budget.iterations + 1):
            active = np.asarray(participation.active(t, participation_rng), dtype=bool)
            hyfdca.check_participation(active, t)
            _meter_round(run, t, active, was_active)
            was_active = active.copy()
            if run.watch.on_round is not None:
                run.watch.on_round(run.server, run.clients)
            crossed = budget.crossed(run.totals["sim_time"])
            row = None
            if budget.evaluates(t, crossed):
                row = run.evaluate(t)
                advance(t, row, run.totals["sim_time"])
            elif progress:
                advance(t, None, run.totals["sim_time"])
            stopped_by, reason = budget.stopped_by(t, crossed, row)
            if stopped_by is not None:
                break
    return stopped_by, reason


def _meter_round(run: _Run, t: int, active: np.ndarray, was_active: np.ndarray) -> None:
    """Play round ``t`` and add what it cost to the run's totals; its statistics (with
    the exchanges it took and the wire's counts) become ``run.last_stats``."""
    wire, model, server = run.wire, run.model, run.server
    wire.reset()
    before = [c.snapshot() for c in run.counters]
    clock = _Clock(run.private, run.public_cipher)
    start = work_clock()
    accepted, exchanges = _one_round(server, run.clients, active, was_active, wire, clock)
    run.round_times.append(work_clock() - start)
    if run.average_duals is not None:
        run.average_duals.advance(t)
        for k in np.flatnonzero(active):
            run.average_duals.update(*run.clients[k].reported)
    newcomers = active & ~was_active
    ops = _ops_since(run.counters, before)
    stats = _round_stats(run.hyfdca, server, active, newcomers, t, accepted)
    stats["exchanges"] = float(exchanges)
    run.trips += stats["round_trips"]
    bytes_up, bytes_down = wire.bytes()
    latency = stats["round_trips"] * model.latency
    he = model.he
    encryption = (ops["encryptions"] * he.encrypt + ops["decryptions"] * he.decrypt
                  + ops["additions"] * he.add)
    client_time = max(clock.client.values(), default=0.0)
    parts = {
        "bytes_up": bytes_up, "bytes_down": bytes_down, **ops,
        "time_client": client_time, "time_server": clock.server,
        "time_latency": latency, "time_encryption": encryption,
        "sim_time": client_time + clock.server + latency + encryption,
        "he_seconds_measured": clock.crypto,
    }
    for key, value in parts.items():
        run.totals[key] += float(value)
    run.last_stats = {k: v for k, v in stats.items() if k != "round_trips"}
    run.last_stats.update({k: float(v) for k, v in wire.counts.items()})


def _result(run: _Run, seed: int, optimum: Optimum | None, stopped_by: str,
            reason: str | None) -> RunResult:
    """The run's result: its metrics, the chosen weights and duals, and its record."""
    chosen = run.chosen
    return RunResult(
        metrics=run.metrics,
        weights=np.array(chosen["weights"], copy=True),
        duals=None if chosen["duals"] is None else np.array(chosen["duals"], copy=True),
        round_times=np.array(run.round_times, dtype=float),
        config={
            "algorithm": run.hyfdca.config(),
            "engine": "protocol",
            "cipher": run.cipher.describe(),
            "seed": seed,
            **run.budget.end_record(len(run.round_times), stopped_by, reason),
            "resumed_from": [],
            "optimum_primal": optimum.primal if optimum else None,
            "costs": run.model.describe(),
            "setup": run.setup,
        },
    )


class _Clock:
    """Per-party compute time of one round, cryptography excluded."""

    def __init__(self, private: _Timed, public: _Timed):
        self.private, self.public = private, public
        self.client: dict[int, float] = {}
        self.server = 0.0
        self.crypto = 0.0

    def run(self, who, fn, *args):
        cipher = self.public if who == "server" else self.private
        crypto_before = cipher.seconds
        tic = work_clock()
        out = fn(*args)
        elapsed = work_clock() - tic
        crypto = cipher.seconds - crypto_before
        self.crypto += crypto
        if who == "server":
            self.server += elapsed - crypto
        else:
            self.client[who] = self.client.get(who, 0.0) + elapsed - crypto
        return out


def _one_round(server, clients, active, was_active, wire: Wire, clock: _Clock
               ) -> tuple[bool, int]:
    """One outer iteration: the round script (:mod:`hyfl.algorithms.hyfdca_round`) over
    direct calls, every message through ``wire``. Returns the verdict and the number of
    exchanges the round took."""

    def exchange(step: Exchange) -> dict[int, dict]:
        replies = {}
        for k, payload in step.messages.items():
            message = wire.down(k, step.phase, payload)
            reply = clock.run(k, answer, clients[k], step.phase, message)
            replies[k] = wire.up(k, step.phase, reply)
        return replies

    def post(step: Post) -> None:
        for k, payload in step.messages.items():
            clock.run(k, deliver, clients[k], step.phase, wire.down(k, step.phase, payload))

    return play_round(one_round(server, active, was_active), exchange, post,
                      lambda fn, *args: clock.run("server", fn, *args))


def _round_stats(hyfdca: HyFDCA, server, active, newcomers, t, accepted) -> dict[str, float]:
    stats = {
        "round_trips": hyfdca.round_trips(
            refreshed=bool(newcomers.any() and t > 1), horizontal=server.public.horizontal,
            ahead=server.used_ahead,
        ) + float(getattr(server, "decisions", 0)),
        "active_clients": float(np.count_nonzero(active)),
        "updated_samples": float(server.updated.size),
        "accepted": float(accepted),
    }
    if hyfdca.rule.tests_round:
        stats["beta"] = server.beta
    if hyfdca.rule.subproblem:
        stats["sigma"] = server.sigma
        # The round start's certificate from the parties' secure sums (NaN where inexact).
        certificate = getattr(server, "evaluation", {}) or {}
        for key in ("primal", "gap", "accuracy"):
            stats[f"certified_{key}"] = float(certificate.get(key, np.nan))
    return stats


def _ops_since(counters, before) -> dict[str, int]:
    out = {"encryptions": 0, "decryptions": 0, "additions": 0}
    for counter, old in zip(counters, before):
        diff = counter - old
        out["encryptions"] += diff.encryptions
        out["decryptions"] += diff.decryptions
        out["additions"] += diff.additions
    return out


def _monitor_duals(server, cipher, problem: Problem, ciphertexts=None) -> np.ndarray:
    """Decrypt the server's duals (or the ``ciphertexts`` given) with a client's key
    (monitoring, not protocol)."""
    layout = server.public.layout
    every = np.arange(problem.n_samples)
    ciphertexts = server.stored.alpha if ciphertexts is None else ciphertexts
    duals = decrypt_samples(cipher, layout, EncryptedVector(np.arange(layout.n_chunks),
                                                           ciphertexts), every)
    # Fixed-point sums of dual changes can leave the dual domain by a rounding unit;
    # the clients project what they decrypt, and so does the monitor.
    lo, hi = problem.loss.dual_bounds(problem.Y, problem.W)
    return np.clip(duals, lo, hi)
