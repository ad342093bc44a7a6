"""Parties with their own files, aligned over the deployment's messages.

* The alignment's mathematics (:mod:`hyfl.privacy.alignment`) against plain set
  operations: the blind join finds exactly the shared ids, the numbering gives
  one index per id, sealed labels open only with the pair's key.
* The coordinator and the parties in this process (the real codec and
  messages; only the network is left out): three organisations' files (CSV and
  Parquet, string ids, partly overlapping, different columns, text labels held
  by two of them) are aligned -- every party's block equals its file under
  one global numbering, checked against the ids the test knows -- and HyFDCA
  trained on them reaches the pooled optimum with real encryption.
* Bad files and a forging server stop the job with a message naming the culprit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hyfl.data import load_party_spec
from hyfl.deploy.config import DeployConfig, run_config_for
from hyfl.deploy.coordinator import Coordinator
from hyfl.deploy.keys import generate_keys, server_cipher
from hyfl.errors import HyflError
from hyfl.privacy.alignment import (
    BlindingKey,
    ChannelKey,
    hash_ids,
    join,
    number_samples,
    seal,
    unseal,
)
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import evaluate
from in_process import RecordingTransport
from synthetic_data import organisation_files

TEST_KEYS = {"insecure_test_keys": True}


# ----------------------------------------------------------------------------- the mathematics

def test_the_blind_join_finds_exactly_the_shared_ids():
    rng = np.random.default_rng(0)
    universe = np.array([f"id-{i}" for i in range(400)])
    a_ids = list(rng.choice(universe, 150, replace=False))
    b_ids = list(rng.choice(universe, 220, replace=False))
    a, b = BlindingKey(), BlindingKey()
    # Each blinds its own ids, then the other's; the join sees only the doubles.
    double_a = b.apply(a.apply(hash_ids(a_ids)))
    double_b = a.apply(b.apply(hash_ids(b_ids)))
    rows_a, rows_b = join(double_a, double_b, ("a", "b"))
    expected = sorted(set(a_ids) & set(b_ids))
    assert sorted(a_ids[i] for i in rows_a) == expected
    assert all(a_ids[i] == b_ids[j] for i, j in zip(rows_a, rows_b))
    # Blinding commutes, and one scalar hides ids: a single blinding matches nothing.
    assert np.array_equal(b.apply(a.apply(hash_ids(a_ids))), a.apply(b.apply(hash_ids(a_ids))))
    assert join(a.apply(hash_ids(a_ids)), b.apply(hash_ids(b_ids)), ("a", "b"))[0].size == 0


def test_numbering_gives_each_id_one_index_in_a_fresh_order():
    ids = [["x", "y", "z"], ["y", "w"], ["z", "w", "v", "x"]]
    keys = [BlindingKey() for _ in ids]
    single = [key.apply(hash_ids(i)) for key, i in zip(keys, ids)]
    matches = {}
    for k in range(3):
        for j in range(k):
            matches[(j, k)] = join(keys[k].apply(single[j]), keys[j].apply(single[k]), ("j", "k"))
    index, n = number_samples([len(i) for i in ids], matches, np.random.default_rng(1))
    assert n == 5
    seen: dict[str, int] = {}
    for party, g in zip(ids, index):
        for name, value in zip(party, g.tolist()):
            assert seen.setdefault(name, value) == value
    assert sorted(seen.values()) == list(range(5))


def test_blinding_refuses_points_of_low_order_and_bad_shapes():
    key = BlindingKey()
    with pytest.raises(HyflError, match="low order"):
        key.apply(np.zeros((3, 32), dtype=np.uint8), what="the peers' ids")
    with pytest.raises(HyflError, match="shape"):
        key.apply(np.zeros((3, 31), dtype=np.uint8))
    with pytest.raises(HyflError, match="repeat a value"):
        points = key.apply(hash_ids(["a", "b"]))
        join(np.concatenate([points, points[:1]]), points, ("p", "q"))


def test_sealed_labels_open_only_for_the_pair():
    one, two, three = ChannelKey(), ChannelKey(), ChannelKey()
    key_12 = one.shared(two.public, (0, 1))
    assert key_12 == two.shared(one.public, (1, 0))
    sealed = seal(key_12, np.array([0.0, 1.0, np.nan]), b"0->1")
    opened = unseal(key_12, sealed, b"0->1", "labels")
    assert np.array_equal(opened[:2], [0.0, 1.0]) and np.isnan(opened[2])
    with pytest.raises(HyflError, match="pairwise key"):
        unseal(three.shared(one.public, (0, 2)), sealed, b"0->1", "labels")
    with pytest.raises(HyflError, match="pairwise key"):
        unseal(key_12, sealed, b"1->0", "labels")  # sent the other way: refused
    tampered = sealed.copy()
    tampered[-1] ^= 1
    with pytest.raises(HyflError, match="pairwise key"):
        unseal(key_12, tampered, b"0->1", "labels")


# ----------------------------------------------------------------------------- deployed, in process

def _deploy(tmp_path, files, *, cipher="none", keys=(None, None), iterations=3, lam=0.05,
            forge=None, node_extra=None, run_extra=None):
    private, public = keys
    run = run_config_for(parties=len(files), iterations=iterations, cipher=cipher, lam=lam,
                         public_key=str(public or ""), insecure_test_keys=True,
                         **(run_extra or {}))
    nodes = []
    for k, path in enumerate(files):
        policy = ({"cipher": "none"} if cipher == "none" else
                  {"key": str(private), "cipher": cipher, "insecure-test-keys": True})
        nodes.append({"party": k, **policy, "data": str(path), "id-column": "customer",
                      "label-column": "income", **(node_extra or {}).get(k, {})})
    config = DeployConfig.from_run_config(run)
    server = server_cipher(cipher, public, **config.cipher_options(), **TEST_KEYS)
    transport = RecordingTransport(nodes, run, server, forge)
    coordinator = Coordinator(config, transport, server, log=lambda line: None)
    return coordinator, transport


def _samples_by_row(transport, k: int) -> np.ndarray:
    """The global sample of each row of party ``k``'s file: the ``block`` message numbers
    the positions of the party's blinded list, which it sent in its own secret order."""
    from hyfl.deploy.codec import decode

    record = next(r for r in transport.records if r.party == k and r.kind == "block")
    order = np.asarray(decode(*record.before)["alignment"]["order"], dtype=np.int64)
    by_row = np.empty(order.size, dtype=np.int64)
    by_row[order] = record.payload["samples"]
    return by_row


