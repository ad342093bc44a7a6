"""HyFDCA's round, written once: its phases as data and its message order as one script.

Every engine that runs HyFDCA as separate parties -- the in-process protocol
(:func:`hyfl.runtime.protocol.run_protocol`) and the Flower coordinator
(:class:`hyfl.deploy.coordinator.Coordinator`) -- plays the same script over
its own transport, so the message order of each step rule exists here only.

The script is a generator (:func:`play_round` drives it). It runs the
server's half (:class:`~hyfl.algorithms.hyfdca_parties.Server`) and yields
what must travel:

* an :class:`Exchange`: one message to each of some parties, all sent at once;
  the transport answers with their replies (a dict per party) and the script
  goes on once every reply is in;
* a :class:`Post`: a one-way message (no reply) that the transport delivers
  before the party's next message -- in process at once, over Flower with the
  next message that carries deliveries (:attr:`Phase.delivers`).

Each message kind is a :class:`Phase` of :data:`PHASES`: its one name (in
process and on Flower), who is addressed, what travels each way (field types
of :func:`hyfl.deploy.codec.check_fields`), the client hook that answers it
(:func:`answer`: the :class:`~hyfl.algorithms.hyfdca_parties.Client` method it
calls), and what a party checks about its order (which phase it follows,
how often per attempt). The deployed party's dispatch, the coordinator's reply
checks and the party's guard all read this table.

The ``cocoa`` rule's round (:func:`cocoa_round`), message by message:

1. ``round``: the round's instructions (draws in visiting order; a returning
   party its stale duals) -> encrypted partial inner products, or from a
   returning party its primal part. When a party returns, every party waits
   for the refreshed weights (``wait``), which follow in
   ``weights`` -> the inner products.
   On horizontal data there is nothing to sum: the subproblem's *model* rides
   along with ``round`` (or ``weights``), answered with the proposals; so it
   does when the inner products came ahead with the last round's ``step``.
2. ``proposals`` (vertical and hybrid data): the summed inner products, the
   Gram matrix of the party's history directions, the subproblem's scaling ->
   encrypted proposals.
3. ``image``: the summed proposals (returning parties also the last steps of
   their samples) -> the proposal's primal image.
4. ``direction``: the momentum coefficient -> the direction's primal image and
   encrypted line-search sums.
5. ``step``: the summed line-search sums to every participant, each of which
   finds the same step and takes it -> the encrypted dual changes (the judge,
   the first active party, adds the step). The round stands once every
   participant answered; the ``commit`` (the new weights) is posted. When
   every party takes part, each also gets its features' move per unit step
   (``dw``) and sends the next round's inner products with the weights after
   the step: the next round needs no ``proposals`` message (four exchanges).
6. ``certify`` (the judge, when a checkpoint can be decided; at most twice).

The per-sample rules' round (:func:`per_sample_round`): ``round`` and
``weights`` as above, ``steps`` (summed inner products -> encrypted dual
steps), ``duals`` (new duals -> primal part and gain terms), ``verdict`` (the
safe rule: summed gain terms to the judge -> accept or not), the ``commit``
posted, and with ``refresh_inner_products`` a ``commit`` exchange that brings
back the second SecureInnerProduct.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hyfl.errors import fail

__all__ = ["COCOA", "PER_SAMPLE", "PHASES", "Exchange", "Phase", "Post", "answer",
           "cocoa_round", "one_round", "play_round", "reply_field"]

COCOA, PER_SAMPLE, BOTH = "cocoa", "per-sample", "both"


@dataclass(frozen=True)
class Phase:
    """One kind of message of a HyFDCA round.

    Parameters
    ----------
    name : str
        The message's name, the same in process and on Flower.
    rule : {"cocoa", "per-sample", "both"}
        The step rules whose round sends it.
    to : str
        Who is addressed: ``"active"`` (every participant of the attempt),
        ``"some"`` (those the server names: returning parties, reporters) or
        ``"judge"`` (one party, deciding for all).
    sends, replies : dict
        Field name -> type (of :func:`hyfl.deploy.codec.check_fields`) of the
        message and of its reply.
    client : str
        The :class:`~hyfl.algorithms.hyfdca_parties.Client` method that
        answers it (:func:`answer`).
    after : str or None
        The phase a party must have answered in the same attempt first.
    per_attempt : int
        How often a party answers it per attempt at most (0: no limit).
    query : bool
        It changes no model state (a Flower ``query`` message).
    post : bool
        One way: no reply; delivered before the party's next message.
    delivers : bool
        Posted messages travel with it (over Flower).
    stands : bool
        Sent after the round is committed: a party that does not answer is
        absent from then on, but the round stands.
    """

    name: str
    rule: str
    to: str
    sends: Mapping[str, str]
    replies: Mapping[str, str]
    client: str
    after: str | None = None
    per_attempt: int = 1
    query: bool = False
    post: bool = False
    delivers: bool = False
    stands: bool = False


#: The subproblem's model (cocoa): what ``proposals`` carries, or ``round``/``weights``
#: on horizontal data.
MODEL_FIELDS = {"z": "vector?", "z_made": "ids?", "grams": "matrix", "coef": "number",
                "towards_w": "matrix?", "span_sums": "bool?", "exact": "bool?"}

_PHASES = (
    Phase("round", BOTH, "active",
          {"deliveries": "dict?", "configure": "dict", "wait": "bool?", "model": "dict?"},
          {"inner_products": "vector?", "primal_part": "matrix?", "proposals": "vector?",
           "checkpoint_part": "matrix?"},
          "configure", per_attempt=0, delivers=True),
    Phase("weights", BOTH, "some", {"w": "matrix", "model": "dict?"},
          {"inner_products": "vector?", "proposals": "vector?"}, "receive_weights"),
    # -- the per-sample rules (safe, theory, paper) ------------------------------------
    Phase("steps", PER_SAMPLE, "active", {"z": "vector?"}, {"steps": "vector"}, "dual_steps"),
    Phase("duals", PER_SAMPLE, "active", {"duals": "vector"},
          {"primal_part": "matrix", "totals": "vector?", "changes": "vector?"}, "new_duals",
          after="steps"),
    Phase("verdict", PER_SAMPLE, "judge", {"totals": "vector", "dw_sq": "number", "active": "ids"},
          {"accepted": "bool"}, "verdict", after="duals", query=True),
    Phase("commit", PER_SAMPLE, "active", {"deliveries": "dict?", "inner_products": "bool?"},
          {"inner_products": "vector?"}, "inner_products", delivers=True, stands=True),
    # -- the cocoa rule ----------------------------------------------------------------
    Phase("proposals", COCOA, "active", MODEL_FIELDS, {"proposals": "vector"},
          "cocoa_proposals"),
    Phase("image", COCOA, "active",
          {"proposal": "vector", "previous": "vector?", "previous_contexts": "ids?"},
          {"primal_part": "matrix"}, "cocoa_image", after="proposals"),
    Phase("direction", COCOA, "active", {"mu": "floats"},
          {"primal_part": "matrix", "totals": "vector", "span_sums": "matrix?"},
          "cocoa_direction", after="image"),
    # Every active party finds the same step from the same sums and takes it at once; the
    # judge's reply also carries the step (docs/privacy.md, "One step message").
    Phase("step", COCOA, "active",
          {"totals": "vector", "dw_sq": "floats", "coherence": "floats", "updated": "int",
           "active": "ids", "leave": "bool?", "dw": "matrix?"},
          {"changes": "vector", "step": "floats?", "coherence": "floats?",
           "evaluation": "floats?", "conjugate_change": "vector?",
           "inner_products": "vector?"},
          "cocoa_step", after="direction"),
    Phase("certify", COCOA, "judge",
          {"certified": "vector", "checkpoint": "vector", "w_sq": "floats",
           "certified_made": "ids?", "checkpoint_made": "ids?"},
          {"accepted": "bool"}, "certify_verdict", after="step", per_attempt=2, query=True),
)
#: Every message kind of a round, by name.
PHASES: dict[str, Phase] = {phase.name: phase for phase in _PHASES}

#: What the server posts for a party's next message (deliveries), and their fields: the
#: round's commit (its verdict and the party's new weights), which also closes the round.
POSTS: dict[str, Phase] = {phase.name: phase for phase in (
    Phase("commit", BOTH, "active", {"round": "int", "accepted": "bool", "w": "matrix",
                                     "step": "floats?"},
          {}, "commit", post=True),
)}


@dataclass(frozen=True)
class Exchange:
    """Messages to some parties (``messages``: party -> payload), all answered."""

    phase: str
    messages: dict[int, dict]


@dataclass(frozen=True)
class Post:
    """One-way messages, delivered before each party's next message."""

    phase: str
    messages: dict[int, dict] = field(default_factory=dict)


