"""The ``cocoa`` rule's certificate: a dual that never falls, whatever the participation.

Why it is needed
----------------
A round's line search knows the dual's change exactly only when every holder
of every sample the round moves takes part: the primal image ``A d`` of the
move and the margins ``x_i^T w`` both need each holder's features. An absent
holder adds its part of the image when it returns, and its part of a margin
is as old as its last round. With few clients a round the estimate can be
wildly wrong (ijcnn1 3x3 at participation 0.1: the true dual fell from 0 to
-8 within five rounds, docs/convergence.md section 5), and no bound on the
unknown part is both provable and tight (a block's spectral norm is thousands
of times its rows' norms on such data).

What it does
------------
The rule therefore separates the *iterate it explores* from the *iterate it
certifies*. Exploration (the round of :mod:`hyfl.algorithms.hyfdca`) moves
on as before. At the end of a round a *checkpoint* of the duals is opened;
every client whose block image the server holds for an older copy of its
duals (a *stale* client) sends the image of its checkpoint duals the next
time it takes part. Once none is missing, the server knows the checkpoint's
primal image exactly, and with the conjugate sum ``sum_i l*(-alpha_i)``
(kept up to date from the line searches' sums, which the clients send
anyway) its dual value. If that is at least the certified dual, the
checkpoint becomes the certified pair; otherwise the certified pair stays
and exploration restarts from it: the server sets every block image, and its
ciphertexts of the duals, back to the certified ones it kept (no arithmetic
on ciphertexts beyond additions), and every client sets its copy to the
certified duals it kept. The state is consistent again, and the
exploration's step is damped for a while (``trust``), so that at low
participation it does not overshoot again at once. The certified dual never
falls, and the certified weights are the exact image of the certified duals.

(A step part of the way along the segment to a fallen checkpoint could keep
more of the exploration's work -- for the hinge the dual along it is known
exactly from the same sums -- but the server would need to scale
ciphertexts, and every other loss a pass over the samples.)

With every holder of every moved sample active and a consistent state, the
round's own line search is exact; the round is then certified at once
without comparison (so full participation runs exactly as before).

Everything here is a pure function of arrays or a small state record, used
by the stacked engine and the message-level parties alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hyfl.losses import Loss

EVENTS = {"leave": 0, "checkpoint": 1, "accept": 2, "reject": 3}
"""What a client is told of the certificate, in order (codes as sent): the exploration
left the certified pair (certified := its copy), a checkpoint was taken (checkpoint := its
copy), the checkpoint was accepted (certified := checkpoint), or it fell (copy :=
certified)."""

TRUST_FLOOR = 1.0 / 64.0
"""Smallest factor on the exploration's step after repeated overshoots."""
_TRUST_RECOVER = 2.0
"""Per accepted checkpoint, the trust factor grows by this much (up to 1)."""
_TRUST_CUT = 0.25
"""Per fallen checkpoint, the trust factor shrinks by this much (down to TRUST_FLOOR)."""
ACCEPT_TOLERANCE = 1e-10
"""A checkpoint whose dual is below the certified one by at most this fraction of the
certified dual's magnitude (plus the same absolute amount) is taken as is: rounding in
the sums (fixed-point encrypted sums of conjugate changes over many rounds), not a fall."""


def evaluation_size(n_outputs: int) -> int:
    """Values of a client's part of a round's reported certificate (objective, dual and
    accuracy of the round's start, summed over the clients before any is opened): loss and
    conjugate terms per output and the correct predictions."""
    return 2 * n_outputs + 1


