"""Checkpoints of the stacked engine: what is written, how it is checked, when, and resume.

With ``checkpointing=Checkpointing(PATH)`` :func:`hyfl.runtime.simulation.simulate`
writes, atomically (temp file, then ``os.replace``), everything needed to
continue: the round number, the algorithm's state, both generators'
bit-generator states, the participation schedule's state (hyfl's schedules
keep none; a schedule with ``checkpoint_state()`` / ``restore_state(s)`` is
saved and restored), the metrics so far, the cumulative cost totals and round
times (:class:`RunProgress`). The problem, the stacked blocks and the sparse
matrices an algorithm builds at set-up are not written: they are stored as
tokens, which are re-attached on load to a fresh ``algorithm.setup`` of the
freshly prepared run. A fingerprint (:func:`run_fingerprint`: data shape,
non-zeros and hash, partition, algorithm, seed, ``eval_every``, cipher, cost
model, participation, and the caller's ``run_key``) guards against resuming
from another run's checkpoint. ``Checkpointing(PATH, resume=True)`` continues
from it; the result is bit-for-bit that of an uninterrupted run in every column
except :data:`hyfl.runtime.simulation.WALL_TIME_COLUMNS`. Because the budget
(and ``stop_when``) is not part of the fingerprint, a finished run (whose last
state is always saved) can be extended to a larger budget.

When: every ``every`` rounds, or else whenever ``seconds`` of wall time have
passed since the last checkpoint, and always after the last round.

The file is an ``.npz`` read without pickle (:class:`_StateCodec`): loading a
checkpoint someone left in a results folder cannot run code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl._io import read_header, read_npz
from hyfl.algorithms.base import Algorithm
from hyfl.costs import CostModel
from hyfl.errors import HyflError, check_int, fail, is_finite
from hyfl.partition import StackedBlocks
from hyfl.problem import Problem
from hyfl.runtime.budget import Budget

__all__ = [
    "CHECKPOINT_FORMAT",
    "DEFAULT_CHECKPOINT_SECONDS",
    "STATIC_ARRAY_BYTES",
    "Checkpointing",
    "Checkpoints",
    "RunProgress",
    "run_fingerprint",
]

# Raised whenever an algorithm's saved state changes shape (3: the cocoa rule's sample
# groups keep their own coordinates), so that an older checkpoint is refused with a
# clear message instead of resuming into the wrong state.
CHECKPOINT_FORMAT = 3
DEFAULT_CHECKPOINT_SECONDS = 60.0


@dataclass(frozen=True)
class Checkpointing:
    """Where and when :func:`~hyfl.runtime.simulation.simulate` writes checkpoints.

    Parameters
    ----------
    path : path
        The checkpoint file (see the module docstring).
    resume : bool, default False
        Continue from ``path`` if that file exists (else start afresh). The
        checkpoint must come from the same run (same data, partition, algorithm
        and hyperparameters, seed, ``eval_every``, cipher, cost model,
        participation and ``run_key``); only the budget may differ. Without
        ``resume`` an existing checkpoint file is replaced.
    every : int, optional
        Write a checkpoint every this many rounds. Default: whenever
        ``seconds`` of wall time have passed since the last one. A checkpoint
        is always written after the last round, so a finished run can be
        extended to a larger budget.
    seconds : float, default 60
    """

    path: Path
    resume: bool = False
    every: int | None = None
    seconds: float = DEFAULT_CHECKPOINT_SECONDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if self.every is not None:
            object.__setattr__(self, "every", check_int("checkpoint_every", self.every,
                                                        minimum=1))
        object.__setattr__(self, "seconds", float(self.seconds))


@dataclass
class RunProgress:
    """The loop's counters: what a checkpoint holds besides the state and the generators."""

    totals: dict[str, float]
    t: int = 0
    trips: float = 0.0
    seconds: float = 0.0
    sim_time_before: float = 0.0  # cumulative sim_time before the last round
    metrics: list[dict[str, float]] = field(default_factory=list)
    round_times: list[float] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    stopped_by: str | None = None
    stop_reason: str | None = None  # stop_when's reason, when it ended the run
    best: dict | None = None  # the best certified pair so far (see Evaluator, keep_best)
    best_before: dict | None = None  # and as it was before the last evaluation


