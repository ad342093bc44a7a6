"""An independent attacker's review of the active server during training (issue 42, point 6).

The attacks of a dishonest coordinator after the set-up, on a recorded genuine run
(:mod:`test_hostile_server`'s harness: the real codec and
:func:`~hyfl.deploy.party.handle_message`, the party's state before each message).
Each test sends a party a message the honest protocol never sends and checks that it
is refused before any reply is computed from it.
"""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.deploy.codec import decode
from hyfl.errors import HyflError
from hyfl.privacy.layout import EncryptedVector
from hyfl.privacy.tags import TAG_PRIME
from in_process import paillier_parties
from test_hostile_server import PARTIES, ROUNDS, _find, _record_run, _send, _with_stale


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """:mod:`test_hostile_server`'s setting (its fixture's body): keys, three parties'
    data files and node configs, the server's public cipher."""
    return _setting(tmp_path_factory, PARTIES, 1)


def _setting(tmp_path_factory, parties: int, sample_blocks: int) -> dict:
    return paillier_parties(tmp_path_factory.mktemp("review"), parties, ROUNDS,
                            sample_blocks)


@pytest.fixture(scope="module")
def run(setting):
    """A genuine encrypted run (three parties holding features, the cocoa rule with its
    certificate)."""
    return _record_run(setting, 1)

#: The largest multiple of the tags' prime, in fixed-point units of 32 fractional bits,
#: that the cipher still encodes (bound 2**16): 255 * P / 2**32 ~ 65280.
SHIFT = np.ldexp(float(255 * TAG_PRIME), -32)


#: Either defence: the tag (its prime is the run's secret now) or the dual domain.
REFUSED = "tag does not verify|outside the dual domain"


def _shifted(cipher, vector: EncryptedVector, index: int, shift: float = SHIFT
             ) -> EncryptedVector:
    """``vector`` with ``Enc(shift)`` added to its ciphertext ``index`` (the server holds
    the public key: it can add any value it encrypts)."""
    out = vector.ciphertexts.copy()
    out[index:index + 1] = cipher.add(out[index:index + 1], cipher.encrypt(np.array([[shift]])))
    return EncryptedVector(vector.chunks, out)


def test_a_multiple_of_the_tag_prime_added_to_a_proposal_is_refused(run):
    """The tag is ``a . u + b mod P``: adding ``k P`` to one value ``u_j`` leaves it
    unchanged whatever ``a_j`` is, so the judge of the tag cannot see it. Added to the
    first sample's summed proposal it made ``image`` return ``X^T p + k P / 2^32 x_i``:
    the party's feature row of that sample times a known factor (exactly, from the
    genuine image of a replay), which the tags were built to prevent. Honest summed
    proposals keep the duals in their domain (hinge: width 1), so a sum that leaves it
    is refused."""
    record = _find(run, "image", t=2)
    genuine = record.payload
    forged = {**genuine, "proposal": _shifted(run.cipher, genuine["proposal"], 0)}
    with pytest.raises(HyflError, match=REFUSED):
        _send(run, record, forged)


def test_a_multiple_of_the_tag_prime_added_to_a_stored_state_is_refused(run):
    """The same shift on a stored state sent back as stale duals: the party's primal
    part ``X^T alpha`` then held a state of the server's choosing (after the party's
    clipping: a label-dependent bound). A state outside the dual domain is refused."""
    record = _with_stale(run)
    payload = record.payload
    payload["configure"]["stale"] = _shifted(run.cipher, payload["configure"]["stale"], 0)
    with pytest.raises(HyflError, match=REFUSED):
        _send(run, record, payload)


def test_the_genuine_messages_still_pass_the_domain_checks(run):
    """The two checks above accept what an honest server sends (replayed exactly)."""
    record = _find(run, "image", t=2)
    assert "primal_part" in decode(*_send(run, record)[0], run.cipher)
    record = _with_stale(run)
    assert "primal_part" in decode(*_send(run, record)[0], run.cipher)


