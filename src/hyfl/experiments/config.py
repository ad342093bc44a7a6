"""Experiment configs: one TOML file describes one experiment.

``hyfl run CONFIG.toml`` runs every (algorithm, seed) pair of the file on
one prepared data set and partition per seed, and writes a results folder
(see :func:`hyfl.experiments.runner.run_experiment`). :func:`load_config`
reads and validates a file into an :class:`ExperimentConfig`; every error
names the table, the key and the file, e.g.::

    [algorithms.fedavg] a: must be > 0, got -1 (in configs/x.toml). Pass ...

Full example (every key; the commented ones are optional, shown with their
defaults)::

    [experiment]
    name = "mnist-8-0.1"              # default: the file name without .toml
    # description = "..."             # free text, kept in the resolved config
    seeds = [0, 1, 2]                 # one run per seed and algorithm; default [0]
    eval_every = 10                   # evaluate every N outer iterations; default 1
    budget = { iterations = 2500 }    # or { sim_time = 10800.0, max_iterations = 1000000 }
    # full_budget = { iterations = 30000 }  # the budget `hyfl study --full` runs instead
    #                                 # (a paper study's full budget when `budget` is scaled)
    # out = "runs/mnist-8-0.1"        # results folder; default runs/<name>; --out overrides
    # checkpoint_every = 100          # rounds between checkpoints; default: by wall time
    # checkpoint_seconds = 60.0       # wall time between checkpoints when checkpoint_every
    #                                 # is not given

    [data]
    dataset = "mnist"                 # a registered name (`hyfl datasets`), a file path,
                                      # or a party-file spec "parties:..." (passed through)
    loss = "hinge"                    # hinge | logistic | squared | smoothed_hinge; default hinge
    lam = 1e-3                        # default: the dataset's (paper's lambdas), else 1/N
    # intercept = false               # a bias: true (a constant column of value 1), a
    #                                 # positive value for the column, or false; default true
    # class_weight = "balanced"       # weight each class's loss by N / (C n_c); default none
    # standardize = true              # scale features by a secure sum; default false
    val_fraction = 0.2                # hold out this fraction; or val = "name or path"
    # data_dir = "../shared/data"     # folder with dataset files

    # Party files instead of dataset (one CSV/Parquet table per client, see
    # hyfl.data.parties); they define the partition, so [partition] spec is left
    # out (or "parties"); validation: val = "parties:..." or val_fraction.
    # [data.parties]
    # files = { hospital = "a.csv", lab = "b.parquet" }   # or a list of paths
    # id_column = "patient"             # and any other hyfl.data.load_parties option

    [partition]
    spec = "quadrant:8"               # horizontal:K | vertical:Q | grid:KxQ | nonzero:KxQ | ...
                                      # (party files: leave out, or "parties")
    participation = "0.1"             # full | a fraction (string or number) | cyclic:C |
                                      # trace:FILE; default full

    [costs]                           # the whole table is optional
    cipher = "none"                   # a name of hyfl.privacy.ciphers.CIPHERS; default none
    key_bits = 2048                   # Paillier modulus; default: the cipher's (2048)
    latency = 0.2575                  # seconds per round trip; default 0
    he_costs = "auto"                 # auto | paper | measured | a cipher name | FILE;
                                      # default auto: the running cipher's own costs
                                      # (none: no HE time), see hyfl.costs
    he_layout = "cipher"              # which ciphertexts are counted: cipher | sample |
                                      # a cipher name; default cipher (the running one's)

    [algorithms.hyfdca]               # one table per algorithm (at least one)
    iic = 0.001

    [algorithms.fedavg]
    iic = 0.02
    a = 0.1
    b = 1.0

    [algorithms.fedavg-slow]          # a second FedAvg: the label is free when
    algorithm = "fedavg"              # `algorithm` names the registered algorithm
    iic = 0.02
    a = 0.01

    [tune]                            # hyperparameter search settings: kept as given
    # ...

The table name under ``algorithms`` is the run's label (its results folder);
it is the registered algorithm (``hyfl algorithms``) unless the table names
one with ``algorithm = "..."``. Every other key is a hyperparameter that
algorithm accepts, checked against the registry. Budgets: ``iterations``
runs that many outer iterations; ``sim_time`` runs until the cumulative
simulated time reaches that many seconds (the round that crosses it is the
last), at most ``max_iterations`` rounds (required with ``sim_time``).

Relative file paths (``dataset``, ``val``, ``data_dir``, ``he_costs``,
``trace:FILE``, string ``parties``) are read relative to the config file's
folder when such a file exists there, else relative to the working folder.
:meth:`ExperimentConfig.to_toml` writes the resolved config: every default
filled in, ``lam`` resolved, found paths made absolute; loading it gives the
same :class:`ExperimentConfig`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from hyfl._names import CLASS_WEIGHTS, HYPERPARAMETER_FLAGS, INTERCEPT_SCALING
from hyfl.errors import HyflError, fail

DEFAULT_CHECKPOINT_SECONDS = 60.0
DEFAULT_RESULTS_ROOT = "runs"

SECTIONS = ("experiment", "data", "partition", "costs", "algorithms", "tune")
EXPERIMENT_KEYS = (
    "name",
    "description",
    "seeds",
    "eval_every",
    "budget",
    "full_budget",
    "out",
    "checkpoint_every",
    "checkpoint_seconds",
)
BUDGET_KEYS = ("iterations", "sim_time", "max_iterations")
DATA_KEYS = ("dataset", "loss", "lam", "intercept", "class_weight", "standardize", "val",
             "val_fraction", "data_dir", "parties")
PARTITION_KEYS = ("spec", "participation")
COSTS_KEYS = ("cipher", "key_bits", "latency", "he_costs", "he_layout")


@dataclass(frozen=True)
class Budget:
    """How long each run lasts: ``iterations``, or ``sim_time`` capped by ``max_iterations``."""

    iterations: int | None = None
    sim_time: float | None = None
    max_iterations: int | None = None

    @property
    def rounds(self) -> int:
        """The most outer iterations a run may take."""
        return int(self.iterations if self.sim_time is None else self.max_iterations)

    def to_dict(self) -> dict[str, Any]:
        if self.sim_time is None:
            return {"iterations": int(self.iterations)}
        return {"sim_time": float(self.sim_time), "max_iterations": int(self.max_iterations)}


@dataclass(frozen=True)
class ExperimentSection:
    name: str
    budget: Budget
    seeds: tuple[int, ...] = (0,)
    full_budget: Budget | None = None
    eval_every: int = 1
    description: str | None = None
    out: str | None = None
    checkpoint_every: int | None = None
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS


@dataclass(frozen=True)
class DataSection:
    dataset: str
    lam: float | None  # None: 1 / N of the loaded training data (data/registry.py)
    loss: str = "hinge"
    val: str | None = None
    val_fraction: float | None = None
    data_dir: str | None = None
    parties: Any = None
    intercept: float | None = INTERCEPT_SCALING
    class_weight: str | None = None
    standardize: bool = False

    def has_party_files(self) -> bool:
        from hyfl.data import is_party_spec

        return self.parties is not None or is_party_spec(self.dataset)


@dataclass(frozen=True)
class PartitionSection:
    spec: str | None = None  # None: the party files' partition
    participation: str = "full"


@dataclass(frozen=True)
class CostsSection:
    cipher: str = "none"
    key_bits: int | None = None
    latency: float = 0.0
    he_costs: str = "auto"
    he_layout: str = "cipher"


@dataclass(frozen=True)
class AlgorithmConfig:
    """One ``[algorithms.LABEL]`` table: a label, a registered algorithm, its hyperparameters."""

    label: str
    algorithm: str
    hyper: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """One run of an experiment: an algorithm (by label) and a seed."""

    label: str
    seed: int
    spec: Any  # RunSpec


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment config (see the module docstring for the schema)."""

    experiment: ExperimentSection
    data: DataSection
    partition: PartitionSection
    costs: CostsSection
    algorithms: tuple[AlgorithmConfig, ...]
    tune: dict[str, Any] = field(default_factory=dict)
    source: str | None = field(default=None, compare=False)
    #: Values that command-line flags set over the file: ``table.key`` ->
    #: ``{"value", "from" (the flags), "config" (the file's value, None if unset)}``.
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        return self.experiment.name

    @property
    def seeds(self) -> tuple[int, ...]:
        return self.experiment.seeds

    @property
    def budget(self) -> Budget:
        return self.experiment.budget

    def algorithm(self, label: str) -> AlgorithmConfig:
        for entry in self.algorithms:
            if entry.label == label:
                return entry
        raise KeyError(label)

    def spec(self, label: str, seed: int):
        """The :class:`~hyfl.experiments.runner.RunSpec` of algorithm ``label`` and ``seed``."""
        from hyfl.experiments.spec import RunSpec

        entry = self.algorithm(label)
        e, d, p, c = self.experiment, self.data, self.partition, self.costs
        return RunSpec(
            algorithm=entry.algorithm,
            data=d.dataset,
            val=d.val,
            val_fraction=d.val_fraction,
            loss=d.loss,
            lam=d.lam,
            intercept=d.intercept,
            class_weight=d.class_weight,
            standardize=d.standardize,
            partition=p.spec,
            participation=p.participation,
            hyper=dict(entry.hyper),
            iterations=e.budget.rounds,
            sim_time=e.budget.sim_time,
            eval_every=e.eval_every,
            seed=int(seed),
            data_dir=d.data_dir,
            cipher=c.cipher,
            key_bits=c.key_bits,
            latency=c.latency,
            he_costs=c.he_costs,
            he_layout=c.he_layout,
            parties=d.parties,
        )

    def jobs(self) -> list[Job]:
        """Every (algorithm, seed) run, seed by seed (runs of one seed share a set-up)."""
        return [
            Job(entry.label, seed, self.spec(entry.label, seed))
            for seed in self.experiment.seeds
            for entry in self.algorithms
        ]

    def run_specs(self) -> list:
        """One :class:`~hyfl.experiments.runner.RunSpec` per algorithm and seed."""
        return [job.spec for job in self.jobs()]

    def default_out(self) -> Path:
        """``[experiment] out``, else ``runs/<name>``."""
        if self.experiment.out is not None:
            return Path(self.experiment.out)
        return Path(DEFAULT_RESULTS_ROOT) / self.experiment.name

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as TOML-ready tables (``None`` values left out)."""
        experiment = {k: v for k, v in asdict(self.experiment).items() if v is not None}
        experiment["seeds"] = list(self.experiment.seeds)
        experiment["budget"] = self.experiment.budget.to_dict()
        if self.experiment.full_budget is not None:
            experiment["full_budget"] = self.experiment.full_budget.to_dict()
        out: dict[str, Any] = {
            "experiment": experiment,
            "data": _without_none(
                {
                    k: getattr(self.data, k)
                    for k in DATA_KEYS
                    if not (k == "dataset" and self.data.parties is not None)
                }
            ) | {"intercept": False if self.data.intercept is None else self.data.intercept},
            "partition": _without_none(asdict(self.partition)),
            "costs": _without_none(asdict(self.costs)),
            "algorithms": {
                entry.label: {
                    **({"algorithm": entry.algorithm} if entry.algorithm != entry.label else {}),
                    **entry.hyper,
                }
                for entry in self.algorithms
            },
        }
        if self.tune:
            out["tune"] = self.tune
        return out

    def to_toml(self) -> str:
        """The resolved config as TOML text (see :meth:`to_dict`)."""
        import tomli_w

        header = (
            f"# Resolved hyfl experiment config{f' (from {self.source})' if self.source else ''}\n"
        )
        for key, record in self.overrides.items():
            header += (
                f"# {key} = {record['value']!r} from {record['from']} "
                f"(the config file had {record['config']!r})\n"
            )
        return header + tomli_w.dumps(self.to_dict())


def _without_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# ---------------------------------------------------------------------------
# Loading and validation
# ---------------------------------------------------------------------------


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """The raw tables of a TOML file (errors name the file and the line)."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8-sig")  # tolerate a UTF-8 byte order mark
    except UnicodeDecodeError as err:
        raise fail(
            f"config file {str(p)!r}",
            f"is not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})",
            "TOML files must be UTF-8; save it as UTF-8 (not UTF-16 or Latin-1).",
        ) from None
    except FileNotFoundError:
        raise fail(f"config file {str(p)!r}", "does not exist", "Check the path.") from None
    except OSError as err:
        raise fail(
            f"config file {str(p)!r}", f"cannot be read ({err})", "Check the path."
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise fail(
            f"config file {str(p)!r}", f"is not valid TOML: {err}", "Fix the syntax."
        ) from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise fail(f"config file {str(p)!r}", "is nested too deeply to read",
                   "Fix the syntax (a config nests a few levels deep).") from None


def load_config(path: str | os.PathLike) -> ExperimentConfig:
    """Read and validate an experiment config file.

    ``hyfl run CONFIG --flags`` overrides the file's values with the flags (see
    :func:`apply_overrides`).

    Parameters
    ----------
    path : path

    Raises
    ------
    HyflError
        Naming the table, the key and the file.
    """
    raw = read_toml(path)
    return parse_config(raw, source=str(path), base=Path(path).resolve().parent)


# Flags of `hyfl run` and where they go in a config (flags given override the config).
FLAG_KEYS = {
    "data": ("data", "dataset"),
    "val": ("data", "val"),
    "val_fraction": ("data", "val_fraction"),
    "loss": ("data", "loss"),
    "lam": ("data", "lam"),
    "intercept": ("data", "intercept"),
    "class_weight": ("data", "class_weight"),
    "standardize": ("data", "standardize"),
    "data_dir": ("data", "data_dir"),
    "partition": ("partition", "spec"),
    "participation": ("partition", "participation"),
    "cipher": ("costs", "cipher"),
    "key_bits": ("costs", "key_bits"),
    "latency": ("costs", "latency"),
    "he_costs": ("costs", "he_costs"),
    "he_layout": ("costs", "he_layout"),
    "eval_every": ("experiment", "eval_every"),
    "seed": ("experiment", "seeds"),
    "iterations": ("experiment", "budget"),
}
HYPER_FLAGS = (*HYPERPARAMETER_FLAGS, "param")


def load_config_with_flags(path: str | os.PathLike, flags: Mapping[str, Any],
                           hyper: Mapping[str, Any], algorithm: str) -> ExperimentConfig:
    """``hyfl run CONFIG``: the config at ``path`` with the command line's flags over it.

    Parameters
    ----------
    path : path-like
        The config file.
    flags : mapping
        The flags given on the command line (``hyfl run``'s parameter names), and only
        those: each replaces its config value (:data:`FLAG_KEYS`); ``--algorithm`` or a
        hyperparameter flag (:data:`HYPER_FLAGS`) sets that algorithm's table.
    hyper : mapping
        The hyperparameters the flags make up.
    algorithm : str
        The algorithm they are for (``--algorithm``, given or its default).

    Returns
    -------
    ExperimentConfig
        Its ``overrides`` record what each flag replaced (the command prints it).
    """
    overrides: dict[str, dict] = {}
    flag_of: dict[str, str] = {}
    for name, (section, key) in FLAG_KEYS.items():
        if name in flags:
            value = flags[name]
            if name == "seed":
                value = [value]
            elif name == "iterations":
                value = {"iterations": value}
            elif isinstance(value, os.PathLike):
                value = os.fspath(value)
            overrides.setdefault(section, {})[key] = value
            flag_of[f"{section}.{key}"] = "--" + name.replace("_", "-")
    raw = read_toml(path)
    algorithm_flags = [n for n in ("algorithm", *HYPER_FLAGS) if n in flags]
    if algorithm_flags:
        listed = raw.get("algorithms") if isinstance(raw.get("algorithms"), dict) else {}
        name = algorithm
        if "algorithm" not in flags and name not in listed:
            raise fail(
                ", ".join("--" + n.replace("_", "-") for n in algorithm_flags),
                f"would set hyperparameters of {name}, which the config does not run",
                f"Name the algorithm with --algorithm (the config runs {', '.join(listed)}).",
            )
        entry = listed.get(name) if isinstance(listed.get(name), dict) else {}
        if "algorithm" in flags:
            overrides["algorithms"] = {name: {**entry, **hyper}}
        else:  # hyperparameters only: the config's other algorithms stay
            overrides["algorithms"] = {**listed, name: {**entry, **hyper}}
        flag_of["algorithms"] = ", ".join("--" + n.replace("_", "-") for n in algorithm_flags)
    raw, record = apply_overrides(raw, overrides, flag_of)
    config = parse_config(raw, source=str(path), base=Path(path).resolve().parent)
    return replace(config, overrides=record)


def apply_overrides(
    raw: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]],
    flags: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``raw`` with the values of ``overrides`` in place of its own: flags win over the file.

    Parameters
    ----------
    raw : mapping
        The config file's tables.
    overrides : mapping
        ``{table: {key: value}}`` from the command line. The ``algorithms``
        table replaces the file's whole table (the flags name the algorithms to
        run); other tables are replaced key by key, and the validation set
        (``val``/``val_fraction``) counts as one setting.
    flags : mapping, optional
        ``table.key`` -> the flags that set it, for the record.

    Returns
    -------
    merged : dict
        The tables to validate (``raw`` is not modified).
    record : dict
        ``table.key`` -> ``{"value": the flag's value, "from": the flags,
        "config": the file's value or None}`` for every value a flag set.
    """
    flags = flags or {}
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    record: dict[str, dict[str, Any]] = {}

    def note(name: str, value: Any, before: Any) -> None:
        record[name] = {"value": value, "from": flags.get(name, name), "config": before}

    for section, values in overrides.items():
        if section == "algorithms":
            note("algorithms", dict(values), merged.get("algorithms"))
            merged["algorithms"] = dict(values)
            continue
        target = merged.setdefault(section, {})
        if not isinstance(target, dict):
            continue  # reported by validation
        for key, value in values.items():
            if section == "data" and key in ("val", "val_fraction"):
                other = "val_fraction" if key == "val" else "val"
                note(f"data.{key}", value, target.get(key, target.get(other)))
                target.pop(other, None)
            else:
                note(f"{section}.{key}", value, target.get(key))
            target[key] = value
    return merged, record


def parse_config(
    raw: Mapping[str, Any], *, source: str | None = None, base: Path | None = None
) -> ExperimentConfig:
    """Validate raw TOML tables into an :class:`ExperimentConfig` (see :func:`load_config`)."""
    v = _Validator(source, base)
    v.known_keys("", raw, SECTIONS)
    for section in ("experiment", "data", "partition", "costs", "tune"):
        if section in raw and not isinstance(raw[section], Mapping):
            raise v.error(
                section, "", "must be a table", f"Write it as [{section}] with keys below it."
            )
    for required in ("experiment", "data", "algorithms"):
        if required not in raw:
            raise v.error(required, "", "is missing", f"Add a [{required}] table.")

    experiment = v.experiment(raw["experiment"])
    data = v.data(raw["data"])
    partition = v.partition(raw.get("partition", {}), party_files=data.has_party_files())
    costs = v.costs(raw.get("costs", {}))
    algorithms = v.algorithms(raw["algorithms"])
    config = ExperimentConfig(
        experiment=experiment,
        data=data,
        partition=partition,
        costs=costs,
        algorithms=algorithms,
        tune=dict(raw.get("tune", {})),
        source=source,
    )
    for job in config.jobs():  # the runner's own checks, as a last net
        try:
            job.spec.validated()
        except HyflError as err:
            raise v.error(f"algorithms.{job.label}", "", str(err).rstrip("."), "") from None
    return config


_KIND_NAMES = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "list": "a list of numbers",
}


def hyperparameter_kinds(name: str) -> dict[str, tuple[str, ...]]:
    """The TOML value kinds each hyperparameter of algorithm ``name`` takes.

    The schema is the algorithm dataclass's own annotations (``int``,
    ``float | str``, ``tuple[float, ...]`` ...), so it cannot drift from the
    code: each annotated type maps to a kind among ``bool``, ``int``,
    ``float`` (also accepts integers), ``str`` and ``list`` (of numbers).
    """
    import dataclasses

    from hyfl.algorithms import ALGORITHMS

    out: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(ALGORITHMS[name].cls):
        kinds = []
        for part in str(f.type).split("|"):
            part = part.strip().strip("'\"")
            kind = "list" if part.startswith(("tuple", "list")) else part
            if kind in _KIND_NAMES:
                kinds.append(kind)
        out[f.name] = tuple(kinds) or ("bool", "int", "float", "str", "list")
    return out


def _matches(value: Any, kinds: tuple[str, ...]) -> bool:
    if isinstance(value, bool):
        return "bool" in kinds
    if isinstance(value, int):
        return "int" in kinds or "float" in kinds
    if isinstance(value, float):
        return "float" in kinds or ("int" in kinds and value.is_integer())
    if isinstance(value, str):
        return "str" in kinds
    if isinstance(value, list):
        return "list" in kinds and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        )
    return False


def _describe(kinds: tuple[str, ...]) -> str:
    return " or ".join(_KIND_NAMES[k] for k in kinds)


class _Validator:
    """Typed reads of raw TOML values with errors naming table, key and file."""

    def __init__(self, source: str | None, base: Path | None):
        self.source, self.base = source, base

    # -- errors ----------------------------------------------------------------
    def error(self, section: str, key: str, problem: str, fix: str) -> HyflError:
        """``"[section] key: problem (in FILE). fix"``."""
        where = f"[{section}] {key}:" if key else f"[{section}]:"
        located = f"{problem} (in {self.source})" if self.source else problem
        return HyflError(f"{where} {located}." + (f" {fix}" if fix else ""))

    def wrap(self, section: str, key: str, err: HyflError) -> HyflError:
        """Re-locate a library error (``"<name> <problem>. <fix>"``) at a config key."""
        text = str(err)
        for prefix in (f"{key} ", f"--{key.replace('_', '-')} "):
            if key and text.startswith(prefix):
                text = text[len(prefix) :]
                break
        problem, sep, fix = text.partition(". ")
        if not sep:
            problem, fix = text.rstrip("."), ""
        return self.error(section, key, problem, fix)

    def known_keys(self, section: str, table: Mapping, known) -> None:
        for key in table:
            if key not in known:
                if section:
                    raise self.error(
                        section,
                        str(key),
                        "is not a known key",
                        f"Known keys of [{section}]: {', '.join(known)}.",
                    )
                raise self.error(
                    str(key), "", "is not a known table", f"Known tables: {', '.join(known)}."
                )

    # -- scalars ---------------------------------------------------------------
    def choice(self, section, table, key, default, options) -> str:
        """A text value that must be one of ``options`` (a registry)."""
        value = self.text(section, table, key, default)
        if value not in options:
            raise self.error(
                section,
                key,
                f"is {value!r}, which is not known",
                f"Choose one of: {', '.join(options)}.",
            )
        return value

    def text(self, section, table, key, default=None, *, required=False) -> str | None:
        if key not in table:
            if required:
                raise self.error(section, key, "is missing", f'Add {key} = "...".')
            return default
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            raise self.error(
                section, key, f"must be a non-empty string, got {value!r}", "Quote it."
            )
        return value.strip()

    def flag(self, section, table, key, default: bool) -> bool:
        """A true/false value."""
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise self.error(section, key, f"must be true or false, got {value!r}",
                             f"Write {key} = true or {key} = false.")
        return value

    def integer(self, section, table, key, default=None, *, minimum=0, required=False):
        if key not in table:
            if required:
                raise self.error(section, key, "is missing", f"Add {key} = <integer>.")
            return default
        return self.as_int(section, key, table[key], minimum)

    def as_int(self, section, key, value, minimum) -> int:
        ok = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not ok:
            raise self.error(
                section,
                key,
                f"must be an integer, got {value!r}",
                f"Write an integer >= {minimum}.",
            )
        if value < minimum:
            raise self.error(
                section,
                key,
                f"must be >= {minimum}, got {value!r}",
                f"Write an integer >= {minimum}.",
            )
        return int(value)

    def number(
        self, section, table, key, default=None, *, low=None, low_open=False, high=None, fix=""
    ) -> float | None:
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(section, key, f"must be a number, got {value!r}", fix)
        value = float(value)
        if not math.isfinite(value):
            raise self.error(section, key, f"must be finite, got {value!r}", fix)
        if low is not None and (value <= low if low_open else value < low):
            raise self.error(
                section, key, f"must be {'>' if low_open else '>='} {low:g}, got {value:g}", fix
            )
        if high is not None and value > high:
            raise self.error(section, key, f"must be <= {high:g}, got {value:g}", fix)
        return value

    def path(self, value: str) -> str:
        """An existing file or folder relative to the config file, made absolute."""
        if self.base is None or os.path.isabs(value):
            return value
        candidate = self.base / value
        return str(candidate.resolve()) if candidate.exists() else value

    # -- tables ----------------------------------------------------------------
    def experiment(self, table: Mapping) -> ExperimentSection:
        s = "experiment"
        self.known_keys(s, table, EXPERIMENT_KEYS)
        default_name = Path(self.source).stem if self.source else None
        name = self.text(s, table, "name", default_name, required=default_name is None)
        if any(sep in name for sep in ("/", "\\")) or name in (".", ".."):
            raise self.error(s, "name", f"is {name!r}", "Use a name without path separators.")
        seeds = table.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds:
            raise self.error(
                s,
                "seeds",
                f"must be a non-empty list of integers, got {seeds!r}",
                "Write e.g. seeds = [0, 1, 2].",
            )
        seeds = tuple(self.as_int(s, "seeds", seed, 0) for seed in seeds)
        if len(set(seeds)) != len(seeds):
            raise self.error(s, "seeds", f"has repeated seeds {list(seeds)}", "List each once.")
        checkpoint_seconds = self.number(
            s,
            table,
            "checkpoint_seconds",
            DEFAULT_CHECKPOINT_SECONDS,
            low=0,
            low_open=True,
            fix="Write wall-clock seconds between checkpoints, e.g. 60.",
        )
        return ExperimentSection(
            name=name,
            budget=self.budget(table),
            full_budget=self.budget(table, "full_budget") if "full_budget" in table else None,
            seeds=seeds,
            eval_every=self.integer(s, table, "eval_every", 1, minimum=1),
            description=self.text(s, table, "description"),
            out=self.text(s, table, "out"),
            checkpoint_every=self.integer(s, table, "checkpoint_every", None, minimum=1),
            checkpoint_seconds=checkpoint_seconds,
        )

    def budget(self, table: Mapping, key: str = "budget") -> Budget:
        s = "experiment"
        example = "budget = { iterations = 2000 } or { sim_time = 3600.0, max_iterations = 100000 }"
        if key not in table:
            raise self.error(s, key, "is missing", f"Add {example}.")
        b = table[key]
        if not isinstance(b, Mapping):
            raise self.error(s, key, f"must be a table, got {b!r}", f"Write {example}.")
        for k in b:
            if k not in BUDGET_KEYS:
                raise self.error(
                    s, f"{key}.{k}", "is not a known key", f"Known keys: {', '.join(BUDGET_KEYS)}."
                )
        if ("iterations" in b) == ("sim_time" in b):
            raise self.error(
                s,
                key,
                f"must give exactly one of iterations and sim_time, got {dict(b)}",
                f"Write {example}.",
            )
        if "iterations" in b:
            if "max_iterations" in b:
                raise self.error(
                    s,
                    f"{key}.max_iterations",
                    "applies only with sim_time",
                    "Remove it, or budget by sim_time.",
                )
            return Budget(iterations=self.as_int(s, f"{key}.iterations", b["iterations"], 1))
        sim_time = self.number(
            s,
            {f"{key}.sim_time": b["sim_time"]},
            f"{key}.sim_time",
            low=0,
            low_open=True,
            fix="Write simulated seconds, e.g. 10800.0.",
        )
        if "max_iterations" not in b:
            raise self.error(
                s,
                f"{key}.max_iterations",
                "is required with sim_time",
                "Add a cap on outer iterations, e.g. max_iterations = 1000000.",
            )
        return Budget(
            sim_time=sim_time,
            max_iterations=self.as_int(s, f"{key}.max_iterations", b["max_iterations"], 1),
        )

    def data(self, table: Mapping) -> DataSection:
        from hyfl.data import dataset_names, default_lambda
        from hyfl.data.dataset import parse_intercept
        from hyfl.losses import LOSSES

        s = "data"
        self.known_keys(s, table, DATA_KEYS)
        parties = None
        if "parties" in table:
            if "dataset" in table:
                raise self.error(
                    s,
                    "dataset, parties",
                    "are both given",
                    "Give a dataset, or party files in [data.parties], not both.",
                )
            parties = self.parties(table["parties"])
            dataset = parties.get("name", "parties")
        else:
            dataset = self.text(s, table, "dataset", required=True)
        names = dataset_names()
        registered = dataset in names or dataset.partition(":")[0] in names
        if parties is not None:
            pass
        elif dataset.startswith("parties:"):
            dataset = self.party_spec(dataset)
        elif not registered:
            dataset = self.path(dataset)
            if not Path(dataset).exists():
                raise self.error(
                    s,
                    "dataset",
                    f"is {dataset!r}, neither a registered dataset nor a file",
                    f"Use one of: {', '.join(names)}; or give the path of a data file.",
                )
        loss = self.choice(s, table, "loss", "hinge", LOSSES)
        lam = self.number(
            s,
            table,
            "lam",
            None,
            low=0,
            low_open=True,
            fix="Write a positive regularization, e.g. lam = 1e-4 (or leave it out).",
        )
        if lam is None:  # data without a paper value: 1 / N, resolved once loaded
            lam = default_lambda(dataset)
        try:  # true, false, a positive number, or a flag's text ("off", "10")
            intercept = parse_intercept(table.get("intercept", True))
        except HyflError:
            raise self.error(s, "intercept", f"must be true, false or a positive number, got "
                             f"{table['intercept']!r}", "Write intercept = true (a constant "
                             "column of value 1), a positive value such as 10, or false.") from None
        if "val" in table and "val_fraction" in table:
            raise self.error(s, "val, val_fraction", "are both given", "Give only one of them.")
        val = self.text(s, table, "val")
        if val is not None and val not in names:
            val = self.path(val)
        val_fraction = self.number(
            s,
            table,
            "val_fraction",
            None,
            low=0,
            low_open=True,
            high=1,
            fix="Write a fraction in (0, 1), e.g. val_fraction = 0.2.",
        )
        if val_fraction is not None and val_fraction >= 1:
            raise self.error(
                s,
                "val_fraction",
                f"must be < 1, got {val_fraction:g}",
                "Write a fraction in (0, 1), e.g. val_fraction = 0.2.",
            )
        data_dir = self.text(s, table, "data_dir")
        if data_dir is not None:
            data_dir = self.path(data_dir)
        if val is not None and val.startswith("parties:"):
            val = self.party_spec(val)
        return DataSection(
            dataset=dataset,
            lam=lam,
            loss=loss,
            intercept=intercept,
            class_weight=(self.choice(s, table, "class_weight", None, CLASS_WEIGHTS)
                          if "class_weight" in table else None),
            standardize=self.flag(s, table, "standardize", False),
            val=val,
            val_fraction=val_fraction,
            data_dir=data_dir,
            parties=parties,
        )

    def parties(self, value: Any) -> dict[str, Any]:
        """A ``[data.parties]`` table: ``files`` paths resolved, options checked by name."""
        from hyfl.data.party_spec import PARTY_OPTIONS

        s, fix = "data", 'Write [data.parties] with files = { a = "a.csv", b = "b.parquet" }.'
        if not isinstance(value, Mapping):
            raise self.error(s, "parties", f"must be a table, got {value!r}", fix)
        self.known_keys("data.parties", value, ("files", *PARTY_OPTIONS))
        kinds = {"psi": bool, "min_common": int, "id_column": str, "unlabeled": str}
        kinds.update(task=str, name=str, scope=str)
        for key, kind in kinds.items():
            if key in value and (
                not isinstance(value[key], kind) or (kind is int and isinstance(value[key], bool))
            ):
                expected = {bool: "true or false", int: "an integer", str: "a string"}[kind]
                raise self.error(
                    s,
                    f"parties.{key}",
                    f"must be {expected}, got {value[key]!r}",
                    f"Write {key} = <{expected}>.",
                )
        files = value.get("files")
        if isinstance(files, Mapping) and files and all(isinstance(f, str) for f in files.values()):
            files = {name: self.path(f) for name, f in files.items()}
        elif isinstance(files, list) and files and all(isinstance(f, str) for f in files):
            files = [self.path(f) for f in files]
        else:
            raise self.error(s, "parties.files", f"must name party files, got {files!r}", fix)
        return {**value, "files": files}

    def party_spec(self, spec: str) -> str:
        """A ``parties:`` spec with its relative paths resolved against the config's folder."""
        from hyfl.data import parse_party_spec

        files, _ = parse_party_spec(spec)
        head, sep, options = spec[len("parties:") :].partition(";")
        entries = [f"{name}={self.path(str(path))}" for name, path in files.items()]
        return "parties:" + ",".join(entries) + (sep + options if sep else "")

    def partition(self, table: Mapping, *, party_files: bool = False) -> PartitionSection:
        from hyfl.experiments.spec import PARTY_PARTITION
        from hyfl.participation import parse_participation
        from hyfl.partition import PARTITIONS, SPEC_PATTERN, parse_sample_split

        s = "partition"
        self.known_keys(s, table, PARTITION_KEYS)
        spec = self.text(s, table, "spec", required=not party_files)
        if party_files and spec not in (None, PARTY_PARTITION):
            raise self.error(
                s,
                "spec",
                f"is {spec!r}, but party files bring their own partition",
                f"Leave spec out (or write spec = {PARTY_PARTITION!r}) with party files.",
            )
        spec = PARTY_PARTITION if party_files else spec
        forms = ", ".join(kind.form for kind in PARTITIONS.values())
        spec_base, skewed, suffix = spec.partition("@")
        if skewed and not party_files:
            try:
                parse_sample_split(suffix)
            except HyflError as err:
                raise self.error(s, "spec", f"is {spec!r}; {err}", f"Use one of: {forms}, "
                                 "with grid, horizontal or quadrant optionally skewed.") from None
        match = SPEC_PATTERN.match(spec_base)
        kind = PARTITIONS.get(match.group(1).lower()) if match else None
        numbers = [g for g in match.groups()[1:] if g is not None] if match else []
        if not party_files and (kind is None or len(numbers) != kind.n_numbers):
            raise self.error(
                s, "spec", f"is {spec!r}, which is not understood", f"Use one of: {forms}."
            )
        participation = table.get("participation", "full")
        if isinstance(participation, bool) or not isinstance(participation, (str, int, float)):
            raise self.error(
                s,
                "participation",
                f"must be a string or a number, got {participation!r}",
                'Write e.g. participation = "full", 0.5 or "cyclic:2".',
            )
        if not isinstance(participation, str):
            participation = repr(float(participation))
        participation = participation.strip()
        head, sep, argument = participation.partition(":")
        if sep and head.strip().lower() == "trace":
            trace = self.path(argument.strip())
            if not Path(trace).is_file():
                raise self.error(
                    s,
                    "participation",
                    f"names the trace file {trace!r}, which does not exist",
                    "Check the path (relative to the config file or the working folder).",
                )
            participation = f"trace:{trace}"
        else:
            try:  # syntax and values; the client count is checked when the data is known
                parse_participation(participation, 1 << 20)
            except HyflError as err:
                raise self.wrap(s, "participation", err) from None
        return PartitionSection(spec=spec, participation=participation)

    def costs(self, table: Mapping) -> CostsSection:
        from hyfl.costs import (
            DEFAULT_HE_COSTS,
            DEFAULT_HE_LAYOUT,
            HE_COST_SOURCES,
            check_he_costs,
            check_he_layout,
        )
        from hyfl.privacy.ciphers import CIPHERS, check_keybits

        s = "costs"
        self.known_keys(s, table, COSTS_KEYS)
        cipher = self.choice(s, table, "cipher", "none", CIPHERS)
        key_bits = self.integer(s, table, "key_bits", None, minimum=1)
        if key_bits is not None:
            try:
                check_keybits(key_bits)
            except HyflError as err:
                raise self.wrap(s, "key_bits", err) from None
        latency = self.number(
            s,
            table,
            "latency",
            0.0,
            low=0,
            fix="Write seconds per round trip, e.g. latency = 0.2575.",
        )
        he_costs = self.text(s, table, "he_costs", DEFAULT_HE_COSTS)
        if he_costs not in (*HE_COST_SOURCES, *CIPHERS):
            he_costs = self.path(he_costs)
        try:
            check_he_costs(he_costs, cipher)
        except HyflError as err:
            raise self.wrap(s, "he_costs", err) from None
        he_layout = self.text(s, table, "he_layout", DEFAULT_HE_LAYOUT)
        try:
            check_he_layout(he_layout, cipher)
        except HyflError as err:
            raise self.wrap(s, "he_layout", err) from None
        return CostsSection(cipher=cipher, key_bits=key_bits, latency=latency, he_costs=he_costs,
                            he_layout=he_layout)

    def algorithms(self, table: Any) -> tuple[AlgorithmConfig, ...]:
        from hyfl.algorithms import (
            accepted_hyperparameters,
            algorithm_names,
            make_algorithm,
            option_elsewhere,
        )

        names = algorithm_names()
        example = "Add e.g. [algorithms.hyfdca] with its hyperparameters (or none)."
        if not isinstance(table, Mapping) or not table:
            raise self.error(
                "algorithms", "", "must hold at least one [algorithms.NAME] table", example
            )
        out = []
        for label, body in table.items():
            s = f"algorithms.{label}"
            if not isinstance(body, Mapping):
                raise self.error(
                    "algorithms",
                    str(label),
                    f"must be a table, got {body!r}",
                    f"Write [algorithms.{label}] with hyperparameters as keys.",
                )
            if any(sep in label for sep in ("/", "\\")) or label in (".", ".."):
                raise self.error(s, "", "has a name with a path separator", "Rename the table.")
            name = self.text(s, body, "algorithm", label)
            if name not in names:
                key = "algorithm" if "algorithm" in body else ""
                raise self.error(
                    s,
                    key,
                    f"{name!r} is not a registered algorithm",
                    f'Registered: {", ".join(names)} (or set algorithm = "..." in the table).',
                )
            accepted = accepted_hyperparameters(name)
            hyper = {k: v for k, v in body.items() if k != "algorithm"}
            for key in hyper:
                if key not in accepted:
                    raise self.error(
                        s,
                        key,
                        f"is not a hyperparameter of {name}",
                        option_elsewhere(key, [name])
                        + f"{name} accepts: {', '.join(sorted(accepted))}.",
                    )
            kinds = hyperparameter_kinds(name)
            for key, value in hyper.items():
                if not _matches(value, kinds[key]):
                    raise self.error(
                        s,
                        key,
                        f"must be {_describe(kinds[key])}, got {value!r}",
                        f"Write {key} = <{_describe(kinds[key])}>.",
                    )
            if "iic" in hyper and "local_steps" in hyper:
                raise self.error(s, "iic, local_steps", "are both given", "Give only one of them.")
            try:
                make_algorithm(name, hyper)
            except HyflError as err:
                raise self._locate_hyper(s, name, hyper, err) from None
            out.append(AlgorithmConfig(label=label, algorithm=name, hyper=hyper))
        return tuple(out)

    def _locate_hyper(self, section, name, hyper, err: HyflError) -> HyflError:
        from hyfl.algorithms import make_algorithm

        for key, value in hyper.items():
            try:
                make_algorithm(name, {key: value})
            except HyflError as single:
                return self.wrap(section, key, single)
        return self.wrap(section, "", err)
