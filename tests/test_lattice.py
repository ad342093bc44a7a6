"""The ``ckks`` lattice cipher: exact fixed-point sums, the noise budget, the public view.

* Decrypted sums are *exactly* the sums of the grid-rounded values (the noise is
  rounded away), so ``ckks`` gives the same iterates as packed Paillier.
* The noise model is an upper bound of the measured noise, and a configuration
  or a sum beyond the budget fails loudly instead of decrypting wrong numbers.
* The server's view holds the public context only: it adds, it cannot decrypt.
"""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.errors import HyflError
from hyfl.participation import RandomFraction
from hyfl.partition import grid
from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.lattice import (
    MAX_MODULUS_BITS_128,
    LatticeCiphertext,
    fresh_noise_std,
    noise_budget,
)
from hyfl.problem import make_problem
from hyfl.runtime.protocol import run_protocol
from synthetic_data import synthetic


@pytest.fixture(scope="module")
def ckks():
    return make_cipher("ckks")


def _grid(x, bits=32):
    return np.ldexp(np.rint(np.ldexp(x, bits)), -bits)


def test_sums_decrypt_exactly_to_the_fixed_point_sum(ckks):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1000.0, 1000.0, size=(3, 2, ckks.slots))  # 3 parties, 2 chunks
    public = ckks.public()
    total = public.zeros(2)
    for part in x:
        total = public.add(total, ckks.encrypt(part))
    got = ckks.decrypt(total)
    np.testing.assert_array_equal(got, _grid(x).sum(axis=0))  # exact, not approximately
    assert [c.addends for c in total] == [3, 3]
    np.testing.assert_array_equal(ckks.decrypt(public.zeros(1)), np.zeros((1, ckks.slots)))


def test_security_parameters_are_within_the_standards_table(ckks):
    info = ckks.describe()
    assert info["poly_modulus_degree"] == 8192 and info["slots"] == 4096
    assert info["modulus_bits"] <= MAX_MODULUS_BITS_128[8192] == 218
    assert info["security_bits"] == 128


def test_the_noise_model_bounds_the_measured_noise():
    # Encrypt off-grid values at a scale where the noise is visible, and compare the
    # raw (unrounded) decryption error with the model.
    cipher = make_cipher("ckks")
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.0, 1.0, size=(2, cipher.slots))
    raw = np.array([ct.vector.decrypt() for ct in cipher.encrypt(x)])
    measured = float(np.std(raw - _grid(x)))
    model = fresh_noise_std(8192, cipher.scale_bits)
    assert 0 < measured <= model
    # The budget at the defaults leaves room for HyFDCA's long-running sums.
    assert cipher.max_addends >= 100_000


def test_a_configuration_beyond_the_noise_budget_is_refused():
    with pytest.raises(HyflError, match="precision_bits.*finer than the noise"):
        make_cipher("ckks", precision_bits=48)
    with pytest.raises(HyflError, match="scale_bits"):
        make_cipher("ckks", scale_bits=61)
    assert noise_budget(precision_bits=32, scale_bits=60, bound=2.0**70) == 0


def test_a_sum_beyond_the_noise_budget_fails_loudly_and_within_it_is_exact():
    cipher = make_cipher("ckks", precision_bits=40)
    budget = cipher.max_addends
    assert 2 <= budget < 50
    x = np.random.default_rng(2).uniform(-1.0, 1.0, size=(budget + 1, cipher.slots))
    cts = [cipher.encrypt(row[None, :]) for row in x]
    total = cts[0]
    for ct in cts[1:budget]:
        total = cipher.add(total, ct)
    np.testing.assert_array_equal(cipher.decrypt(total)[0], _grid(x[:budget], 40).sum(axis=0))
    with pytest.raises(HyflError, match="beyond its noise budget"):
        cipher.add(total, cts[budget])


def test_the_public_view_holds_no_secret_key(ckks):
    public = ckks.public()
    assert ckks.has_private_key and not public.has_private_key
    assert not public._context.is_private() and not public._context.has_secret_key()
    ct = public.encrypt(np.ones((1, ckks.slots)))  # the public key encrypts ...
    with pytest.raises(HyflError, match="no private key"):
        public.decrypt(ct)  # ... but cannot decrypt
    with pytest.raises(HyflError, match="no private key"):
        public.context_bytes(secret=True)
    assert public.fingerprint() == ckks.fingerprint()
    np.testing.assert_array_equal(ckks.decrypt(ct), np.ones((1, ckks.slots)))


def test_wire_format_round_trips_and_refuses_tampering(ckks):
    public = ckks.public()
    cts = public.add(ckks.encrypt(np.full((2, ckks.slots), 0.5)), public.zeros(2))
    blobs, addends = public.serialize(np.concatenate([cts, public.zeros(1)]))
    assert addends == [1, 1, 0] and blobs[2] == b""
    back = ckks.deserialize(blobs, addends)
    np.testing.assert_array_equal(ckks.decrypt(back)[:2], np.full((2, ckks.slots), 0.5))
    with pytest.raises(HyflError, match="addend count"):
        ckks.deserialize(blobs[:1], [-5])
    with pytest.raises(HyflError, match="addend count"):
        ckks.deserialize(blobs[:1], [0])  # a non-empty ciphertext claiming no addend
    with pytest.raises(HyflError, match="not a CKKS ciphertext"):
        ckks.deserialize([blobs[0][:1000]], [1])
    forged = LatticeCiphertext(cts[0].vector, 2**62, cts[0].tag)
    with pytest.raises(HyflError, match="addend count"):
        ckks.decrypt(np.array([forged], dtype=object))
    other = make_cipher("ckks")
    with pytest.raises(HyflError, match="not made by this 'ckks' cipher"):
        other.add(cts, cts)


def test_ckks_and_packed_paillier_give_identical_iterates():
    # Both decrypt the exact sum of the same fixed-point values: the runs agree to the bit.
    # The protocol engine's server holds the public context only.
    problem = make_problem(synthetic(), "hinge", 0.05)
    n, m = problem.n_samples, problem.n_features
    servers = []
    runs = [
        run_protocol(HyFDCA(), problem, grid(n, m, 3, 3), RandomFraction(9, 0.5), 6,
                     make_cipher(name, key_bits=512) if name == "packed" else make_cipher(name),
                     seed=4, on_round=lambda server, clients: servers.append(server.cipher))
        for name in ("packed", "ckks")
    ]
    np.testing.assert_array_equal(runs[0].weights, runs[1].weights)
    np.testing.assert_array_equal(runs[0].duals, runs[1].duals)
    lattice = [c for c in servers if c.name == "ckks"]
    assert lattice and not any(c.has_private_key or c._context.has_secret_key() for c in lattice)