class Checkpoints:
    """One run's checkpoints: when to write them (every N rounds or every so many
    seconds, and at the end), and resuming from one.

    ``setup_state`` is the state as ``algorithm.setup`` returned it, before any round;
    ``rngs`` the run's generators by name.
    """

    def __init__(self, checkpointing: Checkpointing, fingerprint: dict, setup_state: Any,
                 problem: Problem, blocks: StackedBlocks, rngs: dict, participation):
        self.store = _Checkpointer(checkpointing.path, fingerprint, setup_state, problem,
                                   blocks)
        self.every, self.seconds = checkpointing.every, checkpointing.seconds
        self.resume = checkpointing.resume
        self.rngs, self.participation = rngs, participation
        self.last_saved = time.monotonic()

    @property
    def path(self) -> Path:
        return self.store.path

    def start(self, state, run: RunProgress):
        """Load the checkpoint into ``run`` if resuming from one (returning its state), or
        remove a stale one; return the state to continue from."""
        if self.resume and self.store.path.exists():
            state = self.store.load(run, self.rngs, self.participation)
        elif self.store.path.exists():
            self.store.path.unlink()
        self.last_saved = time.monotonic()
        return state

    def maybe_save(self, state, run: RunProgress) -> None:
        due = (
            run.t % self.every == 0
            if self.every is not None
            else time.monotonic() - self.last_saved >= self.seconds
        )
        if due:
            self.store.save(state, run, self.rngs, self.participation)
            self.last_saved = time.monotonic()

    def finish(self, state, run: RunProgress) -> None:
        if self.store.saved_at != run.t:
            self.store.save(state, run, self.rngs, self.participation)

    def resumed(self, run: RunProgress, budget: Budget) -> bool:
        """After loading a checkpoint: whether the budget is already used up.

        Raises if the checkpoint is past the budget; otherwise, when rounds remain,
        drops the final row the earlier run evaluated only because it ended there,
        so that the rows are those of an uninterrupted run. A run that ``stop_when``
        ended at a round an uninterrupted run evaluates too stays ended.
        """
        path, iterations, stop_sim_time = self.path, budget.iterations, budget.sim_time
        if run.t > iterations:
            raise fail(
                f"checkpoint {path}",
                f"is at round {run.t}, past the budget of {iterations} iterations",
                "Raise the budget to at least that, or delete the checkpoint to start over.",
            )
        crossed = budget.crossed(run.totals["sim_time"])
        if crossed and run.sim_time_before > stop_sim_time:
            raise fail(
                f"checkpoint {path}",
                f"is at simulated time {run.totals['sim_time']:.6g} s, past the budget of "
                f"{stop_sim_time:g} s already before its last round",
                "Raise the sim_time budget, or delete the checkpoint to start over.",
            )
        last = run.metrics[-1]
        # The row an uninterrupted run under this budget evaluates at this round, if any.
        evaluated = int(last["iteration"]) == run.t and budget.evaluates(run.t, crossed)
        run.stopped_by, run.stop_reason = budget.stopped_by(
            run.t, crossed, last if evaluated else None)
        if run.stopped_by is not None:
            return True
        if int(last["iteration"]) == run.t and run.t % budget.eval_every != 0:
            run.metrics.pop()
            if "model_round" in last:  # that evaluation's model is not kept either
                run.best = run.best_before
        return False


