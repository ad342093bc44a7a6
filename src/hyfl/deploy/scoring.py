"""``hyfl deploy predict``: the parties score new rows without pooling them.

Every party brings its own file of new rows (CSV or Parquet with the id column and
its feature columns; labels optional), as for training with party files. The
server runs the alignment of :mod:`hyfl.deploy.party_files` unchanged (``hello``,
``align``, ``labels``: blinded ids, authenticated numbering, pairwise channel
keys) with the model's task and classes, then, instead of ``block``, two
messages:

``score`` (to every party)
    The asking party's samples (their global numbers, in the asker's positions)
    and the model's weights of the party's own columns (the server holds the model,
    as after training); the asker also gets the intercept and the labels' names.
    Each party computes its part of every requested margin -- its cells of the
    sample times its block of the weights, 0 for samples it does not hold -- and
    masks it with every peer's pairwise mask (:func:`hyfl.privacy.secure_scaling.
    cell_masks`, keyed by the pair's channel key and the run's identity, one mask per
    sample and output): the masks cancel only in the sum of all parties' parts. A
    party other than the asker seals its masked part for the asker
    (:func:`hyfl.privacy.alignment.seal`, bound to the run, the pair, the
    requested samples and, row by row, the pair's pairing of ``labels``: both sides'
    blinded ids, the doubly blinded id and each side's own number of its row) and
    sends it; the asker keeps its own.
``scores`` (to the asker)
    The peers' sealed parts, relayed. The asker opens each with its pair's key,
    adds them to its own, adds the intercept and writes one row per sample it
    holds: its own id, the prediction (the label's own value), the score and for a
    logistic model the class probabilities (``predictions.csv`` in its node
    config's ``out`` folder).

What each learns: the server what it learns in the alignment, and sealed
blobs (no score, no part, no id) -- with a key only: with cipher none nothing of
the alignment is authenticated, and a server that substitutes its own channel
keys opens every part (docs/privacy.md); a party other than the asker that the asker
holds some of its samples (it knows so from ``labels`` already) and its own
part; the asker the margins of its rows and nothing of a peer's part (each is
masked with keys the asker does not hold). The server chooses the weights (it
holds the model): a server that shares the asker's view could ask for unit
weights and read a peer's column, as a model owner could in any vertical
inference; the parties do not check the weights against the training's. A
lower-numbered asker that claims a peer's column in its own file makes the peer
leave that column out of its part on their shared rows (the first holder's cells
count) and is sent its weight: the difference to an honest run's margins is the
peer's column (tests/test_review_scoring.py, open).

The party checks the ``score`` message against the alignment: the asker's
samples must be exactly its own rows' numbers; another party's rows among the
requested samples must be exactly the ones it shares with the asker (the
server cannot make a party score rows the asker does not hold); a peer's rows
numbered otherwise than the asker's rows of the same samples (scoring has no
``block`` or ``setup``, where training checks the numbering) make its part not
open at the asker; the weights' outputs must be the task's (1, or one per class, as
``align`` fixed them). One ``score`` per alignment (two weightings under the same
masks would show the asker each peer's difference). The scores
equal ``hyfl predict`` on the pooled rows to the fixed point's resolution
(``2**-40``); tests/test_predict_rows.py.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np

from hyfl._private_files import private_folder
from hyfl.errors import fail

__all__ = ["SCORE_FIELDS", "SCORE_KINDS", "on_score", "on_scores", "run_scoring",
           "score_deployed"]

#: The scoring messages after the alignment's ``labels`` (instead of ``block``).
SCORE_KINDS = ("score", "scores")
#: The fields a party reads of them (types of :func:`hyfl.deploy.codec.check_fields`).
SCORE_FIELDS = {"score": {"asker": "int", "samples": "ids", "weights": "matrix",
                          "intercept": "floats?", "labels": "list?"},
                "scores": {"sealed": "dict"}}
#: The fields the server reads of the replies.
SCORE_REPLY_FIELDS = {"score": {"sealed": "dict?"}, "scores": {"rows": "int"}}
#: A reply's metadata besides its payload (as the coordinator reads it).
_META_FIELDS = {"seconds": "number?", "ops": "counts?", "delivery_ops": "counts?",
                "timing": "numbers?"}
#: Fixed-point resolution of the masked parts: ``2**-40`` (about 1e-12) per margin.
FRACTION_BITS = 40
_LIMIT = 2.0 ** (62 - FRACTION_BITS)
_MASK_SALT = b"hyfl deploy predict: margin masks v1"
_SEAL_INFO = b"hyfl deploy predict: margin parts v1"
_FORGED = ("The server does not follow hyfl's protocol; the party answers no more messages of "
           "this run.")
_SAME_VERSION = "Run every party with the same hyfl version; the reply may be garbled or forged."


# -- a party's side ------------------------------------------------------------------------
def on_score(state: dict, payload: dict, party: int, out: str) -> dict:
    """The party's masked part of the asker's margins; sealed for the asker unless it is
    the asker (who keeps it for :func:`on_scores`)."""
    from hyfl.privacy.alignment import seal

    K = len(state["publics"])
    asker = int(payload["asker"])
    if not 0 <= asker < K:
        raise fail("the server's 'score' message field asker", f"is {asker}, not a party "
                   f"0..{K - 1}", _FORGED)
    if asker == party and not out:
        raise fail(f"party {party}", "is asked for the scores but its node config has no out "
                   "folder to write them to", "Set node config out='<folder>' for the asking "
                   "party (hyfl deploy predict does).")
    requested = np.asarray(payload["samples"], dtype=np.int64)
    own = np.asarray(state["samples"], dtype=np.int64)  # global number of each position
    _check_requested(state, requested, own, party, asker)
    values = np.asarray(state["values"], dtype=np.float64)  # by file row
    order = np.asarray(state["order"], dtype=np.int64)  # position -> file row
    weights = np.asarray(payload["weights"], dtype=np.float64)
    if weights.ndim != 2 or weights.shape[0] != values.shape[1] or weights.shape[1] < 1 \
            or not np.all(np.isfinite(weights)):
        raise fail("the server's 'score' message field weights", f"is of shape "
                   f"{weights.shape}, not this party's {values.shape[1]} columns by the "
                   "model's outputs (finite)", _FORGED)
    n_outputs = weights.shape[1]
    expected = 1 if state["task"] in ("regression", "binary") else len(state["classes"])
    if n_outputs != expected:  # (the task and classes checked at align)
        raise fail("the server's 'score' message field weights", f"has {n_outputs} outputs, "
                   f"the {state['task']} task of the alignment {expected}", _FORGED)
    part = np.zeros((requested.size, n_outputs))
    by_sample = np.argsort(own)
    at = np.searchsorted(own[by_sample], requested)
    held = (at < own.size) & (own[by_sample][np.minimum(at, own.size - 1)] == requested)
    rows = order[by_sample[at[held]]]
    part[held] = values[rows] @ weights
    masked = _masked(part, state, party, requested)
    state["scoring"] = {"asker": asker, "requested": requested, "n_outputs": n_outputs}
    if asker == party:
        intercept = np.asarray(payload.get("intercept") if payload.get("intercept") is not None
                               else np.zeros(n_outputs), dtype=np.float64)
        labels = [str(v) for v in (payload.get("labels") or [])]
        if intercept.shape != (n_outputs,) or (state["task"] != "regression"
                                               and len(labels) != max(n_outputs, 2)):
            raise fail("the server's 'score' message fields intercept and labels", "do not "
                       f"fit the model's {n_outputs} outputs", _FORGED)
        state["scoring"].update(masked=masked, intercept=intercept, labels=labels)
        return {}
    sealed = seal(_pair_key(state, party, asker), masked.view("<f8"),
                  _seal_context(state, party, asker, requested, n_outputs, party))
    return {"sealed": {str(asker): sealed}}


def on_scores(state: dict, payload: dict, party: int, out: str, loss: str) -> dict:
    """The asker: open the peers' parts, add them up and write its rows' predictions."""
    from hyfl.predict import labels_of_scores, score_columns, write_predictions
    from hyfl.privacy.alignment import unseal

    scoring = state.get("scoring") or {}
    if scoring.get("asker") != party:
        raise fail(f"party {party}", "got the peers' parts of scores it did not ask for",
                   _FORGED)
    K = len(state["publics"])
    requested, n_outputs = scoring["requested"], int(scoring["n_outputs"])
    sealed = payload["sealed"]
    peers = {str(j) for j in range(K) if j != party}
    if set(sealed) != peers:
        raise fail("the server's 'scores' message field sealed", f"holds the parts of "
                   f"{sorted(sealed)}, not of every peer {sorted(peers)}", _FORGED)
    total = np.asarray(scoring["masked"], dtype=np.uint64).copy()
    for j in range(K):
        if j == party:
            continue
        what = f"the part of the scores party {j} sealed for party {party}"
        opened = unseal(_pair_key(state, party, j), np.asarray(sealed[str(j)], dtype=np.uint8),
                        _seal_context(state, j, party, requested, n_outputs, party),
                        what)
        if opened.size != total.size:
            raise fail(what, f"has {opened.size} values for {total.size}", _SAME_VERSION)
        total = total + opened.view(np.uint64).reshape(total.shape)  # modulo 2**64
    decisions = _decode(total) + np.asarray(scoring["intercept"], dtype=np.float64)
    decisions = decisions[:, 0] if n_outputs == 1 else decisions
    # Positions -> file rows: the rows go out in the file's order, under their own ids.
    order = np.asarray(state["order"], dtype=np.int64)
    by_row = np.argsort(order)
    decisions = decisions[by_row]
    ids = [state["ids"][row] for row in order[by_row]]
    task, names = state["task"], scoring["labels"]
    predicted = labels_of_scores(decisions, task, names)
    columns, values = score_columns(decisions, names, loss == "logistic" and task != "regression")
    path = Path(out) / "predictions.csv"
    private_folder(path.parent)  # the asker's scores are its own: mode 0700
    write_predictions(path, predicted, columns, values, regression=task == "regression", ids=ids)
    state["scoring"] = {"asker": party, "written": str(path)}
    return {"rows": len(ids)}


def _check_requested(state: dict, requested: np.ndarray, own: np.ndarray, party: int,
                     asker: int) -> None:
    """The asker's samples are its own rows' numbers; another party's rows among them are
    exactly the ones it shares with the asker (as the checked join of ``labels`` fixed)."""
    culprit = "the server's 'score' message field samples"
    if np.unique(requested).size != requested.size or (
            requested.size and (requested.min() < 0 or requested.max() >= state["n_samples"])):
        raise fail(culprit, "names a sample twice or one beyond the alignment's", _FORGED)
    if party == asker:
        if not np.array_equal(requested, own):
            raise fail(culprit, "are not this party's own rows as the alignment numbered them",
                       _FORGED)
        return
    sizes = np.asarray(state["peer_counts"], dtype=np.int64)
    if requested.size != sizes[asker]:
        raise fail(culprit, f"name {requested.size} samples, party {asker} holds "
                   f"{int(sizes[asker])}", _FORGED)
    counts = np.asarray(state["shared"]["counts"], dtype=np.int64)
    positions = np.split(np.asarray(state["shared"]["positions"], dtype=np.int64),
                         np.cumsum(counts)[:-1])[asker]
    if not np.array_equal(np.intersect1d(requested, own), np.sort(own[positions])):
        raise fail(culprit, f"ask this party for other rows than the ones it shares with "
                   f"party {asker}", _FORGED)


def _masked(part: np.ndarray, state: dict, party: int, requested: np.ndarray) -> np.ndarray:
    """The part in fixed point, plus the masks of every pair ``party < j``, minus those of
    every pair ``j < party`` (modulo 2**64): they cancel in the sum over all parties."""
    from hyfl.privacy.secure_scaling import cell_masks

    if not np.all(np.abs(part) < _LIMIT):
        raise fail(f"party {party}'s part of the scores", f"exceeds the masked sum's range "
                   f"(|margin| < 2**{62 - FRACTION_BITS})", "Check the model's weights and the "
                   "party's features (their units): such margins are no meaningful scores.")
    message = np.round(part * 2.0**FRACTION_BITS).astype(np.int64).view(np.uint64)
    salt = hashlib.sha256(_MASK_SALT + bytes(state["run"])).digest()
    for j in range(len(state["publics"])):
        if j == party:
            continue
        masks = cell_masks(_pair_key(state, party, j), salt, requested,
                           moments=part.shape[1]).T
        message = message + masks if party < j else message - masks
    return message


def _decode(total: np.ndarray) -> np.ndarray:
    return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) \
        / 2.0**FRACTION_BITS


def _seal_context(state: dict, sender: int, receiver: int, requested: np.ndarray,
                  n_outputs: int, party: int) -> bytes:
    """A sealed part's associated data, as ``party`` (the sender or the receiver) computes
    it: the run, the pair (in its direction), the requested samples, the number of outputs
    and the pair's row-by-row pairing of the labels' seals
    (:func:`hyfl.deploy.party_files.labels_context`: both sides' blinded ids of every row
    they share, the doubly blinded id and each side's own number of its row). A part moved
    to another run, pair or request does not open, nor one of a peer whose rows the server
    numbered otherwise than the asker's rows of the same samples (scoring has no ``block``
    or ``setup``, where training checks the numbering: tests/test_review_scoring.py)."""
    from hyfl.deploy.party_files import labels_context

    peer = receiver if party == sender else sender
    h = hashlib.sha256(_SEAL_INFO)
    h.update(bytes(state["run"]))
    h.update(np.array([sender, receiver, n_outputs], dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(requested, dtype="<i8").tobytes())
    h.update(labels_context(state, party, peer, sender=party == sender))
    return h.digest()


def _pair_key(state: dict, party: int, peer: int) -> bytes:
    from hyfl.deploy.party_files import pair_key

    return pair_key(state, party, peer)


# -- the server's side ---------------------------------------------------------------------
def score_deployed(model, config, transport, *, asker: int = 0, log=None) -> dict:
    """Run a scoring job: align the parties' files, have them score the asker's rows.

    Parameters
    ----------
    model : hyfl.model_file.Model
        A linear model trained on the parties' columns (its ``feature_names``).
    config : DeployConfig
        The job (its ``loss`` the model's, its ``cipher`` the parties').
    transport
        The coordinator's transport (``connect``, ``exchange``:
        :class:`hyfl.deploy.coordinator.Transport`).
    asker : int
        The party that gets the scores of the rows it holds.

    Returns
    -------
    dict
        ``rows`` (the asker's), ``n_samples``, ``alignment`` (the alignment's record).
    """
    from hyfl.deploy.codec import check_fields
    from hyfl.deploy.coordinator import REPLY_FIELDS
    from hyfl.deploy.keys import cipher_fingerprint
    from hyfl.deploy.party_files import align_parties
    from hyfl.predict import column_mismatch, label_text, output_names

    log = log or (lambda line: print(line, flush=True))
    K = int(config.parties)
    if not 0 <= asker < K:
        raise fail("the asking party", f"is {asker}, not one of the parties 0..{K - 1}",
                   "Name one of the parties (--asker K).")
    trained = model.provenance.get("feature_names")
    if not trained:
        raise fail("the model", "does not name its feature columns (it was not trained on "
                   "party files)", "Score with a model trained on party files (hyfl run or "
                   "hyfl deploy local --data parties:...).")
    trained = [str(c) for c in trained]
    tic = time.perf_counter()

    def exchange(messages: dict[int, tuple[str, dict]]) -> dict[int, dict]:
        replies, missing = transport.exchange(messages, config.reply_timeout)
        if missing:
            kind = next(iter(messages.values()))[0]
            raise fail(f"part{'ies' if len(missing) > 1 else 'y'} "
                       f"{', '.join(map(str, sorted(missing)))}", f"did not answer the "
                       f"{kind!r} message within {config.reply_timeout:g} s", "Every party "
                       "takes part in scoring; check its log and start again.")
        out = {}
        for k, reply in replies.items():
            kind = messages[k][0]
            fields = SCORE_REPLY_FIELDS.get(kind) or REPLY_FIELDS[kind]
            check_fields(reply, {**fields, **_META_FIELDS}, f"party {k}'s reply to {kind!r}")
            out[k] = {key: value for key, value in reply.items() if key not in _META_FIELDS}
        return out

    own = cipher_fingerprint(transport.cipher) if getattr(transport, "cipher", None) else None
    hellos = transport.connect(K, config.connect_timeout,
                               {"cipher": config.cipher, "fingerprint": own})
    if sorted(hellos) != list(range(K)):
        raise fail(f"the {K} parties' hellos", f"came from parties {sorted(hellos)}",
                   f"Number the parties 0 to {K - 1} (node config party=K).")
    for k, hello in hellos.items():
        if not (isinstance(hello, dict) and hello.get("align") is not None):
            raise fail(f"party {k}", "brings no party file (a block file or a dataset)",
                       "Score with every party's own file of rows (node config "
                       "data='....csv').")
        check_fields(hello, {**REPLY_FIELDS["hello (party file)"], **_META_FIELDS},
                     f"party {k}'s hello")
        if hello["cipher"] != config.cipher:
            raise fail(f"party {k}", f"runs cipher {hello['cipher']!r} (its node config), but "
                       f"the job asks for {config.cipher!r}", f"Score with cipher "
                       f"{hello['cipher']!r}; a party's cipher is its own policy.")
        if hello["party"] != k:
            raise fail(f"party {k}", f"says in its hello that it is party {hello['party']}",
                       "Run every party with the same hyfl version.")
    columns = [[str(c) for c in hellos[k]["align"]["columns"]] for k in range(K)]
    present = list(dict.fromkeys(c for names in columns for c in names))
    if sorted(present) != sorted(trained):
        raise column_mismatch(model, trained, present, "the parties' files")
    names = [label_text(v) for v in output_names(model)]
    job = ("regression", []) if model.task == "regression" else \
        (model.task, _sorted_classes(model))
    W = np.asarray(model.weights, dtype=np.float64)
    position = {name: m for m, name in enumerate(trained)}
    record: dict[str, Any] = {}

    def final(aligned: dict) -> dict[int, dict]:
        order = [position[name] for name in aligned["feature_names"]]  # global -> model row
        weights = W[order]
        index = aligned["index"]
        requested = np.asarray(index[asker], dtype=np.int64)
        messages = {}
        for k in range(K):
            payload = {"asker": asker, "samples": requested,
                       "weights": weights[np.asarray(aligned["features"][k], dtype=np.int64)]}
            if k == asker:
                payload.update(intercept=np.asarray(model.intercept, dtype=np.float64),
                               labels=names)
            messages[k] = ("score", payload)
        replies = exchange(messages)
        parts = {}
        for k in range(K):
            if k == asker:
                continue
            sealed = (replies[k].get("sealed") or {}).get(str(asker))
            if not (isinstance(sealed, np.ndarray) and sealed.dtype == np.uint8):
                raise fail(f"party {k}'s reply to 'score'", f"has no part sealed for party "
                           f"{asker}", _SAME_VERSION)
            parts[str(k)] = sealed
        done = exchange({asker: ("scores", {"sealed": parts})})
        record["rows"] = int(done[asker]["rows"])
        return {}

    _, alignment = align_parties(hellos, exchange, config, log, job=job, final=final)
    seconds = time.perf_counter() - tic
    log(f"party {asker} scored its {record['rows']:,} rows ({alignment['n_samples']:,} "
        f"samples aligned) in {seconds:.1f} s")
    return {"asker": asker, "rows": record["rows"], "n_samples": alignment["n_samples"],
            "alignment": alignment, "seconds": seconds}


def _sorted_classes(model) -> list:
    """The model's classes as the alignment names them: the original labels, sorted (the
    parties check their own labels are among them)."""
    labels = list(output_names(model)) if model.task != "regression" else []
    text = any(isinstance(v, str) for v in labels)
    return sorted(str(v) for v in labels) if text else sorted(float(v) for v in labels)


def output_names(model):
    from hyfl.predict import output_names as names

    return names(model)


def run_scoring(config, transport) -> dict:
    """The ServerApp's scoring job (run config ``model``): :func:`score_deployed` with the
    model file ``config.model`` for the party ``config.asker``; ``deploy.json`` in
    ``config.out`` records it (``status``, ``error``, the alignment, the asker's rows)."""
    from hyfl._private_files import private_folder, write_private_json
    from hyfl.errors import clause
    from hyfl.model_file import load_model

    def write(record: dict) -> None:
        if config.out:
            folder = private_folder(config.out)
            write_private_json(folder / "deploy.json", record, indent=1)

    base = {"engine": "flower", "job": "predict", "rounds": [], "model": config.model}
    write({**base, "status": "running", "error": None})
    try:
        record = score_deployed(load_model(config.model), config, transport,
                                asker=config.asker)
    except Exception as err:
        write({**base, "status": "failed", "error": clause(err)})
        raise
    write({**base, "status": "completed", "error": None,
           **{key: value for key, value in record.items() if key != "alignment"},
           "alignment": {key: value for key, value in record["alignment"].items()
                         if key != "classes"} | {"classes": [str(c) for c in
                                                             record["alignment"]["classes"]]}})
    return record
