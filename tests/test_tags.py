"""Keyed linear tags (hyfl.privacy.tags, issue 26 point 2, issue 42 point 3): sums of genuine
contributions verify through real encryption; anything a server can add, another run's sums
and chosen integer combinations of genuine sums do not. The protocol's use (the judge's
totals, the stored states) is attacked in test_hostile_server.py."""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.errors import HyflError
from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.tags import RUN_BYTES, TAG_PRIME, TagKey, run_identity, tag_key

SECRET = bytes(range(32))
RUN = run_identity([b"a" * 16, b"b" * 16])
KEY = TagKey(SECRET, RUN)
FAMILY = "totals"


def _contribution(rng, n=7):
    return [int(v) for v in rng.integers(-(2**47), 2**47, size=n)]


def test_a_sum_of_genuine_contributions_verifies_and_nothing_else_does():
    rng = np.random.default_rng(0)
    contexts = [("totals", 3, 1, k) for k in range(4)]
    parts = [_contribution(rng) for _ in contexts]
    tags = [KEY.tag(FAMILY, u, c) for u, c in zip(parts, contexts)]
    total = [sum(col) for col in zip(*parts)]
    assert KEY.verify(FAMILY, total, sum(tags), contexts)
    # A chosen value added to one slot, with any tag change the server could pick.
    for delta_tag in (0, 1, 12345):
        forged = list(total)
        forged[2] += 1
        assert not KEY.verify(FAMILY, forged, sum(tags) + delta_tag, contexts)
    # One contribution left out, repeated, or scaled; another round's in its place.
    assert not KEY.verify(FAMILY, [sum(col) for col in zip(*parts[1:])], sum(tags[1:]),
                          contexts)
    assert not KEY.verify(FAMILY, [t + p for t, p in zip(total, parts[0])],
                          sum(tags) + tags[0], contexts)
    assert not KEY.verify(FAMILY, [2 * t for t in total], 2 * sum(tags), contexts)
    later = ("totals", 4, 1, 0)
    swapped = [u + v - w for u, v, w in zip(total, parts[0], parts[0])]
    assert not KEY.verify(FAMILY, swapped, sum(tags) - tags[0] + KEY.tag(FAMILY, parts[0], later),
                          contexts)
    # Another key (the server's guess) does not make tags that verify.
    other = TagKey(bytes(32), RUN)
    assert not KEY.verify(FAMILY, total, sum(other.tag(FAMILY, u, c)
                                             for u, c in zip(parts, contexts)), contexts)


def test_tags_travel_in_a_real_cipher_and_verify_after_decryption():
    """The tag as one more fixed-point value: encrypted, summed by the server, decrypted."""
    cipher = make_cipher("paillier", key_bits=256)
    server = cipher.public()
    rng = np.random.default_rng(1)
    scale = 2.0**-32
    contexts = [("totals", 1, 1, k) for k in range(3)]
    acc = None
    for context in contexts:
        values = rng.uniform(-100, 100, size=5)
        ints = [int(v) for v in np.rint(np.ldexp(values, 32))]
        tag = KEY.tag(FAMILY, ints, context)
        chunk = np.array([*(np.array(ints, dtype=float) * scale), tag * scale])[:, None]
        ct = cipher.encrypt(chunk)
        acc = ct if acc is None else server.add(acc, ct)
    plain = cipher.decrypt(acc)[:, 0]
    integers = [int(v) for v in np.rint(np.ldexp(plain, 32))]
    assert KEY.verify(FAMILY, integers[:-1], integers[-1], contexts)
    assert 0 <= integers[-1] < 3 * TAG_PRIME
    forged = server.add(acc, server.encrypt(np.array([[0.0], [1.0], [0.0], [0.0], [0.0],
                                                      [0.0]])))
    plain = cipher.decrypt(forged)[:, 0]
    integers = [int(v) for v in np.rint(np.ldexp(plain, 32))]
    assert not KEY.verify(FAMILY, integers[:-1], integers[-1], contexts)


