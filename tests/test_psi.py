"""Private set intersection and multi-party sample alignment (hyfl.privacy.psi)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import private_set_intersection.python as psi_lib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyfl.errors import HyflError
from hyfl.privacy.psi import (
    Alignment,
    PSIClient,
    PSIServer,
    align,
    intersect,
)


def parse_request(data: bytes):
    msg = psi_lib.Request()
    msg.ParseFromString(data)
    return msg


def pid(i: int) -> str:
    # Long, distinctive ids, so "the raw id bytes do not occur in a message" cannot
    # pass or fail by a chance match inside 33-byte ciphertexts.
    return f"patient-{i:05d}-secret"


def canon(x: object) -> bytes:
    return x if isinstance(x, bytes) else str(x).encode()


def reference_align(parties: dict[str, list]) -> tuple[int, dict[str, list[int]], list[int]]:
    """Obviously correct alignment with plain dicts and sets (sees all raw ids)."""
    index: dict[bytes, int] = {}
    out = {}
    for name, ids in parties.items():
        for key in map(canon, ids):
            index.setdefault(key, len(index))  # first appearance, party order, file order
        out[name] = [index[canon(x)] for x in ids]
    counts = Counter(g for gs in out.values() for g in gs)
    return len(index), out, [counts[g] for g in range(len(index))]


def assert_matches_reference(a: Alignment, parties: dict[str, list]) -> None:
    n, gidx, holders = reference_align(parties)
    assert a.n_samples == n
    assert list(a.global_index) == list(parties)
    for name in parties:
        assert a.global_index[name].dtype == np.int64
        assert a.global_index[name].tolist() == gidx[name]
    assert a.holders.tolist() == holders


def assert_views_minimal(a: Alignment, parties: dict[str, list]) -> None:
    """Each party learned exactly its pairwise intersections and the peers' sizes."""
    names = list(parties)
    assert len(a.views) == len(names) * (len(names) - 1)
    for name in names:
        learned = a.learned(name)
        assert set(learned) == set(names) - {name}
        own = [canon(x) for x in parties[name]]
        for peer, view in learned.items():
            theirs = {canon(x) for x in parties[peer]}
            assert view.party == name and view.peer == peer
            assert view.peer_size == len(parties[peer])
            assert view.shared_rows.tolist() == sorted(view.shared_rows.tolist())
            assert {own[r] for r in view.shared_rows} == set(own) & theirs


# --------------------------------------------------------------------- two parties


def test_intersect_finds_exactly_the_shared_ids():
    client = [pid(i) for i in range(30)]
    server = [pid(i) for i in range(45, 19, -1)]  # 20..45, reversed file order
    r = intersect(client, server)
    assert r.client_indices.dtype == np.int64
    assert r.client_indices.tolist() == list(range(20, 30))
    assert (r.client_size, r.server_size, r.exact) == (30, 26, True)
    assert r.bytes_exchanged == sum(r.message_sizes.values()) > 0


def test_intersect_no_overlap_and_full_overlap():
    assert intersect(["a", "b"], ["c"]).client_indices.tolist() == []
    assert intersect(["a", "b"], ["b", "a"]).client_indices.tolist() == [0, 1]


def test_ids_may_be_str_bytes_or_int():
    r = intersect([1, 2, 3, np.int64(4)], ["2", b"3", "4", "x"])
    assert r.client_indices.tolist() == [1, 2, 3]
    assert intersect(["ü"], ["ü".encode()]).client_indices.tolist() == [0]


def test_client_learns_nothing_about_ids_it_does_not_hold():
    client = [pid(i) for i in range(0, 40)]
    server_only = [pid(i) for i in range(100, 140)]
    shared = [pid(i) for i in range(30, 40)]
    r = intersect(client, shared + server_only)
    assert r.client_indices.tolist() == list(range(30, 40))
    # The client's whole output is indices into its own list plus a size ...
    assert r.client_indices.max() < len(client)
    assert r.server_size == 50
    # ... and no message carries any id in plaintext, not even shared ones.
    transcript = r.request + r.setup + r.response
    for x in client + server_only:
        assert x.encode() not in transcript
        assert x not in repr(r)


