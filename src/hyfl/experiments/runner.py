"""Turn a run description into a finished run with its files.

:class:`RunSpec` is the full configuration of one run (what ``hyfl run``'s
flags describe); :func:`execute` resolves data, problem, centralized optimum,
partition, participation, algorithm, cipher and cost model, runs the job and
writes ``metrics.csv``, ``run.json`` and ``loss.png`` into the output folder.

Which engine runs a job: HyFDCA with a real cipher (``paillier``, ``packed``)
runs as separate parties exchanging encrypted messages
(:func:`~hyfl.runtime.protocol.run_protocol`); everything else (cipher
``none``, and every other algorithm, which does no homomorphic encryption) runs
in the fast stacked engine (:func:`~hyfl.runtime.simulation.simulate`), which
counts the ciphertexts the cipher would produce. Both charge the same
:class:`~hyfl.costs.CostModel` (latency per round trip, seconds per HE
operation) in ``sim_time``.
"""

from __future__ import annotations

import json
import platform
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hyfl._io import check_results_folder, dumps_json, read_parquet, write_text
from hyfl.algorithms import algorithm_names, make_algorithm
from hyfl.costs import (
    COST_COLUMNS,
    TIME_COMPONENTS,
    he_label,
    save_calibration,
)
from hyfl.data import lambda_for
from hyfl.errors import PartyFileWarning, check_choice, check_int, fail
from hyfl.experiments.outputs import (
    AUC_TARGETS,
    cost_title,
    environment,
    json_default,
    plain_label,
    run_title,
    timestamp,
    write_comparison,
    write_experiment_summary,
    write_outputs,
)
from hyfl.experiments.spec import (
    RunOutcome,
    RunSpec,
    Setup,
    add_intercept,
    load_split,
    sample_weights,
    scale_features,
)
from hyfl.experiments.stall import stall_message, stalled_steps
from hyfl.participation import parse_participation
from hyfl.partition import parse_partition, stack
from hyfl.privacy.ciphers import CIPHERS, calibrate, check_keybits, make_cipher
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.checkpoint import Checkpointing
from hyfl.runtime.protocol import run_protocol
from hyfl.runtime.simulation import (
    RunResult,
    Validation,
    evaluate,
    first_round_at_least,
    first_round_below,
    settled_round_below,
    simulate,
)
from hyfl.runtime.trivial import TrivialResult, advice, judge_trivial, majority_rate


def prepare(spec: RunSpec) -> Setup:
    """Load data and build problem, optimum, partition, participation, cipher and cost model."""
    spec.validated()
    train, val, partition = load_split(spec)
    if spec.intercept is not None:
        train, val, partition = add_intercept(train, val, partition, spec.intercept)
    lam = spec.lam if spec.lam is not None else lambda_for(spec.data, train.X.shape[0])
    problem = make_problem(train, spec.loss, lam,
                           sample_weight=sample_weights(train, spec.class_weight))
    if partition is None:
        partition = parse_partition(
            spec.partition_spec(), problem.X, seed=spec.seed, meta=train.meta, labels=train.y
        )
    scale = None
    if spec.standardize:  # before the optimum: the problem is the scaled one
        problem, val, scale = scale_features(problem, val, partition, spec)
    optimum = solve_centralized(problem)
    participation = parse_participation(spec.participation_spec(), partition.n_clients)
    validation = Validation(val.X, val.y) if val is not None else None
    cipher = make_cipher(spec.cipher, key_bits=spec.key_bits)
    cost_model = spec.cost_model(cipher)
    return Setup(train, problem, optimum, partition, participation, validation, cipher, cost_model,
                 scale)


def check_applicable(setup: Setup, algorithms: list) -> None:
    """Raise, before anything runs, if one of ``algorithms`` cannot run on ``setup``.

    Uses each algorithm's optional ``check_applicable(problem, blocks)`` hook
    (:class:`hyfl.algorithms.base.Algorithm`), so that a comparison whose
    third algorithm needs another partition fails at once instead of after
    the first two have run.
    """
    checks = [a.check_applicable for a in algorithms if hasattr(a, "check_applicable")]
    if checks:
        blocks = stack(setup.partition, setup.problem.X)
        for check in checks:
            check(setup.problem, blocks)