def test_contexts_are_unambiguous_and_typed():
    assert KEY.offset(("a", 12)) != KEY.offset(("a1", 2))
    assert KEY.offset(("totals", 1, 2)) != KEY.offset(("totals", 12))
    with pytest.raises(TypeError):
        KEY.offset(("totals", True))
    with pytest.raises(TypeError):
        KEY.offset(("totals", 1.5))


def test_a_context_counted_twice_never_verifies():
    """Doubling one contribution (c -> c^2 with Paillier) doubles its tag too, so it would
    verify against the context listed twice: verify refuses a repeated context."""
    key = TagKey(b"k" * 32, RUN)
    values = [5, -3, 7]
    tag = key.tag("f", values, ("x", 1))
    doubled = [2 * v for v in values]
    assert not key.verify("f", doubled, 2 * tag, [("x", 1), ("x", 1)])
    assert key.verify("f", values, tag, [("x", 1)])


def _sums(key, rng, contexts_per_sum, n=5):
    """Genuine sums: per sum, its contexts' contributions summed, with their tags."""
    out = []
    for contexts in contexts_per_sum:
        parts = [_contribution(rng, n) for _ in contexts]
        out.append(([sum(col) for col in zip(*parts)],
                    sum(key.tag(FAMILY, u, c) for u, c in zip(parts, contexts)), contexts))
    return out


def _combine(sums, coefficients):
    """``sum_j lambda_j S_j``: its values and its tag (as the server forms them)."""
    values = [sum(c * s[0][i] for c, s in zip(coefficients, sums)) for i in range(len(sums[0][0]))]
    return values, sum(c * s[1] for c, s in zip(coefficients, sums))


