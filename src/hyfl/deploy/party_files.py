"""A party that brings its own file: its side of the alignment over the network.

A party whose node config names a party file (``data='hospital.csv'``: CSV or
Parquet with an id column, its feature columns and optionally a label column,
the format of :mod:`hyfl.data.parties`) does not know its block's global ids
when the run starts. Before the set-up the server runs the alignment of
:mod:`hyfl.privacy.alignment` through four messages, all relayed by it. One
rule holds throughout: a party uses a value the server relays only after
checking that the party it names made it, for this run, at this place.

``hello``
    The party reads its file and answers with its number of ids, its column
    names and their keys (:func:`hyfl.privacy.alignment.column_keys`), what its
    labels are (their kind, and for classification their distinct values), its
    ids blinded with a fresh secret scalar in a fresh secret order, a fresh
    nonce, the public half of its label-channel key, and a tag over all that
    its peers will see (:func:`hyfl.privacy.alignment.hello_tag`, keyed with the
    key holders' secret).
``align``
    Every party's hello as sent (lists, nonces, channel keys, column keys, tags)
    and the task and classes -> the peers' lists blinded again with its scalar.
    The party first checks every peer's tag for its place and its own place
    against what it sent (a list extended with guessed ids, moved to another
    place or replaced is refused before anything is blinded), then computes the
    run's identity (:func:`hyfl.privacy.alignment.alignment_identity`) and
    numbers the features itself from the column keys. The server joins the
    results (:func:`hyfl.privacy.alignment.join`) and numbers the samples.
``labels``
    For each peer, the pairs of rows the party shares with it (its position and
    the peer's, in an order the server gives both), every peer's re-blinding of
    the party's list under that peer's tag (the party checks the pairs against
    the join it computes itself: none left out, none added) and the global
    numbers of the party's rows (each row's number enters its seal) -> for every such peer, its
    labels of those rows (NaN where it has none), sealed for that peer and bound
    to the run, the pair, the classes and the blinded ids of each row
    (:func:`hyfl.privacy.alignment.label_context`). When the job standardizes
    (run config ``standardize``), the message also numbers the party's columns,
    which must be the numbering the party derived, and the reply adds the sums
    and sums of squares of its columns, masked per cell for a secure sum
    (:func:`hyfl.privacy.secure_scaling.masked_message`, with masks from the
    pairs' channel keys and the run's identity): the server adds the replies
    and learns only the totals.
``block``
    Its positions' global sample indices (those of ``labels``; at ``setup`` the
    party checks that every peer's announced samples meet its own exactly in the
    ones they share, :func:`check_numbering`), its columns' global feature indices
    (again checked against its own numbering), the labels its peers sealed for
    it -- one list from every peer it shares rows with, each opened only on
    the rows it was sealed for (and the totals of the secure sum, used only if
    they carry the parties' summed check sum,
    :func:`hyfl.privacy.secure_scaling.verify_totals`) -> the
    ``hello`` reply of any other party (its block's ids and sizes, with the
    announcement tag), after which the run goes on exactly as with a block file.
    With ``standardize`` the party divides each column by its deviation from
    the totals; with an ``intercept`` S it appends a constant column (global
    feature ``n_features``) of value S to the rows it holds first (no peer of a
    lower number holds them), as ``hyfl run`` does for party files
    (:func:`hyfl.partition.with_constant_feature`).

Cells two parties hold (a column both have, for samples both hold) are the lower-numbered
party's, as :func:`hyfl.data.parties.load_parties` makes the first holder own them: at
``labels`` the other party sets them to 0 in its values (its block and its column sums),
knowing from the checked ``align`` message which columns each peer holds and from the join
which rows. The partition, the standardization and so the iterates are ``hyfl run``'s
on the same files (tests/test_deploy_accepts.py). That the two values agree is not
checked here (neither party sees the other's); ``hyfl deploy local``, which reads all
files, checks it as ``hyfl run`` does before it starts anything.

What leaves the party: its number of ids and rows, its column names (the
features' names are the schema every party and the server work with) and
their keys, the distinct values of a classification label (not which row has
which), blinded ids in an order that is not its file's, labels sealed for the
peers that hold the same samples, and with ``standardize`` masked column
sums, whose total tells everybody each feature's mean and deviation. Never
an id or a feature value. Each refusal names the message and the field
(tests/test_relayed_values.py).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from hyfl.deploy.blocks import Block
from hyfl.errors import fail
from hyfl.privacy.alignment import (
    POINT_BYTES,
    BlindingKey,
    ChannelKey,
    alignment_identity,
    column_keys,
    hash_ids,
    hello_tag,
    join,
    label_context,
    number_features,
    pairing_digest,
    reblinded_tag,
    relay_key,
    seal,
    unseal,
)

__all__ = ["ALIGN_KINDS", "HELLO_FIELDS", "align_parties", "is_party_file", "on_align", "on_block",
           "on_labels", "open_file", "pair_key"]

#: The alignment's messages after ``hello``, in protocol order.
ALIGN_KINDS = ("align", "labels", "block")
#: The most distinct label values a party reports for a classification task.
MAX_CLASSES = 1000
_UNKNOWN = np.nan


def is_party_file(source: str) -> bool:
    """Whether a node config's ``data`` names a party file (CSV or Parquet)."""
    from hyfl.data.parties import PARTY_SUFFIXES

    return source.lower().endswith(PARTY_SUFFIXES)


def open_file(node, config, secret: bytes | None, log) -> tuple[dict, dict]:
    """Read the party's file; its alignment state and what its ``hello`` adds.

    Parameters
    ----------
    node : NodeSettings
    config : DeployConfig
    secret : bytes or None
        The key holders' shared secret (tags the channel key), None without a key.
    log : callable
        Receives progress lines (the party's own log).

    Returns
    -------
    state : dict
        Kept by the party until the ``block`` message: its secrets, values and labels.
    hello : dict
        The ``align`` field of its ``hello`` reply.
    """
    from hyfl.data.parties import read_party_file
    from hyfl.losses import get_loss

    if not node.id_column:
        raise fail("node config id-column", "is empty", "Name the id column, e.g. id-column='id'.")
    path = Path(node.data)
    table = read_party_file(path, party=f"party {node.party}", id_column=node.id_column,
                            label_column=node.label_column or None)
    if not table.features:
        raise fail(table.culprit, "has no feature columns (only ids and labels)",
                   "In a deployment every party holds features: add this party's feature "
                   "columns, or give its labels to a party that holds the same samples.")
    classification = get_loss(config.loss).classification
    labels, label_info = _labels_of(table, classification)
    key, channel = BlindingKey(), ChannelKey()
    n = len(table.ids)
    # The list goes out in a fresh secret order, not the file's: positions in it tell the
    # server and the peers nothing of the file's order (a file sorted by a private column
    # would otherwise show its ranking), and every row number the server sends back is a
    # position in this list (``order`` maps it to the file's row).
    order = np.random.default_rng(secrets.randbits(128)).permutation(n)
    log(f"party file {path.name}: {n} ids, {len(table.features)} columns; blinding the ids")
    ids = np.asarray(table.ids, dtype=object)[order]
    blinded = key.apply(hash_ids(list(ids)), _progress(log, "blinded", n), "the party's ids")
    nonce = secrets.token_bytes(16)
    public = channel.public
    keys = column_keys(list(table.features), secret)
    tag = b"" if secret is None else hello_tag(secret, node.party, nonce, public, blinded, keys)
    state = {"key": _bytes(key.secret), "channel": _bytes(channel.secret),
             "values": table.values, "labels": labels, "name": path.name,
             "columns": list(table.features), "order": order, "blinded": blinded,
             "nonce": _bytes(nonce), "column_keys": keys, "classification": classification,
             "parties": int(config.parties),
             "ids": list(table.ids)}  # (kept here: only a scoring asker writes them out)
    hello = {"n_ids": n, "columns": list(table.features), "column_keys": keys,
             "labels": label_info, "blinded": blinded, "channel": _bytes(public),
             "nonce": _bytes(nonce), "tag": _bytes(tag) if tag else None}
    return state, hello


