"""A slow, obviously-correct HyFDCA: one object per client, loops everywhere.

It follows Algorithm 1 message by message with plain Python containers and
recomputes every aggregate from scratch (no incremental updates, no stacking),
so that the vectorized engine in ``hyfl.algorithms.hyfdca`` can be checked
against it iterate by iterate. It draws its random numbers through the same
``draw_local_samples`` call as the engine, so a seed fixes the same draws.
"""

from __future__ import annotations

import numpy as np

from hyfl.algorithms.base import draw_local_samples
from hyfl.partition import Partition, client_block, stack
from hyfl.problem import Problem


class Client:
    def __init__(self, k, samples, features, X_local, n_outputs):
        self.k = k
        self.samples = samples  # I_k, sorted global ids
        self.features = features  # M_k, sorted global ids
        self.X = X_local.toarray()  # N_k x |M_k|, dense for clarity
        self.alpha = np.zeros((len(samples), n_outputs))  # copy of own samples' duals
        self.w = np.zeros((len(features), n_outputs))  # copy of own features' weights
        self.position = {int(i): p for p, i in enumerate(samples)}

    def inner_product(self, i):
        return self.X[self.position[i]] @ self.w

    def primal_part(self):
        return self.X.T @ self.alpha


class ReferenceHyFDCA:
    def __init__(self, problem: Problem, partition: Partition, hyfdca):
        self.problem = problem
        self.cfg = hyfdca
        N, C = problem.Y.shape
        blocks = stack(partition, problem.X)
        self.clients = []
        for k in range(partition.n_clients):
            samples, features, Xk = client_block(blocks, k)
            self.clients.append(Client(k, samples, features, Xk, C))
        self.holders = {i: [] for i in range(N)}
        for c in self.clients:
            for i in c.samples:
                self.holders[int(i)].append(c.k)
        self.sq_norm = np.asarray(problem.X.multiply(problem.X).sum(axis=1)).ravel()
        H = hyfdca.steps_per_client(N, len(self.clients))
        self.counts = np.array([min(H, len(c.samples)) for c in self.clients])
        self.alpha = np.zeros((N, C))
        self.ip = {}  # (k, i) -> last partial inner product received
        self.hat_w = {c.k: np.zeros((len(c.features), C)) for c in self.clients}
        self.w = np.zeros((problem.n_features, C))
        self.prev_active = set()
        self.beta = 1.0
        self.beta_min = 1.0 / max(len(v) for v in self.holders.values())
        self.t = 0

    # -- server helpers ------------------------------------------------------
    def aggregate_primal(self):
        total = np.zeros_like(self.w)
        for c in self.clients:
            for local, m in enumerate(c.features):
                total[m] += self.hat_w[c.k][local]
        return total / (self.problem.lam * self.problem.n_samples)

    def step(self, i, alpha_i, z_i, k, gamma_t):
        p, cfg = self.problem, self.cfg
        lam, N, loss = p.lam, p.n_samples, p.loss
        y = p.Y[i : i + 1]
        a = alpha_i[None, :]
        z = z_i[None, :]
        if cfg.step_rule == "paper":
            if loss.name == "hinge":
                return (y * np.clip(lam * N * (1 - z) + y * a, 0, 1) - a)[0]
            return loss.dual_step(a, z, np.full_like(a, 1 / (lam * N)), y)[0]
        if cfg.step_rule == "safe":
            q = np.full_like(a, max(self.beta * self.sq_norm[i] / (lam * N), 1e-300))
            return loss.dual_step(a, z, q, y)[0]
        q = np.full_like(a, max(gamma_t * self.sq_norm[i] / lam, 1e-300))
        best = loss.dual_step(a, z, q, y)
        c = len(self.clients[k].samples) / N if cfg.client_weight == "N_k/N" else 1.0
        end = c * (loss.dual_target(z, y) - a)
        return np.clip(best, np.minimum(0, end), np.maximum(0, end))[0]

    # -- one outer iteration -------------------------------------------------
    def round(self, active_mask, rng):
        self.t += 1
        t = self.t
        gamma_t = 1.0 / t if self.cfg.gamma == "1/t" else float(self.cfg.gamma)
        active = [k for k in range(len(self.clients)) if active_mask[k]]
        newcomers = [k for k in active if k not in self.prev_active]

        # Refresh newcomers: duals down, primal parts up, weights down.
        for k in newcomers:
            c = self.clients[k]
            c.alpha = self.alpha[c.samples].copy()
            self.hat_w[k] = c.primal_part()
        self.w = self.aggregate_primal()
        for k in newcomers:
            self.clients[k].w = self.w[self.clients[k].features].copy()

        # Draw H samples per active client (same call as the engine).
        sizes = np.array([len(self.clients[k].samples) for k in active], dtype=np.int64)
        positions = draw_local_samples(rng, sizes, self.counts[active])
        drawn, offset = {}, 0
        for k in active:
            n = self.counts[k]
            drawn[k] = [int(self.clients[k].samples[p]) for p in positions[offset : offset + n]]
            offset += n
        U = sorted({i for k in active for i in drawn[k]})

        # SecureInnerProduct (Algorithm 2): every active client, all its samples.
        for k in active:
            c = self.clients[k]
            for i in c.samples:
                self.ip[(k, int(i))] = c.inner_product(int(i))
        C = self.problem.n_outputs
        z = {
            i: sum((self.ip.get((k, i), np.zeros(C)) for k in self.holders[i]), np.zeros(C))
            for i in U
        }

        # LocalDualMethod on each client, then dual aggregation on the server.
        new_alpha = self.alpha.copy()
        for k in active:
            c = self.clients[k]
            for i in drawn[k]:
                delta = self.step(i, c.alpha[c.position[i]], z[i], k, gamma_t)
                new_alpha[i] += gamma_t / len(self.holders[i]) * delta

        # Candidate primal weights after the active clients re-send their parts.
        candidate_hat = dict(self.hat_w)
        for k in active:
            c = self.clients[k]
            candidate_hat[k] = c.X.T @ new_alpha[c.samples]
        saved, self.hat_w = self.hat_w, candidate_hat
        candidate_w = self.aggregate_primal()
        self.hat_w = saved

        accepted = True
        if self.cfg.step_rule == "safe":
            p = self.problem
            first_order = 0.0
            full = active_part = 0.0
            for i in U:
                d = new_alpha[i] - self.alpha[i]
                y = p.Y[i]
                first_order += np.sum(
                    -(p.loss.conjugate(new_alpha[i], y) - p.loss.conjugate(self.alpha[i], y))
                    - z[i] * d
                )
                full += self.sq_norm[i] * np.sum(d * d)
                for k in self.holders[i]:
                    if k in active:
                        c = self.clients[k]
                        part = c.X[c.position[i]]
                        active_part += part @ part * np.sum(d * d)
            missing = full / active_part if active_part > 0 else 1.0
            dw = candidate_w - self.w
            quadratic = 0.5 * p.lam * np.sum(dw * dw) * missing
            gain = first_order / p.n_samples - quadratic
            scale = abs(first_order) / p.n_samples + quadratic
            beta_max = max(1.0, float(sum(self.counts[k] for k in active)))
            accepted = gain >= -1e-10 * scale or self.beta >= beta_max
            self.beta = self.beta * (0.95 if accepted else 2.0)
            self.beta = min(max(self.beta, self.beta_min), beta_max)
        if accepted:
            self.alpha = new_alpha
            self.hat_w = candidate_hat
            self.w = candidate_w
        for k in active:
            c = self.clients[k]
            c.alpha = self.alpha[c.samples].copy()
            c.w = self.w[c.features].copy()

        if self.cfg.refresh_inner_products:
            for k in active:
                c = self.clients[k]
                for i in c.samples:
                    self.ip[(k, int(i))] = c.inner_product(int(i))
        self.prev_active = set(active)
        return accepted


