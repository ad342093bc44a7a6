"""Registry of federated algorithms: drives validation, ``hyfl run`` and ``hyfl compare``.

Each entry names a class (a frozen dataclass of hyperparameters implementing
:class:`hyfl.algorithms.base.Algorithm`) and the preset hyperparameters that
make the named variant (e.g. ``fedbcd-p`` is ``FedBCD(variant="parallel")``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hyfl.errors import check_choice, fail


@dataclass(frozen=True)
class AlgorithmEntry:
    """How to build one named algorithm."""

    cls: type
    summary: str
    preset: dict[str, Any] = field(default_factory=dict)
    neural: bool = False  # runs on hyfl.neural's engine (needs the neural extra)


def _entries() -> dict[str, AlgorithmEntry]:
    from hyfl.algorithms.disco import DiSCO
    from hyfl.algorithms.fedbcd import DEFAULT_PROX_MU, FedBCD
    from hyfl.algorithms.fedhybrid import FedHybrid
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.algorithms.local_sgd import FedAvg, HyFEM
    from hyfl.algorithms.mix_lr import MixLR
    from hyfl.neural.fedbcd_nn import PAPER_MNIST_CNN, FedBCDNN
    from hyfl.neural.hyfem_nn import HyFEMNN

    entries = {
        "hyfdca": AlgorithmEntry(HyFDCA, "HyFDCA, primal-dual for hybrid FL (any partition)"),
        "fedavg": AlgorithmEntry(
            FedAvg, "FedAvg, hybrid: local SGD on own features, averaged over K_m (any partition)"
        ),
        "hyfem": AlgorithmEntry(
            HyFEM, "HyFEM-Prox: FedAvg + mu/2 ||w_k - w_0[M_k]||^2 (any partition)"
        ),
        "hyfem-avg": AlgorithmEntry(
            HyFEM, "HyFEM-Avg: HyFEM without the proximal term (any partition)", {"variant": "avg"}
        ),
        "fedsgd": AlgorithmEntry(
            FedBCD, "FedSGD: one gradient step per exchange (vertical)", {"variant": "sgd"}
        ),
        "fedbcd-p": AlgorithmEntry(
            FedBCD, "FedBCD-p: Q parallel local steps (vertical)", {"variant": "parallel"}
        ),
        "fedbcd-s": AlgorithmEntry(
            FedBCD, "FedBCD-s: parties take Q steps in turn (vertical)", {"variant": "sequential"}
        ),
        "fedpbcd": AlgorithmEntry(
            FedBCD,
            "FedPBCD: FedBCD-p with a proximal term (vertical)",
            {"variant": "parallel", "mu": DEFAULT_PROX_MU},
        ),
        "fedh-g": AlgorithmEntry(
            FedHybrid,
            "FedHybrid, gradient-type clients (horizontal, smooth loss)",
            {"newton_clients": "none"},
        ),
        "fedh-n": AlgorithmEntry(
            FedHybrid,
            "FedHybrid, Newton-type clients (horizontal, smooth loss)",
            {"newton_clients": "all"},
        ),
        "fedh-k": AlgorithmEntry(
            FedHybrid,
            "FedHybrid, K Newton clients, the rest gradient (--param newton_clients=K)",
            {"newton_clients": "half"},
        ),
        "disco": AlgorithmEntry(
            DiSCO, "DiSCO: inexact damped Newton with distributed PCG (horizontal, smooth loss)"
        ),
        "mix-lr": AlgorithmEntry(
            MixLR, "Mix-LR (SecretFlow): vertical SGD per row group, groups averaged (grid)"
        ),
        "hyfem-nn": AlgorithmEntry(
            HyFEMNN, "HyFEM-Prox, neural: extractors per view + matched averaging (neural extra)",
            neural=True,
        ),
        "hyfem-nn-avg": AlgorithmEntry(
            HyFEMNN, "HyFEM-Avg, neural: hyfem-nn without the proximal term (neural extra)",
            {"variant": "avg", "mu": 0.0}, neural=True,
        ),
        "fedbcd-nn": AlgorithmEntry(
            FedBCDNN, "FedBCD-p, neural: party bottom models, top model at the label holder "
            "(vertical; neural extra)", neural=True,
        ),
        "fedbcd-nn-s": AlgorithmEntry(
            FedBCDNN, "FedBCD-s, neural: parties take their Q steps in turn (vertical; neural "
            "extra)", {"variant": "sequential"}, neural=True,
        ),
        "fedsgd-nn": AlgorithmEntry(
            FedBCDNN, "FedSGD, neural: one step per exchange (vertical; neural extra)",
            {"variant": "sgd"}, neural=True,
        ),
        "fedbcd-nn-cnn": AlgorithmEntry(
            FedBCDNN, "FedBCD-p with the paper's MNIST party CNN (vertical; neural extra)",
            dict(PAPER_MNIST_CNN), neural=True,
        ),
    }
    return entries


ALGORITHMS: dict[str, AlgorithmEntry] = _entries()


def algorithm_names() -> list[str]:
    return list(ALGORITHMS)


def is_neural(name: str) -> bool:
    """Whether algorithm ``name`` runs on the neural engine (:mod:`hyfl.neural`)."""
    entry = ALGORITHMS.get(name)
    return bool(entry is not None and entry.neural)


def make_algorithm(name: str, hyper: dict[str, Any] | None = None):
    """Build a registered algorithm with hyperparameters (``None`` values are ignored).

    Raises
    ------
    HyflError
        Unknown algorithm, or a hyperparameter the algorithm does not have.
    """
    check_choice("algorithm", name, ALGORITHMS)
    entry = ALGORITHMS[name]
    accepted = accepted_hyperparameters(name)
    given = {k: v for k, v in (hyper or {}).items() if v is not None}
    unknown = sorted(set(given) - accepted)
    if unknown:
        raise fail(
            f"hyperparameter {unknown[0]!r}",
            f"does not apply to {name}",
            option_elsewhere(unknown[0], [name])
            + f"{name} accepts: {', '.join(sorted(accepted))}.",
        )
    return entry.cls(**{**entry.preset, **given, "name": name}).validated()


def accepted_hyperparameters(name: str) -> set[str]:
    """Names of the hyperparameters algorithm ``name`` accepts (presets may be overridden)."""
    entry = ALGORITHMS[name]
    return {f.name for f in dataclasses.fields(entry.cls) if f.name != "name"}


def check_algorithm_options(hyper: dict[str, Any]) -> None:
    """Refuse an ``ALGORITHM.KEY`` option naming no registered algorithm, or no option of
    it (a typo such as ``hyfcda.history`` would otherwise be dropped by every algorithm);
    another algorithm's real option may ride along in a spec."""
    for key in hyper:
        name, dot, option = key.partition(".")
        if not dot:
            continue
        if name not in ALGORITHMS:
            raise fail(f"--param {key}", f"names no algorithm {name!r}",
                       f"Write ALGORITHM.KEY with one of {', '.join(ALGORITHMS)}.")
        if option not in accepted_hyperparameters(name):
            raise fail(f"--param {key}", f"is not an option of {name}",
                       f"See `hyfl algorithms` for {name}'s options.")