@pytest.mark.parametrize("limit", [2.0, 1e6, 0.0, -1.0, np.inf, np.nan])
def test_the_rounds_longest_step_is_the_certificates_trust(run, limit):
    """``limit`` (the round's longest step) comes from the server in ``round``; the
    ``changes`` check of the step (``[0, limit]``) and the line search are bounded by
    it, so a server that set it to 1e6 could make a party take any step. An honest
    server sends the certificate's trust, in ``[TRUST_FLOOR, 1]``."""
    record = _find(run, "round", t=2)
    payload = record.payload
    assert payload["configure"].get("limit") is not None  # the run has its certificate
    payload["configure"]["limit"] = limit
    with pytest.raises(HyflError, match="configure.limit. to|field .limit. is"):
        _send(run, record, payload)



def _secret_prime(run, record) -> int:
    """The tags' prime of the party ``record`` went to (what the server does not know)."""
    from hyfl.deploy.party import open_party

    party = open_party(run.nodes[record.party], run.run_config, record.before)
    return party._client()._tag_key.prime


@pytest.mark.parametrize("kind", ["proposals", "step"])
def test_a_multiple_of_the_public_prime_added_to_a_sum_without_a_domain_is_refused(run, kind):
    """The inner products ``z`` (remembered, in the span sums ``direction`` returns in
    plaintext) and the judge's totals (the step and coherence) have no domain a party
    could check: with the public prime ``P``, ``z_i + k P`` and ``margin + k P`` were
    accepted. The prime is now a secret of the run's key: the shift no longer cancels."""
    record = _find(run, kind, t=2 if kind == "step" else 3)
    genuine = record.payload
    field = "z" if kind == "proposals" else "totals"
    index = 0 if kind == "proposals" else genuine[field].ciphertexts.size - 2
    forged = {**genuine, field: _shifted(run.cipher, genuine[field], index)}
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(run, record, forged)


def test_the_prime_is_the_runs_secret(run):
    """Each run's key has its own prime in [2**39, 2**40), not the public bound."""
    from hyfl.privacy.tags import TagKey, _is_prime

    primes = {TagKey(bytes(32), bytes([r]) * 32).prime for r in range(8)}
    assert len(primes) == 8
    assert all(2**39 <= p < TAG_PRIME and _is_prime(p) for p in primes)
    assert _secret_prime(run, _find(run, "image", t=2)) not in (TAG_PRIME, *primes)


def test_a_shift_by_the_secret_prime_is_caught_by_the_domain_and_the_range(run):
    """What is left for a server that guessed the run's prime (chance about 2**-34 per
    run, a refusal ends the run): on duals, the dual domain (hinge: width 1) refuses it;
    anywhere, a value beyond what the contributions can encode (m * max_int) is refused."""
    from hyfl.privacy.tags import TagKey

    record = _find(run, "image", t=2)
    genuine = record.payload
    prime = _secret_prime(run, record)
    shift = np.ldexp(float(255 * prime), -32)
    forged = {**genuine, "proposal": _shifted(run.cipher, genuine["proposal"], 0, shift)}
    with pytest.raises(HyflError, match="outside the dual domain"):
        _send(run, record, forged)
    # The range: a sum of two contributions of at most 100 each, shifted by multiples.
    key = TagKey(bytes(32), bytes(32))
    values = [60, -100]
    context = [("kind", 1), ("kind", 2)]
    tag = (key.tag("f", [30, -50], context[0]) + key.tag("f", [30, -50], context[1]))
    assert key.verify("f", values, tag, context, bound=100)
    shifted = [60 + key.prime, -100]  # the tag still matches: only the range sees it
    assert key.verify("f", shifted, tag, context)
    assert not key.verify("f", shifted, tag, context, bound=100)


