"""What a deployed run is told: the run config (the job) and each node's config (the party).

Flower hands every ServerApp and ClientApp two flat mappings:

* the **run config** (``flwr run ... --run-config``; defaults in the app's
  ``pyproject.toml``, see :data:`RUN_DEFAULTS`): the job, the same for
  everybody -- number of parties, algorithm and hyperparameters, budget,
  participation, cipher and its encoding, timeouts, and for parties that load
  a block of a named dataset the dataset and partition spec;
* the **node config** (``flower-supernode --node-config``; see
  :data:`NODE_KEYS`): the party -- its index, its private key file, its data,
  where it may write its final state, and its security policy: the cipher it
  runs, optionally the key fingerprint it insists on, and whether it admits
  insecure test keys. It stays with the machine, and no job can change it: a
  job asking for another cipher (``none`` included) or another key is refused.

:class:`DeployConfig` and :class:`NodeSettings` validate them; every problem
is a :class:`~hyfl.errors.HyflError` naming the key and the fix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl.errors import HyflError, JobRefused, check_choice, check_int, check_positive, fail

__all__ = [
    "NODE_HELP",
    "NODE_KEYS",
    "RUN_DEFAULTS",
    "RUN_HELP",
    "DeployConfig",
    "NodeSettings",
    "structure_blocks",
]

#: Run config keys and their defaults (the generated app's ``[tool.flwr.app.config]``;
#: what each means: :data:`RUN_HELP`).
RUN_DEFAULTS: dict[str, Any] = {
    "parties": 0,  # required: 0 is refused
    "algorithm": "hyfdca",
    # HyFDCA hyperparameters, e.g. "local_steps=2" or "local_steps=2,step_rule=safe"; without
    # step_rule, HyFDCA's own default (cocoa). Every step rule is deployed.
    "hyper": "",
    "iterations": 10,
    "participation": "full",
    "seed": 0,
    "loss": "hinge",
    "lam": 0.0,
    "partition": "",
    # An intercept: a constant feature of this value (0: none); features divided by their
    # standard deviation from the parties' secure sum.
    "intercept": 0.0,
    "standardize": False,
    "cipher": "paillier",
    "precision-bits": 32,
    "guard-bits": 24,
    "public-key": "",
    "insecure-test-keys": False,
    "out": "",
    "reply-timeout": 120.0,
    "connect-timeout": 300.0,
    "poll": 0.05,
    "min-common": 1,
    # Scoring new rows (hyfl deploy predict): a model file on the server's machine; the
    # job then aligns the parties' files and gives party `asker` its rows' scores.
    "model": "",
    "asker": 0,
}

#: One line per run config key: what it means (the generated app's comments and README).
RUN_HELP: dict[str, str] = {
    "parties": "K, the number of parties (one SuperNode each); required",
    "algorithm": "hyfdca (the one algorithm deployed)",
    "hyper": 'HyFDCA hyperparameters, e.g. "local_steps=50,step_rule=safe"',
    "iterations": "outer iterations (rounds)",
    "participation": "full, a fraction p, cyclic:C or trace:FILE",
    "seed": "seed of the participation schedule and the draws",
    "loss": "hinge, logistic, squared or smoothed_hinge",
    "lam": "regularization; 0 = the data's default (reported by the parties)",
    "partition": "partition spec, for parties whose node config names a dataset, e.g. grid:2x2",
    "intercept": "value S of a constant feature each sample's first holder appends (an "
                 "intercept, as hyfl run --intercept S); 0: none",
    "standardize": "true divides every feature by its standard deviation, from a secure sum "
                   "of the parties' column sums (as hyfl run --standardize)",
    "cipher": "paillier, packed, ckks or none (no encryption: tests only); every party's own",
    "precision-bits": "fixed-point encoding, the same for all",
    "guard-bits": "fixed-point encoding, the same for all",
    "public-key": "the server's public-key.json, a path on the SuperLink's machine",
    "insecure-test-keys": "true admits a public key below 2048 bits (tests only)",
    "out": "results folder on the SuperLink's machine (deploy.json, weights.npz)",
    "reply-timeout": "seconds a party has to answer a message, or it is absent for the round",
    "connect-timeout": "seconds the parties have to connect at the start",
    "poll": "seconds between the server's pulls for replies",
    "min-common": "parties with their own files: fewest samples two or more of them must "
                  "share when their columns differ (0: no check)",
    "model": "a model.npz on the SuperLink's machine: the job scores the parties' rows "
             "with it instead of training (hyfl deploy predict); empty: train",
    "asker": "with model: the party that gets the scores of the rows it holds",
}

#: Node config keys a party understands.
NODE_KEYS = ("party", "key", "cipher", "fingerprint", "insecure-test-keys", "unchecked-rules",
             "data", "data-dir", "id-column", "label-column", "out", "state-dir")

#: One line per node config key: what it means (the generated app's README).
NODE_HELP: dict[str, str] = {
    "party": "this party's index 0 .. K-1 (required)",
    "key": "its private-key.json (required unless cipher='none')",
    "cipher": "the cipher this party runs: paillier (default with a key), packed, ckks, or "
              "none (no key; tests only); a job asking for another is refused",
    "fingerprint": "optional pin: the key fingerprint (from public-key.json) it accepts",
    "insecure-test-keys": "true admits keys below 2048 bits (tests only)",
    "unchecked-rules": "true admits the per-sample step rules (safe, theory, paper), whose "
                       "stored duals the party cannot check against a dishonest server",
    "data": "its own party file (CSV or Parquet with an id column, aligned with the others "
            "over the network), its block file party-K.npz, or a dataset name / LIBSVM file "
            "(required: a party reads only the data its node config names)",
    "data-dir": "folder with dataset files (for a dataset name)",
    "id-column": "its party file's sample id column (default id)",
    "label-column": "its party file's label column, if it has one (default label)",
    "out": "folder where the party writes party-K.npz (its final duals and weights)",
    "state-dir": "folder where the party keeps its state of each run after every message "
                 "(private to its user), so that a restarted SuperNode rejoins its run",
}

CIPHER_NAMES = ("paillier", "packed", "ckks", "none")


def _text(config: Mapping[str, Any], key: str) -> str:
    value = config.get(key, RUN_DEFAULTS.get(key, ""))
    if not isinstance(value, str):
        raise fail(f"run config {key}", f"is {value!r}, not a string", f'Write {key}="...".')
    return value.strip()


def _number(config: Mapping[str, Any], key: str) -> float:
    value = config.get(key, RUN_DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"run config {key}", f"is {value!r}, not a number", f"Write {key}=<number>.")
    return float(value)


def _flag(value: Any, culprit: str) -> bool:
    """A true/false config value (TOML booleans, or the words from a command line)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise fail(culprit, f"is {value!r}, not true or false", f"Write {culprit.split()[-1]}=true "
               "or leave it out (false).")


