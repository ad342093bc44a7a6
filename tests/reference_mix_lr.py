"""A slow, obviously-correct mix-LR: row groups of parties, per-sample loops.

Each row group is a vertical federation: for every sample of a batch the parties'
partial margins are added one by one, the label holder's derivative goes back, and
every active party steps its own block from its own dense columns. The server then
averages the groups' models. The random batch orders are drawn as the engine draws
them (one permutation per training group and epoch, groups in order of their first
client), so the two must agree to rounding.
"""

from __future__ import annotations

import numpy as np

from hyfl.partition import Partition, client_block, stack
from hyfl.problem import Problem


class Party:
    def __init__(self, k, samples, features, X_local):
        self.k, self.samples, self.features = k, list(samples), list(features)
        self.X = X_local.toarray()  # its samples x its features, dense for clarity
        self.row = {i: r for r, i in enumerate(self.samples)}

    def partial_margin(self, i, w):
        return self.X[self.row[i]] @ w[self.features]


class ReferenceMixLR:
    def __init__(self, problem: Problem, partition: Partition, learning_rate=0.1, batch_size=64,
                 local_epochs=1):
        blocks = stack(partition, problem.X)
        groups: dict[tuple, list[Party]] = {}
        for k in range(blocks.n_clients):
            samples, features, X_local = client_block(blocks, k)
            groups.setdefault(tuple(sorted(int(i) for i in samples)), []).append(
                Party(k, samples, features, X_local))
        self.groups = list(groups.items())
        self.problem = problem
        self.lr, self.batch, self.epochs = learning_rate, batch_size, local_epochs
        self.w = np.zeros((problem.n_features, problem.n_outputs))

    def round(self, active, rng):
        p = self.problem
        W = np.ones_like(p.Y) if p.W is None else p.W
        models = []
        for samples, parties in self.groups:
            if not any(active[party.k] for party in parties):
                models.append(self.w.copy())
                continue
            w = self.w.copy()
            order_samples = np.asarray(samples)
            batches = []
            for _ in range(self.epochs):
                order = order_samples[rng.permutation(len(samples))]
                batches += [order[i:i + self.batch] for i in range(0, len(order), self.batch)]
            for batch in batches:
                grads = {party.k: np.zeros((len(party.features), w.shape[1]))
                         for party in parties}
                for i in batch:
                    z = sum(party.partial_margin(i, w) for party in parties)
                    slope = W[i] * p.loss.derivative(z, p.Y[i])
                    for party in parties:
                        grads[party.k] += np.outer(party.X[party.row[i]], slope)
                for party in parties:
                    if active[party.k]:
                        own = party.features
                        w[own] = w[own] - self.lr * (grads[party.k] / len(batch) + p.lam * w[own])
            models.append(w)
        self.w = np.mean(models, axis=0)
