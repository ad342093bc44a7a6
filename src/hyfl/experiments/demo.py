"""The embedded default run behind ``hyfl demo`` (no download, no arguments)."""

from hyfl.experiments.spec import RunSpec

DEMO_SPEC = RunSpec(
    algorithm="hyfdca",
    data="breast_cancer",  # ships with scikit-learn
    val_fraction=0.25,
    loss="hinge",
    lam=1e-3,
    partition="grid:3x3",
    participation="0.5",
    hyper={},  # HyFDCA's defaults
    # HyFDCA's default reaches relative loss 1e-3 by round ~450 with the default intercept
    # (its constant column slows the dual steps; without it, by round ~235)
    iterations=600,
    eval_every=5,
    seed=0,
)
