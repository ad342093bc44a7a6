"""Additively homomorphic ciphers (none, paillier, packed) and the fixed-point encoding."""

from __future__ import annotations

import math

import gmpy2
import numpy as np
import pytest
from phe import paillier as phe_paillier

from hyfl.errors import HyflError
from hyfl.privacy.ciphers import (
    CIPHERS,
    Cipher,
    OpCounts,
    PaillierCiphertext,
    calibrate,
    make_cipher,
)
from hyfl.privacy.encoding import FixedPoint

PRECISION = 32
HALF_ULP = 2.0**-PRECISION / 2  # largest rounding error of one encoding


@pytest.fixture(scope="module")
def keypair():
    return phe_paillier.generate_paillier_keypair(n_length=512)


@pytest.fixture(scope="module")
def ciphers(keypair) -> dict[str, Cipher]:
    return {
        "none": make_cipher("none"),
        "paillier": make_cipher("paillier", keypair=keypair),
        "packed": make_cipher("packed", keypair=keypair),
    }


@pytest.fixture(params=["none", "paillier", "packed"])
def cipher(request, ciphers) -> Cipher:
    return ciphers[request.param]


def tolerance(cipher: Cipher, addends: int, values) -> float:
    """Encoding rounding of every addend plus the float64 rounding of the decoded sum."""
    if cipher.name == "none":
        return addends * 1e-16 * (1 + float(np.max(np.abs(values))))
    return addends * HALF_ULP + 2.0**-52 * float(np.max(np.abs(values)))


def random_chunks(cipher: Cipher, n: int, seed: int = 0, scale: float = 100.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, cipher.slots)) * scale
    x[rng.random(x.shape) < 0.2] = 0.0  # zeros
    x.flat[0] = -abs(x.flat[0]) - 1.0  # at least one negative
    return x


# --------------------------------------------------------------------------- encoding


def test_fixed_point_round_trip_and_rounding():
    fp = FixedPoint(precision_bits=8, bound=4.0)
    values = np.array([0.0, 1.0, -1.0, 0.5 / 256, 1.5 / 256, -3.999, 4.0, -4.0, 1 / 3])
    ints = fp.encode(values)
    assert all(type(i) is int for i in ints)
    # round half to even: 0.5 -> 0, 1.5 -> 2
    assert ints[:5] == [0, 256, -256, 0, 2]
    assert ints[6:8] == [1024, -1024]
    assert fp.max_int == 1024
    decoded = fp.decode(ints)
    assert np.all(np.abs(decoded - values) <= 2.0**-9)


def test_fixed_point_large_precision_is_exact():
    fp = FixedPoint(precision_bits=80, bound=2.0**10)  # encoded ints beyond int64
    values = np.array([1000.0, 3 * 2.0**-70, -(2.0**-80), -1000.5])
    ints = fp.encode(values)
    assert ints == [1000 * 2**80, 3 * 2**10, -1, -2001 * 2**79]
    np.testing.assert_array_equal(fp.decode(ints), values)


def test_fixed_point_decode_of_large_sums_rounds_correctly():
    fp = FixedPoint(precision_bits=32, bound=1.0)
    big = 2**70 + 2**17 + 1  # needs rounding to 53 bits: nearest is 2**70 + 2**18
    assert fp.decode([big])[0] == math.ldexp(2**70 + 2**18, -32)
    assert fp.decode([gmpy2.mpz(big)])[0] == math.ldexp(2**70 + 2**18, -32)


def test_fixed_point_rejects_out_of_bound_and_non_finite():
    fp = FixedPoint(precision_bits=16, bound=100.0)
    with pytest.raises(HyflError, match=r"100\.5 at position 2 exceeds the fixed-point bound 100"):
        fp.encode([1.0, -2.0, 100.5])
    with pytest.raises(HyflError, match="precision_bits"):
        fp.encode([-101.0])
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(HyflError, match="NaN or infinite"):
            fp.encode([0.0, bad])
    with pytest.raises(HyflError, match="precision_bits"):
        FixedPoint(precision_bits=-1)
    with pytest.raises(HyflError, match="bound"):
        FixedPoint(bound=0.0)
    with pytest.raises(HyflError, match="bound"):
        FixedPoint(precision_bits=900, bound=1e300)


