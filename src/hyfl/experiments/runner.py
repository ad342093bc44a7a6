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

import csv
import dataclasses
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyfl import __version__
from hyfl._io import atomic_write, check_results_folder, dumps_json, write_json, write_text
from hyfl._names import CLASS_WEIGHTS
from hyfl.algorithms import algorithm_names, make_algorithm
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.costs import (
    COST_COLUMNS,
    DEFAULT_HE_COSTS,
    DEFAULT_HE_LAYOUT,
    TIME_COMPONENTS,
    CostModel,
    check_he_costs,
    check_he_layout,
    he_label,
    layout_slots,
    resolve_he_costs,
    save_calibration,
)
from hyfl.data import default_lambda, is_party_spec, load_party_data, train_validation
from hyfl.data.dataset import INTERCEPT_SCALING, parse_intercept, with_intercept
from hyfl.errors import check_choice, check_int, fail
from hyfl.losses import LOSSES
from hyfl.partition import parse_participation, parse_partition, stack, with_constant_feature
from hyfl.privacy.ciphers import CIPHERS, calibrate, check_keybits, make_cipher
from hyfl.privacy.secure_scaling import scale_columns, secure_feature_scales
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.protocol import run_protocol
from hyfl.runtime.simulation import (
    DEFAULT_CHECKPOINT_SECONDS,
    METRIC_COLUMNS,
    RunResult,
    Validation,
    budget_record,
    check_sim_time_budget,
    evaluate,
    first_round_at_least,
    first_round_below,
    settled_round_below,
    simulate,
)
from hyfl.runtime.trivial import TrivialResult, advice, judge_trivial, majority_rate

