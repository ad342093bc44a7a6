"""A party's guard: which of the server's messages it answers, when, and how often.

A deployed party decrypts what the server sends and returns values computed
from it. An honest server sends each message kind once per round, in the
protocol's order, rounds in increasing order, and restarts a round only when
a party went missing (each restart without at least one more party). A
server that sends well-formed messages of its own choosing could otherwise
query a party again and again: send ``hello`` mid-run to reset it, restart
one round for ever, ask the judge for the step of chosen sums a thousand
times, or hand a party its own "stale" duals every round. The guard holds a
party to the honest protocol's shape:

* ``hello`` and ``setup`` once per run (a repeated ``hello`` before the
  set-up is answered again: the server may have missed the first reply);
* rounds never go back, nor beyond the job's number of rounds; a round may be
  restarted at most ``n_parties - 1`` times (every honest restart drops a
  missing party) -- so a run asks a party at most ``rounds * n_parties``
  attempts' worth of questions;
* within one attempt of a round, each kind at most once
  (:data:`ONCE_PER_ATTEMPT`), the checkpoint decision at most
  :data:`CERTIFY_MAX` times, and each only after the kind it follows in the
  protocol (:data:`AFTER`);
* ``weights`` only where the round said they follow (a returning party, or
  one told to wait for the refreshed weights);
* stale duals only for a party that really missed a round: not in the round
  right after one it took part in to the end;
* the set-up's partition is the one the parties announced: each party's
  ``hello`` carries a fresh nonce and a tag over its ids and sizes, keyed
  with a secret derived from the private key (which the server lacks), and
  ``setup`` must relay every party's announcement unchanged
  (:func:`check_announcements`), with the regularization they agree on.
  The checked nonces are also the run's identity
  (:func:`hyfl.privacy.tags.run_identity`), which keys the run's tags.

Values the server computes are held to what an honest server can send where
the party can bound them: the cocoa subproblem's ``coef`` (:func:`check_coef`).

What the guard does *not* do: it bounds how often the server can ask, not
what one question reveals. A single forged ciphertext in one allowed message
still decrypts into the reply (docs/privacy.md, "An active server").

The guard's state is a small dict kept in the party's state beside, not
inside, the round's snapshot: undoing an abandoned round does not give back
its attempts. A message the guard refuses is a
:class:`~hyfl.errors.HyflError`; the transport then refuses every later
message of the run (see :mod:`hyfl.deploy.app`).
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

from hyfl.algorithms.hyfdca_round import PHASES
from hyfl.errors import fail

__all__ = ["AFTER", "CERTIFY_MAX", "FORGED_FIX", "ONCE_PER_ATTEMPT", "Guard", "announcement_tag",
           "check_announcements", "check_coef", "coef_bounds"]

#: Kinds a party answers at most once per attempt of a round (the round script's).
ONCE_PER_ATTEMPT = tuple(name for name, phase in PHASES.items() if phase.per_attempt == 1)
#: Checkpoint decisions per attempt: one, and after an accepted one the next checkpoint
#: may be decided at once (hyfl.algorithms.hyfdca_parties.Server.cocoa_certify_request).
CERTIFY_MAX = PHASES["certify"].per_attempt
#: The kind a party must have answered in the same attempt before each of these.
AFTER = {name: phase.after for name, phase in PHASES.items() if phase.after}

FORGED_FIX = ("The server does not follow hyfl's protocol (a bug, or a forged message); the "
           "party answers no more messages of this run.")


class Guard:
    """The round control of one party, on the ``state`` dict it keeps (see the module).

    Parameters
    ----------
    state : dict
        The guard's part of the party's state (updated in place); empty for a
        new party.
    party : int
        The party's index (named in errors).
    """

    def __init__(self, state: dict, party: int):
        self.state, self.party = state, party
        for key, value in (("phase", "new"), ("t", 0), ("attempts", 0), ("done", []),
                           ("certify", 0), ("closed", 0), ("weights_due", False)):
            state.setdefault(key, value)

    def _refuse(self, problem: str):
        return fail(f"party {self.party}", problem, FORGED_FIX)

    # -- the run -------------------------------------------------------------------------
    def hello(self) -> None:
        """A ``hello``: only before the set-up."""
        if self.state["phase"] not in ("new", "hello"):
            raise self._refuse("got a second 'hello' after its set-up (it would reset the party)")
        self.state["phase"] = "hello"

    def setup(self) -> None:
        """The ``setup``: once, after ``hello``."""
        phase = self.state["phase"]
        if phase != "hello":
            raise self._refuse("got a 'setup' message " + ("before 'hello'" if phase == "new"
                                                            else "a second time"))
        self.state["phase"] = "running"

    def finish(self) -> None:
        """The run ended: nothing but ``ping`` is answered any more."""
        self.state["phase"] = "finished"

    # -- rounds --------------------------------------------------------------------------
    def open_round(self, t: int, stale: bool, n_parties: int, rounds: int) -> None:
        """A ``round`` message for round ``t`` (``stale``: it carries stale duals) of a
        run of ``n_parties`` and ``rounds`` rounds (the job's run config)."""
        last = self.state["t"]
        if not 1 <= t <= rounds:
            raise self._refuse(f"was sent round {t} of a run of {rounds} rounds")
        if t < last:
            raise self._refuse(f"was sent round {t} after round {last} (rounds never go back)")
        if t <= self.state["closed"]:
            raise self._refuse(f"was sent round {t} again after it stood (its commit was "
                               "delivered)")
        attempts = self.state["attempts"] + 1 if t == last else 1
        if attempts > max(n_parties, 1):
            raise self._refuse(f"was sent round {t} for the {attempts}th time; an honest server "
                               f"restarts a round only without a missing party, at most "
                               f"{n_parties - 1} times")
        if stale and t == self.state["closed"] + 1:
            raise self._refuse(f"was sent stale duals in round {t}, right after round "
                               f"{self.state['closed']}, which it took part in to the end")
        self.state.update(t=int(t), attempts=attempts, done=[], certify=0, weights_due=False)

    def expect_weights(self) -> None:
        """The round said the weights follow in a ``weights`` message."""
        self.state["weights_due"] = True

    def closed(self, t: int) -> None:
        """Round ``t`` stands with this party in it (its commit was delivered)."""
        self.state["closed"] = max(int(t), self.state["closed"])

    def admit(self, kind: str) -> None:
        """Refuse a kind the protocol does not allow here (before anything is decoded)."""
        done = self.state["done"]
        if self.state["phase"] == "finished" and kind != "ping":
            raise self._refuse(f"was sent {kind!r} after the run finished")
        if kind == "weights" and not self.state["weights_due"]:
            raise self._refuse("was sent 'weights' in a round that did not announce them")
        if kind in ONCE_PER_ATTEMPT and kind in done:
            raise self._refuse(f"was sent {kind!r} twice in one attempt of round "
                               f"{self.state['t']}")
        if kind == "certify" and self.state["certify"] >= CERTIFY_MAX:
            raise self._refuse(f"was asked for more than {CERTIFY_MAX} checkpoint decisions in "
                               f"one attempt of round {self.state['t']}")
        before = AFTER.get(kind)
        if before is not None and before not in done:
            raise self._refuse(f"was sent {kind!r} before {before!r} in round {self.state['t']}")

    def answered(self, kind: str) -> None:
        """The party answered ``kind`` in this attempt."""
        if kind == "certify":
            self.state["certify"] += 1
        elif kind not in self.state["done"]:
            self.state["done"].append(kind)
        if kind == "weights":
            self.state["weights_due"] = False


# -- values the server computes, within what an honest one sends -----------------------
#: Relative slack on :func:`coef_bounds` (the server divides in floating point too).
_COEF_SLACK = 1e-9


def coef_bounds(n_parties: int, n_samples: int, lam: float) -> tuple[float, float]:
    """The cocoa subproblem's scaling an honest server sends: ``sigma / (lam * N)``.

    ``sigma`` stays between :data:`~hyfl.algorithms.hyfdca_local.SIGMA_FLOOR` and its
    ceiling (:func:`~hyfl.algorithms.hyfdca_local.next_sigma`), which is the most
    parties adding on one feature (at most ``n_parties``) times the most samples one
    party updates (at most ``N``): ``coef`` is in
    ``[SIGMA_FLOOR / (lam N), n_parties / lam]``.
    """
    from hyfl.algorithms.hyfdca_local import SIGMA_FLOOR

    scale = float(lam) * int(n_samples)
    return SIGMA_FLOOR / scale, max(int(n_parties), 1) * int(n_samples) / scale


def check_coef(coef, n_parties: int, n_samples: int, lam: float, kind: str, party: int
               ) -> float:
    """``coef`` of a server's ``kind`` message, refused outside :func:`coef_bounds`.

    Why: the party solves its subproblem with it and returns the proposals; a
    server choosing it (zero, negative, huge) chooses what the proposals are a
    function of, outside anything the protocol computes.
    """
    low, high = coef_bounds(n_parties, n_samples, lam)
    value = float(coef)
    if not (np.isfinite(value) and low * (1 - _COEF_SLACK) <= value <= high * (1 + _COEF_SLACK)):
        raise fail(f"the server's {kind!r} message to party {party}",
                   f"field coef is {value!r}, outside [{low:g}, {high:g}] (sigma / (lam N) "
                   "with sigma between its floor and ceiling)", FORGED_FIX)
    return value


# -- the set-up's partition, authenticated ----------------------------------------------

def announcement_tag(secret: bytes, party: int, sizes: tuple[int, int, int],
                     lam_default: float, samples: np.ndarray, features: np.ndarray,
                     nonce: bytes) -> bytes:
    """A party's tag over what its ``hello`` announces (keyed BLAKE2b, 32 bytes).

    ``sizes`` = (n_samples, n_features, n_outputs) of the data set; ``nonce``
    the party's fresh 16 bytes, so that an announcement of another run does
    not verify.
    """
    mac = hashlib.blake2b(key=secret, digest_size=32, person=b"hyfl announce")
    mac.update(np.array([party, *sizes], dtype="<i8").tobytes())
    mac.update(np.array([lam_default], dtype="<f8").tobytes())
    for ids in (samples, features):
        ids = np.asarray(ids, dtype="<i8")
        mac.update(np.array([ids.size], dtype="<i8").tobytes())
        mac.update(ids.tobytes())
    mac.update(nonce)
    return mac.digest()


def check_announcements(secret: bytes, party: int, own_nonce: bytes, setup: dict,
                        samples: list, features: list, lam: float) -> None:
    """Refuse a set-up whose partition or regularization the parties did not announce.

    ``setup`` is the message (its ``nonces``, ``tags`` and ``lam_defaults`` rows,
    one per party); ``samples``/``features`` its per-party ids; ``lam`` the job's
    regularization (0: the data's default, which every party must announce
    alike).
    """
    culprit = f"the server's 'setup' message to party {party}"
    K = len(samples)
    nonces, tags, defaults = setup.get("nonces"), setup.get("tags"), setup.get("lam_defaults")
    if (nonces is None or tags is None or defaults is None or nonces.shape != (K, 16)
            or tags.shape != (K, 32) or defaults.shape != (K,)):
        raise fail(culprit, "does not relay every party's announcement (nonce, tag, "
                   "regularization)", FORGED_FIX)
    if bytes(nonces[party].astype(np.uint8)) != own_nonce:
        raise fail(culprit, "relays another nonce than the one this party announced", FORGED_FIX)
    sizes = (int(setup["n_samples"]), int(setup["n_features"]), int(setup["n_outputs"]))
    for k in range(K):
        expected = announcement_tag(secret, k, sizes, float(defaults[k]), samples[k],
                                    features[k], bytes(nonces[k].astype(np.uint8)))
        if not hmac.compare_digest(expected, bytes(tags[k].astype(np.uint8))):
            raise fail(culprit, f"holds a partition or sizes that party {k} did not announce",
                       FORGED_FIX)
    agreed = lam if lam > 0 else float(defaults[0])
    if lam == 0 and np.any(defaults != defaults[0]):
        raise fail(culprit, "sets the data's default regularization, but the parties announced "
                   "different ones", FORGED_FIX)
    if float(setup["lam"]) != agreed:
        raise fail(culprit, f"sets lam = {setup['lam']!r}, not the job's {agreed!r}", FORGED_FIX)
