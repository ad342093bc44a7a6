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


class RecordingTransport:
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

    def connect(self, n_parties, timeout, hello):
        return {k: self._deliver(k, "hello", hello) for k in range(n_parties)}

    def exchange(self, messages, timeout):
        replies = {k: self._deliver(k, kind, payload) for k, (kind, payload) in messages.items()}
        return replies, set()

    def post(self, k, kind, payload):
        return self._deliver(k, kind, payload) is not None

    def poll(self, handle):
        return "replied" if handle else "failed"