FALLBACK_LAMBDA = 1e-4
AUC_TARGETS = (0.7, 0.75, 0.8)
"""Validation AUCs whose first round the summaries report (FedBCD's Table 2 targets)."""
DEFAULT_PARTITION = "grid:3x3"
PARTY_PARTITION = "parties"  # the partition party files define


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run; defaults are ``hyfl run``'s defaults.

    ``hyper`` holds the algorithm's hyperparameters by name (for example
    ``{"iic": 7.4e-4}`` for HyFDCA or ``{"a": 0.05, "b": 1.0}`` for FedAvg);
    ``hyfl compare`` also accepts ``"fedavg.a"``-style keys that apply to one
    algorithm only.

    ``cipher`` (a name in :data:`~hyfl.privacy.ciphers.CIPHERS`) and
    ``key_bits`` choose HyFDCA's homomorphic encryption: ``none`` simulates it
    (ciphertexts and operations counted, nothing encrypted), a real cipher
    runs HyFDCA's parties with real encryption. Other algorithms never
    encrypt. ``latency`` (seconds per round trip), ``he_costs`` (``auto``: the
    running cipher's own costs, zero for ``none``; ``paper``, ``measured``, a
    cipher name or a JSON file, see :func:`hyfl.costs.resolve_he_costs`) and
    ``he_layout`` (which ciphertexts are counted: ``cipher``, ``sample`` or a
    cipher name, see :func:`hyfl.costs.counting_layout`) make the cost model
    of the simulated time.

    ``intercept`` fits a bias as liblinear does: the data gain a constant column
    of this value (:func:`hyfl.data.dataset.with_intercept`); None fits none.
    ``class_weight="balanced"`` weights each sample's loss by ``N / (C n_c)``, ``n_c``
    the count of its class (:func:`sample_weights`). ``standardize`` divides every
    feature by its standard deviation, computed from a secure sum of the clients'
    column statistics (:mod:`hyfl.privacy.secure_scaling`).

    The budget: ``iterations`` outer iterations, or, with ``sim_time``
    (simulated seconds), until the cumulative simulated time reaches it, at
    most ``iterations`` rounds.

    Party files (a party spec as ``data``, or a config's ``[data] parties``
    table in ``parties``) bring their own partition: ``partition`` is then
    ``None`` or ``"parties"``, and validation is ``val`` (more party files)
    or ``val_fraction`` (rows held out of every party). Otherwise
    ``partition`` defaults to :data:`DEFAULT_PARTITION`.
    """

    algorithm: str = "hyfdca"
    data: str = "breast_cancer"
    val: str | None = None
    val_fraction: float | None = None
    loss: str = "hinge"
    lam: float | None = None
    partition: str | None = None
    participation: str = "0.5"
    hyper: dict[str, Any] = field(default_factory=dict)
    iterations: int = 2000
    eval_every: int = 1
    seed: int = 0
    data_dir: str | None = None
    cipher: str = "none"
    key_bits: int | None = None
    latency: float = 0.0
    he_costs: str = DEFAULT_HE_COSTS
    sim_time: float | None = None
    parties: Any = None
    he_layout: str = DEFAULT_HE_LAYOUT
    intercept: float | None = INTERCEPT_SCALING
    class_weight: str | None = None
    standardize: bool = False

    def validated(self) -> RunSpec:
        check_choice("algorithm", self.algorithm, algorithm_names())
        check_choice("loss", self.loss, LOSSES)
        check_int("iterations", self.iterations, minimum=1)
        check_sim_time_budget(self.sim_time)
        check_int("eval_every", self.eval_every, minimum=1)
        check_int("seed", self.seed, minimum=0)
        parse_intercept(self.intercept)
        if self.class_weight is not None:
            check_choice("class_weight", self.class_weight, CLASS_WEIGHTS)
        if not isinstance(self.standardize, bool):
            raise fail("standardize", f"must be true or false, got {self.standardize!r}",
                       "Pass --standardize (in a config: standardize = true).")
        if self.hyper.get("iic") is not None and self.hyper.get("local_steps") is not None:
            raise fail("--iic and --local-steps", "were both given", "Give only one of them.")
        if self.val is not None and self.val_fraction is not None:
            raise fail("--val and --val-fraction", "were both given", "Give only one of them.")
        if self.uses_party_files() and self.partition not in (None, PARTY_PARTITION):
            raise fail(
                "--partition",
                f"is {self.partition!r}, but party files bring their own partition",
                f"Leave the partition out (or write {PARTY_PARTITION!r}) with party files.",
            )
        if not self.uses_party_files() and self.partition == PARTY_PARTITION:
            raise fail(
                "--partition",
                f"is {PARTY_PARTITION!r}, but the data are not party files",
                "Pass party files (--data parties:a.csv,b.csv) or a partition spec such as "
                "grid:3x3.",
            )
        check_choice("cipher", self.cipher, CIPHERS)
        if self.key_bits is not None:
            check_keybits(self.key_bits)
        _check_latency(self.latency)
        # checked now, before any data is loaded (measured with the cipher in prepare())
        check_he_costs(self.he_costs, self.cipher)
        check_he_layout(self.he_layout, self.cipher)
        return self

    def uses_party_files(self) -> bool:
        """Whether the data are party files (which define the partition)."""
        return self.parties is not None or is_party_spec(self.data)

    def partition_spec(self) -> str:
        """The partition actually used: ``"parties"``, the given spec or the default."""
        if self.uses_party_files():
            return PARTY_PARTITION
        return self.partition if self.partition is not None else DEFAULT_PARTITION

    def cost_model(self, cipher=None) -> CostModel:
        """Latency, per-operation HE costs and counted layout for a run with ``cipher``.

        ``cipher`` is the built cipher of the run (default: built here from
        ``cipher`` and ``key_bits``); ``he_costs = "auto"`` prices it with its
        own costs (:func:`hyfl.costs.resolve_he_costs`).
        """
        check_he_costs(self.he_costs, self.cipher)
        check_he_layout(self.he_layout, self.cipher)
        if cipher is None:
            cipher = make_cipher(self.cipher, key_bits=self.key_bits)
        he = resolve_he_costs(self.he_costs, cipher, key_bits=self.key_bits)
        return CostModel(
            latency=float(self.latency),
            he=he,
            layout=self.he_layout,
            layout_slots=layout_slots(self.he_layout, key_bits=self.key_bits),
        ).validated()

    def budget(self) -> dict[str, float | int]:
        """``{"iterations": T}`` or ``{"sim_time": S, "max_iterations": T}``."""
        return budget_record(self.iterations, self.sim_time)

    def run_key(self) -> dict[str, Any]:
        """What identifies this run's checkpoints: the spec without budget and data folder."""
        key = asdict(self)
        for name in ("iterations", "sim_time", "data_dir"):
            key.pop(name)
        return key

    def uses_protocol(self, algorithm) -> bool:
        """Whether ``algorithm`` runs with real encryption (HyFDCA and a real cipher)."""
        return self.cipher != "none" and isinstance(algorithm, HyFDCA)

    def hyper_for(self, name: str, *, only_accepted: bool = False) -> dict[str, Any]:
        """Hyperparameters for algorithm ``name``: shared keys, then ``name.key`` overrides.

        With ``only_accepted`` (used by ``compare``), shared keys an algorithm
        does not have are skipped instead of being an error.
        """
        from hyfl.algorithms import accepted_hyperparameters

        accepted = accepted_hyperparameters(name)
        shared = {k: v for k, v in self.hyper.items() if "." not in k}
        if only_accepted:
            shared = {k: v for k, v in shared.items() if k in accepted}
        specific = {
            k.split(".", 1)[1]: v for k, v in self.hyper.items() if k.startswith(f"{name}.")
        }
        return {**shared, **specific}


