"""hyfl: hybrid federated learning of convex linear models.

The data matrix is split across clients by samples *and* features. The centre
of the library is HyFDCA, a primal-dual algorithm that reaches the same model
as central training; around it sit the losses, partitions, a fast simulation
engine, data loaders and the ``hyfl`` command.

Typical use::

    from hyfl import HyFDCA, load_data, make_problem, solve_centralized, simulate
    from hyfl.partition import grid, RandomFraction

or, scikit-learn style, ``hyfl.HyFDCAClassifier().fit(X, y)`` and
``hyfl.HyFDCARegressor`` (:mod:`hyfl.estimators`, imported on first use).
"""

__version__ = "0.1.0"

from hyfl.algorithms.hyfdca import HyFDCA  # noqa: E402
from hyfl.data import load_data  # noqa: E402
from hyfl.errors import HyflError  # noqa: E402
from hyfl.problem import make_problem, solve_centralized  # noqa: E402
from hyfl.runtime.simulation import simulate  # noqa: E402

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


def __getattr__(name: str):
    """Import the scikit-learn estimators on first use (keeps ``import hyfl`` fast)."""
    if name in ("HyFDCAClassifier", "HyFDCARegressor"):
        from hyfl import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'hyfl' has no attribute {name!r}")
