"""Feature scaling from a secure sum: exact totals, masked messages, raw-feature models."""

import numpy as np
import pytest
import scipy.sparse as sp

from hyfl.errors import HyflError
from hyfl.experiments.config import parse_config
from hyfl.experiments.runner import RunSpec, execute, prepare
from hyfl.partition import grid, nonzero_balanced
from hyfl.privacy.secure_scaling import (
    FRACTION_BITS,
    client_column_sums,
    decode,
    encode,
    masked_messages,
    scale_columns,
    secure_feature_scales,
    secure_sum,
)


def test_the_secure_sum_is_exact_and_each_message_is_masked():
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(2, 7)) * 100 for _ in range(4)]
    messages = masked_messages(parts, np.random.default_rng(1))
    total = sum(messages[1:], messages[0])  # what the server adds, modulo 2**64
    assert np.array_equal(total, sum((encode(p) for p in parts[1:]), encode(parts[0])))
    np.testing.assert_allclose(decode(total), sum(parts), atol=4 * 2.0**-FRACTION_BITS)
    for part, message in zip(parts, messages):
        assert not np.any(message == encode(part))  # nothing sent in the clear
    high_bits = np.concatenate([m.ravel() >> np.uint64(60) for m in messages])
    assert len(np.unique(high_bits)) > 8  # masked values spread over the whole range
    np.testing.assert_allclose(secure_sum(parts, np.random.default_rng(2)), sum(parts),
                               atol=4 * 2.0**-FRACTION_BITS)


def test_values_beyond_the_fixed_point_range_are_refused():
    with pytest.raises(HyflError, match="secure sum's range"):
        encode(np.array([2.0**40]))


@pytest.mark.parametrize("make", [lambda X: grid(X.shape[0], X.shape[1], 3, 2, seed=0),
                                  lambda X: nonzero_balanced(X, 2, 2, seed=0)])
def test_scales_are_the_pooled_columns_standard_deviations(make):
    rng = np.random.default_rng(3)
    X = sp.random(120, 6, density=0.5, random_state=4, format="csr") * 5.0
    X[:, 5] = 0.0  # a feature without variation keeps scale 1
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    partition = make(X)
    parts = client_column_sums(partition, X)
    np.testing.assert_allclose(sum(parts)[0], np.asarray(X.sum(axis=0)).ravel())
    scale = secure_feature_scales(partition, X, rng)
    expected = X.toarray().std(axis=0)
    expected[expected == 0] = 1.0
    np.testing.assert_allclose(scale, expected, rtol=1e-6)
    scaled = scale_columns(X, scale)
    assert scaled.nnz == X.nnz  # no centring: the sparsity stays
    np.testing.assert_allclose(scaled.toarray().std(axis=0)[:5], 1.0, rtol=1e-6)


def test_a_standardized_run_gives_a_model_of_the_raw_features(tmp_path):
    spec = RunSpec(data="breast_cancer", iterations=5, standardize=True, val_fraction=0.25)
    setup = prepare(spec)
    assert setup.feature_scale is not None and setup.feature_scale[-1] == 1.0  # intercept
    outcome = execute(spec, tmp_path / "run")
    weights = outcome.result.weights  # of the scaled features
    scaled_scores = np.asarray(setup.problem.X @ weights)[:, 0]
    raw_scores = outcome.model.decision_function(setup.train.X[:, :-1])  # as read
    np.testing.assert_allclose(raw_scores, scaled_scores, rtol=1e-9, atol=1e-9)
    assert np.allclose(np.asarray(setup.problem.X[:, :-1].toarray()).std(axis=0), 1.0)


def test_the_config_key_and_its_check():
    base = {"experiment": {"name": "x", "budget": {"iterations": 2}},
            "data": {"dataset": "breast_cancer", "standardize": True},
            "partition": {"spec": "grid:2x2"}, "algorithms": {"hyfdca": {}}}
    config = parse_config(base)
    assert config.spec("hyfdca", 0).standardize is True
    assert parse_config(config.to_dict()).data.standardize is True
    with pytest.raises(HyflError, match="standardize: must be true or false"):
        parse_config({**base, "data": {"dataset": "breast_cancer", "standardize": "yes"}})


def test_keyed_pairwise_masks_cancel_in_the_sum_and_hide_each_message():
    """The deployment's secure sum: masks from the pairs' shared keys and the run's
    identity (both ends derive the same values), added by the lower party and subtracted
    by the higher."""
    from hyfl.privacy.secure_scaling import cell_masks, masked_message, sum_messages

    rng = np.random.default_rng(5)
    parts = [rng.normal(size=(2, 7)) * 100 for _ in range(4)]
    keys = {(j, k): rng.bytes(32) for j in range(4) for k in range(j + 1, 4)}
    shared = [{p: keys[tuple(sorted((k, p)))] for p in range(4) if p != k} for k in range(4)]
    run = rng.bytes(32)
    messages = [masked_message(parts[k], k, shared[k], run) for k in range(4)]
    np.testing.assert_allclose(decode(sum_messages(messages)), sum(parts), atol=1e-6)
    for k in range(4):
        assert not np.any(messages[k] == encode(parts[k]))  # nothing in the clear
    columns = np.arange(6)
    np.testing.assert_array_equal(cell_masks(b"k" * 32, run, columns),
                                  cell_masks(b"k" * 32, run, columns))
    assert not np.any(cell_masks(b"k" * 32, run, columns) == cell_masks(b"j" * 32, run, columns))
    other_run = cell_masks(b"k" * 32, rng.bytes(32), columns)
    assert not np.any(cell_masks(b"k" * 32, run, columns) == other_run)  # per run


def test_a_cells_mask_is_its_column_and_moment_not_a_stream_position():
    """Issue 42, point 2, at the level of the masks: told a larger feature count and
    shifted column numbers, a party used to send, in cells where it holds nothing, the
    stream its peer's cells were masked with -- the sums of squares included -- and the
    server read the peer's own statistics (tests/test_relayed_values.py). A mask is now a
    function of the pair, the run, the global column and the moment alone, so the server
    learns per cell the sum of what the parties put there and never a mask. Which cells a
    party fills is the numbering, which each party checks itself (a party told that it
    holds nothing where it does would leave its peer's values alone in those cells:
    tests/test_relayed_values.py::test_the_server_cannot_unmask_one_partys_column_sums)."""
    from hyfl.privacy.secure_scaling import cell_masks, masked_message

    rng = np.random.default_rng(6)
    key, run, M = rng.bytes(32), rng.bytes(32), 3
    full = cell_masks(key, run, np.arange(4 * M))
    # Any subset, in any order, gets the same cells' masks: no position in a stream.
    picked = np.array([7, 2, 9])
    np.testing.assert_array_equal(cell_masks(key, run, picked), full[:, picked])
    # The stream attack: party 1 told 3M features and its columns the last M; its first
    # 2M sums-cells used to be the mask stream of party 0's sums and sums of squares.
    values = rng.normal(10.0, 2.0, size=(2, M))
    first = masked_message(values, 0, {1: key}, run)
    second = masked_message(np.hstack([np.zeros((2, 2 * M)), values]), 1, {0: key}, run)
    recovered = decode(first + second[0, :2 * M].reshape(2, M))
    assert np.all(np.abs(recovered[1] - values[1]) > 1.0)  # squares: another cell's mask
    assert not np.any(second[0, M:2 * M] == (-full[1, :M]).astype(np.uint64))
