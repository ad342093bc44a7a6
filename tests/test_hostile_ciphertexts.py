"""Hostile CKKS ciphertexts are refused before a key holder decrypts them (issue 26, point 3).

The attack: a dishonest server holds the public context. A ciphertext of zeros
that it encrypts at scale 2**20 decrypts, through a party's rounding to the
2**-32 grid, to raw noise in all 4096 slots (about 21 bits each): the material
of Li and Micciancio's key recovery. Each test below builds such a forgery from
the public context only (or from a genuine ciphertext it saw), feeds it to the
party the way a server would -- through ``codec.decode`` with the party's
cipher, and straight to the cipher's ``decrypt`` as an in-process server's
vector -- and checks it is refused with a ``HyflError`` while nothing is
decrypted. Genuine ciphertexts (fresh, long sums, wire round trips, a party
whose cipher was read from the key file) still decrypt exactly.

The attacker's tools: TenSEAL on the public context, SEAL's own API
(``tenseal.sealapi``, for a modulus switch or an edited scale on the same
parameters) and the TenSEAL wire format written by hand (``_frame``).
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import tenseal as ts
import tenseal.sealapi as sealapi

from hyfl.deploy import codec
from hyfl.errors import HyflError
from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.lattice import (
    COEFF_MOD_BITS,
    POLY_MODULUS_DEGREE,
    LatticeCiphertext,
    _varint,
    make_ckks,
)
from hyfl.privacy.layout import EncryptedVector

SLOTS = POLY_MODULUS_DEGREE // 2


# --------------------------------------------------------------------------- the attacker's kit


@pytest.fixture(scope="module")
def party():
    return make_cipher("ckks")


@pytest.fixture(scope="module")
def server(party):
    """All a server holds: the public context, read from the public key file's bytes."""
    public = make_ckks(context=party.context_bytes(secret=False))
    assert not public.has_private_key
    return public._context


@pytest.fixture(scope="module")
def genuine(party):
    """One genuine fresh ciphertext (serialized) of the party's key, as a server sees it."""
    return party.encrypt(np.full((1, party.slots), 0.25))[0].vector.serialize()


def _frame(seal: list[bytes], sizes: list[int], scale: float) -> bytes:
    """TenSEAL's ``CKKSVectorProto`` by hand: sizes (packed), ciphertexts, scale."""
    packed = b"".join(_varint(n) for n in sizes)
    out = b"\x0a" + _varint(len(packed)) + packed
    for blob in seal:
        out += b"\x12" + _varint(len(blob)) + blob
    return out + b"\x19" + struct.pack("<d", scale)


def _seal(blob: bytes) -> bytes:
    """The SEAL ciphertext inside TenSEAL's serialization of one vector of SLOTS values."""
    head = b"\x0a\x02" + _varint(SLOTS) + b"\x12"
    assert blob.startswith(head)
    n, shift, i = 0, 0, len(head)
    while True:
        byte = blob[i]
        n, shift, i = n | (byte & 0x7F) << shift, shift + 7, i + 1
        if byte < 0x80:
            return blob[i:i + n]


def _sealapi_edit(blob: bytes, edit, tmp_path) -> bytes:
    """Load the SEAL ciphertext of ``blob`` with SEAL's API, ``edit`` it, frame it as genuine."""
    parms = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(POLY_MODULUS_DEGREE)
    parms.set_coeff_modulus(sealapi.CoeffModulus.Create(POLY_MODULUS_DEGREE,
                                                        list(COEFF_MOD_BITS)))
    context = sealapi.SEALContext(parms, True, sealapi.SEC_LEVEL_TYPE.TC128)
    path_in, path_out = str(tmp_path / "in.seal"), str(tmp_path / "out.seal")
    (tmp_path / "in.seal").write_bytes(_seal(blob))
    ct = sealapi.Ciphertext()
    ct.load(context, path_in)
    edit(ct, sealapi.Evaluator(context))
    ct.save(path_out)
    return _frame([(tmp_path / "out.seal").read_bytes()], [SLOTS], 2.0**60)


def _attacker(server):
    """The server's own copy of the public context, TenSEAL's automatic steps off."""
    context = server.copy()
    context.auto_relin = context.auto_rescale = context.auto_mod_switch = False
    return context


