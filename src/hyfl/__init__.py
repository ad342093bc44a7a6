"""hyfl: hybrid federated learning of convex linear models.

The data matrix is split across clients by samples *and* features. The centre
of the library is HyFDCA, a primal-dual algorithm that reaches the same model
as central training; around it sit the losses, partitions, a fast simulation
engine, data loaders and the ``hyfl`` command.

Typical use::

    from hyfl import HyFDCA, load_data, make_problem, solve_centralized, simulate
    from hyfl.partition import grid
    from hyfl.participation import RandomFraction

or, scikit-learn style, ``hyfl.HyFDCAClassifier().fit(X, y)`` and
``hyfl.HyFDCARegressor`` (:mod:`hyfl.estimators`, imported on first use).
"""

__version__ = "0.1.0"

# The public names are imported on first use (PEP 562), so that importing hyfl,
# and so `hyfl --help`, does not load SciPy and scikit-learn.
_LAZY = {
    "HyFDCA": "hyfl.algorithms.hyfdca",
    "HyFDCAClassifier": "hyfl.estimators",
    "HyFDCARegressor": "hyfl.estimators",
    "HyflError": "hyfl.errors",
    "load_data": "hyfl.data",
    "make_problem": "hyfl.problem",
    "simulate": "hyfl.runtime.simulation",
    "solve_centralized": "hyfl.problem",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hyfl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "HyFDCA",
    "HyFDCAClassifier",
    "HyFDCARegressor",
    "HyflError",
    "load_data",
    "make_problem",
    "simulate",
    "solve_centralized",
    "__version__",
]
