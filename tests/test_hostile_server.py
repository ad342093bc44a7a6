"""A dishonest server against a real party: well-formed messages of its own choosing.

Issue 26, point 2 (the party's guard, :mod:`hyfl.deploy.guard`). A genuine run is
recorded message by message with each party's state before and after; the attacks
replay, reorder or alter those messages against the party's state, through
:func:`~hyfl.deploy.party.handle_message` (what every transport runs). Each test
performs an attack the guard must stop and checks that it is refused before any
reply is produced.
"""

from __future__ import annotations

import stat

import numpy as np
import pytest

from hyfl.deploy.codec import decode, encode
from hyfl.deploy.config import DeployConfig, run_config_for
from hyfl.deploy.coordinator import Coordinator
from hyfl.deploy.guard import CERTIFY_MAX
from hyfl.deploy.party import handle_message
from hyfl.errors import HyflError
from hyfl.partition import grid
from hyfl.problem import make_problem
from in_process import Record, RecordingTransport, paillier_parties
from synthetic_data import synthetic

PARTIES = 3
ROUNDS = 8
FORGED = "does not follow hyfl's protocol"
#: A list of participants other than the one the round's instructions told the party.
NOT_TOLD = r"name the active clients \[.*\], not the \[.*\] of the round's instructions"


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """Two parties' worth of everything but a run: keys, data files, node configs, the
    server's public cipher (shared by both recorded runs, so that their ciphertexts can
    be combined as a server holding both would)."""
    return paillier_parties(tmp_path_factory.mktemp("hostile"), PARTIES, ROUNDS)


def _record_run(setting, seed: int) -> RecordingTransport:
    """A genuine encrypted run (cocoa rule, its certificate, 3 parties holding features)."""
    config = run_config_for(parties=PARTIES, iterations=ROUNDS, cipher="paillier",
                            public_key=str(setting["public"]), seed=seed,
                            insecure_test_keys=True,
                            participation="0.67")  # absences: returning parties, checkpoints
    transport = RecordingTransport(setting["nodes"], config, setting["cipher"])
    Coordinator(DeployConfig.from_run_config(config), transport, setting["cipher"],
                log=lambda line: None).run()
    return transport


@pytest.fixture(scope="module")
def run(setting):
    return _record_run(setting, 1)


@pytest.fixture(scope="module")
def other_run(setting):
    """A second run of the same parties (same keys, same data), another seed: what a
    server that ran the job twice holds."""
    return _record_run(setting, 2)


def _find(run, kind, party=None, t=None) -> Record:
    """The first record of ``kind`` (to ``party``, in round ``t``)."""
    opened = {}
    for record in run.records:
        if record.kind == "round":
            opened[record.party] = int(record.payload["configure"]["t"])
        if (record.kind == kind and (party is None or record.party == party)
                and (t is None or opened.get(record.party) == t)):
            return record
    raise LookupError(f"no {kind!r} message (party {party}, round {t}) in the run")


def _find_each(run, kind, t) -> dict[int, Record]:
    """The first record of ``kind`` in round ``t`` to each party that got one."""
    found = {}
    for party in sorted({r.party for r in run.records}):
        if _has(run, kind, party, t):
            found[party] = _find(run, kind, party, t)
    return found


def _took_part(run, record: Record) -> bool:
    """A round message to a party that took part in the round before it, to the end: it
    answered that round's ``step`` and this message delivers that round's commit."""
    t = int(record.payload["configure"]["t"])
    commit = (record.payload.get("deliveries") or {}).get("commit")
    return (t >= 2 and _has(run, "step", record.party, t - 1) and commit is not None
            and int(commit["round"]) == t - 1)


def _has(run, kind, party, t) -> bool:
    try:
        _find(run, kind, party, t)
    except LookupError:
        return False
    return True


def _send(run, record: Record, payload: dict | None = None, state=None, kind=None):
    """Send a party a message (``payload``, else the record's) at a state (else before)."""
    message = record.message if payload is None else encode(payload)
    return handle_message(kind or record.kind, message,
                          record.before if state is None else state,
                          run.nodes[record.party], run.run_config)


def test_the_recorded_run_is_genuine_and_replays_exactly(run):
    """The harness: a message replayed at the state it met gives the same reply."""
    kinds = {r.kind for r in run.records}
    assert {"hello", "setup", "round", "proposals", "image", "direction", "step",
            "certify", "finish"} <= kinds
    assert "changes" not in kinds  # the step message is answered with the dual changes
    # Every active party gets the step; the round's commit comes with its next message.
    assert len(_find_each(run, "step", 2)) >= 2
    assert any((r.payload.get("deliveries") or {}).get("commit") is not None
               for r in run.records if r.kind == "round")
    record = _find(run, "step", t=2)
    _, state = _send(run, record)
    replayed, recorded = decode(*state, run.cipher), decode(*record.after, run.cipher)
    assert np.array_equal(replayed["client"]["alpha"], recorded["client"]["alpha"])
    assert replayed["guard"] == recorded["guard"]