def _parse_hyper(text: str) -> dict[str, Any]:
    """``"local_steps=2, step_rule=safe"`` -> ``{"local_steps": 2, "step_rule": "safe"}``."""
    out: dict[str, Any] = {}
    for item in text.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise fail(f"run config hyper item {item!r}", "is not KEY=VALUE",
                       'Write hyper="local_steps=2,step_rule=safe".')
        value = value.strip()
        parsed: Any = {"true": True, "false": False}.get(value.lower(), value)
        if parsed is value:
            for convert in (int, float):
                try:
                    parsed = convert(value)
                    break
                except ValueError:
                    pass
        out[key.strip()] = parsed
    return out


@dataclass(frozen=True)
class DeployConfig:
    """The validated run config of a deployed HyFDCA job.

    Build it with :meth:`from_run_config`; the constructor only stores.
    Attribute names are the run config keys with ``-`` written ``_``.
    """

    parties: int
    algorithm: Any  # the validated HyFDCA
    hyper: dict = field(default_factory=dict)
    iterations: int = 10
    participation: str = "full"
    seed: int = 0
    loss: str = "hinge"
    lam: float = 0.0
    partition: str = ""
    intercept: float = 0.0
    standardize: bool = False
    cipher: str = "paillier"
    precision_bits: int = 32
    guard_bits: int = 24
    public_key: str = ""
    insecure_test_keys: bool = False
    out: str = ""
    reply_timeout: float = 120.0
    connect_timeout: float = 300.0
    poll: float = 0.05
    min_common: int = 1
    model: str = ""
    asker: int = 0

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> DeployConfig:
        """Validate a Flower run config (a flat mapping) into a :class:`DeployConfig`."""
        from hyfl.algorithms import make_algorithm
        from hyfl.algorithms.hyfdca import HyFDCA
        from hyfl.losses import LOSSES

        for key in config:
            _check_run_key(key)
        parties = config.get("parties", 0)
        parties = check_int("run config parties", parties, minimum=1,
                            fix="Set parties=K, the number of parties of the partition.")
        name = _text(config, "algorithm")
        hyper = _parse_hyper(_text(config, "hyper"))
        try:  # every step rule is deployed; without one, HyFDCA's own default (cocoa)
            algorithm = make_algorithm(name, hyper)
        except HyflError as err:  # name the run config keys it came from
            raise HyflError(f"run config algorithm={name!r} hyper={_text(config, 'hyper')!r}: "
                            f"{err}") from None
        if not isinstance(algorithm, HyFDCA):
            raise fail(f"run config algorithm {name!r}", "cannot be deployed",
                       "Deploy hyfdca: its server and clients exchange encrypted messages; "
                       "the other algorithms exist only in the simulation engine.")
        if algorithm.sip_scope == "paper":
            raise fail("hyper sip_scope", "'paper' is an accounting convention, not a protocol",
                       "Use sip_scope=all (the default).")
        iterations = check_int("run config iterations", config.get("iterations", 10), minimum=1)
        seed = check_int("run config seed", config.get("seed", 0), minimum=0)
        loss = check_choice("run config loss", _text(config, "loss"), LOSSES)
        lam = _number(config, "lam")
        if not math.isfinite(lam) or lam < 0:
            raise fail("run config lam", f"is {lam!r}",
                       "Pass lam > 0, or 0 for the data's default.")
        intercept = _number(config, "intercept")
        if not math.isfinite(intercept) or intercept < 0:
            raise fail("run config intercept", f"is {intercept!r}",
                       "Pass the constant feature's value S > 0 (1 as hyfl run does), or 0 "
                       "for no intercept.")
        cipher = check_choice("run config cipher", _text(config, "cipher"), CIPHER_NAMES)
        precision_bits = check_int("run config precision-bits", config.get("precision-bits", 32),
                                   minimum=0)
        guard_bits = check_int("run config guard-bits", config.get("guard-bits", 24), minimum=1)
        public_key = _text(config, "public-key")
        if cipher != "none" and not public_key:
            raise fail("run config public-key", "is not set",
                       "Pass the server's public key file (hyfl deploy keys writes "
                       "public-key.json), or cipher=none for an unencrypted test run.")
        timeouts = {}
        for key in ("reply-timeout", "connect-timeout", "poll"):
            timeouts[key] = check_positive(f"run config {key}", _number(config, key),
                                           fix=f"Pass {key} in seconds, > 0.")
        participation = _text(config, "participation") or "full"
        min_common = check_int("run config min-common", config.get("min-common", 1), minimum=0)
        asker = check_int("run config asker", config.get("asker", 0), minimum=0)
        if asker >= parties:
            raise fail("run config asker", f"is {asker}, not one of the parties 0..{parties - 1}",
                       "Name the party that gets the scores (asker=K).")
        return cls(
            parties=parties, algorithm=algorithm, hyper=hyper, iterations=iterations,
            participation=participation, seed=seed, loss=loss, lam=lam,
            partition=_text(config, "partition"), intercept=intercept,
            standardize=_flag(config.get("standardize", False), "run config standardize"),
            cipher=cipher,
            precision_bits=precision_bits, guard_bits=guard_bits, public_key=public_key,
            insecure_test_keys=_flag(config.get("insecure-test-keys", False),
                                     "run config insecure-test-keys"),
            out=_text(config, "out"), reply_timeout=timeouts["reply-timeout"],
            connect_timeout=timeouts["connect-timeout"], poll=timeouts["poll"],
            min_common=min_common, model=_text(config, "model"), asker=asker,
        )

    def cipher_options(self) -> dict[str, Any]:
        """Encoding parameters every party and the server must share."""
        return {"precision_bits": self.precision_bits, "guard_bits": self.guard_bits}

    def participation_schedule(self):
        from hyfl.participation import parse_participation

        return parse_participation(self.participation, self.parties)


