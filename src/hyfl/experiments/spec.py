"""What one run is: its specification, the data it loads and prepares, what it yields.

:class:`RunSpec` holds everything that defines a run (what ``hyfl run``'s flags and a
config's tables describe); :func:`load_split` and :func:`add_intercept`,
:func:`sample_weights` and :func:`scale_features` turn its data description into the
training and validation data; :class:`Setup` is a prepared run and :class:`RunOutcome`
a finished one. Running is :mod:`hyfl.experiments.runner`'s; writing the results
:mod:`hyfl.experiments.outputs`'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyfl._names import CLASS_WEIGHTS, HYPERPARAMETER_FLAGS
from hyfl.algorithms import algorithm_names, check_algorithm_options
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.costs import (
    DEFAULT_HE_COSTS,
    DEFAULT_HE_LAYOUT,
    CostModel,
    check_he_costs,
    check_he_layout,
    layout_slots,
    resolve_he_costs,
)
from hyfl.data import is_party_spec, load_party_data, train_validation
from hyfl.data.dataset import INTERCEPT_SCALING, parse_intercept, with_intercept
from hyfl.errors import check_bool, check_choice, check_int, fail
from hyfl.losses import LOSSES
from hyfl.partition import with_constant_feature
from hyfl.privacy.ciphers import CIPHERS, check_keybits, make_cipher
from hyfl.privacy.secure_scaling import scale_columns, secure_feature_scales
from hyfl.runtime.simulation import (
    RunResult,
    Validation,
    budget_record,
    check_sim_time_budget,
)

DEFAULT_PARTITION = "grid:3x3"
DEFAULT_PARTICIPATION = "0.5"  # the paper's random half, for partitions of one dataset


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
    participation: str | None = None
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

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **values: Any) -> RunSpec:
        """A spec from options by name, such as a command's parameters (``ctx.params``).

        Takes the names that are fields of :class:`RunSpec` from ``options`` and
        ``values`` (which win) and ignores the others; ``intercept`` may be a flag's
        text (``"1"``, ``"off"``: :func:`~hyfl.data.dataset.parse_intercept`).
        """
        known = {f.name for f in dataclasses.fields(cls)}
        chosen = {k: v for k, v in {**options, **values}.items() if k in known}
        if "intercept" in chosen:
            chosen["intercept"] = parse_intercept(chosen["intercept"])
        return cls(**chosen)

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
        check_bool("standardize", self.standardize,
                   fix="Pass --standardize (in a config: standardize = true).")
        check_algorithm_options(self.hyper)
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

    def participation_spec(self) -> str:
        """The participation actually used: the given one, else every party every round
        for party files (organisations, which take part in every round of their job) and
        ``0.5`` (the paper's random half) for a partition of one dataset."""
        if self.participation is not None:
            return self.participation
        return "full" if self.uses_party_files() else DEFAULT_PARTICIPATION

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

    def hyper_by_algorithm(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """Each compared algorithm's hyperparameters: an option goes to the algorithms of
        ``names`` that take it, one that none of them takes is refused
        (:func:`hyfl.algorithms.hyperparameters_by_algorithm`)."""
        from hyfl.algorithms import hyperparameters_by_algorithm

        return hyperparameters_by_algorithm(names, self.hyper)


def hyper_from_options(options: Mapping[str, Any], params: list[str] | None) -> dict[str, Any]:
    """The hyperparameters of a command's options: the flags of
    :data:`~hyfl._names.HYPERPARAMETER_FLAGS` given (not None), then every ``--param
    KEY=VALUE`` (:func:`parse_params`) over them."""
    named = {k: options[k] for k in HYPERPARAMETER_FLAGS if options.get(k) is not None}
    return {**named, **parse_params(params)}


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``["mu=0.1", "fedavg.a=0.5"]`` -> ``{"mu": 0.1, "fedavg.a": 0.5}``
    (values: :func:`parse_param_value`)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise fail(f"--param {item!r}", "is not KEY=VALUE", "Write e.g. --param mu=0.1.")
        out[key.strip()] = parse_param_value(value.strip())
    return out


def parse_param_value(text: str) -> Any:
    """A ``--param`` value: an int, a float, ``true``/``false``, a list (``[1,2]``,
    ``1,2`` or ``[]``: the TOML arrays of a config, e.g. FedHybrid's per-client ``a``)
    or else the text itself."""
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [parse_param_value(v.strip()) for v in inner.split(",")] if inner else []
    if "," in text:
        return [parse_param_value(v.strip()) for v in text.split(",")]
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


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