def run_prepared(
    setup: Setup,
    spec: RunSpec,
    name: str,
    hyper: dict[str, Any],
    progress: bool = False,
    *,
    checkpointing: Checkpointing | None = None,
    label: str | None = None,
) -> RunOutcome:
    """Run algorithm ``name`` on a prepared set-up and summarize it.

    The budget is the spec's (``iterations``, or ``sim_time`` capped by
    ``iterations``). ``checkpointing`` is :func:`~hyfl.runtime.simulation.simulate`'s;
    the encrypted protocol engine has no checkpoints, so resuming from an
    existing checkpoint file is an error there. ``label`` names the run
    in the summary (default ``name``).
    """
    started = time.time()
    algorithm = make_algorithm(name, hyper)
    problem, validation = setup.problem, setup.validation
    cipher = setup.cipher if setup.cipher is not None else make_cipher("none")
    common = dict(
        seed=spec.seed,
        eval_every=spec.eval_every,
        optimum=setup.optimum,
        validation=validation,
        train_labels=setup.train.y,
        cost_model=setup.cost_model,
        progress=progress,
    )
    args = (algorithm, problem, setup.partition, setup.participation, spec.iterations)
    run_spec = RunSpec(**{**asdict(spec), "algorithm": name, "hyper": hyper})
    if spec.uses_protocol(algorithm):
        if checkpointing is not None and checkpointing.resume and checkpointing.path.exists():
            raise fail(
                f"checkpoint {checkpointing.path}",
                f"cannot be resumed: {name} with cipher {spec.cipher} runs on the encrypted "
                "protocol engine, which has no checkpoints",
                "Delete the run's folder to run it again from the start, or use cipher none.",
            )
        result = run_protocol(*args, cipher, stop_sim_time=spec.sim_time, **common)
    else:
        result = simulate(
            *args,
            cipher=cipher,
            stop_sim_time=spec.sim_time,
            checkpointing=checkpointing,
            run_key=run_spec.run_key(),
            **common,
        )
    # The central model's figures: what the run's own compare with (NaN without validation).
    central = evaluate(problem, setup.optimum.w, None, setup.optimum, validation, setup.train.y)
    opt_val_acc = central["val_accuracy"]
    majority = majority_rate_of(problem, setup.train.y)
    val_majority = majority_rate_of(problem, validation.y) if validation else None
    # Plots of a fresh compare read it from the result; run.json keeps it in the summary.
    result.config["majority_rate"] = majority
    # Weighted classes trade accuracy for the minority's recall: a weighted model may well
    # score below the majority class, so it is judged by its objective only.
    weighted = problem.W is not None
    trivial = judge_trivial(result.metrics, majority_rate=None if weighted else majority,
                            val_majority_rate=None if weighted else val_majority)
    rel = result.column("relative_loss")
    summary = {
        "algorithm": label or name,
        "final": result.final,
        "best_val_accuracy": float(np.nanmax(result.column("val_accuracy")))
        if validation
        else None,
        "best_val_auc": _nanmax_or_none(result.column("val_auc")) if validation else None,
        "rounds_to_relative_loss": {
            f"{tol:g}": first_round_below(result.column("iteration"), rel, tol)
            for tol in (1e-1, 1e-2, 1e-3)
        },
        "settled_at_relative_loss": {
            f"{tol:g}": settled_round_below(result.column("iteration"), rel, tol)
            for tol in (1e-1, 1e-2, 1e-3)
        },
        "rounds_to_val_auc": {
            f"{level:g}": first_round_at_least(result.column("iteration"),
                                               result.column("val_auc"), level)
            for level in AUC_TARGETS
        } if validation else {},
        "median_round_seconds": float(np.median(result.round_times))
        if len(result.round_times)
        else np.nan,
        "budget": result.config.get("budget", spec.budget()),
        "stopped_by": result.config.get("stopped_by", "iterations"),
        "rounds": int(result.config.get("rounds", len(result.round_times))),
        "resumed_from": list(result.config.get("resumed_from", [])),
        "engine": result.config.get("engine", "simulation"),
        "cipher": cipher.name,
        "costs": cost_summary(result),
        "optimum": {
            "primal": setup.optimum.primal,
            "method": setup.optimum.method,
            **{key: central[key] for key in ("val_accuracy", "val_auc", "train_accuracy",
                                             "train_auc")},
        },
        "majority_rate": majority,
        "val_majority_rate": val_majority,
        # None, or why the model is no better than the zero model or the majority class
        "no_better_than_trivial": trivial.to_dict() if trivial is not None else None,
        "n_clients": setup.partition.n_clients,
        "n_samples": problem.n_samples,
        "n_features": problem.n_features,
        "lam": problem.lam,
        "wall_seconds": time.time() - started,
    }
    shared_ids = getattr(setup.train, "meta", {}).get("shared_ids")
    if shared_ids is not None:  # party files: sample IDs each party shares with another
        summary["shared_ids"] = dict(shared_ids)
    # A tail of rounds without progress (steps rejected, or the objective flat), with why.
    names = getattr(setup.train, "meta", {}).get("feature_names")
    stalled = stalled_steps(result.metrics, problem.X, names, standardized=spec.standardize)
    if stalled is not None:
        stalled["message"] = stall_message(stalled, label or name)
        summary["stalled"] = stalled
    if hasattr(algorithm, "steps_per_client"):
        summary["local_steps"] = algorithm.steps_per_client(
            problem.n_samples, setup.partition.n_clients
        )
    from hyfl.model_file import model_from_problem

    model = model_from_problem(
        problem, result.weights, data_meta=getattr(setup.train, "meta", {}),
        partition=spec.partition_spec(), algorithm=name,
        data=str(spec.parties if spec.parties is not None else spec.data),
        data_X=setup.train.X, data_y=setup.train.y, feature_scale=setup.feature_scale,
    )
    return RunOutcome(
        run_spec, result, setup.optimum.primal, setup.optimum.method, opt_val_acc, summary, None,
        model,
    )


