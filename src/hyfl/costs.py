"""Honest cost accounting: round trips, bytes, HE operations and simulated time.

Every algorithm reports, per outer iteration, what crosses the network in its
``round_stats``: ``round_trips``, plaintext ``floats_up``/``floats_down``,
integer ``ids_up``/``ids_down``, the busiest client's share of the client
work (``client_share_max``) and the time of its server half
(``server_seconds``). HyFDCA additionally reports which (client, sample)
values travel encrypted (``state.traffic``); :class:`CostMeter` turns those
into ciphertexts with the cipher's :class:`~hyfl.privacy.layout.SlotLayout`
(one per value for per-value Paillier, one per chunk for packed schemes) and
counts the encryptions, decryptions and server additions the protocol does.

Simulated wall time of an outer iteration (DESIGN section 6)::

    sim_time = slowest active client's compute + server compute
               + round_trips x latency + HE operations x per-operation cost

The engine runs every client at once, so the slowest client's compute is
estimated as the round's client-side time times the busiest client's share of
the work (non-zeros touched). HE operations are charged serially at the
per-ciphertext cost, as the paper did (section 7.1).

Which per-operation costs (``--he-costs``, :func:`resolve_he_costs`):

``auto`` (the default)
    The cipher that runs prices itself: ``none`` charges no HE time (the
    operations are still counted and reported); a real cipher is charged its
    own seconds per operation at its key size, from the ``hyfl calibrate``
    cache when that holds a record for it, else from a quick calibration in
    this process (offline, well under a second), which is then cached.
``paper``
    The paper's per-value Paillier figures (18.882 ms encrypt, 18.865 ms
    decrypt, 0.054 ms add), per ciphertext counted.
``measured``
    The ``hyfl calibrate`` record of the running cipher (it must exist).
a cipher name (``none``, ``paillier``, ``packed``, ...)
    That cipher's own costs, as ``auto`` finds them (``none``: zero).
a JSON file
    ``{"encrypt": s, "decrypt": s, "add": s}`` or such a record per cipher.

Which ciphertexts are counted (``he_layout``, :func:`counting_layout`): by
default the layout of the cipher that runs (``cipher``): one ciphertext per
value for a one-value cipher (``none``, ``paillier``), and for a packing
cipher (``slots`` > 1) whole samples per ciphertext, all ``C`` one-vs-rest
outputs of a sample in one ciphertext when they fit. ``sample`` counts one
ciphertext per sample whatever ``C`` is (the count the paper's figures
assume, its section 7.1 and Table 6), and a cipher's name counts as that
cipher would pack. The encrypted protocol engine counts the operations the
real cipher performs instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyfl._io import dumps_json, write_text
from hyfl.errors import HyflError, check_positive, fail
from hyfl.privacy.layout import TaggedLayout, compact_steps

FLOAT_BYTES = 8  # float64 on the wire
ID_BYTES = 4  # int32 sample or chunk ids

HE_COUNT_COLUMNS = ("encryptions", "decryptions", "additions")
COST_COLUMNS = (
    "bytes_up",
    "bytes_down",
    *HE_COUNT_COLUMNS,
    "sim_time",
)
TIME_COMPONENTS = ("time_client", "time_server", "time_latency", "time_encryption")
"""Per-component breakdown of ``sim_time`` (cumulative columns), like the paper's Figure 4."""


@dataclass(frozen=True)
class HECosts:
    """Seconds per ciphertext operation.

    Attributes
    ----------
    encrypt, decrypt, add : float
    source : str
        Where the figures come from (``paper``, a calibration file, ...).
    """

    encrypt: float
    decrypt: float
    add: float
    source: str = "custom"


PAPER_HE_COSTS = HECosts(
    encrypt=18.882e-3,
    decrypt=18.865e-3,
    add=0.054e-3,
    source="paper: per-value Paillier (Sidorov, Wei and Ng 2022)",
)

NO_HE_COSTS = HECosts(
    encrypt=0.0,
    decrypt=0.0,
    add=0.0,
    source="none: plaintext run, no HE time charged (operations still counted)",
)

# Named choices of --he-costs and he_layout (in hyfl._names, which `hyfl --help` reads).
from hyfl._names import (  # noqa: E402, F401
    DEFAULT_HE_COSTS,
    DEFAULT_HE_LAYOUT,
    HE_COST_SOURCES,
    HE_LAYOUTS,
)

