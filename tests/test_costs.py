"""Costs follow the cipher that runs.

* ``--he-costs auto`` (the default): a plaintext run carries no HE time (its
  operations are still counted); a real cipher is priced with its own
  calibration at its key size (cached, or measured quickly and then cached).
* ``paper`` still gives the paper's per-value Paillier figures.
* The counted layout is the cipher's: one ciphertext per value for one-value
  ciphers, whole samples per ciphertext for packing ones (all classes of a
  sample together), and ``sample`` counts one ciphertext per sample.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hyfl.costs import (
    NO_HE_COSTS,
    PAPER_HE_COSTS,
    CostModel,
    calibration_key,
    check_he_layout,
    cipher_he_costs,
    counting_layout,
    he_label,
    resolve_he_costs,
    save_calibration,
)
from hyfl.errors import HyflError
from hyfl.experiments.runner import RunSpec, execute
from hyfl.participation import RandomFraction
from hyfl.partition import grid, stack
from hyfl.privacy.ciphers import CIPHERS, make_cipher
from hyfl.problem import make_problem
from hyfl.runtime.simulation import simulate
from synthetic_data import synthetic

KEY_BITS = 512  # small keys keep the tests fast


def _tiny(**changes) -> RunSpec:
    base = dict(data="breast_cancer", val_fraction=0.2, partition="grid:2x2",
                participation="0.5", hyper={"local_steps": 4}, iterations=4, seed=1)
    return RunSpec(**{**base, **changes})


def _encryption_charge(result, he) -> np.ndarray:
    return (result.column("encryptions") * he.encrypt + result.column("decryptions") * he.decrypt
            + result.column("additions") * he.add)


def test_a_plaintext_run_has_no_he_time_by_default():
    outcome = execute(_tiny())
    result = outcome.result
    assert result.column("encryptions")[-1] > 0  # the operations are still counted
    np.testing.assert_array_equal(result.column("time_encryption"), 0.0)
    costs = result.config["costs"]["he_costs"]
    assert costs["source"] == NO_HE_COSTS.source
    assert outcome.summary["costs"]["he_costs"] == "no HE time (plaintext)"


def test_paper_costs_are_the_papers_per_value_figures():
    result = execute(_tiny(he_costs="paper")).result
    assert result.config["costs"]["he_costs"]["encrypt"] == 18.882e-3
    np.testing.assert_allclose(result.column("time_encryption"),
                               _encryption_charge(result, PAPER_HE_COSTS), rtol=1e-12)
    assert result.column("time_encryption")[-1] > 0
    # the same counts as the default run: only the price differs
    plain = execute(_tiny()).result
    np.testing.assert_array_equal(result.column("encryptions"), plain.column("encryptions"))


def test_a_real_cipher_is_priced_with_its_own_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("HYFL_CACHE", str(tmp_path))
    outcome = execute(_tiny(cipher="packed", key_bits=KEY_BITS, iterations=2))
    assert outcome.summary["engine"] == "protocol"
    stored = json.loads((tmp_path / "he-costs.json").read_text())
    record = stored[calibration_key("packed", KEY_BITS)]
    assert record["quick"] is True and record["key_bits"] == KEY_BITS
    he = outcome.result.config["costs"]["he_costs"]
    assert he["encrypt"] == record["encrypt"] and he["add"] == record["add"]
    assert he["source"].startswith(f"packed ({KEY_BITS}-bit key): its own quick calibration")
    result = outcome.result
    np.testing.assert_allclose(result.column("time_encryption"),
                               _encryption_charge(result, cipher_he_costs(
                                   make_cipher("packed", key_bits=KEY_BITS),
                                   tmp_path / "he-costs.json")), rtol=1e-12)


def test_the_calibrate_cache_wins_and_is_read_per_key_size(tmp_path):
    path = tmp_path / "he-costs.json"
    measured = {"cipher": "paillier", "key_bits": KEY_BITS, "slots": 1,
                "encrypt": 1.5e-3, "decrypt": 1.25e-3, "add": 2e-6}
    save_calibration({"paillier": measured}, path)  # what `hyfl calibrate` writes
    cipher = make_cipher("paillier", key_bits=KEY_BITS)
    costs = cipher_he_costs(cipher, path)
    assert (costs.encrypt, costs.decrypt, costs.add) == (1.5e-3, 1.25e-3, 2e-6)
    assert "its own calibration on this machine" in costs.source
    # another key size has no record: measured quickly and cached beside the first
    other = cipher_he_costs(make_cipher("paillier", key_bits=2 * KEY_BITS), path)
    assert other.encrypt > 0 and other.encrypt != 1.5e-3
    stored = json.loads(path.read_text())
    assert stored[calibration_key("paillier", 2 * KEY_BITS)]["quick"] is True
    assert stored["paillier"]["encrypt"] == 1.5e-3  # the full calibration is kept


def test_he_cost_choices_resolve_generically_over_the_cipher_registry():
    plain = make_cipher("none")
    assert resolve_he_costs("auto", plain) == NO_HE_COSTS
    assert resolve_he_costs("none", plain) == NO_HE_COSTS
    assert resolve_he_costs("paper", plain) == PAPER_HE_COSTS
    # any cipher of the registry can price a plaintext run by name
    named = resolve_he_costs("packed", plain, key_bits=KEY_BITS)
    assert named.encrypt > 0 and named.source.startswith(f"packed ({KEY_BITS}-bit key)")
    assert set(CIPHERS) >= {"none", "paillier", "packed"}
    with pytest.raises(HyflError, match="--he-costs"):
        resolve_he_costs("", plain)
    assert he_label(CostModel(he=PAPER_HE_COSTS).describe()) == (
        "paper's per-value Paillier HE costs")


def test_packing_keeps_a_samples_classes_in_one_ciphertext():
    X = synthetic(n=200, m=12, seed=0).X
    blocks = stack(grid(200, 12, 2, 2), X)
    classes = 10
    slots = make_cipher("packed", key_bits=2048).slots  # 27 values per ciphertext
    assert slots >= classes
    layout = counting_layout(blocks, slots, classes)
    # every sample sits in exactly one ciphertext, slots // C samples per ciphertext
    assert (layout.slots, layout.n_outputs) == (slots // classes, 1)
    chunks = layout.positions(np.arange(200)) // layout.slots
    assert chunks.size == 200 and np.bincount(chunks).max() == slots // classes
    # a client sending scattered samples sends one ciphertext per sample, not C
    client = 0
    samples = blocks.row_sample[blocks.client_rowptr[client]:blocks.client_rowptr[client + 1]]
    drawn = samples[:: slots // classes][:7]  # never two in one ciphertext
    assert layout.count_chunks(np.full(drawn.size, client), drawn) == drawn.size
    # one value per ciphertext: C per sample; 'sample' (slots = C): one per sample
    per_value = counting_layout(blocks, 1, classes)
    assert per_value.count_chunks(np.full(drawn.size, client), drawn) == classes * drawn.size
    per_sample = counting_layout(blocks, classes, classes)
    assert per_sample.count_chunks(np.full(samples.size, client), samples) == samples.size
    # more classes than slots: ceil(C / slots) ciphertexts per sample
    wide = counting_layout(blocks, 4, classes)
    assert wide.count_chunks(np.full(drawn.size, client), drawn) == 3 * drawn.size


def test_mnist_like_ten_classes_count_one_ciphertext_per_sample():
    problem = make_problem(synthetic(n=160, m=12, seed=2, classes=10), "hinge", 0.05)
    assert problem.Y.shape[1] == 10
    partition, schedule = grid(160, 12, 2, 2), RandomFraction(4, 0.5)
    from hyfl.algorithms.hyfdca import HyFDCA

    def run(layout, slots=None):
        model = CostModel(he=PAPER_HE_COSTS, layout=layout, layout_slots=slots)
        return simulate(HyFDCA(local_steps=3, step_rule="safe", sip_scope="paper"), problem,
                        partition, schedule, 3, seed=0, cost_model=model)

    per_value, per_sample = run("cipher"), run("sample")
    packed = run("packed", make_cipher("packed", key_bits=2048).slots)
    np.testing.assert_array_equal(per_value.column("primal"), per_sample.column("primal"))
    enc_value = per_value.column("encryptions")[-1]
    enc_sample = per_sample.column("encryptions")[-1]
    # ten times fewer, up to the few scalars of the safe rule's acceptance test
    assert enc_sample > 0 and 9 * enc_sample <= enc_value <= 10 * enc_sample
    assert per_sample.column("time_encryption")[-1] < per_value.column("time_encryption")[-1]
    # packed: all ten classes of a sample in one ciphertext, sometimes two samples in one
    assert packed.column("encryptions")[-1] <= enc_sample
    assert per_sample.config["costs"]["he_layout"] == {"name": "sample", "slots": None}


def test_a_real_cipher_counts_its_own_layout():
    assert check_he_layout("cipher", "packed") == "cipher"
    assert check_he_layout("packed", "packed") == "packed"
    assert check_he_layout("sample", "none") == "sample"
    with pytest.raises(HyflError, match="really encrypts"):
        check_he_layout("sample", "packed")
    with pytest.raises(HyflError, match="--he-layout"):
        check_he_layout("per-row", "none")
    with pytest.raises(HyflError, match="--he-layout"):
        _tiny(cipher="packed", key_bits=KEY_BITS, he_layout="sample").validated()


def test_an_unreadable_cache_is_left_alone(tmp_path):
    path = tmp_path / "he-costs.json"
    path.write_text("not json")
    costs = cipher_he_costs(make_cipher("paillier", key_bits=KEY_BITS), path)
    assert costs.encrypt > 0 and "not saved" in costs.source
    assert path.read_text() == "not json"
    with pytest.raises(HyflError, match="left as it is"):
        save_calibration({"paillier": {"encrypt": 1.0, "decrypt": 1.0, "add": 1.0}}, path)


def test_the_round_is_counted_phase_by_phase_with_its_rule_named():
    """HE operations come from the traffic each phase of HyFDCA's round recorded, one
    counting function per phase (hyfl.costs.PHASE_COUNTS), the rule named by the record."""
    from hyfl.algorithms import hyfdca_round
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.costs import PHASE_COUNTS, RoundTraffic, count_he_operations

    assert set(PHASE_COUNTS) <= set(hyfdca_round.PHASES)
    assert {hyfdca_round.COCOA, hyfdca_round.PER_SAMPLE} == {"cocoa", "per-sample"}
    problem = make_problem(synthetic(n=120, m=10, seed=4), "logistic", 0.05)
    blocks = stack(grid(120, 10, 2, 2), problem.X)
    layout = counting_layout(blocks, 1, 1)
    active = np.array([True, True, False, True])
    for rule, expected in (("cocoa", hyfdca_round.COCOA), ("safe", hyfdca_round.PER_SAMPLE)):
        algorithm = HyFDCA(local_steps=5, step_rule=rule)
        state = algorithm.setup(problem, blocks)
        rng = np.random.default_rng(0)
        for _ in range(3):
            state = algorithm.round(state, active, rng)
            active = ~active | (np.arange(4) == 0)  # returning clients: the refresh too
            traffic = state.traffic
            assert isinstance(traffic, RoundTraffic) and traffic.rule == expected
            for phase in traffic.phases:  # only phases of this rule's round
                assert hyfdca_round.PHASES[phase].rule in (expected, "both"), phase
            counts = count_he_operations(traffic, layout)
            assert counts["encryptions"] > 0 and counts["decryptions"] > 0
    with pytest.raises(HyflError, match="no count for phase"):
        count_he_operations(RoundTraffic("cocoa", {"hello": {}}), layout)
    with pytest.raises(HyflError, match="rule"):
        count_he_operations(RoundTraffic("newton"), layout)