def majority_rate_of(problem: Any, labels: Any) -> float | None:
    """The accuracy of always predicting the most frequent training label.

    The baseline an accuracy curve must beat: on an unbalanced set (ijcnn1:
    0.905) a model that learned nothing scores this much. None for a
    regression target (where :meth:`~hyfl.problem.Problem.accuracy` is NaN)
    or without labels.

    Parameters
    ----------
    problem : Problem
        Tells whether accuracy is defined for the task (the rule of
        :meth:`~hyfl.problem.Problem.accuracy`: classes, a classification
        loss, or +-1 targets).
    labels : array-like or None
        The training labels as the user gave them.
    """
    if labels is None or np.asarray(labels).size == 0:
        return None
    targets = np.asarray(problem.Y)
    classifies = (
        problem.classes is not None
        or problem.loss.classification
        or bool(np.all((targets == 1.0) | (targets == -1.0)))
    )
    if not classifies:
        return None
    return majority_rate(labels)


def trivial_of(outcome: RunOutcome) -> TrivialResult | None:
    """Why ``outcome``'s model is no better than trivial (:func:`judge_trivial`), or None.

    Read from its summary (``no_better_than_trivial``, which :func:`run_prepared`
    records); a run read back from a folder written before hyfl recorded it is
    judged from its metrics (with validation, on its primal only: such a folder does not
    record the validation labels' majority rate).
    """
    summary = outcome.summary or {}
    if "no_better_than_trivial" in summary:
        return TrivialResult.from_dict(summary["no_better_than_trivial"])
    return judge_trivial(outcome.result.metrics, majority_rate=summary.get("majority_rate"),
                         val_majority_rate=summary.get("val_majority_rate"))


def trivial_runs(outcomes: list[RunOutcome]) -> list[tuple[RunOutcome, TrivialResult]]:
    """The outcomes whose models are no better than trivial, each with :func:`trivial_of`."""
    judged = [(outcome, trivial_of(outcome)) for outcome in outcomes]
    return [(outcome, trivial) for outcome, trivial in judged if trivial is not None]


def trivial_advice(outcome: RunOutcome) -> str:
    """What to try after ``outcome``'s trivial run (:func:`hyfl.runtime.trivial.advice`)."""
    from hyfl.algorithms import accepted_hyperparameters

    try:
        names = accepted_hyperparameters(outcome.spec.algorithm)
    except KeyError:  # an algorithm of a results folder this version does not know
        names = ()
    rule = outcome.spec.hyper.get("step_rule") if isinstance(outcome.spec.hyper, dict) else None
    return advice(names, None if rule is None else str(rule))


