"""``hyfl deploy local`` accepts the party files ``hyfl run`` accepts, or refuses before
starting anything (issue 43).

* Three organisations' files of a real dataset (tests/organisation_cut.py: a hospital and a
  lab share three columns for the patients both hold) align in a deployment -- here in this
  process, the real messages without the network -- into exactly ``hyfl run``'s
  standardized problem and partition: the same cells, each owned by the first party in
  order that holds it; and the deployed iterates are those of the in-process engine on
  that partition.
* What a deployment cannot run is refused in seconds, before Flower starts, naming the
  files and the fix, with no ANSI codes or traceback text.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hyfl.data import load_party_spec
from hyfl.deploy.codec import decode
from hyfl.deploy.config import DeployConfig, run_config_for
from hyfl.deploy.coordinator import Coordinator
from hyfl.deploy.keys import server_cipher
from in_process import RecordingTransport
from organisation_cut import breast_cancer_cut

SPEC = "parties:{};id=patient;label=outcome"


@pytest.fixture(scope="module")
def organisations(tmp_path_factory):
    folder = tmp_path_factory.mktemp("orgs")
    breast_cancer_cut(folder)
    return folder


def _deploy(files, iterations=3, **run_extra):
    """A plaintext deployment of party ``files`` in this process (as party_files_deployment,
    with cipher none: the alignment's blinding and sealing run all the same)."""
    run = run_config_for(parties=len(files), iterations=iterations, cipher="none", lam=0.05,
                         **run_extra)
    nodes = [{"party": k, "cipher": "none", "data": str(path), "id-column": "patient",
              "label-column": "outcome"} for k, path in enumerate(files)]
    config = DeployConfig.from_run_config(run)
    server = server_cipher("none", None)
    transport = RecordingTransport(nodes, run, server)
    lines: list[str] = []
    return Coordinator(config, transport, server, log=lines.append), transport, lines


def _file_ids(path) -> list[str]:
    import pandas as pd

    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, dtype=str)
    return [str(i) for i in frame["patient"]]


def test_shared_columns_deploy_as_hyfl_run_builds_them(organisations):
    from hyfl.deploy.blocks import prepare_data
    from hyfl.deploy.keys import party_cipher
    from hyfl.deploy.local import compare_with_protocol
    from hyfl.losses import get_loss
    from hyfl.partition import Partition
    from hyfl.problem import Problem

    spec = SPEC.format(organisations)
    dataset, partition = load_party_spec(spec, psi=False)
    files = [organisations / f"{name}{'.parquet' if name == 'lab' else '.csv'}"
             for name in dataset.meta["clients"]]  # hyfl run's party order: clinic, hospital, lab
    assert dataset.meta["shared_cells"]
    _, run_problem, run_partition, _ = prepare_data(dataset, "hinge", 0.05, partition=partition,
                                                    standardize=True)
    coordinator, transport, lines = _deploy(files, iterations=3, standardize=True)
    results = coordinator.run()  # no refusal: the shared cells are the hospital's
    assert any("share 114 samples and the columns" in line and "hospital.csv" in line
               for line in lines)

    # Each party's block, from its state, in the deployment's numbering of the samples.
    N, M = results["n_samples"], results["n_features"]
    rows, cols, values, owners, Y = [], [], [], [], np.zeros((N, 1))
    by_id: dict[str, int] = {}
    for k, path in enumerate(files):
        block = decode(*transport.states[k], None)["block"]
        X = sp.csr_matrix((block["data"], block["indices"], block["indptr"]),
                          shape=tuple(block["shape"])).tocoo()
        samples, features = np.asarray(block["samples"]), np.asarray(block["features"])
        rows.append(samples[X.row]), cols.append(features[X.col]), values.append(X.data)
        owners.append(np.full(X.nnz, k))
        Y[samples] = block["Y"]
        record = next(r for r in transport.records if r.party == k and r.kind == "block")
        order = np.asarray(decode(*record.before)["alignment"]["order"], dtype=np.int64)
        numbers = np.empty(order.size, dtype=np.int64)
        numbers[order] = record.payload["samples"]
        for name, g in zip(_file_ids(path), numbers.tolist()):
            assert by_id.setdefault(name, g) == g
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    order = np.lexsort((cols, rows))
    X_deployed = sp.csr_matrix((np.concatenate(values)[order], (rows[order], cols[order])),
                               shape=(N, M))
    owner = sp.csr_matrix(((np.concatenate(owners) + 1)[order], (rows[order], cols[order])),
                          shape=(N, M))

    # hyfl run's problem, rows put in the deployment's numbering: the same cells, labels
    # and owners (hyfl run's entry_owner: the first party in order holding a cell).
    permutation = np.array([by_id[i] for i in dataset.meta["sample_ids"]])
    X_run = sp.csr_matrix(run_problem.X)
    X_placed = X_run[np.argsort(permutation)]
    np.testing.assert_allclose(X_deployed.toarray(), X_placed.toarray(), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(Y[:, 0], run_problem.Y[np.argsort(permutation), 0])
    run_owner = sp.csr_matrix((run_partition.entry_owner + 1, X_run.indices, X_run.indptr),
                              shape=(N, M))[np.argsort(permutation)]
    np.testing.assert_array_equal(owner.toarray(), run_owner.toarray())
    shared = [dataset.meta["feature_names"].index(c)
              for c in ("radius_error", "texture_error", "perimeter_error")]
    # every patient is the hospital's or the lab's; the 114 both hold, the hospital's
    assert set(np.unique(owner.toarray()[:, shared])) == {2, 3}

    # The deployed iterates are the in-process engine's on that partition, same seed
    # (what --compare checks for block files).
    states = [decode(*transport.states[k], None)["block"] for k in range(3)]
    blocks = Partition(N, M, tuple(np.asarray(b["samples"]) for b in states),
                       tuple(np.asarray(b["features"]) for b in states),
                       entry_owner=np.concatenate(owners)[order], name="blocks")
    problem = Problem(X=X_deployed, Y=Y, loss=get_loss("hinge"), lam=0.05)
    comparison = compare_with_protocol(results, np.stack(coordinator.weights), problem, blocks,
                                       party_cipher("none", None))
    assert comparison["rounds"] == 3 and comparison["max_abs_weight_difference"] <= 1e-12
