"""Fuzzing the deployment's inputs: every malformed message or key file is a HyflError.

What crosses the network (or sits in a key file) is untrusted. Each case
below is a garbled input -- generated from valid ones with a seeded
``numpy.random.default_rng`` or written by hand (deep nesting, huge ints,
wrong types, truncated or missing arrays, non-JSON descriptions, unknown
message kinds, forged key files) -- and must give a :class:`HyflError` whose
message names something useful (the sender, the field, the file), never a
``KeyError``, ``IndexError``, ``RecursionError`` or a hang. Sizes are tiny:
the whole file runs in a few seconds.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from hyfl.deploy.blocks import read_block, write_blocks
from hyfl.deploy.codec import MAX_DEPTH, decode, encode
from hyfl.deploy.config import DeployConfig, run_config_for
from hyfl.deploy.coordinator import REPLY_FIELDS, Coordinator
from hyfl.deploy.keys import fingerprint, generate_keys, load_key, server_cipher
from hyfl.deploy.party import COCOA_KINDS, MESSAGE_FIELDS, handle_message
from hyfl.errors import HyflError
from hyfl.partition import grid
from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.layout import EncryptedVector
from hyfl.problem import make_problem
from synthetic_data import synthetic

SEED = 20240611
N_RANDOM = 60  # generated cases per fuzzer (several fuzzers: well over 100 in all)


def raises_hyfl(call, *needles: str) -> str:
    """Run ``call``; it must raise HyflError naming one of ``needles``. Returns the message."""
    with pytest.raises(HyflError) as info:
        call()
    message = str(info.value)
    assert any(n in message for n in needles), message
    return message


def hyfl_or_ok(call) -> bool:
    """Run ``call``: True if it raised HyflError, False if it passed; anything else fails."""
    try:
        call()
    except HyflError:
        return True
    return False


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_paillier():
    return make_cipher("paillier", key_bits=256)


@pytest.fixture(scope="module")
def message(tiny_paillier):
    """A valid encoded message with every kind of node, ciphertexts included."""
    cts = tiny_paillier.encrypt(np.ones((2, 1)))
    tree = {"round": 3, "x": 0.5, "s": "hi", "none": None, "flag": True,
            "ids": np.arange(4), "mask": np.array([True, False]), "w": np.ones((2, 2)),
            "vec": EncryptedVector(np.array([0, 1]), cts),
            "empty": EncryptedVector(np.empty(0, np.int64), np.empty(0, object)),
            "nested": {"list": [1, np.zeros(3)], "tuple": (2.0, np.int64(7))}}
    arrays, spec = encode(tree)
    return arrays, spec


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """Three parties of a small problem (cipher none, the safe rule), party 0's state after
    hello and set-up, and the set-up payload."""
    return _deployment(tmp_path_factory, "step_rule=safe", (3, 1))


@pytest.fixture(scope="module")
def cocoa_deployment(tmp_path_factory):
    """As :func:`deployment` with the cocoa rule (the default) on vertical data; also
    party 0's state in its first round (``open_state``)."""
    d = _deployment(tmp_path_factory, "", (1, 3))
    _, d["open_state"] = handle_message("round", encode(_valid_payload("round", d)), d["state"],
                                        d["nodes"][0], d["run"])
    return d


def _deployment(tmp_path_factory, hyper: str, shape: tuple[int, int]) -> dict:
    folder = tmp_path_factory.mktemp("fuzz")
    problem = make_problem(synthetic(n=30, m=6), "hinge", 0.05)
    partition = grid(problem.n_samples, problem.n_features, *shape)
    files = write_blocks(problem, partition, folder, lam_default=0.05)
    run = run_config_for(parties=3, cipher="none", iterations=2, hyper=hyper)
    nodes = [{"party": k, "cipher": "none", "data": str(f)} for k, f in enumerate(files)]
    blocks = [read_block(f, k) for k, f in enumerate(files)]
    setup = {"n_samples": problem.n_samples, "n_features": problem.n_features, "n_outputs": 1,
             "lam": 0.05, "samples": np.concatenate([b.samples for b in blocks]),
             "sample_counts": np.array([b.samples.size for b in blocks]),
             "features": np.concatenate([b.features for b in blocks]),
             "feature_counts": np.array([b.features.size for b in blocks])}
    hello = {"cipher": "none", "fingerprint": ""}
    _, state = handle_message("hello", encode(hello), None, nodes[0], run)
    _, state = handle_message("setup", encode(setup), state, nodes[0], run)
    return {"run": run, "nodes": nodes, "state": state, "setup": setup, "files": files,
            "n_local": blocks[0].samples.size, "n_features": blocks[0].features.size,
            "cocoa": not hyper}