def _check_latency(latency: float) -> float:
    try:
        value = float(latency)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise fail(
            "--latency",
            f"must be seconds >= 0, got {latency!r}",
            "Pass seconds per round trip, e.g. --latency 0.2575 (the paper used 0, 0.2575, 0.8).",
        )
    return value


@dataclass
class RunOutcome:
    """What :func:`execute` produced."""

    spec: RunSpec
    result: RunResult
    optimum_primal: float
    optimum_method: str
    optimum_val_accuracy: float
    summary: dict[str, Any]
    out_dir: Path | None
    model: Any = None  # hyfl.model_file.Model of the final weights (None: not written)


@dataclass(frozen=True)
class Setup:
    """Data, problem, optimum, partition, participation, cipher and cost model shared by runs.

    The cipher (with its key pair) is built once and shared by the runs of a
    comparison; each run counts its own operations.
    """

    train: Any
    problem: Any
    optimum: Any
    partition: Any
    participation: Any
    validation: Validation | None
    cipher: Any = None
    cost_model: CostModel = field(default_factory=CostModel)
    # Each feature's scale (M,) when the features were scaled across parties, else None.
    feature_scale: Any = None


def load_split(spec: RunSpec):
    """``(train, validation, partition)`` of a spec; partition None unless party files give it."""
    if spec.uses_party_files():
        source = spec.parties if spec.parties is not None else spec.data
        return load_party_data(
            source, val=spec.val, val_fraction=spec.val_fraction, seed=spec.seed
        )
    train, val = train_validation(
        spec.data,
        val=spec.val,
        val_fraction=spec.val_fraction,
        seed=spec.seed,
        data_dir=spec.data_dir,
    )
    return train, val, None


def add_intercept(train, val, partition, scaling: float):
    """Train and validation data with the constant intercept column, and the given
    partition (party files) extended to it (:func:`hyfl.partition.with_constant_feature`)."""
    train = with_intercept(train, scaling)
    val = with_intercept(val, scaling) if val is not None else None
    if partition is not None:
        partition = with_constant_feature(partition, train.X)
    return train, val, partition


def sample_weights(train, class_weight: str | None):
    """The training samples' weights: the data's own (a party file's weight column) times
    ``class_weight``'s; None when neither weighs.

    ``"balanced"`` is scikit-learn's: ``N / (C n_c)`` for a sample of class ``c``. In a
    federation the class counts are sums of the label holders' counts (the class
    frequencies are then known to every party)."""
    own = train.sample_weight  # the data's own (a party file's weight column), or None
    if own is not None:  # a weighted mean: integer weights count as repeated samples
        own = np.asarray(own, dtype=np.float64) / float(np.mean(own))
    if class_weight is None:
        return own
    if train.task == "regression":
        raise fail("class_weight", f"is {class_weight!r}, but {train.name!r} is a regression "
                   "target", "Leave --class-weight out for real-valued targets.")
    from sklearn.utils.class_weight import compute_sample_weight

    # As scikit-learn's linear models combine them: each sample's weight times its
    # class's (from the class counts).
    return compute_sample_weight(class_weight, train.y) * (1.0 if own is None else own)