def test_server_learns_only_the_client_set_size():
    ids = [pid(i) for i in range(25)]
    server = PSIServer([pid(i) for i in range(10, 60)])
    assert server.client_size is None
    request = PSIClient(ids).request()
    setup, response = server.respond(request)
    assert server.client_size == 25
    assert all(x.encode() not in request for x in ids)
    # The request is blinded under a fresh key: the same set never looks the same
    # twice, and a disjoint set of the same size yields a message of the same length.
    again = PSIClient(ids).request()
    other = PSIClient([pid(i) for i in range(1000, 1025)]).request()
    assert len(request) == len(again) == len(other)
    blinded = list(parse_request(request).encrypted_elements)
    assert len(blinded) == 25
    assert not set(blinded) & set(parse_request(again).encrypted_elements)


def test_parties_talk_only_through_bytes():
    client = PSIClient([pid(i) for i in range(8)])
    server = PSIServer([pid(i) for i in range(4, 12)])
    # Copies through bytearray: nothing but the byte strings crosses over.
    setup, response = server.respond(bytes(bytearray(client.request())))
    rows = client.intersection(bytes(bytearray(setup)), bytes(bytearray(response)))
    assert rows.tolist() == [4, 5, 6, 7]


def test_garbage_messages_give_clear_errors():
    client = PSIClient(["a", "b"])
    server = PSIServer(["a"])
    with pytest.raises(HyflError, match="request"):
        server.respond(b"\xff\xff\xff not a protobuf")
    setup, response = server.respond(client.request())
    with pytest.raises(HyflError, match="setup"):
        client.intersection(b"\xff\xff\xff", response)
    # A response to someone else's request is caught before it silently misleads.
    _, wrong = server.respond(PSIClient(["a", "b", "c"]).request())
    with pytest.raises(HyflError, match="3 entries for a request of 2"):
        client.intersection(setup, wrong)


def test_compressed_mode_is_smaller_and_has_no_false_negatives():
    client = [pid(i) for i in range(200)]
    server = [pid(i) for i in range(100, 300)]
    exact = intersect(client, server)
    small = intersect(client, server, exact=False, fpr=1e-9)
    assert not small.exact
    assert set(exact.client_indices.tolist()) <= set(small.client_indices.tolist())
    assert small.client_indices.tolist() == list(range(100, 200))  # fpr 1e-9: no FP here
    assert small.message_sizes["setup"] < exact.message_sizes["setup"] / 3


# --------------------------------------------------------------------- many parties


def hybrid_parties() -> dict[str, list]:
    return {
        "A": [pid(i) for i in range(0, 100)],
        "B": [pid(i) for i in range(50, 150)],
        "C": [pid(i) for i in list(range(0, 20)) + list(range(140, 160))],
    }


@pytest.fixture(scope="module")
def hybrid() -> tuple[Alignment, dict[str, list]]:
    parties = hybrid_parties()
    return align(parties), parties


def test_align_hybrid_pattern(hybrid):
    a, parties = hybrid
    assert a.n_samples == 160
    # Same id => same global index; different ids => different indices.
    by_id: dict[str, int] = {}
    for name, ids in parties.items():
        for x, g in zip(ids, a.global_index[name].tolist()):
            assert by_id.setdefault(x, g) == g
    assert len(set(by_id.values())) == len(by_id) == 160
    assert sorted(by_id.values()) == list(range(160))
    expected = {**dict.fromkeys(range(0, 20), 2), **dict.fromkeys(range(20, 50), 1)}
    expected |= {**dict.fromkeys(range(50, 100), 2), **dict.fromkeys(range(100, 140), 1)}
    expected |= {**dict.fromkeys(range(140, 150), 2), **dict.fromkeys(range(150, 160), 1)}
    for i, count in expected.items():
        assert a.holders[by_id[pid(i)]] == count
    assert a.holders.dtype == np.int64 and a.holders.sum() == 240
    assert_matches_reference(a, parties)


def test_align_views_hold_only_pairwise_intersections(hybrid):
    a, parties = hybrid
    assert_views_minimal(a, parties)
    # A and C share nothing in 50..99 that C could learn about: C's view of B is
    # only 140..149 although A and B share 50..99.
    c_rows = a.learned("C")["B"].shared_rows
    assert sorted(parties["C"][r] for r in c_rows) == [pid(i) for i in range(140, 150)]
    with pytest.raises(HyflError, match="not part of this alignment"):
        a.learned("Z")