class ReferenceCocoa:
    """The ``cocoa`` rule (hyfl.algorithms.hyfdca_local) in plain loops, one object per client.

    Every client keeps its own list of (round, inner products of its samples);
    the server keeps the model ``w`` of every round. Local subproblems are
    solved sample by sample with ``loss.dual_step`` on 1-element arrays, with the
    model's residual on the client's own features formed explicitly as
    ``x_i[own] - Q[own] phi_i``; the aggregates are recomputed from scratch, and the
    running averages are dense.

    Where every client's samples have one set of holders (hyfl.algorithms.hyfdca_groups)
    the directions are those of the group's *composite* weights, kept per round in the
    group's coordinates: one per (member, feature of that member), member after member,
    so that members may share features; on each member's slice, the weights it last
    computed inner products with. A client's margins are moved to the server's ``w`` by
    ``x_i^T Q Q^T (w - w~)``; and the absent members' image of a move is the least-norm
    vector on their slices whose products with the directions match the image of the
    move in those coordinates (each member's rows on its slice, taken here from the
    rows, not from remembered margins) minus the active members' part, summed back onto
    the features.
    """

    SHORT, FULL, SHRINK = 0.5, 0.95, 0.8

    def __init__(self, problem: Problem, partition: Partition, hyfdca):
        self.problem, self.cfg = problem, hyfdca
        N, C = problem.Y.shape
        blocks = stack(partition, problem.X)
        self.clients = []
        for k in range(partition.n_clients):
            samples, features, Xk = client_block(blocks, k)
            self.clients.append(Client(k, samples, features, Xk, C))
        self.holders = {i: [] for i in range(N)}
        for c in self.clients:
            for i in c.samples:
                self.holders[int(i)].append(c.k)
        # Sample groups: clients whose samples all have the same holders; else None (the
        # server's own w is the history).
        holder_sets = [{tuple(self.holders[int(i)]) for i in c.samples} for c in self.clients]
        self.group_of = None
        if all(len(h) == 1 for h in holder_sets):
            self.group_of = [next(iter(h)) for h in holder_sets]  # named by its members
        self.sip_w = {c.k: np.zeros((len(c.features), C)) for c in self.clients}
        self.composite_of_round = {}  # round -> {group: composite weights (L_g, C)}
        self.estimate = {c.k: np.zeros((len(c.features), C)) for c in self.clients}
        self.sq_norm = np.asarray(problem.X.multiply(problem.X).sum(axis=1)).ravel()
        H = hyfdca.steps_per_client(N, len(self.clients))
        self.counts = np.array([len(c.samples) if H is None else min(H, len(c.samples))
                                for c in self.clients])
        self.depth = hyfdca.history_depth(problem.n_features)
        self.window = hyfdca.history_slots(N, problem.n_features, C)
        self.alpha = np.zeros((N, C))
        self.ip = {}
        self.hat_w = {c.k: np.zeros((len(c.features), C)) for c in self.clients}
        self.w = np.zeros((problem.n_features, C))
        self.w_of_round = {}
        self.history = {c.k: [] for c in self.clients}  # [(round, {sample: z})], newest first
        self.prev_active = set()
        counts = np.zeros(problem.n_features, dtype=int)
        for c in self.clients:
            counts[c.features] += 1
        self.sigma = float(counts.max())
        self.ceiling = self.sigma * max(len(c.samples) for c in self.clients)
        self.previous_step = np.zeros((N, C))
        self.previous_dw = np.zeros_like(self.w)
        self.avg_alpha = np.zeros((N, C))
        self.avg_w = np.zeros_like(self.w)
        self.coherence = np.zeros(C)
        self.t = 0
        # The certificate (hyfl.algorithms.hyfdca_certify), kept densely: the certified
        # duals, whether they are the current ones, the open checkpoint and the
        # clients whose image of it is missing, the exploration's step factor.
        self.cert_alpha = np.zeros((N, C))
        self.cert_current = True
        self.checkpoint = None
        self.pending = set()
        self.trust = 1.0
        self.decide = None

    def image_of(self, alpha):
        return np.asarray(self.problem.X.T @ alpha) / (self.problem.lam * self.problem.n_samples)

    def dual_of(self, alpha):
        """Per output, the dual objective from the pooled data."""
        p = self.problem
        w = self.image_of(alpha)
        conj = np.sum(p.loss.conjugate(alpha, p.Y), 0)
        return -0.5 * p.lam * np.sum(w * w, 0) - conj / p.n_samples

    def certified(self):
        return self.alpha if self.cert_current else self.cert_alpha

    def stale_clients(self):
        return {c.k for c in self.clients
                if not np.array_equal(c.alpha, self.alpha[c.samples])}

    def certify(self):
        """The checkpoint replaces the certified duals if its pooled dual (summed over the
        outputs) is no lower; otherwise the exploration restarts from the certified duals."""
        start, end = self.cert_alpha.copy(), self.checkpoint
        self.checkpoint = None
        d_start, d_end = np.sum(self.dual_of(start)), np.sum(self.dual_of(end))
        ok = d_end >= d_start - 1e-10 * (1 + abs(d_start))
        if self.decide is not None:  # a test's schedule of verdicts
            ok = self.decide(ok)
        self.trust = min(2 * self.trust, 1.0) if ok else max(self.trust * 0.25, 1 / 64)
        if ok:
            self.cert_alpha = end.copy()
            if not self.stale_clients() and np.array_equal(end, self.alpha):
                self.cert_current = True
            return
        self.alpha = self.cert_alpha.copy()
        self.previous_step = np.zeros_like(self.previous_step)
        self.previous_dw = np.zeros_like(self.previous_dw)
        for k in self.estimate:
            self.estimate[k][:] = 0.0
        for cl in self.clients:
            cl.alpha = self.alpha[cl.samples].copy()
            self.hat_w[cl.k] = cl.primal_part()
        self.w = self.aggregate_primal()
        self.cert_current = True

    def end_round(self, active, exact):
        if exact and self.cert_current:
            return
        if self.checkpoint is not None:
            self.pending -= set(active)
            if not self.pending:
                self.certify()
        if self.checkpoint is None and not self.cert_current:
            self.checkpoint = self.alpha.copy()
            self.pending = self.stale_clients()
            if not self.pending:
                self.certify()

    def aggregate_primal(self):
        total = np.zeros_like(self.w)
        for c in self.clients:
            for local, m in enumerate(c.features):
                total[m] += self.hat_w[c.k][local]
        total /= self.problem.lam * self.problem.n_samples
        for c in self.clients:  # what w holds for the absent members' missing images
            total[c.features] += self.estimate[c.k]
        return total

    def model_of_round(self, k, r):
        """The weights client k's margins of round r were taken with: w, or its group's
        composite."""
        if self.group_of is None:
            return self.w_of_round[r]
        return self.composite_of_round[r][self.group_of[k]]

    def slice_of(self, k):
        """Client k's coordinates in its group's (its members' features, member after
        member)."""
        key = self.group_of[k]
        start = sum(len(self.clients[j].features) for j in key[:key.index(k)])
        return np.arange(start, start + len(self.clients[k].features))

    def columns(self, key):
        """The feature of each coordinate of the group named ``key``."""
        return np.concatenate([self.clients[j].features for j in key])

    def own(self, k):
        """Client k's rows of the directions: its features, or its slice of its group's."""
        return self.clients[k].features if self.group_of is None else self.slice_of(k)

    def directions(self, k, c):
        """(round pairs, D (M or L_g, R)) of client k's directions for output c."""
        rounds = [r for r, _ in self.history[k]][: self.depth]
        pairs = [(rounds[0], None)] + [(rounds[j - 1], rounds[j]) for j in range(1, len(rounds))]
        D = np.column_stack([
            self.model_of_round(k, p)[:, c]
            - (self.model_of_round(k, b)[:, c] if b is not None else 0.0)
            for p, b in pairs
        ])
        return pairs, D

    def transform(self, k, c):
        """(directions as round pairs, T) of client k's model for output c."""
        pairs, D = self.directions(k, c)
        values, vectors = np.linalg.eigh(D.T @ D)
        keep = values > 1e-10 * max(values.max(), 1e-300)
        T = np.zeros((len(pairs), len(pairs)))
        T[:, keep] = vectors[:, keep] / np.sqrt(values[keep])
        return pairs, T

    def phi(self, k, i, c, pairs, T):
        z = {r: values for r, values in self.history[k]}
        m = np.array([z[p][i][c] - (z[b][i][c] if b is not None else 0.0) for p, b in pairs])
        return T.T @ m

    def round(self, active_mask, rng):
        """One round of Algorithm 1 with the ``cocoa`` rule, step by step: the
        newcomers and the refreshed weights, the drawn samples, the shared inner
        products, the margin offsets, the local subproblems, the direction (with
        momentum), the absent members' image, the line search and the step."""
        C = self.problem.n_outputs
        self.t += 1
        t = self.t
        active = [k for k in range(len(self.clients)) if active_mask[k]]
        newcomers = [k for k in active if k not in self.prev_active]
        for k in newcomers:
            c = self.clients[k]
            c.alpha = self.alpha[c.samples].copy()
            self.hat_w[k] = c.primal_part()
            self.estimate[k][:] = 0.0  # its exact part replaces the estimate
        self.w = self.aggregate_primal()
        rho = max(2.0 / (t + 1.0), 0.1)
        if not active:  # an empty round: only the running averages move on
            self.avg_alpha = (1 - rho) * self.avg_alpha + rho * self.alpha
            self.avg_w = (1 - rho) * self.avg_w + rho * self.w
            self.prev_active = set()
            return np.zeros(C)
        for k in active:  # every active client gets the refreshed weights
            self.clients[k].w = self.w[self.clients[k].features].copy()

        drawn = self._draw(active, rng)
        z, exact = self._share_inner_products(active, t)
        offset = self._margin_offsets(active, t)
        proposals = self._local_proposals(active, drawn, z, offset)
        U = sorted(proposals)
        average = {i: np.sum(proposals[i], axis=0) / len(self.holders[i]) for i in U}
        direction = self._direction(U, average, self._image(U, active, average))
        dw = self._image(U, active, direction)
        estimates, spanned = self._absent_images(active, U, direction, dw)
        curvature = self._curvature(active, U, direction, dw, spanned)
        limit = 1.0 if exact else self.trust  # the certificate's trust bounds the step
        step = self._line_search(active, U, direction, z, offset, curvature, limit)
        self._take_step(active, U, direction, step, limit, estimates, dw, exact)
        return step

    def _draw(self, active, rng):
        """Each active client's drawn samples (global ids), through the engine's
        ``draw_local_samples``."""
        sizes = np.array([len(self.clients[k].samples) for k in active], dtype=np.int64)
        positions = draw_local_samples(rng, sizes, self.counts[active])
        drawn, offset = {}, 0
        for k in active:
            n = self.counts[k]
            drawn[k] = [int(self.clients[k].samples[q]) for q in positions[offset: offset + n]]
            offset += n
        return drawn

    def _share_inner_products(self, active, t):
        """The active clients' inner products of their samples with the weights they
        received; each sample's margin ``z`` summed over its holders, the histories
        of inner products and models, and whether the round is exact (no
        certificate, or every holder of every sample present)."""
        C, N = self.problem.n_outputs, self.problem.n_samples
        sip = sorted({int(i) for k in active for i in self.clients[k].samples})
        exact = not self.cfg.certified or (
            self.cert_current and all(k in active for i in sip for k in self.holders[i]))
        for k in active:
            c = self.clients[k]
            self.sip_w[k] = c.w.copy()
            for i in c.samples:
                self.ip[(k, int(i))] = c.inner_product(int(i))
        if self.group_of is not None:
            self.composite_of_round[t] = {}
            for key in set(self.group_of):
                self.composite_of_round[t][key] = np.concatenate([self.sip_w[j] for j in key])
        z = {i: sum((self.ip.get((k, i), np.zeros(C)) for k in self.holders[i]), np.zeros(C))
             for i in range(N)}
        self.w_of_round[t] = self.w.copy()
        for k in active:
            h = [(r, v) for r, v in self.history[k] if r > t - self.window]
            h.insert(0, (t, {int(i): z[int(i)].copy() for i in self.clients[k].samples}))
            self.history[k] = h[: self.depth]
        for k in self.history:  # rounds older than the window are forgotten
            self.history[k] = [(r, v) for r, v in self.history[k] if r > t - self.window]
        return z, exact

    def _margin_offsets(self, active, t):
        """Margin offsets: x_i^T Q Q^T (w - w~) with Q = D T, per active client and
        sample."""
        C = self.problem.n_outputs
        offset = {}
        for k in active:
            for c in range(C):
                pairs, T = self.transform(k, c)
                _, D = self.directions(k, c)
                towards = (T.T @ D.T @ (self.w[self.columns(self.group_of[k])]
                                        - self.model_of_round(k, t))[:, c]
                           if self.group_of is not None else np.zeros(T.shape[1]))
                for i in self.clients[k].samples:
                    offset.setdefault((k, int(i)), np.zeros(C))[c] = (
                        self.phi(k, int(i), c, pairs, T) @ towards)
        return offset

    def _local_proposals(self, active, drawn, z, offset):
        """Local subproblems, sample by sample: sample -> the active holders'
        proposed dual changes."""
        p = self.problem
        lam, N, loss, C = p.lam, p.n_samples, p.loss, p.n_outputs
        coef = self.sigma / (lam * N)
        proposals = {}  # sample -> list of proposals
        for k in active:
            delta = {i: np.zeros(C) for i in drawn[k]}
            cl = self.clients[k]
            for c in range(C):
                pairs, T = self.transform(k, c)
                # Q: orthonormal basis of the directions' span; the client knows it on
                # its own features (its blocks of the weights it received).
                _, D = self.directions(k, c)
                Q_own = (D @ T)[self.own(k)]
                S = np.zeros(T.shape[1])
                S_own = np.zeros(len(cl.features))  # sum d r_own
                for i in drawn[k]:
                    phi = self.phi(k, i, c, pairs, T)
                    r_own = cl.X[cl.position[i]] - Q_own @ phi  # residual on own features
                    resid = max(self.sq_norm[i] - phi @ phi, 0.0)
                    rest = resid - min(r_own @ r_own, resid)  # other holders' part: diagonal
                    q = max(coef * (phi @ phi + resid), 1e-300)
                    margin = (z[i][c] + offset[(k, i)][c]
                              + coef * (phi @ S + r_own @ S_own + rest * delta[i][c]))
                    d = loss.dual_step(np.array([self.alpha[i, c] + delta[i][c]]),
                                       np.array([margin]), np.array([q]), p.Y[i:i + 1, c])[0]
                    delta[i][c] += d
                    S += d * phi
                    S_own += d * r_own
            for i in drawn[k]:
                proposals.setdefault(i, []).append(delta[i])
        return proposals

    def _image(self, U, active, change):
        """The change of w when the active holders re-send their parts."""
        lam, N = self.problem.lam, self.problem.n_samples
        dw = np.zeros_like(self.w)
        for i in U:
            for k in self.holders[i]:
                if k in active:
                    cl = self.clients[k]
                    dw[cl.features] += np.outer(cl.X[cl.position[i]], change[i])
        return dw / (lam * N)

    def _direction(self, U, average, dw_prop):
        """The averaged proposals plus momentum along the previous step (its
        coefficient from the images, at most ``cfg.momentum``), clipped to the dual
        bounds."""
        p, loss = self.problem, self.problem.loss
        norm = np.sum(self.previous_dw ** 2, axis=0)
        mu = np.where(norm > 0, -np.sum(dw_prop * self.previous_dw, axis=0)
                      / np.where(norm > 0, norm, 1.0), 0.0)
        mu = np.clip(mu, 0.0, self.cfg.momentum)
        direction = {}
        for i in U:
            lo, hi = loss.dual_bounds(p.Y[i])
            direction[i] = np.clip(self.alpha[i] + average[i] + mu * self.previous_step[i],
                                   lo, hi) - self.alpha[i]
            direction[i][np.abs(direction[i]) < 1e-9] = 0.0  # rounding, not a step
        return direction

    def _absent_images(self, active, U, direction, dw):
        """The absent members' image, per group, least-norm in the span of the
        directions: added to ``dw`` in place; returns each absent member's estimate
        and the samples whose absent image is exact."""
        lam, N, C = self.problem.lam, self.problem.n_samples, self.problem.n_outputs
        estimates, spanned = {}, set()  # spanned: samples whose absent image is exact
        if self.group_of is not None:
            for key in sorted({self.group_of[k] for k in active}):
                present = [j for j in key if j in active]
                absent = [j for j in key if j not in active]
                moved = [i for i in U if tuple(self.holders[i]) == key]
                if not absent or not moved:
                    continue
                sender = present[0]
                # The move's image on the absent members' slices (each member's rows).
                hidden = np.concatenate([self.slice_of(j) for j in absent])
                theirs = np.zeros((len(self.columns(key)), C))
                for i in moved:
                    for j in absent:
                        cl = self.clients[j]
                        theirs[self.slice_of(j)] += np.outer(cl.X[cl.position[i]], direction[i])
                y = np.zeros((hidden.size, C))
                spans = True
                for c in range(C):
                    _, D = self.directions(sender, c)
                    b = D.T @ theirs[:, c] / (lam * N)
                    y[:, c] = np.linalg.pinv(D[hidden].T, rcond=np.sqrt(1e-9)) @ b
                    spans = spans and np.linalg.matrix_rank(D[hidden]) >= hidden.size
                np.add.at(dw, self.columns(key)[hidden], y)
                start = 0
                for j in absent:
                    n_j = len(self.clients[j].features)
                    estimates[j] = y[start:start + n_j]
                    start += n_j
                if spans:
                    spanned.update(moved)
        return estimates, spanned

    def _curvature(self, active, U, direction, dw, spanned):
        """The line search's curvature per output (updates the remembered
        coherence)."""
        lam, N, C = self.problem.lam, self.problem.n_samples, self.problem.n_outputs
        full = sum(self.sq_norm[i] * direction[i] ** 2 for i in U)
        act = np.zeros(C)
        for i in U:
            if i in spanned:  # the absent part of this sample's image is known
                act += self.sq_norm[i] * direction[i] ** 2
                continue
            for k in self.holders[i]:
                if k in active:
                    cl = self.clients[k]
                    part = cl.X[cl.position[i]]
                    act += (part @ part) * direction[i] ** 2
        # ||A d||^2: the active holders' part, plus the absent holders' squared norms
        # times the largest coherence (||A d||^2 per sum ||x_i||^2 d_i^2, per sample)
        # seen, remembered with decay 0.9.
        per_sample = (lam * N) ** 2 / len(U)
        dw_sq = np.sum(dw * dw, 0)
        seen = np.where(act > 0, dw_sq * per_sample / np.where(act > 0, act, 1.0), 0.0)
        self.coherence = np.maximum(seen, 0.9 * self.coherence)
        curvature = 0.5 * lam * (dw_sq + self.coherence * np.maximum(full - act, 0) / per_sample)
        return curvature

    def _line_search(self, active, U, direction, z, offset, curvature, limit):
        """Line search on the estimated dual change phi(t), per output, up to
        ``limit``."""
        p = self.problem
        N, loss, C = p.n_samples, p.loss, p.n_outputs

        def phi_t(s):
            conj = sum(loss.conjugate(self.alpha[i], p.Y[i])
                       - loss.conjugate(self.alpha[i] + s * direction[i], p.Y[i]) for i in U)
            margin = sum((z[i] + offset[(min(k for k in self.holders[i] if k in active), i)])
                         * direction[i] for i in U)
            return (conj - s * margin) / N - s * s * curvature

        if loss.quadratic_conjugate:  # phi is the quadratic through phi(0)=0, phi(1/2), phi(1)
            f_half, f_one = phi_t(0.5), phi_t(1.0)
            b = 2.0 * (f_one - 2.0 * f_half)
            a = f_one - b
            step = np.where(b < 0, -a / (2 * np.where(b < 0, b, -1.0)), np.where(a > 0, 1.0, 0.0))
            step = np.clip(step, 0.0, limit)
        else:
            grid = limit * np.arange(1, 9) / 8.0
            values = np.array([phi_t(s) for s in grid])
            best = np.argmax(values, axis=0)
            step = np.where(values[best, np.arange(C)] > 0, grid[best], 0.0)
        return step

    def _take_step(self, active, U, direction, step, limit, estimates, dw, exact):
        """Apply the step: duals, the clients' parts, the absent members' estimates,
        w, sigma, the running averages and the certificate."""
        t = self.t
        if not exact and self.cert_current:
            self.cert_alpha = self.alpha.copy()
            self.cert_current = False
        self.previous_step = np.zeros_like(self.previous_step)
        for i in U:
            self.previous_step[i] = direction[i] * step
            self.alpha[i] = self.alpha[i] + direction[i] * step
        for k in active:
            cl = self.clients[k]
            cl.alpha = self.alpha[cl.samples].copy()
            self.hat_w[k] = cl.primal_part()
        for j, part in estimates.items():
            self.estimate[j] = self.estimate[j] + part * step
        self.w = self.aggregate_primal()
        self.previous_dw = dw * step
        mean = float(np.mean(step / limit))
        if mean < self.SHORT:
            self.sigma /= max(mean, 0.25)
        elif mean >= self.FULL:
            self.sigma *= self.SHRINK
        self.sigma = min(max(self.sigma, 0.1), self.ceiling)
        rho = max(2.0 / (t + 1.0), 0.1)
        self.avg_alpha = (1 - rho) * self.avg_alpha + rho * self.alpha
        self.avg_w = (1 - rho) * self.avg_w + rho * self.w
        for k in active:
            self.clients[k].w = self.w[self.clients[k].features].copy()
        self.prev_active = set(active)
        if self.cfg.certified:
            self.end_round(active, exact)
