"""An active server against the alignment of party files: every value it relays is checked.

Each test plays a server that alters the alignment's messages (the coordinator and the
parties in this process, the real codec and messages; :mod:`in_process`), and checks
what it could take home:

* **guessed ids** (`align`): the server appends hashes of ids of its choice to the
  peer lists a party re-blinds and compares the reply with that party's own blinded
  ids; the party must refuse a peer list its owner did not tag, nothing re-blinded.
* **unmasking** (`labels` with standardize): the server tells one party a larger
  feature count and shifted column numbers so that its reply carries its peer's mask;
  the party must refuse a numbering other than the one it derives from the tagged
  column lists, and the masks are per cell (global column, moment) anyway.
* **labels on the wrong samples** (`labels`): the server reorders a party's shared
  rows; the sealed labels are bound to the blinded ids of their rows, so the receiver
  refuses them and the run stops.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hyfl.deploy.codec import decode
from hyfl.deploy.keys import generate_keys
from hyfl.privacy.alignment import hash_ids
from in_process import party_files_deployment as _deploy
from in_process import refusal_of as _run
from synthetic_data import horizontal_organisation_files as _horizontal_files
from synthetic_data import organisation_files


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return generate_keys(tmp_path_factory.mktemp("ckks-keys"), cipher="ckks")


# ----------------------------------------------------------------------------- 1. guessed ids

def test_the_server_cannot_test_guessed_ids_against_a_partys_file(tmp_path, keys):
    """The server appends the hashes of five guessed ids to the list of party 2 it gives
    party 1 to re-blind, strips them from the reply (so that the run goes on), and compares
    them with party 1's own blinded ids from its hello: on the code before the lists were
    tagged it learned exactly which guesses party 1 holds. Now party 1 refuses the list
    (party 2's tag does not cover it) and re-blinds nothing."""
    files, *_ = organisation_files(tmp_path)
    guesses = ["cust-005", "cust-025", "cust-050", "cust-089", "somebody-else"]  # 1: 20-89
    extra = hash_ids(guesses)

    def append(k, kind, payload):
        if k == 1 and kind == "align":
            payload = dict(payload)
            payload["peers"] = np.concatenate([payload["peers"], extra])
            counts = payload["peer_counts"].copy()
            counts[2] += len(guesses)  # as if party 2 had five more ids
            payload["peer_counts"] = counts
        return payload

    def strip(k, kind, reply):
        if k == 1 and kind == "align":
            reply = {**reply, "reblinded": reply["reblinded"][:-len(guesses)]}
        return reply

    coordinator, transport = _deploy(files, keys, forge=append, alter=strip)
    refusal = _run(coordinator)
    reply = transport.reply(1, "align")
    learned = set()
    if reply is not None:  # the attack's payoff: which guesses are among party 1's ids
        own = transport.reply(1, "hello")["align"]["blinded"]
        tried = reply["reblinded"][-len(guesses):]
        hits = (tried[:, None, :] == own[None, :, :]).all(axis=2).any(axis=1)
        learned = {g for g, hit in zip(guesses, hits) if hit}
    assert not learned, f"the server learned that party 1 holds {sorted(learned)}"
    assert refusal is not None and "party 2's hello" in refusal and "tag" in refusal, refusal


@pytest.mark.parametrize("with_tags", [False, True])
def test_a_peer_list_in_another_peers_place_is_refused(tmp_path, keys, with_tags):
    """Party 0's list handed to party 1 as party 2's and the other way round -- alone, or
    with the nonces, tags and channel keys of the two moved along: a tag names its owner
    and its place, so party 1 refuses either before it re-blinds anything (on the code
    without list tags it re-blinded the swapped lists)."""
    files, *_ = organisation_files(tmp_path)

    def swap(k, kind, payload):
        if k == 1 and kind == "align":
            payload = dict(payload)
            counts = payload["peer_counts"]
            first, second = np.split(payload["peers"], [counts[0]])
            payload["peers"] = np.concatenate([second, first])
            payload["peer_counts"] = counts[[2, 1, 0]]
            for name in ("nonces", "tags", "channels") if with_tags else ():
                payload[name] = payload[name][[2, 1, 0]]
        return payload

    coordinator, transport = _deploy(files, keys, forge=swap)
    refusal = _run(coordinator)
    assert transport.reply(1, "align") is None, "party 1 re-blinded the swapped lists"
    assert refusal is not None and "party 0's hello" in refusal and "tag" in refusal, refusal


def test_a_hello_replayed_from_another_run_opens_and_cancels_nothing(tmp_path, keys):
    """A genuine hello of party 1 from an earlier run (its tag verifies: the key is the
    same) shown to party 0 in a new run, with standardize: party 0 then computes another
    run identity than party 1, so their masks do not cancel (the server's sum of their
    masked column sums is not the totals) and the list each seals for the other does not
    open: the run stops at ``block`` -- the parties share no rows, so only the seal
    every party sends every peer, empty or not, shows it."""
    from hyfl.privacy.secure_scaling import column_moments, sum_messages
    from hyfl.privacy.secure_scaling import decode as decode_fixed

    files = _horizontal_files(tmp_path)
    earlier, transport = _deploy(files, keys, standardize=True)
    assert _run(earlier) is None
    old = transport.reply(1, "hello")["align"]

    def replay(k, kind, payload):
        if k == 0 and kind == "align":
            payload = dict(payload)
            payload["peers"] = old["blinded"]
            for name, value in (("nonces", old["nonce"]), ("channels", old["channel"]),
                                ("tags", old["tag"])):
                payload[name] = payload[name].copy()
                payload[name][1] = value
        return payload

    coordinator, transport = _deploy(files, keys, forge=replay, standardize=True)
    refusal = _run(coordinator)
    replies = [transport.reply(k, "labels") for k in range(2)]
    if all(r is not None for r in replies):  # both sent sums: they must not cancel
        pooled = sum(column_moments(pd.read_csv(f)[["x0", "x1", "x2"]].to_numpy())
                     for f in files)
        sums = [r["moments"] for r in replies]
        assert np.all(np.abs(decode_fixed(sum_messages(sums)) - pooled) > 1.0)
    # Party 0 now stops at ``labels`` already: party 1's re-blinding of its list is tagged
    # with the key of party 1's run identity (tests/test_review_alignment.py).
    assert refusal is not None and (("sealed for party" in refusal and "do not open" in refusal)
                                    or "tag for this run" in refusal), refusal


# ----------------------------------------------------------------------------- 2. unmasking


def test_the_server_cannot_unmask_one_partys_column_sums(tmp_path, keys):
    """Standardize with party files: the server tells party 1 that there are 2M+3 features
    and that its columns are the last three. Its masked sums then carry, in the first 2M
    cells, the negated mask party 0 used for its M columns' sums and sums of squares: on
    the code with one mask stream per pair, party 0's own statistics came out exactly.
    Now party 1 refuses the numbering (it numbers the features itself from the columns
    its peers tagged) and sends no sums; and the masks are per cell and moment, so the
    shifted cells would not carry party 0's masks anyway (test_secure_scaling)."""
    from hyfl.privacy.secure_scaling import column_moments
    from hyfl.privacy.secure_scaling import decode as decode_fixed

    files = _horizontal_files(tmp_path)
    M = 3

    def shift(k, kind, payload):
        if k == 1 and kind == "labels":
            payload = dict(payload)
            payload["moments_features"] = 2 * M + np.arange(M)
            payload["n_features"] = 3 * M
        return payload

    coordinator, transport = _deploy(files, keys, forge=shift, standardize=True)
    refusal = _run(coordinator)
    first, second = transport.reply(0, "labels"), transport.reply(1, "labels")
    recovered = None
    if first is not None and second is not None and second.get("moments") is not None:
        mask = second["moments"][0, :2 * M].reshape(2, M)  # -(party 0's mask)
        recovered = decode_fixed(first["moments"] + mask)
    truth = column_moments(pd.read_csv(files[0])[["x0", "x1", "x2"]].to_numpy())
    if recovered is not None:
        error = np.max(np.abs(recovered - truth) / np.abs(truth))
        assert error > 1e-3, f"party 0's column statistics recovered (relative error {error:.1e})"
    assert refusal is not None and "number this party's 3 columns otherwise" in refusal, refusal


# ----------------------------------------------------------------------------- 4. label swaps

def _mislabelled(transport, files, ids, y, k) -> int:
    """Samples of party ``k``'s block whose label is not its customer's."""
    record = next(r for r in transport.records if r.party == k and r.kind == "block")
    state = decode(*record.before)["alignment"]
    frame = pd.read_parquet(files[k]) if files[k].suffix == ".parquet" else pd.read_csv(files[k])
    n = len(frame)
    order = np.asarray(state.get("order", np.arange(n)), dtype=np.int64)
    by_row = np.empty(n, dtype=np.int64)
    by_row[order] = record.payload["samples"]  # the server numbers positions of the list
    customer = dict(zip(by_row.tolist(), frame["customer"]))
    block = decode(*record.after)["block"]
    truth = dict(zip(ids, np.where(y == ">50K", 1.0, -1.0)))
    given = np.asarray(block["Y"])[:, 0]
    return int(sum(truth[customer[int(g)]] != v for g, v in zip(block["samples"], given)))


def test_the_server_cannot_put_labels_on_the_wrong_samples(tmp_path, keys):
    """Party 1 (the telco) has no labels; party 0 (the bank) labels customers 0-59 and
    party 2 (the shop) 40-89. The server reverses, in party 1's ``labels`` message, the
    order of the rows it shares with party 0 but not with party 2 (customers 20-39: no
    second labeller to disagree). On the code with labels bound only as a blob, the run
    finished with labels of the bank's customers on other telco customers. Now every
    sealed label list is bound to the blinded ids of its rows, and the run stops."""
    files, ids, X, y = organisation_files(tmp_path)

    def reorder(k, kind, payload):
        if k == 1 and kind == "labels":
            payload = dict(payload)
            counts = payload["shared_counts"]
            rows = payload["shared_rows"].copy()
            with_0 = np.arange(counts[0])
            alone = with_0[~np.isin(rows[with_0], rows[counts[0]:])]  # not shared with 2
            rows[alone] = rows[alone[::-1]]
            payload["shared_rows"] = rows
            if "peer_rows" in payload:  # the same pairs, in another order
                peer = payload["peer_rows"].copy()
                peer[alone] = peer[alone[::-1]]
                payload["peer_rows"] = peer
        return payload

    coordinator, transport = _deploy(files, keys, forge=reorder)
    refusal = _run(coordinator)
    if refusal is None:
        wrong = _mislabelled(transport, files, ids, y, 1)
        pytest.fail(f"the run finished with {wrong} of party 1's 70 labels on the wrong "
                    "customers")
    # The first to open a list of the reordered pairs refuses it (party 0 opens what
    # party 1 sealed in the reordered order; party 1 would refuse party 0's).
    assert "sealed for party" in refusal and "do not open" in refusal, refusal
    assert transport.reply(1, "block") is None


def test_classes_in_another_order_or_with_a_phantom_class_are_refused(tmp_path, keys):
    """Labels travel as class indices: the server reversing the classes for one party (its
    labels would flip against its peers') is refused by that party; a class added for one
    party only (sorted, so the order checks pass) makes the pairs' seals disagree."""
    files, *_ = organisation_files(tmp_path)

    def reverse(k, kind, payload):
        if k == 0 and kind == "align":
            payload = {**payload, "classes": payload["classes"][::-1]}
        return payload

    refusal = _run(_deploy(files, keys, forge=reverse)[0])
    assert refusal is not None and "task and classes" in refusal, refusal

    def phantom(k, kind, payload):
        if k == 1 and kind == "align":  # the telco has no labels of its own to check with
            payload = {**payload, "classes": [*payload["classes"], "~phantom"],
                       "task": "multiclass"}
        return payload

    refusal = _run(_deploy(files, keys, forge=phantom)[0])
    assert refusal is not None and "do not open" in refusal, refusal


def test_a_partys_list_goes_out_in_a_fresh_secret_order(tmp_path, keys):
    """The blinded ids of ``hello`` are the file's ids blinded in a fresh secret order: the
    positions the server (and, through ``labels``, a peer) sees tell nothing of the file's
    row order -- which a file sorted by a private column would show."""
    from hyfl.privacy.alignment import BlindingKey

    files, *_ = organisation_files(tmp_path)
    orders = []
    for _ in range(2):
        coordinator, transport = _deploy(files, keys)
        assert _run(coordinator) is None
        record = next(r for r in transport.records if r.party == 0 and r.kind == "hello")
        state = decode(*record.after)["alignment"]
        sent = transport.reply(0, "hello")["align"]["blinded"]
        ids = list(pd.read_csv(files[0])["customer"])
        in_file_order = BlindingKey(bytes(state["key"])).apply(hash_ids(ids))
        order = np.asarray(state["order"], dtype=np.int64)
        np.testing.assert_array_equal(sent, in_file_order[order])
        assert not np.array_equal(order, np.arange(order.size))
        orders.append(order)
    assert not np.array_equal(*orders)  # fresh each run
