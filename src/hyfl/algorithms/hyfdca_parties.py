"""HyFDCA as separate parties that talk only through messages (for real encryption).

:mod:`hyfl.algorithms.hyfdca` runs every client at once on stacked arrays,
which is what simulations want. Here the same algorithm is split into a
:class:`Server` and one :class:`Client` per party, each holding only what it
would hold in a deployment:

* a client holds its block ``X_k`` (its samples ``I_k``, its features
  ``M_k``), its labels, the private key, its copy of its samples' duals and
  of its features' weights;
* the server holds the public key only, the ciphertexts of the duals and of
  the partial inner products each client last sent, every client's plaintext
  primal part ``sum_i alpha_i x_{k,i}`` (the model ``w`` is not secret: it
  is the product) and the sample ids each client holds (from private set
  intersection).

Messages are plain Python objects (dicts of arrays and
:class:`~hyfl.privacy.layout.EncryptedVector`), so a transport -- the
in-process driver in :mod:`hyfl.runtime.protocol`, or Flower -- can carry
them and count their bytes. Encryption is a layer around sends and sums:
parties call ``encrypt_samples`` before a send, the server only calls the
public cipher's ``add``, and receivers call ``decrypt_samples``. The
mathematics (the dual steps, the safe rule's gain and verdict) is the same
code the stacked engine uses.

Layouts. Ciphertexts the server keeps across rounds (the duals, the stored
inner products, the cocoa rule's last steps) use the fixed
:class:`~hyfl.privacy.layout.SlotLayout`. Values summed within one round
and then forgotten -- inner products with ``sip_scope="drawn"``, the
per-sample rules' dual steps (when :func:`~hyfl.privacy.layout.compact_steps`
says it pays), the cocoa rule's proposals -- travel in the round's compact
layout (:meth:`SlotLayout.round_layout` of its draws: each client is told
which holders drew each of its updated samples), which fills their
ciphertexts. With compact dual steps the server sums the steps
and the clients add the sum to their own copies; the first active holder of
each updated sample then sends the encrypted change of its dual in the fixed
layout (with its primal part), which the server adds into its stored duals
when the round is accepted.

One outer iteration (see :mod:`hyfl.algorithms.hyfdca` for the algorithm):

1. ``Server.configure`` -> per client: draws, beta, gamma_t, for returning
   clients the encrypted duals that changed while they were away;
   ``Client.configure`` -> returning clients re-send their primal part;
   ``Server.refresh`` -> returning clients get the new weights.
2. ``Client.inner_products`` -> encrypted partial inner products;
   ``Server.sum_inner_products`` -> encrypted ``x_i^T w`` per client.
3. ``Client.dual_steps`` -> encrypted scaled dual steps;
   ``Server.aggregate_duals`` -> encrypted new duals per client.
4. ``Client.new_duals`` -> plaintext primal part, encrypted gain terms;
   ``Server.aggregate_primal`` -> (safe rule) the encrypted totals for one
   client's ``Client.verdict``; ``Server.commit`` -> weights and verdict;
   ``Client.commit``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from hyfl.algorithms.base import draw_local_samples
from hyfl.algorithms.hyfdca import HyFDCA, row_squared_norms
from hyfl.algorithms.hyfdca_certify import (
    EVENTS,
    TRUST_FLOOR,
    accepts,
    evaluation_size,
    next_trust,
)
from hyfl.algorithms.hyfdca_groups import (
    GroupHistory,
    absent_image,
    find_sample_groups,
    offset_weights,
    ring_margin_offsets,
    ring_span_sums,
)
from hyfl.algorithms.hyfdca_local import (
    ClientMemory,
    SpanHistory,
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
    solve_subproblems,
    span_transforms,
)
from hyfl.algorithms.step_rules.safe import dual_gain, next_beta, step_verdict
from hyfl.errors import fail
from hyfl.partition import StackedBlocks, client_block
from hyfl.privacy.layout import (
    EncryptedVector,
    RoundLayout,
    SlotLayout,
    TaggedLayout,
    compact_steps,
    decrypt_samples,
    decrypt_tagged,
    encrypt_samples,
    encrypt_tagged,
    holder_matrix,
)
from hyfl.privacy.tags import tag_key
from hyfl.problem import Problem

GAIN_TERMS = 3  # first-order sum, full-sample weight, active-part weight
#: Slack on the dual domain of decrypted duals (Client._in_domain): the fixed-point
#: rounding of a few contributions, far below the tags' blind shift (about 256).
DOMAIN_SLACK = 1e-6


@dataclass(frozen=True)
class Public:
    """What every party knows: sizes, hyperparameters and who holds which sample."""

    n_samples: int
    n_features: int
    n_outputs: int
    lam: float
    hyfdca: HyFDCA
    layout: SlotLayout  # (sample, output) values
    norm_layout: SlotLayout  # one value per sample
    n_holders: np.ndarray  # (N,)
    holders: np.ndarray  # (N, max |B_i|) sorted, -1 padded
    horizontal: bool
    # Values summed within a round travel in its compact layout; False sends everything
    # in the fixed layout (the protocol before compact layouts, kept to measure against).
    compact: bool = True


class Client:
    """One party: its block, labels (and sample weights), private key and copies of its duals
    and weights."""

    def __init__(self, k: int, public: Public, samples, features, X_local, Y_local, loss, cipher,
                 W_local=None, run: bytes | None = None):
        self.k, self.public, self.loss, self.cipher = k, public, loss, cipher
        # The run's identity (hyfl.privacy.tags.run_identity): it keys every tag, so that
        # sums, states and tags of another run do not verify here.
        self.run = None if run is None else bytes(run)
        self.samples = np.asarray(samples, dtype=np.int64)  # I_k, ascending
        self.features = np.asarray(features, dtype=np.int64)  # M_k, ascending
        self.X = sp.csr_matrix(X_local)
        self.Y = np.asarray(Y_local, dtype=float)
        # The samples' weights (hyfl.losses), None when all are 1.
        self.W = None if W_local is None else np.asarray(W_local, dtype=float)
        C = public.n_outputs
        self.alpha = np.zeros((self.samples.size, C))
        self.w = np.zeros((self.features.size, C))
        self.own_sq = row_squared_norms(self.X)
        self.sq_norms = np.zeros(self.samples.size)  # full ||x_i||^2, learned at set-up
        self.round: dict = {}
        if public.hyfdca.rule.subproblem:
            depth = public.hyfdca.history_depth(public.n_features)
            window = public.hyfdca.history_slots(public.n_samples, public.n_features, C)
            self.memory = ClientMemory(self.samples.size, self.features.size, C, depth, window)
            self.offsets = np.zeros((self.samples.size, C))  # see hyfdca_groups
            self.previous_step = np.zeros((self.samples.size, C))
        if public.hyfdca.certified:  # its samples' certified duals and checkpoint's
            self.cert_alpha = np.zeros((self.samples.size, C))
            self.ckpt_alpha = np.zeros((self.samples.size, C))

    #: What changes between messages: a transport that cannot keep the object
    #: alive (Flower starts a new process per message) saves and restores these.
    STATE = ("alpha", "w", "sq_norms", "round", "z", "previous", "memory", "previous_step",
             "proposal", "direction", "cert_alpha", "ckpt_alpha", "offsets")

    def get_state(self) -> dict:
        """The client's changing state (see :attr:`STATE`), by attribute name."""
        return {name: getattr(self, name) for name in self.STATE if hasattr(self, name)}

    def set_state(self, state: dict) -> None:
        """Restore what :meth:`get_state` returned."""
        for name in self.STATE:
            if name in state:
                setattr(self, name, state[name])

    # -- set-up ----------------------------------------------------------------
    def setup_messages(self) -> dict:
        """Encrypted squared norms of the client's parts of its samples (a tag per group)."""
        return {
            "norms": encrypt_tagged(self.cipher, TaggedLayout(self.public.norm_layout),
                                    self.samples, self.own_sq[:, None], self._tag_key,
                                    "norms", ("norms",), self.k),
        }

    def learn_norms(self, norms: EncryptedVector) -> None:
        """The full squared norms of the client's samples: each group's sum must hold
        exactly its holders' parts (their tags), since the norms enter the subproblem
        and the line search's sums."""
        layout = TaggedLayout(self.public.norm_layout)
        holders = layout.chunk_holders[layout.inner.n_chunks:]
        expected = {group: [("norms", int(h)) for h in holders[group] if h >= 0]
                    for group in range(holders.shape[0])}
        self.sq_norms = decrypt_tagged(self.cipher, layout, norms, self.samples,
                                       self._tag_key, "norms", expected,
                                       "the squared row norms").ravel()

    # -- 1. configure and refresh --------------------------------------------------
    def configure(self, message: dict) -> dict | None:
        """Store the round's instructions; a returning client refreshes its duals."""
        limit = message.get("limit")
        if limit is not None and not TRUST_FLOOR <= float(limit) <= 1.0:
            # The round's longest step bounds the line search and the step the party takes
            # (Party._changes checks it against the limit): an honest server sends the
            # certificate's trust, in [TRUST_FLOOR, 1].
            raise fail("the round's instructions", f"set the longest step (field "
                       f"configure.limit) to {float(limit)!r}, outside the certificate's trust "
                       f"[{TRUST_FLOOR:g}, 1]", "The server does not follow hyfl's protocol.")
        active = message.get("active")
        if active is not None:  # the round's participants, as the server tells every one
            active = np.asarray(active, dtype=np.int64)
            if (np.count_nonzero(active == self.k) != 1 or active.size
                    != np.unique(active).size or np.any(np.diff(active) < 0)):
                raise fail("the round's instructions", f"name the active clients "
                           f"{active.tolist()}, not an ascending list holding this client "
                           f"({self.k}) once", "The server does not follow hyfl's protocol.")
        self.round = dict(message)
        hy, t = self.public.hyfdca, message["t"]
        self.round["gamma_t"] = 1.0 / t if hy.gamma == "1/t" else float(hy.gamma)
        self.round.setdefault("beta", 1.0)
        self.round.setdefault("limit", 1.0)
        reply = {}
        if message.get("certificate") is not None:  # before the refresh: of the old copy
            reply.update(self._certificate(message["certificate"],
                                           message.get("checkpoint_duals"),
                                           message.get("checkpoint_contexts")))
        if message.get("stale") is not None:
            local, values = self._stored_duals(message["stale"], message.get("stale_contexts"),
                                               "the stale duals")
            self.alpha[local] = self._feasible(values, local)
            reply["primal_part"] = self.primal_part()
        return reply or None

    def _samples_in(self, chunks: np.ndarray) -> np.ndarray:
        """Local positions of our samples inside the given chunks (the chunk ids name the
        samples: every sample of ours inside them)."""
        layout = self.public.layout
        chunk_of = layout.positions(self.samples).reshape(self.samples.size, -1) // layout.slots
        return np.flatnonzero(np.isin(chunk_of, chunks).any(axis=1))

    def _stored_duals(self, vec: EncryptedVector, contexts, what: str):
        """Decrypt duals the server stored: ``(local samples, values)`` of every sample in
        the vector's chunks.

        With the cocoa rule the server stores each chunk's *state*, encrypted by the
        holder that reported it with a tag per chunk, and says who made it and when
        (``contexts``: round, attempt and reporter per chunk, round 0 for the public
        zeros it starts from); the tags are checked before any value is used, so a
        value of the server's choosing never reaches a reply (issue 26, point 2).
        The per-sample rules' stored duals are running sums of steps, not checked.
        """
        layout = self.public.layout
        if not self.public.hyfdca.rule.subproblem:
            local = self._samples_in(vec.chunks)
            return local, decrypt_samples(self.cipher, layout, vec, self.samples[local])
        data = vec.chunks[vec.chunks < layout.n_chunks]
        local = self._samples_in(data)
        contexts = np.asarray([] if contexts is None else contexts, dtype=np.int64)
        if contexts.size != 3 * data.size:
            raise fail(what, f"come with {contexts.size} context numbers for {data.size} "
                       "chunks, not 3 per chunk", "The server does not follow hyfl's protocol.")
        expected = {}
        for chunk, (t, attempt, reporter) in zip(data.tolist(),
                                                 contexts.reshape(-1, 3).tolist()):
            if t == 0:  # the public zeros the run starts from: no contribution
                expected[chunk] = []
            elif 0 < t < self.round["t"] and attempt >= 1 and \
                    reporter in layout.chunk_holders[chunk]:
                expected[chunk] = [("state", t, attempt, reporter)]
            else:
                raise fail(what, f"name chunk {chunk}'s state as made in round {t}, attempt "
                           f"{attempt}, by party {reporter}: not a state a holder made "
                           f"before round {self.round['t']}",
                           "The server does not follow hyfl's protocol.")
        values = decrypt_tagged(self.cipher, TaggedLayout(layout, per_chunk=True), vec,
                                self.samples[local], self._tag_key, "duals", expected, what)
        self._in_domain(values, local, what)
        return local, values

    def _certificate(self, events: np.ndarray, duals: EncryptedVector | None,
                     contexts: np.ndarray | None = None) -> dict:
        """Apply the certificate's notices missed while away (hyfl.algorithms.hyfdca_certify);
        a client whose image of the open checkpoint is missing gets the checkpoint's duals
        where its copy differs and sends that image."""
        for code in np.asarray(events, dtype=np.int64):
            if code == EVENTS["leave"]:
                self.cert_alpha = self.alpha.copy()
            elif code == EVENTS["checkpoint"]:
                self.ckpt_alpha = self.alpha.copy()
            elif code == EVENTS["accept"]:
                self.cert_alpha = self.ckpt_alpha.copy()
            elif code == EVENTS["reject"]:
                self.alpha = self.cert_alpha.copy()
                self.previous_step = np.zeros_like(self.previous_step)
            else:
                raise fail("the certificate's notices", f"name an unknown event {int(code)}",
                           "Run every party with the same hyfl version.")
        if duals is None:
            return {}
        local, values = self._stored_duals(duals, contexts, "the checkpoint's duals")
        self.ckpt_alpha[local] = self._feasible(values, local)
        return {"checkpoint_part": np.asarray(self.X.T @ self.ckpt_alpha)}

    def _round_layout(self) -> SlotLayout | RoundLayout:
        """This round's compact layout (the fixed one if compaction is off).

        The client holds every sample of each of its holder groups, so its own
        updated samples are all it needs to place the round's values exactly as
        the server and the other holders do.
        """
        if not self.public.compact:
            return self.public.layout
        return self.public.layout.compact(self.samples[self.round["updated_local"]],
                                          self._drawn_by())

    def _drawn_by(self) -> np.ndarray:
        """Which holders drew each of the client's updated samples, (n_updated, width)."""
        layout, updated = self.public.layout, self.round["updated_local"]
        drawn_by = np.asarray(self.round["drawn_by_local"], dtype=bool)
        width = layout.chunk_holders.shape[1]
        if drawn_by.size != updated.size * width:
            raise fail("the round's instructions", f"name the drawers of {drawn_by.size} "
                       f"(sample, holder) pairs, not {updated.size} x {width}",
                       "Run every party with the same hyfl version; the message may be garbled.")
        return drawn_by.reshape(updated.size, width)

    def _sip_layout(self) -> SlotLayout | RoundLayout:
        """Where the round's inner products sit: stored (scope all) or summed only."""
        if self.public.hyfdca.sip_scope == "all":
            return self.public.layout
        return self._round_layout()

    def receive_weights(self, w_local: np.ndarray) -> None:
        self.w = np.array(w_local, dtype=float)

    def primal_part(self) -> np.ndarray:
        """``sum_i alpha_{k,i} x_{k,i}`` over the client's samples, shape (|M_k|, C)."""
        return np.asarray(self.X.T @ self.alpha)

    # -- 2. SecureInnerProduct -----------------------------------------------------
    def inner_products(self, every: bool = False, w: np.ndarray | None = None,
                       made: tuple[int, int] | None = None) -> EncryptedVector | None:
        """Encrypted ``x_{k,i}^T w_k`` for all samples (or the round's updated ones).

        ``w`` and ``made`` (round, attempt): other weights than the client's, for
        the inner products of another round (:meth:`inner_products_ahead`).
        """
        if self.public.horizontal:
            return None
        local = self.round["updated_local"]
        layout = self._sip_layout()
        if every or self.public.hyfdca.sip_scope == "all":  # stored by the server
            local, layout = np.arange(self.samples.size), self.public.layout
        values = np.asarray(self.X[local] @ (self.w if w is None else w))
        if self.public.hyfdca.rule.subproblem:  # a tag per holder group (see proposals)
            context = self._round_context("ip") if made is None else ("ip", *made)
            return encrypt_tagged(self.cipher, TaggedLayout(layout), self.samples[local],
                                  values, self._tag_key, "ip", context, self.k)
        return encrypt_samples(self.cipher, layout, self.samples[local], values)

    def inner_products_ahead(self, step: np.ndarray, dw: np.ndarray) -> EncryptedVector:
        """(cocoa) The next round's inner products, sent with this round's step: with the
        weights after it, ``w_k + step dw_k`` (``dw_k`` the server's move of this
        client's features per unit step), made for the next round's first attempt."""
        w_next = self.w + np.asarray(dw, dtype=float) * np.asarray(step)[None, :]
        return self.inner_products(w=w_next, made=(int(self.round["t"]) + 1, 1))

    # -- 3. LocalDualMethod ----------------------------------------------------------
    def dual_steps(self, z: EncryptedVector | None) -> EncryptedVector:
        """Dual steps of the drawn samples, scaled by ``gamma_t / |B_i|`` and encrypted."""
        updated = self.round["updated_local"]
        if self.public.horizontal:  # whole samples: the inner product is local
            self.z = np.asarray(self.X[updated] @ self.w)
        else:
            self.z = decrypt_samples(self.cipher, self._sip_layout(), z, self.samples[updated])
        drawn = self.round["drawn_local"]
        z_drawn = self.z[np.searchsorted(updated, drawn)]
        pub, hy = self.public, self.public.hyfdca
        delta = hy.rule.dual_steps(
            self.loss,
            alpha=self.alpha[drawn],
            z=z_drawn,
            y=self.Y[drawn],
            weight=self._weights(drawn),
            sq_norms=self.sq_norms[drawn],
            lam=pub.lam,
            n_samples=pub.n_samples,
            beta=self.round["beta"],
            gamma_t=self.round["gamma_t"],
            client_share=hy.rule.client_shares(
                hy.client_weight, np.full(drawn.size, self.samples.size), pub.n_samples),
        )
        scale = self.round["gamma_t"] / pub.n_holders[self.samples[drawn]]
        layout = self._round_layout() if self.round.get("compact_steps") else pub.layout
        return encrypt_samples(self.cipher, layout, self.samples[drawn], delta * scale[:, None])

    # -- 4. new duals, primal part, gain terms ----------------------------------------
    def new_duals(self, duals: EncryptedVector) -> dict:
        """Adopt the new duals tentatively; send the primal part and the gain terms.

        ``duals`` holds the new duals (fixed layout) or, with compact steps, the
        summed steps (compact layout); then the client also sends the encrypted
        change of each dual it reports, for the server's stored duals.
        """
        updated = self.round["updated_local"]
        old = self.alpha[updated]
        if self.round.get("compact_steps"):
            steps = decrypt_samples(self.cipher, self._round_layout(), duals,
                                    self.samples[updated])
            new = self._feasible(old + steps, updated)
        else:
            new = self._feasible(
                decrypt_samples(self.cipher, self.public.layout, duals, self.samples[updated]),
                updated,
            )
        self.previous = (old.copy(), self.w.copy())
        step = new - old
        self.alpha[updated] = new
        reply = {"primal_part": self.primal_part()}
        if self.round.get("compact_steps"):
            reports = self.round["reports_local"]
            reply["changes"] = encrypt_samples(self.cipher, self.public.layout,
                                               self.samples[updated[reports]], step[reports])
        if self.public.hyfdca.rule.tests_round:
            old = self.previous[0]
            y, y_weight = self.Y[updated], self._weights(updated)
            weight = np.sum(step * step, axis=1)
            reports = self.round["reports_local"]  # samples this client is first active holder of
            conj = -(self.loss.conjugate(old + step, y, y_weight)
                     - self.loss.conjugate(old, y, y_weight))
            first = np.sum((conj - self.z * step)[reports])
            full = np.sum((self.sq_norms[updated] * weight)[reports])
            own = np.sum(self.own_sq[updated] * weight)
            totals = np.array([first, full, own])
            values = np.append(totals, self._totals_tag(totals, self.k, "gains"))
            reply["totals"] = encrypt_samples(
                self.cipher, _totals_layout(self.cipher, values.size), np.array([0]),
                values.reshape(1, -1))
        return reply

    def verdict(self, message: dict) -> bool:
        """Decrypt the summed gain terms and judge the round (the safe rule's test).

        ``message`` has the summed ``totals``, the server's ``dw_sq`` and the
        ``active`` clients whose gain terms (and tags) the sum must hold exactly.
        """
        first, full, own = self._open_totals(message["totals"], GAIN_TERMS, message["active"],
                                             "gains")
        gain, scale = dual_gain(first, full, own, float(message["dw_sq"]), self.public.lam,
                                self.public.n_samples)
        return step_verdict(gain, scale, self.round["beta"], self.round["n_draws"])

    def commit(self, accepted: bool, w_local: np.ndarray) -> None:
        if not accepted:
            self.alpha[self.round["updated_local"]] = self.previous[0]
        self.w = np.array(w_local, dtype=float)

    # -- the cocoa rule (see hyfl.algorithms.hyfdca_local) ---------------------------------
    def cocoa_proposals(self, message: dict) -> EncryptedVector:
        """Remember the round's inner products, solve the subproblem, send the proposals.

        ``message`` has the encrypted ``z`` of all the client's samples, the
        Gram matrices of its directions and the subproblem's ``coef``; where the
        split has sample groups (:mod:`hyfl.algorithms.hyfdca_groups`) also
        ``towards_w`` (``<w - w~, u_j>``, which moves its margins to the server's
        ``w``) and two flags for the round's direction: ``span_sums`` (this client
        sends its group's span sums) and ``exact`` (its group's absent image is
        known exactly).
        """
        pub = self.public
        if pub.horizontal:  # whole samples: the inner products are local
            self.z = np.asarray(self.X @ self.w)
        else:
            layout = TaggedLayout(pub.layout)
            self.z = decrypt_tagged(self.cipher, layout, message["z"], self.samples,
                                    self._tag_key, "ip",
                                    self._inner_product_parts(layout, message.get("z_made")),
                                    "the inner products")
        self.memory.record(self.round["t"], self.z, self.w)
        transforms = span_transforms(_symmetric(message["grams"])[None])
        self.offsets = np.zeros_like(self.z)
        if message.get("towards_w") is not None:
            self.offsets = ring_margin_offsets(
                self.memory.z, np.arange(self.samples.size), self.memory.pairs()[0],
                transforms[0], np.asarray(message["towards_w"], dtype=float), self.memory.column)
        self.round["span_sums"] = bool(message.get("span_sums", False))
        self.round["exact"] = bool(message.get("exact", False))
        order = self.round["order_local"]  # the drawn samples, in the order to visit them
        proposals = solve_subproblems(
            self.loss,
            segments=np.array([0, order.size]),
            row_sample=order,
            alpha=self.alpha,
            z_ring=self.memory.z,
            pairs=self.memory.ring_pairs(),
            transforms=transforms,
            Y=self.Y,
            W=self.W,
            sq_norms=self.sq_norms,
            coef=float(message["coef"]),
            X=self.X,
            rows=order,
            feature_ptr=np.array([0, self.features.size]),
            features=np.arange(self.features.size),
            directions=self.memory.direction_vectors(),
            offset_weights=(None if message.get("towards_w") is None else offset_weights(
                transforms[0], np.asarray(message["towards_w"], dtype=float))[None]),
            passes=local_passes(self.sq_norms[order], np.array([0, order.size]),
                                pub.lam * pub.n_samples, pub.hyfdca.local_passes),
        )
        scale = 1.0 / pub.n_holders[self.samples[order]]
        return encrypt_tagged(self.cipher, TaggedLayout(self._round_layout()),
                              self.samples[order], proposals * scale[:, None], self._tag_key,
                              "proposal", self._round_context("proposal"), self.k)

    def cocoa_image(self, message: dict) -> np.ndarray:
        """Adopt the aggregated proposal of the round's samples; send its primal image.

        The sums are checked first: each holder group's must hold exactly the
        proposals of the holders that drew its samples this attempt (their tags),
        since the image of a chosen vector would give the server feature rows.
        """
        updated = self.round["updated_local"]
        proposal_layout = TaggedLayout(self._round_layout())
        context = self._round_context("proposal")
        expected = {group: [(*context, int(sender)) for sender in senders]
                    for group, senders in self._drawers(proposal_layout).items()}
        self.proposal = decrypt_tagged(
            self.cipher, proposal_layout, message["proposal"], self.samples[updated],
            self._tag_key, "proposal", expected, "the summed proposals")
        # The drawers' proposals average moves within the dual domain: a sum that leaves
        # it holds a multiple of the tags' prime the tag cannot see (_in_domain).
        self._in_domain(self.alpha[updated] + self.proposal, updated, "the summed proposals")
        if message.get("previous") is not None:  # returning: the last steps, made by others
            # The states before last round's step of the chunks it moved: the step is
            # the difference to the states this client was refreshed with.
            self.previous_step = np.zeros_like(self.previous_step)
            vec = message["previous"]
            if len(vec):
                local, before = self._stored_duals(vec, message.get("previous_contexts"),
                                                   "the last steps")
                self.previous_step[local] = self.alpha[local] - before
        return np.asarray(self.X[updated].T @ self.proposal)

    def cocoa_direction(self, mu: np.ndarray) -> dict:
        """The round's feasible direction; its primal image and encrypted line-search sums."""
        updated = self.round["updated_local"]
        y, y_weight = self.Y[updated], self._weights(updated)
        alpha = self.alpha[updated]
        self.direction = momentum_direction(self.loss, alpha, self.proposal,
                                            self.previous_step[updated], np.asarray(mu), y,
                                            y_weight)
        d = self.direction
        reports = self.round["reports_local"]  # samples this client is first active holder of
        report_weight = None if y_weight is None else y_weight[reports]
        gains = conjugate_gains(self.loss, alpha[reports], d[reports], y[reports],
                                self.round["limit"], report_weight)
        margins = self.z[updated] + self.offsets[updated]  # moved to the server's w
        margin = np.sum((margins * d)[reports], axis=0)
        full = np.sum((self.sq_norms[updated][:, None] * d * d)[reports], axis=0)
        # The observed part of ||A d||^2: the client's own, or -- where its group's absent
        # image is known exactly -- the whole samples' (reported once per sample).
        own = (full if self.round.get("exact") else
               np.sum(self.own_sq[updated][:, None] * d * d, axis=0))
        totals = np.concatenate([gains, margin[None], full[None], own[None]]).T  # (C, P + 3)
        # The round's certificate: loss, conjugate and correct predictions of the reported
        # samples at the round's start, summed with the other clients' before any is opened.
        report = _evaluation_terms(self.loss, margins[reports], alpha[reports], y[reports],
                                   self.public.n_samples, report_weight)
        values = np.concatenate([totals.ravel(), report])
        values = np.append(values, self._totals_tag(values, self.k, "totals"))
        reply = {
            "primal_part": np.asarray(self.X[updated].T @ d),
            "totals": encrypt_samples(self.cipher, _totals_layout(self.cipher, values.size),
                                      np.array([0]), values.reshape(1, -1)),
        }
        if self.round.get("span_sums"):  # its group's moves on its directions
            reply["span_sums"] = ring_span_sums(self.memory.z, updated, self.memory.pairs()[0],
                                                d, self.public.lam * self.public.n_samples,
                                                self.memory.column)
        return reply

    def cocoa_step(self, message: dict) -> dict:
        """Decrypt the summed sums and find the line search's step (every active client
        finds the same one: :meth:`cocoa_commit` takes it).

        ``message`` has the summed ``totals``, the server's ``dw_sq``, the remembered
        ``coherence``, the number of ``updated`` samples and the ``active`` clients;
        the result the step, the coherence to remember (see
        :func:`line_search_curvature`) and the round's certificate sums. The judge
        (the first active client) also encrypts the conjugate sum's change.
        """
        pub = self.public
        C = pub.n_outputs
        limit = self.round["limit"]
        points = line_search_points(self.loss, limit).size
        opened = self._open_totals(message["totals"], C * (points + 3) + evaluation_size(C),
                                   message["active"], "totals")
        values = opened[:C * (points + 3)].reshape(C, points + 3)
        gains, margin, full, own = (values[:, :points].T, values[:, points],
                                    values[:, points + 1], values[:, points + 2])
        quadratic, coherence = line_search_curvature(
            message["dw_sq"], full, own, message["updated"], message["coherence"], pub.lam,
            pub.n_samples,
        )
        step = line_search(self.loss, gains, margin, quadratic, pub.n_samples, limit)
        reply = {"step": step, "coherence": coherence,
                 "evaluation": opened[C * (points + 3):]}  # sums over all clients only
        judge = int(np.asarray(message["active"])[0]) == self.k
        if pub.hyfdca.certified and judge:  # the conjugate sum's change, for the server's sum
            change = np.array([-np.sum(_gain_at(self.loss, gains, step, limit))])
            values = np.append(change, self._totals_tag(change, self.k, "conjugate"))
            reply["conjugate_change"] = encrypt_samples(
                self.cipher, _totals_layout(self.cipher, 2), np.array([0]),
                values.reshape(1, -1))
        return reply

    # -- the line search's sums, tagged (hyfl.privacy.tags) ---------------------------------
    @functools.cached_property
    def _tag_key(self):
        """The run's tag key (None without a private key), derived once: it hashes the key."""
        return tag_key(self.cipher, self.run)

    def _round_context(self, kind: str) -> tuple:
        """What names this attempt's contributions of one kind (a sender is appended)."""
        return (kind, int(self.round["t"]), int(self.round.get("attempt", 1)))

    def _tag_context(self, kind: str, sender: int) -> tuple:
        context = (*self._round_context(kind), int(sender))
        if kind == "totals" and self.round.get("active") is not None:
            # The participants this client was told: a sum verifies only where every
            # contribution was made for the same list (no party can be given the sums of
            # fewer parties than the others).
            context += (",".join(map(str, np.asarray(self.round["active"]).tolist())),)
        return context

    def _inner_product_parts(self, layout: TaggedLayout, made) -> dict[int, list]:
        """The parts each holder group's inner products must hold: every holder's last
        one, made in the round and attempt the server names (``made``: per group of the
        client's samples, per holder, ``(t, attempt)``; round 0: the zeros of the
        set-up). Its own part is the one it sent this attempt."""
        made = np.asarray([] if made is None else made, dtype=np.int64).reshape(-1, 2)
        t, attempt = int(self.round["t"]), int(self.round.get("attempt", 1))
        holders = layout.chunk_holders[layout.inner.n_chunks:]
        groups = np.unique(layout.sample_groups(self.samples))
        count = int(np.count_nonzero(holders[groups] >= 0))
        if made.shape[0] != count:
            raise fail("the inner products", f"name when {made.shape[0]} parts were made, "
                       f"not the {count} of the holders of its groups",
                       "The server does not follow hyfl's protocol.")
        expected, row = {}, 0
        for group in groups.tolist():
            expected[group] = []
            for holder in holders[group][holders[group] >= 0].tolist():
                t_made, a_made = made[row].tolist()
                row += 1
                own = holder == self.k
                if (t_made, a_made) == (0, 0) and not own:
                    continue  # the zeros the server starts from
                if (own and (t_made, a_made) != (t, attempt)) or not (
                        0 < t_made <= t and a_made >= 1):
                    raise fail("the inner products", f"name party {holder}'s part as made "
                               f"in round {t_made}, attempt {a_made}: not a part it can "
                               f"have sent by round {t}",
                               "The server does not follow hyfl's protocol.")
                expected[group].append(("ip", t_made, a_made, holder))
        return expected

    def _drawers(self, layout: TaggedLayout) -> dict[int, np.ndarray]:
        """The holders that drew samples of each of the client's holder groups this round:
        the senders whose proposals its sums hold."""
        fixed, samples = self.public.layout, self.samples[self.round["updated_local"]]
        drawn_by = self._drawn_by()
        holders = fixed.chunk_holders[fixed.base[samples] // fixed.slots]
        groups = np.broadcast_to(layout.sample_groups(samples)[:, None], holders.shape)
        senders, groups = holders[drawn_by], groups[drawn_by]
        return {int(g): np.unique(senders[groups == g]) for g in np.unique(groups)}

    def _totals_tag(self, values: np.ndarray, sender: int, kind: str) -> float:
        """The tag of this client's totals as one more value (0 without a private key).

        Keyed with the parties' secret, so that the judge can check the sum it
        decrypts is exactly the active clients' totals of this attempt: a server
        that added a value of its choosing would otherwise read it back through
        the step and the coherence.
        """
        key = self._tag_key
        if key is None:
            return 0.0
        fixed = self.cipher.fixed_point
        tag = key.tag(kind, fixed.encode(values), self._tag_context(kind, sender))
        return float(np.ldexp(float(tag), -fixed.precision_bits))  # tag < 2**40: exact

    def _open_totals(self, vector: EncryptedVector, n: int, active: np.ndarray,
                     kind: str) -> np.ndarray:
        """The judge decrypts the summed totals of ``kind`` (``n`` values and their tag)
        and checks the tag against exactly the ``active`` clients' contributions,
        before using any."""
        layout = _totals_layout(self.cipher, n + 1)
        key = self._tag_key
        if key is None:  # no private key: nothing is hidden, nothing to check
            return decrypt_samples(self.cipher, layout, vector, np.array([0])).ravel()[:n]
        active = np.asarray(active, dtype=np.int64)
        told = self.round.get("active")
        if told is not None and not np.array_equal(active, told):
            raise fail("the summed totals", f"name the active clients {active.tolist()}, not "
                       f"the {np.asarray(told).tolist()} of the round's instructions",
                       "The server does not follow hyfl's protocol.")
        if self.k not in active or np.unique(active).size != active.size:
            raise fail("the summed totals", f"name the active clients {active.tolist()}, which "
                       f"do not include the judge (client {self.k}) once",
                       "The server does not follow hyfl's protocol.")
        return self._open_sum(vector, n, kind, [self._tag_context(kind, k)
                                                for k in active.tolist()],
                              "the summed totals", "the active clients' totals of this round")

    def _open_sum(self, vector: EncryptedVector, n: int, kind: str, contexts: list,
                  what: str, of: str) -> np.ndarray:
        """Decrypt a sum of ``n`` values and their tag; check it holds exactly the
        contributions of ``contexts`` before any value is used."""
        ints = decrypt_samples(self.cipher, _totals_layout(self.cipher, n + 1), vector,
                               np.array([0]), integers=True).ravel()
        if not self._tag_key.verify(kind, list(ints[:n]), ints[n], contexts,
                                    bound=self.cipher.fixed_point.max_int):
            raise fail(what, f"are not the sum of {of} (their tag does not verify): the "
                       "server changed them",
                       "The server does not follow hyfl's protocol; nothing was sent back.")
        return self.cipher.fixed_point.decode(ints[:n])

    def certify_verdict(self, message: dict) -> dict:
        """(One client, for all) decide on a checkpoint: is its dual no lower than the
        certified one? From the two conjugate sums (decrypted here) and the squared norms
        of the two primal images (the server's)."""
        pub = self.public
        sums = [self._conjugate_sum(message[name], message.get(f"{name}_made"), name)
                for name in ("certified", "checkpoint")]
        squares = np.asarray(message["w_sq"], dtype=float)
        certified, checkpoint = (-0.5 * pub.lam * q - s / pub.n_samples
                                 for s, q in zip(sums, squares))
        return {"accepted": bool(accepts(checkpoint, certified))}

    def _conjugate_sum(self, vector: EncryptedVector, made, name: str) -> float:
        """A conjugate sum the server kept: the judges' changes of the rounds it names
        (``made``: round, attempt, judge of each), checked by their tags."""
        made = np.asarray([] if made is None else made, dtype=np.int64).reshape(-1, 3)
        if self._tag_key is None:  # no private key: nothing hidden, nothing to check
            return decrypt_samples(self.cipher, _totals_layout(self.cipher, 2), vector,
                                   np.array([0])).ravel()[0]
        t = int(self.round["t"])
        if not np.all((made[:, 0] >= 1) & (made[:, 0] <= t) & (made[:, 1] >= 1)
                      & (made[:, 2] >= 0)):
            raise fail(f"the {name} conjugate sum", "names changes no judge can have made by "
                       f"round {t}", "The server does not follow hyfl's protocol.")
        if np.unique(made[:, :2], axis=0).shape[0] != made.shape[0]:
            raise fail(f"the {name} conjugate sum", "names two changes of one attempt of a "
                       "round (one judge makes a round's change)",
                       "The server does not follow hyfl's protocol.")
        return float(self._open_sum(vector, 1, "conjugate",
                                    [("conjugate", *row) for row in made.tolist()],
                                    f"the {name} conjugate sums",
                                    "the judges' changes it names")[0])

    def cocoa_commit(self, step: np.ndarray, leave: bool = False) -> EncryptedVector:
        """Take the step; send the encrypted changes of the samples this client reports
        (the new weights follow with the round's commit, :meth:`receive_weights`).

        ``leave``: the exploration leaves the certified pair: keep the copy as certified.
        """
        if leave:
            self.cert_alpha = self.alpha.copy()
        updated = self.round["updated_local"]
        change = self.direction * np.asarray(step)[None, :]
        before = self.alpha[updated]
        self.alpha[updated] = self._feasible(before + change, updated)
        reports = self.round["reports_local"]
        # The client's own record of the duals it reported (monitoring reads it to keep
        # the running average of the duals; it never leaves the client in the protocol).
        self.reported = (self.samples[updated[reports]], before[reports],
                         self.alpha[updated[reports]])
        self.previous_step = np.zeros_like(self.previous_step)
        self.previous_step[updated] = change
        self.round["taken_step"] = np.array(step, dtype=float)  # the commit names it too
        # The new state of every chunk holding a sample it reports that moved (a zero step
        # changes nothing), with a tag per chunk: the server stores it as it is.
        send = reports & np.any(change != 0.0, axis=1)
        local = self._samples_in(self.public.layout.chunks_of(self.samples[updated[send]]))
        return encrypt_tagged(self.cipher, TaggedLayout(self.public.layout, per_chunk=True),
                              self.samples[local], self.alpha[local], self._tag_key, "duals",
                              self._round_context("state"), self.k)

    def confirm_step(self, step: np.ndarray | None) -> None:
        """(cocoa) The round's commit names the judge's step: it must be the one this client
        found and took (every party finds the same from the same sums and curvature;
        different ones mean the server sent them different messages)."""
        taken = self.round.get("taken_step")
        if step is None or taken is None or not np.array_equal(np.asarray(step, float), taken):
            raise fail("the round's commit", f"names the step {np.asarray(step).tolist()!r}, "
                       f"not the step {None if taken is None else taken.tolist()!r} this party "
                       "found and took", "The server does not follow hyfl's protocol (it sent "
                       "the parties different sums or curvature); the party answers no more.")

    def _in_domain(self, values: np.ndarray, local: np.ndarray, what: str) -> None:
        """Refuse decrypted duals of local samples ``local`` outside the dual domain.

        A tag is linear modulo the prime ``P`` (:mod:`hyfl.privacy.tags`): a server
        that adds ``k P`` fixed-point units (``k P / 2**precision_bits``, about 256 at 32
        bits) to one value of a genuine sum leaves its tag valid whatever the key. The
        values an honest sum of duals or of averaged proposals holds stay in the dual
        domain (up to the encoding's rounding), so where that domain is narrower than
        the shift, such a sum is refused before anything is computed from it. (A loss
        with an unbounded dual domain, such as the squared loss, has no such check:
        docs/privacy.md, "How the tags work".)
        """
        if self._tag_key is None:
            return
        lo, hi = self.loss.dual_bounds(self.Y[local], self._weights(local))
        slack = DOMAIN_SLACK * (1.0 + np.abs(np.where(np.isfinite(lo), lo, 0.0))
                                + np.abs(np.where(np.isfinite(hi), hi, 0.0)))
        if np.any(values < lo - slack) or np.any(values > hi + slack):
            raise fail(what, "hold duals outside the dual domain (a multiple of the tags' "
                       "prime added to a genuine sum: its tag cannot see it)",
                       "The server does not follow hyfl's protocol; nothing was sent back.")

    def _feasible(self, values: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Project decrypted duals into the dual domain (fixed-point rounding may step out)."""
        lo, hi = self.loss.dual_bounds(self.Y[local], self._weights(local))
        return np.clip(values, lo, hi)

    def _weights(self, local) -> np.ndarray | None:
        """The weights of local samples ``local`` (shape of ``Y[local]``), None unweighted."""
        return None if self.W is None else self.W[local]


class Server:
    """The coordinator: public key, ciphertexts, plaintext primal parts and ``w``."""

    def __init__(self, public: Public, client_samples, client_features, cipher, rng):
        self.public, self.cipher, self.rng = public, cipher, rng
        self.client_samples = [np.asarray(s, dtype=np.int64) for s in client_samples]
        self.client_features = [np.asarray(f, dtype=np.int64) for f in client_features]
        K = len(self.client_samples)
        C = public.n_outputs
        self.K = K
        n_chunks = public.layout.n_chunks
        self.stored = _StoredDuals.empty(n_chunks, states=public.hyfdca.rule.subproblem)
        # Each client's last inner products; with the cocoa rule a tag chunk per holder
        # group, and when each group's part was made (round, attempt; 0: the zeros).
        self.ip_layout = (TaggedLayout(public.layout) if public.hyfdca.rule.subproblem
                          else public.layout)
        self.enc_ip = np.empty((K, self.ip_layout.n_chunks), dtype=object)
        self.ip_made = np.zeros((K, self.ip_layout.n_chunks - n_chunks, 2), dtype=np.int64)
        self.chunk_updated = np.zeros(n_chunks, dtype=np.int64)
        self.last_active = np.zeros(K, dtype=np.int64)
        self.primal_parts = [np.zeros((f.size, C)) for f in self.client_features]
        self.primal_sum = np.zeros((public.n_features, C))
        self.w = np.zeros((public.n_features, C))
        N = public.n_samples
        H = public.hyfdca.steps_per_client(N, K)
        sizes = np.array([s.size for s in self.client_samples])
        self.counts = sizes.copy() if H is None else np.minimum(H, sizes)
        self.beta = 1.0
        self.beta_min = 1.0 / float(public.n_holders.max())
        self.t = 0
        self.round_layout: SlotLayout | RoundLayout = public.layout  # set each round
        self.compact_steps = False  # whether this round's dual steps travel compact
        if public.hyfdca.rule.subproblem:
            M = public.n_features
            depth = public.hyfdca.history_depth(M)
            window = public.hyfdca.history_slots(public.n_samples, M, C)
            self.history = SpanHistory.empty(K, None, M, C, depth, window)
            # The absent holders' model (hyfl.algorithms.hyfdca_groups): the sample groups,
            # their composite weights' history, the weights each client last computed
            # inner products with, and the estimates of missing images that w holds.
            self.groups = find_sample_groups(self.client_samples, self.client_features,
                                             public.n_samples)
            self.group_history = (None if self.groups is None else
                                  GroupHistory.empty(self.groups, C, depth, window))
            self.snapshot = [np.zeros((f.size, C)) for f in self.client_features]
            self.estimates = [np.zeros((f.size, C)) for f in self.client_features]
            self.sigma = initial_sigma(self.client_features, M)
            self.sigma_ceiling = sigma_ceiling(self.client_features, M, sizes)
            self.previous_dw = np.zeros((M, C))
            # The chunks last round's step moved and what they held before it.
            self.previous = _StoredDuals.none()
            self.average_w = np.zeros((M, C))  # the running average of the model (plaintext)
            self.coherence = np.zeros(C)  # the line search's remembered coherence
        self.cert = _ServerCertificate.start(K) if public.hyfdca.certified else None
        self.limit = 1.0  # the round's longest step (the certificate's trust, or 1)
        self.attempt = 1  # the attempt at the round (a deployment may restart one)
        # The next round's inner products, sent ahead with this round's step (cocoa, every
        # client active): {"t": the round they are for, "parts": party -> EncryptedVector}.
        self.ahead: dict | None = None
        self.used_ahead = False  # this round's came ahead (one exchange fewer)

    # -- set-up ----------------------------------------------------------------
    def setup(self, messages: list[dict]) -> list[EncryptedVector]:
        """Start from (publicly known) zero duals and inner products; sum the row norms."""
        layout = self.public.layout
        self.stored.alpha[:] = self.cipher.zeros(layout.n_chunks)
        if self.stored.tags is not None:  # the zeros' tags: zero (no contribution)
            self.stored.tags[:] = self.cipher.zeros(layout.n_chunks)
        if self.cert is not None:  # the conjugate sum of the explored duals (all zero: 0)
            self.cert.explored_conj = self.cipher.zeros(
                _totals_layout(self.cipher, 2).n_chunks)
        for k, samples in enumerate(self.client_samples):
            chunks = self.ip_layout.chunks_of(samples)
            self.enc_ip[k, chunks] = self.cipher.zeros(chunks.size)
        norm_layout = TaggedLayout(self.public.norm_layout)
        norms = np.empty(norm_layout.n_chunks, dtype=object)
        store = np.empty((self.K, norms.size), dtype=object)
        for k, message in enumerate(messages):
            store[k, message["norms"].chunks] = message["norms"].ciphertexts
        every = np.arange(norms.size)
        norms[:] = self._sum_over_holders(store, every, norm_layout)
        return [self._select(norms, norm_layout, s) for s in self.client_samples]

    # -- 1. configure ----------------------------------------------------------------
    def configure(self, active: np.ndarray, was_active: np.ndarray) -> dict[int, dict]:
        """Draw every active client's samples and tell it what this round needs."""
        pub, hy = self.public, self.public.hyfdca
        self.t += 1
        t = self.t
        self.active = np.flatnonzero(active)
        sizes = np.array([self.client_samples[k].size for k in self.active])
        positions = draw_local_samples(self.rng, sizes, self.counts[self.active])
        splits = np.cumsum(self.counts[self.active])[:-1]
        drawn = dict(zip(self.active.tolist(), np.split(positions, splits)))
        self.updated = np.unique(
            np.concatenate(
                [self.client_samples[k][p] for k, p in drawn.items()] or [np.empty(0, int)]
            )
        ).astype(np.int64)
        self.n_draws = int(positions.size)
        first_active = _first_active_holder(pub.holders[self.updated], active)
        mine = {k: np.isin(self.client_samples[k], self.updated) for k in self.active.tolist()}
        draws = _pairs({k: self.client_samples[k][p] for k, p in drawn.items()})
        self.round_layout, self.compact_steps = pub.layout, False
        _, drawn_by = pub.layout.drawers(*draws)  # rows: self.updated
        if pub.compact:
            self.round_layout = pub.layout.compact(self.updated, drawn_by)
            if not hy.rule.subproblem:
                self.compact_steps = compact_steps(
                    pub.layout, draws,
                    _pairs({k: self.client_samples[k][m] for k, m in mine.items()}))
        cert = self.cert
        self.decisions = 0  # checkpoints a judge decides on this round (one exchange each)
        # Exact round: a certified state and every holder of every sample the round may
        # move (all of the active clients' samples) takes part.
        held = pub.holders[np.concatenate([self.client_samples[k] for k in self.active])
                           if self.active.size else np.empty(0, dtype=np.int64)]
        every_holder = bool(np.all(active[held[held >= 0]]))
        self.evaluable = every_holder and (cert is None or cert.current)
        self.evaluation: dict[str, float] = {}
        if cert is not None:
            self.exact = bool(cert.current and every_holder)
            self.limit = 1.0 if self.exact else cert.trust
        messages = {}
        for k in self.active.tolist():
            samples = self.client_samples[k]
            updated_local = np.flatnonzero(mine[k])
            message = {
                "updated_local": updated_local,
                "reports_local": (first_active[np.searchsorted(self.updated, samples[mine[k]])]
                                  == k),
                "t": t,
                "n_draws": self.n_draws,
                "stale": None,
                "active": self.active.astype(np.int64),  # the round's participants
            }
            # Which holders drew each updated sample: places it compactly, and names
            # whose proposals the client's sums hold (their tags are checked).
            rows = np.searchsorted(self.updated, samples[mine[k]])
            message["drawn_by_local"] = drawn_by[rows].ravel()
            if hy.rule.subproblem:  # the drawn samples in the order to visit them
                message["order_local"] = np.asarray(drawn[k])
            else:
                message["drawn_local"] = np.sort(drawn[k])
                message["compact_steps"] = self.compact_steps  # a control bit
            if hy.rule.tests_round:
                message["beta"] = self.beta
            synced = self.last_active[k]
            if cert is not None:
                synced = max(synced, cert.reset_at)  # every copy was reset then
                message["limit"] = self.limit
                message["certificate"] = np.asarray(cert.events[cert.cursor[k]:],
                                                    dtype=np.int64)
                cert.cursor[k] = len(cert.events)
                if cert.checkpoint is not None and cert.checkpoint["pending"][k]:
                    message["checkpoint_duals"], message["checkpoint_contexts"] = \
                        self._states(cert.checkpoint["stored"], self._changed(
                            k, cert.checkpoint["chunk_updated"], synced))
            if not was_active[k] and t > 1:
                changed = self._changed(k, self.chunk_updated, synced)
                if self.stored.tags is None:  # the per-sample rules: running sums of steps
                    message["stale"] = self._select(self.stored.alpha, pub.layout, changed)
                else:
                    message["stale"], message["stale_contexts"] = self._states(self.stored,
                                                                               changed)
            messages[k] = message
        self.last_active[self.active] = t
        return messages

    def refresh(self, replies: dict[int, dict]) -> dict[int, np.ndarray]:
        """Re-aggregate ``w`` from returning clients' parts; send them their weights."""
        for k, reply in replies.items():
            if "checkpoint_part" in reply:  # its image of the open checkpoint
                self.cert.checkpoint["parts"][k] = np.array(reply["checkpoint_part"], dtype=float)
                self.cert.checkpoint["pending"][k] = False
            if "primal_part" in reply:
                self._set_primal_part(k, reply["primal_part"])
        if self.public.hyfdca.rule.subproblem:  # exact images replace the estimates
            for k in replies:
                if "primal_part" in replies[k]:
                    self.estimates[k][:] = 0.0
        self._update_w()
        if self.public.hyfdca.rule.subproblem:  # every active client needs the new w
            return {int(k): self.w[self.client_features[k]] for k in self.active}
        return {k: self.w[self.client_features[k]] for k in replies}

    # -- 2. SecureInnerProduct ---------------------------------------------------------
    def sum_inner_products(self, parts: dict[int, EncryptedVector]) -> dict[int, EncryptedVector]:
        """Store each client's encrypted parts; return ``enc(x_i^T w)`` of its updated samples."""
        if self.public.horizontal:
            return dict.fromkeys(parts)
        layout, store = self.public.layout, self.enc_ip
        if self.public.hyfdca.sip_scope != "all":
            # Only this round's parts are summed (every holder is active): they travel
            # compact and are not kept, so the stored parts stay in the fixed layout.
            layout = self.round_layout
            store = np.empty_like(self.enc_ip)
        for k, vec in parts.items():
            store[k, vec.chunks] = vec.ciphertexts
        chunks = layout.chunks_of(self.updated)
        z = np.empty(layout.n_chunks, dtype=object)
        z[chunks] = self._sum_over_holders(store, chunks, layout)
        return {k: self._select(z, layout, self._updated_of(k)) for k in parts}

    def store_inner_products(self, k: int, vec: EncryptedVector | None) -> None:
        """The optional second SecureInnerProduct: keep the parts for later rounds."""
        if vec is not None:
            self.enc_ip[k, vec.chunks] = vec.ciphertexts

    # -- 3. dual aggregation -------------------------------------------------------------
    def aggregate_duals(self, steps: dict[int, EncryptedVector]) -> dict[int, EncryptedVector]:
        """Tentative ``enc(alpha) + sum of the scaled steps``; new duals for each client.

        With compact steps: the sums of the steps instead (compact layout); the
        stored duals move by the changes the clients report next.
        """
        if self.compact_steps:
            total = self._sum_received(steps, self.round_layout.n_chunks)
            return {k: self._select(total, self.round_layout, self._updated_of(k))
                    for k in steps}
        layout = self.public.layout
        self.tentative = self.stored.alpha.copy()
        for vec in steps.values():
            self.tentative[vec.chunks] = self.cipher.add(self.tentative[vec.chunks],
                                                         vec.ciphertexts)
        return {k: self._select(self.tentative, layout, self._updated_of(k)) for k in steps}

    # -- 4. primal aggregation and the verdict ----------------------------------------------
    def aggregate_primal(self, replies: dict[int, dict]):
        """New primal parts -> candidate ``w``; the summed gain terms for the verdict."""
        self.saved = (list(self.primal_parts), self.primal_sum.copy(), self.w.copy())
        if self.compact_steps:  # the reported changes move the stored duals (if accepted)
            self.tentative = self.stored.alpha.copy()
            for reply in replies.values():
                vec = reply["changes"]
                if len(vec):
                    self.tentative[vec.chunks] = self.cipher.add(self.tentative[vec.chunks],
                                                                 vec.ciphertexts)
        for k, reply in replies.items():
            self._set_primal_part(k, reply["primal_part"])
        self._update_w()
        if not self.public.hyfdca.rule.tests_round or not replies:
            # Without active clients nothing moved: there is nothing to judge.
            return None
        dw = self.w - self.saved[2]
        totals = [reply["totals"] for reply in replies.values()]
        acc = totals[0].ciphertexts
        for vec in totals[1:]:
            acc = self.cipher.add(acc, vec.ciphertexts)
        judge = int(self.active[0])
        return judge, {"totals": EncryptedVector(totals[0].chunks, acc),
                       "dw_sq": float(np.sum(dw * dw)), "active": self.active.astype(np.int64)}

    def commit(self, accepted: bool) -> dict[int, np.ndarray]:
        """Keep or drop the round; every active client gets its features' weights."""
        if self.public.hyfdca.rule.tests_round:
            self.beta = next_beta(accepted, self.beta, self.beta_min, self.n_draws)
        if accepted:
            self.stored.alpha = self.tentative
            self.chunk_updated[self.public.layout.chunks_of(self.updated)] = self.t
        else:
            self.primal_parts, self.primal_sum, self.w = self.saved
        return {int(k): self.w[self.client_features[k]] for k in self.active}

    # -- the cocoa rule (see hyfl.algorithms.hyfdca_local) ---------------------------------
    def cocoa_inner_products(self, parts: dict[int, EncryptedVector | None]) -> dict[int, dict]:
        """Sums of the inner products of every sample of the active clients, each client's
        directions' Gram matrix and the subproblem's scaling."""
        layout, pub = self.public.layout, self.public
        active = self.active
        self.history.record(self.t, self.w, active)
        pairs, grams = self.history.directions(active)
        self.pairs = dict(zip(active.tolist(), pairs))
        towards_w, roles = {}, {}
        if self.groups is not None:
            for k in active:  # they compute this round's inner products with w
                self.snapshot[k] = self.w[self.client_features[k]].copy()
            composites = self._record_composites()
            grams = self.group_history.grams(active, pairs, self.t)
            towards_w = dict(zip(active.tolist(), self.group_history.towards_w(
                active, pairs, self.w, composites)))
            roles = self._group_roles()
        upper = np.triu_indices(grams.shape[-1])
        coef = self.sigma / (pub.lam * pub.n_samples)
        made = {}
        if pub.horizontal:
            z = None
        else:
            layout = self.ip_layout
            for k, vec in parts.items():
                self.enc_ip[k, vec.chunks] = vec.ciphertexts
                tags = vec.chunks[vec.chunks >= pub.layout.n_chunks] - pub.layout.n_chunks
                self.ip_made[k, tags] = (self.t, self.attempt)
            chunks = np.unique(np.concatenate([layout.chunks_of(self.client_samples[k])
                                               for k in active]))
            z = np.empty(layout.n_chunks, dtype=object)
            z[chunks] = self._sum_over_holders(self.enc_ip, chunks, layout)
            made = {int(k): self._parts_made(k) for k in active}
        return {
            int(k): {
                "z": None if z is None else self._select(z, layout, self.client_samples[k]),
                **({"z_made": made[int(k)]} if made else {}),
                "grams": grams[a][:, upper[0], upper[1]],  # symmetric: the upper triangles
                "coef": coef,
                **({} if self.groups is None else {
                    "towards_w": towards_w[int(k)],
                    "span_sums": int(k) in roles.get("senders", {}),
                    "exact": bool(roles.get("exact", {}).get(int(k), False)),
                }),
            }
            for a, k in enumerate(active)
        }

    def cocoa_aggregate(self, proposals: dict[int, EncryptedVector],
                        newcomers: np.ndarray) -> dict[int, dict]:
        """Sum the scaled proposals; each active client gets its updated samples' sums
        (returning clients also the last steps of their samples)."""
        layout = self.public.layout  # the stored last steps
        tagged = self.proposal_layout
        total = self._sum_received(proposals, tagged.n_chunks)
        out = {}
        for k in self.active.tolist():
            message = {"proposal": self._select(total, tagged, self._updated_of(k)),
                       "previous": None}
            moved = self.previous.chunks
            if newcomers[k] and moved.size:
                # Only the chunks that moved last round travel (their states before it,
                # the client has the states after); the rest were zero steps.
                chunks = np.intersect1d(layout.chunks_of(self._updated_of(k)), moved)
                message["previous"], message["previous_contexts"] = self.previous.sent(
                    chunks, layout.n_chunks)
            out[k] = message
        return out

    @property
    def proposal_layout(self) -> TaggedLayout:
        """Where the round's proposals travel: its layout with a tag chunk per holder group."""
        return TaggedLayout(self.round_layout)

    def cocoa_momentum(self, images: dict[int, np.ndarray]) -> np.ndarray:
        """The proposal's primal image -> the momentum coefficient, per output."""
        dw = self._image(images)
        return momentum_coefficient(dw, self.previous_dw, self.public.hyfdca.momentum)

    def cocoa_totals(self, replies: dict[int, dict]) -> dict[int, dict]:
        """The direction's primal image (with the absent holders' part estimated where the
        split has sample groups); the summed line-search sums for every active client,
        each of which finds the same step and takes it.

        ``leave``: the exploration leaves the certified state this round (it is kept
        first, :meth:`_keep_certified`), and so does each client's copy.
        """
        self.direction_dw = self._image({k: r["primal_part"] for k, r in replies.items()})
        self.direction_parts = {k: r["primal_part"] for k, r in replies.items()}
        self.direction_estimates = {}
        if self.groups is not None:
            self._estimate_absent(replies)
        totals = [reply["totals"] for reply in replies.values()]
        acc = totals[0].ciphertexts
        for vec in totals[1:]:
            acc = self.cipher.add(acc, vec.ciphertexts)
        self.start_w_sq = float(np.sum(self.w * self.w))  # the round start's, for its certificate
        dw_sq = np.sum(self.direction_dw * self.direction_dw, axis=0)
        self.leave = False
        if self.cert is not None and not self.exact and self.cert.current:
            self._keep_certified()  # the round's step leaves the certified state
            self.leave = True
        message = {"totals": EncryptedVector(totals[0].chunks, acc), "dw_sq": dw_sq,
                   "coherence": self.coherence, "updated": int(self.updated.size),
                   "active": self.active.astype(np.int64), "leave": self.leave}
        if not self.sends_ahead:
            return {int(k): message for k in self.active}
        # Every client takes part: nobody can return next round, so each sends the next
        # round's inner products with its step, from its features' move per unit step.
        return {int(k): {**message, "dw": self.direction_dw[self.client_features[k]]}
                for k in self.active}

    @property
    def sends_ahead(self) -> bool:
        """Whether this round's step brings the next round's inner products (cocoa, not
        horizontal, every client active: then no absent holder's estimate moves ``w``,
        which moves by ``step dw``)."""
        pub = self.public
        return bool(pub.hyfdca.rule.subproblem and not pub.horizontal
                    and self.active.size == self.K)

    def keep_ahead(self, parts: dict[int, EncryptedVector]) -> None:
        """Keep the next round's inner products sent with this round's step."""
        self.ahead = {"t": self.t + 1, "parts": dict(parts)}

    def take_ahead(self, configure: dict[int, dict]) -> dict[int, EncryptedVector] | None:
        """The inner products sent ahead for this round, if they hold: made for this
        round's first attempt with the weights it starts from (no certificate reset
        since, no returning client), one from each of its clients."""
        ahead, self.ahead, self.used_ahead = self.ahead, None, False
        if (ahead is None or ahead["t"] != self.t or self.attempt != 1
                or not set(configure) <= set(ahead["parts"])
                or any(message["stale"] is not None for message in configure.values())):
            return None
        self.used_ahead = True
        return {k: ahead["parts"][k] for k in configure}

    @property
    def judge(self) -> int:
        """The client whose reply carries the round's step (all find the same one)."""
        return int(self.active[0])

    def cocoa_commit(self, verdict: dict) -> dict[int, np.ndarray]:
        """Apply the judge's step to ``w``; every active client gets its weights."""
        step = np.asarray(verdict["step"], dtype=float)
        self.coherence = np.asarray(verdict["coherence"], dtype=float)
        # The round start's certificate, where it is exact: every holder of every active
        # client's sample took part, from a consistent (certified) state.
        pub = self.public
        covered = self.updated.size == pub.n_samples  # every sample reported once
        self.evaluation = (round_certificate(np.asarray(verdict["evaluation"], dtype=float),
                                             self.start_w_sq, pub.lam)
                           if self.evaluable and covered else {})
        if self.cert is not None:
            self.stepped = bool(np.any(step > 0))
            self.cert.explored_conj = self.cipher.add(self.cert.explored_conj,
                                            verdict["conjugate_change"].ciphertexts)
            self.cert.explored_made.append((self.t, self.attempt, int(self.active[0])))
        for k, part in self.direction_parts.items():
            features = self.client_features[k]
            self.primal_parts[k] = self.primal_parts[k] + part * step[None, :]
            self.primal_sum[features] += part * step[None, :]
        for k, part in self.direction_estimates.items():
            self.estimates[k] = self.estimates[k] + part * step[None, :]
        self._update_w()
        self.previous_dw = self.direction_dw * step[None, :]
        self.sigma = next_sigma(self.sigma, step / self.limit, self.sigma_ceiling)
        self.cocoa_average()
        return {int(k): self.w[self.client_features[k]] for k in self.active}

    def cocoa_idle(self) -> None:
        """A round nobody takes part in: the history and the running average move on."""
        self.history.record(self.t, self.w, np.empty(0, dtype=np.int64))
        if self.groups is not None:
            self._record_composites()
        self.cocoa_average()

    # -- the absent holders' model (hyfl.algorithms.hyfdca_groups) ---------------------------
    def _record_composites(self) -> np.ndarray:
        composites = self.groups.composite(lambda k: self.snapshot[k])
        self.group_history.record(self.t, composites)
        return composites

    def _group_roles(self) -> dict:
        """Per group with active and absent members: its first active member sends the span
        sums; whether its directions span the absent members' features (an exact estimate)."""
        active = np.zeros(self.K, dtype=bool)
        active[self.active] = True
        senders, exact = {}, {}
        for g, members in enumerate(self.groups.members):
            present, absent = members[active[members]], members[~active[members]]
            if present.size == 0 or absent.size == 0:
                continue
            sender = int(present[0])
            U = self.group_history.vectors(sender, self.pairs[sender],
                                           self.groups.coordinates(absent))
            _, is_exact = absent_image(U, np.zeros((U.shape[2], U.shape[1])),
                                       np.zeros((U.shape[2], U.shape[1])))
            senders[sender] = g
            exact.update(dict.fromkeys(present.tolist(), is_exact))
        self.roles = {"senders": senders, "exact": exact}
        return self.roles

    def _estimate_absent(self, replies: dict[int, dict]) -> None:
        """Each sender's group: the least-norm image on its absent members' features."""
        lam_n = self.public.lam * self.public.n_samples
        active = np.zeros(self.K, dtype=bool)
        active[self.active] = True
        for sender, g in self.roles["senders"].items():
            members = self.groups.members[g]
            absent = members[~active[members]]
            active_image = self.groups.place(g, {  # each member's image on its own slice
                int(k): replies[int(k)]["primal_part"] / lam_n for k in members[active[members]]})
            pairs = self.pairs[sender]
            sums = replies[sender].get("span_sums")
            if sums is None or np.shape(sums) != (self.public.n_outputs, pairs.shape[0]):
                raise fail(f"party {sender}",
                           f"sent span sums of shape {np.shape(sums)} with its direction, "
                           f"expected {(self.public.n_outputs, pairs.shape[0])}",
                           "Run the same hyfl version on every party and the server.")
            estimates, _ = self.group_history.estimate_absent(
                g, sender, pairs, absent, np.asarray(sums, dtype=float), active_image,
                self.direction_dw)
            self.direction_estimates.update(estimates)

    def cocoa_average(self) -> None:
        """Move the running average of the model on by one round."""
        rho = average_weight(self.t)
        self.average_w = (1.0 - rho) * self.average_w + rho * self.w

    def cocoa_store(self, states: dict[int, EncryptedVector]) -> None:
        """Store the chunks' new states as the reporters sent them (each with its tag, and
        who made it); keep what they replace, for returning clients' last steps."""
        n, stored = self.public.layout.n_chunks, self.stored
        for k, vec in states.items():
            if not np.array_equal(vec.chunks[vec.chunks >= n], n + vec.chunks[vec.chunks < n]):
                raise fail(f"party {k}'s dual states", "do not come with one tag per chunk",
                           "Run every party with the same hyfl version.")
        moved = np.sort(np.concatenate([vec.chunks[vec.chunks < n] for vec in states.values()]
                                       or [np.empty(0, dtype=np.int64)]))
        self.previous = stored.take(moved)
        for k, vec in states.items():
            data = vec.chunks < n
            chunks = vec.chunks[data]
            stored.alpha[chunks] = vec.ciphertexts[data]
            stored.tags[chunks] = vec.ciphertexts[~data]
            stored.contexts[chunks] = (self.t, self.attempt, k)
            self.chunk_updated[chunks] = self.t
        if self.cert is not None:
            self._certificate_round_end()

    # -- the certificate (hyfl.algorithms.hyfdca_certify) -----------------------------------
    def _keep_certified(self) -> None:
        """The exploration leaves the certified state: keep its ciphertexts and images."""
        cert = self.cert
        cert.stored = self.stored.copy()
        cert.parts = [part.copy() for part in self.primal_parts]
        cert.w = self.w.copy()
        cert.enc_conj = cert.explored_conj.copy()
        cert.conj_made = list(cert.explored_made)
        cert.current = False
        cert.events.append(EVENTS["leave"])
        cert.cursor[self.active] = len(cert.events)  # told with this round's commit

    def _certificate_round_end(self) -> None:
        """Mark the absent holders of what moved as stale; pending clients that sent their
        image are no longer pending (done in refresh); open a checkpoint if needed."""
        cert, pub = self.cert, self.public
        active = np.zeros(self.K, dtype=bool)
        active[self.active] = True
        cert.stale[active] = False
        if self.stepped:  # any sample of the round may have moved
            holders = pub.holders[self.updated]
            holders = holders[holders >= 0]
            cert.stale[holders[~active[holders]]] = True
        self.decisions = 0
        if self.exact and cert.current:
            return
        if cert.checkpoint is None and not cert.current:
            self._open_checkpoint()

    def _open_checkpoint(self) -> None:
        cert = self.cert
        cert.checkpoint = {
            "stored": self.stored.copy(),
            "chunk_updated": self.chunk_updated.copy(),
            "parts": [None if cert.stale[k] else part.copy()
                      for k, part in enumerate(self.primal_parts)],
            "enc_conj": cert.explored_conj.copy(),
            "conj_made": list(cert.explored_made),
            "pending": cert.stale.copy(),
            "round": self.t,
        }
        cert.events.append(EVENTS["checkpoint"])

    def cocoa_certify_request(self):
        """At the end of a round: ``(judge, message)`` when the open checkpoint can be
        decided (no image of it is missing), else None."""
        cert = self.cert
        if cert is None or cert.checkpoint is None or cert.checkpoint["pending"].any():
            return None
        if not self.active.size:
            return None
        ckpt = cert.checkpoint
        self.checkpoint_w = self._image(dict(enumerate(ckpt["parts"])))
        chunks = np.arange(cert.enc_conj.size)
        return int(self.active[0]), {
            "certified": EncryptedVector(chunks, cert.enc_conj),
            "checkpoint": EncryptedVector(chunks, ckpt["enc_conj"]),
            # who made the changes each sum holds (round, attempt, judge): checked by tags
            "certified_made": np.array(cert.conj_made, dtype=np.int64).reshape(-1),
            "checkpoint_made": np.array(ckpt["conj_made"], dtype=np.int64).reshape(-1),
            "w_sq": np.array([np.sum(cert.w * cert.w), np.sum(self.checkpoint_w ** 2)]),
        }

    def cocoa_certify_verdict(self, accepted: bool) -> None:
        """Take the checkpoint as certified, or restart the exploration from the certified
        state; then open the next checkpoint if the exploration has moved on."""
        cert = self.cert
        ckpt, cert.checkpoint = cert.checkpoint, None
        cert.trust = next_trust(cert.trust, bool(accepted))
        self.decisions += 1
        if accepted:
            cert.events.append(EVENTS["accept"])
            cert.stored, cert.enc_conj = ckpt["stored"], ckpt["enc_conj"]
            cert.conj_made = ckpt["conj_made"]
            cert.parts, cert.w = ckpt["parts"], self.checkpoint_w
            if not cert.stale.any() and ckpt["round"] == self.t:
                cert.current = True
        else:
            cert.events.append(EVENTS["reject"])
            self.ahead = None  # made with the explored w, which is dropped
            self.stored = cert.stored.copy()
            cert.explored_conj = cert.enc_conj.copy()
            cert.explored_made = list(cert.conj_made)
            self.primal_parts = [part.copy() for part in cert.parts]
            self.primal_sum = np.zeros_like(self.primal_sum)
            for k, part in enumerate(self.primal_parts):
                self.primal_sum[self.client_features[k]] += part
            for estimate in self.estimates:  # the certified w is exact
                estimate[:] = 0.0
            self._update_w()
            self.previous = _StoredDuals.none()
            self.previous_dw = np.zeros_like(self.previous_dw)
            cert.stale[:] = False
            cert.current = True
            cert.reset_at = self.t
        if cert.checkpoint is None and not cert.current:
            self._open_checkpoint()

    def _states(self, stored: _StoredDuals, samples: np.ndarray):
        """The stored states of the chunks of ``samples`` (see :meth:`_StoredDuals.sent`)."""
        layout = self.public.layout
        chunks = layout.chunks_of(samples) if len(samples) else np.empty(0, dtype=np.int64)
        return stored.sent(chunks, layout.n_chunks)

    def _parts_made(self, k: int) -> np.ndarray:
        """When each holder's inner products in client ``k``'s groups were made: (round,
        attempt) per group (ascending) and holder (ascending), flattened."""
        layout = self.ip_layout
        holders = layout.chunk_holders[layout.inner.n_chunks:]
        groups = np.unique(layout.sample_groups(self.client_samples[k]))
        rows = holders[groups]
        group_of = np.broadcast_to(groups[:, None], rows.shape)
        real = rows >= 0
        return self.ip_made[rows[real], group_of[real]].reshape(-1)

    def _changed(self, k: int, chunk_updated: np.ndarray, after: int) -> np.ndarray:
        """Client ``k``'s samples whose stored duals changed after round ``after``."""
        pub, samples = self.public, self.client_samples[k]
        rounds = chunk_updated[pub.layout.positions(samples) // pub.layout.slots]
        rounds = rounds.reshape(samples.size, pub.n_outputs).max(axis=1)
        return samples[rounds > after]

    def _image(self, parts: dict[int, np.ndarray]) -> np.ndarray:
        """``sum_k`` (per-feature) of the clients' primal parts, divided by lam N."""
        total = np.zeros_like(self.w)
        for k, part in parts.items():
            total[self.client_features[k]] += part
        return total / (self.public.lam * self.public.n_samples)

    # -- helpers -----------------------------------------------------------------------
    def _updated_of(self, k: int) -> np.ndarray:
        samples = self.client_samples[k]
        return samples[np.isin(samples, self.updated)]

    def _set_primal_part(self, k: int, part: np.ndarray) -> None:
        features = self.client_features[k]
        self.primal_sum[features] += part - self.primal_parts[k]
        self.primal_parts[k] = np.array(part, dtype=float)

    def _update_w(self) -> None:
        self.w = self.primal_sum / (self.public.lam * self.public.n_samples)
        for k, estimate in enumerate(getattr(self, "estimates", ())):
            if estimate.any():
                self.w[self.client_features[k]] += estimate

    def _sum_received(self, vectors: dict[int, EncryptedVector], n_chunks: int) -> np.ndarray:
        """Chunk-wise sums of the received vectors: the first ciphertext of a chunk is
        kept, the others are added to it (summed within the round, not stored)."""
        total = np.empty(n_chunks, dtype=object)
        have = np.zeros(n_chunks, dtype=bool)
        for vec in vectors.values():
            old = have[vec.chunks]
            fresh_chunks, added_chunks = vec.chunks[~old], vec.chunks[old]
            total[fresh_chunks] = vec.ciphertexts[~old]
            if added_chunks.size:
                total[added_chunks] = self.cipher.add(total[added_chunks], vec.ciphertexts[old])
            have[vec.chunks] = True
        return total

    def _select(self, store: np.ndarray, layout: SlotLayout | RoundLayout,
                samples) -> EncryptedVector:
        chunks = layout.chunks_of(samples) if len(samples) else np.empty(0, dtype=np.int64)
        return EncryptedVector(chunks, store[chunks])

    def _sum_over_holders(self, store: np.ndarray, chunks: np.ndarray,
                          layout: SlotLayout | RoundLayout):
        """``sum_{k in B} store[k, c]`` for each chunk, added in holder order."""
        holders = layout.chunk_holders[chunks]
        acc = store[holders[:, 0], chunks]
        for rank in range(1, holders.shape[1]):
            has = holders[:, rank] >= 0
            if has.any():
                acc[has] = self.cipher.add(acc[has], store[holders[has, rank], chunks[has]])
        return acc


@dataclass
class _StoredDuals:
    """The server's encrypted duals, one ciphertext per chunk of the fixed layout.

    With the cocoa rule each chunk holds the *state* its reporter last sent, with
    its tag (:mod:`hyfl.privacy.tags`) and who made it (``contexts``: round,
    attempt, reporter; round 0 for the zeros the run starts from), so that a
    client can check what it is sent. The per-sample rules' duals are running
    sums of steps (``tags`` and ``contexts`` None).
    """

    alpha: np.ndarray
    tags: np.ndarray | None
    contexts: np.ndarray | None
    chunks: np.ndarray | None = None  # a subset's chunk ids (None: every chunk, in order)

    @classmethod
    def none(cls) -> _StoredDuals:
        """No chunks (no last step to send)."""
        return cls.empty(0, states=True).take(np.empty(0, dtype=np.int64))

    def take(self, chunks: np.ndarray) -> _StoredDuals:
        """What the given chunks (ascending) hold now, as a subset."""
        return _StoredDuals(self.alpha[chunks], self.tags[chunks], self.contexts[chunks].copy(),
                            np.asarray(chunks, dtype=np.int64))

    def sent(self, chunks: np.ndarray, n_chunks: int) -> tuple[EncryptedVector, np.ndarray]:
        """The states of ``chunks`` as a client receives them: each with its tag chunk (see
        :class:`~hyfl.privacy.layout.TaggedLayout`), and who made each (round, attempt,
        reporter per chunk, flattened)."""
        rows = chunks if self.chunks is None else np.searchsorted(self.chunks, chunks)
        vector = EncryptedVector(np.concatenate([chunks, n_chunks + chunks]),
                                 np.concatenate([self.alpha[rows], self.tags[rows]]))
        return vector, self.contexts[rows].reshape(-1)

    @classmethod
    def empty(cls, n_chunks: int, states: bool) -> _StoredDuals:
        if not states:
            return cls(np.empty(n_chunks, dtype=object), None, None)
        return cls(np.empty(n_chunks, dtype=object), np.empty(n_chunks, dtype=object),
                   np.zeros((n_chunks, 3), dtype=np.int64))

    def copy(self) -> _StoredDuals:
        return _StoredDuals(*(None if a is None else a.copy()
                              for a in (self.alpha, self.tags, self.contexts, self.chunks)))


@dataclass
class _ServerCertificate:
    """What the server keeps for the certificate (see hyfl.algorithms.hyfdca_certify)."""

    stale: np.ndarray  # (K,) clients whose primal part is of an older copy of their duals
    cursor: np.ndarray  # (K,) notices each client has been told
    events: list  # the notices so far (EVENTS codes)
    trust: float = 1.0
    current: bool = True  # the certified state is the explored one
    reset_at: int = 0  # the last round the exploration restarted (every copy reset)
    stored: _StoredDuals | None = None  # the certified duals' ciphertexts
    enc_conj: np.ndarray | None = None  # their conjugate sum's ciphertexts (sum and tag)
    conj_made: list | None = None  # (round, attempt, judge) of each change it holds
    explored_conj: np.ndarray | None = None  # the explored duals' conjugate sum's ciphertexts
    explored_made: list = field(default_factory=list)
    parts: list | None = None  # every client's primal part of them
    w: np.ndarray | None = None  # their image
    checkpoint: dict | None = None  # the open checkpoint

    @classmethod
    def start(cls, n_clients: int) -> _ServerCertificate:
        return cls(stale=np.zeros(n_clients, dtype=bool),
                   cursor=np.zeros(n_clients, dtype=np.int64), events=[])


def _first_active_holder(holders: np.ndarray, active: np.ndarray) -> np.ndarray:
    """For each row of sorted holders (-1 padded), the first active one (or -1)."""
    is_active = (holders >= 0) & active[np.maximum(holders, 0)]
    first = np.argmax(is_active, axis=1)
    found = is_active[np.arange(holders.shape[0]), first]
    return np.where(found, holders[np.arange(holders.shape[0]), first], -1)


def _pairs(samples_of: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``{client: samples}`` -> the (clients, samples) pairs, client by client."""
    if not samples_of:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    clients = np.repeat(np.fromiter(samples_of, dtype=np.int64, count=len(samples_of)),
                        [len(v) for v in samples_of.values()])
    return clients, np.concatenate(list(samples_of.values())).astype(np.int64)


def _gain_at(loss, gains: np.ndarray, step: np.ndarray, limit: float) -> np.ndarray:
    """The conjugate gain ``sum_i l*(-alpha_i) - l*(-(alpha_i + t d_i))`` at the step taken,
    per output, from its values at the line search's points (exact: the quadratic through
    them, or the grid point taken)."""
    gains, step = np.asarray(gains, dtype=float), np.asarray(step, dtype=float)
    if loss.quadratic_conjugate:
        half, full = gains
        curvature = 2.0 * (full - 2.0 * half)
        return (full - curvature) * step + curvature * step * step
    points = line_search_points(loss, limit)
    taken = np.isclose(points[:, None], step[None, :], rtol=0.0, atol=1e-15) & (step > 0)
    return np.sum(np.where(taken, gains, 0.0), axis=0)


def _symmetric(upper: np.ndarray) -> np.ndarray:
    """(C, R(R+1)/2) upper triangles (row-major) -> (C, R, R) symmetric matrices."""
    C, n = upper.shape
    R = int(round((np.sqrt(8 * n + 1) - 1) / 2))
    out = np.zeros((C, R, R))
    i, j = np.triu_indices(R)
    out[:, i, j] = upper
    out[:, j, i] = upper
    return out


def _evaluation_terms(loss, margins: np.ndarray, alpha: np.ndarray, y: np.ndarray,
                      n_samples: int, weight: np.ndarray | None = None) -> np.ndarray:
    """A client's part of the round certificate over the samples it reports, each a sum
    over them divided by ``N`` (its share of the mean): ``loss(x_i^T w)`` and
    ``loss*(alpha_i)`` per output, and its correct predictions (of a classification: the
    sign, or the largest of the one-vs-rest scores)."""
    if margins.shape[0] == 0:
        return np.zeros(2 * y.shape[1] + 1)
    if loss.classification:
        if y.shape[1] == 1:
            correct = np.count_nonzero(np.where(margins[:, 0] >= 0, 1.0, -1.0) == y[:, 0])
        else:
            correct = np.count_nonzero(np.argmax(margins, axis=1) == np.argmax(y, axis=1))
    else:
        correct = 0
    return np.concatenate([np.sum(loss.value(margins, y, weight), axis=0),
                           np.sum(loss.conjugate(alpha, y, weight), axis=0),
                           [float(correct)]]) / n_samples


def round_certificate(evaluation: np.ndarray, w_sq: float, lam: float) -> dict[str, float]:
    """The objective, dual, gap and accuracy of a round's start from the summed terms.

    ``P(w) = sum loss / N + lam/2 ||w||^2`` and ``D(alpha) = -sum loss* / N - lam/2
    ||w||^2`` (``w`` the image of ``alpha``, and the terms over all samples: the caller
    vouches for both). ``accuracy`` means something for a classification loss only (it
    is 0 for a regression).
    """
    C = (evaluation.size - 1) // 2
    primal = float(np.sum(evaluation[:C]) + 0.5 * lam * w_sq)
    dual = float(-np.sum(evaluation[C:2 * C]) - 0.5 * lam * w_sq)
    return {"primal": primal, "dual": dual, "gap": primal - dual,
            "accuracy": float(evaluation[2 * C])}


def _totals_layout(cipher, n_values: int = GAIN_TERMS) -> SlotLayout:
    """One pseudo-sample carrying ``n_values`` summed terms (ceil(n / slots) ciphertexts)."""
    slots = cipher.slots
    n_chunks = -(-n_values // slots)
    return SlotLayout(
        slots=slots,
        n_outputs=n_values,
        base=np.zeros(1, dtype=np.int64),
        n_chunks=n_chunks,
        chunk_holders=np.zeros((n_chunks, 1), dtype=np.int64),
        client_chunks=np.zeros(1, dtype=np.int64),
    )


def public_info(hyfdca: HyFDCA, blocks: StackedBlocks, n_outputs: int, lam: float,
                slots: int, compact: bool = True) -> Public:
    """What every party knows, from who holds which sample and feature.

    Only the block structure of ``blocks`` is read (sample and feature ids
    per client), never its values, so a deployment's server can build it
    from the ids the parties announce.
    ``compact=False`` keeps every message in the fixed layout (the protocol
    before compact layouts; for measuring against).
    """
    return Public(
        n_samples=blocks.n_samples,
        n_features=blocks.n_features,
        n_outputs=int(n_outputs),
        lam=float(lam),
        hyfdca=hyfdca.validated(),
        layout=SlotLayout.build(blocks, slots, n_outputs),
        norm_layout=SlotLayout.build(blocks, slots, 1),
        n_holders=blocks.n_holders,
        holders=holder_matrix(blocks),
        horizontal=bool(np.all(blocks.n_holders == 1)),
        compact=bool(compact),
    )


def build_parties(hyfdca: HyFDCA, problem: Problem, blocks: StackedBlocks, private, public_cipher,
                  rng: np.random.Generator, compact: bool = True, run: bytes | None = None):
    """The server and every client of one run, each holding only its own data.

    ``compact=False`` sends every value in the fixed layout (see :class:`Public`);
    ``run`` is the run's identity the clients key their tags with
    (:func:`hyfl.privacy.tags.run_identity`; needed with a private key).
    """
    public = public_info(hyfdca, blocks, problem.Y.shape[1], problem.lam, private.slots,
                         compact)
    clients, samples_of, features_of = [], [], []
    for k in range(blocks.n_clients):
        samples, features, X_local = client_block(blocks, k)
        clients.append(
            Client(k, public, samples, features, X_local, problem.Y[samples], problem.loss,
                   private, problem.weights_of(samples), run=run)
        )
        samples_of.append(samples)
        features_of.append(features)
    server = Server(public, samples_of, features_of, public_cipher, rng)
    return server, clients
