"""The cocoa rule's one ``step`` message (issue 44 item 2), in the in-process protocol.

The summed line-search sums go to every active party; each decrypts them, checks their
tag, finds the step and takes it at once, answering with its encrypted dual changes (the
judge, the first active party, also with the step). The new weights follow as the round's
``commit`` post (:mod:`hyfl.algorithms.hyfdca_round`). So every active party must find
the very same step, and a server that sends two parties different sums must be refused
at the party whose sum is not the active parties' (the deployed party's guard is attacked
in tests/test_hostile_server.py).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from hyfl.algorithms import hyfdca_parties
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.errors import HyflError
from hyfl.participation import RandomFraction
from hyfl.partition import grid
from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.layout import EncryptedVector
from hyfl.problem import make_problem
from hyfl.runtime.protocol import Wire, run_protocol
from synthetic_data import synthetic

KEY_BITS = 512  # small keys keep the tests fast; the scheme is the same at 2048 bits
ROUNDS = 4


@pytest.fixture(scope="module")
def problem():
    return make_problem(synthetic(n=60, m=8), "hinge", 0.05)


@pytest.fixture(scope="module")
def cipher():
    return make_cipher("packed", key_bits=KEY_BITS)


def _setting(problem):
    """A hybrid 2 x 2 grid, half the parties each round (absences, returning parties)."""
    return grid(problem.n_samples, problem.n_features, 2, 2), RandomFraction(4, 0.5)


@pytest.mark.parametrize("certify", [False, True])
def test_every_active_party_finds_and_takes_the_same_step(problem, cipher, monkeypatch,
                                                          certify):
    """Each round, every active party is sent the same ``step`` message, finds from it the
    step the judge returns (to the last bit: the same integers decrypted, the same
    arithmetic), takes that step, and gets the round's commit afterwards."""
    found, taken = defaultdict(dict), defaultdict(dict)
    step, commit = hyfdca_parties.Client.cocoa_step, hyfdca_parties.Client.cocoa_commit

    def recording_step(self, message):
        verdict = step(self, message)
        found[int(self.round["t"])][self.k] = (np.array(verdict["step"]),
                                               np.array(verdict["coherence"]),
                                               np.array(verdict["evaluation"]))
        return verdict

    def recording_commit(self, step_taken, leave=False):
        taken[int(self.round["t"])][self.k] = np.array(step_taken)
        return commit(self, step_taken, leave)

    monkeypatch.setattr(hyfdca_parties.Client, "cocoa_step", recording_step)
    monkeypatch.setattr(hyfdca_parties.Client, "cocoa_commit", recording_commit)
    partition, participation = _setting(problem)
    wire = Wire(0, record=True)
    run_protocol(HyFDCA(certify=certify), problem, partition, participation, ROUNDS, cipher,
                 seed=1, wire=wire)
    # The messages: per round, one step to each active party, all alike, then the commit.
    steps, commits, opened = defaultdict(dict), defaultdict(set), {}
    for k, kind, payload in wire.sent:
        if kind == "round":
            opened[k] = int(payload["configure"]["t"])
        elif kind == "step":
            steps[opened[k]][k] = payload
        elif kind == "commit":  # after the party's step of that round
            assert k in steps[int(payload["round"])], (k, payload["round"])
            commits[int(payload["round"])].add(k)
    assert sorted(steps) == sorted(found) and len(found) == ROUNDS
    assert any(len(parties) < 4 for parties in found.values())  # partial participation
    assert any(len(parties) > 1 for parties in found.values())
    for t, messages in steps.items():
        active = next(iter(messages.values()))["active"].tolist()
        assert sorted(messages) == sorted(active) == sorted(found[t]) == sorted(taken[t])
        assert commits[t] == set(active)
        first = messages[active[0]]
        for message in messages.values():
            assert np.array_equal(message["active"], first["active"])
            assert np.array_equal(message["totals"].chunks, first["totals"].chunks)
            assert all(a.c == b.c for a, b in zip(message["totals"].ciphertexts,
                                                  first["totals"].ciphertexts))
        judge = found[t][active[0]]
        for k in active:
            for mine, judges in zip(found[t][k], judge):
                assert np.array_equal(mine, judges), (t, k)
            assert np.array_equal(taken[t][k], judge[0]), (t, k)  # taken as found
    # Every party answers with its dual changes; the judge's reply alone carries the step.
    judges = {t: int(next(iter(m.values()))["active"][0]) for t, m in steps.items()}
    rounds_of = {k: [t for t in sorted(steps) if k in steps[t]] for k in range(4)}
    replies = defaultdict(list)
    for k, kind, reply in wire.received:
        if kind == "step":
            replies[k].append(reply)
    for k, answered in replies.items():
        assert len(answered) == len(rounds_of[k])
        for t, reply in zip(rounds_of[k], answered):
            assert reply.get("changes") is not None
            assert (reply.get("step") is not None) == (k == judges[t]), (t, k)
            if k == judges[t]:
                assert np.array_equal(reply["step"], found[t][k][0])


def test_different_sums_to_two_parties_are_refused_at_the_one_with_the_wrong_sum(
        problem, cipher, monkeypatch):
    """A server that sends one active party (not the judge) the summed totals without one
    other party's contribution, naming the same active parties, would have the parties
    take different steps: that party's tag check refuses the sum before it computes or
    takes any step (the judge before it answered with the genuine sum)."""
    genuine = hyfdca_parties.Server.cocoa_totals
    forged_for, refused, answered = {}, [], []

    def forge(self, replies):
        messages = genuine(self, replies)
        active = [int(k) for k in self.active]
        if len(active) >= 3 and not forged_for:  # a round with a judge and two others
            victim, omitted = active[-1], active[1]
            acc = None
            for k, reply in replies.items():
                if int(k) != omitted:
                    vec = reply["totals"].ciphertexts
                    acc = vec if acc is None else self.cipher.add(acc, vec)
            message = dict(messages[victim])
            message["totals"] = EncryptedVector(message["totals"].chunks, acc)
            messages[victim] = message
            forged_for.update(t=int(self.t), victim=victim, judge=active[0])
        return messages

    step = hyfdca_parties.Client.cocoa_step

    def watching_step(self, message):
        try:
            verdict = step(self, message)
        except HyflError:
            refused.append((int(self.round["t"]), self.k))
            raise
        answered.append((int(self.round["t"]), self.k))
        return verdict

    commit = hyfdca_parties.Client.cocoa_commit
    took = []

    def watching_commit(self, step_taken, leave=False):
        took.append((int(self.round["t"]), self.k))
        return commit(self, step_taken, leave)

    monkeypatch.setattr(hyfdca_parties.Server, "cocoa_totals", forge)
    monkeypatch.setattr(hyfdca_parties.Client, "cocoa_step", watching_step)
    monkeypatch.setattr(hyfdca_parties.Client, "cocoa_commit", watching_commit)
    partition, _ = _setting(problem)
    with pytest.raises(HyflError, match="their tag does not verify"):
        run_protocol(HyFDCA(), problem, partition, RandomFraction(4, 0.75), ROUNDS, cipher,
                     seed=1)
    assert forged_for, "no round with three active parties"
    t, victim = forged_for["t"], forged_for["victim"]
    assert refused == [(t, victim)]
    assert (t, forged_for["judge"]) in answered and (t, victim) not in answered
    assert (t, victim) not in took  # refused before its step was taken
