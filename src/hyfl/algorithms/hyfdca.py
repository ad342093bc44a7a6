"""HyFDCA: the hybrid federated dual coordinate ascent of Overman, Blum and Klabjan.

One outer iteration (Algorithm 1 of ``hyfdca-aaai.md``) for the set ``A`` of
active clients, with newcomers ``A_new`` (active now, absent last round):

1. *Refresh newcomers.* The server sends newcomers the current duals of their
   samples; they recompute their primal contribution and the server
   re-aggregates ``w`` (PrimalAggregation over ``A_new``) and sends it to them.
2. *Draw.* Every active client draws ``H`` of its samples without replacement.
3. *SecureInnerProduct.* Active clients send ``x_{k,i}^T w_k`` for their
   samples (Algorithm 2); the server sums over the holders ``B_i`` -- using
   the last value it received from absent holders -- and returns ``x_i^T w``.
   Only the drawn sample ids ``U`` are ever used, so the engine evaluates
   those alone (:class:`WeightSnapshots`); the values match Algorithm 2's.
   (Sending only the drawn ids, as the paper's section 7.1 counts, would leave
   absent holders' parts as old as the last round in which that very sample
   was drawn; measured on ijcnn1 with half participation the dual then falls.)
4. *LocalDualMethod.* Each active client computes a dual step for each drawn
   sample from the global inner product (rule ``safe``, ``theory`` or ``paper``).
5. *Dual aggregation.* The server adds ``gamma_t / |B_i|`` times the sum of the
   steps for sample ``i`` to the global duals and sends the new duals back to
   the active clients.
6. *PrimalAggregation.* Active clients send ``sum_i alpha_i x_{k,i}`` for their
   features (absent clients' blocks stay stale); ``w = sum / (lam N)``.
7. Optionally, a second SecureInnerProduct refreshes the stored inner products
   of all samples of the active clients (the paper drops it in experiments).

The simulation engine stacks every client's block into one sparse matrix
(:class:`hyfl.partition.StackedBlocks`), so each step above is one or two
vectorized operations over only the rows it touches. Two facts keep the state
small: a client's primal contribution is always ``X_k^T alpha_k`` of its own
dual copy (it is re-sent whenever that copy changes), so the server's ``w``
is updated incrementally from changed rows; and active clients hold fresh
duals after step 1, so the local steps use the server's duals directly.

Step rules: ``cocoa`` (the default) solves a local subproblem per client and
searches the step; ``safe``, ``theory`` and ``paper`` take one dual step per
drawn sample. Each is a :class:`~hyfl.algorithms.step_rules.StepRule` in its
own module of :mod:`hyfl.algorithms.step_rules`, resolved once
(:attr:`HyFDCA.rule`); the engines ask it, never its name.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl._names import STEP_RULES  # the registry of step rules (`hyfl --help` lists it)
from hyfl.algorithms import hyfdca_kernels
from hyfl.algorithms.base import draw_local_samples
from hyfl.algorithms.hyfdca_certify import (
    Certificate,
    checkpoint_accepted,
    conjugate_sums,
    evaluation_size,
    next_trust,
)
from hyfl.algorithms.hyfdca_groups import (
    GroupHistory,
    SampleGroups,
    find_sample_groups,
    offset_weights,
    ring_margin_offsets,
    ring_span_sums,
)
from hyfl.algorithms.hyfdca_local import (
    RunningAverage,
    SpanHistory,
    ascending_draws,
    average_weight,
    conjugate_gains,
    initial_sigma,
    line_search,
    line_search_curvature,
    line_search_points,
    local_passes,
    momentum_coefficient,
    momentum_direction,
    next_sigma,
    sigma_ceiling,
    single_threaded_blas,
    solve_subproblems,
    span_transforms,
)
from hyfl.algorithms.hyfdca_round import COCOA, PER_SAMPLE, PHASES
from hyfl.algorithms.step_rules import StepRule, step_rule
from hyfl.algorithms.step_rules.safe import dual_gain, next_beta, step_verdict
from hyfl.costs import RoundTraffic
from hyfl.errors import check_bool, check_choice, check_int, check_positive, fail
from hyfl.partition import StackedBlocks
from hyfl.problem import Problem
from hyfl.work_clock import work_clock

MAX_AUTO_HISTORY = 32
"""Most rounds of inner products a client remembers for the ``cocoa`` rule's model by default
(``history=None``: one more than the number of features, so that the remembered directions can
span low-dimensional data, and at most this many)."""
HISTORY_WINDOW = 8
"""Rounds a client's remembered inner products stay usable, as a multiple of its
``history`` depth. At low participation a client's last ``depth`` active rounds lie far
apart: with a window of ``2 * depth`` rounds a client taking part one round in ten kept a
fifth of its directions (measured: ijcnn1 3x3 at participation 0.1, relative loss 5.6
after 600 rounds with ``2``, 3e-4 with ``8``; docs/convergence.md)."""
MAX_HISTORY_WINDOW = 64
"""Largest ``history_window``: every group's Gram boxes are (W, W) with W = window x
history slots, a gigabyte at 64 x 32 on small data; no measured case wants more than 8."""
HISTORY_RING_BYTES = 256 * 2**20
"""The window shrinks (not below ``2 * depth``) where a ring of remembered inner products
for every slot of it, ``N x window x C`` floats, would exceed this (the store holds only the
slots clients list, but at low participation that can be all of them)."""
DEFAULT_MOMENTUM = 0.95
"""Largest momentum coefficient of the ``cocoa`` rule."""

SIP_SCOPES = ("all", "drawn", "paper")
"""Which partial inner products travel in SecureInnerProduct (see :class:`HyFDCA`)."""


def local_steps_from_iic(iic: float, n_samples: int, n_clients: int) -> int:
    """The paper's inner iterations constant: ``H = ceil(IIC * N / n_clients)`` (eq. 13)."""
    return max(1, math.ceil(iic * n_samples / n_clients))