# --------------------------------------------------------------------------- registry


def test_registry_and_make_cipher_validation(keypair):
    assert set(CIPHERS) == {"none", "paillier", "packed", "ckks"}
    for factory, description in CIPHERS.values():
        assert callable(factory) and isinstance(description, str) and description
    with pytest.raises(HyflError, match="Choose one of: none, paillier, packed"):
        make_cipher("rsa")
    with pytest.raises(HyflError, match="guard_bits"):
        make_cipher("paillier", keypair=keypair, guard_bits=3)
    with pytest.raises(HyflError, match="key_bits"):
        make_cipher("paillier", key_bits=511)
    with pytest.raises(HyflError, match="key_bits"):
        make_cipher("packed", key_bits=1024, keypair=keypair)
    with pytest.raises(HyflError, match="key_bits"):
        make_cipher("packed", keypair=keypair, precision_bits=500)  # no slot fits 512 bits
    with pytest.raises(HyflError, match="precision_bits"):
        make_cipher("paillier", keypair=keypair, precision_bits=600)
    # none ignores key and precision settings
    none = make_cipher("none", key_bits=2048, precision_bits=40)
    assert (none.slots, none.key_bits, none.ciphertext_bytes) == (1, 0, 8)


def test_fresh_key_generation():
    cipher = make_cipher("paillier", key_bits=256, precision_bits=16, bound=1.0)
    assert cipher.key_bits == 256 and cipher.ciphertext_bytes == 64
    x = np.array([[0.25], [-0.75]])
    np.testing.assert_array_equal(cipher.decrypt(cipher.encrypt(x)), x)


def test_describe(ciphers):
    import json

    for cipher in ciphers.values():
        info = cipher.describe()
        json.dumps(info)
        assert info["name"] == cipher.name and info["slots"] == cipher.slots
        assert info["key_bits"] == cipher.key_bits
        assert {"precision", "bounds"} <= set(info)
    packed = ciphers["packed"].describe()
    assert packed["precision"]["precision_bits"] == PRECISION
    assert packed["bounds"] == {"value": 2.0**16, "addends": 2**24}
    assert ciphers["packed"].slots == (512 - 3) // packed["slot_bits"] == 6


# --------------------------------------------------------------------------- correctness


def test_round_trip(cipher):
    x = random_chunks(cipher, 40)
    x[1] = 2.0**16  # the bound itself
    x[2] = -(2.0**16)
    ct = cipher.encrypt(x)
    assert isinstance(ct, np.ndarray) and ct.dtype == object and ct.shape == (40,)
    out = cipher.decrypt(ct)
    assert out.shape == x.shape and out.dtype == np.float64
    assert np.max(np.abs(out - x)) <= tolerance(cipher, 1, x)
    if cipher.name == "none":
        np.testing.assert_array_equal(out, x)  # exact floats
    # empty input
    assert cipher.encrypt(np.zeros((0, cipher.slots))).shape == (0,)
    assert cipher.decrypt(np.empty(0, dtype=object)).shape == (0, cipher.slots)


def test_homomorphic_addition(cipher):
    a = random_chunks(cipher, 30, seed=1)
    b = random_chunks(cipher, 30, seed=2)
    s = cipher.add(cipher.encrypt(a), cipher.encrypt(b))
    assert s.shape == (30,) and s.dtype == object
    assert np.max(np.abs(cipher.decrypt(s) - (a + b))) <= tolerance(cipher, 2, a + b)