# ----------------------------------------------------------------------------- codec

JUNK_NODES = [  # descriptions no encoder writes
    {}, [], 5, "x", None, {"v": [1, 2]}, {"v": {"a": 1}}, {"a": "999"}, {"a": 3},
    {"q": 1}, {"d": []}, {"l": {}}, {"t": 5}, {"v": 1, "a": "0"}, {"e": "0"},
    {"e": "0", "kind": "weird"}, {"e": "0", "kind": "float"}, {"e": "nope", "kind": "empty"},
    {"e": "0", "kind": "paillier", "width": -1, "ct": "0", "addends": "0"},
    {"e": "0", "kind": "paillier", "width": "8", "ct": "0", "addends": "0"},
]


def _nodes(spec, path=()):
    """Every node of a description with its path (a list of keys and indices)."""
    yield path, spec
    if isinstance(spec, dict):
        for tag in ("d", "l", "t"):
            children = spec.get(tag)
            if isinstance(children, dict):
                for key, child in children.items():
                    yield from _nodes(child, (*path, tag, key))
            elif isinstance(children, list):
                for i, child in enumerate(children):
                    yield from _nodes(child, (*path, tag, i))


def _replace(spec, path, value):
    spec = copy.deepcopy(spec)
    if not path:
        return value
    target = spec
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return spec


def test_codec_random_garbled_descriptions(message, tiny_paillier):
    arrays, spec = message
    description = json.loads(spec)
    nodes = list(_nodes(description))
    rng = np.random.default_rng(SEED)
    for _ in range(N_RANDOM):
        path, _node = nodes[rng.integers(len(nodes))]
        junk = JUNK_NODES[rng.integers(len(JUNK_NODES))]
        garbled = json.dumps(_replace(description, path, junk))
        raises_hyfl(lambda g=garbled: decode(arrays, g, tiny_paillier, sender="party 2"),
                    "message from party 2")


def test_codec_random_garbled_arrays(message, tiny_paillier):
    arrays, spec = message
    rng = np.random.default_rng(SEED + 1)
    names = sorted(arrays)
    failures = 0
    for _ in range(N_RANDOM):
        garbled = dict(arrays)
        name = names[rng.integers(len(names))]
        how = rng.integers(4)
        if how == 0:  # missing
            del garbled[name]
        elif how == 1:  # truncated
            garbled[name] = arrays[name].ravel()[: max(arrays[name].size - 1 - rng.integers(3),
                                                     0)]
        elif how == 2:  # another dtype
            garbled[name] = arrays[name].astype([np.float32, np.int8, np.bool_][rng.integers(3)])
        else:  # another shape
            garbled[name] = np.repeat(arrays[name].reshape(1, -1), 2, axis=0)
        # Some garbling leaves a valid message (a float array of another float dtype);
        # what must never happen is another exception than HyflError.
        failures += hyfl_or_ok(lambda g=garbled: decode(g, spec, tiny_paillier,
                                                        sender="the server"))
    assert failures >= N_RANDOM // 3