QUICK_CALIBRATION_VALUES = 16
"""Ciphertexts timed per operation by the quick calibration of ``--he-costs auto``."""


def calibration_path() -> Path:
    """Where ``hyfl calibrate`` stores its measurements (``HYFL_CACHE`` or ~/.cache/hyfl)."""
    root = Path(os.environ.get("HYFL_CACHE", Path.home() / ".cache" / "hyfl"))
    return root / "he-costs.json"


def calibration_key(cipher: str, key_bits: int | None) -> str:
    """The cache key of one cipher at one key size, e.g. ``packed@2048``."""
    return f"{cipher}@{key_bits}"


def save_calibration(measurements: dict[str, dict], path: Path | None = None) -> Path:
    """Merge per-cipher measurements (``{cipher: {"encrypt": s, ...}}``) into the file.

    Each record is stored under its cipher name (what ``--he-costs measured``
    reads: the latest measurement) and, when it names its ``key_bits``, also
    under ``cipher@key_bits`` (what ``--he-costs auto`` looks up).
    """
    path = Path(path) if path is not None else calibration_path()
    existing = _read_calibration(path) if path.exists() else {}
    if path.exists() and not existing and path.read_text().strip() not in ("", "{}"):
        raise fail(
            f"calibration file {path}",
            "is not a JSON object of records; it is left as it is",
            "Move it away (or delete it) and measure again.",
        )
    _MEMO.clear()
    for name, record in measurements.items():
        existing[name] = record
        if isinstance(record, dict) and "@" not in name and record.get("key_bits") is not None:
            existing[calibration_key(name, record["key_bits"])] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, dumps_json(existing, indent=2, sort_keys=True))
    return path