def _message(blobs: list[bytes], addends: list[int]) -> tuple[dict, str]:
    """A server's message holding one encrypted vector of these serialized ciphertexts."""
    arrays = {"0": np.arange(len(blobs), dtype=np.int64),
              "1": np.frombuffer(b"".join(blobs) or b"\0", dtype=np.uint8),
              "2": np.array([len(b) for b in blobs], dtype=np.int64),
              "3": np.array(addends, dtype=np.int64)}
    spec = {"d": {"duals": {"e": "0", "kind": "lattice", "ct": "1", "sizes": "2",
                            "addends": "3"}}}
    return arrays, json.dumps(spec)


@pytest.fixture
def no_decryption(monkeypatch, party):
    """Fails the test if anything decrypts; checks no decryption was counted."""
    def decrypted(*args, **kwargs):
        raise AssertionError("a hostile ciphertext was decrypted")

    monkeypatch.setattr(ts.CKKSVector, "decrypt", decrypted)
    before = party.counts.decryptions
    yield
    assert party.counts.decryptions == before


def _refused_on_the_wire(party, blob: bytes, match: str) -> None:
    arrays, spec = _message([blob], [1])
    with pytest.raises(HyflError, match=match) as caught:
        codec.decode(arrays, spec, party, sender="the server")
    assert "message from the server field duals" in str(caught.value)
    with pytest.raises(HyflError, match=match):
        party.deserialize([blob], [1])


def _refused_in_memory(party, vector, match: str) -> None:
    """The in-process route: a vector handed to ``decrypt`` without any wire."""
    genuine = party.encrypt(np.zeros((1, party.slots)))[0]
    hostile = LatticeCiphertext(vector, 1, party._tag)
    with pytest.raises(HyflError, match=match):  # checked before the genuine one decrypts
        party.decrypt(np.array([genuine, hostile], dtype=object))


# --------------------------------------------------------------------------- the attack itself


def test_the_attack_zeros_at_scale_2_20_are_refused_before_decryption(party, server,
                                                                      no_decryption):
    forged = ts.ckks_vector(server, [0.0] * SLOTS, scale=2.0**20)
    # Sent as TenSEAL writes it (its own scale field says 2**20) ...
    _refused_on_the_wire(party, forged.serialize(), "not a CKKS ciphertext of this context")
    # ... or framed like a genuine one, the forged scale only in the SEAL ciphertext.
    _refused_on_the_wire(party, _frame([_seal(forged.serialize())], [SLOTS], 2.0**60),
                         r"has CKKS scale 2\*\*20, not this cipher's 2\*\*60")
    _refused_in_memory(party, forged, r"has CKKS scale 2\*\*20, not this cipher's 2\*\*60.*"
                       "refused before decrypting")


def test_what_the_attack_would_have_learned_without_the_check(party, server):
    # The same forgery, decrypted past the check: raw noise in every slot, which a
    # party's reply could carry to the server. This is what the check prevents.
    forged = ts.ckks_vector(server, [0.0] * SLOTS, scale=2.0**20)
    steps = np.rint(np.ldexp(forged.decrypt(party._context.secret_key()), 32))  # the grid
    assert np.count_nonzero(steps) > 0.99 * SLOTS
    assert np.mean(np.log2(np.abs(steps) + 1)) > 15  # about 21 bits of noise per slot


@pytest.mark.parametrize("scale", [2.0**20, 2.0**59, 2.0**61, 2.0**119,
                                   math.nextafter(2.0**60, math.inf), math.nan, math.inf,
                                   -(2.0**60)])
def test_any_scale_but_the_ciphers_own_is_refused(party, genuine, tmp_path, scale,
                                                  no_decryption):
    def set_scale(ct, evaluator):
        ct.scale = scale

    blob = _sealapi_edit(genuine, set_scale, tmp_path)
    _refused_on_the_wire(party, blob, "has CKKS scale .*, not this cipher's 2\\*\\*60")
    _refused_in_memory(party, ts.ckks_vector_from(party._context, blob), "has CKKS scale")