def test_ciphertexts_swapped_within_a_sum_or_a_party_named_twice_are_refused(run):
    """Attacks that fail (evidence): two values of a genuine sum swapped (each tag
    coefficient is of its position), and the judge's active list naming a party twice
    (its totals counted twice): the step's list is not the one the round's instructions
    told the party, and instructions naming a party twice are refused when they come."""
    record = _find(run, "image", t=2)
    genuine = record.payload
    vec = genuine["proposal"]
    data = np.flatnonzero(vec.chunks < vec.chunks.max())  # (the tag chunks come last)
    if data.size >= 2:
        swapped = vec.ciphertexts.copy()
        swapped[[data[0], data[1]]] = swapped[[data[1], data[0]]]
        with pytest.raises(HyflError, match="tag does not verify"):
            _send(run, record, {**genuine, "proposal": EncryptedVector(vec.chunks, swapped)})
    record = _find(run, "step", t=2)
    genuine = record.payload
    twice = np.append(genuine["active"], record.party)
    with pytest.raises(HyflError, match=r"name the active clients \[.*\], not the "
                                        r"\[.*\] of the round's instructions"):
        _send(run, record, {**genuine, "active": twice})
    opened = _find(run, "round", party=record.party, t=2)
    configure = opened.payload["configure"]
    for forged in (np.sort(np.append(configure["active"], record.party)),
                   np.append(configure["active"], record.party)):
        with pytest.raises(HyflError, match="not an ascending list holding this client"):
            _send(run, opened, {**opened.payload,
                                "configure": {**configure, "active": forged}})


@pytest.mark.parametrize("field", ["grams", "towards_w"])
def test_non_finite_server_numbers_in_proposals_return_nothing(run, field):
    """Attacks that fail (evidence): the Gram matrices (and, with sample groups, the
    margin offsets) are only shape-checked; NaN or inf in them stop the party before
    anything is encrypted (the encoding refuses non-finite values)."""
    record = _find(run, "proposals", t=3)
    genuine = record.payload
    value = genuine.get(field)
    assert value is not None, f"the proposals carry no {field} (no sample groups?)"
    forged = value.astype(float).copy()
    forged.flat[0] = np.nan
    with pytest.raises(Exception):  # noqa: B017 (any refusal; none returns a reply)
        _send(run, record, {**genuine, field: forged})


def test_the_judges_evaluation_is_of_the_reports_the_server_names(setting, monkeypatch):
    """A documented exposure (docs/privacy.md, the ``step`` row), not refused: besides the
    step and the coherence the judge returns the round certificate's sums (loss,
    conjugate, correct predictions) over the samples the parties report, and which
    samples each party reports (``reports_local``) is the server's word. A server that
    names one sample in all the round's reports reads that sample's loss, conjugate
    and whether it is predicted correctly, every round, without a refusal."""
    from hyfl.algorithms import hyfdca_parties
    from hyfl.deploy.config import DeployConfig
    from hyfl.deploy.coordinator import Coordinator
    from in_process import RecordingTransport

    shares = []
    terms = hyfdca_parties._evaluation_terms
    monkeypatch.setattr(hyfdca_parties, "_evaluation_terms",
                        lambda loss, margins, *rest: shares.append(
                            (margins.shape[0], terms(loss, margins, *rest))) or shares[-1][1])
    chosen = {}

    def forge(k, kind, payload):
        configure = payload.get("configure") if kind == "round" else None
        if configure is not None and int(configure["t"]) == 2:
            reports = np.zeros_like(configure["reports_local"])
            if not chosen and reports.size:  # the first party told of round 2: one sample
                chosen["party"] = k
                reports[0] = True
            configure["reports_local"] = reports
        return payload

    replies = []

    class Recording(RecordingTransport):
        def _deliver(self, k, kind, payload):
            reply = super()._deliver(k, kind, payload)
            replies.append((k, kind, reply))
            return reply

    transport = Recording(setting["nodes"], setting["config"], setting["cipher"], forge=forge)
    try:
        Coordinator(DeployConfig.from_run_config(setting["config"]), transport,
                    setting["cipher"], log=lambda line: None).run()
    except HyflError:
        pass  # the forged round may derail the server's own bookkeeping later
    # Every active party answers the step; the judge's reply carries the round's sums.
    step = [reply for _, kind, reply in replies
            if kind == "step" and reply.get("evaluation") is not None]
    one = [share for count, share in shares if count == 1]
    assert chosen and one, "no party reported exactly one sample"
    assert step, "no judge returned the round certificate's sums"
    # A judge returned the sums of the one sample named: its loss, conjugate, correctness.
    assert any(np.allclose(np.asarray(r["evaluation"]), share, rtol=0, atol=1e-9)
               for r in step for share in one)