def test_codec_hand_written_nasty_messages(message, tiny_paillier):
    arrays, spec = message
    deep = '{"l":[' * 5000 + "]}" * 5000  # thousands deep: json itself would recurse
    nested = {"v": 1}
    for _ in range(MAX_DEPTH + 5):
        nested = {"l": [nested]}
    cases = [
        ("not json {", "not JSON"),
        (deep, "not JSON"),
        (json.dumps(nested), "nested deeper"),
        ('{"v": ' + "9" * 5000 + "}", "not JSON"),  # beyond Python's int-from-text limit
        ("[1, 2]", "malformed description"),
        ('"just a string"', "malformed description"),
        ('{"d": {"x": {"a": "missing"}}}', "field x refers to array"),
        ('{"a": ["0"]}', "refers to array"),
        ('{"e": "0", "kind": "empty", "extra": 1}', "encrypted vector"),
        ('{"d": {"v": {"e": "1", "kind": "float", "ct": "1"}}}', "chunk ids"),
        ('{"t": [{"v": NaN}, {"xx": 1}]}', "field [1]"),
    ]
    for text, needle in cases:
        raises_hyfl(lambda t=text: decode(arrays, t, tiny_paillier, sender="party 1"), needle)
    raises_hyfl(lambda: decode(arrays, None, sender="party 1"), "not JSON text")
    raises_hyfl(lambda: decode([1, 2], spec, sender="party 1"), "not a mapping")
    raises_hyfl(lambda: decode({"0": np.array([object()])}, spec, sender="party 1"),
                "not numeric")
    raises_hyfl(lambda: decode({**arrays, "0": "text"}, spec, sender="party 1"), "not numeric")
    # Huge integers: the codec carries them; the receiver's field checks refuse them.
    huge = encode({"totals": None, "dw_sq": 10**400})
    assert decode(*huge)["dw_sq"] == 10**400


# ----------------------------------------------------------------------------- party


def _wrong_value(kind: str, rng) -> object:
    """A value of another type than ``kind`` (a check_fields type)."""
    pool = {"int": ["x", 1.5, [1], np.ones(2), None], "number": ["x", [1.0], np.ones(2), True],
            "bool": [1, "yes", np.ones(1)], "str": [1, ["a"], np.ones(1)],
            "dict": [5, "x", [1], np.ones(2)], "ids": [np.ones(3), np.ones((2, 2), int), 5, "x"],
            "mask": [np.arange(3), 1, "x"], "matrix": [np.ones(3), 3, "x", np.ones((2, 2, 2))],
            "floats": [np.ones((2, 2)), np.array([np.inf]), 3.0, "x"],
            "vector": [np.ones(3), 5, "x", [1, 2]]}
    options = pool[kind.rstrip("?")]
    return options[rng.integers(len(options))]


def _valid_payload(kind: str, d: dict) -> dict:
    """A well-formed server message of ``kind`` to party 0 (cipher none)."""
    vec = EncryptedVector(np.array([0]), np.array([0.5], dtype=object))
    n_local = d["n_local"]
    configure = {"t": 1, "updated_local": np.arange(n_local), "reports_local":
                 np.ones(n_local, bool), "n_draws": 2, "stale": None}
    if d["cocoa"]:
        configure["order_local"] = np.array([1, 0])
    else:
        configure.update(drawn_local=np.array([0, 1]), beta=1.0)
    one = np.zeros(1)
    return {"hello": {"cipher": "none", "fingerprint": ""}, "setup": d["setup"],
            "round": {"configure": configure, "deliveries": {}},
            "weights": {"w": np.zeros((d["n_features"], 1))}, "steps": {"z": vec},
            "duals": {"duals": vec}, "verdict": {"totals": vec, "dw_sq": 0.0,
                                                         "active": np.array([0])},
            "commit": {"inner_products": True}, "ping": {}, "finish": {},
            # grams: (C, R(R+1)/2) for the R = 7 directions of 6 features
            "proposals": {"z": vec, "grams": np.zeros((1, 28)), "coef": 1.0},
            "image": {"proposal": vec, "previous": None}, "direction": {"mu": one},
            "step": {"totals": vec, "dw_sq": one, "coherence": one, "updated": 2,
                     "active": np.array([0])},
            "certify": {"certified": vec, "checkpoint": vec, "w_sq": np.zeros(2)},
            # the alignment of party files (refused by a party with a block, as here)
            "align": {"peers": np.zeros((2, 32), np.uint8), "peer_counts": np.array([0, 1, 1]),
                      "channels": np.zeros((3, 32), np.uint8), "task": "binary",
                      "nonces": np.zeros((3, 16), np.uint8), "classes": ["a", "b"],
                      "column_keys": np.zeros((3, 32), np.uint8),
                      "column_counts": np.array([1, 1, 1])},
            "labels": {"shared_rows": np.array([0]), "peer_rows": np.array([0]),
                       "shared_counts": np.array([0, 1, 0])},
            "block": {"samples": np.arange(n_local), "features": np.arange(d["n_features"]),
                      "n_samples": 30, "n_features": d["n_features"], "sealed": {}},
            # scoring new rows after the alignment (refused by a party with a block, as here)
            "score": {"asker": 0, "samples": np.arange(n_local),
                      "weights": np.zeros((d["n_features"], 1))},
            "scores": {"sealed": {}}}[kind]


