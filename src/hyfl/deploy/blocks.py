"""A party's block of the data: from its own block file, or cut from a named dataset.

In a deployment each party holds one block ``X_k`` of the data matrix (its
samples ``I_k`` and features ``M_k``, as global ids after alignment) and the
labels of its samples. A party gets it in one of two ways, chosen by its node
config ``data``:

* a **block file** ``party-K.npz`` (``hyfl deploy split`` writes one per
  party from a dataset and a partition, :func:`write_blocks`): the party's
  machine needs nothing else of the data set;
* a **dataset name or LIBSVM file** (with the node config's ``data-dir``): the
  party loads the data set, builds the run config's partition spec with the
  run's seed and keeps its block -- convenient on loopback and for
  demonstrations where every machine has the public data set anyway.

The job never names a file: a party reads only what its own node config names.

Block files are plain ``.npz`` archives of numeric arrays and strings (read
with ``allow_pickle=False``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from hyfl._io import read_npz
from hyfl._private_files import private_folder, private_write
from hyfl.errors import fail

__all__ = ["BLOCK_FORMAT", "Block", "load_block", "prepare_data", "read_block", "write_blocks"]

BLOCK_FORMAT = "hyfl-party-block"
#: The members of a block file: dtype kinds and dimensions (checked before any is read).
_MEMBERS = {
    "format": ("U", 0), "version": ("iu", 0), "party": ("iu", 0), "n_parties": ("iu", 0),
    "n_samples": ("iu", 0), "n_features": ("iu", 0), "samples": ("iu", 1),
    "features": ("iu", 1), "X_data": ("biuf", 1), "X_indices": ("iu", 1),
    "X_indptr": ("iu", 1), "X_shape": ("iu", 1), "Y": ("biuf", None),
    "lam_default": ("iuf", 0), "name": ("U", 0), "partition": ("U", 0),
}
#: Members of newer files (an older file lacks them); any other member is refused unread.
_OPTIONAL_MEMBERS = ("intercept", "scale")


@dataclass(frozen=True)
class Block:
    """One party's data: global ids of its samples and features, its matrix and labels."""

    party: int
    samples: np.ndarray  # (N_k,) int64, ascending
    features: np.ndarray  # (|M_k|,) int64, ascending
    X: sp.csr_matrix  # (N_k, |M_k|)
    Y: np.ndarray  # (N_k, C) encoded labels
    n_samples: int
    n_features: int
    lam_default: float  # the data set's regularization (used when the run sets lam=0)
    name: str = ""
    # How the data were prepared (hyfl deploy split --intercept / --standardize, or the
    # job's intercept and standardize applied by the party): the constant feature's value
    # (0: none; it is the last feature) and the scales of the block's features (None: 1).
    intercept: float = 0.0
    scale: np.ndarray | None = None


def write_blocks(problem, partition, out_dir: str | os.PathLike, *, name: str = "",
                 lam_default: float | None = None, intercept: float = 0.0,
                 scale: np.ndarray | None = None) -> list[Path]:
    """Write one block file per party: ``out_dir/party-K.npz``.

    Parameters
    ----------
    problem : hyfl.problem.Problem
        The data (``X``, encoded labels ``Y``).
    partition : hyfl.partition.Partition
        Who holds which block (any partition, including ``entry_owner`` splits).
    out_dir : path-like
    name : str, optional
        Data set name recorded in the files.
    lam_default : float, optional
        The regularization a run uses when it sets ``lam=0`` (default: ``problem.lam``).
    intercept : float, default 0
        The value of the constant last feature ``problem.X`` carries (0: none).
    scale : ndarray of shape (M,), optional
        The scales ``problem.X``'s features were divided by (each file keeps its own).

    Returns
    -------
    list of Path
        The files, party 0 first.
    """
    from hyfl.partition import client_block, stack

    blocks = stack(partition, problem.X)
    # Raw feature values and labels: private from their creation (hyfl._private_files).
    out = private_folder(out_dir)
    paths = []
    lam = float(problem.lam if lam_default is None else lam_default)
    for k in range(blocks.n_clients):
        samples, features, X = client_block(blocks, k)
        path = out / f"party-{k}.npz"
        with private_write(path, "wb") as f:
            np.savez(
                f,
                format=np.array(BLOCK_FORMAT), version=np.array(1), party=np.array(k),
                n_parties=np.array(blocks.n_clients), n_samples=np.array(blocks.n_samples),
                n_features=np.array(blocks.n_features), samples=samples.astype(np.int64),
                features=features.astype(np.int64), X_data=X.data, X_indices=X.indices,
                X_indptr=X.indptr, X_shape=np.array(X.shape), Y=problem.Y[samples],
                lam_default=np.array(lam), name=np.array(name or "data"),
                partition=np.array(getattr(partition, "name", "") or "blocks"),
                intercept=np.array(float(intercept)),
                scale=(np.ones(features.size) if scale is None else
                       np.asarray(scale, dtype=np.float64)[features]),
            )
        paths.append(path)
    return paths