Script = Generator[Exchange | Post, Any, bool]


def reply_field(replies: Mapping[int, dict], k: int, phase: str, name: str,
                optional: bool = False) -> Any:
    """Field ``name`` of party ``k``'s reply to ``phase``: present, and set unless
    ``optional`` (a reply is untrusted: a missing field is the party's error)."""
    reply = replies[k]
    if reply.get(name) is None and not (optional and name in reply):
        raise fail(f"party {k}'s reply to {phase!r}", f"has no field {name!r}",
                   "Run every party with the same hyfl version and job; the reply may be "
                   "garbled.")
    return reply[name]


# -- the server's half: one round as a script ----------------------------------------------
def one_round(server, active: np.ndarray, was_active: np.ndarray) -> Script:
    """The round of ``server``'s step rule (returns the verdict: did the model move)."""
    if server.public.hyfdca.rule.subproblem:
        return (yield from cocoa_round(server, active, was_active))
    return (yield from per_sample_round(server, active, was_active))


def _open(server, configure: dict[int, dict]) -> Generator[Exchange, Any, tuple[dict, str]]:
    """``round`` (and ``weights``): instructions, the returning parties' refresh, and what
    each party sends once it has the round's weights: its inner products, or, when the
    subproblem's model rides along, its proposals. Returns those and their name.

    The model rides along on horizontal data (it needs no sums), and with the cocoa
    rule when the inner products came ahead with the last round's step
    (:meth:`~hyfl.algorithms.hyfdca_parties.Server.take_ahead`).
    """
    cocoa = server.public.hyfdca.rule.subproblem
    returning = [k for k, message in configure.items() if message["stale"] is not None]
    # The cocoa rule refreshes every party's weights when one returns (Server.refresh):
    # the others wait for them before they compute their inner products.
    wait = cocoa and bool(returning)
    ahead = server.take_ahead(configure) if cocoa else None
    ride = cocoa and (server.public.horizontal or ahead is not None)

    def models() -> dict:
        if not ride:
            return {}
        return server.cocoa_inner_products(ahead if ahead is not None
                                           else dict.fromkeys(configure))

    early = {} if returning else models()
    messages = {}
    for k, instructions in configure.items():
        payload = {"configure": instructions}
        if wait and k not in returning:
            payload["wait"] = True
        if k in early:
            payload["model"] = early[k]
        messages[k] = payload
    replies = dict((yield Exchange("round", messages)))
    if returning:
        refresh = {}
        for k in returning:
            refresh[k] = {"primal_part": reply_field(replies, k, "round", "primal_part")}
            if replies[k].get("checkpoint_part") is not None:  # the certificate's image
                refresh[k]["checkpoint_part"] = replies[k]["checkpoint_part"]
        weights = server.refresh(refresh)
        late = models()  # after the refresh: the model records the refreshed w
        messages = {}
        for k, w_local in weights.items():
            messages[k] = {"w": w_local, **({"model": late[k]} if k in late else {})}
        replies.update((yield Exchange("weights", messages)))
    name = "proposals" if ride else "inner_products"
    empty = not ride and server.public.horizontal  # no inner products to send
    return {k: reply_field(replies, k, "round", name, optional=empty)
            for k in configure}, name