def test_a_setup_without_one_of_the_parties_is_refused(tmp_path_factory):
    """A forged partition: ``setup`` relaying every announcement but one (a 2 x 2 grid,
    where the other three still hold every sample and feature). Each relayed tag
    verified, so the parties accepted a partition without the fourth and trained a
    three-party model of the server's making. A party now requires every party of the
    job in its set-up."""
    from hyfl.deploy.config import DeployConfig
    from hyfl.deploy.coordinator import Coordinator
    from in_process import RecordingTransport

    setting4 = _setting(tmp_path_factory, 4, 2)
    run4 = RecordingTransport(setting4["nodes"], setting4["config"], setting4["cipher"])
    Coordinator(DeployConfig.from_run_config(setting4["config"]), run4, setting4["cipher"],
                log=lambda line: None).run()
    record = _find(run4, "setup", party=0)
    p = record.payload
    K = p["sample_counts"].size
    ns, nf = p["sample_counts"][:K - 1], p["feature_counts"][:K - 1]
    dropped = {**p, "samples": p["samples"][:ns.sum()], "sample_counts": ns,
               "features": p["features"][:nf.sum()], "feature_counts": nf,
               "nonces": p["nonces"][:K - 1], "tags": p["tags"][:K - 1],
               "lam_defaults": p["lam_defaults"][:K - 1]}
    with pytest.raises(HyflError, match="parties"):
        _send(run4, record, dropped)


def test_a_holders_part_claimed_never_sent_is_the_documented_exposure(run):
    """A documented exposure (docs/privacy.md, the ``proposals`` row), not refused: the
    server may say another holder's part of ``z`` is still the set-up's zeros (it
    cannot know whether that holder ever took part), so the party's own part alone is
    accepted as the sum. That is what a ``w`` zero on the other holders' features gives
    an honest server too; no value of the server's choosing enters."""
    record = _find(run, "proposals", t=3)
    k = record.party
    prior = next(r for r in run.records if r.party == k and r.kind in ("round", "weights")
                 and r.after is record.before)
    own = decode(*_send(run, prior)[0], run.cipher)["inner_products"]
    genuine = record.payload
    made = genuine["z_made"].reshape(-1, 2).copy()
    holders = np.arange(made.shape[0])  # (every party holds every sample here)
    made[holders != k] = 0
    reply = decode(*_send(run, record, {**genuine, "z": own, "z_made": made.reshape(-1)})[0],
                   run.cipher)
    assert "proposals" in reply
    # A part claimed made in another attempt than the one that made it is refused.
    made[holders != k] = (1, 1)
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(run, record, {**genuine, "z": own, "z_made": made.reshape(-1)})


def test_an_attempts_messages_replayed_in_the_next_attempt_are_refused(run):
    """Attacks that fail (evidence): the round restarted (one more attempt, which the
    guard allows), then the first attempt's ``proposals`` sent again -- the same inner
    products, to get a second set of proposals from one context. The party's own part
    must be of this attempt: refused."""
    opened = next(r for r in run.records if r.kind == "round" and r.party == 0
                  and int(r.payload["configure"]["t"]) == 2)
    asked = next(r for r in run.records[run.records.index(opened):]
                 if r.party == 0 and r.kind == "proposals")
    before = asked.before
    _, restarted = _send(run, opened, state=before)  # attempt 2 of round 2
    later = [r for r in run.records[run.records.index(opened):run.records.index(asked)]
             if r.party == 0 and r.kind == "weights"]
    for record in later:  # the weights the round announced, as the server sent them
        _, restarted = _send(run, record, state=restarted)
    with pytest.raises(HyflError, match="not a part it can"):
        _send(run, asked, state=restarted)
    # ... and claimed to be of this attempt, its tag (of attempt 1) does not verify.
    genuine = asked.payload
    made = genuine["z_made"].reshape(-1, 2).copy()
    made[(made[:, 0] == 2) & (made[:, 1] == 1)] = (2, 2)
    with pytest.raises(HyflError, match="tag does not verify"):
        _send(run, asked, {**genuine, "z_made": made.reshape(-1)}, state=restarted)