def _verifies_with_a_shift(key, values, tag, contexts) -> bool:
    """Does the combination verify for some multiple of the prime added to its tag (the
    server's free choice: it brings the tag into range)? The run's own prime, which the
    server does not know (a server that knew it, at its strongest)."""
    prime = key.prime
    bound = len(contexts) * prime
    return any(key.verify(FAMILY, values, tag + shift * prime, contexts)
               for shift in range(-(tag // prime) - 1, -((tag - bound) // prime) + 1))


def test_another_runs_sums_and_their_combinations_do_not_verify():
    """Issue 42, point 3: two runs of the same parties name the same places (contexts).
    Under one key for both, run 1's sum verified in run 2, and so did 2*S_B - S_A; with
    the key of the secret and the run, neither does."""
    rng = np.random.default_rng(3)
    contexts = [("totals", 2, 1, k) for k in range(3)]
    second = run_identity([b"c" * 16, b"b" * 16])
    one, two = TagKey(SECRET, RUN), TagKey(SECRET, second)
    (values_a, tag_a, _), = _sums(one, rng, [contexts])
    (values_b, tag_b, _), = _sums(two, rng, [contexts])
    assert two.verify(FAMILY, values_b, tag_b, contexts)
    assert not two.verify(FAMILY, values_a, tag_a, contexts)  # another run's sum
    combined = [2 * b - a for a, b in zip(values_a, values_b)]
    assert not _verifies_with_a_shift(two, combined, 2 * tag_b - tag_a, contexts)
    # Why the run must key the tags: under one key the same combination verifies.
    (values_c, tag_c, _), = _sums(one, rng, [contexts])
    combined = [2 * c - a for a, c in zip(values_a, values_c)]
    assert _verifies_with_a_shift(one, combined, 2 * tag_c - tag_a, contexts)


def test_only_the_protocols_combination_of_genuine_sums_verifies():
    """Within a run every context carries one plaintext, so a combination
    ``sum_j lambda_j S_j`` has per context ``c`` the coefficient
    ``sum_j lambda_j [c in C_j]``; it verifies as the sum of contexts ``C`` exactly when
    those coefficients are 1 on ``C`` and 0 elsewhere -- when it *is* the genuine sum of
    ``C`` (as 3 S_1 - S_12 - S_23 - S_13 of one round's overlapping sums is). Random
    integer coefficients, 2 S_B - S_A and every other combination: refused at any
    multiple of the prime added to the tag."""
    rng = np.random.default_rng(4)
    contexts = [("totals", t, 1, k) for t in range(1, 5) for k in range(3)]
    parts = {c: _contribution(rng) for c in contexts}  # one plaintext per context
    tags = {c: KEY.tag(FAMILY, u, c) for c, u in parts.items()}
    rounds = [contexts[3 * t:3 * t + 3] for t in range(4)]
    sets = rounds + [rounds[0][:2], rounds[0][1:], [rounds[0][0], rounds[0][2]]]
    sums = [([sum(col) for col in zip(*(parts[c] for c in cs))], sum(tags[c] for c in cs), cs)
            for cs in sets]
    member = np.array([[c in cs for c in contexts] for cs in sets], dtype=np.int64)
    chosen = [*rng.integers(-3, 4, size=(60, len(sets))),
              [-1, 2, 0, 0, 0, 0, 0],  # 2 S_B - S_A
              [3, 0, 0, 0, -1, -1, -1],  # round 1's sum, through its overlapping sums
              [1, 0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 1, 1, 1], [2, 0, 0, 0, -1, -1, 0]]
    verified = 0
    for coefficients in chosen:
        coefficients = np.asarray(coefficients, dtype=np.int64)
        values, tag = _combine(sums, coefficients.tolist())
        per_context = coefficients @ member
        for target in rounds:
            genuine = np.array_equal(per_context, [int(c in target) for c in contexts])
            assert _verifies_with_a_shift(KEY, values, tag, target) == genuine
            verified += genuine
            if genuine:  # then it is the genuine sum, value for value
                assert values == [sum(col) for col in zip(*(parts[c] for c in target))]
    assert verified == 1  # the one genuine combination in the list


def test_the_run_identity_is_of_every_nonce_in_order():
    nonces = [bytes([k]) * 16 for k in range(3)]
    run = run_identity(nonces)
    assert len(run) == RUN_BYTES and run == run_identity(list(nonces))
    assert run != run_identity(nonces[::-1])
    assert run != run_identity([nonces[0], nonces[1], b"\x02" * 15 + b"\x03"])
    assert run != run_identity(nonces[:2])
    assert run_identity([b"ab", b"c"]) != run_identity([b"a", b"bc"])  # length-prefixed
    with pytest.raises(HyflError, match="has 16 bytes, not 32"):
        TagKey(SECRET, b"x" * 16)


def test_a_key_holder_has_no_tags_without_a_run():
    cipher = make_cipher("paillier", key_bits=256)
    with pytest.raises(HyflError, match="has no run identity"):
        tag_key(cipher, None)
    assert tag_key(make_cipher("none"), None) is None  # no private key: no tags
    one, two = tag_key(cipher, RUN), tag_key(cipher, run_identity([b"z" * 16]))
    assert one.offset(("totals", 1)) != two.offset(("totals", 1))
    assert one.coefficients(FAMILY, 4) != two.coefficients(FAMILY, 4)


def test_the_in_process_engine_keys_each_run_with_fresh_nonces(monkeypatch):
    """run_protocol gives its parties a run identity as a deployment's compute it (fresh
    nonces, not the seed): two runs of one seed have two identities, every client of a
    run the same one, and the run's sums verify under it."""
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.participation import Full
    from hyfl.partition import grid
    from hyfl.problem import make_problem
    from hyfl.runtime import protocol
    from synthetic_data import synthetic

    seen = []
    build = protocol.build_parties

    def spy(*args, **kwargs):
        server, clients = build(*args, **kwargs)
        seen.append({client.run for client in clients})
        return server, clients

    monkeypatch.setattr(protocol, "build_parties", spy)
    problem = make_problem(synthetic(n=30, m=4), "hinge", 0.05)
    partition = grid(problem.n_samples, problem.n_features, 1, 2)
    cipher = make_cipher("paillier", key_bits=256)
    for _ in range(2):
        protocol.run_protocol(HyFDCA(local_steps=2), problem, partition,
                              Full(2), 1, cipher, seed=0)
    (one,), (two,) = seen
    assert len(one) == RUN_BYTES and one != two