def per_sample_round(server, active: np.ndarray, was_active: np.ndarray) -> Script:
    """A round of the safe, theory or paper rule."""
    configure = server.configure(active, was_active)
    answers, _ = yield from _open(server, configure)
    sums = server.sum_inner_products(answers)
    replies = yield Exchange("steps", {k: {"z": sums[k]} for k in configure})
    duals = server.aggregate_duals({k: reply_field(replies, k, "steps", "steps")
                                    for k in configure})
    replies = yield Exchange("duals", {k: {"duals": duals[k]} for k in configure})
    check = server.aggregate_primal(replies)
    accepted = True
    if check is not None:
        judge, message = check
        replies = yield Exchange("verdict", {judge: message})
        accepted = bool(reply_field(replies, judge, "verdict", "accepted"))
    # Committed: from here on the round stands, whatever happens to the messages.
    yield Post("commit", {k: {"round": server.t, "accepted": accepted, "w": w_local}
                          for k, w_local in server.commit(accepted).items()})
    if server.public.hyfdca.refresh_inner_products:
        replies = yield Exchange("commit", {k: {"inner_products": True} for k in configure})
        for k in sorted(replies):  # (a party that did not answer keeps its older parts)
            server.store_inner_products(k, reply_field(replies, k, "commit", "inner_products",
                                                       optional=server.public.horizontal))
    return accepted