@dataclass(frozen=True)
class HyFDCA:
    """Hyperparameters of HyFDCA (constructor only stores them).

    Parameters
    ----------
    local_steps : int, optional
        ``H``, dual steps per active client and outer iteration (capped at the
        client's sample count).
    iic : float, optional
        Inner iterations constant; ``H = ceil(iic * N / n_clients)``. Used when
        ``local_steps`` is not given. When neither is given, the ``cocoa``
        rule makes one pass over each client's samples per round and the
        other rules use ``iic = 0.5`` (each client draws about half its share
        ``N / n_clients`` of the samples per round).
    step_rule : {"cocoa", "safe", "theory", "paper"}, default "cocoa"
        How LocalDualMethod computes the dual steps: ``cocoa`` solves a local
        subproblem over all drawn samples (see :mod:`hyfl.algorithms.hyfdca_local`);
        the others take one step per sample from the round's inner products.
    gamma : float or "1/t", default 1.0
        Aggregation weight ``gamma_t`` of Algorithm 1.
    client_weight : {"N_k/N", "1"}, default "N_k/N"
        ``c_k`` of the ``theory`` rule (Theorem 4.4 uses ``N_k/N``; 4.8 and 4.11 use 1).
    history : int, optional
        ``cocoa`` only: how many of its recent rounds' inner products a client
        uses to model the Gram matrix of its samples. Default: one more than
        the number of features, at most 32 (enough directions to span
        low-dimensional data; memory and time per round grow with it).
    history_window : int, optional
        ``cocoa`` only: how many server rounds remembered inner products stay
        usable, as a multiple of ``history`` (2 to :data:`MAX_HISTORY_WINDOW`). Default
        :data:`HISTORY_WINDOW`. The window has ``history * history_window``
        slots (fewer where a ring of them all would exceed
        :data:`HISTORY_RING_BYTES`); every group's Gram matrices are that many
        slots square. The inner products are stored only for the slots some
        client still lists -- about ``history / p`` rounds at participation
        ``p`` -- so the window costs memory only at low participation.
    momentum : float, default 0.95
        ``cocoa`` only: largest momentum coefficient (0 disables momentum).
    local_passes : int, optional
        ``cocoa`` only: passes each active client makes over its drawn samples
        per round. Default: from the subproblem's condition, 1 to 16
        (:func:`hyfl.algorithms.hyfdca_local.local_passes`).
    certify : bool, default True
        With the ``cocoa`` rule: keep a certified pair whose dual never falls,
        whatever the participation (:mod:`hyfl.algorithms.hyfdca_certify`); the
        rule then stands behind the certified duals. Every engine runs it (the
        stacked one, the protocol with real ciphers, the Flower deployment).
        ``False`` gives the rule without it, whose dual can fall with few
        clients a round. The other rules ignore it.
    refresh_inner_products : bool, default False
        Run the second SecureInnerProduct at the end of each outer iteration.
    sip_scope : {"all", "drawn"}, default "all"
        Which partial inner products active clients encrypt and send in
        SecureInnerProduct. ``all``: every sample they hold (Algorithm 2; the
        server keeps them for when the client is absent). ``drawn``: only the
        samples drawn this round (section 7.1's count) -- identical iterates,
        far fewer encryptions, but valid only with full participation (an
        absent holder would leave stale parts behind), so a round with an
        absent client raises. ``paper``: computes exactly as ``all`` but
        charges only the drawn samples' parts, which is what the paper's
        simulation counted (section 7.1) also under partial participation; an
        accounting convention for reproducing its equal-time figures, not a
        protocol (it undercounts what ``all`` must send), so the encrypted
        protocol engine refuses it.
    """

    local_steps: int | None = None
    iic: float | None = None
    step_rule: str = "cocoa"
    gamma: float | str = 1.0
    client_weight: str = "N_k/N"
    history: int | None = None
    history_window: int | None = None
    momentum: float = DEFAULT_MOMENTUM
    local_passes: int | None = None
    certify: bool = True
    refresh_inner_products: bool = False
    sip_scope: str = "all"
    name: str = "hyfdca"

    default_iic = 0.5

    # -- configuration -----------------------------------------------------
    divergence_hint = (
        "Use the default step rule 'cocoa' (or 'safe'); the printed 'paper' rule diverges "
        "on some losses and data (docs/convergence.md)"
    )

    def validated(self) -> HyFDCA:
        """Return self after checking every hyperparameter (raises HyflError)."""
        rule = self.rule  # checks the name
        check_choice("client_weight", self.client_weight, ("N_k/N", "1"))
        check_choice("sip_scope", self.sip_scope, SIP_SCOPES)
        if self.local_steps is not None:
            check_int("local_steps", self.local_steps, minimum=1)
        if self.iic is not None:
            check_positive("iic", self.iic, fix="Pass a positive inner iterations constant.")
        if self.gamma != "1/t":
            g = check_positive("gamma", self.gamma, fix='Pass a value in (0, 1] or "1/t".')
            if g > 1:
                raise fail("gamma", f"must be <= 1, got {g}", 'Pass a value in (0, 1] or "1/t".')
        if self.history is not None:
            check_int("history", self.history, minimum=1,
                      fix="Pass how many recent rounds a client remembers, e.g. history=16.")
        if self.history_window is not None:
            fix = (f"Pass a multiple of history from 2 to {MAX_HISTORY_WINDOW}, "
                   "e.g. history_window=4.")
            window = check_int("history_window", self.history_window, minimum=2, fix=fix)
            if window > MAX_HISTORY_WINDOW:  # the (W, W) Gram boxes grow as its square
                raise fail("history_window", f"must be <= {MAX_HISTORY_WINDOW}, got {window}",
                           fix)
        for flag in ("certify", "refresh_inner_products"):
            check_bool(flag, getattr(self, flag), fix=f"Pass {flag}=true or {flag}=false.")
        if self.local_passes is not None:
            passes = check_int("local_passes", self.local_passes, minimum=1,
                               fix="Pass passes per round from 1 to 64, e.g. local_passes=2.")
            if passes > 64:
                raise fail("local_passes", f"must be <= 64, got {passes}",
                           "Pass passes per round from 1 to 64, e.g. local_passes=2.")
        try:
            momentum = float(self.momentum)
        except (TypeError, ValueError):
            momentum = float("nan")
        if not 0.0 <= momentum < 1.0:
            raise fail("momentum", f"must be in [0, 1), got {self.momentum!r}",
                       "Pass e.g. momentum=0.95, or 0 to disable momentum.")
        rule.check(self)
        return self

    def config(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def rule(self) -> StepRule:
        """The step rule object named by ``step_rule`` (the one place a name is resolved)."""
        check_choice("step_rule", self.step_rule, STEP_RULES)
        return step_rule(self.step_rule)

    @property
    def certified(self) -> bool:
        """Whether the rule keeps the certificate (a subproblem rule with ``certify``)."""
        return bool(self.certify) and self.rule.subproblem

    def history_depth(self, n_features: int) -> int:
        """``history``, or its default for data with ``n_features`` features."""
        if self.history is not None:
            return int(self.history)
        return min(n_features + 1, MAX_AUTO_HISTORY)

    def history_slots(self, n_samples: int, n_features: int, n_outputs: int) -> int:
        """Slots of the ring of remembered rounds (see :data:`HISTORY_WINDOW`)."""
        depth = self.history_depth(n_features)
        multiple = (HISTORY_WINDOW if self.history_window is None
                    else check_int("history_window", self.history_window, minimum=2))
        fits = HISTORY_RING_BYTES // (8 * max(n_samples * n_outputs, 1))
        window = int(max(2 * depth, min(multiple * depth, fits)))
        # A ring of a multiple of 64 slots gives its (W, W) Gram matrices power-of-two rows,
        # and NumPy's strided passes over them (cumsum, gathers) run 2-3x slower (cache-set
        # conflicts; 256 slots cost breast cancer with an intercept 20% more per round).
        return window + 1 if window % 64 == 0 else window

    def steps_per_client(self, n_samples: int, n_clients: int) -> int | None:
        """Resolve ``H`` from ``local_steps`` or the IIC (None: every local sample)."""
        if self.local_steps is not None:
            return int(self.local_steps)
        if self.iic is None and self.rule.subproblem:
            return None
        iic = self.iic if self.iic is not None else self.default_iic
        return local_steps_from_iic(iic, n_samples, n_clients)

    # -- engine hooks --------------------------------------------------------
    def setup(self, problem: Problem, blocks: StackedBlocks) -> HyFDCAState:
        self.validated()
        N, C = problem.Y.shape
        R = blocks.X.shape[0]
        H = self.steps_per_client(N, blocks.n_clients)
        sizes = np.diff(blocks.client_rowptr)
        # Squared norms of the samples. In a deployment each client sends its
        # part and the server sums them over the holders once at set-up; the
        # sum is the row norm of the pooled matrix (a smaller temporary).
        sq_norms = row_squared_norms(problem.X)
        local = None
        if self.rule.subproblem:
            depth = self.history_depth(problem.n_features)
            window = self.history_slots(N, problem.n_features, C)
            rowptr = blocks.client_rowptr
            groups = find_sample_groups(
                [blocks.row_sample[rowptr[k]:rowptr[k + 1]] for k in range(blocks.n_clients)],
                blocks.client_features, N)
            local = LocalState(
                history=SpanHistory.empty(blocks.n_clients, N, problem.n_features, C, depth,
                                          window),
                groups=groups,
                group_history=(None if groups is None else
                               GroupHistory.empty(groups, C, depth, window)),
                absent_estimate=[np.zeros((f.size, C)) for f in blocks.client_features],
                sigma=initial_sigma(blocks.client_features, problem.n_features),
                sigma_ceiling=sigma_ceiling(blocks.client_features, problem.n_features, sizes),
                previous_step=np.zeros((N, C)),
                previous_dw=np.zeros((problem.n_features, C)),
                # With the certificate every candidate pairs with the certified duals:
                # their running average is not needed.
                average_alpha=None if self.certified else RunningAverage(np.zeros((N, C))),
                average_w=np.zeros((problem.n_features, C)),
                coherence=np.zeros(C),
                certificate=(Certificate.zero(N, problem.n_features, C, blocks.n_clients)
                             if self.certified else None),
            )
        return HyFDCAState(
            problem=problem,
            blocks=blocks,
            counts=sizes.copy() if H is None else np.minimum(H, sizes),
            sq_norms=sq_norms,
            alpha=np.zeros((N, C)),
            alpha_local=np.zeros((R, C)),
            snapshots=WeightSnapshots.empty(blocks.n_clients, problem.n_features, C),
            w=np.zeros((problem.n_features, C)),
            was_active=np.zeros(blocks.n_clients, dtype=bool),
            beta=1.0,
            beta_min=1.0 / float(blocks.n_holders.max()),
            feature_counts=np.array([f.size for f in blocks.client_features], dtype=np.int64),
            updated_at=np.zeros(N, dtype=np.int64),
            last_active=np.zeros(blocks.n_clients, dtype=np.int64),
            changes=DualChangeLog.empty(N),
            copy_residue=np.empty(0, dtype=np.int64),
            t=0,
            horizontal=bool(np.all(blocks.n_holders == 1)),
            local=local,
        )

    def weights(self, state: HyFDCAState) -> np.ndarray:
        return state.w

    def duals(self, state: HyFDCAState) -> np.ndarray:
        """The duals the rule stands behind: with ``cocoa`` the certified ones
        (:mod:`hyfl.algorithms.hyfdca_certify`), whose dual never falls."""
        if state.local is not None and state.local.certificate is not None:
            return certified_pair(state)[1]
        return state.alpha

    def models(self, state: HyFDCAState) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """Candidate (name, weights, duals) pairs; the engine reports the best certified one.

        The ``cocoa`` rule pairs its certified duals with three weights: the
        exploration's last iterate, its running average (see
        :mod:`hyfl.algorithms.hyfdca_local`) and the certified duals' exact
        image. Any weights with feasible duals give a valid gap. The other
        rules offer their last iterate.
        """
        if state.local is None:
            return [("last", state.w, state.alpha)]
        if state.local.certificate is None:  # the last iterate and the running average
            models = [("last", state.w, state.alpha)]
            if state.t > 0:
                models.append(("average", state.local.average_w,
                               state.local.average_alpha.value(state.alpha)))
            return models
        w_certified, alpha = certified_pair(state)
        models = [("last", state.w, alpha)]
        if state.t > 0:
            models.append(("average", state.local.average_w, alpha))
            models.append(("certified", w_certified, alpha))
        return models

    def round_stats(self, state: HyFDCAState) -> dict[str, float]:
        return state.stats

    def round(self, state: HyFDCAState, active: np.ndarray, rng: np.random.Generator):
        """One outer iteration of Algorithm 1 for the clients flagged in ``active``.

        Besides the new state, records in ``state.traffic`` (a
        :class:`~hyfl.costs.RoundTraffic`) which (client, sample) values travel
        encrypted in each message of each phase (for :mod:`hyfl.costs`), and in
        ``state.stats`` the round trips, plaintext floats and ids each way, the
        busiest client's share of the work and the server's compute time. Each
        phase reports what it sent (:class:`Sent`); :class:`RoundIO` adds them up.
        """
        t = state.t + 1
        active = np.asarray(active, dtype=bool)
        self.check_participation(active, t)
        newcomers = active & ~state.was_active
        rule = self.rule
        io = RoundIO(RoundTraffic(COCOA if rule.subproblem else PER_SAMPLE))
        n_features = state.feature_counts * state.w.shape[1]  # floats of a client's weights

        # 1. Newcomers receive the duals of their samples that changed while
        # they were away and re-send their primal part; returning clients
        # still hold the weights sent at the end of last round.
        # With the cocoa rule every active client receives the refreshed
        # weights (its model needs inner products with the w it records).
        # The server logs last round's dual changes first: a newcomer's stale
        # copies are found from the changes made while it was away, so the
        # refresh costs those rows, not the newcomer's whole block.
        receivers = active if rule.subproblem else newcomers
        state.snapshots.record(state.w, active & ~receivers)
        log_last_round(state)
        if state.local is not None and state.local.certificate is not None:
            io.add("round", certificate_configure(state, active))
        refreshed = None
        if newcomers.any() and state.t > 0:
            stale = _stale_rows(state, newcomers)
            io.add("round", Sent(floats_up=n_features[newcomers].sum(),
                                 encrypted={"refresh_down": _stale_copies(state.blocks, stale)}))
            io.add("weights", Sent(floats_down=n_features[receivers].sum()))
            refreshed = server_refresh_newcomers(state, newcomers, stale)
        if refreshed:
            state.w += primal_aggregation_rows(state, refreshed[0], refreshed[1])
        if state.local is not None:  # their exact images replace the estimates
            drop_absent_estimates(state, newcomers)
        state.snapshots.record(state.w, receivers)

        if rule.subproblem:
            # Its dense products are of R x R and (features x R) matrices: BLAS's threads
            # cost more than they do (the demo's round: 5.3 -> 4.7 ms on one).
            with single_threaded_blas():
                state, stats = self._cocoa_round(state, active, rng, io, t)
        else:
            state, stats = self._per_sample_round(state, active, rng, io, t)
        stats["round_trips"] = self.round_trips(
            refreshed=bool(newcomers.any() and state.t > 0), horizontal=state.horizontal,
            ahead=bool(stats.pop("ahead", False)),
        ) + stats.pop("certifications", 0.0)  # a judge's exchange each (hyfdca_certify)
        stats.update(
            active_clients=float(np.count_nonzero(active)),
            floats_up=float(io.floats_up),
            floats_down=float(io.floats_down),
            ids_up=0.0,
            ids_down=float(io.ids_down),
            server_seconds=io.server_seconds,
        )
        state.last_active[active] = t
        return replace(state, t=t, was_active=active.copy(), stats=stats, traffic=io.traffic)

    # -- the per-sample rules' round, phase by phase (hyfl.algorithms.hyfdca_round.PHASES) --
    def _per_sample_round(self, state, active, rng, io, t):
        """Steps 2-7 with one dual step per drawn sample (rules safe, theory, paper).

        Each phase is one function that updates the round's :class:`SampleRound` and
        returns what it sent (:class:`Sent`); ``io`` adds them up, by phase name.
        """
        r = SampleRound(t=t, active=active, clients=np.flatnonzero(active),
                        gamma_t=1.0 / t if self.gamma == "1/t" else float(self.gamma))
        io.add("round", self._sample_open(state, r, rng))
        io.add("steps", self._sample_steps(state, r))
        io.add("duals", self._sample_duals(state, r))
        if self.rule.tests_round:
            io.add("verdict", self._sample_verdict(state, r))
            state = replace(state, beta=r.beta)
        io.add("commit", self._sample_commit(state, r))
        stats = {
            "updated_samples": float(r.samples.size),
            "accepted": float(r.accepted),
            "client_share_max": _busiest_share(
                state.blocks, np.concatenate([r.drawn_rows, r.active_rows]), r.clients.size
            ),
        }
        if self.rule.tests_round:
            stats["beta"] = state.beta
        return state, stats

    def _sample_open(self, state, r: SampleRound, rng) -> Sent:
        """``round``: the server draws H samples of every active client and announces
        them; SecureInnerProduct: active clients' parts with their current weights,
        absent holders' parts as last sent (with the weights of their last round)."""
        blocks, active, clients = state.blocks, r.active, r.clients
        sent = Sent()
        sizes = np.diff(blocks.client_rowptr)[clients]
        positions = draw_local_samples(rng, sizes, state.counts[clients])
        r.drawn_rows = np.repeat(blocks.client_rowptr[clients], state.counts[clients]) + positions
        r.drawn_samples = blocks.row_sample[r.drawn_rows]
        r.samples = hyfdca_kernels.distinct(r.drawn_samples)
        r.drawn_slot = np.searchsorted(r.samples, r.drawn_samples)
        r.client_of_drawn = np.repeat(clients, state.counts[clients])
        sent.draws = (r.client_of_drawn, r.drawn_samples)
        # The holders' rows are read in place (compiled kernels: SciPy's X[rows]
        # alone cost more than the rest of a one-step round), and their squared
        # norms come along for the safe rule's test.
        holder_rows, r.holder_slot, holder_clients = hyfdca_kernels.holder_rows(blocks, r.samples)
        r.fresh = active[holder_clients]
        r.active_rows = holder_rows[r.fresh]
        parts, r.holder_sq = state.snapshots.row_inner_products(blocks.X, holder_rows,
                                                                holder_clients)
        with sent.timing():
            r.z = server_sum_over_holders(parts, r.holder_slot, r.samples.size)
        r.updated_pairs = (holder_clients[r.fresh], r.samples[r.holder_slot[r.fresh]])
        # The round's instructions name each client's draws and its updated samples.
        sent.ids_down += r.drawn_rows.size + r.updated_pairs[0].size
        sent.ids_down += clients.size ** 2  # each is told the round's participants
        if not state.horizontal:  # with whole samples on one client, z is computed locally
            if self.sip_scope == "all":
                sent.encrypted["sip_up_all"] = active.copy()
            else:  # "drawn", or "paper" (its count; the parts are as with "all")
                sent.encrypted["sip_up"] = r.updated_pairs
            sent.encrypted["sip_sum"] = r.samples
            sent.encrypted["sip_down"] = r.updated_pairs
        return sent

    def _sample_steps(self, state, r: SampleRound) -> Sent:
        """``steps``: LocalDualMethod on every active client (all drawn rows at once)."""
        r.delta = self.client_dual_steps(state, r.drawn_samples, r.z[r.drawn_slot],
                                         r.client_of_drawn, r.gamma_t)
        return Sent(encrypted={"dual_up": (r.client_of_drawn, r.drawn_samples)})

    def _sample_duals(self, state, r: SampleRound) -> Sent:
        """``duals``: dual aggregation, alpha_i += gamma_t / |B_i| * sum of the steps for i,
        sent to the active holders of each updated sample, who send back their primal
        part (and, for the safe rule's test, their encrypted gain terms)."""
        sent = Sent()
        with sent.timing():
            r.step = server_aggregate_duals(r.delta, r.drawn_slot, r.samples,
                                            state.blocks.n_holders, r.gamma_t)
        sent.encrypted["dual_down"] = r.updated_pairs
        r.row_step = r.step[r.holder_slot[r.fresh]]
        # Absent holders do not re-send. Their rows would add exact zeros to
        # sums that start at +0.0, which changes no bit, so they are left out.
        r.dw = primal_aggregation_rows(state, r.active_rows, r.row_step)
        n_features = state.feature_counts * state.w.shape[1]
        sent.floats_up += n_features[r.active].sum()
        sent.floats_down += n_features[r.active].sum()
        if self.rule.tests_round:  # 3 gain terms and their tag (hyfl.privacy.tags)
            sent.encrypted["totals"] = (int(r.clients.size), 3 + 1)
        return sent

    def _sample_verdict(self, state, r: SampleRound) -> Sent:
        """``verdict`` (the safe rule): the summed totals are decrypted by one active
        client, with ||dw||^2 from the server (its verdict is a control bit); the server
        sends it the active clients, whose tags it checks, and every active client beta
        with the round's instructions."""
        sent = Sent()
        with sent.timing():
            fresh_sq = np.bincount(r.holder_slot[r.fresh], weights=r.holder_sq[r.fresh],
                                   minlength=r.samples.size)
            gain, scale = _dual_gain_estimate(state, r.samples, r.step, r.z, r.dw, fresh_sq)
            # beta >= number of draws makes every step provably safe when nobody
            # is stale (Cauchy-Schwarz over the updated samples): accept there.
            r.accepted = step_verdict(gain, scale, state.beta, r.drawn_rows.size)
            r.beta = next_beta(r.accepted, state.beta, state.beta_min, r.drawn_rows.size)
        sent.encrypted["summed_totals"] = (1, 3 + 1)
        sent.floats_down += 1 + r.clients.size
        sent.ids_down += int(r.clients.size)
        return sent

    def _sample_commit(self, state, r: SampleRound) -> Sent:
        """The commit: server duals, clients' copies and the aggregated primal weights
        (if accepted); with ``refresh_inner_products`` the ``commit`` exchange, a second
        SecureInnerProduct with the weights the active clients just received."""
        if r.accepted:
            state.alpha[r.samples] += r.step
            state.alpha_local[r.active_rows] += r.row_step
            state.w += r.dw
            state.updated_at[r.samples] = r.t
        if not self.refresh_inner_products:
            return Sent()
        state.snapshots.record(state.w, r.active)
        return Sent(encrypted={"sip_again_all": r.active.copy()})

    # -- the cocoa rule's round, phase by phase (hyfl.algorithms.hyfdca_round.PHASES) ------
    def _cocoa_round(self, state, active, rng, io, t):
        """Steps 2-6 with the ``cocoa`` rule (see :mod:`hyfl.algorithms.hyfdca_local`).

        Each phase is one function that updates the round's :class:`CocoaRound` and
        returns what it sent (:class:`Sent`); ``io`` adds them up, by phase name.
        """
        local = state.local
        if local.average_alpha is not None:
            local.average_alpha.advance(t)
        clients = np.flatnonzero(active)
        if clients.size == 0:  # nobody takes part: only the history and the average move on
            return state, _cocoa_idle(state, t)
        r = CocoaRound(t=t, active=active, clients=clients)
        io.add("round", self._cocoa_open(state, r, rng))
        io.add("proposals", self._cocoa_proposals(state, r))
        io.add("image", self._cocoa_image(state, r))
        io.add("direction", self._cocoa_direction(state, r))
        io.add("step", self._cocoa_step(state, r))
        io.add("certify", _cocoa_certify(state, r))
        stats = {
            "updated_samples": float(r.samples.size),
            "accepted": float(np.any(r.step > 0)),
            "step": float(np.mean(r.step)),
            "sigma": float(local.sigma),
            "momentum": float(np.mean(r.mu)),
            "client_share_max": r.busiest_share,
            "certifications": float(r.certifications),
            "ahead": r.ahead,
        }
        return state, stats

    def _cocoa_open(self, state, r: CocoaRound, rng) -> Sent:
        """``round``: the draws, by default one pass over each active client's samples in
        a random order the server announces, and SecureInnerProduct for every sample of
        the active clients (the clients remember these inner products to model their
        data)."""
        blocks, active, clients = state.blocks, r.active, r.clients
        sent = Sent()
        rowptr = blocks.client_rowptr
        r.sizes = np.diff(rowptr)[clients]
        r.counts = state.counts[clients]
        positions = draw_local_samples(rng, r.sizes, r.counts)
        # int32, as the blocks' row indices (a full pass on Covtype draws 6.3 million)
        r.drawn_rows = (np.repeat(rowptr[clients], r.counts) + positions).astype(np.int32)
        r.ascending = ascending_draws(positions, r.counts, r.sizes)  # for the solver's reads
        del positions
        r.drawn_samples = blocks.row_sample[r.drawn_rows]
        sent.ids_down += r.drawn_rows.size
        sent.ids_down += clients.size ** 2  # each is told the round's participants
        # With a full local pass every active client sends (and later receives) a value
        # for each of its samples: the record names the clients, not the 6.3 million
        # (client, sample) pairs on Covtype, which would stay allocated until the next
        # round (the counts are the same, see hyfl.costs); the round has no draws then.
        r.full_pass = bool(np.array_equal(r.counts, r.sizes))
        if not r.full_pass:
            sent.draws = (np.repeat(clients, r.counts), r.drawn_samples)
        # Read in the clients' runs of rows: no array over their rows (76 MB on Covtype).
        r.sip_samples = hyfdca_kernels.distinct_in_runs(blocks.row_sample, rowptr[clients],
                                                        r.sizes, blocks.n_samples)
        r.busiest_share = _busiest_client_share(blocks, clients)
        # The holders' rows are read in place (compiled kernels, as in the per-sample
        # rules): no gathered copy of the active clients' data, and no array over the
        # holders' rows. The server's sum over the holders rides in the same kernel (its
        # additions are not timed apart: they are a few percent of the kernel).
        r.z, r.fresh_sq_sip, every_active = state.snapshots.sample_inner_products(
            blocks, r.sip_samples, active)
        # r.fresh_sq_sip: the active holders' squared norms per sample, for the line
        # search (step). With every holder of these samples active and a consistent
        # state the line search is exact (hyfl.algorithms.hyfdca_certify).
        certificate = state.local.certificate
        r.exact = certificate is None or bool(certificate.current and every_active)
        # The inner products came with the last round's step when every client took part
        # in it and its explored w stands (then nobody returns and the model rides along).
        r.ahead, state.local.ahead = state.local.ahead, False
        if not state.horizontal:
            sent.encrypted.update(sip_sum=r.sip_samples,
                                  # every sample of every active client
                                  sip_down_all=active.copy())
            if not r.ahead:
                sent.encrypted["sip_up_all"] = active.copy()
        return sent

    def _cocoa_proposals(self, state, r: CocoaRound) -> Sent:
        """``proposals``: the subproblem's model -- the Gram matrix of each active client's
        directions (of the composite weights its margins were taken with, where the split
        has sample groups, :mod:`hyfl.algorithms.hyfdca_groups`, and R numbers per output
        that move its margins from them to w) and the subproblem's scaling -- and
        LocalDualMethod: every active client solves its subproblem with its block of the
        history directions (it received those weights)."""
        blocks, problem, local, clients = state.blocks, state.problem, state.local, r.clients
        C = state.w.shape[1]
        sent = Sent()
        towards_w = None
        with sent.timing():
            local.history.record(r.t, state.w, clients, r.sip_samples, r.z)
            pairs, grams = local.history.directions(clients)
            groups = local.groups
            if groups is not None:
                composites = record_composites(state, r.t)
                grams = local.group_history.grams(clients, pairs, r.t)
                towards_w = local.group_history.towards_w(clients, pairs, state.w, composites)
        r.pairs, R = pairs, pairs.shape[1]
        transforms = span_transforms(grams)
        # Each client gets its Gram matrices (upper triangles) and the subproblem's scaling.
        sent.floats_down += clients.size * (C * R * (R + 1) / 2 + 1)
        if groups is not None:
            sent.floats_down += clients.size * C * R

            def offsets(a, rows):  # margin offsets of the rows a client reports
                # (by ascending sample, as reporter_offsets lists them: the ring is read
                # forward)
                return ring_margin_offsets(local.history.z, blocks.row_sample[rows], pairs[a],
                                           transforms[a], towards_w[a], local.history.z_column)

            r.offsets = offsets
        own_features = [blocks.client_features[k] for k in clients]
        directions = np.concatenate([local.history.direction_vectors(pairs[a], f)
                                     for a, f in enumerate(own_features)])
        segments = np.concatenate(([0], np.cumsum(r.counts)))
        proposals = solve_subproblems(
            problem.loss,
            segments=segments,
            row_sample=r.drawn_samples,
            alpha=state.alpha,  # active clients hold fresh copies (the refresh)
            z_ring=local.history.z,
            pairs=local.history.ring_pairs(pairs),
            transforms=transforms,
            Y=problem.Y,
            W=problem.W,
            sq_norms=state.sq_norms,
            coef=local.sigma / (problem.lam * problem.n_samples),
            X=blocks.X,
            rows=r.drawn_rows,
            feature_ptr=np.concatenate(([0], np.cumsum([f.size for f in own_features]))),
            features=np.concatenate(own_features),
            directions=directions,
            # Each row's margin moves to the server's w by m . h, m its margins on the
            # client's directions, which the solver reads anyway (hyfdca_groups).
            offset_weights=(None if groups is None else np.stack(
                [offset_weights(transforms[a], towards_w[a]) for a in range(clients.size)])),
            ascending=r.ascending,
            passes=local_passes(state.sq_norms, segments, problem.lam * problem.n_samples,
                                self.local_passes, samples=r.drawn_samples),
        )
        r.drawn_rows = r.ascending = None
        # Aggregation as in Algorithm 1: the server adds each sample's proposals scaled
        # by 1/|B_i| (the clients scale before encrypting), so a sample whose holders
        # are partly absent -- whose inner product is partly stale -- moves less.
        with sent.timing():
            r.samples = hyfdca_kernels.distinct(r.drawn_samples)
            slot = hyfdca_kernels.positions_in(r.samples, r.drawn_samples)
            r.proposal = server_aggregate_duals(proposals, slot, r.samples, blocks.n_holders,
                                                1.0)
        if r.full_pass:  # every active client sends a value for each of its samples
            sent.encrypted["proposals_up_all"] = (r.active.copy(), r.samples)
        else:
            sent.encrypted["proposals_up"] = (np.repeat(clients, r.counts), r.drawn_samples)
        r.drawn_samples = None  # (kept in the traffic record without a full pass)
        return sent

    def _cocoa_image(self, state, r: CocoaRound) -> Sent:
        """``image``: the server sends each sample's summed proposal to its active holders,
        who send back its primal image, and newcomers the previous steps of their samples
        (the others made them); the momentum coefficient of the proposal's image."""
        blocks, local, active = state.blocks, state.local, r.active
        sent = Sent()
        r.updated_rows, r.updated_slot, r.updated_clients = hyfdca_kernels.holder_rows(
            blocks, r.samples, active)
        if r.full_pass:  # the active holders of every sample of the active clients: all rows
            sent.encrypted["dual_down_all"] = active.copy()
        else:
            sent.encrypted["dual_down"] = (r.updated_clients, r.samples[r.updated_slot])
        sent.ids_down += r.updated_rows.size  # which of its samples each holder updates
        dw_proposal = _image_of(state, r, r.proposal)
        sent.floats_up += (state.feature_counts * state.w.shape[1])[active].sum()
        r.previous = local.previous_step[r.samples]
        newcomers = active & ~state.was_active
        if newcomers.any() and state.t > 0:
            moved_before = np.any(r.previous != 0.0, axis=1)[r.updated_slot]
            got = newcomers[r.updated_clients] & moved_before
            sent.encrypted["momentum_down"] = (r.updated_clients[got],
                                               r.samples[r.updated_slot[got]])
        # Momentum: the previous step, with the coefficient that makes the direction
        # conjugate to it.
        with sent.timing():
            r.mu = momentum_coefficient(dw_proposal, local.previous_dw, self.momentum)
        return sent

    def _cocoa_direction(self, state, r: CocoaRound) -> Sent:
        """``direction``: the momentum coefficient to every active client; the direction
        back in the dual domain, its primal image (the absent holders' part estimated in
        the span of each group's directions from R sums per output that one active member
        sends) and the clients' encrypted line-search sums."""
        problem, local, active, clients = state.problem, state.local, r.active, r.clients
        C = state.w.shape[1]
        sent = Sent(floats_down=clients.size * C)  # the momentum coefficient
        samples = r.samples
        r.y, r.y_weight = problem.Y[samples], problem.weights_of(samples)
        r.alpha_before = state.alpha[samples]
        r.direction = momentum_direction(problem.loss, r.alpha_before, r.proposal, r.previous,
                                         r.mu, r.y, r.y_weight)
        r.dw = _image_of(state, r, r.direction)
        sent.floats_up += (state.feature_counts * C)[active].sum()
        r.exact_samples = np.zeros(samples.size, dtype=bool)
        if local.groups is not None:
            with sent.timing():
                dw_absent, r.estimates, r.exact_samples, senders = estimate_absent_images(
                    state, active, clients, r.pairs, samples, r.direction, r.updated_rows,
                    r.updated_slot)
                r.dw += dw_absent
            sent.floats_up += senders * C * r.pairs.shape[1]
        # An exact round searches [0, 1]; otherwise the certificate's trust bounds the step.
        r.limit = 1.0 if r.exact else local.certificate.trust
        # The line search's sums (conjugate terms, margin term, squared norms) with the
        # terms of the round's certificate (objective, dual, accuracy: 2C + 1) and their
        # tag (hyfl.privacy.tags), one more value.
        sent.encrypted["totals"] = (int(clients.size), _line_search_values(problem.loss,
                                                                           r.limit, C))
        return sent

    def _cocoa_step(self, state, r: CocoaRound) -> Sent:
        """``step``: the summed line-search sums go to every active client, which finds the
        step (with the server's ||dw||^2) and takes it; for each updated sample one active
        holder sends the encrypted new state of its dual (the judge also the step and,
        with the certificate, the conjugate sum's change), and the new weights follow."""
        blocks, problem, local, active, clients = (state.blocks, state.problem, state.local,
                                                   r.active, r.clients)
        loss, lam, N, C = problem.loss, problem.lam, problem.n_samples, state.w.shape[1]
        samples, direction, limit = r.samples, r.direction, r.limit
        sent = Sent()
        with sent.timing():
            weight = direction * direction
            # The judge's margins: each sample's as its first active holder reports it.
            at_sip = hyfdca_kernels.positions_in(r.sip_samples, samples)  # updated among SIP's
            line_margins = r.z[at_sip]
            if r.offsets is not None:
                line_margins = line_margins + reporter_offsets(blocks, active, clients, samples,
                                                               r.offsets, C)
            full = np.sum(state.sq_norms[samples][:, None] * weight, axis=0)
            # Where a group's estimate is exact its absent part of ||A d||^2 is known too.
            fresh_sq = np.where(r.exact_samples, state.sq_norms[samples], r.fresh_sq_sip[at_sip])
            active_part = np.sum(fresh_sq[:, None] * weight, axis=0)
            quadratic, local.coherence = line_search_curvature(
                np.sum(r.dw * r.dw, axis=0), full, active_part, samples.size, local.coherence,
                lam, N
            )
            r.step = step = line_search(
                loss,
                conjugate_gains(loss, r.alpha_before, direction, r.y, limit, r.y_weight),
                np.sum(line_margins * direction, axis=0),
                quadratic,
                N,
                limit,
            )
        sent.encrypted["summed_totals"] = (int(clients.size), _line_search_values(loss, limit, C))
        sent.floats_down += clients.size * 2 * C  # ||dw||^2 and the remembered coherence
        sent.ids_down += int(clients.size) ** 2  # the active clients, whose tags each checks
        sent.floats_up += 2 * C + evaluation_size(C)  # the judge's step, coherence, certificate
        # Every active client has taken the step; the new weights follow (the commit).
        if not r.exact:  # the certified pair stays where the round starts
            materialize_certificate(state, active)
        change = direction * step[None, :]
        state.alpha[samples] += change
        hyfdca_kernels.add_rows(state.alpha_local, r.updated_rows, change, r.updated_slot)
        applied_dw = r.dw * step[None, :]
        state.w += applied_dw
        for k, part in r.estimates.items():
            local.absent_estimate[k] += part * step[None, :]
        moved = np.any(change != 0.0, axis=1)
        state.updated_at[samples[moved]] = r.t
        sent.floats_down += (state.feature_counts * C)[active].sum()  # the commit: new weights
        sent.floats_down += clients.size * C  # and the judge's step, each checks it
        sent.encrypted["dual_commit"] = samples[moved]
        if local.certificate is not None:  # the judge's conjugate change (a value, its tag)
            sent.encrypted["conjugate_up"] = 1
        # Every client takes part: each gets its features' move per unit step and sends
        # the next round's inner products with the step (hyfdca_parties.Server.sends_ahead).
        local.ahead = not state.horizontal and clients.size == blocks.n_clients
        if local.ahead:
            sent.floats_down += (state.feature_counts * C)[active].sum()
            sent.encrypted["sip_ahead_all"] = active.copy()
        local.previous_step[local.previous_samples] = 0.0
        local.previous_step[samples] = change
        local.previous_samples = samples
        local.previous_dw = applied_dw
        # sigma follows the step relative to what the line search could take.
        local.sigma = next_sigma(local.sigma, step / limit, local.sigma_ceiling)
        if local.average_alpha is not None:
            local.average_alpha.update(samples[moved], r.alpha_before[moved],
                                       state.alpha[samples[moved]])
        rho = average_weight(r.t)
        local.average_w *= 1.0 - rho
        local.average_w += rho * state.w
        return sent

    # -- client half: the local dual method ----------------------------------
    def client_dual_steps(
        self,
        state: HyFDCAState,
        samples: np.ndarray,
        z: np.ndarray,
        clients: np.ndarray,
        gamma_t: float,
    ) -> np.ndarray:
        """Dual steps of the drawn samples (LocalDualMethod, all clients stacked).

        Parameters
        ----------
        samples : ndarray, shape (D,)
            Global id of each drawn sample (one entry per (client, sample) draw).
        z : ndarray, shape (D, C)
            Global inner products ``x_i^T w`` from SecureInnerProduct.
        clients : ndarray, shape (D,)
            The drawing client of each entry (for ``c_k`` of the theory rule).
        gamma_t : float

        Returns
        -------
        ndarray, shape (D, C)
        """
        problem = state.problem
        N = problem.n_samples
        rule = self.rule
        return rule.dual_steps(
            problem.loss,
            alpha=state.alpha[samples],  # active clients hold fresh copies (step 1)
            z=z,
            y=problem.Y[samples],
            weight=problem.weights_of(samples),
            sq_norms=state.sq_norms[samples],
            lam=problem.lam,
            n_samples=N,
            beta=state.beta,
            gamma_t=gamma_t,
            client_share=rule.client_shares(
                self.client_weight, np.diff(state.blocks.client_rowptr)[clients], N),
        )

    def check_participation(self, active: np.ndarray, t: int) -> None:
        """``sip_scope='drawn'`` is exact only when every client takes part."""
        if self.sip_scope == "drawn" and not active.all():
            raise fail(
                "sip_scope",
                f"'drawn' needs every client in every round, but {np.count_nonzero(~active)} "
                f"client(s) are absent in round {t}",
                "Use sip_scope='all' with partial participation",
            )

    def round_trips(self, *, refreshed: bool, horizontal: bool, ahead: bool = False) -> float:
        """Round trips of one outer iteration (:meth:`StepRule.round_trips`; every engine
        counts with this method)."""
        return self.rule.round_trips(refreshed=refreshed, horizontal=horizontal, ahead=ahead,
                                     refresh_inner_products=self.refresh_inner_products)


class WeightSnapshots:
    """The weights each client held at its last SecureInnerProduct.

    Algorithm 2 has every active client send ``x_{k,i}^T w_k`` for all its
    samples; the server keeps the last value from each client, so an absent
    holder's part of ``x_i^T w`` is its inner product with the weights it held
    in its last active round. The engine stores those weights once per
    version (all clients of one round share it) and evaluates only the rows of
    the drawn samples, which gives exactly the stored values at a fraction of
    the cost. Versions no client refers to any more are reused.

    Attributes
    ----------
    store : ndarray, shape (capacity, M, C)
    slot : ndarray of int, shape (K,)
        Version held by each client (version 0 is all zeros: ``ip = 0`` initially).
    """

    def __init__(self, store: np.ndarray, slot: np.ndarray):
        self.store, self.slot = store, slot

    @classmethod
    def empty(cls, n_clients: int, n_features: int, n_outputs: int) -> WeightSnapshots:
        return cls(np.zeros((4, n_features, n_outputs)), np.zeros(n_clients, dtype=np.int64))

    def record(self, w: np.ndarray, clients: np.ndarray) -> None:
        """The flagged clients now hold (and have sent inner products with) ``w``."""
        if not clients.any():
            return
        in_use = np.zeros(len(self.store), dtype=bool)
        in_use[self.slot[~clients]] = True
        free = np.flatnonzero(~in_use)
        if free.size == 0:
            free = np.array([len(self.store)])
            self.store = np.concatenate([self.store, np.zeros_like(self.store)])
        self.store[free[0]] = w
        self.slot[clients] = free[0]

    def sample_inner_products(self, blocks: StackedBlocks, samples: np.ndarray,
                              active: np.ndarray):
        """``x_i^T w`` of each sample summed over its holders, each with the weights it
        holds, the active holders' squared row norms per sample, and whether every
        holder is active (:func:`hyfl.algorithms.hyfdca_kernels.sample_inner_products`)."""
        return hyfdca_kernels.sample_inner_products(blocks, samples, active, self.slot,
                                                    self.store)

    def row_inner_products(self, X: sp.csr_matrix, rows: np.ndarray, clients: np.ndarray):
        """``x_{k,i}^T w_k`` of the stacked ``rows``, each with its client's weights, and
        the rows' squared norms, read in place.

        Parameters
        ----------
        X : scipy.sparse.csr_matrix, shape (R, M)
            The stacked blocks.
        rows : ndarray of int, shape (n,)
        clients : ndarray of int, shape (n,)
            Client of each row.

        Returns
        -------
        parts : ndarray, shape (n, C)
            Bitwise equal to the sparse product ``X[rows] @ w_k`` row by row.
        sq_norms : ndarray, shape (n,)
            ``||x_r||^2`` of each row, as :func:`row_squared_norms` of ``X[rows]``.
        """
        return hyfdca_kernels.gather_inner_products(X, rows, self.slot[clients], self.store)


@dataclass
class Sent:
    """What one phase of a round sent: plaintext floats and ids, the server's compute time
    (:meth:`timing`), the encrypted messages (name -> what travels, as
    :data:`hyfl.costs.PHASE_COUNTS` reads them) and, from the phase that announces
    them, the round's draws (they define its compact layout)."""

    floats_up: float = 0.0
    floats_down: float = 0.0
    ids_down: float = 0.0
    server_seconds: float = 0.0
    encrypted: dict = field(default_factory=dict)
    draws: tuple | None = None

    @contextmanager
    def timing(self):
        """Count the time of the block as the server's compute."""
        tic = work_clock()
        try:
            yield
        finally:
            self.server_seconds += work_clock() - tic


@dataclass
class RoundIO:
    """What one round sends, added up phase by phase (see :meth:`HyFDCA.round`)."""

    traffic: RoundTraffic
    floats_up: float = 0.0
    floats_down: float = 0.0
    ids_down: float = 0.0
    server_seconds: float = 0.0

    def add(self, phase: str, sent: Sent) -> None:
        """Meter what ``phase`` (a name of :data:`hyfl.algorithms.hyfdca_round.PHASES`) sent."""
        if phase not in PHASES:
            raise ValueError(f"{phase!r} is not a phase of HyFDCA's round")
        self.floats_up += sent.floats_up
        self.floats_down += sent.floats_down
        self.ids_down += sent.ids_down
        self.server_seconds += sent.server_seconds
        if sent.encrypted:
            self.traffic.add(phase, sent.encrypted)
        if sent.draws is not None:
            self.traffic.draws = sent.draws


@dataclass
class SampleRound:
    """What the phases of one round of a per-sample rule share (``HyFDCA._sample_*``)."""

    t: int
    active: np.ndarray
    clients: np.ndarray
    gamma_t: float
    # round: the draws and SecureInnerProduct
    drawn_rows: np.ndarray | None = None
    drawn_samples: np.ndarray | None = None
    samples: np.ndarray | None = None  # the distinct drawn samples (the updated ones)
    drawn_slot: np.ndarray | None = None  # each draw's position in samples
    client_of_drawn: np.ndarray | None = None
    holder_slot: np.ndarray | None = None  # each holder row's position in samples
    holder_sq: np.ndarray | None = None  # its squared norm
    fresh: np.ndarray | None = None  # the holder row's client is active
    active_rows: np.ndarray | None = None  # the active holders' rows
    updated_pairs: tuple | None = None  # (client, sample) of each active holder row
    z: np.ndarray | None = None  # the summed inner products
    # steps, duals, verdict
    delta: np.ndarray | None = None  # the drawn samples' dual steps
    step: np.ndarray | None = None  # the aggregated step of each updated sample
    row_step: np.ndarray | None = None  # ... of each active holder row
    dw: np.ndarray | None = None  # its primal image
    accepted: bool = True
    beta: float | None = None


@dataclass
class CocoaRound:
    """What the phases of one ``cocoa`` round share (``HyFDCA._cocoa_*``)."""

    t: int
    active: np.ndarray
    clients: np.ndarray
    # round: the draws and SecureInnerProduct
    counts: np.ndarray | None = None  # draws of each active client
    sizes: np.ndarray | None = None  # its samples
    full_pass: bool = False  # every active client draws all of its samples
    drawn_rows: np.ndarray | None = None
    drawn_samples: np.ndarray | None = None
    ascending: np.ndarray | None = None  # the draws in ascending order (the solver's reads)
    busiest_share: float = 0.0
    sip_samples: np.ndarray | None = None  # every sample of the active clients
    z: np.ndarray | None = None  # their summed inner products
    fresh_sq_sip: np.ndarray | None = None  # their active holders' squared norms
    exact: bool = True  # the line search is exact (hyfl.algorithms.hyfdca_certify)
    # proposals: the model and the local solve
    pairs: np.ndarray | None = None  # each active client's history directions
    offsets: Any = None  # offsets(a, rows): margin offsets (n, C) of active client a's rows
    samples: np.ndarray | None = None  # the distinct drawn samples (the updated ones)
    proposal: np.ndarray | None = None  # their aggregated proposal
    # image
    updated_rows: np.ndarray | None = None  # the active holders' rows of samples
    updated_slot: np.ndarray | None = None  # their positions in samples
    updated_clients: np.ndarray | None = None
    previous: np.ndarray | None = None  # the samples' previous steps
    mu: np.ndarray | None = None  # the momentum coefficient
    # direction
    y: np.ndarray | None = None
    y_weight: np.ndarray | None = None
    alpha_before: np.ndarray | None = None
    direction: np.ndarray | None = None
    dw: np.ndarray | None = None  # its primal image
    estimates: dict = field(default_factory=dict)  # absent clients' estimated images
    exact_samples: np.ndarray | None = None  # samples whose group estimate is exact
    limit: float = 1.0  # the line search's interval
    # step, certify
    step: np.ndarray | None = None
    certifications: int = 0
    ahead: bool = False  # its inner products came with the last round's step


def _image_of(state: HyFDCAState, r: CocoaRound, change: np.ndarray) -> np.ndarray:
    """The server's w change when the active holders re-send their image of ``change``."""
    return primal_aggregation_rows(state, r.updated_rows, change, r.updated_slot)


def _line_search_values(loss, limit: float, n_outputs: int) -> int:
    """Values of each client's encrypted line-search sums: the sums at the search's points,
    3 more per output, the certificate's terms (objective, dual, accuracy) and a tag."""
    return n_outputs * (line_search_points(loss, limit).size + 3) + evaluation_size(n_outputs) + 1


def _cocoa_idle(state: HyFDCAState, t: int) -> dict[str, float]:
    """A ``cocoa`` round nobody takes part in: only the history and the average move on."""
    local, C = state.local, state.w.shape[1]
    clients = np.empty(0, dtype=np.int64)
    local.history.record(t, state.w, clients, clients, np.empty((0, C)))
    record_composites(state, t)
    local.average_w *= 1.0 - average_weight(t)
    local.average_w += average_weight(t) * state.w
    return {"updated_samples": 0.0, "accepted": 0.0, "step": 0.0,
            "sigma": float(local.sigma), "momentum": 0.0, "client_share_max": 0.0}


def _cocoa_certify(state: HyFDCAState, r: CocoaRound) -> Sent:
    """``certify``: the certificate's bookkeeping (:func:`certify_round`); a judge decides
    on each checkpoint whose images are all in, from two conjugate sums and the two
    squared norms of w, with who made each change the sums hold (3 ids)."""
    certificate = state.local.certificate
    if certificate is None:
        return Sent()
    # A round whose step is positive may have moved any of its samples (the server
    # cannot tell a zero change inside a packed ciphertext).
    certificate.explored_changes += 1
    moved = r.samples if np.any(r.step > 0) else r.samples[:0]
    r.certifications, made = certify_round(state, r.active, moved, r.exact, r.t)
    return Sent(floats_down=2 * r.certifications, ids_down=3 * made,
                encrypted={"certify_down": 2 * r.certifications})


@dataclass
class LocalState:
    """What the ``cocoa`` rule keeps between rounds (see :mod:`hyfl.algorithms.hyfdca_local`)."""

    history: SpanHistory
    sigma: float
    sigma_ceiling: float
    previous_step: np.ndarray  # (N, C) the last applied dual change
    previous_dw: np.ndarray  # (M, C) its primal image
    average_alpha: RunningAverage | None  # the duals' average (without the certificate)
    average_w: np.ndarray
    previous_samples: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    coherence: np.ndarray = field(default_factory=lambda: np.zeros(1))  # see line_search_curvature
    certificate: Certificate | None = None  # see hyfl.algorithms.hyfdca_certify
    ahead: bool = False  # the last round's step brought this round's inner products
    # The model of the absent holders (hyfl.algorithms.hyfdca_groups; None: not a grid-like
    # partition): the sample groups, their composite weights' history, and per client the
    # estimate of its missing image that w holds until it returns, (|M_k|, C).
    groups: SampleGroups | None = None
    group_history: GroupHistory | None = None
    absent_estimate: list = field(default_factory=list)


@dataclass
class HyFDCAState:
    """Everything HyFDCA keeps between outer iterations (see module docstring).

    Server side: ``alpha`` (N, C) global duals, ``w`` (M, C) global weights,
    and (through ``snapshots``) the partial inner products each client last
    sent. Client side: ``alpha_local`` (R, C) each client's copy of its
    samples' duals.
    """

    problem: Problem
    blocks: StackedBlocks
    counts: np.ndarray
    sq_norms: np.ndarray
    alpha: np.ndarray
    alpha_local: np.ndarray
    snapshots: WeightSnapshots
    w: np.ndarray
    was_active: np.ndarray
    beta: float
    beta_min: float
    feature_counts: np.ndarray  # (K,) |M_k|, for counting the weights that travel
    updated_at: np.ndarray  # (N,) last round that changed each dual (0: never)
    last_active: np.ndarray  # (K,) last round each client took part in (0: never)
    changes: DualChangeLog  # which duals changed in which recent round (for refreshes)
    copy_residue: np.ndarray  # (S,) ascending rows a refresh left unequal to the server's dual
    t: int
    horizontal: bool = False
    local: LocalState | None = None
    stats: dict = field(default_factory=dict)
    traffic: RoundTraffic | None = None  # the last round's encrypted messages


# ---------------------------------------------------------------------------
# Server and client halves (vectorized over all participating clients)
# ---------------------------------------------------------------------------


class DualChangeLog:
    """The server's record of which duals changed in which recent round.

    A returning client must receive the duals of its samples that changed
    while it was away (``updated_at > last_active``). Looking for them among
    all its rows costs the size of its block; the log lists the changes
    themselves, in round order, so the changes after any round are a suffix
    of it. A round logs the samples the server may have updated (see
    :func:`_candidates_last_round`), repeats included, as they come; only an
    entry whose round equals its sample's ``updated_at`` is live (the sample's
    latest change), and readers skip the others and drop repeated rows.

    The log holds every change of the rounds after ``start``. It forgets the
    rounds nobody can need (up to the earliest last active round of any
    client) and, to keep at most ``limit`` entries (memory O(N)), its oldest
    rounds; a client absent since before ``start`` is then refreshed by
    scanning its rows (see :func:`_stale_rows`).

    Attributes
    ----------
    samples, rounds : ndarray of int32, shape (capacity,)
        Entries ``head:tail`` are the log: changed sample and the round that
        changed it, rounds non-decreasing.
    head, tail : int
    start : int
        Every change made after this round is logged.
    limit : int
        Most entries kept (the number of samples).
    """

    def __init__(self, samples, rounds, head: int, tail: int, start: int, limit: int):
        self.samples, self.rounds = samples, rounds
        self.head, self.tail, self.start, self.limit = head, tail, start, limit

    @classmethod
    def empty(cls, n_samples: int) -> DualChangeLog:
        nothing = np.empty(0, dtype=np.int32)
        return cls(nothing, nothing.copy(), 0, 0, 0, int(n_samples))

    def __len__(self) -> int:
        return self.tail - self.head

    def since(self, round_: int) -> tuple[np.ndarray, np.ndarray]:
        """Entries (samples, rounds), shape (E,) each, of the rounds after ``round_``.

        ``round_`` must not precede ``start`` (earlier changes may be forgotten).
        """
        rounds = self.rounds[self.head : self.tail]
        first = self.head + int(np.searchsorted(rounds, round_, side="right"))
        return self.samples[first : self.tail], self.rounds[first : self.tail]

    def append(self, round_: int, samples: np.ndarray, forget_through: int) -> None:
        """Log ``samples`` (shape (n,)) as changed in ``round_``.

        Rounds up to ``forget_through`` (nobody's last active round precedes
        it) are forgotten first; then whole oldest rounds while the log would
        exceed ``limit`` entries (whole rounds: the log stays complete after
        ``start``).
        """
        n = samples.size
        self._forget_through(forget_through)
        excess = len(self) + n - self.limit
        if excess > len(self):  # the round alone exceeds the limit: forget all through it
            self._forget_through(round_)
            return
        if excess > 0:
            self._forget_through(int(self.rounds[self.head + excess - 1]))
        if self.tail + n > self.samples.size:  # compact, growing by doubling up to the limit
            size = len(self)
            capacity = max(min(2 * (size + n), self.limit), size + n, self.samples.size)
            for name in ("samples", "rounds"):
                old = getattr(self, name)
                buffer = np.empty(capacity, dtype=np.int32) if capacity > old.size else old
                buffer[:size] = old[self.head : self.tail].copy()
                setattr(self, name, buffer)
            self.head, self.tail = 0, size
        self.samples[self.tail : self.tail + n] = samples
        self.rounds[self.tail : self.tail + n] = round_
        self.tail += n

    def _forget_through(self, round_: int) -> None:
        rounds = self.rounds[self.head : self.tail]
        self.head += int(np.searchsorted(rounds, round_, side="right"))
        self.start = max(self.start, round_)


def _candidates_last_round(state: HyFDCAState) -> np.ndarray:
    """Samples whose duals round ``state.t`` may have changed, shape (n,), repeats allowed.

    The server knows which duals it may have updated last round: those it
    committed (``dual_commit`` of its ``step`` phase, the cocoa rule) or
    aggregated the drawn steps of (``dual_up`` of its ``steps`` phase, the
    per-sample rules; applied only if accepted), named by the round's traffic
    record (:class:`~hyfl.costs.RoundTraffic`). Which of them did change, ``updated_at``
    tells when the log is read. A round whose record names neither (nobody
    took part) falls back to a pass over all N samples.
    """
    traffic = state.traffic
    if isinstance(traffic, RoundTraffic):
        if traffic.rule == COCOA:
            committed = traffic.message("step", "dual_commit")
            if committed is not None:
                return np.asarray(committed)
        else:
            steps = traffic.message("steps", "dual_up")
            if steps is not None:
                return np.asarray(steps[1])
    return np.flatnonzero(state.updated_at == state.t)


def log_last_round(state: HyFDCAState) -> None:
    """Log the duals the previous round changed (:class:`DualChangeLog`; at round start)."""
    if state.t > 0:
        state.changes.append(state.t, _candidates_last_round(state), int(state.last_active.min()))


def server_refresh_newcomers(
    state: HyFDCAState, newcomers: np.ndarray, stale_rows: np.ndarray | None = None
):
    """Send newcomers the duals that changed while they were away.

    Parameters
    ----------
    state : HyFDCAState
        Its clients' dual copies (``alpha_local``) and ``copy_residue`` are updated in place.
    newcomers : ndarray of bool, shape (K,)
    stale_rows : ndarray of int, shape (S,), optional
        Ascending rows of the newcomers whose dual changed since their client
        last took part (:func:`_stale_rows`, computed when not given).

    Returns
    -------
    tuple (rows, change) or None
        The refreshed rows, shape (S',) ascending, and the change of their
        copies, shape (S', C); ``None`` if no copy changed.

    Notes
    -----
    A copy is refreshed by adding the difference, and ``a + (b - a)`` need not
    round to ``b``: such copies (rare) are kept in ``copy_residue`` and
    compared again when their client next returns, so exactly the copies that
    differ from the server's duals are refreshed -- the same rows as
    comparing every row of every newcomer, at the cost of the stale ones.
    """
    if not newcomers.any() or state.t == 0:
        return None  # in the first round every copy already equals the (zero) duals
    blocks = state.blocks
    if stale_rows is None:
        stale_rows = _stale_rows(state, newcomers)
    residue = state.copy_residue
    returning = newcomers[blocks.clients_of(residue)]
    if residue.size:
        stale_rows = np.concatenate((stale_rows, residue[returning]))
    rows = hyfdca_kernels.distinct(stale_rows)
    # One compiled pass compares, updates and re-checks each row (the same
    # element-wise operations as NumPy's, without a call per step).
    moved, change, inexact = hyfdca_kernels.refresh_copies(
        rows, blocks.row_sample, state.alpha, state.alpha_local
    )
    rows, change, inexact = rows[moved], change[moved], inexact[moved]
    if returning.any() or inexact.any():
        state.copy_residue = hyfdca_kernels.distinct(
            np.concatenate((residue[~returning], rows[inexact]))
        )
    if rows.size == 0:
        return None
    return rows, change


def record_composites(state: HyFDCAState, t: int) -> list[np.ndarray] | None:
    """Record round ``t``'s composite weights of every sample group (None without groups):
    on each client's slice of its group's coordinates, the weights it last computed inner
    products with."""
    local = state.local
    if local.groups is None:
        return None
    snapshots = state.snapshots
    features = state.blocks.client_features
    composites = local.groups.composite(
        lambda k: snapshots.store[snapshots.slot[k]][features[k]])
    local.group_history.record(t, composites)
    return composites


def drop_absent_estimates(state: HyFDCAState, clients: np.ndarray) -> None:
    """The flagged clients re-sent their exact primal parts: drop the estimates of their
    missing images that ``w`` held (:mod:`hyfl.algorithms.hyfdca_groups`)."""
    for k in np.flatnonzero(clients):
        estimate = state.local.absent_estimate[k]
        if estimate.any():
            state.w[state.blocks.client_features[k]] -= estimate
            estimate[:] = 0.0


def reporter_offsets(blocks, active, clients, samples, offsets, n_outputs: int) -> np.ndarray:
    """Per sample, the margin offset of its first active holder (who reports it to the
    line search), shape (n, C); ``offsets(a, rows)`` gives active client ``a``'s."""
    rows, holders = hyfdca_kernels.first_active_holders(blocks, samples, active)
    slot = np.flatnonzero(rows >= 0)
    rows, holders = rows[slot], holders[slot]
    out = np.zeros((samples.size, n_outputs))
    by_client, bounds = hyfdca_kernels.group_order(np.searchsorted(clients, holders),
                                                   clients.size)
    for a in np.flatnonzero(np.diff(bounds)):
        sel = by_client[bounds[a]:bounds[a + 1]]
        out[slot[sel]] = offsets(int(a), rows[sel])
    return out


def estimate_absent_images(state: HyFDCAState, active, clients, pairs, samples, direction,
                           updated_rows, updated_slot):
    """The absent holders' image of the round's direction, per sample group
    (:func:`hyfl.algorithms.hyfdca_groups.absent_image`).

    Returns the image on the absent features (M, C), each absent client's part of it
    (``{k: (|M_k|, C)}``), which of ``samples`` had an exact estimate, and how many
    clients sent span sums.
    """
    local, problem = state.local, state.problem
    groups, history = local.groups, local.group_history
    lam_n = problem.lam * problem.n_samples
    total = np.zeros_like(state.w)
    parts: dict[int, np.ndarray] = {}
    exact_samples = np.zeros(samples.size, dtype=bool)
    of_sample = groups.of_sample[samples]
    # The samples and the updated rows of each group (of_sample == g, of the updated
    # rows' samples == g), sorted out once rather than compared with every group.
    by_sample, sample_bounds = hyfdca_kernels.group_order(of_sample, groups.n_groups)
    by_row, row_bounds = hyfdca_kernels.group_order(of_sample, groups.n_groups, updated_slot)
    senders = 0
    for g in np.flatnonzero(np.diff(sample_bounds)):
        members = groups.members[g]
        present, absent = members[active[members]], members[~active[members]]
        if absent.size == 0 or present.size == 0:
            continue
        sel = by_sample[sample_bounds[g]:sample_bounds[g + 1]]
        sender = int(present[0])
        a = int(np.searchsorted(clients, sender))
        sums = ring_span_sums(local.history.z, samples[sel], pairs[a], direction[sel], lam_n,
                              local.history.z_column)
        in_group = by_row[row_bounds[g]:row_bounds[g + 1]]
        active_image = group_image(state, g, updated_rows[in_group],
                                   direction[updated_slot[in_group]])
        estimates, exact = history.estimate_absent(g, sender, pairs[a], absent, sums,
                                                   active_image, total)
        parts.update(estimates)
        exact_samples[sel] = exact
        senders += 1
    return total, parts, exact_samples, senders


def group_image(state: HyFDCAState, g: int, rows: np.ndarray, dual_change: np.ndarray):
    """The image of a dual change on the stacked ``rows`` (of group ``g``'s members), in
    the group's coordinates (L_g, C): each member's on its own slice."""
    groups = state.local.groups
    if groups.disjoint:  # the coordinates are distinct features: read them off w's change
        return groups.lift(g, primal_aggregation_rows(state, rows, dual_change))
    owner = np.searchsorted(state.blocks.client_rowptr, rows, side="right") - 1
    return groups.place(g, {
        int(k): primal_aggregation_rows(state, rows[owner == k],
                                        dual_change[owner == k])[groups.client_features[k]]
        for k in np.unique(owner)})


def primal_aggregation_rows(state: HyFDCAState, rows: np.ndarray, dual_change: np.ndarray,
                            slot: np.ndarray | None = None):
    """Change of ``w`` when the clients owning the stacked ``rows`` re-send their primal part.

    Each client's part is ``sum_i alpha_{k,i} x_{k,i}`` over its samples, so a
    change of its dual copy on some rows changes the server's sum over ``K_m``
    by ``X[rows]^T dual_change``; ``w`` is that sum over ``lam N``. The rows are
    read in place (a compiled kernel adds in the order of SciPy's product),
    without SciPy's fixed cost of gathering them. With ``slot``, row ``j``'s change
    is ``dual_change[slot[j]]`` (no gathered copy).
    """
    problem = state.problem
    change = hyfdca_kernels.rows_transpose_product(state.blocks.X, rows, dual_change, slot)
    return change / (problem.lam * problem.n_samples)


def server_sum_over_holders(values: np.ndarray, slot: np.ndarray, n_slots: int) -> np.ndarray:
    """Sum per-(client, sample) values over the holders of each sample."""
    # Compiled, in np.add.at's order (np.add.at costs ~100 us on a thousand rows).
    return hyfdca_kernels.sum_by_slot(values, slot, n_slots)


def server_aggregate_duals(
    delta: np.ndarray,
    slot: np.ndarray,
    samples: np.ndarray,
    n_holders: np.ndarray,
    gamma_t: float,
) -> np.ndarray:
    """``gamma_t / |B_i| * sum of the steps for i`` for each updated sample."""
    total = hyfdca_kernels.sum_by_slot(delta, slot, samples.size)  # np.add.at's order
    return total * (gamma_t / n_holders[samples])[:, None]


def certified_pair(state: HyFDCAState) -> tuple[np.ndarray, np.ndarray]:
    """The ``cocoa`` rule's certified (weights, duals) (:mod:`hyfl.algorithms.hyfdca_certify`)."""
    cert = state.local.certificate
    if cert.current:
        return state.w, state.alpha
    return cert.w, cert.alpha


def materialize_certificate(state: HyFDCAState, active: np.ndarray) -> None:
    """Before the exploration leaves a certified pair, keep a copy of it (the active
    clients are told with the round's commit, the others when they next take part)."""
    cert = state.local.certificate
    if not cert.current:
        return
    problem = state.problem
    cert.alpha = state.alpha.copy()
    cert.w = state.w.copy()
    cert.conjugate = conjugate_sums(problem.loss, cert.alpha, problem.Y, problem.W)
    cert.certified_changes = cert.explored_changes
    cert.current = False
    cert.events += 1  # EVENTS["leave"]
    cert.cursor[active] = cert.events


def certificate_configure(state: HyFDCAState, active: np.ndarray) -> Sent:
    """What the round's instructions carry for the certificate, and the clients' answers
    (what the ``round`` phase sends for it).

    Every active client gets the line search's limit and the certificate's notices it
    missed; an active client whose image of the open checkpoint is missing gets the
    checkpoint's duals where its copy differs (before its refresh) and sends that image.
    """
    cert, blocks = state.local.certificate, state.blocks
    clients = np.flatnonzero(active)
    sent = Sent(floats_down=clients.size,  # the limit
                ids_down=float(np.sum(cert.events - cert.cursor[clients])))
    cert.cursor[clients] = cert.events
    if cert.checkpoint is None:
        return sent
    asked = clients[cert.pending[clients]]
    if asked.size == 0:
        return sent
    # A copy differs from the checkpoint where its sample changed after the client's last
    # sync and before the checkpoint opened: the rule the protocol's server applies to
    # its round stamps. (Comparing the values instead would count a copy that a refresh
    # made equal up to rounding, and how it rounds depends on the machine's BLAS kernel.)
    differ = hyfdca_kernels.rows_updated_after(blocks, asked, state.last_active[asked],
                                               cert.checkpoint_updated_at)
    sent.encrypted["checkpoint_down"] = (blocks.clients_of(differ), blocks.row_sample[differ])
    sent.floats_up += float(np.sum(state.feature_counts[asked])) * state.w.shape[1]
    cert.pending[asked] = False
    return sent


def certify_round(state: HyFDCAState, active: np.ndarray, moved: np.ndarray, exact: bool,
                  t: int) -> tuple[int, int]:
    """The certificate's bookkeeping at the end of a ``cocoa`` round.

    Marks which clients' block images became stale (absent holders of the
    samples that may have moved), certifies the open checkpoint once no
    client's image of it is missing, and opens the next one. An exact round
    from a certified state leaves the certified pair current. Returns how many
    checkpoints a judge decided on (each one exchange) and how many judges'
    changes the sums it was sent held.
    """
    cert = state.local.certificate
    blocks = state.blocks
    cert.stale[active] = False
    if moved.size:
        cert.stale |= hyfdca_kernels.holding_clients(blocks, moved) & ~active
    if exact and cert.current:
        return 0, 0
    decided = made = 0
    if cert.checkpoint is not None:
        cert.pending &= ~active
        if not cert.pending.any():
            made += cert.certified_changes + cert.checkpoint_changes
            _certify_checkpoint(state, t)
            decided += 1
    if cert.checkpoint is None and not cert.current:
        cert.checkpoint = state.alpha.copy()
        cert.checkpoint_updated_at = state.updated_at.copy()
        cert.checkpoint_changes = cert.explored_changes
        cert.pending = cert.stale.copy()
        cert.opened_at = t
        cert.events += 1  # EVENTS["checkpoint"]
        if cert.pending.any():
            # What the stale clients' images of the checkpoint will add up to
            # (computed here at once; the server learns it when the last one returns).
            problem = state.problem
            cert.checkpoint_w = np.asarray(problem.X.T @ cert.checkpoint) / (
                problem.lam * problem.n_samples)
        else:
            cert.checkpoint_w = state.w.copy()
            made += cert.certified_changes + cert.checkpoint_changes
            _certify_checkpoint(state, t)
            decided += 1
    return decided, made


def _certify_checkpoint(state: HyFDCAState, t: int) -> None:
    """Certify the checkpoint if its dual did not fall; otherwise restart the
    exploration from the certified pair (:mod:`hyfl.algorithms.hyfdca_certify`)."""
    cert, problem, local = state.local.certificate, state.problem, state.local
    checkpoint, checkpoint_w = cert.checkpoint, cert.checkpoint_w
    cert.checkpoint = cert.checkpoint_w = cert.checkpoint_updated_at = None
    # The conjugate sum at the checkpoint: in the protocol the server keeps it
    # from the judges' encrypted changes; here it is recomputed.
    checkpoint_conjugate = conjugate_sums(problem.loss, checkpoint, problem.Y, problem.W)
    accepted = checkpoint_accepted(cert.w, cert.conjugate, checkpoint_w, checkpoint_conjugate,
                                   problem.lam, problem.n_samples)
    cert.trust = next_trust(cert.trust, accepted)
    cert.events += 1  # EVENTS["accept"] or EVENTS["reject"]
    if accepted:
        cert.alpha, cert.w, cert.conjugate = checkpoint, checkpoint_w, checkpoint_conjugate
        cert.certified_changes = cert.checkpoint_changes
        if not cert.stale.any() and cert.opened_at == t:
            cert.current = True  # the exploration has not moved since: it sits on it
        return
    # Restart the exploration from the certified pair: the server restores its block
    # images and ciphertexts, every client its copy.
    local.ahead = False  # the next round's inner products were made with the explored w
    state.alpha[:] = cert.alpha
    state.w[:] = cert.w
    cert.explored_changes = cert.certified_changes
    for estimate in local.absent_estimate:  # the certified w is exact
        estimate[:] = 0.0
    state.alpha_local[:] = cert.alpha[state.blocks.row_sample]
    local.previous_step[:] = 0.0
    local.previous_dw[:] = 0.0
    cert.stale[:] = False
    cert.current = True
    # Every copy is in step as of this round: a returning client's refresh sends only
    # what changes from now on (the server's ``reset_at``).
    state.last_active[:] = t


def row_squared_norms(X: sp.csr_matrix, chunk: int = 8192) -> np.ndarray:
    """Squared Euclidean norm of every row of a CSR matrix.

    Works on views of ``X.data`` a chunk of rows at a time, so the temporary
    memory stays small even for the whole training matrix.
    """
    n = X.shape[0]
    out = np.zeros(n)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        lo, hi = X.indptr[start], X.indptr[stop]
        values = X.data[lo:hi]
        local_rows = np.repeat(np.arange(stop - start), np.diff(X.indptr[start : stop + 1]))
        out[start:stop] = np.bincount(local_rows, weights=values * values, minlength=stop - start)
    return out


def _dual_gain_estimate(
    state: HyFDCAState, samples, step, z, dw, fresh_sq_norms
) -> tuple[float, float]:
    """Estimated change of the dual objective if the round's update is applied.

    ``D(a + d) - D(a) = 1/N sum_i [-(l*(-(a_i + d_i)) - l*(-a_i)) - z_i d_i]
    - lam/2 ||A d||^2``, where ``z_i`` are the inner products the clients
    used for their steps and ``A d`` is the change of ``w``. The server knows
    the part of ``A d`` contributed by the active holders (``dw``); absent
    holders add their part when they return, so ``||A d||^2`` is estimated by
    scaling ``||dw||^2`` with the ratio of full to active squared norms.
    With full participation, or a horizontal split, nobody is stale and the
    estimate is exact. In a deployment the per-sample terms are summed under
    encryption by the holders of the samples; the server supplies ``||dw||^2``.

    Returns the estimated gain and the size of its terms (for a rounding tolerance).
    """
    problem = state.problem
    loss = problem.loss
    y, y_weight = problem.Y[samples], problem.weights_of(samples)
    old = state.alpha[samples]
    first_order = np.sum(-(loss.conjugate(old + step, y, y_weight)
                           - loss.conjugate(old, y, y_weight)) - z * step)
    weight = np.sum(step * step, axis=1)
    return dual_gain(
        float(first_order),
        full_weight=float(np.sum(state.sq_norms[samples] * weight)),
        active_weight=float(np.sum(fresh_sq_norms * weight)),
        dw_sq=float(np.sum(dw * dw)),
        lam=problem.lam,
        N=problem.n_samples,
    )


def _stale_rows(state: HyFDCAState, newcomers: np.ndarray) -> np.ndarray:
    """Rows of the newcomers whose sample's dual changed since their client last took part.

    Parameters
    ----------
    state : HyFDCAState
    newcomers : ndarray of bool, shape (K,)

    Returns
    -------
    ndarray of int64, shape (S,)
        Ascending stacked rows (so in client, then sample, order).

    Notes
    -----
    Two ways give the same rows. From the log (:class:`DualChangeLog`): the
    holders' rows of every dual changed since the longest-absent newcomer
    left, kept where the holder is a newcomer absent at that change; this
    costs the changes, times the holders per sample. Or every row of every
    newcomer, compared against ``updated_at``. The cheaper one is taken:
    the log when the changes are few next to the newcomers' blocks (a round
    with a handful of draws per client), the scan when most samples change
    every round (full local passes) or a newcomer left before the log starts.
    """
    blocks, log = state.blocks, state.changes
    k = np.flatnonzero(newcomers)
    first = blocks.client_rowptr[k]
    sizes = blocks.client_rowptr[k + 1] - first
    oldest = int(state.last_active[k].min())
    if oldest >= log.start:
        samples, rounds = log.since(oldest)
        holders_per_sample = blocks.X.shape[0] / max(blocks.n_samples, 1)
        if samples.size * holders_per_sample < sizes.sum():
            # A holder missed a change if it is a newcomer absent at that round.
            # Superseded entries are skipped; a sample logged twice in a round
            # gives its rows twice, so the rows are made distinct (one compiled
            # pass: the NumPy version cost a dozen calls on a few rows).
            missed_after = np.where(newcomers, state.last_active, np.iinfo(np.int64).max)
            return hyfdca_kernels.stale_rows_from_log(
                blocks, samples, rounds, state.updated_at, missed_after
            )
    return hyfdca_kernels.rows_updated_after(blocks, k, state.last_active[k], state.updated_at)


def _stale_copies(blocks: StackedBlocks, stale_rows: np.ndarray):
    """(clients, samples) of returning clients' dual copies changed while they were away.

    The server cannot see dual values, only which it updated and when, so
    it re-sends every dual updated after the client's last active round:
    the rows :func:`_stale_rows` finds.
    """
    return blocks.clients_of(stale_rows), blocks.row_sample[stale_rows]


def _busiest_client_share(blocks: StackedBlocks, clients: np.ndarray) -> float:
    """Busiest client's share of the non-zeros of all the given clients' rows (the
    work of a round over every row of theirs: :func:`_busiest_share` of those rows)."""
    if clients.size == 0:
        return 0.0
    indptr, rowptr = blocks.X.indptr, blocks.client_rowptr
    work = (indptr[rowptr[clients + 1]] - indptr[rowptr[clients]]).astype(np.float64)
    total = work.sum()
    return float(work.max() / total) if total > 0 else 1.0 / clients.size


def _busiest_share(blocks: StackedBlocks, rows: np.ndarray, n_active: int) -> float:
    """Busiest client's share of the non-zeros its rows contribute to the round.

    Parameters
    ----------
    blocks : StackedBlocks
    rows : ndarray of int, shape (n,)
        Stacked rows the round works on (a repeated row counts again).
    n_active : int

    Notes
    -----
    Reads the non-zero counts of these rows from ``X.indptr``, never a diff of
    all R rows. When the rows are whole runs of consecutive rows in ascending
    order (every row of the active clients, as the cocoa rule reports), each
    client's count is one difference of ``indptr`` at the ends of its run:
    K binary searches instead of one per row.
    """
    if n_active == 0:
        return 0.0
    indptr = blocks.X.indptr
    work = None
    if rows.size > blocks.n_clients and np.all(rows[1:] >= rows[:-1]):
        ends = np.searchsorted(rows, blocks.client_rowptr)  # client k's: rows[ends[k]:ends[k + 1]]
        some = np.flatnonzero(ends[1:] > ends[:-1])
        first, last = rows[ends[some]], rows[ends[some + 1] - 1]
        if np.array_equal(last - first, ends[some + 1] - 1 - ends[some]):  # consecutive rows
            work = np.zeros(blocks.n_clients)
            work[some] = indptr[last + 1] - indptr[first]
    if work is None:  # (integer sums in float64, exact in any order)
        work = hyfdca_kernels.client_nonzeros(blocks, rows)
    total = work.sum()
    return float(work.max() / total) if total > 0 else 1.0 / n_active
