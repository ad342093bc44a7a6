"""Neural hybrid FL (optional extra ``hyfl[neural]``): HyFEM and FedBCD with neural models.

The linear algorithms of :mod:`hyfl.algorithms` run on NumPy/SciPy. The two
reference papers about neural models get their own algorithms here, on JAX
and optax (see ``docs/neural.md`` for why JAX rather than PyTorch):

* ``hyfem-nn`` (:mod:`hyfl.neural.hyfem_nn`): one feature extractor per view,
  an inference model per client, server averaging of the extractors and
  matched averaging (:mod:`hyfl.neural.matching`) of the inference models.
* ``fedbcd-nn`` (:mod:`hyfl.neural.fedbcd_nn`): a bottom model per party, a
  top model at the label holder, intermediate results and their gradients
  exchanged, ``Q`` local steps on stale information.

They use the same data sets, partitions, participation schedules, results
folder and plots as the linear algorithms; views are derived from the
partition (:mod:`hyfl.neural.views`) and the loop is :func:`hyfl.neural.engine.run`.
"""

from __future__ import annotations

INSTALL_HINT = (
    'Install the neural extra (JAX and optax, CPU): pip install "hyfl[neural]", '
    "or pip install '.[neural]' from a clone of the repository."
)


def require_jax():
    """Import JAX (and optax) or raise a clear error saying how to install them."""
    try:
        import jax
        import optax  # noqa: F401
    except ImportError as err:  # pragma: no cover - exercised without the extra
        from hyfl.errors import fail

        raise fail(
            "The neural algorithms (hyfem-nn, fedbcd-nn)",
            f"need JAX and optax, which are not installed ({err})",
            INSTALL_HINT,
        ) from None
    return jax