@pytest.fixture(scope="module")
def ckks_keys(tmp_path_factory):
    return generate_keys(tmp_path_factory.mktemp("ckks-keys"), cipher="ckks")


def test_party_files_align_into_their_blocks_and_train_to_the_optimum(tmp_path, ckks_keys):
    files, ids, X, y = organisation_files(tmp_path)
    coordinator, transport = _deploy(tmp_path, files, cipher="ckks", keys=ckks_keys,
                                     iterations=12)
    results = coordinator.run()
    record = results["alignment"]
    assert record["ids"] == [60, 70, 50] and record["n_samples"] == 90
    assert record["n_features"] == 9 and record["classes"] == ["<=50K", ">50K"]

    # Every party's block is its file under one numbering: the same id, the same index.
    index_of: dict[str, int] = {}
    frames = [pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_csv(f) for f in files]
    for k, frame in enumerate(frames):
        given = _samples_by_row(transport, k)
        for name, g in zip(frame["customer"], given.tolist()):
            assert index_of.setdefault(name, g) == g
    assert sorted(index_of.values()) == list(range(90))
    order = np.array([index_of[i] for i in ids])  # file id -> global sample

    # The pooled problem in the deployment's numbering: X's rows and the labels by id.
    held = np.zeros_like(X)  # the cells some party holds (the rest are zero when pooled)
    held[0:60, 0:3], held[20:90, 3:6], held[40:90, 6:9] = (X[0:60, 0:3], X[20:90, 3:6],
                                                           X[40:90, 6:9])
    X_global = np.zeros_like(X)
    X_global[order] = held
    labels = np.where(y == ">50K", 1.0, -1.0)
    Y_global = np.zeros(90)
    Y_global[order] = labels
    dataset, _ = load_party_spec(f"parties:{','.join(map(str, files))};id=customer;"
                                 "label=income", psi=False)
    problem = make_problem(dataset, "hinge", 0.05)
    optimum = solve_centralized(problem, cache=False)
    w = coordinator.weights[-1]
    value = evaluate(problem, w, None, optimum, None)
    assert value["relative_loss"] <= 1e-3, value
    # The deployment's own pooled view agrees with the central one (features by first
    # appearance, the labels the parties sealed for each other).
    import scipy.sparse as sp

    from hyfl.losses import get_loss
    from hyfl.problem import Problem

    pooled = Problem(X=sp.csr_matrix(X_global), Y=Y_global[:, None], loss=get_loss("hinge"),
                     lam=0.05)
    assert pooled.primal(w) == pytest.approx(problem.primal(w), rel=1e-12)

    # Each round reports its start's certificate from the parties' secure sums: the
    # objective of the weights it starts from, a dual below the optimum, their gap.
    labels = problem.Y[:, 0]
    for record, start in zip(results["rounds"], coordinator.weights):
        certificate = record["certificate"]
        assert certificate["primal"] == pytest.approx(problem.primal(start), rel=1e-6)
        assert certificate["dual"] <= optimum.primal + 1e-6
        assert certificate["gap"] == pytest.approx(certificate["primal"] - certificate["dual"])
        expected = np.mean(np.where(problem.X @ start[:, 0] >= 0, 1.0, -1.0) == labels)
        assert certificate["accuracy"] == pytest.approx(expected)
    assert results["rounds"][-1]["certificate"]["gap"] <= 1e-2 * optimum.primal