def scale_features(problem, val, partition, spec: RunSpec):
    """The problem and validation data with every feature divided by its deviation from
    the clients' secure sum (:mod:`hyfl.privacy.secure_scaling`; the intercept's
    constant column stays), and the scales (M,)."""
    constant = [problem.n_features - 1] if spec.intercept is not None else None
    scale = secure_feature_scales(partition, problem.X, np.random.default_rng([spec.seed, 3]),
                                  keep=constant)
    problem = dataclasses.replace(problem, X=scale_columns(problem.X, scale))
    if val is not None:
        val = dataclasses.replace(val, X=scale_columns(val.X, scale))
    return problem, val, scale


def prepare(spec: RunSpec) -> Setup:
    """Load data and build problem, optimum, partition, participation, cipher and cost model."""
    spec.validated()
    train, val, partition = load_split(spec)
    if spec.intercept is not None:
        train, val, partition = add_intercept(train, val, partition, spec.intercept)
    lam = spec.lam if spec.lam is not None else (default_lambda(spec.data) or FALLBACK_LAMBDA)
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
    participation = parse_participation(spec.participation, partition.n_clients)
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
    checkpoint: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int | None = None,
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS,
    label: str | None = None,
) -> RunOutcome:
    """Run algorithm ``name`` on a prepared set-up and summarize it.

    The budget is the spec's (``iterations``, or ``sim_time`` capped by
    ``iterations``). ``checkpoint``, ``resume``, ``checkpoint_every`` and
    ``checkpoint_seconds`` are :func:`~hyfl.runtime.simulation.simulate`'s;
    the encrypted protocol engine has no checkpoints, so ``resume`` with an
    existing ``checkpoint`` file is an error there. ``label`` names the run
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
        if resume and checkpoint is not None and Path(checkpoint).exists():
            raise fail(
                f"checkpoint {checkpoint}",
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
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            checkpoint_seconds=checkpoint_seconds,
            resume=resume,
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
    return advice(names)


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
        codes = [_plain(c) for c in problem.classes]
        if len(classes) != len(codes):
            classes = codes
        mapping = {str(_plain(c)): k for k, c in enumerate(classes)}
    elif task == "binary":
        classes = list(original) if original is not None and len(original) == 2 else [-1, 1]
        mapping = {str(_plain(classes[0])): -1, str(_plain(classes[1])): 1}
    else:
        classes, mapping = [], {}
    return {"task": task, "classes": [_plain(c) for c in classes],
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


def _plain(value):
    """A class label as an int when it is a whole number (1.0 -> 1); text stays text."""
    if isinstance(value, str):
        return value
    number = float(value)
    return int(number) if number.is_integer() else number


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
    setup = prepare(spec)
    task = task_of(setup)
    if log is not None:
        log(describe_task(task))
    outcome = run_prepared(setup, spec, spec.algorithm, spec.hyper_for(spec.algorithm), progress)
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
    """
    from hyfl.experiments.plots import plot_cost_breakdown, plot_runs

    if not names:
        raise fail("--algorithms", "is empty", "Give a comma-separated list, e.g. hyfdca,fedavg.")
    for name in names:
        check_choice("algorithm", name, algorithm_names())
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
    setup = prepare(spec)
    check_applicable(setup, [make_algorithm(n, spec.hyper_for(n, only_accepted=True))
                             for n in names])
    if log is not None:
        log(describe_task(task_of(setup)))
    outcomes = []
    for name in names:
        outcome = run_prepared(
            setup, spec, name, spec.hyper_for(name, only_accepted=True), progress
        )
        outcome.out_dir = write_outputs(outcome, out / name, plot=False)
        outcomes.append(outcome)
    write_comparison(outcomes, out)
    runs = {o.spec.algorithm: o.result for o in outcomes}
    encrypted = any(o.summary["engine"] == "protocol" for o in outcomes)
    title = _title(spec, encrypted)
    plot_runs(runs, out / "compare.png", title=title)
    plot_cost_breakdown(runs, out / "costs.png", title=_cost_title(outcomes, spec, title))
    return outcomes