def _read_calibration(path: Path) -> dict:
    """The calibration file's records ({} when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _costs_of(record, source: str) -> HECosts | None:
    """A calibration record as :class:`HECosts` (None when it lacks a finite figure)."""
    try:
        values = {key: float(record[key]) for key in ("encrypt", "decrypt", "add")}
    except (KeyError, TypeError, ValueError):
        return None
    if not all(np.isfinite(v) and v >= 0 for v in values.values()):
        return None
    return HECosts(**values, source=source)


_MEMO: dict[tuple[str, str], HECosts] = {}


def cipher_he_costs(cipher, path: Path | None = None) -> HECosts:
    """The seconds per operation of ``cipher`` (a built cipher) on this machine.

    ``none`` charges nothing. Otherwise the calibration file (default
    :func:`calibration_path`) is read for a record of this cipher at its key
    size (``cipher@key_bits``, or the cipher's latest record if it has the
    same ``key_bits``); without one, the cipher is calibrated here on
    :data:`QUICK_CALIBRATION_VALUES` ciphertexts (offline, a fraction of a
    second) and the record is added to the file (``"quick": true``; a full
    ``hyfl calibrate`` later replaces it). Results are remembered per process.
    """
    from hyfl.privacy.ciphers import calibrate

    name = str(cipher.name)
    if name == "none":
        return NO_HE_COSTS
    path = Path(path) if path is not None else calibration_path()
    bits = getattr(cipher, "key_bits", None)
    key = calibration_key(name, bits)
    memo = (str(path), key)
    if memo in _MEMO:
        return _MEMO[memo]
    data = _read_calibration(path)
    record = data.get(key)
    if record is None and isinstance(data.get(name), dict) and data[name].get("key_bits") == bits:
        record = data[name]
    what = f"{name} ({bits}-bit key)" if bits is not None else name
    costs = None
    if record is not None:
        kind = "quick calibration" if record.get("quick") else "calibration"
        costs = _costs_of(record, f"{what}: its own {kind} on this machine ({path})")
    if costs is None:
        record = calibrate(cipher, n_values=QUICK_CALIBRATION_VALUES)
        if record.get("decrypt") is None:  # a public view cannot decrypt: take encrypt's time
            record["decrypt"] = record["encrypt"]
        record.update(quick=True, n_values=QUICK_CALIBRATION_VALUES)
        try:
            save_calibration({key: record}, path)
            where = f"saved to {path}"
        except (OSError, HyflError):
            where = "not saved"
        costs = _costs_of(record, f"{what}: its own quick calibration on this machine ({where})")
    _MEMO[memo] = costs
    return costs


def check_he_costs(spec, cipher: str) -> str:
    """Validate ``--he-costs`` without measuring anything; returns it.

    Named sources and cipher names are accepted as they are; ``measured`` and
    files are read (so a missing file fails before any data is loaded).
    """
    from hyfl.privacy.ciphers import CIPHERS

    if not isinstance(spec, str) or not spec.strip():
        raise fail(
            "--he-costs",
            f"is {spec!r}",
            f"Pass {', '.join(HE_COST_SOURCES)}, a cipher name ({', '.join(CIPHERS)}) or a "
            "JSON file.",
        )
    if spec in ("auto", *CIPHERS):
        return spec
    load_he_costs(spec, cipher)
    return spec


def resolve_he_costs(spec: str, cipher, *, key_bits: int | None = None) -> HECosts:
    """``--he-costs`` for a run whose cipher is ``cipher`` (a built cipher object).

    ``auto``: the running cipher's own costs (:func:`cipher_he_costs`; zero for
    ``none``). A cipher name: that cipher's own costs (built with ``key_bits``
    when it is not the running one). ``paper``, ``measured`` or a file:
    :func:`load_he_costs`.
    """
    from hyfl.privacy.ciphers import CIPHERS, make_cipher

    check_he_costs(spec, cipher.name)
    if spec == "auto" or spec == cipher.name:
        return cipher_he_costs(cipher)
    if spec in CIPHERS:
        if spec == "none":
            return NO_HE_COSTS
        return cipher_he_costs(make_cipher(spec, key_bits=key_bits))
    return load_he_costs(spec, cipher.name)


def he_label(costs: dict | None, fallback: str = "") -> str:
    """A short name of what priced a run, from its ``run.json`` ``costs`` record.

    ``costs`` is :meth:`CostModel.describe`'s dict; e.g. "paper's per-value
    Paillier HE costs", "no HE time (plaintext)", "packed (2048-bit key): its own
    calibration on this machine", plus the counted layout when it is not the
    cipher's own ("counted one ciphertext per sample").
    """
    costs = costs if isinstance(costs, dict) else {}
    he = costs.get("he_costs") if isinstance(costs.get("he_costs"), dict) else {}
    source = str(he.get("source") or fallback or "")
    if source.startswith("paper"):
        label = "paper's per-value Paillier HE costs"
    elif source.startswith("none:"):
        label = "no HE time (plaintext)"
    elif " on this machine" in source:
        label = source[: source.index(" on this machine") + len(" on this machine")]
    elif source in ("", "custom"):
        label = "HE costs " + (source or "unknown")
    else:
        label = f"HE costs from {Path(source).name}"
    layout = costs.get("he_layout")
    if isinstance(layout, dict) and layout.get("name") not in (None, DEFAULT_HE_LAYOUT):
        if layout["name"] == "sample":
            label += ", counted one ciphertext per sample"
        else:
            label += f", counted as {layout['name']} packs ({layout.get('slots')} slots)"
    return label


def check_he_layout(layout, cipher: str) -> str:
    """Validate ``he_layout``: ``cipher``, ``sample`` or a cipher name; returns it."""
    from hyfl.privacy.ciphers import CIPHERS

    if layout not in (*HE_LAYOUTS, *CIPHERS):
        raise fail(
            "--he-layout",
            f"is {layout!r}",
            f"Pass {', '.join(HE_LAYOUTS)} or a cipher name ({', '.join(CIPHERS)}).",
        )
    if cipher != "none" and layout not in ("cipher", cipher):
        raise fail(
            "--he-layout",
            f"is {layout!r}, but cipher {cipher!r} really encrypts: its operations are "
            "counted as they happen, in its own layout",
            "Leave --he-layout at 'cipher' with a real cipher, or run with --cipher none.",
        )
    return layout


def layout_slots(layout: str, *, key_bits: int | None = None) -> int | None:
    """Values per ciphertext of ``he_layout`` (None for ``cipher`` and ``sample``)."""
    from hyfl.privacy.ciphers import cipher_slots

    if layout in HE_LAYOUTS:
        return None
    return cipher_slots(layout, key_bits=key_bits)


def load_he_costs(spec: str, cipher: str) -> HECosts:
    """Resolve ``--he-costs``: ``paper``, ``measured`` or a JSON file.

    A file holds either ``{"encrypt": s, "decrypt": s, "add": s}`` or such a
    record per cipher name (the format ``hyfl calibrate`` writes).
    """
    if spec == "paper":
        return PAPER_HE_COSTS
    path = calibration_path() if spec == "measured" else Path(spec)
    if not path.exists():
        if spec == "measured":
            raise fail(
                "--he-costs measured",
                f"no calibration found at {path}",
                f"Run `hyfl calibrate --cipher {cipher}` first, or pass --he-costs paper",
            )
        raise fail(
            "--he-costs", f"file {path} does not exist", "Pass paper, measured or a JSON file"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise fail("--he-costs", f"cannot read {path}: {exc}", "Pass a JSON file") from exc
    record = data.get(cipher, data) if isinstance(data, dict) else None
    try:
        values = {key: float(record[key]) for key in ("encrypt", "decrypt", "add")}
    except (KeyError, TypeError, ValueError) as exc:
        raise fail(
            "--he-costs",
            f"{path} has no encrypt/decrypt/add seconds for cipher {cipher!r}",
            f'Run `hyfl calibrate --cipher {cipher}` or write {{"{cipher}": '
            '{"encrypt": s, "decrypt": s, "add": s}}',
        ) from exc
    for key, value in values.items():
        if not np.isfinite(value) or value < 0:
            raise fail("--he-costs", f"{key} cost {value} in {path}", "Use seconds >= 0")
    return HECosts(**values, source=str(path))


@dataclass(frozen=True)
class CostModel:
    """How to turn counts into bytes and seconds.

    Parameters
    ----------
    latency : float, default 0
        Seconds per round trip (the paper used 0, 0.2575 and 0.8).
    he : HECosts, default PAPER_HE_COSTS
        Seconds per ciphertext operation. (The runner's default, ``--he-costs
        auto``, resolves to the running cipher's own costs; this library
        default keeps the paper's figures for direct callers.)
    layout : str, default "cipher"
        Which ciphertexts are counted (:func:`counting_layout`): ``cipher``
        (the running cipher's slots), ``sample`` (one ciphertext per sample)
        or a cipher's name, whose ``layout_slots`` values per ciphertext are
        then counted.
    layout_slots : int, optional
        Values per ciphertext of the named layout (see :func:`layout_slots`).
    """

    latency: float = 0.0
    he: HECosts = PAPER_HE_COSTS
    layout: str = DEFAULT_HE_LAYOUT
    layout_slots: int | None = None

    def validated(self) -> CostModel:
        if self.latency != 0:
            check_positive("latency", self.latency, fix="Pass seconds per round trip, >= 0.")
        if self.layout not in HE_LAYOUTS and self.layout_slots is None:
            raise fail(
                "CostModel",
                f"has layout {self.layout!r} without layout_slots",
                "Pass layout_slots (see hyfl.costs.layout_slots).",
            )
        return self

    def slots_for(self, cipher, n_outputs: int) -> int:
        """Values per counted ciphertext for a run with ``cipher`` and ``n_outputs`` outputs."""
        if self.layout == "cipher":
            return int(cipher.slots)
        if self.layout == "sample":
            return int(n_outputs)
        return int(self.layout_slots)

    def describe(self) -> dict:
        out = {"latency": self.latency, "he_costs": asdict(self.he)}
        if self.layout != DEFAULT_HE_LAYOUT:  # the default is left out: old runs stay comparable
            out["he_layout"] = {"name": self.layout, "slots": self.layout_slots}
        return out


class CostMeter:
    """Per-round costs of one run (counts ciphertexts for one cipher's layout).

    Parameters
    ----------
    model : CostModel
    ciphertext_bytes : int
        Wire size of one ciphertext of the counted cipher.
    layout : SlotLayout or None
        Needed only by algorithms that report encrypted traffic (HyFDCA).
    """

    def __init__(self, model: CostModel, ciphertext_bytes: int, layout=None,
                 value_slots: int | None = None):
        self.model, self.ciphertext_bytes, self.layout = model, ciphertext_bytes, layout
        self.value_slots = value_slots

    def build_layout(self, blocks, cipher, n_outputs: int) -> None:
        """Set the counted layout for a run with ``cipher`` (see :class:`CostModel`)."""
        slots = self.model.slots_for(cipher, n_outputs)
        self.layout = counting_layout(blocks, slots, n_outputs)
        self.value_slots = slots

    def round_costs(self, stats: dict, traffic: dict | None, round_seconds: float) -> dict:
        """Costs of one outer iteration (per round, not cumulative)."""
        he = count_he_operations(traffic, self.layout, self.value_slots) if traffic else (
            dict.fromkeys(
                ("encryptions", "decryptions", "additions", "ciphertexts_up", "ciphertexts_down"),
                0,
            )
        )
        ct = self.ciphertext_bytes + ID_BYTES  # each ciphertext travels with its chunk id
        bytes_up = (
            FLOAT_BYTES * stats.get("floats_up", 0.0)
            + ID_BYTES * stats.get("ids_up", 0.0)
            + ct * he["ciphertexts_up"]
        )
        bytes_down = (
            FLOAT_BYTES * stats.get("floats_down", 0.0)
            + ID_BYTES * (stats.get("ids_down", 0.0) + he.get("ids_down", 0))
            + ct * he["ciphertexts_down"]
        )
        server = float(stats.get("server_seconds", 0.0))
        active = float(stats.get("active_clients", 0.0))
        share = float(stats.get("client_share_max", 1.0 / active if active else 0.0))
        client = max(float(round_seconds) - server, 0.0) * share
        latency = float(stats.get("round_trips", 0.0)) * self.model.latency
        costs = self.model.he
        encryption = (
            he["encryptions"] * costs.encrypt
            + he["decryptions"] * costs.decrypt
            + he["additions"] * costs.add
        )
        return {
            "bytes_up": float(bytes_up),
            "bytes_down": float(bytes_down),
            "encryptions": float(he["encryptions"]),
            "decryptions": float(he["decryptions"]),
            "additions": float(he["additions"]),
            "time_client": client,
            "time_server": server,
            "time_latency": latency,
            "time_encryption": encryption,
            "sim_time": client + server + latency + encryption,
        }


def counting_layout(blocks, slots: int, n_outputs: int = 1):
    """The :class:`~hyfl.privacy.layout.SlotLayout` the cost model counts.

    ``slots`` values per ciphertext, ``n_outputs`` (C) values per sample:

    * ``slots == 1``: one ciphertext per value (C per sample), the per-value
      count of ``none`` and ``paillier``;
    * ``C <= slots``: ``slots // C`` whole samples per ciphertext, so all C
      one-vs-rest outputs of a sample travel in one ciphertext (with
      ``slots == C``: one ciphertext per sample, the paper's count);
    * ``C > slots``: ``ceil(C / slots)`` ciphertexts per sample.

    Samples are grouped by holder set as in :meth:`SlotLayout.build`. The
    returned layout counts samples, not values (its ``n_outputs`` is the
    ciphertexts per sample); :func:`count_he_operations` takes the values per
    ciphertext separately for the messages that are not per sample.
    """
    from hyfl.privacy.layout import SlotLayout

    slots = int(slots)
    n_outputs = int(n_outputs)
    if slots < 1 or n_outputs < 1:
        raise fail("counting_layout", f"slots={slots}, n_outputs={n_outputs}", "Use >= 1.")
    if slots == 1:
        return SlotLayout.build(blocks, 1, n_outputs)
    if n_outputs <= slots:
        return SlotLayout.build(blocks, slots // n_outputs, 1)
    return SlotLayout.build(blocks, 1, -(-n_outputs // slots))


COCOA, PER_SAMPLE = "cocoa", "per-sample"
"""The step rules' rounds a :class:`RoundTraffic` names (as
:data:`hyfl.algorithms.hyfdca_round.COCOA` and ``PER_SAMPLE``)."""


@dataclass
class RoundTraffic:
    """What one HyFDCA round sent encrypted, phase by phase (read by :func:`count_he_operations`).

    Attributes
    ----------
    rule : {"cocoa", "per-sample"}
        Whose round it is: the ``cocoa`` rule's stored duals are states with tags
        (each stored chunk sent down travels with its tag chunk and who made it);
        the per-sample rules' are plain sums.
    phases : dict
        Phase name (of :data:`hyfl.algorithms.hyfdca_round.PHASES`) -> the
        encrypted messages of that phase, message name -> what travels (the
        counting function of the phase, :data:`PHASE_COUNTS`, lists its messages).
    draws : (clients, samples) or None
        The round's draws, which define its compact layout
        (``layout.round_layout``); ``None``: there is none (nobody drew, or the
        ``cocoa`` rule's full local pass), the fixed layout is used.
    """

    rule: str
    phases: dict = field(default_factory=dict)
    draws: tuple | None = None

    def add(self, phase: str, messages: dict) -> None:
        """Record ``messages`` (name -> what travels) as sent in ``phase``."""
        self.phases.setdefault(phase, {}).update(messages)

    def message(self, phase: str, name: str, default=None):
        """What travelled as ``name`` in ``phase`` (``default`` if it did not)."""
        return self.phases.get(phase, {}).get(name, default)


@dataclass
class _Count:
    """The running counts of :func:`count_he_operations` and the layouts of the round."""

    layout: Any  # where the stored values are (SlotLayout)
    compact: Any  # the round's compact layout (``layout`` without draws)
    states: bool  # the stored duals are states with tags (the cocoa rule)
    value_slots: int  # values per ciphertext of the messages that are not per sample
    duals: Any = None  # where the new duals (per-sample) or the summed proposals travel down
    steps_compact: bool = False  # the per-sample steps travel compact (compact_steps)
    encryptions: int = 0
    decryptions: int = 0
    additions: int = 0
    ciphertexts_up: int = 0
    ciphertexts_down: int = 0
    ids_down: int = 0

    def up(self, n: int, added: int = 0) -> None:
        """``n`` ciphertexts encrypted and sent up, ``added`` additions by the server."""
        self.ciphertexts_up += n
        self.encryptions += n
        self.additions += added

    def down(self, n: int) -> None:
        """``n`` ciphertexts sent down and decrypted."""
        self.ciphertexts_down += n
        self.decryptions += n

    def stored(self, n: int) -> int:
        """Ciphertexts of ``n`` stored chunks sent down: with the cocoa rule each state
        travels with its tag chunk and who made it (round, attempt, reporter: 3 ids)."""
        if not self.states:
            return n
        self.ids_down += 3 * n
        return 2 * n

    def per_value(self, values: int) -> int:
        """Ciphertexts of ``values`` values that are not per sample."""
        return -(-int(values) // self.value_slots)

    def result(self) -> dict[str, int]:
        return {"encryptions": self.encryptions, "decryptions": self.decryptions,
                "additions": self.additions, "ciphertexts_up": self.ciphertexts_up,
                "ciphertexts_down": self.ciphertexts_down, "ids_down": self.ids_down}


def count_he_operations(traffic: RoundTraffic, layout,
                        value_slots: int | None = None) -> dict[str, int]:
    """Ciphertexts and HE operations of one HyFDCA round from its encrypted traffic.

    ``layout`` places the samples' values (see :func:`counting_layout`);
    ``value_slots`` is the values per ciphertext of the messages that are not
    per sample (the line-search and gain totals, the certificate's sums;
    default ``layout.slots``).

    Each phase of ``traffic`` (:class:`RoundTraffic`) is counted by its
    function in :data:`PHASE_COUNTS`, whose docstring lists the messages it
    reads; a phase without one is refused. Layouts (see
    :mod:`hyfl.privacy.layout`): what the server stores stays in ``layout``;
    values summed within the round travel in the round's compact layout
    (``layout.round_layout`` of its draws): the inner products of ``sip_up``
    (with ``sip_sum``, ``sip_down``), the cocoa rule's proposals and their sums
    (with a tag chunk per sender or receiver and holder group,
    :class:`~hyfl.privacy.layout.TaggedLayout`), and the per-sample rules'
    dual steps when :func:`~hyfl.privacy.layout.compact_steps` chooses it --
    then the server sums the steps instead of adding them into the stored
    duals, and one active holder per updated sample sends its dual's change in
    ``layout``, added into the stored duals.
    """
    if traffic.rule not in (COCOA, PER_SAMPLE):
        raise fail("count_he_operations", f"a round of rule {traffic.rule!r}",
                   f"Name the rule {COCOA!r} or {PER_SAMPLE!r}.")
    unknown = sorted(set(traffic.phases) - set(PHASE_COUNTS))
    if unknown:
        raise fail("count_he_operations", f"has no count for phase(s) {unknown}",
                   "Add the phase's counting function to hyfl.costs.PHASE_COUNTS.")
    draws = traffic.draws
    count = _Count(layout, layout if draws is None else layout.round_layout(*draws),
                   traffic.rule == COCOA, int(value_slots or layout.slots))
    if count.states:  # the summed proposals, with a tag chunk per holder group
        count.duals = TaggedLayout(count.compact)
    else:
        dual_up = traffic.message("steps", "dual_up")
        count.steps_compact = dual_up is not None and bool(compact_steps(
            layout, dual_up, traffic.message("duals", "dual_down")))
        count.duals = count.compact if count.steps_compact else layout
    for phase, messages in traffic.phases.items():
        PHASE_COUNTS[phase](count, messages, traffic)
    return count.result()


# -- one counting function per phase (hyfl.algorithms.hyfdca_round.PHASES) --------------
def _count_round(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``round``: ``refresh_down`` (clients, samples), the changed duals sent to returning
    clients, and ``checkpoint_down`` (clients, samples), the certificate's checkpoint
    duals sent to the clients whose image of it is missing: stored chunks, decrypted.
    SecureInnerProduct: ``sip_up`` (clients, samples; the drawn samples' parts, summed
    and never stored: compact) or ``sip_up_all`` (bool mask over clients: every sample
    of the flagged clients, stored), encrypted; ``sip_sum`` (samples) the server sums
    over all holders; ``sip_down`` (clients, samples) or ``sip_down_all`` (mask), the
    sums sent back, decrypted. With the cocoa rule the parts carry a tag chunk per
    holder group, and the sums who made each holder's part (2 ids)."""
    layout = count.layout
    count.down(count.stored(_chunks(layout, messages, "refresh_down"))
               + count.stored(_chunks(layout, messages, "checkpoint_down")))
    sip = count.compact if "sip_up" in messages else layout
    if count.states:
        sip = TaggedLayout(layout)
        if "sip_down_all" in messages:
            count.ids_down += 2 * _flagged_holders(sip, messages["sip_down_all"])
    count.up(_chunks(sip, messages, "sip_up"))
    if "sip_sum" in messages:
        chunks = sip.chunks_of(messages["sip_sum"])
        count.additions += int(np.sum(sip.holders_per_chunk(chunks) - 1))
    count.down(_chunks(sip, messages, "sip_down"))


def _count_steps(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``steps`` (per-sample rules): ``dual_up`` (clients, samples), the drawn samples'
    encrypted dual steps. In the fixed layout the server adds every received
    ciphertext into the stored duals; in the compact one it sums them (the first kept,
    the others added) and one active holder per updated sample encrypts its dual's
    change in the fixed layout, added into the stored duals."""
    if "dual_up" not in messages:
        return
    clients, samples = messages["dual_up"]
    layout, compact = count.layout, count.compact
    if count.steps_compact:
        updated = np.unique(np.asarray(traffic.draws[1], dtype=np.int64))
        n = compact.count_chunks(clients, samples)
        changes = int(layout.chunks_of(updated).size)
        count.up(n + changes, n - int(compact.chunks_of(updated).size) + changes)
    else:
        n = layout.count_chunks(clients, samples)
        count.up(n, n)


def _count_duals(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``duals`` (per-sample rules): ``dual_down`` (clients, samples), the new duals (or
    the steps' sums) sent to the active holders, decrypted; ``totals``."""
    count.down(_chunks(count.duals, messages, "dual_down"))
    _count_totals(count, messages)


def _count_totals(count: _Count, messages: dict) -> None:
    """``totals`` (n_senders, n_values): a few encrypted scalars (with their tag) per
    sender, summed by the server; ``summed_totals`` (n_readers, n_values): their sums,
    each reader decrypts them (the safe rule's judge; the cocoa rule's every active
    client)."""
    if "totals" in messages:
        senders, values = messages["totals"]
        n = count.per_value(values)
        count.up(senders * n, max(senders - 1, 0) * n)
    if "summed_totals" in messages:
        readers, values = messages["summed_totals"]
        count.down(readers * count.per_value(values))


def _count_verdict(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``verdict`` (the safe rule): ``summed_totals`` to the judge."""
    _count_totals(count, messages)


def _count_commit(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``commit`` (per-sample rules): ``sip_again_all`` (mask over clients), the optional
    second SecureInnerProduct: every sample of the flagged clients, stored."""
    count.up(_chunks(count.layout, messages, "sip_again"))


def _count_proposals(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``proposals`` (cocoa): ``proposals_up`` (clients, samples), the drawn samples'
    proposed dual changes, or ``proposals_up_all`` (mask, samples), every sample of the
    flagged clients (a full local pass; ``samples`` the distinct ones): encrypted
    with a tag chunk per holder group, summed per chunk by the server (the first
    kept, the others added), not into the stored duals."""
    duals = count.duals
    if "proposals_up" in messages:
        clients, samples = messages["proposals_up"]
        n = duals.count_chunks(clients, samples)
        count.up(n, n - (int(duals.chunks_of(samples).size) if len(samples) else 0))
    if "proposals_up_all" in messages:
        clients, samples = messages["proposals_up_all"]
        n = _flagged_chunks(duals, clients)
        count.up(n, n - (int(duals.chunks_of(samples).size) if len(samples) else 0))


def _count_image(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``image`` (cocoa): ``dual_down`` (clients, samples) or ``dual_down_all`` (mask),
    the summed proposals sent to the active holders; ``momentum_down`` (clients,
    samples), the previous dual steps (stored states) sent to returning clients; all
    decrypted."""
    count.down(_chunks(count.duals, messages, "dual_down")
               + count.stored(_chunks(count.layout, messages, "momentum_down")))


def _count_direction(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``direction`` (cocoa): the line search's ``totals`` from every active client."""
    _count_totals(count, messages)


def _count_step(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``step`` (cocoa): ``summed_totals`` to every active client; ``dual_commit``
    (samples), the new dual states of the chunks whose samples moved, encrypted by one
    active holder per sample with a tag chunk each, replacing the stored ones (a plain
    change would be added); ``conjugate_up`` (int), the judges' conjugate-sum changes
    (a value and its tag), added into the server's sum; ``sip_ahead_all`` (mask), the
    next round's inner products sent with the step."""
    _count_totals(count, messages)
    # ``sip_ahead_all`` (mask): the next round's inner products of every sample of the
    # flagged clients, sent with the step (stored, with a tag chunk per holder group).
    count.up(_chunks(TaggedLayout(count.layout), messages, "sip_ahead"))
    if "dual_commit" in messages:
        commit = messages["dual_commit"]
        n = int(count.layout.chunks_of(commit).size) if len(commit) else 0
        count.up(2 * n if count.states else n, 0 if count.states else n)
    n = int(messages.get("conjugate_up", 0)) * count.per_value(2)
    count.up(n, n)


def _count_certify(count: _Count, messages: dict, traffic: RoundTraffic) -> None:
    """``certify`` (cocoa): ``certify_down`` (int), the conjugate sums (a value and its
    tag each) a judge decrypts to decide on a checkpoint."""
    count.down(int(messages.get("certify_down", 0)) * count.per_value(2))


#: Phase name (of :data:`hyfl.algorithms.hyfdca_round.PHASES`) -> its counting function.
PHASE_COUNTS: dict[str, Callable[[_Count, dict, RoundTraffic], None]] = {
    "round": _count_round,
    "weights": lambda count, messages, traffic: None,  # plaintext weights only
    "steps": _count_steps,
    "duals": _count_duals,
    "verdict": _count_verdict,
    "commit": _count_commit,
    "proposals": _count_proposals,
    "image": _count_image,
    "direction": _count_direction,
    "step": _count_step,
    "certify": _count_certify,
}


def _chunks(layout, messages: dict, key: str) -> int:
    """Ciphertext chunks of a message: the (clients, samples) pairs recorded under
    ``key``, plus every sample of the clients flagged under ``key + "_all"`` (a chunk
    covers one holder group, each of whose samples the client holds)."""
    n = layout.count_chunks(*messages[key]) if key in messages else 0
    if f"{key}_all" in messages:
        n += _flagged_chunks(layout, messages[f"{key}_all"])
    return n


def _flagged_holders(layout, flags) -> int:
    """Holders of every holder group of the clients flagged in ``flags``, counted once per
    (client, group, holder)."""
    holders = layout.chunk_holders[layout.inner.n_chunks:]
    n_holders = np.count_nonzero(holders >= 0, axis=1)
    flagged = np.flatnonzero(np.asarray(flags, dtype=bool))
    return int(sum(n_holders[(holders == k).any(axis=1)].sum() for k in flagged))


def _flagged_chunks(layout, flags) -> int:
    """All the chunks of the clients flagged in ``flags`` (bool, shape (K,))."""
    return int(layout.client_chunks[np.asarray(flags, dtype=bool)].sum())
