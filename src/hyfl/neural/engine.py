"""The loop that runs a neural federated algorithm (the neural twin of ``simulate``).

It does what :func:`hyfl.runtime.simulation.simulate` does for the linear
algorithms, with the same random streams (one for participation, one for the
algorithm, both from the seed, so algorithms compared under one seed see the
same participating clients), the same participation schedules, progress bar
and :class:`~hyfl.runtime.simulation.RunResult`: draw the active clients,
call ``round``, time it, evaluate every ``eval_every`` rounds (timed apart).

Metrics (cumulative where they are costs): :data:`NEURAL_COLUMNS`, then the
algorithm's own round figures. The simulated time of a round is compute plus
``latency`` per round trip; nothing is encrypted, so there is no encryption
time. Compute is the slowest client's measured seconds plus the server's when
the algorithm reports them (``client_seconds_max`` and ``server_seconds``:
HyFEM, whose clients would train side by side), else the round's measured
seconds (FedBCD, whose parties share one compiled round here: an upper bound
of parties that run side by side).
"""

from __future__ import annotations

import time

import numpy as np

from hyfl.errors import fail
from hyfl.neural.base import EVAL_COLUMNS
from hyfl.runtime.budget import Budget, StopWhen
from hyfl.runtime.simulation import RunResult, random_streams

NEURAL_COLUMNS = (
    "iteration",
    *EVAL_COLUMNS,
    "round_trips",
    "round_seconds",
    "bytes_up",
    "bytes_down",
    "sim_time",
    "time_client",
    "time_server",
    "time_latency",
    "active_clients",
)
CUMULATIVE = ("round_trips", "round_seconds", "bytes_up", "bytes_down", "sim_time",
              "time_client", "time_server", "time_latency")


def run(
    algorithm,
    data,
    participation,
    iterations: int,
    *,
    seed: int = 0,
    eval_every: int = 1,
    latency: float = 0.0,
    progress: bool = False,
    stop_when: StopWhen | None = None,
) -> RunResult:
    """Run ``iterations`` outer iterations of a neural ``algorithm`` on ``data``.

    Parameters
    ----------
    algorithm : hyfl.neural.base.NeuralAlgorithm
    data : hyfl.neural.views.ViewData
    participation : schedule
        ``active(t, rng) -> bool mask`` over the clients, see :mod:`hyfl.partition`.
    iterations : int
    seed : int, default 0
    eval_every : int, default 1
        Evaluate every this many rounds (and after the last one).
    latency : float, default 0
        Seconds charged per round trip in ``sim_time``.
    progress : bool, default False
    stop_when : callable, optional
        As in :func:`~hyfl.runtime.simulation.simulate`: ``stop_when(row)`` after
        each evaluation of a round; a string ends the run there
        (``config["stopped_by"] == "stop_when"``, the string ``config["stop_reason"]``).

    Returns
    -------
    RunResult
        ``metrics`` rows with :data:`NEURAL_COLUMNS`; ``weights`` holds the
        exported parameters (a dict of arrays) and ``duals`` None;
        ``config["participation"]`` the active mask of every round (rounds x clients).
    """
    budget = Budget(iterations, eval_every, stop_when=stop_when)
    participation_rng, algorithm_rng = random_streams(seed)
    state = algorithm.setup(data, int(algorithm_rng.integers(2**31 - 1)))
    totals = dict.fromkeys(CUMULATIVE, 0.0)
    metrics: list[dict[str, float]] = []
    round_times: list[float] = []
    trace: list[np.ndarray] = []

    def record(t: int, stats: dict) -> dict:
        row = {"iteration": float(t), **algorithm.evaluate(state, data), **totals, **stats}
        if not np.isfinite(row.get("loss", np.nan)):
            raise fail(
                f"{algorithm.name} at round {t}",
                f"has a non-finite training loss ({row.get('loss')})",
                "Lower the learning rate (--param learning_rate=...).",
            )
        metrics.append(row)
        return row

    record(0, {"active_clients": 0.0})
    stopped_by, reason = "iterations", None
    with budget.progress_bar(progress, algorithm.name) as advance:
        advance(0, None)
        for t in range(1, budget.iterations + 1):
            active = np.asarray(participation.active(t, participation_rng), dtype=bool)
            if active.shape != (data.n_clients,):
                raise fail(
                    "participation", f"gave a mask of shape {active.shape} at round {t}",
                    f"Give one flag per client ({data.n_clients}).",
                )
            trace.append(active.copy())
            start = time.perf_counter()
            state = algorithm.round(state, active, algorithm_rng)
            seconds = time.perf_counter() - start
            stats = algorithm.round_stats(state)
            round_times.append(seconds)
            trips = float(stats.get("round_trips", 0.0))
            if "client_seconds_max" in stats and "server_seconds" in stats:
                client, server = stats["client_seconds_max"], stats["server_seconds"]
            else:
                client, server = seconds, 0.0
            for key, value in (
                ("round_trips", trips), ("round_seconds", seconds),
                ("bytes_up", stats.get("bytes_up", 0.0)),
                ("bytes_down", stats.get("bytes_down", 0.0)),
                ("time_client", client), ("time_server", server),
                ("time_latency", latency * trips),
                ("sim_time", client + server + latency * trips),
            ):
                totals[key] += float(value)
            row = None
            if budget.evaluates(t, crossed=False):
                extra = {k: v for k, v in stats.items() if k not in CUMULATIVE}
                row = record(t, extra)
                advance(t, {"status": _status(row)})
            else:
                advance(t, None)
            stopped_by, reason = budget.stopped_by(t, False, row)
            if stopped_by is not None:
                break
    return RunResult(
        metrics=metrics,
        weights=algorithm.export(state),
        duals=None,
        round_times=np.array(round_times),
        config={
            "algorithm": algorithm.config(),
            "seed": seed,
            **budget.end_record(len(round_times), stopped_by, reason),
            "resumed_from": [],
            "optimum_primal": None,
            "engine": "neural",
            "cipher": {"name": "none"},
            "costs": {"latency": latency, "he_costs": {"source": "none (nothing encrypted)"}},
            "participation": np.array(trace, dtype=np.int8).tolist(),
            "metric_columns": list(NEURAL_COLUMNS),
        },
    )


def _status(row: dict) -> str:
    """The progress bar's words for a metrics row."""
    if np.isfinite(row.get("val_accuracy", np.nan)):
        return f"val. acc. {row['val_accuracy']:.4f}"
    return f"loss {row['loss']:.4g}"