def read_block(path: str | os.PathLike, party: int | None = None) -> Block:
    """Read a block file; ``party`` (the node's index) must match the file's."""
    where = Path(path)
    if not where.is_file():
        raise fail(f"block file {where}", "does not exist on this machine",
                   "Copy the party's file from `hyfl deploy split` here, or pass a dataset name.")
    culprit, fix = f"block file {where}", "Pass a party-K.npz written by `hyfl deploy split`."
    f = read_npz(where, culprit, f"a {BLOCK_FORMAT} file", fix, kinds="biufU", expect=_MEMBERS,
                 known=(*_MEMBERS, *_OPTIONAL_MEMBERS))
    if str(f["format"]) != BLOCK_FORMAT:
        raise fail(culprit, f"is not a {BLOCK_FORMAT} file", fix)
    samples, features = f["samples"].astype(np.int64), f["features"].astype(np.int64)
    n_samples, n_features = int(f["n_samples"]), int(f["n_features"])
    for name, ids, n in (("samples", samples, n_samples), ("features", features, n_features)):
        if np.any(np.diff(ids) <= 0) or (ids.size and (ids[0] < 0 or ids[-1] >= n)):
            raise fail(culprit, f"has {name} that are not ascending ids below n_{name} = {n}",
                       fix)
    shape = tuple(int(v) for v in f["X_shape"])
    if shape != (samples.size, features.size):
        raise fail(culprit, f"has X_shape {shape}, not (samples, features) = "
                   f"({samples.size}, {features.size})", fix)
    try:
        X = sp.csr_matrix((f["X_data"], f["X_indices"], f["X_indptr"]), shape=shape)
        X.check_format(full_check=True)  # column indices within the shape, too
        Y = np.asarray(f["Y"], dtype=float).reshape(shape[0], -1)
    except ValueError as err:
        raise fail(culprit, f"has a matrix or labels that do not fit its shape ({err})",
                   fix) from None
    # Files written before intercepts and scaling (neither member): none of either.
    intercept = float(f["intercept"]) if "intercept" in f else 0.0
    scale = np.asarray(f["scale"], dtype=np.float64) if "scale" in f else None
    if not (np.isfinite(intercept) and intercept >= 0) or (scale is not None and (
            scale.shape != features.shape or not np.all(np.isfinite(scale) & (scale > 0)))):
        raise fail(culprit, "has an intercept or feature scales that are not finite and "
                   "positive, one per feature", fix)
    block = Block(party=int(f["party"]), samples=samples, features=features, X=X, Y=Y,
                  n_samples=n_samples, n_features=n_features,
                  lam_default=float(f["lam_default"]), name=str(f["name"]),
                  intercept=intercept, scale=scale)
    if party is not None and block.party != party:
        raise fail(f"block file {where}", f"is party {block.party}'s, but this node is party "
                   f"{party}", f"Give this node party-{party}.npz, or set party={block.party}.")
    return block


