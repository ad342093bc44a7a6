"""The cocoa rule's compact ClientMemory and a party's saved state of it (a review).

A party's saved state (deploy/party.py ``_client_state`` / ``_set_client_state``) is a
plain .npz in its state folder (or Flower's context.state): no MAC. A stale or damaged
one must be refused with the library's error naming the saved state, not accepted and
left to crash later (blamed on the server's message, see Party.receive) or to compute
garbage silently. Parties restored from their states on every message across many
wraps of a small ring follow run_protocol exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hyfl.algorithms.hyfdca_local import ClientMemory
from hyfl.deploy.blocks import write_blocks
from hyfl.deploy.codec import decode, encode
from hyfl.deploy.config import DeployConfig, run_config_for
from hyfl.deploy.coordinator import Coordinator
from hyfl.deploy.keys import server_cipher
from hyfl.deploy.party import handle_message, open_party
from hyfl.errors import HyflError
from hyfl.partition import grid
from hyfl.problem import make_problem
from in_process import DeliveringTransport
from synthetic_data import synthetic

# history=3, history_window=2: a ring of 6 slots, so 8 rounds wrap it and forget slots.
HYPER = "history=3,history_window=2"
ITERATIONS = 8


class _Transport(DeliveringTransport):
    """Parties rebuilt for every message (Flower's ClientApp), states through the codec."""

    def __init__(self, nodes, run_config, tamper=None):
        self.nodes, self.run_config = nodes, run_config
        self.states = dict.fromkeys(range(len(nodes)))
        self.count = dict.fromkeys(range(len(nodes)), 0)
        self.tamper = tamper  # (party, message number, function of the decoded state)
        self.errors: list[str] = []
        self.sent_bytes = self.received_bytes = 0

    def _deliver(self, k, kind, payload):
        n = self.count[k]
        self.count[k] += 1
        if self.tamper is not None and self.tamper[0] == k and self.tamper[1] == n:
            tree = decode(*self.states[k])
            self.tamper[2](tree)
            self.states[k] = encode(tree)
        try:
            reply, self.states[k] = handle_message(kind, encode(payload), self.states[k],
                                                   self.nodes[k], self.run_config)
        except HyflError as err:  # the app refuses the run on the party's side
            self.errors.append(f"party {k}, {kind}: {err}")
            return None
        return decode(*reply)


def _deploy(folder: Path, participation="full", tamper=None, hyper=HYPER,
            iterations=ITERATIONS, shape=(1, 2), reference=False):
    problem = make_problem(synthetic(n=60, m=6), "hinge", 0.05)
    partition = grid(problem.n_samples, problem.n_features, *shape)
    files = write_blocks(problem, partition, folder / "blocks", lam_default=problem.lam)
    run = run_config_for(parties=partition.n_clients, iterations=iterations, cipher="none",
                         hyper=hyper, participation=participation, seed=3)
    nodes = [{"party": k, "cipher": "none", "data": str(f)} for k, f in enumerate(files)]
    config = DeployConfig.from_run_config(run)
    transport = _Transport(nodes, run, tamper)
    coordinator = Coordinator(config, transport, server_cipher("none", None),
                              log=lambda line: None)
    results = coordinator.run()
    if reference:  # run_protocol on the participation that happened
        from hyfl.algorithms import make_algorithm
        from hyfl.participation import Trace
        from hyfl.privacy.ciphers import make_cipher
        from hyfl.runtime.protocol import run_protocol

        K = partition.n_clients
        taken = Trace(np.array([[k in r["active"] for k in range(K)]
                                for r in results["rounds"]]))
        history = []
        run_protocol(make_algorithm("hyfdca", config.hyper), problem, partition, taken,
                     iterations, make_cipher("none"), seed=3,
                     on_round=lambda server, clients: history.append(server.w.copy()))
        return results, np.stack(coordinator.weights), transport, np.stack(history)
    return results, np.stack(coordinator.weights), transport


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    results, weights, transport = _deploy(tmp_path_factory.mktemp("cocoa"))
    assert results["status"] == "completed" and not transport.errors
    return transport


def _restored(deployed, change):
    """Party 0 reopened from its (changed) saved state: its live client (restore runs)."""
    tree = decode(*deployed.states[0])
    change(tree["client"]["memory"], tree)
    party = open_party(deployed.nodes[0], deployed.run_config, encode(tree))
    return party._client()


def test_the_unchanged_state_restores_its_memory(deployed):
    tree = decode(*deployed.states[0])
    memory = tree["client"]["memory"]
    client = _restored(deployed, lambda m, t: None)
    for key in ("z", "w", "slots", "rounds", "column"):
        np.testing.assert_array_equal(getattr(client.memory, key), memory[key])
    assert np.count_nonzero(memory["slots"] >= 0) >= 2  # the memory lists past rounds


def _listed(memory):
    slots = np.asarray(memory["slots"])
    return slots[slots >= 0]


def _set(key, make):
    def change(memory, tree):
        memory[key] = make(memory)
    return change


def _dup_column(memory):
    column = memory["column"].copy()
    a, b = _listed(memory)[:2]
    column[b] = column[a]  # two live slots read one column
    return column


def _column_value(value):
    def make(memory):
        column = memory["column"].copy()
        column[_listed(memory)[0]] = value
        return column
    return make


def _rounds_off(memory):
    rounds = memory["rounds"].copy()
    rounds[rounds >= 0] += 1  # slot != round mod size
    return rounds


def _slots_swapped(memory):
    slots = memory["slots"].copy()
    slots[0], slots[1] = slots[1], slots[0]
    return slots


def _nan_z(memory):
    z = memory["z"].copy()
    z[0, memory["column"][_listed(memory)[0]], 0] = np.nan
    return z


def _drop_memory(memory, tree):
    del tree["client"]["memory"]


#: Saved states a party must refuse at restore (HyflError naming the saved state).
HOSTILE = {
    "column key missing": lambda m, t: m.pop("column"),
    "z of another shape": _set("z", lambda m: m["z"][:, :-1]),
    "whole memory missing": _drop_memory,
    "slots as fractions": _set("slots", lambda m: np.where(m["slots"] >= 0,
                                                            m["slots"] + 0.5, -1.0)),
    "slots beyond the ring": _set("slots", lambda m: np.where(m["slots"] >= 0,
                                                               m["slots"] + 2**40, -1)),
    "slots repeated": _set("slots", lambda m: np.full_like(m["slots"], _listed(m)[0])),
    "slots not matching rounds": _set("rounds", _rounds_off),
    "slots out of time order": _set("slots", _slots_swapped),
    "column negative": _set("column", _column_value(-2)),
    "column beyond depth": _set("column", _column_value(3)),
    "column huge": _set("column", _column_value(2**40)),
    "listed slot without column": _set("column", _column_value(-1)),
    "two slots one column": _set("column", _dup_column),
    "NaN in z": _set("z", _nan_z),
    "inf in w": _set("w", lambda m: np.full_like(m["w"], np.inf)),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_bad_saved_memory_is_refused_at_restore(deployed, case):
    with pytest.raises(HyflError, match="saved state"):
        _restored(deployed, HOSTILE[case])


def test_a_saved_memory_of_non_numbers_is_refused_as_the_saved_states_fault(deployed):
    """A memory that is not arrays (strings, not a dict) must be refused by the restore
    naming the saved state, not as "the server's message is malformed"."""
    def strings(memory, tree):
        memory["slots"] = ["x"] * memory["slots"].size

    def not_a_dict(memory, tree):
        tree["client"]["memory"] = 5

    for change in (strings, not_a_dict):
        tree = decode(*deployed.states[0])
        change(tree["client"]["memory"], tree)
        party = open_party(deployed.nodes[0], deployed.run_config, encode(tree))
        with pytest.raises(HyflError, match="saved state"):
            party._client()


@pytest.fixture(scope="module")
def clean_weights(tmp_path_factory):
    return _deploy(tmp_path_factory.mktemp("clean"))[1]


#: Party 0 restarts from a damaged saved state before its 13th message (a 'round'); before
#: the restore checked the memory, five of these finished the run with other iterates and
#: three failed later, blamed on the server's message or on "the computation".
E2E = ["whole memory missing", "slots repeated", "slots out of time order",
       "column negative", "two slots one column", "column beyond depth", "column huge",
       "NaN in z"]


@pytest.mark.parametrize("case", E2E)
def test_a_party_restarted_from_a_damaged_state_refuses_it(tmp_path, clean_weights, case):
    """End to end: either the party refuses its state, naming it (it is then absent), or
    the run's model is what it would have been. Never silently other iterates."""
    def tamper(tree):
        HOSTILE[case](tree["client"]["memory"], tree)

    results, weights, transport = _deploy(tmp_path, tamper=(0, 12, tamper))
    assert results["status"] == "completed"
    if not transport.errors:
        diff = float(np.abs(weights[-1] - clean_weights[-1]).max())
        pytest.fail(f"damaged state accepted silently: final w off by {diff:.3g}")
    assert "saved state" in transport.errors[0], transport.errors[0]


# ----------------------------------------------------------------------------- rejoin


@pytest.mark.parametrize("participation", ["0.5", "cyclic:2"])
def test_parties_restored_every_message_across_ring_wraps_equal_run_protocol(
        tmp_path, participation):
    """Every message restores every party from its saved state (the compact memory),
    over many wraps of a 4-slot ring with slots forgotten while a party is away: the
    iterates are run_protocol's (existing deploy tests run 4 rounds of a ring of
    2 x (F+1) slots or more: no wrap, nothing forgotten)."""
    results, weights, _, history = _deploy(tmp_path, participation=participation,
                                           hyper="history=2,history_window=2",
                                           iterations=16, shape=(2, 2), reference=True)
    assert results["status"] == "completed"
    np.testing.assert_array_equal(weights[1:], history)


# ----------------------------------------------------------------------------- record


def test_record_of_a_memory_keeps_depth_columns_and_server_agreement():
    """ClientMemory against a ring of every slot (what the old code kept), across many
    wraps, with the window forgetting of rounds a window old."""
    rng = np.random.default_rng(0)
    N, M, C, depth, size = 7, 3, 2, 3, 7
    memory = ClientMemory(N, M, C, depth, size)
    ring_z, ring_w = np.zeros((N, size, C)), np.zeros((size, M, C))
    rounds = []
    for t in range(1, 200):
        if rng.random() < 0.35:
            continue
        z, w = rng.normal(size=(N, C)), rng.normal(size=(M, C))
        memory.record(t, z, w)
        ring_z[:, t % size], ring_w[t % size] = z, w
        rounds = [r for r in [t, *rounds] if r > t - size][:depth]
        expected = [r % size for r in rounds] + [-1] * (depth - len(rounds))
        np.testing.assert_array_equal(memory.slots, expected)
        listed = memory.slots[memory.slots >= 0]
        cols = memory.column[listed]
        assert np.unique(cols).size == cols.size and cols.max() < depth
        np.testing.assert_array_equal(memory.z[:, cols], ring_z[:, listed])
        np.testing.assert_array_equal(memory.w[cols], ring_w[listed])
        assert np.all(memory.column[np.setdiff1d(np.arange(size), listed)] == -1)