def cost_summary(result: RunResult) -> dict[str, Any]:
    """Final cumulative costs and the mean of each time component per outer iteration."""
    final = result.final
    iterations = max(float(final.get("iteration", 0.0)), 1.0)
    totals = {key: float(final.get(key, np.nan)) for key in ("round_trips", *COST_COLUMNS)}
    per_iteration = {
        key: float(final.get(key, np.nan)) / iterations for key in (*TIME_COMPONENTS, "sim_time")
    }
    costs = result.config.get("costs") or {}
    out = {
        "totals": totals,
        "per_iteration": per_iteration,
        "he_costs": he_label(costs),
        "he_costs_source": (costs.get("he_costs") or {}).get("source"),
    }
    if "he_seconds_measured" in final:  # the protocol engine's real cryptography time
        out["he_seconds_measured"] = float(final["he_seconds_measured"])
    return out


def task_of(setup: Setup) -> dict[str, Any]:
    """The learning task a set-up trains: kind, classes and how labels are encoded.

    Parameters
    ----------
    setup : Setup

    Returns
    -------
    dict
        ``task`` ("binary", "multiclass" or "regression"), ``classes`` (the
        original label values, empty for regression), ``label_mapping``
        (original label -> +1/-1 for binary, -> the one-vs-rest column for
        multiclass), ``loss``, ``intercept_scaling`` (the constant column's
        value, None without an intercept) and ``weighted`` (whether the samples'
        losses are weighted, e.g. by ``class_weight``).
    """
    train, problem = setup.train, setup.problem
    task = str(train.task)
    original = train.meta.get("classes") if isinstance(train.meta, dict) else None
    if task == "multiclass":
        classes = list(original) if original is not None and len(original) else []
        codes = [plain_label(c) for c in problem.classes]
        if len(classes) != len(codes):
            classes = codes
        mapping = {str(plain_label(c)): k for k, c in enumerate(classes)}
    elif task == "binary":
        classes = list(original) if original is not None and len(original) == 2 else [-1, 1]
        mapping = {str(plain_label(classes[0])): -1, str(plain_label(classes[1])): 1}
    else:
        classes, mapping = [], {}
    return {"task": task, "classes": [plain_label(c) for c in classes],
            "label_mapping": mapping, "loss": problem.loss.name,
            "intercept_scaling": train.meta.get("intercept_scaling"),
            "weighted": problem.W is not None}


def describe_task(task: dict[str, Any]) -> str:
    """Two lines announcing :func:`task_of`'s task (``hyfl run`` prints them at start)."""
    classes = ", ".join(str(c) for c in task["classes"])
    mapping = ", ".join(f"{k} -> {v:+d}" if task["task"] == "binary" else f"{k} -> column {v}"
                        for k, v in task["label_mapping"].items())
    scaling = task.get("intercept_scaling")
    bias = (f"\n  intercept: a constant column of value {scaling:g}" if scaling is not None
            else "\n  no intercept")
    if task.get("weighted"):
        bias += "; each sample's loss weighted (class weights)"
    if task["task"] == "multiclass":
        return (f"task: multiclass, one-vs-rest over {len(task['classes'])} classes "
                f"({classes}), {task['loss']} loss per class; labels {mapping}{bias}")
    if task["task"] == "binary":
        return f"task: binary classification, classes {classes}; labels {mapping}{bias}"
    return f"task: regression ({task['loss']} loss){bias}"


def _prepare_telling(spec: RunSpec, log) -> Setup:
    """:func:`prepare`, telling ``log`` the party files' notices (a misspelt column,
    :class:`~hyfl.errors.PartyFileWarning`) instead of warning them a second time."""
    with warnings.catch_warnings():
        if log is not None:
            warnings.simplefilter("ignore", PartyFileWarning)
        setup = prepare(spec)
    if log is not None:
        for notice in getattr(setup.train, "meta", {}).get("notices", ()):
            log(f"warning: {notice}")
    return setup


def _tell_stall(outcome: RunOutcome, log) -> None:
    """Tell ``log`` why the run's last rounds made no progress (``summary["stalled"]``)."""
    stalled = outcome.summary.get("stalled")
    if log is not None and stalled:
        log(f"warning: {stalled['message']}")