def load_block(node, config) -> Block:
    """The block of ``node``'s party: from a block file, or cut from a data set.

    Only the data the node config names are read (its ``data`` and
    ``data-dir``); the job -- ``config``, the
    :class:`~hyfl.deploy.config.DeployConfig` -- gives at most the partition
    spec and seed that cut a named dataset (module docstring).
    """
    party, source = node.party, node.data
    if not source:
        raise fail(
            "node config data", f"is not set: party {party} reads only the data its node "
            "config names",
            "Give the node its block file (node config data='party-K.npz', from `hyfl deploy "
            "split`; hyfl deploy party --data), or a dataset name with the run's partition spec.",
        )
    if source.endswith(".npz"):
        block = read_block(source, party)
        _check_prepared_alike(block, config, source)
        return block
    from hyfl.data import is_party_spec, lambda_for, load_data
    from hyfl.partition import client_block, stack

    if is_party_spec(source):
        raise fail(
            f"data {source!r}", "is a spec of several party files, but a party reads only its "
            "own file",
            "Give each party's node config its own file (data='bank.csv', with id-column and "
            "label-column): the parties align their files over the network. `hyfl deploy "
            "local --data parties:...` does that for files on one machine.",
        )
    if not config.partition:
        raise fail("run config partition", "is not set",
                   f"Parties that cut their block from {source!r} need the partition spec, "
                   "e.g. partition=grid:2x2 (K*Q = parties).")
    dataset = load_data(source, node.data_dir or None)
    lam_default = lambda_for(source, dataset.X.shape[0])
    dataset, problem, partition, scale = prepare_data(
        dataset, config.loss, config.lam or lam_default, spec=config.partition,
        seed=config.seed, intercept=config.intercept, standardize=config.standardize)
    if partition.n_clients != config.parties:
        raise fail(f"run config partition {config.partition!r}",
                   f"has {partition.n_clients} clients but the run has {config.parties} parties",
                   "Make them equal (grid:KxQ has K*Q clients).")
    if not 0 <= party < partition.n_clients:
        raise fail("node config party", f"is {party}, outside the partition's "
                   f"{partition.n_clients} clients", f"Use 0 to {partition.n_clients - 1}.")
    samples, features, X = client_block(stack(partition, problem.X), party)
    return Block(party=party, samples=samples.astype(np.int64),
                 features=features.astype(np.int64), X=X, Y=problem.Y[samples],
                 n_samples=problem.n_samples, n_features=problem.n_features,
                 lam_default=float(lam_default), name=dataset.name,
                 intercept=float(config.intercept),
                 scale=None if scale is None else scale[features])


def prepare_data(dataset, loss: str, lam: float, *, partition=None, spec: str = "",
                 seed: int = 0, intercept: float = 0.0, standardize: bool = False):
    """The data a deployment trains on, prepared as ``hyfl run`` prepares them.

    With ``intercept`` S the data gain a constant last column (a spec then
    splits it with the others; a given ``partition`` -- party files -- gives
    each sample's constant to its first holder). With ``standardize`` every
    feature is divided by its deviation from the clients' secure sum with the
    run's seed (:func:`hyfl.privacy.secure_scaling.secure_feature_scales`; the
    constant column kept): a party that cuts its block from a named dataset
    holds all of it, so every party computes the same scales.

    Returns
    -------
    (dataset, problem, partition, scale)
        The dataset with its constant column, the problem, the partition and
        the scales (M,) or None.
    """
    import dataclasses

    from hyfl.partition import parse_partition, with_constant_feature
    from hyfl.problem import make_problem

    if intercept:
        from hyfl.data.dataset import with_intercept

        dataset = with_intercept(dataset, intercept)
        if partition is not None:
            partition = with_constant_feature(partition, dataset.X)
    problem = make_problem(dataset, loss, lam)
    if partition is None:
        partition = parse_partition(spec, problem.X, seed=seed, meta=dataset.meta,
                                    labels=dataset.y)
    scale = None
    if standardize:
        from hyfl.privacy.secure_scaling import scale_columns, secure_feature_scales

        keep = [problem.n_features - 1] if intercept else None
        scale = secure_feature_scales(partition, problem.X, np.random.default_rng([seed, 3]),
                                      keep=keep)
        problem = dataclasses.replace(problem, X=scale_columns(problem.X, scale))
    return dataset, problem, partition, scale


def _check_prepared_alike(block: Block, config, source: str) -> None:
    """A block file is prepared when it is split: the job must ask for what it holds."""
    scaled = block.scale is not None and not np.all(block.scale == 1.0)
    if block.intercept != config.intercept or (config.standardize and not scaled):
        held = (f"intercept {block.intercept:g}" if block.intercept else "no intercept") + (
            ", scaled features" if scaled else "")
        raise fail(f"block file {source}", f"holds {held}, but the job asks for intercept "
                   f"{config.intercept:g}{' and standardize' if config.standardize else ''}",
                   "Split the data as the job trains them (hyfl deploy split --intercept S "
                   "--standardize), or submit the job with the files' intercept and "
                   "standardize.")