def _labels_of(table, classification: bool) -> tuple[Any, dict]:
    """The party's labels as kept until the classes are known, and what it reports."""
    if table.labels is None:
        return None, {"kind": "none"}
    known = table.label_known
    if table.labels.dtype == object:
        if not classification:
            raise fail(f"label column of {table.culprit}", "holds text, which cannot be a "
                       "regression target", "Use numeric labels, or a classification loss.")
        values = sorted({str(v) for v in table.labels[known]})
        kind = "text"
    else:
        values = sorted(set(table.labels[known].tolist())) if classification else []
        kind = "number"
    if len(values) > MAX_CLASSES:
        raise fail(f"label column of {table.culprit}", f"holds {len(values)} distinct values, "
                   f"more than the {MAX_CLASSES} classes a classification task may have",
                   "Use a regression loss (loss=squared) for real-valued targets.")
    # Kept as numbers: a classification label as its position among the party's own
    # values (mapped to the job's classes once they are known), a regression target as is.
    kept = np.full(known.size, _UNKNOWN)
    if not classification:
        kept[known] = table.labels[known]
    elif kind == "text":
        kept[known] = pd.Categorical(table.labels[known].astype(str), categories=values).codes
    else:
        kept[known] = np.searchsorted(values, table.labels[known].astype(float))
    return {"kind": kind, "kept": kept, "values": values}, {"kind": kind, "values": values}


def on_align(state: dict, payload: dict, party: int, secret: bytes | None, log) -> dict:
    """Check every peer's ``hello`` as relayed, then blind the peers' ids again.

    With the key holders' ``secret``, each peer's blinded ids, channel key, nonce
    and column keys must carry that peer's :func:`~hyfl.privacy.alignment.hello_tag`
    for its place, and this party's own place must hold what it sent: a list the
    server extended with guessed ids or moved to another party's place is refused
    before any point is blinded (tests/test_relayed_values.py). A peer's hello
    replayed from another run carries a genuine tag; it changes the run's identity
    instead (SHA-256 of the nonces), under which nothing this party seals or masks
    opens or cancels at a party that saw the real one. The features' numbering and
    the task are derived from the checked values; the peers' lists and their
    re-blinding are kept to bind the labels to their rows (:func:`on_labels`).
    """
    peers = np.asarray(payload["peers"], dtype=np.uint8)
    counts = np.asarray(payload["peer_counts"], dtype=np.int64)
    K = counts.size
    if (K != state["parties"] or K < party + 1 or counts[party] != 0 or np.any(counts < 0)
            or counts.sum() != peers.shape[0] or peers.shape[1:] != (POINT_BYTES,)):
        raise fail("the server's 'align' message", "has peer lists that do not add up",
                   _SAME_VERSION)
    publics = np.asarray(payload["channels"], dtype=np.uint8)
    nonces = np.asarray(payload["nonces"], dtype=np.uint8)
    keys = np.asarray(payload["column_keys"], dtype=np.uint8)
    key_counts = np.asarray(payload["column_counts"], dtype=np.int64)
    if (publics.shape != (K, 32) or nonces.shape != (K, 16) or key_counts.shape != (K,)
            or np.any(key_counts < 1) or keys.shape != (int(key_counts.sum()), POINT_BYTES)):
        raise fail("the server's 'align' message", "has channel keys, nonces or column keys "
                   "of the wrong shape", _SAME_VERSION)
    lists = dict(zip(range(K), np.split(peers, np.cumsum(counts)[:-1])))
    columns = np.split(keys, np.cumsum(key_counts)[:-1])
    own = (np.array_equal(publics[party], _own_public(state))
           and np.array_equal(nonces[party], state["nonce"])
           and np.array_equal(columns[party], state["column_keys"]))
    if not own:
        raise fail(f"party {party}'s own hello as the server relays it", "differs from what "
                   "this party sent (its nonce, channel key or columns)", _FORGED)
    if secret is not None:
        tags = payload.get("tags")
        tags = None if tags is None else np.asarray(tags, dtype=np.uint8)
        if tags is None or tags.shape != (K, 32):
            raise fail("the server's 'align' message", "carries the peers' hellos without "
                       "their tags", _FORGED)
        for j in range(K):
            if j == party:
                continue
            expected = hello_tag(secret, j, nonces[j].tobytes(), publics[j].tobytes(),
                                 lists[j], columns[j])
            if not secrets.compare_digest(expected, tags[j].tobytes()):
                raise fail(f"party {j}'s hello as the server relays it", "does not carry party "
                           f"{j}'s tag (its blinded ids, channel key, nonce or columns were "
                           "changed, or are another party's or another run's)", _FORGED)
    state["run"] = _bytes(alignment_identity([row.tobytes() for row in nonces]))
    if secret is not None:  # the secure sum's check sum (its totals are verified at block)
        from hyfl.privacy.secure_scaling import check_key

        state["check_key"] = _bytes(check_key(secret, bytes(state["run"])))
    features, n_features = number_features(columns)
    state["features"], state["n_features"] = features[party], n_features
    # Every party's columns (global ids), for the cells a lower-numbered peer owns (on_labels).
    state["all_features"] = np.concatenate(features).astype(np.int64)
    state["feature_counts"] = key_counts
    state["task"], state["classes"] = _checked_task(state, payload)
    state["publics"], state["peers"], state["peer_counts"] = publics, peers, counts
    key = BlindingKey(bytes(state["key"]))
    log(f"re-blinding {peers.shape[0]} ids of {K - 1} peers")
    reblinded = key.apply(peers, _progress(log, "re-blinded", peers.shape[0]),
                          "the peers' blinded ids")
    state["reblinded"] = reblinded
    reply = {"reblinded": reblinded}
    if secret is not None:  # each peer's list re-blinded, tagged for its owner (on_labels)
        key = relay_key(secret, bytes(state["run"]))
        state["relay_key"] = _bytes(key)
        tags = np.zeros((K, 32), dtype=np.uint8)
        for j in range(K):
            if j != party:
                tags[j] = _bytes(reblinded_tag(key, party, j, _chunk(reblinded, counts, j)))
        reply["tags"] = tags
    return reply