def run_config_for(**values: Any) -> dict[str, Any]:
    """A complete run config: :data:`RUN_DEFAULTS` updated with ``values``
    (given with ``_`` or ``-``); ``None`` values are left at the default."""
    out = dict(RUN_DEFAULTS)
    for key, value in values.items():
        if value is None:
            continue
        name = key.replace("_", "-")
        _check_run_key(name)
        out[name] = value
    return out


def _check_run_key(key: str) -> None:
    """A run config key must be known; the data are not the job's to choose."""
    if key in ("data", "data-dir"):
        raise fail(f"run config key {key!r}", "is not the job's to set: a party reads only the "
                   "data its own node config names",
                   f"Set {key} in each party's node config (hyfl deploy party --{key}, or "
                   f"--node-config \"{key}='...'\"); the job gives the partition spec only.")
    if key not in RUN_DEFAULTS:
        raise fail(f"run config key {key!r}", "is not known",
                   f"Known keys: {', '.join(RUN_DEFAULTS)}.")


@dataclass(frozen=True)
class NodeSettings:
    """A party's node config: who it is, its data, and its own security policy.

    Keys (:data:`NODE_KEYS`): ``party`` (index), ``key`` (private key file),
    ``cipher`` (``paillier`` -- the default with a key --, ``packed``, or
    ``none``, which a party without a key must state explicitly),
    ``fingerprint`` (optional: the key fingerprint this party insists on),
    ``insecure-test-keys`` (admit a key below 2048 bits; tests only),
    ``unchecked-rules`` (admit the per-sample step rules with a private key:
    their stored duals are running sums of steps, which the party cannot
    check, so a dishonest server could read rows and labels through them),
    ``data`` (block file, dataset name or LIBSVM file: the only data the
    party reads), ``data-dir`` (where a named dataset's files are) and
    ``out`` (folder for the party's final state; optional).

    The policy comes only from here: :meth:`check_job` refuses a job whose
    run config asks for another cipher, :meth:`check_key` a server announcing
    another key.
    """

    party: int
    key: str = ""
    cipher: str = "paillier"
    fingerprint: str = ""
    insecure_test_keys: bool = False
    unchecked_rules: bool = False
    data: str = ""
    data_dir: str = ""
    id_column: str = "id"
    label_column: str = "label"
    out: str = ""
    state_dir: str = ""

    @classmethod
    def from_node_config(cls, config: Mapping[str, Any], n_parties: int | None = None
                         ) -> NodeSettings:
        """Validate a Flower node config (a flat mapping); ``n_parties`` bounds the index."""
        unknown = sorted(set(config) - set(NODE_KEYS))
        if unknown:
            raise fail(f"node config key {unknown[0]!r}", "is not known",
                       f"A party's node config takes: {', '.join(NODE_KEYS)}.")
        party = _node_party(config, n_parties)
        values = {}
        for key in ("key", "cipher", "fingerprint", "data", "data-dir", "id-column",
                    "label-column", "out", "state-dir"):
            value = config.get(key, {"id-column": "id", "label-column": "label"}.get(key, ""))
            if not isinstance(value, str):
                raise fail(f"node config {key}", f"is {value!r}, not a string",
                           f"Quote it: --node-config \"{key}='...'\".")
            values[key.replace("-", "_")] = value.strip()
        cipher = _node_cipher(values.pop("cipher"), values["key"])
        insecure = _flag(config.get("insecure-test-keys", False), "node config insecure-test-keys")
        unchecked = _flag(config.get("unchecked-rules", False), "node config unchecked-rules")
        return cls(party=party, cipher=cipher, insecure_test_keys=insecure,
                   unchecked_rules=unchecked, **values)

    def check_job(self, config: DeployConfig) -> None:
        """Refuse a job whose cipher is not this party's (the job cannot switch encryption off),
        or that runs a step rule whose decryptions the party cannot check, unless admitted."""
        rule = config.algorithm.rule
        if not rule.subproblem and self.cipher != "none" and not self.unchecked_rules:
            raise fail(f"party {self.party}",
                       f"refuses the job: step rule {rule.name!r} keeps the duals as running sums "
                       "of steps, which a party cannot check against a dishonest server (it "
                       "could read rows and labels through them); only the cocoa rule's are "
                       "checked",
                       "Submit the job with the cocoa rule (the default), or admit the rule "
                       "in the party's node config if you trust the server: "
                       "hyfl deploy party --unchecked-rules.", error=JobRefused)
        if config.cipher != self.cipher:
            plain = (" (a party with a private key never sends its values in plaintext)"
                     if config.cipher == "none" else "")
            raise fail(f"party {self.party}",
                       f"refuses the job: the job asks for cipher {config.cipher!r}, but this "
                       f"party's policy (its node config) is cipher {self.cipher!r}{plain}",
                       f"Submit the job with cipher={self.cipher}; only the party's own node "
                       "config (hyfl deploy party --cipher) can change its cipher.",
                       error=JobRefused)

    def check_key(self, own: str, announced: Any) -> None:
        """Refuse a server that announces another key than this party's own (or pinned) one.

        Parameters
        ----------
        own : str
            Fingerprint of the party's key ("" for the ``none`` cipher).
        announced : str
            The fingerprint the server's ``hello`` names.
        """
        if not own:
            return
        if not isinstance(announced, str) or not announced:
            raise fail(f"party {self.party}", "refuses the job: the server did not say which "
                       f"public key it uses (this party's key is {own})",
                       "Run the server with the same hyfl version as the parties.",
                       error=JobRefused)
        if announced != own:
            raise fail(f"party {self.party}", f"refuses the job: the server's public key has "
                       f"fingerprint {announced}, this party's key {own}",
                       "Give the server the public-key.json written together with this party's "
                       "private-key.json by `hyfl deploy keys`.", error=JobRefused)