CONVERGENCE_COLUMNS = (
    "algorithm",
    "final_relative_loss",
    "best_val_accuracy",
    "best_val_auc",
    "rounds_to_1e-1",
    "rounds_to_1e-2",
    "rounds_to_1e-3",
    "settled_1e-2",
    "settled_1e-3",
    "round_trips",
    "median_round_ms",
    *(f"rounds_to_auc_{level:g}" for level in AUC_TARGETS),
)
COST_SUMMARY_COLUMNS = (
    "algorithm",
    "engine",
    "sim_time",
    "bytes_up",
    "bytes_down",
    "encryptions",
    "decryptions",
    *(f"{component}_per_iter" for component in TIME_COMPONENTS),
)
"""Final cumulative costs, then the mean seconds per outer iteration of each component."""
SUMMARY_COLUMNS = CONVERGENCE_COLUMNS + COST_SUMMARY_COLUMNS[1:]


def summary_rows(outcomes: list[RunOutcome]) -> list[dict[str, Any]]:
    rows = []
    for o in outcomes:
        s = o.summary
        reach = s["rounds_to_relative_loss"]
        rows.append(
            {
                "algorithm": s["algorithm"],
                "final_relative_loss": s["final"]["relative_loss"],
                "best_val_accuracy": s["best_val_accuracy"],
                "best_val_auc": s.get("best_val_auc"),  # (absent from older run.json files)
                "rounds_to_1e-1": reach["0.1"],
                "rounds_to_1e-2": reach["0.01"],
                "rounds_to_1e-3": reach["0.001"],
                "settled_1e-2": s["settled_at_relative_loss"]["0.01"],
                "settled_1e-3": s["settled_at_relative_loss"]["0.001"],
                "round_trips": s["final"]["round_trips"],
                "median_round_ms": 1e3 * s["median_round_seconds"],
                **{f"rounds_to_auc_{level:g}": s.get("rounds_to_val_auc", {}).get(f"{level:g}")
                   for level in AUC_TARGETS},
                "engine": s["engine"],
                **{
                    key: s["costs"]["totals"][key]
                    for key in ("sim_time", "bytes_up", "bytes_down", "encryptions", "decryptions")
                },
                **{f"{key}_per_iter": s["costs"]["per_iteration"][key] for key in TIME_COMPONENTS},
            }
        )
    return rows


def write_comparison(outcomes: list[RunOutcome], out: Path) -> None:
    rows = summary_rows(outcomes)
    with atomic_write(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows({k: _summary_value(k, v) for k, v in r.items()} for r in rows)
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r[c]) for c in SUMMARY_COLUMNS) + " |")
    write_text(out / "summary.md", "\n".join(lines) + "\n")


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _title(spec: RunSpec, encrypted: bool = False) -> str:
    """Plot title; names the cipher when (some) runs are really encrypted. A data file is
    named by its file name, not its whole path."""
    data = Path(spec.data).name if Path(spec.data).is_file() else spec.data
    title = f"{data}, {spec.partition_spec()}, participation {spec.participation}"
    return f"{title}, HyFDCA encrypted with {spec.cipher}" if encrypted else title