@pytest.mark.parametrize("kind", ["step", "image", "direction", "proposals"])
def test_a_second_query_in_one_attempt_is_refused(run, kind):
    """The oracles of point 2 need the same question asked many times: each kind is
    answered once per attempt of a round, by every party it goes to (the step: each
    active party decrypts the summed sums once, takes one step, sends one set of dual
    changes; the judge returns one coherence, one step)."""
    records = _find_each(run, kind, 2)
    if kind == "step":
        assert len(records) >= 2, "the step goes to every active party"
    for record in records.values():
        with pytest.raises(HyflError, match=f"{FORGED}|sent '{kind}' twice"):
            _send(run, record, state=record.after)


def test_the_judges_step_takes_no_numbers_out_of_range(run):
    record = _find(run, "step", t=2)
    genuine = record.payload
    C = genuine["dw_sq"].size
    for field, value, problem in [("dw_sq", -np.ones(C), "field dw_sq holds"),
                                  ("coherence", np.full(C, np.nan), "field 'coherence' is"),
                                  ("updated", 0, "field updated is 0")]:
        with pytest.raises(HyflError, match=problem):
            _send(run, record, {**genuine, field: value})


def test_direction_and_step_take_no_numbers_out_of_range(run):
    """The server's numbers a party computes with are held to what an honest server
    sends. The step itself no longer travels (the server's chosen step was refused in
    the old ``changes`` message): every active party finds it from the summed sums, so
    the server's way to choose it is now those sums, or the numbers beside them. At
    every party: a chosen or altered ``totals`` fails the tag check, another round's
    genuine sum too, and ``dw_sq``, ``coherence``, ``updated`` out of range are refused."""
    from hyfl.privacy.layout import EncryptedVector

    record = _find(run, "direction", t=2)
    mu = record.payload["mu"]
    for forged in (mu + 1.0, mu - 1.0, np.full_like(mu, np.inf)):
        with pytest.raises(HyflError, match="field mu holds|field 'mu' is array"):
            _send(run, record, {"mu": forged})
    steps = _find_each(run, "step", 2)
    assert len(steps) >= 2 and any(int(r.payload["active"][0]) != k for k, r in steps.items())
    for k, record in steps.items():
        genuine = record.payload
        totals = genuine["totals"]
        _send(run, record)  # the genuine message verifies
        C = genuine["dw_sq"].size
        n = int(decode(*record.before, run.cipher)["public"]["n_samples"])
        for field, value, problem in [("dw_sq", -np.ones(C), "field dw_sq holds"),
                                      ("dw_sq", np.full(C, np.inf),
                                       "field dw_sq holds|field 'dw_sq' is"),
                                      ("coherence", -np.ones(C), "field coherence holds"),
                                      ("coherence", np.full(C, np.nan), "field 'coherence' is"),
                                      ("updated", 0, "field updated is 0"),
                                      ("updated", n + 1, f"field updated is {n + 1}")]:
            with pytest.raises(HyflError, match=problem):
                _send(run, record, {**genuine, field: value})
        # A step of the server's choosing: a chosen sum, a genuine one plus anything (the
        # first line-search point's gain), another round's genuine sum.
        chosen = run.cipher.encrypt(np.full((totals.ciphertexts.size, 1), 0.25))
        added = totals.ciphertexts.copy()
        added[:1] = run.cipher.add(added[:1], run.cipher.encrypt(np.array([[1e-3]])))
        later = _find(run, "step", party=k, t=3).payload["totals"] if _has(
            run, "step", k, 3) else None
        for forged in (chosen, added, None if later is None else later.ciphertexts):
            if forged is None:
                continue
            with pytest.raises(HyflError, match="their tag does not verify"):
                _send(run, record, {**genuine,
                                    "totals": EncryptedVector(totals.chunks, forged)})


def test_a_commit_before_the_step_is_refused(run):
    """The round's commit (the party's new weights) comes with its next message and closes
    the round. Delivered for the open round before the party answered ``step`` -- the
    weights of a step it has not taken, a round it would close without its dual changes
    -- it is refused before anything is answered; after the step it is applied."""
    record = next(r for r in run.records if r.kind == "round" and _took_part(run, r))
    party, t = record.party, int(record.payload["configure"]["t"])
    commit = record.payload["deliveries"]["commit"]
    assert int(commit["round"]) == t - 1
    reply, state = _send(run, record)  # genuine: after its step in round t - 1
    assert decode(*state, run.cipher)["guard"]["closed"] == t - 1
    for before in ("round", "proposals", "image", "direction"):
        early = _find(run, before, party=party, t=t - 1)
        with pytest.raises(HyflError, match=f"commits round {t - 1} before the party took "
                                            "its step"):
            _send(run, record, state=early.after)
    # Nor can the commit ride along with the step itself (the step carries no deliveries).
    step = _find(run, "step", party=party, t=t - 1)
    with pytest.raises(HyflError, match="unknown field 'deliveries'"):
        _send(run, step, {**step.payload, "deliveries": {"commit": commit}})