def test_trivial_zeros_are_free_and_neutral(cipher):
    # The server's initial state: known zeros, made with the public key at no cost.
    server = cipher.public()
    zeros = server.zeros(5)
    before = cipher.counts.snapshot()
    assert server.counts.encryptions == 0
    np.testing.assert_array_equal(cipher.decrypt(zeros), np.zeros((5, cipher.slots)))
    a = random_chunks(cipher, 5, seed=4)
    summed = server.add(zeros, cipher.encrypt(a))
    assert np.max(np.abs(cipher.decrypt(summed) - a)) <= tolerance(cipher, 1, a)
    assert (cipher.counts - before).encryptions == 5 and server.counts.additions == 5


def test_sum_of_many_ciphertexts_mixed_signs(cipher):
    rng = np.random.default_rng(3)
    terms = rng.normal(size=(50, 4, cipher.slots)) * rng.choice([0.01, 1.0, 1000.0], (50, 1, 1))
    server = cipher.public()
    total = cipher.encrypt(terms[0])
    for t in terms[1:]:
        total = server.add(total, cipher.encrypt(t))
    expected = terms.sum(axis=0)
    assert np.max(np.abs(cipher.decrypt(total) - expected)) <= tolerance(cipher, 50, expected)
    if cipher.name != "none":
        assert all(c.addends == 50 for c in total)


def test_packed_equals_paillier(ciphers):
    paillier, packed = ciphers["paillier"], ciphers["packed"]
    values = random_chunks(packed, 5, seed=4).ravel()
    other = random_chunks(packed, 5, seed=5).ravel()
    via_paillier = paillier.decrypt(
        paillier.add(paillier.encrypt(values[:, None]), paillier.encrypt(other[:, None]))
    ).ravel()
    packed_chunks = values.reshape(-1, packed.slots)
    other_chunks = other.reshape(-1, packed.slots)
    via_packed = packed.decrypt(
        packed.add(packed.encrypt(packed_chunks), packed.encrypt(other_chunks))
    ).ravel()
    # same encoding, exact integer sums: identical results
    np.testing.assert_array_equal(via_packed, via_paillier)
    assert np.max(np.abs(via_packed - (values + other))) <= 2 * HALF_ULP + 1e-12


def test_packed_full_headroom_at_the_bound(keypair):
    """2**24 addends of +-bound (by doubling) still decode exactly; one more raises."""
    packed = make_cipher("packed", keypair=keypair)
    x = np.zeros((2, packed.slots))
    x[0] = 2.0**16
    x[1] = -(2.0**16)
    x[1, 0] = 2.0**-PRECISION
    ct = packed.encrypt(x)
    for _ in range(24):
        ct = packed.add(ct, ct)
    assert ct[0].addends == 2**24
    np.testing.assert_array_equal(packed.decrypt(ct), x * 2.0**24)
    with pytest.raises(HyflError, match=r"more than the 2\*\*guard_bits = 16777216"):
        packed.add(ct, packed.encrypt(x))


# --------------------------------------------------------------------------- overflow


@pytest.mark.parametrize("name", ["paillier", "packed"])
def test_encoding_beyond_bound_raises(name, keypair):
    cipher = make_cipher(name, keypair=keypair, bound=10.0)
    x = np.zeros((2, cipher.slots))
    x[1, -1] = -10.5
    with pytest.raises(HyflError, match=r"-10\.5 .* exceeds the fixed-point bound 10\b") as err:
        cipher.encrypt(x)
    assert "bound" in str(err.value) and "precision_bits" in str(err.value)
    assert cipher.counts.encryptions == 0


def test_non_finite_values_raise(cipher):
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros((3, cipher.slots))
        x[2, 0] = bad
        with pytest.raises(HyflError, match="NaN or infinite"):
            cipher.encrypt(x)


