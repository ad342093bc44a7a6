"""A slow, obviously-correct hybrid local SGD (FedAvg / HyFEM): one object per client.

Every client holds a dense copy of its block in local coordinates and its own
weight vector; each local step is the textbook update written out; the server
keeps a dictionary of the blocks it received and averages feature by feature.
No stacking, no lazy scaling, no incremental updates, so the vectorized engine
in ``hyfl.algorithms.local_sgd`` can be checked against it iterate by iterate.
Random numbers come from the same call as the engine: per round, one
``draw_local_samples`` call with a count of 1 for every (local step, active
client) pair, step-major (``sizes`` tiled ``H`` times), i.e. independent
uniform draws with replacement.
"""

from __future__ import annotations

import math

import numpy as np

from hyfl.algorithms.base import draw_local_samples
from hyfl.partition import Partition, client_block, stack
from hyfl.problem import Problem


class Client:
    def __init__(self, k, samples, features, X_local, Y_local):
        self.k = k
        self.samples = samples  # I_k, sorted global ids
        self.features = features  # M_k, sorted global ids
        self.X = X_local.toarray()  # N_k x |M_k|, dense for clarity
        self.Y = Y_local  # N_k x C
        self.column = {int(m): j for j, m in enumerate(features)}  # global -> local
        self.w = None

    def receive(self, w0_block):
        self.w = w0_block.copy()
        self.anchor = w0_block.copy()  # w_0[M_k], the proximal centre

    def sgd_step(self, position, eta, loss, lam, mu):
        x = self.X[position]
        y = self.Y[position : position + 1]
        z = (x @ self.w)[None, :]  # own features only
        g = loss.derivative(z, y)[0]
        grad = np.outer(x, g) + lam * self.w + mu * (self.w - self.anchor)
        self.w = self.w - eta * grad


class ReferenceLocalSGD:
    def __init__(self, problem: Problem, partition: Partition, cfg):
        self.problem = problem
        self.cfg = cfg.validated()
        N, C = problem.Y.shape
        blocks = stack(partition, problem.X)
        self.clients = []
        for k in range(partition.n_clients):
            samples, features, Xk = client_block(blocks, k)
            self.clients.append(Client(k, samples, features, Xk, problem.Y[samples]))
        self.H = cfg.steps_per_client(N, len(self.clients))
        self.mu = cfg.mu if getattr(cfg, "variant", None) == "prox" else 0.0
        self.stored = {c.k: np.zeros((len(c.features), C)) for c in self.clients}
        self.w = np.zeros((problem.n_features, C))
        self.t = 0
        self.drift = 0.0

    def round(self, active_mask, rng):
        self.t += 1
        eta = self.cfg.a / (self.cfg.b + math.sqrt(self.t))
        active = [c for c in self.clients if active_mask[c.k]]
        if not active:
            return
        for c in active:
            c.receive(self.w[c.features])
        sizes = np.array([len(c.samples) for c in active], dtype=np.int64)
        draws = draw_local_samples(
            rng, np.tile(sizes, self.H), np.ones(self.H * len(active), dtype=np.int64)
        )
        for step in range(self.H):
            for a, c in enumerate(active):
                position = int(draws[step * len(active) + a])
                c.sgd_step(position, eta, self.problem.loss, self.problem.lam, self.mu)
        self.drift = math.sqrt(sum(np.sum((c.w - c.anchor) ** 2) for c in active) / len(active))
        for c in active:
            self.stored[c.k] = c.w.copy()
        new_w = np.zeros_like(self.w)
        for m in range(self.problem.n_features):
            blocks = [self.stored[c.k][c.column[m]] for c in self.clients if m in c.column]
            new_w[m] = sum(blocks) / len(blocks)
        self.w = new_w