@dataclass
class Certificate:
    """The certified pair and the open checkpoint (see the module docstring).

    Attributes
    ----------
    alpha : ndarray, shape (N, C)
        Certified duals.
    w : ndarray, shape (M, C)
        Their exact primal image ``A alpha``.
    conjugate : ndarray, shape (C,)
        Their conjugate sum ``sum_i l*(-alpha_ic)`` per output.
    stale : ndarray of bool, shape (K,)
        Clients whose block image in the server's ``w`` is of an older copy of
        their duals than the current one (they were absent when samples they
        hold moved).
    checkpoint : ndarray, shape (N, C), or None
        Duals awaiting certification.
    checkpoint_w : ndarray, shape (M, C), or None
        Their exact image (what the stale clients' images add up to).
    pending : ndarray of bool, shape (K,)
        Clients that have still to send their image of the checkpoint.
    trust : float
        The longest step the exploration's line search may take (at most 1), lowered
        after a fallen checkpoint.
    current : bool
        The certified pair is the exploration's current pair (``alpha`` and
        ``w`` above are then not maintained: the state's are read).
    opened_at : int
        Round at whose end the open checkpoint was taken.
    events : int
        Notices the server has for the clients so far (a client learns the ones it
        missed the next time it takes part: the certified pair was left, a
        checkpoint was taken, it was accepted or fell); see :data:`EVENTS`.
    cursor : ndarray of int, shape (K,)
        How many of them each client has been told.
    """

    alpha: np.ndarray
    w: np.ndarray
    conjugate: np.ndarray
    stale: np.ndarray
    checkpoint: np.ndarray | None
    checkpoint_w: np.ndarray | None
    pending: np.ndarray
    trust: float
    current: bool = True
    opened_at: int = -1
    events: int = 0
    cursor: np.ndarray | None = None
    # How many judges' changes the server's encrypted conjugate sums hold (each travels
    # with who made it, 3 ids, when a judge decides on a checkpoint).
    explored_changes: int = 0
    certified_changes: int = 0
    checkpoint_changes: int = 0
    # Each dual's last-changed round when the checkpoint opened (which copies differ).
    checkpoint_updated_at: np.ndarray | None = None

    @classmethod
    def zero(cls, n_samples: int, n_features: int, n_outputs: int, n_clients: int):
        """The zero pair: its dual is 0 (``l*(0) = 0`` for every loss here)."""
        return cls(
            alpha=np.zeros((n_samples, n_outputs)),
            w=np.zeros((n_features, n_outputs)),
            conjugate=np.zeros(n_outputs),
            stale=np.zeros(n_clients, dtype=bool),
            checkpoint=None,
            checkpoint_w=None,
            pending=np.zeros(n_clients, dtype=bool),
            trust=1.0,
            cursor=np.zeros(n_clients, dtype=np.int64),
        )


def conjugate_sums(loss: Loss, alpha, Y, W=None) -> np.ndarray:
    """``sum_i l*(-alpha_ic)`` per output (weighted by ``W``, :mod:`hyfl.losses`), shape (C,)."""
    return np.sum(loss.conjugate(alpha, Y, W), axis=0)


def dual_value(w, conjugate, lam: float, n_samples: int) -> np.ndarray:
    """``D_c = -lam/2 ||w_c||^2 - S_c / N`` per output from the image and the conjugate sum."""
    return -0.5 * lam * np.sum(w * w, axis=0) - np.asarray(conjugate) / n_samples


def checkpoint_accepted(w, conjugate, checkpoint_w, checkpoint_conjugate, lam: float,
            n_samples: int) -> bool:
    """Does the checkpoint's dual reach the certified one?

    ``w``, ``checkpoint_w`` (shape (M, C)) are the exact primal images of the
    certified duals and of the checkpoint's, ``conjugate``,
    ``checkpoint_conjugate`` (shape (C,)) their conjugate sums. The dual is the
    sum over the outputs (one-vs-rest), and so is the decision: a checkpoint is
    taken or left whole (its ciphertexts pack all outputs together).
    """
    return bool(accepts(np.sum(dual_value(checkpoint_w, checkpoint_conjugate, lam, n_samples)),
                        np.sum(dual_value(w, conjugate, lam, n_samples))))


def accepts(checkpoint_dual, certified_dual) -> np.ndarray:
    """Per output: is the checkpoint's dual at least the certified one (up to rounding)?"""
    slack = ACCEPT_TOLERANCE * (1.0 + np.abs(certified_dual))
    return np.asarray(checkpoint_dual) >= np.asarray(certified_dual) - slack


def next_trust(trust: float, accepted: bool) -> float:
    """The exploration's step limit: lowered after a fallen checkpoint, raised (up to 1)
    after an accepted one."""
    if accepted:
        return min(trust * _TRUST_RECOVER, 1.0)
    return max(trust * _TRUST_CUT, TRUST_FLOOR)