def test_packed_addend_overflow(keypair):
    packed = make_cipher("packed", keypair=keypair, guard_bits=2)  # room for 4 addends
    assert packed.max_addends == 4
    x = random_chunks(packed, 3, seed=6)
    one = packed.encrypt(x)
    total = one
    for _ in range(3):
        total = packed.public().add(total, one)
    np.testing.assert_allclose(packed.decrypt(total), 4 * x, rtol=0, atol=4 * HALF_ULP + 1e-9)
    with pytest.raises(HyflError, match="guard_bits"):
        packed.add(total, one)
    # small guard bits mean narrower slots and so more of them
    assert packed.slots >= make_cipher("packed", keypair=keypair).slots


def test_paillier_sum_overflow_raises_at_decryption(keypair):
    cipher = make_cipher("paillier", keypair=keypair, precision_bits=400, bound=1.0)
    ct = cipher.encrypt(np.array([[0.75], [-0.5]]))
    for k in range(1, 200):
        ct = cipher.add(ct, ct)
        try:
            out = cipher.decrypt(ct)
        except HyflError as err:
            assert "overflow" in str(err) and "safe range" in str(err)
            break
        np.testing.assert_array_equal(out.ravel(), [0.75 * 2.0**k, -0.5 * 2.0**k])
    else:
        pytest.fail("the doubling sum never overflowed")
    assert k > 90  # 512-bit key: about 510 - 400 bits of headroom


def test_wrong_shapes_and_foreign_ciphertexts(ciphers, keypair):
    packed, paillier = ciphers["packed"], ciphers["paillier"]
    with pytest.raises(HyflError, match=r"shape \(3, 2\).*\(n, 6\)"):
        packed.encrypt(np.zeros((3, 2)))
    with pytest.raises(HyflError, match=r"\(n, 1\)"):
        paillier.encrypt(np.zeros(3))
    a = paillier.encrypt(np.zeros((2, 1)))
    with pytest.raises(HyflError, match="2 and 1"):
        paillier.add(a, a[:1])
    with pytest.raises(HyflError, match="same cipher"):
        packed.add(packed.encrypt(np.zeros((2, packed.slots))), a)
    other = make_cipher("paillier", keypair=keypair)  # same key, different cipher
    with pytest.raises(HyflError, match="same cipher"):
        other.decrypt(a)
    with pytest.raises(HyflError, match="1-D"):
        paillier.decrypt(a.reshape(1, 2))


# --------------------------------------------------------------------------- roles and counts


def test_public_view(cipher):
    server = cipher.public()
    assert not server.has_private_key and cipher.has_private_key
    assert (server.name, server.slots, server.key_bits) == (
        cipher.name,
        cipher.slots,
        cipher.key_bits,
    )
    assert server.ciphertext_bytes == cipher.ciphertext_bytes
    assert server.counts is not cipher.counts
    x = random_chunks(cipher, 4, seed=7)
    ct = cipher.encrypt(x)
    with pytest.raises(HyflError, match="server holds no private key"):
        server.decrypt(ct)
    before_private = cipher.counts.snapshot()
    before_public = server.counts.snapshot()
    s = server.add(ct, ct)
    assert server.counts - before_public == OpCounts(additions=4)
    assert cipher.counts - before_private == OpCounts()
    # the server can encrypt too (without the key's factors), and the client decrypts it
    y = random_chunks(cipher, 2, seed=8)
    from_server = server.encrypt(y)
    assert server.counts.encryptions == before_public.encryptions + 2
    assert np.max(np.abs(cipher.decrypt(from_server) - y)) <= tolerance(cipher, 1, y)
    assert np.max(np.abs(cipher.decrypt(s) - 2 * x)) <= tolerance(cipher, 2, 2 * x)
    with pytest.raises(HyflError, match="no private key"):
        server.public().decrypt(s)