def test_coordinator_sees_only_integers_in_a_pseudorandom_order(hybrid):
    a, parties = hybrid
    view = a.coordinator_view
    assert view.set_sizes == {"A": 100, "B": 100, "C": 40}
    assert set(view.matched_rows) == {("A", "B"), ("A", "C"), ("B", "C")}
    for (j, k), (rows_j, rows_k) in view.matched_rows.items():
        assert rows_j.dtype == rows_k.dtype == np.int64
        # Paired by position: the same sample on both sides.
        assert [parties[j][r] for r in rows_j] == [parties[k][r] for r in rows_k]
    # Keyed (HMAC) order, not id order: 50 shared ids in sorted order has odds 1/50!.
    rows_a, _ = view.matched_rows[("A", "B")]
    assert len(rows_a) == 50 and rows_a.tolist() != sorted(rows_a.tolist())
    assert 0 < view.relayed_bytes < a.bytes_exchanged
    to_coordinator = sum(r.nbytes + s.nbytes for r, s in view.matched_rows.values())
    assert a.bytes_exchanged == view.relayed_bytes + to_coordinator


def test_align_results_are_read_only(hybrid):
    a, _ = hybrid
    with pytest.raises(ValueError):
        a.global_index["A"][0] = 7
    with pytest.raises(ValueError):
        a.holders[0] = 7


def test_align_single_party_and_mixed_id_types():
    a = align({"solo": ["x", "y", "z"]})
    assert (a.n_samples, a.global_index["solo"].tolist(), a.holders.tolist()) == (
        3,
        [0, 1, 2],
        [1, 1, 1],
    )
    assert a.bytes_exchanged == 0 and a.views == ()
    parties = {"ints": [3, 1, 2], "strs": ["2", "9"], "bytes": [b"9", b"3", b"7"]}
    b = align(parties)
    assert_matches_reference(b, parties)
    assert b.global_index["bytes"].tolist() == [3, 0, 4]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 25), min_size=1, max_size=12, unique=True),
        min_size=1,
        max_size=4,
    )
)
def test_align_matches_reference_on_random_sets(id_lists):
    parties = {f"p{i}": ids for i, ids in enumerate(id_lists)}
    a = align(parties)
    assert_matches_reference(a, parties)
    assert_views_minimal(a, parties)


# --------------------------------------------------------------------- errors


@pytest.mark.parametrize("fpr", [0, 1, -1e-9, 1.5, math.nan, math.inf, "tiny", None])
def test_bad_fpr(fpr):
    with pytest.raises(HyflError, match=r"fpr .*Pass a false-positive rate"):
        intersect(["a"], ["a"], fpr=fpr)
    with pytest.raises(HyflError, match="fpr"):
        align({"A": ["a"]}, fpr=fpr)
    with pytest.raises(HyflError, match="fpr"):
        PSIServer(["a"], fpr=fpr)


def test_duplicate_ids_name_the_party_and_the_id():
    with pytest.raises(HyflError, match=r"party 'B' has duplicate id 'x' at rows 0 and 2"):
        align({"A": ["x"], "B": ["x", "y", "x"]})
    with pytest.raises(HyflError, match=r"rows 0 and 1 \(5 and '5' both mean b'5'\)"):
        align({"A": [5, "5"]})
    with pytest.raises(HyflError, match="client_ids has duplicate id 'a'"):
        intersect(["a", "a"], ["b"])


def test_empty_or_missing_parties():
    with pytest.raises(HyflError, match="parties is empty"):
        align({})
    with pytest.raises(HyflError, match="party 'B' has no ids"):
        align({"A": ["x"], "B": []})
    with pytest.raises(HyflError, match="server_ids has no ids"):
        intersect(["a"], [])
    with pytest.raises(HyflError, match="not a mapping"):
        align([["a"], ["b"]])
    with pytest.raises(HyflError, match="bad party name"):
        align({3: ["a"]})


@pytest.mark.parametrize("bad", [1.0, None, True, ("a",), object()])
def test_ids_of_unsupported_type(bad):
    with pytest.raises(HyflError, match=r"party 'A' id at row 1 has type .* not an id"):
        align({"A": ["ok", bad]})


def test_single_string_is_not_a_list_of_ids():
    with pytest.raises(HyflError, match="single str .* not a sequence of ids"):
        intersect("abc", ["a"])
    with pytest.raises(HyflError, match="not a sequence of ids"):
        align({"A": 42})
    with pytest.raises(HyflError, match="not valid Unicode"):
        intersect(["\ud800"], ["a"])


def test_alignment_reports_shared_counts():
    alignment = align({"a": ["1", "2", "3"], "b": ["3", "4"], "c": ["9"]})
    assert alignment.shared_counts == {"a": 1, "b": 1, "c": 0}
    assert alignment.n_common == 1