def test_alignment_reports_bad_files_by_culprit(tmp_path):
    files, ids, X, y = organisation_files(tmp_path)
    # Vertical parties that share no id: below min-common.
    lonely = tmp_path / "lonely.csv"
    pd.DataFrame({"customer": [f"other-{i}" for i in range(10)], "z": np.arange(10.0),
                  "income": [">50K", "<=50K"] * 5}).to_csv(lonely, index=False)
    coordinator, _ = _deploy(tmp_path, [files[0], lonely])
    with pytest.raises(HyflError, match="party 1 .*fewer than min-common=1"):
        coordinator.run()

    # Two parties that label a shared sample differently.
    frame = pd.read_csv(files[2])
    frame["income"] = np.where(frame["income"] == ">50K", "<=50K", ">50K")
    flipped = tmp_path / "flipped.csv"
    frame.to_csv(flipped, index=False)
    coordinator, _ = _deploy(tmp_path, [files[0], files[1], flipped])
    with pytest.raises(HyflError, match="different labels to"):
        coordinator.run()

    # Samples nobody labels: the telco party alone, plus an unlabelled bank.
    bank = pd.read_csv(files[0]).drop(columns="income")
    unlabelled = tmp_path / "bank-unlabelled.csv"
    bank.to_csv(unlabelled, index=False)
    coordinator, _ = _deploy(tmp_path, [unlabelled, files[1], files[2]])
    with pytest.raises(HyflError, match="samples that no party labels"):
        coordinator.run()

    # (The same column at two parties that share samples is no refusal: the first holder's
    # cells, as hyfl run builds them; tests/test_deploy_accepts.py.)


def test_a_forging_server_cannot_swap_channel_keys_or_labels(tmp_path, ckks_keys):
    files, *_ = organisation_files(tmp_path)
    own = ChannelKey()

    def swap_key(k, kind, payload):  # the server puts in its own half of party 0's channel
        if kind == "align":
            payload = dict(payload)
            channels = payload["channels"].copy()
            channels[0] = np.frombuffer(own.public, dtype=np.uint8)
            payload["channels"] = channels
        return payload

    coordinator, _ = _deploy(tmp_path, files, cipher="ckks", keys=ckks_keys, forge=swap_key)
    with pytest.raises(HyflError, match="party 0's (own )?hello as the server relays it"):
        coordinator.run()

    def swap_labels(k, kind, payload):  # labels party 0 sealed for 1 handed to 2
        if kind == "block" and k == 2 and "0" in payload["sealed"]:
            payload = dict(payload)
            payload["sealed"] = {"0": seal(b"\0" * 32, np.zeros(3), b"x")}
        return payload

    coordinator, _ = _deploy(tmp_path, files, cipher="ckks", keys=ckks_keys, forge=swap_labels)
    with pytest.raises(HyflError, match="pairwise key"):
        coordinator.run()


def test_deploy_local_gives_each_party_its_own_file(tmp_path):
    """``hyfl deploy local --data parties:...``: each party's node config names its own
    file and columns, the run config its overlap check; options a deployment cannot honour
    are refused (the protocol itself runs over Flower in tests/test_deploy_netns.py)."""
    from hyfl.deploy.local import _party_file_nodes

    files, *_ = organisation_files(tmp_path)
    nodes, run = _party_file_nodes(f"parties:{files[0]},{files[2]};id=customer;label=income;"
                                   "min_common=5")
    assert [n["data"] for n in nodes] == [str(files[0].resolve()), str(files[2].resolve())]
    assert all(n["id-column"] == "customer" and n["label-column"] == "income" for n in nodes)
    assert run == {"min_common": 5}
    with pytest.raises(HyflError, match="task.*cannot be deployed"):
        _party_file_nodes(f"parties:{files[0]},{files[2]};task=binary")


