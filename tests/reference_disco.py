"""A slow, obviously-correct DiSCO: one object per client, loops and dense matrices.

It follows Zhang and Lin's Algorithm (inexact damped Newton, distributed PCG)
message by message: every client computes its gradient and Hessian-vector products
from its own dense block with per-sample Python loops; the master (the first active
client) applies its preconditioner with ``np.linalg.solve``; the server runs PCG one
output at a time. Its tolerance and smoothness are derived here from the paper's
formulas, so a comparison with the engine checks them as well as the iteration.
"""

from __future__ import annotations

import math

import numpy as np

from hyfl.partition import Partition, client_block, stack
from hyfl.problem import Problem
from reference_fedhybrid import SUP_SECOND_DERIVATIVE, loss_derivative, loss_second_derivative


class Client:
    def __init__(self, X_local, Y_local, W_local, loss_name):
        self.X = X_local.toarray()
        self.Y, self.W, self.loss = Y_local, W_local, loss_name

    def curvatures(self, w, c):
        return np.array([self.W[j, c] * loss_second_derivative(self.loss, self.X[j] @ w,
                                                               self.Y[j, c])
                         for j in range(self.X.shape[0])])

    def gradient_sum(self, w, c):
        total = np.zeros(self.X.shape[1])
        for j in range(self.X.shape[0]):
            slope = loss_derivative(self.loss, self.X[j] @ w, self.Y[j, c])
            total += self.W[j, c] * slope * self.X[j]
        return total

    def hessian_sum(self, w, c, u):
        d = self.curvatures(w, c)
        total = np.zeros(self.X.shape[1])
        for j in range(self.X.shape[0]):
            total += d[j] * (self.X[j] @ u) * self.X[j]
        return total


class ReferenceDiSCO:
    def __init__(self, problem: Problem, partition: Partition, beta=0.05, mu=0.0,
                 max_iterations=100):
        blocks = stack(partition, problem.X)
        W = np.ones_like(problem.Y) if problem.W is None else problem.W
        self.clients = []
        for k in range(blocks.n_clients):
            samples, _, X_local = client_block(blocks, k)
            self.clients.append(Client(X_local, problem.Y[samples], W[samples],
                                       problem.loss.name))
        self.lam, self.mu, self.max_iterations = problem.lam, mu, max_iterations
        X = problem.X.toarray()
        sup = {**SUP_SECOND_DERIVATIVE, "smoothed_hinge": 1.0}[problem.loss.name]
        L = (sup * float(W.max())
             * max(float(x @ x) for x in X) + problem.lam)
        self.tolerance = beta * math.sqrt(problem.lam / L)
        self.w = np.zeros((problem.n_features, problem.n_outputs))
        self.iterations = []

    def round(self, active):
        clients = [self.clients[k] for k in np.flatnonzero(active)]
        if not clients:
            return
        n = sum(c.X.shape[0] for c in clients)
        master = clients[0]
        for c in range(self.w.shape[1]):
            w = self.w[:, c].copy()
            g = sum(client.gradient_sum(w, c) for client in clients) / n + self.lam * w

            def H(u):
                return sum(client.hessian_sum(w, c, u) for client in clients) / n + self.lam * u

            d1 = master.curvatures(w, c)
            P = (master.X.T * d1) @ master.X / master.X.shape[0]
            P += (self.lam + self.mu) * np.eye(len(w))
            v, Hv, r = np.zeros_like(w), np.zeros_like(w), g.copy()
            stop = self.tolerance * np.linalg.norm(g)
            iterations = 0
            if np.linalg.norm(r) > stop:
                s = np.linalg.solve(P, r)
                u = s.copy()
                while iterations < self.max_iterations:
                    Hu = H(u)
                    iterations += 1
                    alpha = (r @ s) / (u @ Hu)
                    v, Hv = v + alpha * u, Hv + alpha * Hu
                    r_new = r - alpha * Hu
                    if np.linalg.norm(r_new) <= stop:
                        break
                    s_new = np.linalg.solve(P, r_new)
                    u = s_new + ((r_new @ s_new) / (r @ s)) * u
                    r, s = r_new, s_new
            self.iterations.append(iterations)
            self.w[:, c] = w - v / (1.0 + math.sqrt(max(v @ Hv, 0.0)))