def _garble_payload(kind: str, payload: dict, rng) -> dict | None:
    """One invalid change to a message: drop, mistype or add a field (None: not possible)."""
    fields = MESSAGE_FIELDS[kind]
    how = rng.integers(3)
    garbled = dict(payload)
    required = [f for f, t in fields.items() if not t.endswith("?")]
    if how == 0 and required:
        del garbled[required[rng.integers(len(required))]]
    elif how == 1 and fields:
        name = list(fields)[rng.integers(len(fields))]
        garbled[name] = _wrong_value(fields[name], rng)
    else:
        garbled[f"bogus{rng.integers(100)}"] = 1
    return garbled


def test_party_random_garbled_messages(deployment, cocoa_deployment):
    rng = np.random.default_rng(SEED + 2)
    kinds = list(MESSAGE_FIELDS)
    for _ in range(N_RANDOM):
        kind = kinds[rng.integers(len(kinds))]
        # The cocoa rule's kinds to a cocoa party, the others to either.
        d = cocoa_deployment if kind in COCOA_KINDS or rng.integers(2) else deployment
        payload = _garble_payload(kind, _valid_payload(kind, d), rng)
        state = None if kind == "hello" else d["state"]
        raises_hyfl(lambda k=kind, p=payload, s=state: handle_message(
            k, encode(p), s, d["nodes"][0], d["run"]), "the server's", "party 0")


def test_party_hand_written_nasty_messages(deployment):
    d = deployment
    node, run, state = d["nodes"][0], d["run"], d["state"]

    def send(kind, message, state=state):
        return lambda: handle_message(kind, message, state, node, run)

    good = _valid_payload("round", d)
    cases = [
        (send("steal", encode({})), "message kind 'steal' is not known"),
        (send("round", ({}, "not json")), "message from the server"),
        (send("round", ({}, '{"d": {"configure": {"a": "7"}}}')), "field configure refers"),
        (send("round", encode({"configure": {**good["configure"], "t": "one"}})),
         "field configure"),
        (send("round", encode({"configure": {**good["configure"],
                                             "updated_local": np.array([10**6])}})),
         "field updated_local holds indices outside"),
        (send("round", encode({"configure": good["configure"],
                               "deliveries": {"commit": {"round": 1}}})), "deliveries.commit"),
        (send("round", encode({"configure": good["configure"], "deliveries": {"x": 1}})),
         "deliveries"),
        (send("setup", encode({**d["setup"], "sample_counts": np.array([1, 2])}), None),
         "before 'hello'"),
        (send("steps", encode({"z": None}), None), "before 'hello'"),
        (send("round", encode(good), ({}, '{"d": {"block": {"a": "9"}}}')),
         "the party's own saved state"),
        (send("weights", encode({"w": np.zeros((99, 1))})), "'weights' message"),
        (send("verdict", encode({"totals": EncryptedVector(np.array([0]), np.array(
            [1.0], dtype=object)), "dw_sq": float("inf")})), "field 'dw_sq'"),
        (send("verdict", encode({"totals": None, "dw_sq": 10**400})), "field 'totals'"),
        (send("verdict", encode({"totals": EncryptedVector(np.array([0]), np.array(
            [1.0], dtype=object)), "dw_sq": 10**400})), "field 'dw_sq'"),
    ]
    for call, needle in cases:
        raises_hyfl(call, needle)
    # Set-up counts that do not add up, or name fewer parties than the run has.
    for counts in ([1, 2], [100, 0, 0], [-1, 20, 11]):
        hello = encode({"cipher": "none", "fingerprint": ""})
        _, fresh = handle_message("hello", hello, None, node, run)
        raises_hyfl(send("setup", encode({**d["setup"], "sample_counts": np.array(counts)}),
                         fresh), "'setup' message", "party 0")