def _cost_title(outcomes: list[RunOutcome], spec: RunSpec, title: str) -> str:
    """Cost plot title: the latency and what priced the HE operations (one line per source)."""
    labels = []
    for o in outcomes:
        label = he_label(o.result.config.get("costs"), spec.he_costs)
        if label not in labels:
            labels.append(label)
    return f"{title}\nlatency {float(spec.latency):g} s per round trip, {'; '.join(labels)}"


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
        _atomic_text(out / "config.toml", config.to_toml())
        _atomic_text(out / "environment.json", dumps_json(environment(), indent=2) + "\n")
        outcomes, rows = run_neural_experiment(config, out, progress=progress, say=say)
        return ExperimentOutcome(config, out, outcomes, [], rows)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_text(out / "config.toml", config.to_toml())
    _atomic_text(
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
            setup, setup_seed = prepare(job.spec), job.seed
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
        _atomic_text(
            started,
            dumps_json({"started": _now(), "spec": asdict(job.spec)}),
        )
        outcome = run_prepared(
            setup,
            job.spec,
            entry.algorithm,
            dict(entry.hyper),
            progress,
            checkpoint=None if encrypted else checkpoint,
            resume=resume,
            checkpoint_every=config.experiment.checkpoint_every,
            checkpoint_seconds=config.experiment.checkpoint_seconds,
            label=job.label,
        )
        outcome.out_dir = write_outputs(outcome, run_dir, plot=False,
                                        extra={"overrides": config.overrides})
        started.unlink(missing_ok=True)
        outcomes.append(outcome)
    rows = write_experiment_summary(config, outcomes, out)
    return ExperimentOutcome(config, out, outcomes, skipped, rows)


def load_finished_run(run_dir: Path, spec: RunSpec) -> RunOutcome | None:
    """A run folder's outcome if it holds a finished run of exactly ``spec``, else None."""
    import pandas as pd

    record_path, table_path = run_dir / "run.json", run_dir / "metrics.parquet"
    if (run_dir / STARTED_FILE).exists() or not record_path.exists() or not table_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        table = pd.read_parquet(table_path)
    except (OSError, ValueError):
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


SEED_AGGREGATED_COLUMNS = tuple(c for c in SUMMARY_COLUMNS if c not in ("algorithm", "engine"))


def write_experiment_summary(config, outcomes: list[RunOutcome], out: Path) -> list[dict[str, Any]]:
    """``summary.csv``/``summary.md`` (and ``summary_seeds.csv``), ``compare.png``, ``costs.png``.

    With one seed the summary is :func:`write_comparison`'s. With several,
    ``summary_seeds.csv`` has every run's row (with its seed) and
    ``summary.csv`` one row per algorithm: ``n_seeds`` and, for every numeric
    column, ``<column>_mean`` and ``<column>_std`` (sample standard deviation,
    0 for one value), empty when some seed has no value (e.g. a tolerance not
    reached). The plots show the first seed's runs.
    """
    from hyfl.experiments.plots import plot_cost_breakdown, plot_runs

    seeds = list(config.experiment.seeds)
    if len(seeds) == 1:
        write_comparison(outcomes, out)
        rows = summary_rows(outcomes)
    else:
        per_run = [{"seed": o.spec.seed, **row} for o, row in zip(outcomes, summary_rows(outcomes))]
        columns = ["algorithm", "seed", *SUMMARY_COLUMNS[1:]]
        _write_csv(out / "summary_seeds.csv", columns, per_run)
        rows = aggregate_seeds(per_run)
        agg_columns = ["algorithm", "engine", "n_seeds"] + [
            f"{c}_{stat}" for c in SEED_AGGREGATED_COLUMNS for stat in ("mean", "std")
        ]
        _write_csv(out / "summary.csv", agg_columns, rows)
        header = ["algorithm", "engine", "seeds", *SEED_AGGREGATED_COLUMNS]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
            cells = [r["algorithm"], r["engine"], str(r["n_seeds"])]
            for c in SEED_AGGREGATED_COLUMNS:
                mean, std = r[f"{c}_mean"], r[f"{c}_std"]
                cells.append("-" if mean is None else f"{_fmt(mean)} ± {_fmt(std)}")
            lines.append("| " + " | ".join(cells) + " |")
        write_text(
            out / "summary.md",
            f"Mean ± sample standard deviation over seeds {seeds}.\n\n" + "\n".join(lines) + "\n"
        )
    first = [o for o in outcomes if o.spec.seed == seeds[0]]
    if first:
        runs = {o.summary["algorithm"]: o.result for o in first}
        encrypted = any(o.summary.get("engine") == "protocol" for o in first)
        title = _title(first[0].spec, encrypted)
        if len(seeds) > 1:
            title += f", seed {seeds[0]}"
        plot_runs(runs, out / "compare.png", title=title)
        plot_cost_breakdown(runs, out / "costs.png",
                            title=_cost_title(first, first[0].spec, title))
    return rows


def aggregate_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per algorithm: mean and sample std of every numeric summary column."""
    by_algorithm: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_algorithm.setdefault(row["algorithm"], []).append(row)
    out = []
    for name, group in by_algorithm.items():
        agg: dict[str, Any] = {
            "algorithm": name,
            "engine": group[0].get("engine"),
            "n_seeds": len(group),
        }
        for column in SEED_AGGREGATED_COLUMNS:
            values = [row.get(column) for row in group]
            if any(v is None or not np.isfinite(v) for v in values):
                agg[f"{column}_mean"] = agg[f"{column}_std"] = None
                continue
            values = np.asarray(values, dtype=float)
            agg[f"{column}_mean"] = float(values.mean())
            agg[f"{column}_std"] = float(values.std(ddof=1)) if values.size > 1 else 0.0
        out.append(agg)
    return out


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    with atomic_write(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({k: _summary_value(k, r.get(k)) for k in columns} for r in rows)


def _summary_value(column: str, value: Any) -> Any:
    """A summary cell for the CSV: counts (rounds, bytes, HE operations) as integers."""
    if value is None:
        return ""
    counts = column in INTEGER_COLUMNS or column in ("n_seeds", "seed") or column.startswith(
        ("rounds_to_", "settled_"))
    counts = counts and not column.endswith(("_mean", "_std"))
    if counts and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def environment() -> dict[str, Any]:
    """Versions, machine and source revision, for ``environment.json``."""
    from importlib import metadata

    versions = {}
    for package in ("hyfl", "numpy", "scipy", "scikit-learn", "phe", "gmpy2", "pandas", "pyarrow"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    versions["hyfl"] = versions["hyfl"] or __version__
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        available = os.cpu_count()
    return {
        "date": _now(),
        "versions": versions,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_available": available,
        "git": _git_revision(),
    }


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_revision() -> dict[str, Any] | None:
    """Commit (and whether tracked files differ from it) of hyfl's source, if in a git checkout."""
    import subprocess

    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())} if commit else None