def cocoa_round(server, active: np.ndarray, was_active: np.ndarray) -> Script:
    """A round of the ``cocoa`` rule (the module docstring lists its messages)."""
    configure = server.configure(active, was_active)
    if not configure:  # nobody takes part
        server.cocoa_idle()
        return False
    answers, name = yield from _open(server, configure)
    if name == "proposals":  # the model rode along
        proposals = answers
    else:
        models = server.cocoa_inner_products(answers)
        replies = yield Exchange("proposals", {k: models[k] for k in configure})
        proposals = {k: reply_field(replies, k, "proposals", "proposals") for k in configure}
    sums = server.cocoa_aggregate(proposals, active & ~was_active)
    replies = yield Exchange("image", {k: sums[k] for k in configure})
    mu = server.cocoa_momentum({k: reply_field(replies, k, "image", "primal_part")
                                for k in configure})
    replies = yield Exchange("direction", {k: {"mu": mu} for k in configure})
    # Every party finds the step and takes it; the round stands once all have answered
    # with their dual changes (the server stores them).
    ahead = server.sends_ahead
    replies = yield Exchange("step", server.cocoa_totals(replies))
    judge = server.judge
    verdict = {name: reply_field(replies, judge, "step", name)
               for name in ("step", "coherence", "evaluation")}
    if server.public.hyfdca.certified:
        verdict["conjugate_change"] = reply_field(replies, judge, "step", "conjugate_change")
    commits = server.cocoa_commit(verdict)
    server.cocoa_store({k: reply_field(replies, k, "step", "changes") for k in configure})
    if ahead:  # the next round's inner products came with the step
        server.keep_ahead({k: reply_field(replies, k, "step", "inner_products")
                           for k in configure})
    # The certificate (hyfl.algorithms.hyfdca_certify): a judge decides on each checkpoint
    # whose images are all in.
    while (request := server.cocoa_certify_request()) is not None:
        judge, message = request
        replies = yield Exchange("certify", {judge: message})
        server.cocoa_certify_verdict(bool(reply_field(replies, judge, "certify", "accepted")))
    stepped = bool(np.any(np.asarray(verdict["step"]) > 0))
    yield Post("commit", {k: {"round": server.t, "accepted": stepped, "w": w_local,
                              "step": verdict["step"]} for k, w_local in commits.items()})
    return stepped