def _admitted(state, kind):
    """``state`` with the kinds ``kind`` follows answered in its round (and ``kind`` not):
    the party's guard (hyfl.deploy.guard) lets it through, so a case reaches the checks of
    the message's own fields. The guard itself is attacked in test_hostile_server.py."""
    from hyfl.deploy.guard import AFTER

    tree = decode(*state)
    guard = tree.get("guard")
    if guard is None or "done" not in guard:
        return state
    guard["done"] = [k for k in (*AFTER.values(),) if k != kind]
    return encode(tree)


def test_party_refuses_cocoa_messages_that_do_not_fit(deployment, cocoa_deployment):
    d = cocoa_deployment
    inside = d["open_state"]

    def send(kind, payload, state=inside, d=d, admit=True):
        state = _admitted(state, kind) if admit else state
        return lambda: handle_message(kind, encode(payload), state, d["nodes"][0], d["run"])

    def commit(w):
        return {"deliveries": {"commit": {"round": 1, "accepted": True, "w": w}}}

    vec = EncryptedVector(np.array([0]), np.array([0.5], dtype=object))
    one = np.zeros(1)
    good = _valid_payload("round", d)
    safe_round = _valid_payload("round", deployment)
    cases = [
        # Another rule's messages and fields, messages outside a round.
        (send("steps", {"z": None}), "step rule is 'cocoa'"),
        (send("steps", {"z": None}, d=deployment, state=deployment["state"]),
         "outside a round"),
        (send("image", {"proposal": vec}, state=d["state"]), "outside a round"),
        (send("image", {"proposal": vec}, d=deployment, state=deployment["state"]),
         "step rule is 'safe'"),
        (send("round", safe_round), "has no field 'order_local'"),
        (send("round", {**safe_round, "wait": True}, d=deployment, state=deployment["state"]),
         "cocoa fields"),
        # The commit of the open round (its new weights) before the party took its step.
        (send("round", {**good, **commit(np.zeros((2, 1)))}, admit=False),
         "commits round 1 before the party took its step"),
        # No rule delivers 'closed' any more (the cocoa rule's commit closes its round).
        (send("round", {**good, "deliveries": {"closed": 1}}), "unknown field 'closed'"),
        (send("round", {**safe_round, "deliveries": {"closed": 1}}, d=deployment,
              state=deployment["state"]), "unknown field 'closed'"),
        # Shapes and values of the cocoa fields.
        (send("proposals", {"z": vec, "grams": np.zeros((1, 3)), "coef": 1.0}),
         "field grams has shape (1, 3), not (1, 28)"),
        (send("proposals", {"z": vec, "grams": np.zeros((1, 28)), "coef": float("nan")}),
         "field 'coef'"),
        (send("round", {**good, "model": {"grams": np.zeros((1, 28))}}), "field model"),
        (send("direction", {"mu": np.zeros(3)}), "field mu has shape (3,)"),
        (send("direction", {"mu": np.array([np.inf])}), "field 'mu'"),
        (send("direction", {"mu": np.zeros((1, 1))}), "field 'mu'"),
        (send("step", {"totals": vec, "dw_sq": np.zeros(2), "coherence": one, "updated": 2,
                       "active": np.array([0])}),
         "field dw_sq has shape"),
        (send("step", {"totals": None, "dw_sq": one, "coherence": one, "updated": 2,
                       "active": np.array([0])}),
         "field 'totals'"),
        # The step is the party's own now (from the summed sums); what the server sends
        # beside the sums is bounded, and the new weights come with the commit.
        (send("step", {"totals": vec, "dw_sq": one, "coherence": -np.ones(1), "updated": 2,
                       "active": np.array([0])}), "field coherence holds"),
        (send("step", {"totals": vec, "dw_sq": one, "coherence": one, "updated": 0,
                       "active": np.array([0])}), "field updated is 0"),
        (send("step", {"totals": vec, "dw_sq": one, "coherence": one, "updated": 31,
                       "active": np.array([0])}), "field updated is 31"),
        (send("step", {"totals": vec, "dw_sq": one, "coherence": one, "updated": 2,
                       "active": np.array([0]), "step": one}), "unknown field 'step'"),
        (send("changes", {"step": one, "w": np.zeros((2, 1))}), "kind 'changes' is not known"),
        (send("round", {**good, **commit(np.zeros((99, 1)))}), "deliveries.commit.w"),
        (send("image", {"proposal": vec, "previous": 3}), "field 'previous'"),
    ]
    for call, needle in cases:
        raises_hyfl(call, needle)