def _chunk(points: np.ndarray, counts: np.ndarray, j: int) -> np.ndarray:
    """Party ``j``'s part of a concatenation of lists of ``counts`` points each."""
    start = int(np.sum(counts[:j]))
    return points[start:start + int(counts[j])]


def _checked_task(state: dict, payload: dict) -> tuple[str, list]:
    """The task and classes the server names, checked against what this party knows: the
    classes in their one sorted order (the server numbers them so), each once, the
    party's own values among them, and the task their number makes."""
    task, classes = str(payload["task"]), list(payload["classes"])
    labels = state["labels"]
    if not state["classification"]:
        ok = task == "regression" and not classes
    else:
        text = bool(classes) and all(isinstance(c, str) for c in classes)
        try:
            values = [str(c) if text else float(c) for c in classes]
            ordered = values == sorted(set(values))
        except (TypeError, ValueError):
            ordered = False
        own = [] if labels is None else labels["values"]
        same_kind = labels is None or text == (labels["kind"] == "text")
        ok = (ordered and same_kind and len(classes) >= 2 and set(own) <= set(values)
              and task == ("binary" if len(classes) == 2 else "multiclass"))
    if not ok:
        raise fail("the server's 'align' message fields task and classes", f"({task!r}, "
                   f"{len(classes)} classes) do not fit this party's labels and loss", _FORGED)
    return task, classes


def on_labels(state: dict, payload: dict, party: int) -> dict:
    """The party's labels of the rows it shares with each peer, sealed for that peer; with
    ``standardize``, its masked column sums.

    For every peer the party seals a list (its labels of the rows they share, NaN where it
    has none; empty if they share none), bound to the run, both parties, the task, classes
    and feature count, and the blinded ids of the rows
    (:func:`~hyfl.privacy.alignment.pairing_digest`): the receiver opens it only on its
    rows of the same samples in the same order, so a server that reorders or swaps rows,
    or shows the parties different runs, stops the run (tests/test_relayed_values.py).
    The column sums are masked
    per cell with the run's identity, and sent only for the numbering this party derived
    itself from the tagged column lists.
    """
    positions, peer_positions, counts = _shared(payload, state)
    _check_join(state, payload, party, positions, peer_positions, counts)
    state["samples"], state["n_samples"] = _numbering(state, payload)
    order = np.asarray(state["order"], dtype=np.int64)
    state["shared"] = {"rows": order[positions], "counts": counts,
                       "positions": positions, "peer_positions": peer_positions}
    _drop_peer_cells(state, party)
    own = _label_values(state)
    sealed = {}
    # A list for every peer, empty where they share no rows: each confirms to its receiver
    # that both parties see one run (its identity and numbering are in the seal), so a view
    # the server showed some parties otherwise stops the run at ``block``.
    for j in (j for j in range(counts.size) if j != party):
        chunk = np.split(positions, np.cumsum(counts)[:-1])[j]
        values = np.full(chunk.size, _UNKNOWN) if own is None else own[order[chunk]]
        sealed[str(j)] = seal(_pair_key(state, party, j), values,
                              labels_context(state, party, j, sender=True))
    reply: dict[str, Any] = {"sealed": sealed}
    if payload.get("moments_features") is not None:
        reply["moments"], check = _masked_moments(state, payload, party)
        if check is not None:
            reply["moments_check"] = check
    return reply


def _drop_peer_cells(state: dict, party: int) -> None:
    """Leave out the cells a lower-numbered peer holds too: the rows this party shares with
    peer ``j < party`` in the columns both hold become 0 here (the peer's value is the
    cell's), as :func:`hyfl.data.parties.load_parties` makes the first party in order own a
    cell several parties hold. The party still holds those columns (its other rows' cells are
    its own): its block, its column sums and so the standardization count each cell once,
    and the partition is the one ``hyfl run`` builds from the same files."""
    counts = np.asarray(state["shared"]["counts"], dtype=np.int64)
    split = np.cumsum(counts)[:-1]
    chunks = np.split(np.asarray(state["shared"]["rows"], dtype=np.int64), split)
    feature_counts = np.asarray(state["feature_counts"], dtype=np.int64)
    peers = np.split(np.asarray(state["all_features"], dtype=np.int64),
                     np.cumsum(feature_counts)[:-1])
    own = np.asarray(state["features"], dtype=np.int64)
    values = np.array(state["values"], dtype=np.float64)  # a writable copy
    dropped = 0
    for j in range(min(party, counts.size)):
        rows = chunks[j]
        columns = np.flatnonzero(np.isin(own, peers[j]))
        if rows.size and columns.size:
            dropped += int(np.count_nonzero(values[np.ix_(rows, columns)]))
            values[np.ix_(rows, columns)] = 0.0
    state["values"], state["dropped_cells"] = values, dropped


def _check_join(state: dict, payload: dict, party: int, positions: np.ndarray,
                peer_positions: np.ndarray, counts: np.ndarray) -> None:
    """The pairs of the ``labels`` message must be this party's join with each peer, which
    it computes itself: its own re-blinding of the peer's (tagged) list against the
    peer's re-blinding of its own list, which the server relays under the peer's
    :func:`~hyfl.privacy.alignment.reblinded_tag`. A shared pair left out (the server
    could then number the sample twice, at each holder otherwise, unnoticed), or a pair
    added, stops the run. What the party learns is what the message tells it anyway:
    which of its rows each peer holds, at which of the peer's positions."""
    n = len(state["values"])
    sizes = np.asarray(state["peer_counts"], dtype=np.int64)
    K = sizes.size
    doubles = payload.get("doubles")
    doubles = None if doubles is None else np.asarray(doubles, dtype=np.uint8)
    if doubles is None or doubles.shape != ((K - 1) * n, POINT_BYTES):
        raise fail("the server's 'labels' message", f"does not relay every peer's re-blinding "
                   f"of this party's {n} ids (field doubles)", _FORGED)
    key = state.get("relay_key")
    tags = payload.get("double_tags")
    if key is not None:
        tags = None if tags is None else np.asarray(tags, dtype=np.uint8)
        if tags is None or tags.shape != (K, 32):
            raise fail("the server's 'labels' message", "relays the peers' re-blindings "
                       "without their tags", _FORGED)
    split = np.cumsum(counts)[:-1]
    mine, theirs = np.split(positions, split), np.split(peer_positions, split)
    chunks = iter(np.split(doubles, K - 1)) if K > 1 else iter(())
    for j in range(K):
        if j == party:
            continue
        of_mine = next(chunks)  # party j's re-blinding of this party's list
        if key is not None and not secrets.compare_digest(
                reblinded_tag(bytes(key), j, party, of_mine), tags[j].tobytes()):
            raise fail(f"party {j}'s re-blinding of party {party}'s ids as the server relays "
                       "it", f"does not carry party {j}'s tag for this run", _FORGED)
        rows_mine, rows_theirs = join(of_mine, _chunk(state["reblinded"], sizes, j),
                                      (f"party {party}", f"party {j}"))
        order = np.argsort(mine[j], kind="stable")
        if not (np.array_equal(mine[j][order], rows_mine)
                and np.array_equal(theirs[j][order], rows_theirs)):
            raise fail("the server's 'labels' message", f"names other rows than the "
                       f"{rows_mine.size} this party shares with party {j} (a shared sample "
                       "left out, or one added)", _FORGED)