def test_a_step_to_a_party_outside_its_active_list_is_refused(run):
    """The summed totals are checked against the contributions of the parties the message
    names as active, which must be the round's participants the round's instructions told
    the party (``configure.active``): a step that names a list without the party it goes
    to, with it twice, or with a party that sent nothing is refused before anything is
    decrypted, at every party; instructions telling a list without the party are refused
    when they come; a step to a party that is not in the round at all is refused by its
    guard."""
    steps = _find_each(run, "step", 2)
    assert len(steps) >= 2
    for k, record in steps.items():
        genuine = record.payload
        active = genuine["active"]
        assert k in active.tolist()
        for forged in (active[active != k], np.concatenate([active, [k]]),
                       np.array([j for j in range(PARTIES) if j not in active.tolist()])):
            if forged.size == 0:
                continue
            with pytest.raises(HyflError, match=NOT_TOLD):
                _send(run, record, {**genuine, "active": forged})
        for j in range(PARTIES):  # the sum claimed to hold a party that sent nothing
            if j not in active.tolist():
                with pytest.raises(HyflError, match=NOT_TOLD):
                    _send(run, record, {**genuine, "active": np.append(active, j)})
        opened = _find(run, "round", party=k, t=2)
        configure = opened.payload["configure"]
        assert np.array_equal(configure["active"], active)  # the list it was told
        with pytest.raises(HyflError, match="not an ascending list holding this client"):
            _send(run, opened, {**opened.payload, "configure": {
                **configure, "active": active[active != k]}})
    outside = [j for j in range(PARTIES) if j not in steps]
    assert outside, "every party took part in round 2"
    for j in outside:  # a party not in round 2, sent its step: the guard refuses it
        sent = steps[min(steps)]
        at = next(i for i, r in enumerate(run.records) if r is sent)
        state = next(r for r in reversed(run.records[:at]) if r.party == j).after
        with pytest.raises(HyflError, match=f"{FORGED}|outside a round"):
            handle_message("step", sent.message, state, run.nodes[j], run.run_config)


def test_rounds_never_go_back_and_restart_a_bounded_number_of_times(run):
    later = _find(run, "round", party=0, t=3)
    earlier = _find(run, "round", party=0, t=2)
    with pytest.raises(HyflError, match="was sent round 2 after round 3"):
        _send(run, earlier, state=later.after)
    beyond = later.payload
    beyond["configure"]["t"] = ROUNDS + 1
    with pytest.raises(HyflError, match=f"was sent round {ROUNDS + 1} of a run of {ROUNDS}"):
        _send(run, later, beyond, state=later.after)
    # A restart of round 3 (the same round again) is honest up to PARTIES - 1 times.
    state = later.after
    for _ in range(PARTIES - 1):
        _, state = _send(run, later, state=state)
    with pytest.raises(HyflError, match=f"round 3 for the {PARTIES + 1}th time"):
        _send(run, later, state=state)


def test_stale_duals_go_only_to_a_party_that_missed_a_round(run):
    """The rows-and-labels attack: stale duals of the server's choosing to a party that
    took part in the previous round to the end; refused before anything is decrypted."""
    record = next(r for r in run.records if r.kind == "round" and _took_part(run, r))
    payload = record.payload
    t = int(payload["configure"]["t"])
    assert payload["configure"]["stale"] is None
    chosen = _find(run, "image", party=record.party, t=t - 1).payload["proposal"]  # any vector
    payload["configure"]["stale"] = chosen
    with pytest.raises(HyflError, match=f"was sent stale duals in round {t}"):
        _send(run, record, payload)


def test_hello_and_setup_come_once(run):
    hello = _find(run, "hello", party=0)
    setup = _find(run, "setup", party=0)
    mid_run = _find(run, "round", party=0, t=2).after
    with pytest.raises(HyflError, match="second 'hello' after its set-up"):
        _send(run, hello, state=mid_run)
    with pytest.raises(HyflError, match="'setup' message a second time"):
        _send(run, setup, state=mid_run)
    # Before the set-up a repeated hello is answered (the server may have lost the reply).
    _send(run, hello, state=hello.after)


def test_kinds_out_of_the_protocols_order_are_refused(run):
    # (a round whose model rode along -- its inner products came ahead -- has answered
    # the proposals already: it has no proposals message)
    opened = next(r for r in run.records if r.kind == "round" and not r.payload.get("wait")
                  and r.payload["configure"]["stale"] is None
                  and _has(run, "proposals", r.party, int(r.payload["configure"]["t"])))
    party, t = opened.party, int(opened.payload["configure"]["t"])
    for kind, before in [("image", "proposals"), ("direction", "image"),
                         ("step", "direction")]:
        record = _find(run, kind, party=party, t=t)
        with pytest.raises(HyflError, match=f"sent '{kind}' before '{before}'"):
            _send(run, record, state=opened.after)
    # The checkpoint decision comes after the judge's step (the table's ``after``).
    certify = _find(run, "certify")
    judge = certify.party
    direction = next(r for r in reversed(run.records[:run.records.index(certify)])
                     if r.kind == "direction" and r.party == judge)
    with pytest.raises(HyflError, match="sent 'certify' before 'step'"):
        _send(run, certify, state=direction.after)
    weights = {"w": decode(*opened.after, run.cipher)["client"]["w"]}
    with pytest.raises(HyflError, match="'weights' in a round that did not announce them"):
        _send(run, opened, weights, state=opened.after, kind="weights")


def test_checkpoint_decisions_are_bounded_per_attempt(run):
    record = _find(run, "certify")
    state = record.after
    answered = 1
    while answered < CERTIFY_MAX:
        _, state = _send(run, record, state=state)
        answered += 1
    with pytest.raises(HyflError, match=f"more than {CERTIFY_MAX} checkpoint decisions"):
        _send(run, record, state=state)
    with pytest.raises(HyflError, match="field w_sq holds"):
        _send(run, record, {**record.payload, "w_sq": np.array([-1.0, 0.0])})