def test_counts(cipher):
    c = cipher
    start = c.counts.snapshot()
    ct = c.encrypt(random_chunks(c, 7, seed=9))
    assert c.counts - start == OpCounts(encryptions=7)
    c.add(ct, ct)
    c.add(ct[:3], ct[:3])
    c.decrypt(ct[:5])
    assert c.counts - start == OpCounts(encryptions=7, decryptions=5, additions=10)
    snap = c.counts.snapshot()
    c.encrypt(random_chunks(c, 1))
    assert snap.encryptions == start.encryptions + 7  # snapshot is a copy
    assert OpCounts(5, 4, 3) - OpCounts(1, 1, 1) == OpCounts(4, 3, 2)
    c.counts.restore(snap)  # the operations since the snapshot are not counted
    assert c.counts == snap and c.counts is not snap


# --------------------------------------------------------------------------- real Paillier


@pytest.mark.parametrize("name", ["paillier", "packed"])
def test_ciphertexts_are_randomized_and_not_the_plaintext(name, ciphers, keypair):
    cipher = ciphers[name]
    public_key, private_key = keypair
    n = public_key.n
    x = np.ones((3, cipher.slots)) * 1.5
    first, second = cipher.encrypt(x), cipher.encrypt(x)
    plaintexts = [private_key.raw_decrypt(int(c.c)) for c in first]
    assert len(set(plaintexts)) == 1  # same value, same plaintext...
    raw = [int(c.c) for c in first] + [int(c.c) for c in second]
    assert len(set(raw)) == 6  # ...but all six ciphertexts differ
    for c in raw:
        assert c not in (plaintexts[0], 1 + n * plaintexts[0]) and n < c < n * n
    for fresh in (first, second):
        np.testing.assert_array_equal(cipher.decrypt(fresh), x)
    assert cipher.public().encrypt(x)[0].c not in (first[0].c, second[0].c)


def test_interoperates_with_python_paillier(ciphers, keypair):
    """Our integers are python-paillier's raw_encrypt / raw_decrypt integers."""
    cipher = ciphers["paillier"]
    public_key, private_key = keypair
    values = np.array([[2.5], [-3.25], [0.0]])
    ours = cipher.encrypt(values)
    encoded = [round(v * 2**PRECISION) % public_key.n for v in values.ravel()]
    assert [private_key.raw_decrypt(int(c.c)) for c in ours] == encoded
    theirs = [public_key.raw_encrypt(m) for m in encoded]
    wrapped = np.empty(3, dtype=object)
    wrapped[:] = [PaillierCiphertext(gmpy2.mpz(c), 1, ours[0].tag) for c in theirs]
    np.testing.assert_array_equal(cipher.decrypt(wrapped), values)
    # addition is the ciphertext product mod n^2, as python-paillier's
    total = cipher.add(ours, wrapped)
    product = [int(a.c) * int(b.c) % public_key.nsquare for a, b in zip(ours, wrapped)]
    assert [int(c.c) for c in total] == product


def test_crt_obfuscators_are_nth_residues(ciphers, keypair):
    key = ciphers["paillier"]._key
    _, private_key = keypair
    p, q = private_key.p, private_key.q
    phi = (p - 1) * (q - 1)
    for key_view in (key, key.public()):
        for s in key_view.obfuscators(4):
            assert pow(int(s), phi, key.n * key.n) == 1  # order divides phi(n): an n-th residue
            assert math.gcd(int(s), int(key.n)) == 1


def test_default_packed_parameters_at_2048_bits():
    cipher = make_cipher("packed")  # one 2048-bit key pair, default parameters
    assert cipher.key_bits == 2048
    assert cipher.slots >= 26
    assert cipher.fixed_point.resolution <= 2.0**-32
    assert cipher.fixed_point.bound >= 2.0**16 and cipher.max_addends >= 2**24
    assert cipher.ciphertext_bytes == 512 + 4
    x = random_chunks(cipher, 2, seed=10)
    assert np.max(np.abs(cipher.decrypt(cipher.encrypt(x)) - x)) <= HALF_ULP + 1e-12


