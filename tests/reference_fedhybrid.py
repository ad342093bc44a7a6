"""A slow, obviously-correct FedHybrid: one object per client, loops everywhere.

It follows Algorithm 1 of ``fedhybrid.md`` message by message with dense
per-client matrices, per-sample Python loops for gradients and Hessians, and
``np.linalg.solve`` for the Newton systems. It derives the step sizes itself
from the rule documented in ``hyfl.algorithms.fedhybrid`` (dense eigenvalues,
its own second derivatives), so a comparison with the engine checks the rule
as well as the iteration. The server stores the last message of every client
and forms the consensus update from those stored messages.
"""

from __future__ import annotations

import math

import numpy as np

from hyfl.partition import Partition, client_block, stack
from hyfl.problem import Problem


def loss_derivative(name, z, y, smoothing=1.0):
    """l'(z, y) for one scalar margin."""
    if name == "logistic":
        return -y / (1.0 + math.exp(y * z))
    if name == "squared":
        return z - y
    if name == "smoothed_hinge":
        return -y * min(max((1.0 - y * z) / smoothing, 0.0), 1.0)
    raise ValueError(name)


def loss_second_derivative(name, z, y, smoothing=1.0):
    """l''(z, y) for one scalar margin (smoothed hinge: 0 at the kinks)."""
    if name == "logistic":
        p = 1.0 / (1.0 + math.exp(-y * z))
        return p * (1.0 - p)
    if name == "squared":
        return 1.0
    if name == "smoothed_hinge":
        m = 1.0 - y * z
        return 1.0 / smoothing if 0.0 < m < smoothing else 0.0
    raise ValueError(name)


SUP_SECOND_DERIVATIVE = {"logistic": 0.25, "squared": 1.0}


class Client:
    def __init__(self, k, X_local, Y_local, problem, newton):
        self.k = k
        self.X = X_local.toarray()  # N_k x M, dense for clarity
        self.Y = Y_local  # N_k x C
        self.N = problem.n_samples
        self.lam = problem.lam
        self.loss = problem.loss
        self.newton = newton
        M, C = self.X.shape[1], Y_local.shape[1]
        self.x = np.zeros((M, C))
        self.dual = np.zeros((M, C))
        self.share = self.X.shape[0] * self.lam / self.N  # N_k lam / N

    def d1(self, z, y):
        return loss_derivative(self.loss.name, z, y, getattr(self.loss, "smoothing", 1.0))

    def d2(self, z, y):
        return loss_second_derivative(self.loss.name, z, y, getattr(self.loss, "smoothing", 1.0))

    def gradient(self, w):
        """grad f_k(w) = 1/N sum_j x_j l'(x_j^T w) + (N_k lam / N) w, per class."""
        g = self.share * w.copy()
        for j in range(self.X.shape[0]):
            for c in range(w.shape[1]):
                z = float(self.X[j] @ w[:, c])
                g[:, c] += self.X[j] * self.d1(z, self.Y[j, c]) / self.N
        return g

    def hessian_plus_mu(self, w, c, mu):
        """hess f_k(w) + mu I for class c."""
        M = self.X.shape[1]
        H = (self.share + mu) * np.eye(M)
        for j in range(self.X.shape[0]):
            z = float(self.X[j] @ w[:, c])
            H += np.outer(self.X[j], self.X[j]) * self.d2(z, self.Y[j, c]) / self.N
        return H

    def update(self, x0, a, b, mu):
        """Lines 4-11 of Algorithm 1; returns the message (x, lambda) for the server."""
        g = self.gradient(self.x) - self.dual + mu * (self.x - x0)
        gap = x0 - self.x
        if self.newton:
            x_new = self.x.copy()
            dual_new = self.dual.copy()
            for c in range(self.x.shape[1]):
                D = self.hessian_plus_mu(self.x, c, mu)
                x_new[:, c] = self.x[:, c] - a * np.linalg.solve(D, g[:, c])
                dual_new[:, c] = self.dual[:, c] + b * D @ gap[:, c]
        else:
            x_new = self.x - a * g
            dual_new = self.dual + b * gap
        self.x, self.dual = x_new, dual_new
        return self.x.copy(), self.dual.copy()


class ReferenceFedHybrid:
    def __init__(self, problem: Problem, partition: Partition, cfg):
        self.problem = problem
        n = partition.n_clients
        blocks = stack(partition, problem.X)
        newton = cfg.newton_mask(n)
        self.clients = []
        for k in range(n):
            samples, _, Xk = client_block(blocks, k)
            self.clients.append(Client(k, Xk, problem.Y[samples], problem, bool(newton[k])))
        # Step sizes from the documented rule, recomputed densely.
        sup = SUP_SECOND_DERIVATIVE.get(problem.loss.name)
        if sup is None:  # smoothed hinge
            sup = 1.0 / problem.loss.smoothing
        L = np.array(
            [
                sup * np.linalg.eigvalsh(c.X.T @ c.X)[-1] / problem.n_samples + c.share
                for c in self.clients
            ]
        )
        self.mu = 0.1 * L.mean() if cfg.mu == "auto" else float(cfg.mu)
        a = np.broadcast_to(np.asarray(cfg.a, dtype=float), (n,))
        b = np.broadcast_to(np.asarray(cfg.b, dtype=float), (n,))
        self.a, self.b = [], []
        for k, c in enumerate(self.clients):
            if cfg.step_sizes == "raw":
                self.a.append(a[k])
                self.b.append(b[k])
            elif c.newton:
                self.a.append(a[k])
                self.b.append(b[k] * self.mu / (L[k] + self.mu))
            else:
                self.a.append(a[k] / (L[k] + self.mu))
                self.b.append(b[k] * self.mu)
        M, C = problem.n_features, problem.n_outputs
        self.x0 = np.zeros((M, C))
        # The server's store of the last message from every client.
        self.received = {c.k: (np.zeros((M, C)), np.zeros((M, C))) for c in self.clients}

    def round(self, active_mask):
        for c in self.clients:
            if active_mask[c.k]:
                self.received[c.k] = c.update(self.x0, self.a[c.k], self.b[c.k], self.mu)
        n = len(self.clients)
        total_x = sum(m[0] for m in self.received.values())
        total_dual = sum(m[1] for m in self.received.values())
        self.x0 = total_x / n - total_dual / (self.mu * n)