def test_nothing_is_answered_after_the_run_finished(run):
    finish = _find(run, "finish", party=0)
    last = max(r for r in range(1, 20) if _has(run, "round", 0, r))
    record = _find(run, "round", party=0, t=last)
    payload = record.payload
    payload["configure"]["t"] = last + 1  # the next round, as if the run went on
    with pytest.raises(HyflError, match="after the run finished"):
        _send(run, record, payload, state=finish.after)


def test_a_refusal_ends_the_run_for_the_server(run, monkeypatch):
    """The transport marks the run refused: the genuine next message gets no answer
    either, so a refusal is not a question the server can ask again."""
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from hyfl.deploy.app import _handler, pack, save_state

    for name in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    record = _find(run, "step", t=2)
    context = Context(run_id=1, node_id=1, node_config=run.nodes[record.party],
                      state=RecordDict(), run_config=run.run_config)
    save_state(context, record.after)
    replayed = Message(pack(*record.message), dst_node_id=1, message_type="query.step")
    with pytest.raises(HyflError, match="could not handle the server's 'step' message"):
        _handler("step")(replayed, context)
    save_state(context, record.before)  # even a state where the message was fine
    with pytest.raises(HyflError, match="could not handle"):
        _handler("step")(replayed, context)
    from hyfl.deploy.app import load_state

    with pytest.raises(HyflError, match="answers no more of it"):
        load_state(context)


def test_the_setup_partition_is_the_one_the_parties_announced(run):
    """A forged partition (another party's features, other sizes, another lam) would
    change what a party computes and sends later: each must carry the parties' tags."""
    record = _find(run, "setup", party=0)
    genuine = record.payload
    assert genuine["tags"].shape == (PARTIES, 32)
    counts = genuine["feature_counts"]
    moved = genuine["features"].copy()  # party 1 claims one of party 2's features
    moved[counts[0] + counts[1] - 1], moved[counts[0] + counts[1]] = (
        moved[counts[0] + counts[1]], moved[counts[0] + counts[1] - 1])
    for change, problem in [
        ({"features": moved}, "a partition or sizes that party 1 did not announce"),
        ({"n_samples": genuine["n_samples"] + 1}, "did not announce"),
        ({"lam": genuine["lam"] * 2}, "sets lam"),
        ({"n_outputs": 2}, "sets 2 outputs"),
        ({"tags": None}, "does not relay every party's announcement"),
    ]:
        with pytest.raises(HyflError, match=problem):
            _send(run, record, {**genuine, **change})
    # The set-up of an earlier hello (another nonce) does not verify either.
    _, again = _send(run, _find(run, "hello", party=0), state=record.before)
    with pytest.raises(HyflError, match="another nonce than the one this party announced"):
        _send(run, record, state=again)


def test_a_party_decrypts_only_the_chunks_it_reads(run):
    """Extra, repeated or reordered chunks in a vector are refused before decryption."""
    from hyfl.privacy.layout import EncryptedVector

    record = _find(run, "image", t=2)
    genuine = record.payload
    vec = genuine["proposal"]
    spare = vec.ciphertexts[:1]
    for chunks, ciphertexts in [
        (np.append(vec.chunks, vec.chunks.max() + 1), np.concatenate([vec.ciphertexts, spare])),
        (np.append(vec.chunks, vec.chunks[-1]), np.concatenate([vec.ciphertexts, spare])),
        (vec.chunks[::-1], vec.ciphertexts[::-1]),
    ]:
        if np.array_equal(chunks, vec.chunks):
            continue  # one chunk reversed is itself
        forged = {**genuine, "proposal": EncryptedVector(chunks, ciphertexts)}
        with pytest.raises(HyflError, match="not exactly those of the samples"):
            _send(run, record, forged)


def test_the_judge_decrypts_only_the_active_parties_totals(run):
    """The issue's reproducer: a chosen value added into the judge's summed totals (the
    'own' slot, read back through the coherence) -- or a sum of fewer parties' totals --
    is refused before anything computed from it leaves (hyfl.privacy.tags; a list other
    than the one the round's instructions told the judge, before its tag is checked)."""
    from hyfl.privacy.layout import EncryptedVector

    record = _find(run, "step", t=2)
    genuine = record.payload
    totals = genuine["totals"]
    _, state = _send(run, record)  # the genuine message verifies
    own = totals.ciphertexts.size - 2  # the last value before the tag: 'own' of the last output
    for delta in (1e-6, 1.0, -3.5):
        ciphertexts = totals.ciphertexts.copy()
        ciphertexts[own:own + 1] = run.cipher.add(ciphertexts[own:own + 1],
                                                  run.cipher.encrypt(np.array([[delta]])))
        forged = {**genuine, "totals": EncryptedVector(totals.chunks, ciphertexts)}
        with pytest.raises(HyflError, match="their tag does not verify"):
            _send(run, record, forged)
    active = genuine["active"]
    judge = record.party
    if active.size > 1:  # the same sum claimed to be of fewer parties
        fewer = active[active == judge]
        with pytest.raises(HyflError, match=NOT_TOLD):
            _send(run, record, {**genuine, "active": fewer})
    with pytest.raises(HyflError, match=NOT_TOLD):
        _send(run, record, {**genuine, "active": active[active != judge]})


