"""Keyed linear tags (hyfl.privacy.tags, issue 26 point 2): sums of genuine contributions
verify through real encryption; anything a server can add does not. The protocol's use (the
judge's totals) is attacked in test_hostile_server.py."""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.tags import TAG_PRIME, TagKey

KEY = TagKey(bytes(range(32)))
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
    other = TagKey(bytes(32))
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
    key = TagKey(b"k" * 32)
    values = [5, -3, 7]
    tag = key.tag("f", values, ("x", 1))
    doubled = [2 * v for v in values]
    assert not key.verify("f", doubled, 2 * tag, [("x", 1), ("x", 1)])
    assert key.verify("f", values, tag, [("x", 1)])
