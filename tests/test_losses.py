import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from hyfl.errors import HyflError
from hyfl.losses import LOSSES, SmoothedHinge, get_loss

ALL = list(LOSSES.values()) + [SmoothedHinge(smoothing=0.3)]
IDS = [f"{loss.name}-{getattr(loss, 'smoothing', '')}" for loss in ALL]


def labels(loss, rng, shape):
    if loss.classification:
        return rng.choice([-1.0, 1.0], size=shape)
    return rng.normal(size=shape)


def feasible_duals(loss, rng, y):
    lo, hi = loss.dual_bounds(y)
    lo = np.maximum(lo, -5)
    hi = np.minimum(hi, 5)
    return lo + rng.random(y.shape) * (hi - lo)


@pytest.mark.parametrize("loss", ALL, ids=IDS)
def test_fenchel_young_equality_at_the_gradient(loss):
    rng = np.random.default_rng(0)
    z = rng.normal(scale=3, size=(200, 3))
    y = labels(loss, rng, z.shape)
    u = loss.dual_target(z, y)  # u = -l'(z)
    assert np.all(np.isfinite(loss.conjugate(u, y)))
    np.testing.assert_allclose(loss.value(z, y) + loss.conjugate(u, y) + u * z, 0, atol=1e-12)


@pytest.mark.parametrize("loss", ALL, ids=IDS)
def test_fenchel_young_inequality_for_feasible_duals(loss):
    rng = np.random.default_rng(1)
    z = rng.normal(scale=3, size=500)
    y = labels(loss, rng, z.shape)
    a = feasible_duals(loss, rng, y)
    assert np.all(loss.value(z, y) + loss.conjugate(a, y) + a * z >= -1e-12)


@pytest.mark.parametrize("loss", ALL, ids=IDS)
def test_conjugate_matches_numerical_supremum(loss):
    # l*(v) = sup_z (v z - l(z)), evaluated at v = -a for feasible a.
    rng = np.random.default_rng(2)
    for _ in range(20):
        y = labels(loss, rng, (1,))
        a = feasible_duals(loss, rng, y)
        lo, hi = loss.dual_bounds(y)
        # stay strictly inside so the supremum is attained at a finite z
        a = np.clip(a, lo + 1e-3, hi - 1e-3) if np.isfinite(lo).all() else a
        res = minimize_scalar(
            lambda zz: -(-a[0] * zz - loss.value(np.array([zz]), y)[0]),
            bounds=(-200, 200),
            method="bounded",
            options={"xatol": 1e-12},
        )
        assert loss.conjugate(a, y)[0] == pytest.approx(-res.fun, abs=1e-6)


@pytest.mark.parametrize("loss", [loss for loss in ALL if loss.smooth], ids=lambda x: x.name)
def test_derivative_matches_finite_differences(loss):
    rng = np.random.default_rng(3)
    z = rng.normal(scale=2, size=300)
    y = labels(loss, rng, z.shape)
    h = 1e-6
    numeric = (loss.value(z + h, y) - loss.value(z - h, y)) / (2 * h)
    np.testing.assert_allclose(loss.derivative(z, y), numeric, atol=1e-6)


def test_hinge_subgradient_is_in_the_subdifferential():
    loss = LOSSES["hinge"]
    rng = np.random.default_rng(4)
    z = rng.normal(scale=2, size=300)
    y = rng.choice([-1.0, 1.0], size=300)
    g = loss.derivative(z, y)
    for dz in (-0.5, 0.1, 0.7):  # l(z') >= l(z) + g (z' - z)
        assert np.all(loss.value(z + dz, y) >= loss.value(z, y) + g * dz - 1e-12)


@pytest.mark.parametrize("loss", ALL, ids=IDS)
def test_dual_step_matches_brute_force_maximization(loss):
    rng = np.random.default_rng(5)
    n = 60
    y = labels(loss, rng, (n,))
    a = feasible_duals(loss, rng, y)
    z = rng.normal(scale=2, size=n)
    q = 10.0 ** rng.uniform(-3, 3, size=n)
    delta = loss.dual_step(a, z, q, y)
    lo, hi = loss.dual_bounds(y)

    def objective(d, i):
        return -loss.conjugate(np.array([a[i] + d]), y[i : i + 1])[0] - d * z[i] - q[i] * d * d / 2

    for i in range(n):
        # the step stays feasible
        assert lo[i] - 1e-12 <= a[i] + delta[i] <= hi[i] + 1e-12
        left, right = max(lo[i] - a[i], -1e3), min(hi[i] - a[i], 1e3)
        grid = np.linspace(left, right, 4001)
        brute = max(objective(d, i) for d in grid)
        res = minimize_scalar(
            lambda d: -objective(d, i),
            bounds=(left, right),
            method="bounded",
            options={"xatol": 1e-13},
        )
        best = max(brute, -res.fun, objective(left, i), objective(right, i))
        assert objective(delta[i], i) >= best - 1e-9 * (1 + abs(best))


def test_dual_steps_work_elementwise_on_matrices():
    loss = LOSSES["logistic"]
    rng = np.random.default_rng(6)
    y = rng.choice([-1.0, 1.0], size=(7, 4))
    a = feasible_duals(loss, rng, y)
    z = rng.normal(size=(7, 4))
    q = np.full((7, 4), 0.5)
    full = loss.dual_step(a, z, q, y)
    for c in range(4):
        np.testing.assert_allclose(full[:, c], loss.dual_step(a[:, c], z[:, c], q[:, c], y[:, c]))


def test_logistic_step_is_stable_at_extremes():
    loss = LOSSES["logistic"]
    y = np.array([1.0, -1.0, 1.0, -1.0])
    a = np.array([0.0, -1.0, 1.0, 0.0])
    z = np.array([50.0, -50.0, -40.0, 1e-9])
    q = np.array([1e-8, 1e6, 1.0, 1e-12])
    d = loss.dual_step(a, z, q, y)
    assert np.all(np.isfinite(d))
    s = y * (a + d)
    assert np.all((s >= 0) & (s <= 1))


def test_shapes_must_match():
    with pytest.raises(HyflError, match="shapes"):
        LOSSES["hinge"].dual_step(np.zeros(3), np.zeros((3, 1)), np.ones(3), np.ones(3))


def test_registry_and_label_checks():
    assert set(LOSSES) == {"hinge", "logistic", "squared", "smoothed_hinge"}
    with pytest.raises(HyflError, match="Choose one of"):
        get_loss("quantile")
    with pytest.raises(HyflError, match="-1 or \\+1"):
        LOSSES["hinge"].check_labels(np.array([0.0, 1.0]))
    LOSSES["squared"].check_labels(np.array([0.3, 2.0]))
    assert get_loss("smoothed_hinge", smoothing=0.5).smoothing == 0.5