def test_the_image_is_only_of_the_drawers_summed_proposals(run):
    """The strongest oracle of issue 26 point 2: ``image`` returns ``X_k^T p`` for the
    proposal sum ``p`` the party decrypts, so ``p = Enc(e_i)`` gave a feature row and,
    after that, any ciphertext's value. Each holder group's sum now carries the keyed
    tags of its drawers' proposals: a chosen value, a genuine sum plus anything, or a
    sum missing a drawer is refused before the image is computed."""
    from hyfl.privacy.layout import EncryptedVector

    record = _find(run, "image", t=2)
    genuine = record.payload
    vec = genuine["proposal"]
    reply, _ = _send(run, record)  # the genuine sum verifies
    assert "primal_part" in decode(*reply, run.cipher)
    chosen = vec.ciphertexts.copy()
    chosen[0] = run.cipher.encrypt(np.array([[1.0]]))[0]  # e_i in the first sample's slot
    added = vec.ciphertexts.copy()
    added[:1] = run.cipher.add(added[:1], run.cipher.encrypt(np.array([[1e-6]])))
    for ciphertexts in (chosen, added):
        forged = {**genuine, "proposal": EncryptedVector(vec.chunks, ciphertexts)}
        with pytest.raises(HyflError, match="tag does not verify"):
            _send(run, record, forged)
    # The party's own proposals alone, as if its co-drawers had sent nothing.
    asked = _find(run, "proposals", party=record.party, t=2)
    own = decode(*_send(run, asked)[0], run.cipher)["proposals"]
    assert np.array_equal(own.chunks, vec.chunks)
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(run, record, {**genuine, "proposal": own})
    # Another round's genuine sum (same chunks) is not this attempt's.
    later = _find(run, "image", party=record.party, t=3).payload["proposal"]
    if np.array_equal(later.chunks, vec.chunks):
        with pytest.raises(HyflError, match="tag does not verify"):
            _send(run, record, {**genuine, "proposal": later})


def test_the_safe_rules_verdict_is_only_of_the_active_parties_gain_terms(monkeypatch):
    """The per-sample safe rule's judge decrypts the summed gain terms and answers a bit:
    a server that adds a value of its choosing (a comparison oracle at a threshold it
    picks) or drops a party's terms is refused before the verdict is computed (the
    dropped party by the list the round's instructions told the judge)."""
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.algorithms.hyfdca_parties import Server
    from hyfl.participation import RandomFraction
    from hyfl.privacy.ciphers import make_cipher
    from hyfl.privacy.layout import EncryptedVector
    from hyfl.runtime.protocol import run_protocol

    problem = make_problem(synthetic(n=40, m=6), "hinge", 0.05)
    partition = grid(problem.n_samples, problem.n_features, 2, 2)
    cipher = make_cipher("paillier", key_bits=256)
    hyfdca = HyFDCA(local_steps=2, step_rule="safe")
    run_protocol(hyfdca, problem, partition, RandomFraction(4, 0.75), 2, cipher, seed=0)
    genuine = Server.aggregate_primal

    def forge(change):
        def aggregate(self, replies):
            check = genuine(self, replies)
            if check is not None:
                change(self, check[1])
            return check
        return aggregate

    def add_value(server, message):
        totals = message["totals"]
        extra = server.cipher.encrypt(np.array([[0.5]]))
        message["totals"] = EncryptedVector(totals.chunks, np.concatenate(
            [server.cipher.add(totals.ciphertexts[:1], extra), totals.ciphertexts[1:]]))

    def drop_party(server, message):
        message["active"] = message["active"][:1]

    for change, refusal in ((add_value, "their tag does not verify"),
                            (drop_party, NOT_TOLD)):
        monkeypatch.setattr(Server, "aggregate_primal", forge(change))
        with pytest.raises(HyflError, match=refusal):
            run_protocol(hyfdca, problem, partition, RandomFraction(4, 0.75), 2, cipher, seed=0)


def _with_stale(run) -> Record:
    """A round message that carries stale duals (a party that missed rounds)."""
    for record in run.records:
        if record.kind == "round":
            stale = record.payload["configure"].get("stale")
            if stale is not None and len(stale):
                return record
    raise LookupError("no stale duals in the recorded run")