def test_a_model_of_text_labelled_party_files_predicts_from_them(tmp_path):
    """The model file keeps text labels; ``hyfl predict`` reads party files in any order."""
    from hyfl.model_file import load_model, model_from_problem, save_model
    from hyfl.predict import predict_data

    files, ids, X, y = organisation_files(tmp_path)
    spec = f"parties:{','.join(map(str, files))};id=customer;label=income"
    dataset, _ = load_party_spec(spec, psi=False)
    problem = make_problem(dataset, "hinge", 0.05)
    w = solve_centralized(problem, cache=False).w
    save_model(tmp_path / "model.npz", model_from_problem(problem, w, data_meta=dataset.meta))
    model = load_model(tmp_path / "model.npz")
    assert model.label_names == ("<=50K", ">50K")
    prediction = predict_data(tmp_path / "model.npz", spec, tmp_path / "p.csv")
    written = pd.read_csv(tmp_path / "p.csv")
    assert set(written["prediction"]) <= {"<=50K", ">50K"} and prediction.same_data
    expected = np.mean(np.where(problem.X @ w[:, 0] >= 0, 1.0, -1.0) == problem.Y[:, 0])
    assert prediction.accuracy == pytest.approx(expected)
    # Columns are matched by name and rows by id: the files in another order score alike.
    swapped = f"parties:{files[1]},{files[0]},{files[2]};id=customer;label=income"
    predict_data(tmp_path / "model.npz", swapped, tmp_path / "q.csv")
    again = pd.read_csv(tmp_path / "q.csv").set_index("id").loc[written["id"]]
    np.testing.assert_allclose(again["decision"], written["decision"], rtol=1e-12)


def test_party_files_standardize_by_a_secure_sum_and_fit_an_intercept(tmp_path):
    """Run config ``standardize`` and ``intercept``: the parties' masked column sums add up to
    the pooled totals (the scales are ``hyfl run --standardize``'s), no single message shows
    a party's sums, each sample's first holder carries the constant, and the deployment
    trains to the optimum of the pooled, scaled problem with its intercept."""
    import dataclasses

    from hyfl.experiments.runner import add_intercept
    from hyfl.privacy.secure_scaling import (
        column_moments,
        decode,
        scale_columns,
        secure_feature_scales,
    )

    files, ids, X, y = organisation_files(tmp_path)
    X[:, 3:6] *= 1000.0  # a shop's columns in other units: scaling matters
    for path in files:  # rewrite the files with those units
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        for name in frame.columns:
            if name in ("x3", "x4", "x5"):
                frame[name] *= 1000.0
        frame.to_parquet(path) if path.suffix == ".parquet" else frame.to_csv(path, index=False)
    coordinator, transport = _deploy(tmp_path, files, iterations=80,
                                     run_extra={"intercept": 1.0, "standardize": True})
    results = coordinator.run()
    spec = f"parties:{','.join(map(str, files))};id=customer;label=income"
    dataset, partition = load_party_spec(spec, psi=False)
    train, _, partition = add_intercept(dataset, None, partition, 1.0)
    problem = make_problem(train, "hinge", 0.05)
    M = problem.n_features - 1
    scale = secure_feature_scales(partition, problem.X, np.random.default_rng(0), keep=[M])
    assert scale[3:6].min() > 100 * scale[0:3].max()  # the units show in the scales
    np.testing.assert_allclose(results["alignment"]["scales"], scale[:M], rtol=1e-6)
    problem = dataclasses.replace(problem, X=scale_columns(problem.X, scale))
    optimum = solve_centralized(problem, cache=False)
    w = coordinator.weights[-1]
    assert w.shape == (M + 1, 1)
    assert evaluate(problem, w, None, optimum, None)["relative_loss"] <= 1e-3

    # The masked sums add up to the pooled totals, to the fixed-point precision (that
    # each message alone hides its values: tests/test_secure_scaling.py).
    pooled = column_moments(dataset.X)
    totals = transport.sent(0, "block")["moments"]
    np.testing.assert_allclose(decode(totals), pooled, rtol=1e-9, atol=1e-6)
    # The constant: one holder per sample, the lowest-numbered party holding it.
    constant_holders = [k for k in range(3) if M in transport.sent(k, "setup")["features"]]
    assert constant_holders == [0, 1, 2]  # each is first for some samples here