# ----------------------------------------------------------------------------- coordinator


class GarblingTransport:
    """Parties in this process (cipher none); one reply of one kind is garbled."""

    def __init__(self, nodes, run, target_kind, garble, party=0):
        self.nodes, self.run = nodes, run
        self.states = dict.fromkeys(range(len(nodes)))
        self.target_kind, self.garble, self.party = target_kind, garble, party
        self.sent_bytes = self.received_bytes = 0

    def _deliver(self, k, kind, payload):
        reply, self.states[k] = handle_message(kind, encode(payload), self.states[k],
                                               self.nodes[k], self.run)
        reply = decode(*reply, make_cipher("none").public())
        if kind == self.target_kind and k == self.party:
            reply = self.garble(reply)
        return reply

    def connect(self, n_parties, timeout, hello):
        return {k: self._deliver(k, "hello", hello) for k in range(n_parties)}

    def exchange(self, messages, timeout):
        return {k: self._deliver(k, kind, p) for k, (kind, p) in messages.items()}, set()

    def post(self, k, kind, payload):
        return True

    def poll(self, handle):
        return "replied"


def _coordinate(d, kind, garble):
    config = DeployConfig.from_run_config(d["run"])
    transport = GarblingTransport(d["nodes"], d["run"], kind, garble)
    coordinator = Coordinator(config, transport, make_cipher("none").public(),
                              log=lambda line: None)
    return coordinator.run