def test_stale_duals_are_states_a_holder_made(run):
    """The issue's second reproducer: stale duals ``Enc(e_i v)`` (then rolled back) gave,
    through the primal part, one sample's feature row and label. The server stores each
    chunk's state as its reporter encrypted it, with a tag, and says who made it; a
    chosen value, a genuine state plus anything, or a state attributed to anyone or any
    round else is refused before the primal part is computed."""
    from hyfl.privacy.layout import EncryptedVector

    record = _with_stale(run)
    genuine = record.payload
    configure = genuine["configure"]
    vec, contexts = configure["stale"], configure["stale_contexts"]
    reply, _ = _send(run, record)  # the genuine states verify
    assert "primal_part" in decode(*reply, run.cipher)

    def send(ciphertexts=None, forged_contexts=None):
        forged = {**configure,
                  "stale": EncryptedVector(vec.chunks, vec.ciphertexts if ciphertexts is None
                                           else ciphertexts),
                  "stale_contexts": contexts if forged_contexts is None else forged_contexts}
        return _send(run, record, {**genuine, "configure": forged})

    chosen = vec.ciphertexts.copy()
    chosen[0] = run.cipher.encrypt(np.array([[1.0]]))[0]
    added = vec.ciphertexts.copy()
    added[:1] = run.cipher.add(added[:1], run.cipher.encrypt(np.array([[1e-6]])))
    for ciphertexts in (chosen, added):
        with pytest.raises(HyflError, match="tag does not verify"):
            send(ciphertexts)
    t = int(configure["t"])
    made = contexts.reshape(-1, 3)
    assert (made[:, 0] > 0).any() and (made[:, 0] < t).all()
    first = int(np.flatnonzero(made[:, 0] > 0)[0])
    for column, value, refusal in [(0, t, "not a state a holder made"),  # made this round
                                   (2, 99, "not a state a holder made"),  # by a non-holder
                                   (0, 0, "tag does not verify"),  # the zeros it started from
                                   (1, 2, "tag does not verify")]:  # in another attempt
        forged = made.copy()
        forged[first, column] = value
        with pytest.raises(HyflError, match=refusal):
            send(forged_contexts=forged.reshape(-1))


def test_the_last_steps_and_the_checkpoint_are_states_a_holder_made(run):
    """A returning party's last steps (``previous``: the states before last round's
    step) and a checkpoint's duals enter its direction and its checkpoint image: a
    chosen value in either is refused (their tags)."""
    from hyfl.privacy.layout import EncryptedVector

    def forge(vec):
        ciphertexts = vec.ciphertexts.copy()
        ciphertexts[0] = run.cipher.encrypt(np.array([[0.5]]))[0]
        return EncryptedVector(vec.chunks, ciphertexts)

    tried = 0
    for record in run.records:
        payload = record.payload
        if record.kind == "image" and payload.get("previous") is not None \
                and len(payload["previous"]):
            _send(run, record)  # genuine
            with pytest.raises(HyflError, match="tag does not verify"):
                _send(run, record, {**payload, "previous": forge(payload["previous"])})
            tried |= 1
        if record.kind == "round" and payload["configure"].get("checkpoint_duals") is not None \
                and len(payload["configure"]["checkpoint_duals"]):
            configure = payload["configure"]
            _send(run, record)  # genuine
            forged = {**configure, "checkpoint_duals": forge(configure["checkpoint_duals"])}
            with pytest.raises(HyflError, match="tag does not verify"):
                _send(run, record, {**payload, "configure": forged})
            tried |= 2
    assert tried == 3, f"the recorded run lacks last steps or checkpoint duals ({tried})"


def test_the_row_norms_are_the_holders_sums(run):
    """The set-up's squared row norms (delivered with the first round) enter the
    subproblem and the line search: a chosen value, or one holder's part alone, is
    refused (each holder group's sum carries its holders' tags)."""
    from hyfl.privacy.layout import EncryptedVector

    record = next(r for r in run.records if r.kind == "round"
                  and (r.payload.get("deliveries") or {}).get("norms") is not None)
    genuine = record.payload
    norms = genuine["deliveries"]["norms"]
    _send(run, record)  # genuine
    chosen = norms.ciphertexts.copy()
    chosen[0] = run.cipher.add(chosen[:1], run.cipher.encrypt(np.array([[2.0]])))[0]
    forged = {**genuine, "deliveries": {**genuine["deliveries"],
                                        "norms": EncryptedVector(norms.chunks, chosen)}}
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(run, record, forged)


def test_the_inner_products_are_the_holders_parts(run):
    """The inner products ``z`` a party decrypts are remembered and reach its proposals,
    span sums and line-search sums: a chosen value added, or a holder's part claimed
    to be of another round (or its own of an older one), is refused."""
    from hyfl.privacy.layout import EncryptedVector

    record = _find(run, "proposals", t=3)
    genuine = record.payload
    z, made = genuine["z"], genuine["z_made"]
    _send(run, record)  # genuine
    chosen = z.ciphertexts.copy()
    chosen[0] = run.cipher.add(chosen[:1], run.cipher.encrypt(np.array([[0.25]])))[0]
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(run, record, {**genuine, "z": EncryptedVector(z.chunks, chosen)})
    parts = made.reshape(-1, 2)
    for row in range(parts.shape[0]):
        forged = parts.copy()
        forged[row, 0] = 1 if parts[row, 0] != 1 else 2  # made in another round
        with pytest.raises(HyflError, match="tag does not verify|not a part it can"):
            _send(run, record, {**genuine, "z_made": forged.reshape(-1)})


def test_the_checkpoint_decision_is_of_the_judges_changes(run):
    """The certificate's judge compares two conjugate sums the server kept: with a chosen
    value added (a comparison oracle at a threshold the server sets through ``w_sq``),
    or a change left out of the list of who made them, it is refused; a list naming
    a change twice is refused before the tag is checked (one judge makes a round's
    change)."""
    from hyfl.privacy.layout import EncryptedVector

    record = _find(run, "certify")
    genuine = record.payload
    _send(run, record)  # genuine
    for name in ("certified", "checkpoint"):
        vec = genuine[name]
        chosen = vec.ciphertexts.copy()
        chosen[:1] = run.cipher.add(chosen[:1], run.cipher.encrypt(np.array([[-3.0]])))
        with pytest.raises(HyflError, match="tag does not verify"):
            _send(run, record, {**genuine, name: EncryptedVector(vec.chunks, chosen)})
        made = genuine[f"{name}_made"].reshape(-1, 3)
        if made.shape[0]:
            with pytest.raises(HyflError, match="tag does not verify"):
                _send(run, record, {**genuine, f"{name}_made": made[1:].reshape(-1)})
            twice = np.concatenate([made, made[:1]])
            with pytest.raises(HyflError, match="names two changes of one attempt of a "
                                                "round"):
                _send(run, record, {**genuine, f"{name}_made": twice.reshape(-1)})
    assert genuine["checkpoint_made"].size  # the run's checkpoint holds judges' changes