def _node_party(config: Mapping[str, Any], n_parties: int | None) -> int:
    """The node config's party index, checked against the run's number of parties."""
    if "party" not in config:
        raise fail("node config party", "is not set",
                   'Start the SuperNode with --node-config "party=K key=\'...\'" '
                   "(K = 0, 1, ... the party's index in the partition).")
    party = config["party"]
    if isinstance(party, bool) or not isinstance(party, int) or party < 0:
        raise fail("node config party", f"is {party!r}, not a party index",
                   "Pass party=K with K = 0, 1, ... (an integer).")
    if n_parties is not None and party >= n_parties:
        raise fail("node config party", f"is {party}, but the run has {n_parties} parties",
                   f"Number the parties 0 to {n_parties - 1}.")
    return party


def _node_cipher(cipher: str, key: str) -> str:
    """The party's cipher: ``paillier`` by default with a key; ``none`` only if stated."""
    if not cipher:
        if not key:
            raise fail("node config key", "is not set: a party needs the private key",
                       "Pass key='/path/private-key.json' (written by `hyfl deploy keys`); a "
                       "party without encryption (tests only) must say cipher='none'.")
        cipher = "paillier"
    check_choice("node config cipher", cipher, CIPHER_NAMES)
    if cipher == "none" and key:
        raise fail("node config cipher", "is 'none', but a private key is set",
                   "A party with a key encrypts: drop cipher='none', or drop key for an "
                   "unencrypted test party.")
    if cipher != "none" and not key:
        raise fail("node config key", f"is not set: a party with cipher {cipher!r} needs the "
                   "private key", "Pass key='/path/private-key.json' (from `hyfl deploy keys`).")
    if cipher != "none" and not os.path.isfile(key):
        raise fail(f"node config key {key!r}", "does not exist on this machine",
                   "Copy private-key.json (from `hyfl deploy keys`) here and pass its path.")
    return cipher


def structure_blocks(n_samples: int, n_features: int, samples, features):
    """The block structure of a partition (who holds which sample and feature), no values.

    What :func:`~hyfl.algorithms.hyfdca_parties.public_info` needs, built from
    the ids alone: the stacked layout of a partition over an empty matrix.
    """
    from hyfl.partition import Partition, stack

    partition = Partition(int(n_samples), int(n_features),
                          tuple(np.asarray(s, dtype=np.int64) for s in samples),
                          tuple(np.asarray(f, dtype=np.int64) for f in features))
    return stack(partition, sp.csr_matrix((int(n_samples), int(n_features))))