# --------------------------------------------------------------------------- calibration


def test_calibrate(ciphers):
    for cipher in ciphers.values():
        before = cipher.counts.snapshot()
        result = calibrate(cipher, n_values=5)
        assert cipher.counts == before  # calibration leaves the counts alone
        assert result["cipher"] == cipher.name and result["slots"] == cipher.slots
        assert result["key_bits"] == cipher.key_bits
        for op in ("encrypt", "decrypt", "add"):
            assert result[op] > 0
            assert result[f"{op}_per_value"] == pytest.approx(result[op] / cipher.slots)
    server = calibrate(ciphers["packed"].public(), n_values=3)
    assert server["decrypt"] is None and server["decrypt_per_value"] is None
    assert server["encrypt"] > 0 and server["add"] > 0


@pytest.mark.parametrize("name", ["paillier", "packed"])
def test_public_key_alone_gives_the_public_view(keypair, name):
    # A deployment's server holds only the public key: (public, None) must equal .public().
    public_key, private_key = keypair
    full = make_cipher(name, keypair=keypair)
    server = make_cipher(name, keypair=(public_key, None))
    assert (server.slots, server.ciphertext_bytes) == (full.slots, full.ciphertext_bytes)
    assert server._key.n == full._key.n and not server._key.has_private_key
    values = np.arange(2 * full.slots, dtype=float).reshape(2, full.slots) / 7
    summed = server.add(server.encrypt(values), server.encrypt(values))  # public operations
    with pytest.raises(HyflError):
        server.decrypt(summed)
    wrong = make_cipher(name, key_bits=1024)._key.private_key
    with pytest.raises(HyflError, match="does not match"):
        make_cipher(name, keypair=(public_key, wrong))


@pytest.mark.parametrize("name", ["paillier", "packed"])
@pytest.mark.parametrize("tampered", [-5, 2**40, 2**70, 0.5, True])
def test_a_tampered_addend_count_is_refused(ciphers, name, tampered):
    """The addend count travels with a ciphertext; a forged one must not shift the value.

    (Before the check, -5 decrypted 0.5 as 393216.5 and 2**40 as -7.2e16.)
    """
    cipher = ciphers[name]
    width = cipher.slots if name == "packed" else 1
    ct = cipher.encrypt(np.full((1, width), 0.5))
    forged = PaillierCiphertext(ct[0].c, tampered, ct[0].tag)
    if name == "paillier" and tampered in (2**40, 2**70):  # per-value Paillier ignores it
        np.testing.assert_allclose(cipher.decrypt(np.array([forged], dtype=object)), 0.5)
        return
    with pytest.raises(HyflError, match="addend count"):
        cipher.decrypt(np.array([forged], dtype=object))
    with pytest.raises(HyflError, match="addend count"):
        cipher.add(np.array([forged], dtype=object), ct)


@pytest.mark.parametrize("name", ["paillier", "packed"])
def test_a_ciphertext_outside_the_key_range_is_refused(ciphers, name):
    cipher = ciphers[name]
    ct = cipher.encrypt(np.zeros((1, cipher.slots if name == "packed" else 1)))
    for c in (gmpy2.mpz(0), cipher._key.nsq, cipher._key.nsq + 5):
        forged = PaillierCiphertext(c, 1, ct[0].tag)
        with pytest.raises(HyflError, match=r"\[1, n\^2\)"):
            cipher.decrypt(np.array([forged], dtype=object))


# --------------------------------------------------------------------------- speed: threads, pool


