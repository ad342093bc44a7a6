"""A slow, obviously-correct FedBCD: one object per party, loops everywhere.

It follows Algorithms 1-3 of ``fedbcd.md`` message by message with dense
per-party blocks in local coordinates, loops over parties, local steps and
batch samples, and recomputes every margin from scratch, so that the
vectorized engine in ``hyfl.algorithms.fedbcd`` can be checked against it
iterate by iterate. It draws the batch through the same
``draw_batch`` call as the engine, so a seed fixes the same draws.
"""

from __future__ import annotations

import math

import numpy as np

from hyfl.algorithms.fedbcd import draw_batch
from hyfl.partition import Partition, client_block, stack
from hyfl.problem import Problem

CURVATURE = {"logistic": 0.25, "squared": 1.0, "hinge": 1.0}


class Party:
    def __init__(self, k, features, X_local, n_outputs):
        self.k = k
        self.features = features  # global feature ids of the block
        self.X = X_local.toarray()  # N x d_k, dense for clarity
        self.w = np.zeros((len(features), n_outputs))  # the party's block of w

    def margin(self, i):
        """H_i^k = x_{k,i}^T w_k."""
        return self.X[i] @ self.w


class ReferenceFedBCD:
    def __init__(self, problem: Problem, partition: Partition, cfg):
        self.problem = problem
        self.cfg = cfg
        N, C = problem.Y.shape
        blocks = stack(partition, problem.X)
        self.parties = []
        for k in range(partition.n_clients):
            samples, features, Xk = client_block(blocks, k)
            assert np.array_equal(samples, np.arange(N))
            self.parties.append(Party(k, features, Xk, C))
        self.S = min(cfg.batch_size, N)
        if cfg.eta0 == "auto":
            # 1 / L, L = c ||X||_2^2 / N + lam + mu, with X assembled from the blocks.
            X = np.zeros((N, problem.n_features))
            for p in self.parties:
                X[:, p.features] = p.X
            curvature = CURVATURE.get(problem.loss.name, 1.0)
            if problem.loss.name == "smoothed_hinge":
                curvature = 1.0 / problem.loss.smoothing
            spectral = np.linalg.svd(X, compute_uv=False)[0] ** 2
            self.eta0 = 1.0 / (curvature * spectral / N + problem.lam + cfg.mu)
        else:
            self.eta0 = float(cfg.eta0)
        self.Q = 1 if cfg.variant == "sgd" else (cfg.local_steps or 5)
        self.t = 0

    @property
    def w(self):
        out = np.zeros((self.problem.n_features, self.problem.n_outputs))
        for p in self.parties:
            out[p.features] = p.w
        return out

    def local_steps(self, party, batch, others, eta):
        """Q steps on party's block with the stale sums ``others[s]`` of the other parties."""
        p, cfg = self.problem, self.cfg
        start = party.w.copy()
        for _ in range(self.Q):
            grad = np.zeros_like(party.w)
            for s, i in enumerate(batch):
                z = others[s] + party.margin(i)
                d = p.loss.derivative(z[None, :], p.Y[i : i + 1])[0]
                grad += np.outer(party.X[i], d)
            grad = grad / len(batch) + p.lam * party.w + cfg.mu * (party.w - start)
            party.w = party.w - eta * grad

    def round(self, active_mask, rng):
        eta = self.eta0 / math.sqrt(self.t + 1)
        self.t += 1
        N = self.problem.n_samples
        batch = [int(i) for i in draw_batch(rng, N, self.S)]
        active = [p for p in self.parties if active_mask[p.k]]
        if not active:
            return 0.0
        # Exchange: every party sends H^k for the batch (absent ones with their
        # unchanged blocks); the server sums.
        sent = {(p.k, i): p.margin(i) for p in self.parties for i in batch}
        H = {i: sum(sent[(p.k, i)] for p in self.parties) for i in batch}
        if self.cfg.variant == "sequential":
            for p in active:
                others = [H[i] - sent[(p.k, i)] for i in batch]
                self.local_steps(p, batch, others, eta)
                for i in batch:  # Exchange({k, K}): fresh margins of p replace the stale ones
                    sent[(p.k, i)] = p.margin(i)
                    H[i] = sum(sent[(q.k, i)] for q in self.parties)
            return float(len(active))
        # Parallel / FedSGD: every party works from the same exchanged sums.
        stale = {p.k: [H[i] - sent[(p.k, i)] for i in batch] for p in active}
        for p in active:
            self.local_steps(p, batch, stale[p.k], eta)
        return 1.0
