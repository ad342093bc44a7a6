"""HyFDCA's round script (``hyfl.algorithms.hyfdca_round``): the message order every
party-based engine plays, and the phase table the deployment reads.

The script is the one place the order is written, so these tests pin it: which
phases a round sends, to whom, and how many sequential exchanges that is.
"""

from __future__ import annotations

import numpy as np
import pytest

import hyfl.runtime.protocol as protocol
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.algorithms.hyfdca_parties import Client
from hyfl.algorithms.hyfdca_round import PHASES, POSTS, Exchange, Post, play_round
from hyfl.data import load_data
from hyfl.deploy import coordinator, guard, party
from hyfl.participation import Cyclic, Full
from hyfl.partition import grid
from hyfl.privacy.ciphers import make_cipher
from hyfl.problem import make_problem


@pytest.fixture(scope="module")
def problem():
    return make_problem(load_data("breast_cancer"), "hinge", 1e-3)


def _played(monkeypatch, problem, hyfdca, partition, participation, rounds=5):
    """Every round's exchanges as (phase, addressed parties), and its active parties."""
    played: list[list[tuple[str, tuple[int, ...]]]] = []
    actives: list[np.ndarray] = []

    def recording(script, exchange, post, server=lambda fn, *a: fn(*a)):
        steps: list[tuple[str, tuple[int, ...]]] = []
        played.append(steps)

        def exchanging(step: Exchange):
            steps.append((step.phase, tuple(sorted(step.messages))))
            return exchange(step)

        def posting(step: Post):
            steps.append((f"post {step.phase}", tuple(sorted(step.messages))))
            post(step)

        return play_round(script, exchanging, posting, server)

    monkeypatch.setattr(protocol, "play_round", recording)
    protocol.run_protocol(hyfdca, problem, partition, participation, rounds,
                          make_cipher("none"), seed=0,
                          on_round=lambda server, clients: actives.append(server.active.copy()))
    return played, actives


@pytest.mark.parametrize("layout, phases", [
    ("horizontal", ["round", "image", "direction", "step"]),
    # with every party active the inner products come ahead with the step: the model
    # rides along with `round` from round 2 on, as on horizontal data
    ("vertical", ["round", "image", "direction", "step"]),
    ("grid", ["round", "image", "direction", "step"]),
])
def test_a_steady_cocoa_round_sends_its_phases_once_each(monkeypatch, problem, layout, phases):
    n, m = problem.n_samples, problem.n_features
    partition = {"horizontal": grid(n, m, 3, 1), "vertical": grid(n, m, 1, 3),
                 "grid": grid(n, m, 2, 2)}[layout]
    K = partition.n_clients
    played, actives = _played(monkeypatch, problem, HyFDCA(), partition, Full(K))
    everyone = tuple(range(K))
    for steps in played[1:]:  # round 1 sets the certificate up like any other
        exchanges = [phase for phase, _ in steps if not phase.startswith("post")]
        assert exchanges == phases  # horizontal: the model rides along with `round`
        assert all(to == everyone for _, to in steps)  # every phase goes to all active
        assert steps[-1] == ("post commit", everyone)  # the weights, with the next message
    # The steady state is four sequential exchanges; the first round (nothing came
    # ahead yet) needs the proposals message on vertical and hybrid data.
    first = [phase for phase, _ in played[0] if not phase.startswith("post")]
    assert first == (phases if layout == "horizontal" else
                     ["round", "proposals", "image", "direction", "step"])


def test_a_returning_party_adds_one_weights_exchange_and_judges_are_one_party(monkeypatch,
                                                                               problem):
    n, m = problem.n_samples, problem.n_features
    played, actives = _played(monkeypatch, problem, HyFDCA(), grid(n, m, 2, 2), Cyclic(4, 2),
                              rounds=6)
    for t, (steps, active) in enumerate(zip(played, actives), start=1):
        exchanges = [phase for phase, _ in steps if not phase.startswith("post")]
        returning = t > 1 and not set(active) <= set(actives[t - 2])
        assert ("weights" in exchanges) == returning, t
        assert exchanges[:1 + returning] == (["round", "weights"] if returning else ["round"])
        for phase, to in steps:
            if phase in PHASES and PHASES[phase].to == "judge":
                assert to == (int(active[0]),)  # the first active party decides
            elif not phase.startswith("post"):
                assert to == tuple(int(k) for k in active)


def test_the_safe_rules_round_is_its_per_sample_phases(monkeypatch, problem):
    n, m = problem.n_samples, problem.n_features
    played, _ = _played(monkeypatch, problem, HyFDCA(step_rule="safe", local_steps=3),
                        grid(n, m, 2, 2), Full(4), rounds=3)
    for steps in played[1:]:
        assert [phase for phase, _ in steps] == ["round", "steps", "duals", "verdict",
                                                 "post commit"]
        assert [to for phase, to in steps if phase == "verdict"] == [(0,)]


def test_play_round_counts_exchanges_and_skips_empty_ones():
    def script():
        first = yield Exchange("round", {0: {"x": 1}})
        assert first == {0: {"seen": 1}}
        empty = yield Exchange("steps", {})
        assert empty == {}
        yield Post("commit", {0: {"w": 2}})
        return True

    posted = []
    accepted, exchanges = play_round(script(), lambda step: {0: {"seen": 1}},
                                     lambda step: posted.append(step.phase))
    assert (accepted, exchanges, posted) == (True, 1, ["commit"])


def test_the_deployment_reads_the_phase_table():
    # the party's kinds, fields and query kinds, the coordinator's reply fields and the
    # guard's order are the table's, so a new phase is added in one place
    assert set(PHASES) <= set(party.KINDS)
    assert {name for name, p in PHASES.items() if p.query} == (
        set(party.QUERY_KINDS) - {"hello", "ping", "finish"})
    for name, phase in PHASES.items():
        assert party.MESSAGE_FIELDS[name] == dict(phase.sends)
        assert coordinator.REPLY_FIELDS[name] == dict(phase.replies)
    assert guard.AFTER == {n: p.after for n, p in PHASES.items() if p.after}
    assert set(guard.ONCE_PER_ATTEMPT) == {n for n, p in PHASES.items() if p.per_attempt == 1}
    assert guard.CERTIFY_MAX == PHASES["certify"].per_attempt
    # every phase has its party handler and names a client method that exists
    for name, phase in PHASES.items():
        assert callable(getattr(party.Party, f"_{name}"))
        assert callable(getattr(Client, phase.client)), (name, phase.client)
    assert set(POSTS) == {"commit"}