def _numbering(state: dict, payload: dict) -> tuple[np.ndarray, int]:
    """The global sample numbers of the party's positions (``labels``; bound into every
    seal row by row, so that two holders of one sample given two numbers stop the run)."""
    samples = np.asarray(payload.get("samples", np.zeros(0, np.int64)), dtype=np.int64)
    n_rows = len(state["values"])
    n_samples = payload.get("n_samples")
    if (not isinstance(n_samples, int) or samples.shape != (n_rows,)
            or np.unique(samples).size != n_rows
            or (n_rows and (samples.min() < 0 or samples.max() >= n_samples))):
        raise fail("the server's 'labels' message fields samples and n_samples", "do not number "
                   f"this party's {n_rows} rows with distinct ids below n_samples", _FORGED)
    return samples, int(n_samples)


def numbering_record(state: dict) -> dict:
    """What :func:`check_numbering` needs at ``setup``: per peer, the sorted global numbers
    of the samples this party shares with it (as the checked join and the seals fixed)."""
    counts = state["shared"]["counts"]
    numbers = np.asarray(state["samples"], dtype=np.int64)
    chunks = np.split(state["shared"]["positions"], np.cumsum(counts)[:-1])
    return {"counts": np.asarray(counts, dtype=np.int64),
            "numbers": np.concatenate([np.sort(numbers[c]) for c in chunks]
                                      or [np.empty(0, np.int64)]).astype(np.int64)}


def check_numbering(record: dict | None, samples: list, party: int, n_samples: int) -> None:
    """At ``setup``: every peer's samples (under their owners' announcement tags) meet this
    party's exactly in the samples the two share, and every number has a holder. With
    the seals (one number per shared sample at both holders) this leaves the server no
    numbering but a consistent one: two different samples given one number (a sample
    of this party's made a peer's), or a number nobody holds, stop the run."""
    if record is None:
        return
    counts = np.asarray(record["counts"], dtype=np.int64)
    expected = np.split(np.asarray(record["numbers"], dtype=np.int64), np.cumsum(counts)[:-1])
    culprit = f"the server's 'setup' message to party {party}"
    if len(samples) != counts.size:
        raise fail(culprit, f"has {len(samples)} parties, the alignment {counts.size}", _FORGED)
    own = np.asarray(samples[party], dtype=np.int64)
    for j in range(counts.size):
        if j != party and not np.array_equal(
                np.intersect1d(own, np.asarray(samples[j], dtype=np.int64)), expected[j]):
            raise fail(culprit, f"gives party {j} other samples in common with this party than "
                       "the ones the two share (two samples under one number)", _FORGED)
    held = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in samples]))
    if held.size != n_samples:
        raise fail(culprit, f"numbers {n_samples} samples, of which the parties hold "
                   f"{held.size}", _FORGED)


def labels_context(state: dict, party: int, peer: int, sender: bool) -> bytes:
    """The associated data of the labels sealed between this party and ``peer``, as this
    party computes it (:func:`~hyfl.privacy.alignment.label_context`): its own blinded
    ids of the shared rows, the peer's (from the checked ``align`` message) and the
    doubly blinded ids it made of the peer's, row by row in the server's order."""
    counts = state["shared"]["counts"]
    split = np.cumsum(counts)[:-1]
    mine = np.split(state["shared"]["positions"], split)[peer]
    theirs = np.split(state["shared"]["peer_positions"], split)[peer]
    start = int(np.sum(state["peer_counts"][:peer]))
    peer_ids = np.asarray(state["peers"], dtype=np.uint8)[start:][theirs]
    doubles = np.asarray(state["reblinded"], dtype=np.uint8)[start:][theirs]
    own_ids = np.asarray(state["blinded"], dtype=np.uint8)[mine]
    numbers = np.asarray(state["samples"], dtype=np.int64)[mine]  # this side's own numbers
    pairing = (pairing_digest(own_ids, peer_ids, doubles, numbers) if sender
               else pairing_digest(peer_ids, own_ids, doubles, numbers))
    sender_id, receiver_id = (party, peer) if sender else (peer, party)
    return label_context(bytes(state["run"]), sender_id, receiver_id, _task_digest(state),
                         pairing)


def _task_digest(state: dict) -> bytes:
    """SHA-256 of the task and classes this party was given (the labels are class indices:
    both ends of a channel must read them alike) and of the feature count it derived."""
    import hashlib
    import json

    text = json.dumps([state["task"], [str(c) for c in state["classes"]],
                       int(state["n_features"]), int(state["n_samples"])])
    return hashlib.sha256(text.encode()).digest()


