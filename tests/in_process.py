"""The coordinator's transport to parties in this process (the real codec and
:func:`~hyfl.deploy.party.handle_message`, no network), recording every message."""

from __future__ import annotations

from dataclasses import dataclass

from hyfl.deploy.codec import decode, encode
from hyfl.deploy.party import handle_message


@dataclass
class Record:
    """One message a party handled: what it was sent, its state before and after."""

    party: int
    kind: str
    message: tuple
    before: tuple | None
    after: tuple
    cipher: object  # the server's (public key only): decodes the ciphertexts

    @property
    def payload(self) -> dict:
        """The message as the server built it (to alter and send again)."""
        return decode(*self.message, self.cipher)


class DeliveringTransport:
    """What a coordinator's transport to parties in this process does with ``_deliver(k,
    kind, payload)`` (a subclass's: the decoded reply, or None when the party is missing)."""

    sent_bytes = received_bytes = 0  # the coordinator reads these

    def connect(self, n_parties, timeout, hello):
        return {k: self._deliver(k, "hello", hello) for k in range(n_parties)}

    def exchange(self, messages, timeout):
        replies, missing = {}, set()
        for k, (kind, payload) in messages.items():
            reply = self._deliver(k, kind, payload)
            if reply is None:
                missing.add(k)
            else:
                replies[k] = reply
        return replies, missing

    def post(self, k, kind, payload):
        return self._deliver(k, kind, payload) is not None

    def poll(self, handle):
        return "replied" if handle else "failed"


class RecordingTransport(DeliveringTransport):
    """The coordinator's transport to per-message parties in this process, recording all.

    ``forge(party, kind, payload)``, if given, replaces each message before it is sent
    (a dishonest server's alterations).
    """

    def __init__(self, nodes, run_config, cipher, forge=None):
        self.nodes, self.run_config, self.cipher, self.forge = nodes, run_config, cipher, forge
        self.states = dict.fromkeys(range(len(nodes)))
        self.records: list[Record] = []
        self.sent_bytes = self.received_bytes = 0  # the coordinator reads these

    def sent(self, k: int, kind: str) -> dict:
        """The last ``kind`` message party ``k`` was sent, decoded."""
        return next(r for r in reversed(self.records) if r.party == k and r.kind == kind).payload

    def _deliver(self, k, kind, payload):
        if self.forge is not None:
            payload = self.forge(k, kind, payload)
        message = encode(payload)
        before = self.states[k]
        reply, self.states[k] = handle_message(kind, message, before, self.nodes[k],
                                               self.run_config)
        self.records.append(Record(k, kind, message, before, self.states[k], self.cipher))
        return decode(*reply, self.cipher)


def certificate_shares(monkeypatch) -> list:
    """Record the round certificate's shares the clients compute
    (``hyfdca_parties._evaluation_terms``) for :func:`secrets_without`.

    They are encrypted like every other value and only their sum is opened, on purpose.
    From the zero model they are simple fractions (4/120 = 1/30) that public integers --
    a ciphertext's addend count, the round number, a coherence of 1 -- match at some
    scale, so the privacy audits leave them out of the private values they look for (the
    opened sums are checked where they are received).
    """
    from hyfl.algorithms import hyfdca_parties

    shares: list = []
    terms = hyfdca_parties._evaluation_terms
    monkeypatch.setattr(hyfdca_parties, "_evaluation_terms",
                        lambda *args: shares.append(terms(*args)) or shares[-1])
    return shares


def secrets_without(secrets, shares) -> list:
    """The recorded plaintexts without the certificate's shares (:func:`certificate_shares`)."""
    import numpy as np

    shared = np.concatenate(shares) if shares else np.empty(0)
    recorded = [np.asarray(x, dtype=float).ravel() for x in secrets]
    return [x[~np.isin(x, shared)] for x in recorded]


class AlteringTransport(RecordingTransport):
    """A recording transport that also keeps every reply, and lets the server alter it
    (``alter(party, kind, reply) -> reply``) before the coordinator reads it."""

    def __init__(self, nodes, run, cipher, forge=None, alter=None):
        super().__init__(nodes, run, cipher, forge)
        self.alter, self.replies = alter, []

    def _deliver(self, k, kind, payload):
        reply = super()._deliver(k, kind, payload)
        self.replies.append((k, kind, reply))
        return reply if self.alter is None else self.alter(k, kind, reply)

    def reply(self, k: int, kind: str) -> dict | None:
        """Party ``k``'s last reply to ``kind`` (None: it gave none)."""
        return next((r for p, q, r in reversed(self.replies) if p == k and q == kind), None)


def party_files_deployment(files, keys, *, forge=None, alter=None, iterations=2,
                           id_column="customer", label_column="income", **run_extra):
    """A coordinator and its :class:`AlteringTransport` for parties with their own
    ``files`` (ckks, test keys ``(private, public)``), in this process."""
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.coordinator import Coordinator
    from hyfl.deploy.keys import server_cipher

    private, public = keys
    run = run_config_for(parties=len(files), iterations=iterations, cipher="ckks", lam=0.05,
                         public_key=str(public), insecure_test_keys=True, **run_extra)
    nodes = [{"party": k, "key": str(private), "cipher": "ckks", "insecure-test-keys": True,
              "data": str(path), "id-column": id_column, "label-column": label_column}
             for k, path in enumerate(files)]
    config = DeployConfig.from_run_config(run)
    server = server_cipher("ckks", public, **config.cipher_options(), insecure_test_keys=True)
    transport = AlteringTransport(nodes, run, server, forge, alter)
    return Coordinator(config, transport, server, log=lambda line: None), transport


def refusal_of(coordinator) -> str | None:
    """The run's refusal, the error's text (None: it finished)."""
    from hyfl.errors import HyflError

    try:
        coordinator.run()
    except HyflError as error:
        return str(error)
    return None


def paillier_parties(tmp, parties: int, rounds: int, sample_blocks: int = 1,
                     participation: str = "0.67", seed: int = 1) -> dict:
    """Everything of a small encrypted deployment but its run: 256-bit test keys, a
    synthetic problem's blocks on a ``sample_blocks x (parties / sample_blocks)`` grid,
    the parties' node configs, the run config and the server's public cipher
    (``{"public", "nodes", "cipher", "config"}``)."""
    from hyfl.deploy.blocks import write_blocks
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.keys import generate_keys, server_cipher
    from hyfl.partition import grid
    from hyfl.problem import make_problem
    from synthetic_data import synthetic

    private, public = generate_keys(tmp / "keys", 256, insecure_test_keys=True)
    problem = make_problem(synthetic(n=60, m=6), "hinge", 0.05)
    partition = grid(problem.n_samples, problem.n_features, sample_blocks,
                     parties // sample_blocks)
    files = write_blocks(problem, partition, tmp / "blocks", lam_default=problem.lam)
    nodes = [{"party": k, "key": str(private), "cipher": "paillier",
              "insecure-test-keys": True, "data": str(f)} for k, f in enumerate(files)]
    config = run_config_for(parties=parties, iterations=rounds, cipher="paillier",
                            public_key=str(public), seed=seed, insecure_test_keys=True,
                            participation=participation)
    cipher = server_cipher("paillier", public,
                           **DeployConfig.from_run_config(config).cipher_options(),
                           insecure_test_keys=True)
    return {"public": public, "nodes": nodes, "cipher": cipher, "config": config}