def _atomic_text(path: Path, text: str) -> None:
    write_text(path, text)


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


def metric_columns(rows: list[dict[str, float]], first=METRIC_COLUMNS) -> list[str]:
    """``first`` (default :data:`METRIC_COLUMNS`) in order, then the other columns of
    ``rows`` alphabetically."""
    extra = sorted({k for row in rows for k in row} - set(first))
    return list(first) + extra


def write_outputs(
    outcome: RunOutcome, out_dir: Path, plot: bool = True, extra: dict | None = None
) -> Path:
    """Write ``metrics.csv``, ``metrics.parquet``, ``model.npz``, ``run.json`` and ``loss.png``.

    ``loss.png`` only with ``plot``; ``model.npz`` (the final weights, see
    :mod:`hyfl.model_file`) when the outcome has a model (a run loaded back from
    its folder has none, and its ``model.npz`` is left as it is).

    ``metrics.csv`` and ``metrics.parquet`` hold the same table: the columns
    :data:`METRIC_COLUMNS` in that order (the cumulative costs among them),
    then the engine's extra round statistics in alphabetical order, as
    int64 for the counts of :data:`INTEGER_COLUMNS` (written ``10``, not
    ``10.0``) and float64 for the others (missing values empty in the CSV, NaN
    in Parquet). ``run.json``
    records the spec, the algorithm, the engine, the cipher, the cost model,
    the budget and what ended the run (``stopped_by``: ``iterations`` or
    ``sim_time``), the rounds at which it was resumed, and, for protocol
    runs, the set-up costs (encryptions, bytes) that precede the first round;
    ``extra`` adds entries (config runs: ``overrides``, the values that
    command-line flags set over the config file).
    """
    import pandas as pd

    from hyfl.experiments.plots import plot_runs

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = outcome.result.metrics
    # the neural engine has its own columns (no objective gap, no HE counts)
    columns = metric_columns(rows, outcome.result.config.get("metric_columns", METRIC_COLUMNS))
    values = {k: np.array([_float(row.get(k)) for row in rows], dtype=float) for k in columns}
    for k in integer_columns(values):
        values[k] = values[k].astype(np.int64)
    with atomic_write(out_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for i in range(len(rows)):
            writer.writerow({k: _csv_value(values[k][i]) for k in columns})
    table = pd.DataFrame(values, columns=columns)
    _atomic_parquet(table, out_dir / "metrics.parquet")
    config = outcome.result.config
    record = {
        "hyfl_version": __version__,
        "label": outcome.summary.get("algorithm", outcome.spec.algorithm),
        "seed": outcome.spec.seed,
        "spec": asdict(outcome.spec),
        "algorithm": config["algorithm"],
        "engine": config.get("engine", "simulation"),
        "cipher": config.get("cipher"),
        "costs": config.get("costs"),
        "budget": config.get("budget", outcome.spec.budget()),
        "stopped_by": config.get("stopped_by", "iterations"),
        "rounds": config.get("rounds", len(outcome.result.round_times)),
        "resumed_from": config.get("resumed_from", []),
        "optimum_primal": config.get("optimum_primal"),
        "summary": outcome.summary,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "numpy": np.__version__,
        },
    }
    if "setup" in outcome.result.config:
        record["setup"] = outcome.result.config["setup"]
    if outcome.model is not None:
        from hyfl.model_file import MODEL_FILE, save_model

        save_model(out_dir / MODEL_FILE, outcome.model)
    record.update(extra or {})
    write_json(out_dir / "run.json", record)
    if plot:
        plot_runs(
            {outcome.spec.algorithm: outcome.result},
            out_dir / "loss.png",
            title=_title(outcome.spec, encrypted=record["engine"] == "protocol"),
        )
    return out_dir