def test_a_modulus_switched_ciphertext_is_refused(party, genuine, tmp_path, no_decryption):
    # At the last level SEAL allows scales below 2**60 only: the forger lowers it first.
    def switch(ct, evaluator):
        ct.scale = 2.0**40
        evaluator.mod_switch_to_next_inplace(ct)

    blob = _sealapi_edit(genuine, switch, tmp_path)
    _refused_on_the_wire(party, blob, "another level .*1 of 2 data primes")
    _refused_in_memory(party, ts.ckks_vector_from(party._context, blob), "another level")


def test_the_level_is_checked_on_its_own(tmp_path):
    # With scale 2**40 a genuine ciphertext can be switched down without touching its scale:
    # it would even decrypt correctly, but no genuine sum is at that level, so it is refused.
    party = make_cipher("ckks", scale_bits=40, precision_bits=16)
    blob = party.encrypt(np.ones((1, party.slots)))[0].vector.serialize()
    switched = _sealapi_edit(blob, lambda ct, ev: ev.mod_switch_to_next_inplace(ct), tmp_path)
    switched = switched[:-8] + struct.pack("<d", 2.0**40)  # TenSEAL's own scale field
    with pytest.raises(HyflError, match="another level"):
        party.deserialize([switched], [1])
    np.testing.assert_array_equal(party.decrypt(party.deserialize([blob], [1])),
                                  np.ones((1, party.slots)))


def test_a_product_of_ciphertexts_size_3_is_refused(party, server, no_decryption):
    attacker = _attacker(server)
    x = ts.ckks_vector(attacker, [0.0] * SLOTS, scale=2.0**30)
    product = x * x  # size 3 (no relinearization), scale 2**60, data level
    assert product.ciphertext()[0].size() == 3 and product.ciphertext()[0].scale == 2.0**60
    _refused_on_the_wire(party, product.serialize(), "not a CKKS ciphertext of this context")
    _refused_on_the_wire(party, _frame([_seal(product.serialize())], [SLOTS], 2.0**60),
                         "has 3 polynomials, not 2")
    _refused_in_memory(party, product, "has 3 polynomials, not 2")


def test_several_chunks_in_one_vector_are_refused(party, server, genuine, no_decryption):
    seal = _seal(genuine)
    # Two chunks of 2048 values: TenSEAL would decrypt each with the size the message gives.
    split = _frame([seal, seal], [SLOTS // 2, SLOTS // 2], 2.0**60)
    _refused_on_the_wire(party, split, "not a CKKS ciphertext of this context")
    _refused_in_memory(party, ts.ckks_vector_from(party._context, split),
                       "holds 2 ciphertexts of 4096 values, not one of 4096")
    # One ciphertext claiming more values than it has slots, and a longer vector.
    _refused_on_the_wire(party, _frame([seal], [2 * SLOTS], 2.0**60),
                         "not a CKKS ciphertext of this context")
    longer = ts.ckks_vector(_attacker(server), [0.0] * (SLOTS + 1))
    _refused_on_the_wire(party, longer.serialize(), "not a CKKS ciphertext of this context")
    _refused_in_memory(party, longer, "holds 2 ciphertexts")


@pytest.mark.parametrize("bits", [(60, 40, 60), (40, 40, 40), (60, 60)])
def test_a_ciphertext_under_other_parameters_is_refused(party, bits, no_decryption):
    other = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=POLY_MODULUS_DEGREE,
                       coeff_mod_bit_sizes=list(bits))
    vector = ts.ckks_vector(other, [0.0] * SLOTS, scale=2.0**30)
    _refused_on_the_wire(party, _frame([_seal(vector.serialize())], [SLOTS], 2.0**60),
                         "not a CKKS ciphertext of this context")
    _refused_in_memory(party, vector, "another level or under other parameters")


def test_a_ciphertext_of_another_ring_dimension_is_refused(party, no_decryption):
    other = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=16384,
                       coeff_mod_bit_sizes=[60, 60, 60])
    other.global_scale = 2.0**60
    vector = ts.ckks_vector(other, [0.0] * SLOTS)
    _refused_on_the_wire(party, vector.serialize(), "not a CKKS ciphertext of this context")
    _refused_in_memory(party, vector, "another level or under other parameters.*16384")


