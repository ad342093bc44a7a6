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
from typing import Any

import numpy as np

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.algorithms.hyfdca_local import RunningAverage
from hyfl.algorithms.hyfdca_parties import build_parties
from hyfl.algorithms.hyfdca_round import Exchange, Post, answer, deliver, one_round, play_round
from hyfl.costs import COST_COLUMNS, FLOAT_BYTES, ID_BYTES, TIME_COMPONENTS, CostModel
from hyfl.errors import fail
from hyfl.partition import Partition, stack
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
        real cryptography time); ``config["setup"]`` has the set-up costs.
    """
    if not isinstance(hyfdca, HyFDCA):
        raise fail(
            "algorithm",
            f"{getattr(hyfdca, 'name', hyfdca)!r} has no encrypted protocol",
            "Real encryption applies to hyfdca only; run other algorithms with --cipher none",
        )
    budget = Budget(iterations, eval_every, stop_sim_time, stop_when)
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
    run = run_identity([secrets.token_bytes(16) for _ in range(blocks.n_clients)])
    server, clients = build_parties(hyfdca, problem, blocks, private, public_cipher, algorithm_rng,
                                    compact=compact, run=run)
    model = (cost_model or CostModel()).validated()
    wire = wire or Wire(int(cipher.ciphertext_bytes))
    wire.ciphertext_bytes = int(cipher.ciphertext_bytes)

    # Set-up: encrypted zeros and the full row norms (not part of any round).
    counters = (cipher.counts, public_cipher.counts)
    before = [c.snapshot() for c in counters]
    wire.reset()
    norms = server.setup([wire.up(c.k, "setup", c.setup_messages()) for c in clients])
    for client, vec in zip(clients, norms):
        client.learn_norms(wire.down(client.k, "norms", vec))
    setup_ops = _ops_since(counters, before)
    setup = {**setup_ops, "bytes_up": wire.bytes()[0], "bytes_down": wire.bytes()[1]}

    was_active = np.zeros(blocks.n_clients, dtype=bool)
    metrics: list[dict[str, float]] = []
    round_times: list[float] = []
    totals = dict.fromkeys((*COST_COLUMNS, *TIME_COMPONENTS, "he_seconds_measured"), 0.0)
    trips = 0.0
    last_stats: dict[str, float] = {}

    # The cocoa rule's second candidate model: the running average of the iterates.
    # The server averages w itself; the duals' average is kept by the monitor from
    # the clients' own records of what they reported (monitoring, not protocol).
    average_duals = (
        RunningAverage(np.zeros((problem.n_samples, server.w.shape[1])))
        if hyfdca.rule.subproblem and monitor_duals else None
    )
    chosen = {"weights": server.w, "duals": None}
    kept = {"best": None}  # see hyfl.runtime.simulation.keep_best

    def record(t: int) -> dict[str, float]:
        row = {"iteration": float(t)}
        # Monitoring only: a client decrypts the server's duals to report the gap.
        duals = _monitor_duals(server, cipher, problem) if monitor_duals else None
        candidates = [("last", server.w, duals)]
        cert = getattr(server, "cert", None)
        if cert is not None:  # every weight with the certified duals (as HyFDCA.models)
            if not cert.current and monitor_duals:
                duals = _monitor_duals(server, cipher, problem, cert.stored.alpha)
            candidates = [("last", server.w, duals)]
            if t > 0:
                candidates += [("average", server.average_w, duals),
                               ("certified", server.w if cert.current else cert.w, duals)]
        elif average_duals is not None and t > 0:
            candidates.append(("average", server.average_w, average_duals.value(duals)))
        index, _, w, alpha, primal, dual = best_certified(problem, hyfdca, t, candidates)
        if alpha is not None:  # the best weights and duals so far, as the stacked engine
            kept["best"] = keep_best(kept["best"], t, index, w, alpha, primal, dual)
            index, w, alpha, primal, dual = (kept["best"][k] for k in
                                             ("index", "w", "alpha", "primal", "dual"))
            row["model_round"] = float(kept["best"]["round"])
        chosen.update(weights=w, duals=alpha)
        row.update(evaluate(problem, w, alpha, optimum, validation, train_labels,
                            primal=primal, dual=dual))
        row["model"] = float(index)  # which candidate: 0 the last iterate, 1 the average
        row["round_trips"] = trips
        row["round_seconds"] = float(np.sum(round_times))
        row.update(totals)
        if t > 0:
            row.update(last_stats)
        metrics.append(row)
        if on_evaluate is not None:
            on_evaluate(row)
        return row

    counts_before = [c.snapshot() for c in counters]
    record(0)
    _restore(counters, counts_before)
    stopped_by, reason = "iterations", None
    label = f"{hyfdca.name} ({cipher.name})"
    with budget.progress_bar(progress, label) as advance:
        for t in range(1, budget.iterations + 1):
            active = np.asarray(participation.active(t, participation_rng), dtype=bool)
            hyfdca.check_participation(active, t)
            wire.reset()
            before = [c.snapshot() for c in counters]
            clock = _Clock(private, public_cipher)
            start = work_clock()
            accepted = _one_round(server, clients, active, was_active, wire, clock)
            round_times.append(work_clock() - start)
            if average_duals is not None:
                average_duals.advance(t)
                for k in np.flatnonzero(active):
                    average_duals.update(*clients[k].reported)
            newcomers = active & ~was_active
            was_active = active.copy()
            ops = _ops_since(counters, before)
            stats = _round_stats(hyfdca, server, active, newcomers, t, accepted)
            trips += stats["round_trips"]
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
                totals[key] += float(value)
            last_stats = {k: v for k, v in stats.items() if k != "round_trips"}
            last_stats.update({k: float(v) for k, v in wire.counts.items()})
            if on_round is not None:
                on_round(server, clients)
            crossed = budget.crossed(totals["sim_time"])
            row = None
            if budget.evaluates(t, crossed):
                counts_before = [c.snapshot() for c in counters]
                row = record(t)
                _restore(counters, counts_before)
                advance(t, row, totals["sim_time"])
            elif progress:
                advance(t, None, totals["sim_time"])
            stopped_by, reason = budget.stopped_by(t, crossed, row)
            if stopped_by is not None:
                break

    return RunResult(
        metrics=metrics,
        weights=np.array(chosen["weights"], copy=True),
        duals=None if chosen["duals"] is None else np.array(chosen["duals"], copy=True),
        round_times=np.array(round_times, dtype=float),
        config={
            "algorithm": hyfdca.config(),
            "engine": "protocol",
            "cipher": cipher.describe(),
            "seed": seed,
            **budget.end_record(len(round_times), stopped_by, reason),
            "resumed_from": [],
            "optimum_primal": optimum.primal if optimum else None,
            "costs": model.describe(),
            "setup": {k: float(v) for k, v in setup.items()},
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


def _one_round(server, clients, active, was_active, wire: Wire, clock: _Clock) -> bool:
    """One outer iteration: the round script (:mod:`hyfl.algorithms.hyfdca_round`) over
    direct calls, every message through ``wire``. Returns the verdict."""

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

    accepted, _ = play_round(one_round(server, active, was_active), exchange, post,
                             lambda fn, *args: clock.run("server", fn, *args))
    return accepted


def _round_stats(hyfdca: HyFDCA, server, active, newcomers, t, accepted) -> dict[str, float]:
    stats = {
        "round_trips": hyfdca.round_trips(
            refreshed=bool(newcomers.any() and t > 1), horizontal=server.public.horizontal
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


def _restore(counters, snapshots) -> None:
    """Undo the operations of monitoring (they are not part of the protocol)."""
    for counter, old in zip(counters, snapshots):
        counter.encryptions, counter.decryptions, counter.additions = (
            old.encryptions, old.decryptions, old.additions
        )


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