def _masked_moments(state: dict, payload: dict, party: int
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """The party's column sums and sums of squares (2, M) in global features, masked per
    cell with every peer's pairwise key and the run's identity
    (:func:`hyfl.privacy.secure_scaling.masked_message`), and (with the key holders'
    secret) their masked check sum (:func:`hyfl.privacy.secure_scaling.masked_check`)."""
    from hyfl.privacy.secure_scaling import column_moments, masked_check, masked_message

    values = state["values"]
    features = np.asarray(payload["moments_features"], dtype=np.int64)
    n_features = int(payload["n_features"]) if payload.get("n_features") is not None else -1
    # The numbering must be the one this party derived from its peers' tagged column
    # lists: a count or column ids of the server's choosing would let one party's sums
    # fill cells where its peers send nothing but masks.
    if not (np.array_equal(features, state["features"]) and n_features == state["n_features"]):
        raise fail("the server's 'labels' message fields moments_features and n_features",
                   f"number this party's {values.shape[1]} columns otherwise than the "
                   f"parties' tagged column lists do ({state['n_features']} features)", _FORGED)
    if len(state["publics"]) < 2:  # no peer, no mask: the sums would go out in the clear
        raise fail("the job's standardize", "needs a secure sum of two parties or more",
                   "Run with two parties or more, or without standardize.")
    state["moments_features"] = features
    moments = column_moments(values, features, n_features)
    peers = {j: _pair_key(state, party, j) for j in range(len(state["publics"])) if j != party}
    run = bytes(state["run"])
    check = None
    if state.get("check_key") is not None:
        check = masked_check(moments, party, peers, run, bytes(state["check_key"]))
    return masked_message(moments, party, peers, run), check


def on_block(state: dict, payload: dict, node, log, config=None) -> Block:
    """Build the party's block from its global ids and the labels its peers sealed (and
    with the job's ``config`` -- a :class:`~hyfl.deploy.config.DeployConfig` -- standardized
    and with its intercept)."""
    party = node.party
    values = state["values"]
    n_rows, n_columns = values.shape
    samples = np.asarray(payload["samples"], dtype=np.int64)
    features = np.asarray(payload["features"], dtype=np.int64)
    n_samples, n_features = int(payload["n_samples"]), int(payload["n_features"])
    for name, ids, size, n in (("samples", samples, n_rows, n_samples),
                               ("features", features, n_columns, n_features)):
        if ids.shape != (size,) or np.unique(ids).size != size or (
                size and (ids.min() < 0 or ids.max() >= n)):
            raise fail(f"the server's 'block' message field {name}", "does not number this "
                       f"party's {size} {'rows' if name == 'samples' else 'columns'} with "
                       f"distinct ids below {n}", "Both sides must run the same hyfl version.")
    if not (np.array_equal(samples, state["samples"]) and n_samples == state["n_samples"]):
        raise fail("the server's 'block' message fields samples and n_samples", "number this "
                   "party's rows otherwise than its 'labels' message did", _FORGED)
    if not (np.array_equal(features, state["features"]) and n_features == state["n_features"]):
        raise fail("the server's 'block' message fields features and n_features", "number "
                   "this party's columns otherwise than the parties' tagged column lists do",
                   _FORGED)
    by_row = np.empty(n_rows, dtype=np.int64)
    by_row[np.asarray(state["order"], dtype=np.int64)] = samples  # positions -> file rows
    samples = by_row
    labels = _label_values(state)
    labels = np.full(n_rows, _UNKNOWN) if labels is None else labels.copy()
    source = np.where(np.isnan(labels), -1, party)  # who gave each row its label
    rows, counts = state["shared"]["rows"], state["shared"]["counts"]
    sealed = payload.get("sealed") or {}
    unexpected = sorted(set(sealed) - {str(j) for j in range(counts.size) if j != party})
    if unexpected:
        raise fail("the server's 'block' message field sealed", f"has labels from "
                   f"{unexpected[0]!r}, which is not a peer of this party", _FORGED)
    for j, chunk in enumerate(np.split(rows, np.cumsum(counts)[:-1])):
        if j == party:
            continue
        what = f"the labels party {j} sealed for party {party}"
        if str(j) not in sealed:  # every peer seals a list (for every shared row, or empty)
            raise fail(what, "are missing (the server held them back)", _FORGED)
        # Opened only with the run, the pair, the classes and the blinded ids of these
        # rows in this order: labels put on other rows, or in another order, stop here.
        theirs = unseal(_pair_key(state, party, j), sealed[str(j)],
                        labels_context(state, party, j, sender=False), what)
        if theirs.shape != chunk.shape:
            raise fail(f"the labels party {j} sent", f"are {theirs.size} for {chunk.size} "
                       "shared samples", "Both sides must run the same hyfl version.")
        mine = labels[chunk]
        differ = ~np.isnan(mine) & ~np.isnan(theirs) & (mine != theirs)
        if differ.any():
            other = int(source[chunk][differ][0])
            raise fail(f"parties {min(other, j)} and {max(other, j)}", f"give different labels "
                       f"to {int(differ.sum())} samples they both hold (seen by party {party})",
                       "Parties that both label a sample must give the same label: correct "
                       "one file, or drop the label column from one.")
        take = np.isnan(mine) & ~np.isnan(theirs)
        labels[chunk[take]] = theirs[take]
        source[chunk[take]] = j
    missing = int(np.isnan(labels).sum())
    if missing:
        raise fail(f"party {party} ({state['name']})", f"holds {missing} samples that no party "
                   "labels", "Give those samples a label in this file or in another party's "
                   "that holds them, or delete those rows.")
    order = np.argsort(samples)
    columns = np.argsort(features)
    X = sp.csr_matrix(values[np.ix_(order, columns)])
    X.eliminate_zeros()
    samples, features = samples[order], features[columns]
    from hyfl.data import fallback_lambda

    log(f"aligned: {n_rows} of {n_samples} samples, {n_columns} of {n_features} features")
    if state.get("dropped_cells"):
        log(f"left out {state['dropped_cells']} cells that a lower-numbered peer holds too "
            "(the samples and columns both hold: the peer's)")
    scale = None
    if config is not None and config.standardize:
        if state.get("moments_features") is None:
            raise fail("the server's 'labels' message", "asked for no column sums, which the "
                       "job's standardize needs", _FORGED)
        X, scale = _standardize(payload, X, features, n_samples, n_features, log,
                                state.get("check_key"), len(state["publics"]))
    intercept = 0.0 if config is None else float(config.intercept)
    if intercept:
        X, features, n_features, scale = _append_constant(state, party, order, X, features,
                                                          n_features, scale, intercept, log)
    return Block(party=party, samples=samples, features=features, X=X,
                 Y=_encode(labels[order], state["task"], len(state["classes"])),
                 n_samples=n_samples, n_features=n_features,
                 lam_default=fallback_lambda(n_samples),
                 name=state["name"], intercept=intercept, scale=scale)


def _standardize(payload: dict, X, features: np.ndarray, n_samples: int, n_features: int,
                 log, check_key=None, n_parties: int = 0):
    """The columns divided by their deviations from the secure sum's totals (with the key
    holders' secret: only totals that carry the parties' summed check sum)."""
    from hyfl.privacy.secure_scaling import (
        decode,
        scale_columns,
        scales_from_moments,
        verify_totals,
    )

    totals = np.asarray(payload.get("moments"))
    if totals.dtype != np.uint64 or totals.shape != (2, n_features):
        raise fail("the server's 'block' message field moments", f"is not the (2, {n_features}) "
                   "sum of the parties' masked column sums", "Both sides must run the same "
                   "hyfl version.")
    if check_key is not None and not verify_totals(
            totals, np.asarray(payload.get("moments_check", np.zeros(0, np.uint64))),
            n_parties, bytes(check_key)):
        raise fail("the server's 'block' message fields moments and moments_check", "are not "
                   "the sum of the parties' masked column sums of this run (the totals do not "
                   "carry the parties' summed check sum: altered, or of another run; or an "
                   "honest sum beyond the secure sum's range)", _FORGED)
    scale = scales_from_moments(decode(totals), n_samples)
    log("standardized: every feature divided by its deviation from the parties' secure sum")
    return scale_columns(X, scale[features]), scale[features]


def _append_constant(state: dict, party: int, order: np.ndarray, X, features: np.ndarray,
                     n_features: int, scale, intercept: float, log):
    """The block with the intercept's constant column (global feature ``n_features``) on the
    rows this party holds first: those no peer of a lower number shares."""
    rows, counts = state["shared"]["rows"], state["shared"]["counts"]
    lower = rows[:int(np.sum(counts[:party]))]  # the rows shared with peers 0 .. party-1
    first = np.ones(X.shape[0], dtype=bool)
    first[np.argsort(order)[lower]] = False  # file rows -> block rows (sorted by sample)
    if not first.any():  # every party counts the constant feature all the same
        return X, features, n_features + 1, scale
    column = sp.csr_matrix((np.full(int(first.sum()), intercept), (np.flatnonzero(first),
                            np.zeros(int(first.sum()), dtype=np.int64))), shape=(X.shape[0], 1))
    log(f"intercept: a constant {intercept:g} on the {int(first.sum())} samples held first here")
    return (sp.hstack([X, column], format="csr"), np.append(features, n_features),
            n_features + 1, None if scale is None else np.append(scale, 1.0))


def _label_values(state: dict) -> np.ndarray | None:
    """The party's labels in the job's terms: class index (classification) or value; NaN
    where the party has none."""
    labels = state["labels"]
    if labels is None:
        return None
    kept = np.asarray(labels["kept"], dtype=float)
    if state["task"] == "regression":
        return kept
    text = labels["kind"] == "text"
    position = {str(c) if text else float(c): i for i, c in enumerate(state["classes"])}
    lookup = np.array([position[str(v) if text else float(v)] for v in labels["values"]],
                      dtype=float)  # the party's own values -> the job's class index
    known = ~np.isnan(kept)
    out = np.full(kept.size, _UNKNOWN)
    out[known] = lookup[kept[known].astype(np.int64)]
    return out


def _encode(index: np.ndarray, task: str, n_classes: int) -> np.ndarray:
    """Labels as the loss reads them (as :func:`hyfl.problem.make_problem` encodes them)."""
    if task == "regression":
        return index[:, None]
    if task == "binary":
        return np.where(index == 1, 1.0, -1.0)[:, None]
    return np.where(index[:, None] == np.arange(n_classes)[None, :], 1.0, -1.0)


def _shared(payload: dict, state: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs of the ``labels`` message: this party's positions, the peers' positions
    (in the peers' lists of ``align``) and the count per peer, checked against the lists."""
    positions = np.asarray(payload["shared_rows"], dtype=np.int64)
    peer_positions = np.asarray(payload["peer_rows"], dtype=np.int64)
    counts = np.asarray(payload["shared_counts"], dtype=np.int64)
    sizes = np.asarray(state["peer_counts"], dtype=np.int64)
    n_rows = len(state["values"])
    if (counts.shape != sizes.shape or np.any(counts < 0) or counts.sum() != positions.size
            or peer_positions.shape != positions.shape):
        raise fail("the server's 'labels' message", "has shared rows that do not add up",
                   _SAME_VERSION)
    split = np.cumsum(counts)[:-1]
    for j, (mine, theirs) in enumerate(zip(np.split(positions, split),
                                           np.split(peer_positions, split))):
        if mine.size and (mine.min() < 0 or mine.max() >= n_rows or theirs.min() < 0
                          or theirs.max() >= sizes[j] or np.unique(mine).size != mine.size
                          or np.unique(theirs).size != theirs.size):
            raise fail("the server's 'labels' message", f"names rows that this party or "
                       f"party {j} does not have, or one row twice", _SAME_VERSION)
    return positions, peer_positions, counts


def _pair_key(state: dict, party: int, peer: int) -> bytes:
    channel = ChannelKey(bytes(state["channel"]))
    return channel.shared(bytes(state["publics"][peer]), (party, peer))


def pair_key(state: dict, party: int, peer: int) -> bytes:
    """The key ``party`` shares with ``peer`` from the alignment's channel keys (after
    ``align``): what its seals and secure-sum masks for that peer are keyed with."""
    return _pair_key(state, party, peer)


def _own_public(state: dict) -> np.ndarray:
    return _bytes(ChannelKey(bytes(state["channel"])).public)


def _bytes(value: bytes) -> np.ndarray:
    return np.frombuffer(value, dtype=np.uint8).copy()


def _progress(log, what: str, total: int):
    """A progress callback that logs about ten lines for a long list."""
    step = max(total // 10, 50_000)
    state = {"next": step}

    def report(done: int) -> None:
        if done >= state["next"] or (done == total and total >= step):
            log(f"{what} {done:,} of {total:,} ids")
            state["next"] = done + step

    return report


# -- the server's side ---------------------------------------------------------------------
#: The ``align`` field of a party file's ``hello`` (types of hyfl.deploy.codec.check_fields).
HELLO_FIELDS = {"n_ids": "int", "columns": "list", "column_keys": "matrix", "labels": "dict",
                "blinded": "matrix", "channel": "ids", "nonce": "ids", "tag": "ids?"}


def _checked_hellos(hellos: dict[int, dict]) -> tuple[dict[int, dict], list[int]]:
    """Each party's ``align`` field of its hello, checked (its fields, and shapes that
    match the number of ids it announces); and those numbers."""
    from hyfl.deploy.codec import check_fields
    from hyfl.privacy.alignment import POINT_BYTES

    K = len(hellos)
    info = {k: check_fields(hellos[k]["align"], HELLO_FIELDS, f"party {k}'s hello field align")
            for k in range(K)}
    sizes = [int(info[k]["n_ids"]) for k in range(K)]
    for k in range(K):
        if np.shape(info[k]["blinded"]) != (sizes[k], POINT_BYTES) or sizes[k] < 1:
            raise fail(f"party {k}'s hello", f"announces {sizes[k]} ids but sends "
                       f"{np.shape(info[k]['blinded'])} blinded ones", _SAME_VERSION)
        if np.shape(info[k]["column_keys"]) != (len(info[k]["columns"]), POINT_BYTES) or \
                np.shape(info[k]["nonce"]) != (16,):
            raise fail(f"party {k}'s hello", "has column keys or a nonce of the wrong shape",
                       _SAME_VERSION)
    return info, sizes


def _reblind(exchange, info: dict[int, dict], sizes: list[int], columns: list[list[str]],
             task, classes) -> tuple[dict[tuple[int, int], np.ndarray], np.ndarray, bool]:
    """Step 1: each party blinds its peers' lists again. Every party's hello goes to its
    peers as it was sent, with its tag (they check it). Returns ``double``, (owner,
    blinder) -> the owner's ids blinded by both in the owner's order; the blinders' tags,
    ``[blinder, owner]``; and whether every party tags."""
    from hyfl.privacy.alignment import POINT_BYTES

    K = len(sizes)
    channels = np.stack([np.asarray(info[k]["channel"], dtype=np.uint8) for k in range(K)])
    tagged = all(info[k].get("tag") is not None for k in range(K))
    shared_fields = {
        "channels": channels, "task": task, "classes": classes,
        "nonces": np.stack([np.asarray(info[j]["nonce"], dtype=np.uint8) for j in range(K)]),
        "column_keys": np.concatenate([np.asarray(info[j]["column_keys"], dtype=np.uint8)
                                       for j in range(K)]),
        "column_counts": np.array([len(columns[j]) for j in range(K)], dtype=np.int64)}
    if tagged:
        shared_fields["tags"] = np.stack([np.asarray(info[j]["tag"], dtype=np.uint8)
                                          for j in range(K)])
    messages = {}
    for k in range(K):
        peers = [np.asarray(info[j]["blinded"], dtype=np.uint8) for j in range(K) if j != k]
        payload = {"peers": np.concatenate(peers) if peers else np.empty((0, POINT_BYTES),
                                                                           dtype=np.uint8),
                   "peer_counts": np.array([0 if j == k else sizes[j] for j in range(K)]),
                   **shared_fields}
        messages[k] = ("align", payload)
    replies = exchange(messages)
    double_tags = np.zeros((K, K, 32), dtype=np.uint8)  # [blinder, owner]: blinder's tag
    for k in range(K):
        tags = replies[k].get("tags")
        if tags is not None:
            tags = np.asarray(tags, dtype=np.uint8)
            if tags.shape != (K, 32):
                raise fail(f"party {k}'s reply to 'align'", f"has tags of shape {tags.shape}",
                           _SAME_VERSION)
            double_tags[k] = tags
    double = {}  # (owner, blinder) -> the owner's ids blinded by both, in the owner's order
    for k in range(K):
        reblinded = np.asarray(replies[k]["reblinded"], dtype=np.uint8)
        expected = (sum(sizes) - sizes[k], POINT_BYTES)
        if reblinded.shape != expected:
            raise fail(f"party {k}'s reply to 'align'", f"has {reblinded.shape} points, not "
                       f"{expected}", _SAME_VERSION)
        start = 0
        for j in range(K):
            if j != k:
                double[(j, k)] = reblinded[start:start + sizes[j]]
                start += sizes[j]
    return double, double_tags, tagged


def _match_pairs(double: dict[tuple[int, int], np.ndarray], columns: list[list[str]],
                 hellos: dict[int, dict], log) -> dict[tuple[int, int], tuple]:
    """The samples each pair of parties shares (``(j, k)`` with ``j < k`` -> their rows,
    in both parties' orders), by joining the doubly blinded ids; logs the columns a pair
    holds both (those cells are the first holder's, as ``hyfl run`` does)."""
    from hyfl.privacy.alignment import join

    matches = {}
    for k in range(len(hellos)):
        for j in range(k):
            rows_j, rows_k = join(double[(j, k)], double[(k, j)], (f"party {j}", f"party {k}"))
            if rows_j.size:
                matches[(j, k)] = (rows_j, rows_k)
                both = [name for name in columns[k] if name in set(columns[j])]
                if both:  # cells both hold: party j's (the first holder's), as hyfl run does
                    log(f"{_named(hellos, j)} and {_named(hellos, k)} share {rows_j.size:,} "
                        f"samples and the columns {', '.join(both[:5])}"
                        f"{' ...' if len(both) > 5 else ''}: those cells are "
                        f"{_named(hellos, j)}'s, {_named(hellos, k)} leaves them out")
    return matches


def _exchange_labels(exchange, matches: dict, double: dict, double_tags: np.ndarray,
                     tagged: bool, index: list[np.ndarray], n_samples: int,
                     numbered: dict[int, np.ndarray], n_features: int, standardize: bool,
                     rng: np.random.Generator) -> tuple[dict[int, dict], Any, Any]:
    """Step 2: labels for the samples a peer holds too, in one order for both sides of a
    pair; each side is told the other's rows too (positions in the lists it re-blinded),
    to bind the labels to the blinded ids of their rows. Returns the labels each party
    sealed for each peer (recipient -> sender -> bytes) and, with ``standardize``, the
    secure sum of the features' moments and its check."""
    from hyfl.privacy.alignment import POINT_BYTES

    K = len(index)
    rows = {k: [np.empty(0, dtype=np.int64)] * K for k in range(K)}
    for (j, k), (rows_j, rows_k) in matches.items():
        order = rng.permutation(rows_j.size)
        rows[j][k], rows[k][j] = rows_j[order], rows_k[order]
    scaling = {k: ({"moments_features": numbered[k], "n_features": n_features}
                   if standardize else {}) for k in range(K)}
    replies = exchange({k: ("labels", {"shared_rows": np.concatenate(rows[k]),
                                       "peer_rows": np.concatenate([rows[j][k]
                                                                    for j in range(K)]),
                                       "shared_counts": np.array([r.size for r in rows[k]]),
                                       # every peer's re-blinding of k's list, with its tag:
                                       # k checks the pairs against its own join
                                       "doubles": np.concatenate(
                                           [double[(k, j)] for j in range(K) if j != k]
                                           or [np.empty((0, POINT_BYTES), np.uint8)]),
                                       **({"double_tags": double_tags[:, k]} if tagged
                                          else {}),
                                       "samples": index[k], "n_samples": n_samples,
                                       **scaling[k]})
                        for k in range(K)})
    moments = _sum_moments(replies, K, n_features) if standardize else None
    check = _sum_checks(replies, K) if standardize else None
    sealed = {}
    for j in range(K):
        for key, value in replies[j]["sealed"].items():
            if key not in {str(k) for k in range(K) if k != j} or not (
                    isinstance(value, np.ndarray) and value.dtype == np.uint8):
                raise fail(f"party {j}'s reply to 'labels'", f"seals labels for {key!r}, not "
                           "a peer", _SAME_VERSION)
            sealed.setdefault(int(key), {})[str(j)] = value
    return sealed, moments, check


def align_parties(hellos: dict[int, dict], exchange, config, log, *, job=None,
                  final=None) -> tuple[dict[int, dict], dict]:
    """The server's side: run the alignment; return the parties' block hellos and a record.

    ``job`` (task, classes), if given, is the task instead of the one the parties'
    labels make (a model's, when scoring: :mod:`hyfl.deploy.scoring`); ``final``, if
    given, replaces the ``block`` message: ``final(aligned) -> replies``, with
    ``aligned`` the numbering (``index``: each party's global samples by position,
    ``features``: its columns' global features, ``n_samples``, ``feature_names``).

    Parameters
    ----------
    hellos : dict
        Party -> its ``hello`` reply (each with an ``align`` field).
    exchange : callable
        ``exchange({party: (kind, payload)}) -> {party: reply}`` (the coordinator's,
        replies checked against ``REPLY_FIELDS``).
    config : DeployConfig
    log : callable
    """
    from hyfl.privacy.alignment import number_samples

    tic = time.perf_counter()
    K = len(hellos)
    info, sizes = _checked_hellos(hellos)
    columns = [[str(c) for c in info[k]["columns"]] for k in range(K)]
    features: dict[str, int] = {}  # column name -> global feature, by first appearance
    for names in columns:
        for name in names:
            features.setdefault(name, len(features))
    task, classes = (_job_labels({k: info[k]["labels"] for k in range(K)}, config.loss,
                                 [_named(hellos, k) for k in range(K)])
                     if job is None else job)
    log(f"aligning the parties' files: {', '.join(f'{n:,}' for n in sizes)} ids "
        f"({_task_text(task, classes)})")

    # 1. Each party blinds its peers' lists again; the pairs' shared samples.
    double, double_tags, tagged = _reblind(exchange, info, sizes, columns, task, classes)
    matches = _match_pairs(double, columns, hellos, log)
    rng = np.random.default_rng(secrets.randbits(128))  # fresh: no file order shows through
    index, n_samples = number_samples(sizes, matches, rng)
    holders = np.bincount(np.concatenate(index), minlength=n_samples)
    shared = [int(np.count_nonzero(holders[g] > 1)) for g in index]
    _check_overlap(columns, sizes, shared, config.min_common,
                   [_named(hellos, k) for k in range(K)])

    # 2. Labels for the samples a peer holds too.
    numbered = {k: np.array([features[name] for name in columns[k]], dtype=np.int64)
                for k in range(K)}
    sealed, moments, check = _exchange_labels(exchange, matches, double, double_tags, tagged,
                                              index, n_samples, numbered, len(features),
                                              config.standardize, rng)

    if final is not None:  # scoring (hyfl.deploy.scoring): no block, the job's own message
        replies = final({"index": index, "features": numbered, "n_samples": n_samples,
                         "feature_names": list(features), "sealed": sealed})
        record = {"ids": sizes, "n_samples": n_samples, "n_features": len(features),
                  "shared": shared, "task": task, "classes": classes,
                  "seconds": time.perf_counter() - tic}
        return {k: {**replies.get(k, {}), "node": hellos[k].get("node")} for k in range(K)}, record

    # 3. Each party's block: its global ids, and the labels sealed for it.
    replies = exchange({k: ("block", {
        "samples": index[k], "n_samples": n_samples, "n_features": len(features),
        "features": numbered[k], "sealed": sealed.get(k, {}),
        **({} if moments is None else {"moments": moments}),
        **({} if check is None else {"moments_check": check})}) for k in range(K)})
    seconds = time.perf_counter() - tic
    record = {"ids": sizes, "n_samples": n_samples, "n_features": len(features),
              "shared": shared, "task": task, "classes": classes, "seconds": seconds}
    if moments is not None:  # what the secure sum revealed to everybody (docs/privacy.md)
        from hyfl.privacy.secure_scaling import decode, scales_from_moments

        record["scales"] = scales_from_moments(decode(moments), n_samples).tolist()
    log(f"aligned in {seconds:.1f} s: {n_samples:,} samples "
        f"({int(np.count_nonzero(holders > 1)):,} held by two or more parties), "
        f"{len(features)} features")
    return {k: {**replies[k], "node": hellos[k].get("node")} for k in range(K)}, record


def _named(hellos: dict[int, dict], k: int) -> str:
    """Party ``k`` with the file name its hello gives (``party 1 (hospital.csv)``)."""
    name = hellos[k].get("name") if isinstance(hellos.get(k), dict) else None
    return f"party {k} ({name})" if name else f"party {k}"


_SAME_VERSION = "Run every party with the same hyfl version; the reply may be garbled or forged."
_FORGED = ("The server does not follow hyfl's protocol; the party answers no more messages of "
           "this run.")


def _sum_moments(replies: dict[int, dict], K: int, n_features: int) -> np.ndarray:
    """The server's part of the secure sum: the parties' masked column sums added (uint64);
    every party must send (the masks cancel only in the sum of all)."""
    from hyfl.privacy.secure_scaling import sum_messages

    messages = []
    for k in range(K):
        message = replies[k].get("moments")
        if not (isinstance(message, np.ndarray) and message.dtype == np.uint64
                and message.shape == (2, n_features)):
            raise fail(f"party {k}'s reply to 'labels'", f"has no (2, {n_features}) masked "
                       "column sums, which the job's standardize needs", _SAME_VERSION)
        messages.append(message)
    return sum_messages(messages)


def _sum_checks(replies: dict[int, dict], K: int) -> np.ndarray | None:
    """The parties' masked check sums added (uint64), if they sent them (a cipher's key)."""
    from hyfl.privacy.secure_scaling import CHECK_LIMBS, sum_messages

    checks = [replies[k].get("moments_check") for k in range(K)]
    if all(c is None for c in checks):
        return None
    for k, c in enumerate(checks):
        if not (isinstance(c, np.ndarray) and c.dtype == np.uint64 and c.shape == (CHECK_LIMBS,)):
            raise fail(f"party {k}'s reply to 'labels'", f"has no ({CHECK_LIMBS},) masked check "
                       "sum of its column sums", _SAME_VERSION)
    return sum_messages(checks)


def _job_labels(labels: dict[int, dict], loss: str, names: list[str] | None = None
                ) -> tuple[str, list]:
    """The task and its classes from what the parties report of their labels."""
    from hyfl.losses import get_loss

    kinds = {k: str(info.get("kind")) for k, info in labels.items()}
    labelled = [k for k, kind in kinds.items() if kind != "none"]
    if not labelled:
        raise fail("the parties' files", "have no label column",
                   "Give at least one party a label column (node config label-column names "
                   "it; default 'label').")
    if len({kinds[k] for k in labelled}) > 1:
        text = [k for k in labelled if kinds[k] == "text"]
        raise fail(", ".join(names[k] if names else f"party {k}" for k in text),
                   "label with text while others label with numbers",
                   "Use one kind of label in every file: all numbers or all the same class "
                   "names.")
    if not get_loss(loss).classification:
        return "regression", []
    kind = kinds[labelled[0]]
    values = set()
    for k in labelled:
        values |= {str(v) if kind == "text" else float(v) for v in labels[k].get("values", [])}
    classes = sorted(values)
    if len(classes) < 2:
        raise fail("the parties' labels", f"hold a single class {classes}",
                   "A classification task needs samples of two classes or more.")
    if kind == "number" and len(classes) > 2 and not all(c == round(c) for c in classes):
        raise fail("the parties' labels", "include non-integer numbers, which cannot be "
                   "classes", "Use integer or text classes, or loss=squared for regression.")
    return ("binary" if len(classes) == 2 else "multiclass"), classes


def _task_text(task: str, classes: list) -> str:
    if task == "regression":
        return "regression"
    return f"{task}: classes {', '.join(map(str, classes[:5]))}{' ...' if len(classes) > 5 else ''}"


def _check_overlap(columns: list[list[str]], sizes: list[int], shared: list[int],
                   min_common: int, names: list[str] | None = None) -> None:
    """Parties with different columns must share at least ``min_common`` samples each."""
    if len(columns) < 2 or len({tuple(sorted(c)) for c in columns}) == 1:
        return
    low = [k for k, count in enumerate(shared) if count < min_common]
    if low:
        names = names or [f"party {k}" for k in range(len(sizes))]
        counts = ", ".join(f"{names[k]} with {sizes[k]:,} ids, {shared[k]:,} shared"
                           for k in low)
        raise fail(counts, f"share{'s' if len(low) == 1 else ''} fewer than min-common="
                   f"{min_common} samples with the other parties, although the parties hold "
                   "different columns", "Check that every party uses the same id column "
                   "and spelling of the ids (node config id-column); lower the run config "
                   "min-common (0 turns the check off) only if the files are meant to share "
                   "so few samples.")