def test_packed_options_workers_and_pool(keypair):
    from hyfl._threads import thread_count

    cipher = make_cipher("packed", keypair=keypair)
    assert cipher.workers == thread_count() and cipher.pool_size > 0
    serial = make_cipher("packed", keypair=keypair, workers=1, pool_size=0)
    assert (serial.workers, serial.pool_size) == (1, 0) and serial._key._pool is None
    assert serial.public().workers == 1 and serial.public().pool_size == 0
    for bad in ({"workers": 0}, {"pool_size": -1}, {"workers": 1.5}):
        with pytest.raises(HyflError):
            make_cipher("packed", keypair=keypair, **bad)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_multi_worker_encryption_decrypts_correctly(keypair, workers):
    # More chunks than threads and not a multiple of them: every slice of every job
    # must come back in order.
    cipher = make_cipher("packed", keypair=keypair, workers=workers, pool_size=0)
    serial = make_cipher("packed", keypair=keypair, workers=1, pool_size=0)
    x = random_chunks(cipher, 37, seed=workers)
    cts = cipher.encrypt(x)
    np.testing.assert_allclose(cipher.decrypt(cts), x, atol=tolerance(cipher, 1, x), rtol=0)
    # Same key: threads change nothing in the raw arithmetic.
    raw = [c.c for c in cts] + [c.c for c in serial.encrypt(x)]
    assert cipher._key.decrypt_ints(raw) == serial._key.decrypt_ints(raw)
    assert cipher.counts.encryptions == 37 and cipher.counts.decryptions == 37


def test_powmods_splits_and_reassembles_in_order():
    from hyfl.privacy._workers import powmods

    m = gmpy2.mpz(2**127 - 1)
    jobs = [(list(range(2, 40)), 65537, m), ([], 3, m), (list(range(5, 16)), 7, m)]
    expected = [[pow(b, e, int(m)) for b in bases] for bases, e, _ in jobs]
    for workers in (1, 2, 5):
        assert [[int(v) for v in out] for out in powmods(jobs, workers)] == expected


def _wait_for(pool, n, seconds=30.0):
    import time

    deadline = time.monotonic() + seconds
    while len(pool) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(pool)


def test_pooled_obfuscators_are_nth_residues_used_once_and_bounded(keypair):
    cipher = make_cipher("packed", keypair=keypair, pool_size=12)
    key, pool = cipher._key, cipher._key._pool
    _, private_key = keypair
    phi = (private_key.p - 1) * (private_key.q - 1)
    nsq = int(key.nsq)
    assert len(pool) == 0  # the filler starts with the first use, not before
    x = random_chunks(cipher, 3)
    np.testing.assert_allclose(cipher.decrypt(cipher.encrypt(x)), x, atol=tolerance(cipher, 1, x))
    assert _wait_for(pool, 3) == 3
    assert _wait_for(pool, 4, seconds=0.5) == 3  # no more than the largest request so far
    x = random_chunks(cipher, 20)
    np.testing.assert_allclose(cipher.decrypt(cipher.encrypt(x)), x, atol=tolerance(cipher, 1, x))
    assert _wait_for(pool, 12) == 12
    assert _wait_for(pool, 13, seconds=0.5) == 12  # bounded: the filler stops at pool_size
    pooled = list(pool._items)
    for s in pooled:
        assert pow(int(s), phi, nsq) == 1 and math.gcd(int(s), int(key.n)) == 1
    taken = key.obfuscators(5)
    assert [int(s) for s in taken] == [int(s) for s in pooled[:5]]
    assert not {int(s) for s in taken} & {int(s) for s in pool._items}  # gone from the pool
    seen = {int(s) for s in taken}
    for _ in range(4):  # the pool refills with fresh values; nothing comes out twice
        _wait_for(pool, 12)
        more = [int(s) for s in key.obfuscators(9)]
        assert len(more) == 9 and not seen & set(more)
        seen |= set(more)
    # Ciphertexts of the same plaintext never share their randomness.
    cts = cipher.encrypt(np.zeros((30, cipher.slots)))
    assert len({int(c.c) for c in cts}) == 30
    pool.close()