def _float(v: Any) -> float:
    return np.nan if v is None else float(v)


def _atomic_parquet(table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    table.to_parquet(tmp, index=False)
    os.replace(tmp, path)


#: Metric columns that count things (iterations, round trips, bytes, HE operations).
INTEGER_COLUMNS = (
    "iteration", "round_trips", "bytes_up", "bytes_down", "encryptions", "decryptions",
    "additions",
)


def integer_columns(values: dict[str, np.ndarray]) -> list[str]:
    """The columns of :data:`INTEGER_COLUMNS` in ``values`` whose every value is a whole number.

    Parameters
    ----------
    values : dict of str to ndarray
        Column name -> float values (NaN where missing).

    Returns
    -------
    list of str
        The columns to write as integers (a column with a missing value stays float).
    """
    return [
        k for k in INTEGER_COLUMNS
        if k in values and np.all(np.isfinite(values[k])) and np.all(values[k] % 1 == 0)
    ]


def _csv_value(v) -> str:
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else repr(float(v))


def json_default(obj):
    """``json.dumps`` fallback for NumPy scalars and arrays (anything else as text)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def tune_config(
    path: str | Path,
    *,
    algorithms: list[str] | None = None,
    seconds: float = 600.0,
    max_trials: int | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """``hyfl tune CONFIG``: tune each algorithm of an experiment config.

    Each ``[algorithms.LABEL]`` table is tuned on the config's data,
    partition, participation, budget and costs (its first seed), with the
    bounds of ``[tune.bounds]`` over the paper's defaults
    (:data:`hyfl.experiments.tuning.DEFAULT_BOUNDS`). ``[tune] seconds`` and
    ``max_trials`` in the config are used when not given here. Results go to
    ``<out>/<label>/`` (trials.csv, best.toml, tuning.json).

    Returns
    -------
    dict
        ``label -> TuneResult``.
    """
    from hyfl.experiments.config import load_config
    from hyfl.experiments.tuning import tune

    config = load_config(path)
    settings = dict(config.tune)
    labels = algorithms or [entry.label for entry in config.algorithms]
    out = Path(out_dir) if out_dir is not None else config.default_out() / "tuning"
    results = {}
    for label in labels:
        try:
            entry = config.algorithm(label)
        except KeyError:
            known = ", ".join(e.label for e in config.algorithms)
            raise fail(
                "--algorithm", f"{label!r} is not in {path}", f"Use one of: {known}"
            ) from None
        spec = config.spec(label, config.seeds[0])
        bounds = settings.get("bounds", {})
        bounds = bounds.get(label, bounds.get(entry.algorithm, bounds))
        results[label] = tune(
            spec,
            entry.algorithm,
            seconds=float(settings.get("seconds", seconds)),
            max_trials=settings.get("max_trials", max_trials),
            bounds={k: v for k, v in bounds.items() if not isinstance(v, dict)} or None,
            seed=seed,
            out_dir=out / label,
            progress=progress,
        )
    return results
