"""The embedded default run behind ``hyfl demo`` (no download, no arguments)."""

from hyfl.experiments.runner import RunSpec

DEMO_SPEC = RunSpec(
    algorithm="hyfdca",
    data="breast_cancer",  # ships with scikit-learn
    val_fraction=0.25,
    loss="hinge",
    lam=1e-3,
    partition="grid:3x3",
    participation="0.5",
    hyper={},  # HyFDCA's defaults
    iterations=300,  # HyFDCA's default settles at relative loss 1e-3 by then
    eval_every=5,
    seed=0,
)