def test_the_worker_keeps_the_state_in_its_folder_not_in_the_context(run, tmp_path):
    """The long-lived worker's state goes to a private file of the run (mode 0600), not
    into ``context.state``, which would travel with every message; a restarted worker
    reads it back exactly; a node config's ``state-dir`` wins over the worker's folder."""
    from flwr.app import Context, RecordDict

    from hyfl.deploy.app import load_state, save_state

    record = _find(run, "step", t=2)
    node = run.nodes[record.party]
    context = Context(run_id=7, node_id=1, node_config=node, state=RecordDict(),
                      run_config=run.run_config)
    folder = tmp_path / "worker"
    assert load_state(context, folder) is None  # nothing saved yet: a new party
    save_state(context, record.after, folder)
    assert len(context.state) == 0
    saved = folder / f"run-7-party-{node['party']}.npz"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    arrays, spec = load_state(Context(run_id=7, node_id=2, node_config=node,
                                      state=RecordDict(), run_config=run.run_config), folder)
    assert spec == record.after[1] and arrays.keys() == record.after[0].keys()
    for name, array in record.after[0].items():
        np.testing.assert_array_equal(arrays[name], array)
    kept = Context(run_id=7, node_id=1, node_config={**node, "state-dir": str(tmp_path / "dir")},
                   state=RecordDict(), run_config=run.run_config)
    save_state(kept, record.after, folder)
    assert (tmp_path / "dir" / saved.name).is_file() and len(kept.state) == 0


# -- issue 42, point 3: sums, states and tags of another run ----------------------------

def _attempt(run, record: Record) -> int:
    """The attempt of its round a party was in after ``record``."""
    return int(decode(*record.after, run.cipher)["guard"]["attempts"])


def _round_of(run, record: Record) -> int:
    return int(decode(*record.after, run.cipher)["guard"]["t"])


def _at(run, kind: str, party: int, t: int, attempt: int) -> Record | None:
    """The ``kind`` record of ``party`` in round ``t``, attempt ``attempt`` (else None)."""
    return next((r for r in run.records if r.kind == kind and r.party == party
                 and _round_of(run, r) == t and _attempt(run, r) == attempt), None)


def _judged(run) -> list[Record]:
    """Every ``step`` message: each active party decrypts the summed totals it carries
    (all of one attempt carry the same sum)."""
    return [r for r in run.records if r.kind == "step"]


def _negated(cipher, ciphertexts: np.ndarray) -> np.ndarray:
    """``Enc(-m)`` from ``Enc(m)`` with the public key alone (the inverse mod n^2)."""
    import gmpy2

    from hyfl.privacy.ciphers import PaillierCiphertext

    nsq = cipher._key.nsq
    out = np.empty(ciphertexts.size, dtype=object)
    out[:] = [PaillierCiphertext(gmpy2.invert(x.c, nsq), x.addends, x.tag) for x in ciphertexts]
    return out


def _combined(cipher, terms, tag_shift: int):
    """``sum_j lambda_j S_j`` for ``terms`` = [(lambda_j, EncryptedVector)], plus
    ``tag_shift * TAG_PRIME`` in the tag (the last value): a server's integer combination
    of genuine sums, brought into the tag's range by a multiple of the prime."""
    from hyfl.privacy.layout import EncryptedVector
    from hyfl.privacy.tags import TAG_PRIME

    total = None
    for coefficient, vec in terms:
        part = vec.ciphertexts if coefficient > 0 else _negated(cipher, vec.ciphertexts)
        for _ in range(abs(coefficient)):
            total = part if total is None else cipher.add(total, part)
    shift = np.zeros((total.size, 1))
    shift[-1, 0] = np.ldexp(float(tag_shift * TAG_PRIME), -32)  # exact: 42 bits
    total = cipher.add(total, cipher.encrypt(shift))
    return EncryptedVector(terms[0][1].chunks, total)


def test_a_judged_sum_of_another_run_is_refused(run, other_run):
    """The issue's reproducer: the judge of run 2 was sent run 1's summed totals of the
    same round and attempt (every context alike: same parties, same kind, round, attempt,
    senders) and returned the step computed from them. The tags are keyed with the run's
    identity now: another run's sum does not verify, nothing is returned (and one under
    another list of parties than run 2's instructions told is refused for that first)."""
    tried = 0
    for judged in _judged(run):
        t, attempt = _round_of(run, judged), _attempt(run, judged)
        there = _at(other_run, "direction", judged.party, t, attempt)
        if there is None:
            continue
        told = decode(*there.after, other_run.cipher)["client"]["round"]["active"]
        same = np.array_equal(judged.payload["active"], told)
        with pytest.raises(HyflError, match="their tag does not verify" if same else NOT_TOLD):
            handle_message("step", judged.message, there.after, other_run.nodes[judged.party],
                           other_run.run_config)
        tried += same
    assert tried, ("no round in which the same party judged in one run and was active in "
                   "both, told the same participants")