def execute(spec: RunSpec, out_dir: str | Path | None = None, progress: bool = False,
            overwrite: bool = False, log=None) -> RunOutcome:
    """Run ``spec`` and, when ``out_dir`` is given, write its files there.

    An existing non-empty ``out_dir`` is refused before anything runs unless ``overwrite``.
    ``log`` (a callable taking a string) hears the task (:func:`describe_task`)
    before training starts; ``run.json`` records it (``task``, :func:`task_of`).
    """
    from hyfl.algorithms import is_neural

    if is_neural(spec.algorithm):
        from hyfl.neural import runner as neural

        return neural.execute(spec, out_dir, progress=progress, overwrite=overwrite, log=log)
    if out_dir is not None:  # (single runs have no --resume: only configs do)
        check_results_folder(out_dir, overwrite=overwrite, resumable=False)
    setup = _prepare_telling(spec, log)
    task = task_of(setup)
    if log is not None:
        log(describe_task(task))
    outcome = run_prepared(setup, spec, spec.algorithm, spec.hyper_for(spec.algorithm), progress)
    _tell_stall(outcome, log)
    if out_dir is not None:
        outcome.out_dir = write_outputs(outcome, Path(out_dir), extra={"task": task})
    return outcome


def compare(
    spec: RunSpec, names: list[str], out_dir: str | Path, progress: bool = False,
    overwrite: bool = False, log=None,
) -> list[RunOutcome]:
    """Run several algorithms on one partition and one participation trace.

    The participation random stream depends only on the seed, so every
    algorithm sees the same active clients in every outer iteration. Writes
    ``<name>/metrics.csv`` and ``<name>/run.json`` per algorithm,
    ``summary.csv``, ``summary.md``, ``compare.png`` (relative loss and
    validation accuracy against outer iterations and simulated time) and
    ``costs.png`` (mean time per outer iteration by component). ``log`` (a
    callable taking a string) hears the task (:func:`describe_task`) first.

    A hyperparameter of ``spec.hyper`` goes to the algorithms that take it, and only
    to those; one that none of ``names`` takes is refused before anything runs
    (:meth:`RunSpec.hyper_by_algorithm`).
    """
    from hyfl.experiments.plots import plot_cost_breakdown, plot_runs

    if not names:
        raise fail("--algorithms", "is empty", "Give a comma-separated list, e.g. hyfdca,fedavg.")
    for name in names:
        check_choice("algorithm", name, algorithm_names())
    hyper = spec.hyper_by_algorithm(names)  # refuses an option none of them takes
    from hyfl.algorithms import is_neural

    neural = [is_neural(name) for name in names]
    if any(neural):
        if not all(neural):
            raise fail(
                "--algorithms", f"mixes neural and linear algorithms ({', '.join(names)})",
                "Compare neural algorithms (hyfem-nn, fedbcd-nn, ...) among themselves: "
                "they train other models on other engines.",
            )
        from hyfl.neural import runner as neural_runner

        return neural_runner.compare(spec, names, out_dir, progress=progress,
                                     overwrite=overwrite, log=log)
    out = check_results_folder(out_dir, overwrite=overwrite, resumable=False)
    setup = _prepare_telling(spec, log)
    check_applicable(setup, [make_algorithm(n, hyper[n]) for n in names])
    if log is not None:
        log(describe_task(task_of(setup)))
    outcomes = []
    for name in names:
        outcome = run_prepared(setup, spec, name, hyper[name], progress)
        _tell_stall(outcome, log)
        outcome.out_dir = write_outputs(outcome, out / name, plot=False)
        outcomes.append(outcome)
    write_comparison(outcomes, out)
    runs = {o.spec.algorithm: o.result for o in outcomes}
    encrypted = any(o.summary["engine"] == "protocol" for o in outcomes)
    title = run_title(spec, encrypted)
    plot_runs(runs, out / "compare.png", title=title)
    plot_cost_breakdown(runs, out / "costs.png", title=cost_title(outcomes, spec, title))
    return outcomes


# ---------------------------------------------------------------------------
# Experiments from config files
# ---------------------------------------------------------------------------

CHECKPOINT_FILE = "checkpoint.npz"
#: The pickle checkpoints of earlier versions: refused on --resume, never read (unpickling a
#: file from a results folder could run code).
OLD_CHECKPOINT_FILE = "checkpoint.pkl"
STARTED_FILE = "started.json"
"""Marks a run folder whose run has started and not finished (removed when it finishes)."""