def test_coordinator_random_garbled_replies(deployment, cocoa_deployment):
    rng = np.random.default_rng(SEED + 3)
    kinds = [*((deployment, kind) for kind in ("hello", "setup", "round", "steps", "duals",
                                               "verdict", "finish")),
             *((cocoa_deployment, kind) for kind in ("round", "proposals", "image", "direction",
                                                     "step"))]
    for _ in range(N_RANDOM // 2):
        d, kind = kinds[rng.integers(len(kinds))]
        fields = REPLY_FIELDS[kind]
        seed = int(rng.integers(1 << 30))

        def garble(reply, fields=fields, seed=seed):
            r = np.random.default_rng(seed)
            reply = dict(reply)
            present = [f for f in fields if f in reply and f != "node"]
            how = r.integers(4)
            if how == 0 and present:
                name = present[r.integers(len(present))]
                reply[name] = _wrong_value(fields[name] if fields[name].rstrip("?") in (
                    "int", "number", "bool", "str", "ids", "matrix", "vector") else "int", r)
            elif how == 1:
                reply["ops"] = {"encryptions": "many"}
            elif how == 2:
                reply["surprise"] = [1]
            else:
                return ["not", "a", "dict"]
            return reply

        raises_hyfl(_coordinate(d, kind, garble), "party 0's reply to", "party 0")


def test_coordinator_hand_written_garbled_replies(deployment):
    d = deployment
    cases = [
        ("hello", lambda r: {**r, "party": 2}, "says in its hello that it is party 2"),
        ("hello", lambda r: {**r, "party": 7}, "says in its hello that it is party 7"),
        ("hello", lambda r: {k: v for k, v in r.items() if k != "fingerprint"},
         "has no field 'fingerprint'"),
        ("hello", lambda r: {**r, "samples": np.array([[1, 2]])}, "field 'samples'"),
        ("hello", lambda r: {**r, "n_samples": 10**12}, "n_samples = 1000000000000"),
        ("hello", lambda r: {**r, "n_samples": 10**400}, "n_samples = 1000"),
        ("hello", lambda r: {**r, "features": np.array([-1])}, "features ids outside"),
        ("hello", lambda r: {**r, "n_outputs": 10**9}, "n_outputs"),
        ("hello", lambda r: {**r, "lam_default": 10**400}, "field 'lam_default'"),
        ("setup", lambda r: {**r, "norms": EncryptedVector(np.array([10**6]), np.array(
            [1.0], dtype=object))}, "chunk ids outside"),
        ("setup", lambda r: {**r, "norms": EncryptedVector(np.array([0, 0]), np.array(
            [1.0, 1.0], dtype=object))}, "or twice"),
        ("duals", lambda r: {**r, "primal_part": np.zeros((99, 1))}, "has shape (99, 1)"),
        ("steps", lambda r: {**r, "seconds": "soon"}, "field 'seconds'"),
        ("verdict", lambda r: {"accepted": "yes"}, "field 'accepted'"),
        ("round", lambda r: {}, "has no field 'inner_products'"),
    ]
    for kind, garble, needle in cases:
        run = _coordinate(d, kind, garble)
        raises_hyfl(run, needle)


def test_coordinator_hand_written_garbled_cocoa_replies(cocoa_deployment):
    d = cocoa_deployment
    far = EncryptedVector(np.array([10**6]), np.array([1.0], dtype=object))
    cases = [
        ("round", lambda r: {**r, "inner_products": None}, "has no field 'inner_products'"),
        ("proposals", lambda r: {**r, "proposals": far}, "chunk ids outside"),
        ("proposals", lambda r: {}, "has no field 'proposals'"),
        ("image", lambda r: {**r, "primal_part": np.zeros((99, 1))}, "has shape (99, 1)"),
        ("direction", lambda r: {"primal_part": r["primal_part"]}, "has no field 'totals'"),
        ("step", lambda r: {**r, "step": np.ones(3)}, "field 'step' has shape (3,)"),
        ("step", lambda r: {**r, "coherence": np.array([np.nan])}, "field 'coherence'"),
        ("step", lambda r: {"changes": r["changes"], "step": r["step"]},
         "has no field 'coherence'"),
        # The dual changes come with the step (every active party's reply).
        ("step", lambda r: {**r, "changes": far}, "chunk ids outside"),
        ("step", lambda r: {k: v for k, v in r.items() if k != "changes"},
         "has no field 'changes'"),
    ]
    for kind, garble, needle in cases:
        raises_hyfl(_coordinate(d, kind, garble), needle)
    # A party other than the judge: its step reply must carry its changes too.
    for garble, needle in [(lambda r: {**r, "changes": far}, "chunk ids outside"),
                           (lambda r: {k: v for k, v in r.items() if k != "changes"},
                            "party 1's reply to 'step' has no field 'changes'")]:
        config = DeployConfig.from_run_config(d["run"])
        transport = GarblingTransport(d["nodes"], d["run"], "step", garble, party=1)
        raises_hyfl(Coordinator(config, transport, make_cipher("none").public(),
                                log=lambda line: None).run, needle)


def _bundled(buffer, layout, spec='{"t":"dict","v":{}}'):
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({"hyfl": ConfigRecord({"spec": spec, "layout": layout,
                                             "bundle": buffer.tobytes()})})


def test_flower_replies_that_are_not_hyfl_messages():
    from types import SimpleNamespace

    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from hyfl.deploy.app import FlowerTransport, pack

    transport = FlowerTransport(grid=None, cipher=server_cipher("none", None))

    def reply(content):
        return SimpleNamespace(has_error=lambda: False, error=None, content=content)

    cases = [
        (RecordDict({}), "message from party 2 is not a hyfl message"),
        (RecordDict({"arrays": ArrayRecord({})}), "is not a hyfl message"),
        (RecordDict({"hyfl": ConfigRecord({"spec": "{"})}), "is not a hyfl message"),
        (RecordDict({"hyfl": ConfigRecord({"spec": "{", "layout": "[]", "bundle": 3})}),
         "is not a hyfl message"),
        (_bundled(np.zeros(0, np.uint8), "[]", spec="{"),
         "message from party 2 has no readable description"),
        # The array bundle: sizes that do not add up, dtypes that are not numbers.
        (_bundled(np.zeros(8, np.uint8), '[["0", "<f8", [100]]]'), "garbled array bundle"),
        (_bundled(np.zeros(16, np.uint8), '[["0", "<f8", [1]]]'), "8 bytes left over"),
        (_bundled(np.zeros(8, np.uint8), '[["0", "|O", [1]]]'), "garbled array bundle"),
        (_bundled(np.zeros(8, np.uint8), '[["0", "<f8", [-1]]]'), "garbled array bundle"),
        (_bundled(np.zeros(8, np.uint8), '{"0": 1}'), "garbled array bundle"),
        (_bundled(np.zeros(8, np.uint8), "[["), "garbled array bundle"),
        (pack(*encode({"x": 1})), None),
    ]
    for content, needle in cases:
        if needle is None:
            assert transport._read(reply(content), 2, "round") == {"x": 1}
        else:
            raises_hyfl(lambda c=content: transport._read(reply(c), 2, "round"), needle)


# ----------------------------------------------------------------------------- key files


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory):
    return generate_keys(tmp_path_factory.mktemp("fuzzkeys"), 256, insecure_test_keys=True)