def test_inner_products_of_another_run_are_refused(run, other_run):
    """Run 1's inner products (with who made them when) replayed into run 2's proposals
    of the same round and attempt: same chunks, same contexts, genuine tags of the same
    secret -- refused, since the tags are keyed with the run."""
    proposals = next(r for r in other_run.records if r.kind == "proposals"
                     and _at(run, "proposals", r.party, _round_of(other_run, r),
                             _attempt(other_run, r)) is not None)
    earlier = _at(run, "proposals", proposals.party, _round_of(other_run, proposals),
                  _attempt(other_run, proposals)).payload
    genuine = proposals.payload
    assert np.array_equal(earlier["z"].chunks, genuine["z"].chunks)
    _send(other_run, proposals)  # genuine
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(other_run, proposals, {**genuine, "z": earlier["z"], "z_made": earlier["z_made"]})


def test_row_norms_of_another_run_are_refused(run, other_run):
    """Run 1's set-up row norms in run 2's first round (the same parties' same data:
    the same values and contexts) are refused: a state of another run."""

    def with_norms(r):
        return r.kind == "round" and (r.payload.get("deliveries") or {}).get("norms") is not None

    first = next(r for r in other_run.records if with_norms(r))
    norms = next(r for r in run.records if with_norms(r) and r.party == first.party)
    payload = first.payload
    payload["deliveries"]["norms"] = norms.payload["deliveries"]["norms"]
    _send(other_run, first)  # genuine
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(other_run, first, payload)


def test_a_chosen_combination_of_genuine_sums_is_refused(run, other_run):
    """The issue's second reproducer: ``2*S_B - S_A`` of two genuine summed totals (S_A of
    run 1, S_B of run 2, the same round, attempt and active parties), its tag shifted by
    a multiple of the prime into range, was accepted by run 2's judge (it is no sum of
    genuine contributions). Within one run, a combination of two rounds' sums fails too.
    Every shift the server could try is refused, and the genuine sum still verifies."""
    def key(r, on):
        return _round_of(on, r), _attempt(on, r), tuple(sorted(r.payload["active"].tolist()))

    ones = {key(r, run): r for r in _judged(run)}
    pairs = [(ones[key(r, other_run)], r) for r in _judged(other_run) if key(r, other_run) in ones]
    assert pairs, "no round judged with the same active parties in both runs"
    first, second = pairs[0]
    # Another round's sum (every active party of an attempt is sent the same one).
    within = next((r for r in _judged(other_run) if key(r, other_run)[0] != key(
        second, other_run)[0] and key(r, other_run)[2] == key(second, other_run)[2]), None)
    cipher = run.cipher
    assert within is not None, "no second round of run 2 judged with the same active parties"
    combinations = {"across runs": [(2, second.payload["totals"]),
                                    (-1, first.payload["totals"])],
                    "within run 2": [(2, second.payload["totals"]),
                                     (-1, within.payload["totals"])],
                    "of three sums": [(1, second.payload["totals"]),
                                      (1, within.payload["totals"]),
                                      (-1, first.payload["totals"])]}
    m = second.payload["active"].size
    accepted = []
    _send(other_run, second)  # genuine
    for name, terms in combinations.items():
        for shift in range(-2 * m, 3 * m + 1):  # every multiple that can land in range
            forged = {**second.payload, "totals": _combined(cipher, terms, shift)}
            try:
                _send(other_run, second, forged)
            except HyflError as err:
                assert "their tag does not verify" in str(err)
                continue
            accepted.append((name, shift))
    assert not accepted, f"combinations accepted (which, tag shift): {accepted}"


def test_the_run_identity_is_each_partys_own_from_the_announced_nonces(run, other_run):
    """Every party computes the run's identity itself, SHA-256 of the set-up's nonces
    (each under its party's tag): all agree, two runs differ. A server that relays a
    peer's genuine announcement of another run gets the set-up through (the tag is
    genuine) but the party's identity then differs from its peers', and their sums are
    refused: the server cannot make parties share a run identity it chose."""
    from hyfl.privacy.tags import RUN_BYTES, run_identity

    def identities(r):
        setups = [x for x in r.records if x.kind == "setup"]
        nonces = [bytes(row) for row in setups[0].payload["nonces"].astype(np.uint8)]
        return {bytes(decode(*x.after, r.cipher)["run"]) for x in setups}, run_identity(nonces)

    (one,), expected = identities(run)
    (two,), _ = identities(other_run)
    assert one == expected and len(one) == RUN_BYTES and one != two
    setup = _find(other_run, "setup", party=0)
    forged = setup.payload
    earlier = _find(run, "setup", party=0).payload
    for name in ("nonces", "tags"):
        forged[name][1] = earlier[name][1]  # party 1's genuine announcement of run 1
    _, state = _send(other_run, setup, forged)
    assert bytes(decode(*state, other_run.cipher)["run"]) not in (one, two)
    first = next(r for r in other_run.records if r.kind == "round" and r.party == 0)
    assert first.payload["deliveries"]["norms"] is not None
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(other_run, first, state=state)