def run_fingerprint(
    problem: Problem,
    blocks: StackedBlocks,
    algorithm: Algorithm,
    *,
    seed: int,
    eval_every: int,
    cipher,
    cost_model: CostModel,
    participation,
    run_key: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What identifies a run for its checkpoints (JSON-ready; the budget is not part of it)."""
    X = problem.X
    return _jsonable(
        {
            "problem": {
                "shape": list(X.shape),
                "nnz": int(X.nnz),
                "outputs": int(problem.n_outputs),
                "loss": getattr(problem.loss, "name", str(problem.loss)),
                "lam": float(problem.lam),
                "hash": _hash_arrays(X.indptr, X.indices, X.data, problem.Y,
                                     *(() if problem.W is None else (problem.W,))),
            },
            "partition": {
                "clients": int(blocks.n_clients),
                "rows": int(blocks.X.shape[0]),
                "nnz": int(blocks.X.nnz),
                "hash": _hash_arrays(
                    blocks.client_rowptr, blocks.row_sample, blocks.X.indptr, blocks.X.indices
                ),
            },
            "algorithm": algorithm.config(),
            "seed": int(seed),
            "eval_every": int(eval_every),
            "cipher": cipher.describe(),
            "costs": cost_model.describe(),
            "participation": _describe_schedule(participation),
            "run": run_key,
        }
    )


def _hash_arrays(*arrays: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _describe_schedule(participation) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(participation).__name__}
    if dataclasses.is_dataclass(participation):
        for f in dataclasses.fields(participation):
            value = getattr(participation, f.name)
            out[f.name] = _hash_arrays(value) if isinstance(value, np.ndarray) else value
    else:
        out["repr"] = repr(participation)
    return out


def _jsonable(obj: Any) -> Any:
    """Round-trip through JSON (numbers, strings, lists, dicts), for stable comparisons."""
    return json.loads(json.dumps(obj, sort_keys=True, default=_json_fallback))


def _json_fallback(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


STATIC_ARRAY_BYTES = 1 << 16
"""Arrays of a state at least this large that still hold their set-up values are not written
into checkpoints (e.g. FedAvg's entry index of every non-zero): a token stands for them."""


def _static_objects(state: Any, problem: Problem, blocks: StackedBlocks) -> dict[tuple, Any]:
    """Set-up data reachable from a freshly set-up ``state``, by path.

    The problem, the stacked blocks and every sparse matrix the state holds
    (algorithms build those at set-up from the data and never change them)
    are written into checkpoints as their path and taken, when loading, from a
    fresh ``algorithm.setup`` of the prepared run. Large arrays are candidates
    too, but are written as tokens only while their content (hash) is still
    that of set-up.
    """
    found: dict[tuple, Any] = {("problem",): problem, ("blocks",): blocks}
    seen = {id(problem), id(blocks)}

    def walk(obj: Any, path: tuple, depth: int) -> None:
        if depth > 8 or isinstance(obj, (str, bytes, int, float, bool, np.generic)):
            return
        if id(obj) in seen:
            return
        if isinstance(obj, np.ndarray):
            if obj.nbytes >= STATIC_ARRAY_BYTES and obj.dtype != object:
                seen.add(id(obj))
                found[path] = obj
            return
        if isinstance(obj, (Problem, StackedBlocks)) or sp.issparse(obj):
            seen.add(id(obj))
            found[path] = obj
            return
        if isinstance(obj, dict):
            seen.add(id(obj))
            for key, value in obj.items():
                walk(value, (*path, f"[{key!r}]"), depth + 1)
        elif isinstance(obj, (list, tuple)):
            seen.add(id(obj))
            for i, value in enumerate(obj):
                walk(value, (*path, f"[{i}]"), depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            seen.add(id(obj))
            for name, value in vars(obj).items():
                walk(value, (*path, f".{name}"), depth + 1)

    walk(state, ("state",), 0)
    return found


class _StateCodec:
    """Algorithm state <-> numeric arrays plus a JSON description; nothing in it runs code.

    Checkpoints live in results folders that users copy and share, so loading one must
    not be able to execute anything (pickle would). The description names, for each
    object of the state, its class as ``module:qualname``; a class is rebuilt only if it
    is defined in the ``hyfl`` package, with ``object.__new__`` and its attributes set
    one by one (no ``__init__``, ``__reduce__`` or ``__setstate__``). Arrays are stored
    as numeric or bool arrays of an ``.npz`` read with ``allow_pickle=False``. Set-up
    data (see :func:`_static_objects`) are written as their path, and large arrays as
    their path and hash while their content is still that of set-up.
    """

    def __init__(self, objects: dict[tuple, Any], hashes: dict[int, str]):
        self.objects = objects
        self.tokens = {id(obj): path for path, obj in objects.items()}
        self.hashes = hashes
        self.used: set[str] = set()  # arrays decoded so far (each may be referenced once)

    # -- writing -------------------------------------------------------------------
    def encode(self, value: Any, arrays: dict[str, np.ndarray]) -> Any:
        path = self.tokens.get(id(value))
        if path is not None:
            if not isinstance(value, np.ndarray):
                return {"ref": list(path)}
            digest = _hash_arrays(value)
            if digest == self.hashes[id(value)]:
                return {"ref": list(path), "hash": digest}
        if isinstance(value, (np.generic, np.ndarray)):  # first: np.float64 is a float
            array = np.asarray(value)
            if array.dtype.kind not in "biufc":
                raise fail("checkpoint", f"cannot hold an array of dtype {array.dtype}",
                           "Keep algorithm state numeric (or leave checkpoint unset).")
            name = f"a{len(arrays)}"
            arrays[name] = array
            return {"a": name, "scalar": isinstance(value, np.generic)}
        if value is None or isinstance(value, (bool, str, int)):
            return {"v": value}
        if isinstance(value, float):
            return {"v": value} if np.isfinite(value) else {"float": repr(value)}
        if sp.issparse(value):
            csr = value.tocsr()
            return {"csr": [self.encode(x, arrays) for x in (csr.data, csr.indices, csr.indptr)],
                    "shape": list(csr.shape)}
        if isinstance(value, dict):
            return {"d": [[self.encode(k, arrays), self.encode(v, arrays)]
                          for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return {"t" if isinstance(value, tuple) else "l":
                    [self.encode(item, arrays) for item in value]}
        cls = type(value)
        if cls.__module__.startswith("hyfl.") and hasattr(value, "__dict__"):
            return {"o": f"{cls.__module__}:{cls.__qualname__}",
                    "f": {k: self.encode(v, arrays) for k, v in vars(value).items()}}
        raise fail("checkpoint", f"cannot hold a {cls.__module__}.{cls.__qualname__}",
                   "Algorithm state must be hyfl objects, arrays, numbers, strings, "
                   "lists, tuples and dicts.")

    # -- reading -------------------------------------------------------------------
    def decode(self, spec: Any, arrays: dict[str, np.ndarray]) -> Any:
        if not isinstance(spec, dict):
            raise ValueError("a malformed entry")
        if "ref" in spec:
            path = tuple(spec["ref"])
            obj = self.objects.get(path)
            if obj is None or ("hash" in spec and _hash_arrays(obj) != spec["hash"]):
                raise ValueError(f"the set-up data at {path!r} differ from this run's "
                                 "(set-up is not reproducible?)")
            return obj
        if "v" in spec:
            return spec["v"]
        if "float" in spec:
            return float(spec["float"])
        if "a" in spec:
            name = spec["a"]
            if not isinstance(name, str) or name in self.used:  # would copy it again
                raise ValueError(f"array {name!r} is referenced twice (each is stored once)")
            self.used.add(name)
            array = arrays[name]
            return array[()] if spec.get("scalar") else np.array(array)
        if "csr" in spec:
            data, indices, indptr = (self.decode(x, arrays) for x in spec["csr"])
            return sp.csr_matrix((data, indices, indptr), shape=tuple(spec["shape"]))
        if "d" in spec:
            return {_hashable(self.decode(k, arrays)): self.decode(v, arrays)
                    for k, v in spec["d"]}
        if "l" in spec:
            return [self.decode(item, arrays) for item in spec["l"]]
        if "t" in spec:
            return tuple(self.decode(item, arrays) for item in spec["t"])
        if "o" in spec:
            obj = object.__new__(_state_class(spec["o"]))
            for name, item in spec["f"].items():
                object.__setattr__(obj, name, self.decode(item, arrays))
            return obj
        raise ValueError("a malformed entry")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _state_class(name: str) -> type:
    """The hyfl class ``module:qualname`` names; anything outside hyfl is refused."""
    import importlib

    module_name, _, qualname = str(name).partition(":")
    if not module_name.startswith("hyfl.") or not qualname:
        raise ValueError(f"it names {name!r}, which is not a hyfl state class")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or not obj.__module__.startswith("hyfl."):
        raise ValueError(f"it names {name!r}, which is not a hyfl state class")
    return obj


class _Checkpointer:
    """Writes and reads one run's checkpoint file.

    The file is an ``.npz`` (read with ``allow_pickle=False``): the state's arrays
    plus ``__header__`` (format, hyfl version, round, the run's fingerprint; read and
    checked first) and ``__body__`` (the description of the algorithm state, generator
    states, counters and metrics), both JSON (see :class:`_StateCodec`).
    ``setup_state`` must be the state as ``algorithm.setup`` returned it, before any
    round.
    """

    def __init__(self, path: Path, fingerprint: dict, setup_state: Any, problem, blocks):
        self.path = path
        self.fingerprint = fingerprint
        objects = _static_objects(setup_state, problem, blocks)
        hashes = {id(obj): _hash_arrays(obj) for obj in objects.values()
                  if isinstance(obj, np.ndarray)}
        self.codec = _StateCodec(objects, hashes)
        self.setup_state = setup_state  # what a restored state must look like (load)
        self.saved_at: int | None = None

    def save(self, state: Any, run: RunProgress, rngs: dict, participation) -> None:
        header = {
            "format": CHECKPOINT_FORMAT,
            "hyfl_version": _hyfl_version(),
            "round": run.t,
            "written": time.time(),
            "fingerprint": self.fingerprint,
        }
        arrays: dict[str, np.ndarray] = {}
        body = self.codec.encode({
            "state": state,
            "rngs": {name: rng.bit_generator.state for name, rng in rngs.items()},
            "participation": _schedule_state(participation),
            "progress": dataclasses.asdict(run),
        }, arrays)
        arrays["__header__"] = _json_array(header)
        arrays["__body__"] = _json_array(body)
        # Every party's duals (whose signs are the labels) and weights: a 0600 file from
        # its creation, renamed into place (hyfl._private_files).
        from hyfl._private_files import savez_private

        savez_private(self.path, **arrays)
        self.saved_at = run.t

    def load(self, run: RunProgress, rngs: dict, participation) -> Any:
        """Restore ``run``, the generators and the schedule; return the algorithm state."""
        start_over = "Delete it (or run without --resume) to start over."
        culprit = f"checkpoint {self.path}"
        # Not an npz, truncated, pickled objects, arrays larger than their file: refused
        # before any array is read.
        arrays = read_npz(self.path, culprit, "a hyfl checkpoint", start_over, kinds="biufc",
                          expect={"__header__": ("u", 1), "__body__": ("u", 1)})
        header = read_header(arrays.pop("__header__"), culprit, "a hyfl checkpoint",
                             start_over)
        if header.get("format") != CHECKPOINT_FORMAT:
            raise fail(f"checkpoint {self.path}", "is not a hyfl checkpoint of this version",
                       start_over)
        self._check(header.get("fingerprint"))
        try:
            self.codec.used.clear()
            body = self.codec.decode(json.loads(arrays.pop("__body__").tobytes()), arrays)
            _check_like(body["state"], self.setup_state, "state")
            # Every array is one field's: a member nothing refers to is not hyfl's.
            stray = sorted(set(arrays) - self.codec.used)
            if stray:
                raise fail(f"checkpoint {self.path}", f"holds member {stray[0]!r}, which no "
                           "field of its state refers to", start_over)
            rng_states = body["rngs"]
            for name, rng in rngs.items():
                rng.bit_generator.state = rng_states[name]
            if body["participation"] is not None:
                participation.restore_state(body["participation"])
            for key, value in body["progress"].items():
                setattr(run, key, value)
        except HyflError:
            raise
        except Exception as err:
            raise fail(f"checkpoint {self.path}", f"cannot be restored ({err})",
                       start_over) from None
        run.resumed_from.append(run.t)
        self.saved_at = run.t
        return body["state"]

    def _check(self, stored: dict | None) -> None:
        if stored == self.fingerprint:
            return
        stored = stored or {}
        differ = sorted(
            key
            for key in set(stored) | set(self.fingerprint)
            if stored.get(key) != self.fingerprint.get(key)
        )
        details = []
        for key in differ:
            old, new = stored.get(key), self.fingerprint.get(key)
            if isinstance(old, dict) and isinstance(new, dict):
                for sub in sorted(set(old) | set(new)):
                    if old.get(sub) == new.get(sub):
                        continue
                    if sub == "hash":
                        details.append(f"{key}: the data differ")
                    else:
                        details.append(
                            f"{key}.{sub}: checkpoint has {_short(old.get(sub))}, "
                            f"this run has {_short(new.get(sub))}"
                        )
            else:
                details.append(f"{key}: checkpoint has {_short(old)}, this run has {_short(new)}")
        raise fail(
            f"checkpoint {self.path}",
            "was written by a different run (" + "; ".join(details) + ")",
            "Resume with the configuration that wrote it, or delete the checkpoint "
            "(or run without --resume) to start over.",
        )


def _check_like(restored: Any, fresh: Any, path: str, grows_along: int = 0) -> None:
    """Raise ``ValueError`` naming the first place where a restored state does not fit.

    ``fresh`` is the state ``algorithm.setup`` returned for this run's problem: where
    it holds an array, the restored state must hold one of the same kind (bool, integer,
    float, complex) and shape (its first axis may have grown -- or the axis its class's
    ``GROWS_ALONG`` names for it; finite if the fresh one is); where a hyfl object, one
    of the same class with its attributes; where a number, a number (finite if the
    fresh one is); dicts, lists and tuples are compared where both have the entry. So
    a forged or foreign checkpoint is refused at resume, naming the field, instead of
    failing rounds later or silently computing with NaN.
    """
    if restored is fresh or fresh is None:  # set-up data by reference; an unset slot
        return
    if isinstance(fresh, np.ndarray) or sp.issparse(fresh):
        sparse = sp.issparse(fresh)
        if sparse != sp.issparse(restored) or not (sparse or isinstance(restored, np.ndarray)):
            raise ValueError(f"{path} is a {type(restored).__name__}, not a "
                             f"{type(fresh).__name__}")
        # Buffers may grow along their first axis (WeightSnapshots.store; an empty int64
        # placeholder becomes int32 sample ids) or a declared one (SpanHistory.z's
        # columns), never shrink or change kind.
        a = grows_along
        if (_KINDS[restored.dtype.kind] != _KINDS[fresh.dtype.kind]
                or restored.ndim != fresh.ndim
                or np.delete(restored.shape, a).tolist() != np.delete(fresh.shape, a).tolist()
                or restored.shape[a:a + 1] < fresh.shape[a:a + 1]):
            raise ValueError(f"{path} is of dtype {restored.dtype} and shape {restored.shape}, "
                             f"this run's is of {fresh.dtype} and {fresh.shape}")
        values, reference = (x.data if sparse else x for x in (restored, fresh))
        if (values.dtype.kind in "fc" and not np.all(np.isfinite(values))
                and np.all(np.isfinite(reference))):
            raise ValueError(f"{path} holds NaN or infinite values")
        return
    if isinstance(fresh, (bool, np.bool_)) or not isinstance(fresh, (int, float, np.number)):
        if isinstance(fresh, (dict, list, tuple)) or type(fresh).__module__.startswith(
                "hyfl."):
            if type(restored) is not type(fresh):
                raise ValueError(f"{path} is a {type(restored).__name__}, not a "
                                 f"{type(fresh).__name__}")
        if isinstance(fresh, dict):
            for key in fresh.keys() & restored.keys():
                _check_like(restored[key], fresh[key], f"{path}[{key!r}]")
        elif isinstance(fresh, (list, tuple)):
            if len(restored) == len(fresh):
                for i, (a, b) in enumerate(zip(restored, fresh)):
                    _check_like(a, b, f"{path}[{i}]")
        elif type(fresh).__module__.startswith("hyfl.") and hasattr(fresh, "__dict__"):
            grows = getattr(type(fresh), "GROWS_ALONG", {})
            for name, value in vars(fresh).items():
                if name not in vars(restored):
                    raise ValueError(f"{path} lacks attribute {name!r}")
                _check_like(vars(restored)[name], value, f"{path}.{name}", grows.get(name, 0))
        return
    if isinstance(restored, (bool, np.bool_)) or not isinstance(restored,
                                                                (int, float, np.number)):
        raise ValueError(f"{path} is a {type(restored).__name__}, not a number")
    if is_finite(fresh) and not is_finite(restored):
        raise ValueError(f"{path} is {restored:.6g}, not a finite number")


#: Dtype kinds a restored array may have instead of the fresh one's (integers of any width).
_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "f", "c": "c"}


def _json_array(tree: Any) -> np.ndarray:
    """A JSON document as a uint8 array (an ``.npz`` entry that needs no pickle)."""
    return np.frombuffer(json.dumps(tree, allow_nan=False).encode(), dtype=np.uint8)


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _schedule_state(participation) -> Any:
    """A participation schedule's own state, if it keeps one (``checkpoint_state()``)."""
    get = getattr(participation, "checkpoint_state", None)
    return get() if callable(get) else None


def _hyfl_version() -> str:
    from hyfl import __version__

    return __version__