def _load_both(path):
    """Both ways a key file is read; each must be a HyflError or a valid key."""
    outcomes = []
    for private in (True, False):
        outcomes.append(hyfl_or_ok(lambda p=private: load_key(path, private=p,
                                                              insecure_test_keys=True)))
    return outcomes


def test_key_files_random_garbling(tmp_path, key_pair):
    private, _ = key_pair
    text = private.read_text()
    rng = np.random.default_rng(SEED + 4)
    refused = 0
    for i in range(N_RANDOM):
        chars = list(text)
        for _ in range(1 + rng.integers(4)):  # flip, drop or cut
            at = int(rng.integers(max(len(chars), 1)))
            how = rng.integers(3)
            if how == 0 and chars:
                chars[at] = chr(int(rng.integers(32, 127)))
            elif how == 1 and chars:
                del chars[at]
            else:
                chars = chars[:at]
        path = tmp_path / f"garbled-{i}.json"
        path.write_text("".join(chars))
        refused += sum(_load_both(path))
    assert refused >= N_RANDOM  # at least one of the two readings refuses most garblings


def test_key_files_hand_written(tmp_path, key_pair):
    private, public = key_pair
    record = json.loads(private.read_text())
    n, p, q = (int(record[x], 16) for x in ("n", "p", "q"))

    def write(name, content):
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    def forged(**change):
        return {**record, **change}

    small_n = 3 * 5
    cases = [  # (file content, needs the private key?, needle)
        ("not json", True, "is not a hyfl-paillier-key file"),
        (b"\xff\xfe\x00garbage", True, "is not a hyfl-paillier-key file"),
        ([1, 2, 3], False, "is not a hyfl-paillier-key file"),
        ("[" * 10000, False, "is not a hyfl-paillier-key file"),
        ({"format": "hyfl-paillier-key"}, True, "kind None"),
        ({k: v for k, v in record.items() if k != "n"}, True, "no valid 'n'"),
        ({k: v for k, v in record.items() if k != "p"}, True, "no valid 'p'"),
        (forged(n="0x0"), True, "no valid 'n'"),
        (forged(n="-0x5"), True, "no valid 'n'"),
        (forged(n="zz"), True, "no valid 'n'"),
        (forged(n=12345), True, "no valid 'n'"),
        (forged(n="0x" + "f" * 5000), True, "no valid 'n'"),
        (forged(key_bits=4096), True, "key_bits"),
        (forged(fingerprint="0" * 32), True, "fingerprint"),
        (forged(q=hex(q + 2)), True, "do not multiply"),
        (forged(p=hex(n), q="0x1"), True, "do not multiply"),
        (forged(kind="secret"), True, "kind 'secret'"),
        (forged(n=hex(small_n), key_bits=4, fingerprint=fingerprint(small_n), p="0x3",
                q="0x5"), True, "fewer than the 2048"),
        (record, False, "holds the private key, but the server"),  # private for public
        (json.loads(public.read_text()), True, "holds only the public key"),  # and back
    ]
    for i, (content, needs_private, needle) in enumerate(cases):
        path = write(f"case-{i}.json", content)
        strict = needle == "fewer than the 2048"
        raises_hyfl(lambda p=path, k=needs_private, s=strict: load_key(
            p, private=k, insecure_test_keys=not s), needle)
    # The real 256-bit key itself is refused without the explicit test flag.
    raises_hyfl(lambda: load_key(public, private=False), "fewer than the 2048")
    raises_hyfl(lambda: server_cipher("paillier", private, insecure_test_keys=True),
                "server must only ever hold the public key")