def test_the_pool_never_leaves_memory(keypair):
    import copy
    import pickle

    cipher = make_cipher("packed", keypair=keypair, pool_size=8)
    cipher.encrypt(np.zeros((8, cipher.slots)))
    pool = cipher._key._pool
    assert _wait_for(pool, 8) == 8
    secret = [int(s) for s in pool._items]
    assert copy.copy(cipher)._key is cipher._key  # a shallow copy shares the one pool
    for clone in (pickle.loads(pickle.dumps(cipher)), copy.deepcopy(cipher)):
        assert clone._key._pool is not pool
        assert clone._key._pool is None or len(clone._key._pool) == 0
        x = random_chunks(clone, 2)
        np.testing.assert_allclose(cipher.decrypt(clone.encrypt(x)), x,
                                   atol=tolerance(cipher, 1, x))
    blob = pickle.dumps(cipher)
    for s in secret:  # no pooled value in any encoding a pickle could carry
        assert s.to_bytes((s.bit_length() + 7) // 8, "little") not in blob
        assert s.to_bytes((s.bit_length() + 7) // 8, "big") not in blob
        assert str(s).encode() not in blob
    assert "pool" not in repr(cipher.describe())
    pool.close()


def test_a_forked_child_discards_the_parents_obfuscators(keypair):
    import os

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    cipher = make_cipher("packed", keypair=keypair, pool_size=6)
    cipher.encrypt(np.zeros((6, cipher.slots)))
    pool = cipher._key._pool
    assert _wait_for(pool, 6) == 6
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its copy of the pool must be empty before any use
        try:
            os.write(write, str(len(pool._items)).encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 64)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"0"
    assert len(pool) == 6  # the parent keeps its own
    pool.close()


def test_calibrate_ignores_the_pool(keypair):
    cipher = make_cipher("packed", keypair=keypair, pool_size=64)
    cipher.encrypt(np.zeros((64, cipher.slots)))
    pool = cipher._key._pool
    _wait_for(pool, 64)
    before = len(pool)
    calibrate(cipher, n_values=4)
    assert cipher._key._pool is pool and len(pool) >= before  # nothing was taken from it
    pool.close()


@pytest.mark.parametrize("name, key_bits", [("none", None), ("paillier", 512), ("packed", 512),
                                            ("packed", 1024), ("ckks", None)])
def test_slot_counts_without_a_key_are_the_ciphers_own(name, key_bits):
    """hyfl.costs.layout_slots reads the slot count from a formula, not from a keyed cipher."""
    from hyfl.costs import layout_slots
    from hyfl.privacy.ciphers import cipher_slots

    cipher = make_cipher(name, key_bits=key_bits) if key_bits else make_cipher(name)
    assert cipher_slots(name, key_bits=key_bits) == cipher.slots
    assert layout_slots(name, key_bits=key_bits) == cipher.slots


@pytest.mark.parametrize("name", ["paillier", "packed", "ckks"])
def test_a_copied_state_shares_its_ciphertexts_which_operations_never_change(name, ciphers):
    # The coordinator snapshots the server (copy.deepcopy) at every round's start: the
    # ciphertexts are shared, which is sound because no operation changes one in place.
    import copy

    cipher = ciphers[name] if name in ciphers else make_cipher(name)
    chunks = np.zeros((2, cipher.slots))
    chunks[:, 0] = [1.5, 2.0]
    a = cipher.encrypt(chunks)
    state = {"stored": a, "nested": [a[:1]]}
    snapshot = copy.deepcopy(state)
    assert snapshot["stored"] is not a and all(x is y for x, y in zip(snapshot["stored"], a))
    before = [(ct.addends, ct.tag) for ct in a]
    total = cipher.add(a, a)
    assert all(t is not x for t, x in zip(total, a))  # new ciphertexts
    assert [(ct.addends, ct.tag) for ct in a] == before  # the operands unchanged
    np.testing.assert_allclose(cipher.decrypt(snapshot["stored"])[:, 0], [1.5, 2.0], atol=1e-6)