def option_takers(option: str) -> list[str]:
    """The registered algorithms that take hyperparameter ``option``, in registry order."""
    return [name for name in ALGORITHMS if option in accepted_hyperparameters(name)]


def option_elsewhere(option: str, chosen: list[str]) -> str:
    """The start of an error's fix for ``option``, which none of ``chosen`` takes: the
    option's new name if one of them renamed it, and which algorithms take it."""
    hints = []
    for name in chosen:
        new = getattr(ALGORITHMS[name].cls, "renamed_options", {}).get(option)
        if new is not None:
            hints.append(f"{name}'s {option} is now called {new}: write {new}=VALUE.")
    takers = option_takers(option)
    if takers:
        hints.append(f"{option} is an option of {', '.join(takers)}.")
    else:
        hints.append(f"No algorithm takes {option}: `hyfl algorithms` lists their options.")
    return " ".join(hints) + " "


def hyperparameters_by_algorithm(
    names: list[str], hyper: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Each of ``names``' hyperparameters from one set of options, as ``hyfl compare`` runs them.

    An option ``key`` goes to every algorithm of ``names`` that takes it, and only to
    those; ``name.key`` to algorithm ``name`` alone, over the shared value.

    Raises
    ------
    HyflError
        An option that none of ``names`` takes (naming the algorithms chosen and those
        that take it), a ``name.key`` for an algorithm not among ``names``, or a ``key``
        that ``name`` does not take.
    """
    for name in names:
        check_choice("algorithm", name, ALGORITHMS)
    chosen = list(dict.fromkeys(names))
    out: dict[str, dict[str, Any]] = {name: {} for name in chosen}
    specific: list[tuple[str, str, Any]] = []
    for key, value in hyper.items():
        if "." in key:
            name, _, option = key.partition(".")
            if name not in out:
                raise fail(
                    f"option {key!r}",
                    f"is for {name}, which is not among the algorithms chosen "
                    f"({', '.join(chosen)})",
                    f"Add {name} to --algorithms, or write the option for one of them.",
                )
            specific.append((name, option, value))
            continue
        takers = [name for name in chosen if key in accepted_hyperparameters(name)]
        if not takers:
            add = "Add one of them to --algorithms, or leave it out." if option_takers(key) else ""
            raise fail(
                f"option {key!r}",
                f"is taken by none of the algorithms chosen ({', '.join(chosen)})",
                (option_elsewhere(key, chosen) + add).strip(),
            )
        for name in takers:
            out[name][key] = value
    for name, option, value in specific:
        accepted = accepted_hyperparameters(name)
        if option not in accepted:
            raise fail(
                f"option {name}.{option}",
                f"does not apply to {name}",
                option_elsewhere(option, [name])
                + f"{name} accepts: {', '.join(sorted(accepted))}.",
            )
        out[name][option] = value
    return out