def play_round(script: Script, exchange: Callable[[Exchange], dict[int, dict]],
               post: Callable[[Post], None],
               server: Callable[..., Any] = lambda fn, *args: fn(*args)) -> tuple[bool, int]:
    """Drive ``script`` over a transport: ``exchange`` answers an :class:`Exchange`
    with every addressed party's reply, ``post`` delivers a :class:`Post`;
    ``server(fn, *args)`` runs the server's half (e.g. timing it).

    Returns the round's verdict and the number of exchanges it took.
    """
    exchanges, reply = 0, None
    while True:
        try:
            step = server(script.send, reply)
        except StopIteration as end:
            return bool(end.value), exchanges
        if isinstance(step, Post):
            if step.messages:
                post(step)
            reply = None
        else:
            if not step.messages:
                reply = {}
                continue
            exchanges += 1
            reply = exchange(step)


# -- the parties' half ---------------------------------------------------------------------
def answer(client, phase: str, payload: dict) -> dict:
    """Client ``client``'s reply to a message of ``phase`` (or a post's effect: ``{}``)."""
    return _ANSWERS[phase](client, payload)


def _with_weights(client, model: dict | None) -> dict:
    """The client has the round's weights: its inner products, or its proposals when the
    subproblem's model came along."""
    if model is None:
        return {"inner_products": client.inner_products()}
    return {"proposals": client.cocoa_proposals(model)}


def _round(client, payload: dict) -> dict:
    refresh = client.configure(payload["configure"])
    if refresh is not None:  # returning: the weights come first
        return dict(refresh)
    if payload.get("wait"):
        return {}
    return _with_weights(client, payload.get("model"))


def _weights(client, payload: dict) -> dict:
    client.receive_weights(payload["w"])
    return _with_weights(client, payload.get("model"))


def _step(client, payload: dict) -> dict:
    """Find the round's step, take it; the dual changes (the judge: and the step)."""
    verdict = client.cocoa_step(payload)
    changes = client.cocoa_commit(verdict["step"], bool(payload.get("leave")))
    judge = int(np.asarray(payload["active"])[0]) == client.k
    reply = {"changes": changes, **(verdict if judge else {})}
    if payload.get("dw") is not None:  # every party is active: the next round's sums
        reply["inner_products"] = client.inner_products_ahead(verdict["step"], payload["dw"])
    return reply


def _commit_exchange(client, payload: dict) -> dict:
    return {"inner_products": client.inner_products(True)} if payload.get("inner_products") else {}


_ANSWERS: dict[str, Callable[[Any, dict], dict]] = {
    "round": _round,
    "weights": _weights,
    "steps": lambda client, p: {"steps": client.dual_steps(p["z"])},
    "duals": lambda client, p: dict(client.new_duals(p["duals"])),
    "verdict": lambda client, p: {"accepted": bool(client.verdict(p))},
    "commit": _commit_exchange,
    "proposals": lambda client, p: {"proposals": client.cocoa_proposals(p)},
    "image": lambda client, p: {"primal_part": client.cocoa_image(p)},
    "direction": lambda client, p: dict(client.cocoa_direction(p["mu"])),
    "step": _step,
    "certify": lambda client, p: dict(client.certify_verdict(p)),
}


def deliver(client, phase: str, payload: dict) -> None:
    """Apply a post (:data:`POSTS`) to ``client``: the round's commit."""
    if client.public.hyfdca.rule.subproblem:  # the step is taken: the new weights
        client.confirm_step(payload.get("step"))
        client.receive_weights(payload["w"])
    else:
        client.commit(bool(payload["accepted"]), payload["w"])