@dataclass
class ExperimentOutcome:
    """What :func:`run_experiment` produced.

    ``outcomes`` has one entry per (algorithm, seed) in the config's order,
    seed by seed; ``skipped`` the (label, seed) of finished runs that
    ``resume`` read back instead of running; ``rows`` the summary rows (per
    algorithm, means and standard deviations across seeds when there are
    several).
    """

    config: Any
    out_dir: Path
    outcomes: list[RunOutcome]
    skipped: list[tuple[str, int]]
    rows: list[dict[str, Any]]


def run_experiment(
    config,
    out_dir: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    log=None,
) -> ExperimentOutcome:
    """Run every (algorithm, seed) of an :class:`~hyfl.experiments.config.ExperimentConfig`.

    Results folder (``out_dir``, default ``config.default_out()``)::

        config.toml            the resolved config
        environment.json       versions, machine, git commit, date
        summary.csv, summary.md
                               one row per algorithm; with several seeds the
                               mean and standard deviation across seeds
                               (``<column>_mean``, ``<column>_std``), and
                               summary_seeds.csv with every run's row
        compare.png, costs.png the first seed's runs
        <label>/seed-<s>/      metrics.parquet, metrics.csv, run.json,
                               checkpoint.npz (stacked engine: the last state)

    Runs of one seed share one prepared set-up (data, split, partition,
    participation). With ``resume``, a run whose ``run.json`` records the same
    spec is read back instead of run again; the others continue from their
    checkpoint when there is one (a finished run with a larger budget is
    extended). An interrupted run of the encrypted protocol engine cannot be
    continued: that is an error. ``log`` (a callable taking a string) hears
    about each run.
    """
    from hyfl.algorithms import is_neural, make_algorithm

    say = log or (lambda message: None)
    neural = [is_neural(entry.algorithm) for entry in config.algorithms]
    if any(neural) and not all(neural):
        raise fail(
            "config [algorithms]", "mixes neural and linear algorithms",
            "Put neural algorithms (hyfem-nn, fedbcd-nn, ...) in a config of their own.",
        )
    out = check_results_folder(out_dir if out_dir is not None else config.default_out(),
                               overwrite=overwrite, resume=resume)
    if any(neural):
        from hyfl.neural.runner import run_experiment as run_neural_experiment

        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "config.toml", config.to_toml())
        write_text(out / "environment.json", dumps_json(environment(), indent=2) + "\n")
        outcomes, rows = run_neural_experiment(config, out, progress=progress, say=say)
        return ExperimentOutcome(config, out, outcomes, [], rows)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "config.toml", config.to_toml())
    write_text(
        out / "environment.json", dumps_json(environment(), indent=2) + "\n"
    )
    jobs = config.jobs()
    outcomes: list[RunOutcome] = []
    skipped: list[tuple[str, int]] = []
    setup: Setup | None = None
    setup_seed: int | None = None
    announced = False
    for number, job in enumerate(jobs, 1):
        entry = config.algorithm(job.label)
        run_dir = out / job.label / f"seed-{job.seed}"
        where = f"[{number}/{len(jobs)}] {job.label}, seed {job.seed}"
        if resume:
            finished = load_finished_run(run_dir, job.spec)
            if finished is not None:
                say(f"{where}: finished earlier, read from {run_dir}")
                outcomes.append(finished)
                skipped.append((job.label, job.seed))
                continue
        started = run_dir / STARTED_FILE
        encrypted = job.spec.uses_protocol(make_algorithm(entry.algorithm, entry.hyper))
        if resume and encrypted and started.exists():
            raise fail(
                f"run {job.label} (seed {job.seed}) in {run_dir}",
                f"was interrupted and cannot be resumed: with cipher {job.spec.cipher} it runs "
                "on the encrypted protocol engine, which writes no checkpoints",
                f"Delete {run_dir} to run it again from the start (--resume keeps the other "
                "runs), or run without --resume to start every run over.",
            )
        if setup is None or setup_seed != job.seed:
            setup = None  # free the previous seed's data first
            # (the party files' notices once: every seed reads the same files)
            told = say if not announced else (lambda message: None)
            setup, setup_seed = _prepare_telling(job.spec, told), job.seed
            if not announced:  # the task is the same for every run
                check_applicable(setup, [make_algorithm(e.algorithm, e.hyper)
                                         for e in config.algorithms])
                say(describe_task(task_of(setup)))
                announced = True
        checkpoint = run_dir / CHECKPOINT_FILE
        if resume and not checkpoint.exists() and (run_dir / OLD_CHECKPOINT_FILE).exists():
            raise fail(
                f"checkpoint {run_dir / OLD_CHECKPOINT_FILE}",
                "is a pickle from an earlier hyfl version; it is not read, because unpickling "
                "a file can run code",
                f"Delete it (and --resume starts {job.label} over), or finish the run with the "
                "hyfl version that wrote it.",
            )
        continuing = resume and not encrypted and checkpoint.exists()
        say(f"{where}: {'continuing from its checkpoint' if continuing else 'running'}")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").unlink(missing_ok=True)
        write_text(
            started,
            dumps_json({"started": timestamp(), "spec": asdict(job.spec)}),
        )
        outcome = run_prepared(
            setup,
            job.spec,
            entry.algorithm,
            dict(entry.hyper),
            progress,
            checkpointing=None if encrypted else Checkpointing(
                checkpoint, resume=resume, every=config.experiment.checkpoint_every,
                seconds=config.experiment.checkpoint_seconds),
            label=job.label,
        )
        _tell_stall(outcome, say)
        outcome.out_dir = write_outputs(outcome, run_dir, plot=False,
                                        extra={"overrides": config.overrides})
        started.unlink(missing_ok=True)
        outcomes.append(outcome)
    rows = write_experiment_summary(config, outcomes, out)
    return ExperimentOutcome(config, out, outcomes, skipped, rows)