def test_truncated_extended_and_garbled_serializations_are_refused(party, genuine,
                                                                    no_decryption):
    seal = _seal(genuine)
    blobs = [genuine[:n] for n in (1, 4, 20, 1000, len(genuine) - 9, len(genuine) - 1)]
    blobs += [genuine + b"\x20\x01", b"\x20\x01" + genuine,
              genuine[:-8] + struct.pack("<d", 2.0**59)]  # TenSEAL's scale field
    blobs += [_frame([seal[:n]], [SLOTS], 2.0**60) for n in (0, 8, 100, len(seal) - 1)]
    for at in (0, 1, 2, 3, 4, 8, 16, 40):  # SEAL's header and the ciphertext's parameters
        garbled = bytearray(seal)
        garbled[at] ^= 0xFF
        blobs.append(_frame([bytes(garbled)], [SLOTS], 2.0**60))
    for blob in blobs:
        _refused_on_the_wire(party, blob, "not a CKKS ciphertext of this context")


# --------------------------------------------------------------------------- genuine ones pass


def test_genuine_ciphertexts_pass_fresh_summed_and_through_the_wire(party):
    # As in a deployment: the server adds with the public key file's context, the party
    # that decrypts read its cipher from the secret key file.
    server = make_ckks(context=party.context_bytes(secret=False))
    reader = make_ckks(context=party.context_bytes(secret=True))
    rng = np.random.default_rng(3)
    x = rng.uniform(-100.0, 100.0, size=(40, 2, party.slots))
    total = server.zeros(3)
    for part in x:
        arrays, spec = codec.encode({"v": EncryptedVector(np.arange(2),
                                                          party.encrypt(part))})
        sent = codec.decode(arrays, spec, server, sender="party 1")["v"]  # the server reads
        total = server.add(total, np.concatenate([sent.ciphertexts, server.zeros(1)]))
    assert [c.addends for c in total] == [40, 40, 0]
    arrays, spec = codec.encode({"duals": EncryptedVector(np.arange(3), total)})
    back = codec.decode(arrays, spec, reader, sender="the server")["duals"]
    expected = np.ldexp(np.rint(np.ldexp(x, 32)), -32).sum(axis=0)
    np.testing.assert_array_equal(reader.decrypt(back.ciphertexts)[:2], expected)
    np.testing.assert_array_equal(reader.decrypt(back.ciphertexts)[2], np.zeros(party.slots))
    # A party's own state, written and read back, decrypts the same.
    arrays, spec = codec.encode({"state": back})
    again = codec.decode(arrays, spec, reader)["state"]
    np.testing.assert_array_equal(reader.decrypt(again.ciphertexts),
                                  reader.decrypt(back.ciphertexts))
    # In process (the protocol engine): the public view's sums, with no wire at all.
    public = party.public()
    in_process = public.add(party.encrypt(x[0]), public.add(party.encrypt(x[1]), public.zeros(2)))
    np.testing.assert_array_equal(party.decrypt(in_process),
                                  np.ldexp(np.rint(np.ldexp(x[:2], 32)), -32).sum(axis=0))


# --------------------------------------------------------------------------- the limit


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "issue 26: a ciphertext with genuine metadata and chosen content passes any check of "
    "the ciphertext alone; the protection is that no reply built on such a decryption "
    "reaches the server (lattice module doc)"))
def test_chosen_content_with_genuine_metadata_is_not_caught_by_metadata(party, server):
    # Zero at scale 2**20, times the plaintext 1 encoded at 2**20, twice: size 2, data
    # level, scale 2**60 -- and its decryption is the noise times 2**-20.
    attacker = _attacker(server)
    forged = ts.ckks_vector(attacker, [0.0] * SLOTS, scale=2.0**20).mul(1.0).mul(1.0)
    meta = forged.ciphertext()[0]
    if not (meta.scale == 2.0**60 and meta.size() == 2):  # not an AssertionError: no xfail
        pytest.fail("the forgery does not have genuine metadata")
    blob = _frame([_seal(forged.serialize())], [SLOTS], 2.0**60)  # TenSEAL's field says 2**20
    noise = party.decrypt(party.deserialize([blob], [1]))  # not refused
    assert np.count_nonzero(noise) == 0, "the rounded decryption carries the noise"