def load_finished_run(run_dir: Path, spec: RunSpec) -> RunOutcome | None:
    """A run folder's outcome if it holds a finished run of exactly ``spec``, else None."""
    record_path, table_path = run_dir / "run.json", run_dir / "metrics.parquet"
    if (run_dir / STARTED_FILE).exists() or not record_path.exists() or not table_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        # Bounded by its size (hyfl._io); a refused table is a run to redo, like a broken one.
        table = read_parquet(table_path, f"metrics table {table_path}", "")
    except (OSError, ValueError, RecursionError):
        return None
    if _normalized(record.get("spec")) != _normalized(asdict(spec)):
        return None
    metrics = [
        {str(k): float(v) for k, v in row.items()} for row in table.to_dict(orient="records")
    ]
    summary = record.get("summary", {})
    optimum = summary.get("optimum", {})
    config = {
        key: record.get(key)
        for key in (
            "algorithm",
            "engine",
            "cipher",
            "costs",
            "budget",
            "stopped_by",
            "rounds",
            "resumed_from",
            "setup",
        )
        if key in record
    }
    config["optimum_primal"] = optimum.get("primal")
    config["seed"] = spec.seed
    config["majority_rate"] = summary.get("majority_rate")  # for the resumed compare.png
    result = RunResult(
        metrics=metrics,
        weights=np.empty((0, 0)),
        duals=None,
        round_times=np.empty(0),
        config=config,
    )
    return RunOutcome(
        spec,
        result,
        _nan_if_none(optimum.get("primal")),
        optimum.get("method", ""),
        _nan_if_none(optimum.get("val_accuracy")),
        summary,
        run_dir,
    )


def _nanmax_or_none(values: np.ndarray) -> float | None:
    """The largest finite value, or None when there is none (a regression target)."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    return float(finite.max()) if finite.size else None


def _nan_if_none(value) -> float:
    return np.nan if value is None else float(value)


def _normalized(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=json_default))


def calibrate_ciphers(
    cipher: str,
    key_bits: int | None = None,
    n_values: int = 200,
    output: str | Path | None = None,
) -> tuple[dict[str, dict], Path]:
    """Measure seconds per operation of cipher ``cipher`` (or ``all``) and save them.

    The records are merged into ``output`` (default
    :func:`hyfl.costs.calibration_path`), where ``--he-costs measured`` reads
    them. Returns the records by cipher name and the file written.
    """
    check_choice("cipher", cipher, [*CIPHERS, "all"])
    names = list(CIPHERS) if cipher == "all" else [cipher]
    check_int("n", n_values, minimum=1)
    if key_bits is not None:
        check_keybits(key_bits)
    records = {}
    for name in names:
        record = calibrate(make_cipher(name, key_bits=key_bits), n_values=n_values)
        record["n_values"] = int(n_values)
        record["python"] = platform.python_version()
        record["platform"] = platform.platform()
        records[name] = record
    return records, save_calibration(records, None if output is None else Path(output))
