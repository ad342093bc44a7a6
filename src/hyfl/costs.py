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
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hyfl._io import dumps_json, write_text
from hyfl.errors import check_positive, fail
from hyfl.privacy.layout import compact_steps

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

HE_COST_SOURCES = ("paper", "measured")
"""Named choices of ``--he-costs`` (anything else is a JSON file path)."""


def calibration_path() -> Path:
    """Where ``hyfl calibrate`` stores its measurements (``HYFL_CACHE`` or ~/.cache/hyfl)."""
    root = Path(os.environ.get("HYFL_CACHE", Path.home() / ".cache" / "hyfl"))
    return root / "he-costs.json"


def save_calibration(measurements: dict[str, dict], path: Path | None = None) -> Path:
    """Merge per-cipher measurements (``{cipher: {"encrypt": s, ...}}``) into the file."""
    path = Path(path) if path is not None else calibration_path()
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing.update(measurements)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, dumps_json(existing, indent=2, sort_keys=True))
    return path


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
    except (OSError, json.JSONDecodeError) as exc:
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
    """

    latency: float = 0.0
    he: HECosts = PAPER_HE_COSTS

    def validated(self) -> CostModel:
        if self.latency != 0:
            check_positive("latency", self.latency, fix="Pass seconds per round trip, >= 0.")
        return self

    def describe(self) -> dict:
        return {"latency": self.latency, "he_costs": asdict(self.he)}


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

    def __init__(self, model: CostModel, ciphertext_bytes: int, layout=None):
        self.model, self.ciphertext_bytes, self.layout = model, ciphertext_bytes, layout

    def round_costs(self, stats: dict, traffic: dict | None, round_seconds: float) -> dict:
        """Costs of one outer iteration (per round, not cumulative)."""
        he = count_he_operations(traffic, self.layout) if traffic else dict.fromkeys(
            ("encryptions", "decryptions", "additions", "ciphertexts_up", "ciphertexts_down"), 0
        )
        ct = self.ciphertext_bytes + ID_BYTES  # each ciphertext travels with its chunk id
        bytes_up = (
            FLOAT_BYTES * stats.get("floats_up", 0.0)
            + ID_BYTES * stats.get("ids_up", 0.0)
            + ct * he["ciphertexts_up"]
        )
        bytes_down = (
            FLOAT_BYTES * stats.get("floats_down", 0.0)
            + ID_BYTES * stats.get("ids_down", 0.0)
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


def count_he_operations(traffic: dict, layout) -> dict[str, int]:
    """Ciphertexts and HE operations of one HyFDCA round from its encrypted traffic.

    ``traffic`` maps message names to what travels (see
    :meth:`hyfl.algorithms.hyfdca.HyFDCA.round`):

    ``refresh_down`` (clients, samples)
        Changed duals sent to returning clients; they decrypt them.
    ``sip_up_all`` (bool mask over clients) or ``sip_up`` (clients, samples)
        Encrypted partial inner products (all samples of the active clients,
        or only the needed ones); the server stores them.
    ``sip_again_all`` (bool mask over clients)
        The optional second SecureInnerProduct (stored, not summed).
    ``sip_sum`` (samples)
        Samples whose inner product the server sums over all holders.
    ``sip_down`` (clients, samples) or ``sip_down_all`` (bool mask over clients)
        Summed inner products sent back (all samples of the flagged clients with
        ``sip_down_all``, the ``cocoa`` rule); decrypted by the clients.
    ``dual_up`` (clients, samples)
        Encrypted dual steps of the drawn samples; the server adds every
        received ciphertext into the stored encrypted duals.
    ``dual_down`` (clients, samples) or ``dual_down_all`` (bool mask over clients)
        The new duals sent back; decrypted.
    ``totals`` (n_senders, n_values)
        A few encrypted scalars per client summed by the server and
        decrypted by one client (the safe rule's acceptance test, the
        ``cocoa`` rule's line search).
    ``proposals_up`` (clients, samples) or ``proposals_up_all`` (mask, samples)
        ``cocoa``: the drawn samples' proposed dual changes; encrypted and summed
        per sample by the server (not into the stored duals). ``proposals_up_all``:
        the flagged clients send every sample they hold (a full local pass);
        ``samples`` are the distinct samples.
    ``momentum_down`` (clients, samples)
        ``cocoa``: the previous dual steps sent to returning clients; decrypted.
    ``dual_commit`` (samples)
        ``cocoa``: the applied dual changes, encrypted by one active holder per
        sample and added into the stored duals.

    Layouts (see :mod:`hyfl.privacy.layout`): what the server stores stays in
    ``layout``; values summed within the round travel in the round's compact
    layout (``layout.round_layout`` of its draws): the inner products
    of ``sip_up`` (with ``sip_sum``, ``sip_down``), the cocoa rule's
    ``proposals_up`` and ``dual_down``, and the per-sample rules' dual steps
    when :func:`~hyfl.privacy.layout.compact_steps` chooses it -- then the
    server sums the steps instead of adding them into the stored duals, and
    one active holder per updated sample sends its dual's change in
    ``layout``, added into the stored duals.
    """
    enc = dec = add = up = down = 0
    draws = _round_draws(traffic)
    updated = None if draws is None else np.unique(np.asarray(draws[1], dtype=np.int64))
    compact = layout if draws is None else layout.round_layout(*draws)
    n = _chunks(layout, traffic, "refresh_down")
    down += n
    dec += n
    # Inner products of the drawn samples only are summed, never stored: compact.
    sip = compact if "sip_up" in traffic else layout
    # sip_again_all: the optional second SecureInnerProduct
    n = _chunks(sip, traffic, "sip_up") + _chunks(layout, traffic, "sip_again")
    up += n
    enc += n
    if "sip_sum" in traffic:
        chunks = sip.chunks_of(traffic["sip_sum"])
        add += int(np.sum(sip.holders_per_chunk(chunks) - 1))
    n = _chunks(sip, traffic, "sip_down")
    down += n
    dec += n
    duals = layout  # where the new duals (or the step sums) travel down
    if "dual_up" in traffic:
        clients, samples = traffic["dual_up"]
        if compact_steps(layout, traffic["dual_up"], traffic["dual_down"]):
            duals = compact
            n = compact.count_chunks(clients, samples)
            changes = int(layout.chunks_of(updated).size)
            up += n + changes
            enc += n + changes
            # The steps are summed (first kept, others added); the changes are
            # added into the stored duals.
            add += n - int(compact.chunks_of(updated).size) + changes
        else:
            n = layout.count_chunks(clients, samples)
            up += n
            enc += n
            add += n  # each received ciphertext is added into the stored duals
    if "proposals_up" in traffic:
        duals = compact
    n = _chunks(duals, traffic, "dual_down")
    down += n
    dec += n
    if "proposals_up" in traffic:
        clients, samples = traffic["proposals_up"]
        n = compact.count_chunks(clients, samples)
        up += n
        enc += n
        # The server sums each chunk's proposals: the first is kept, the others added.
        add += n - (int(compact.chunks_of(samples).size) if len(samples) else 0)
    if "proposals_up_all" in traffic:  # every flagged client sends all of its samples
        clients, samples = traffic["proposals_up_all"]
        n = _flagged_chunks(layout, clients)
        up += n
        enc += n
        add += n - (int(layout.chunks_of(samples).size) if len(samples) else 0)
    n = _chunks(layout, traffic, "momentum_down")
    down += n
    dec += n
    if "dual_commit" in traffic:
        n = int(layout.chunks_of(traffic["dual_commit"]).size) if len(traffic["dual_commit"]) else 0
        up += n
        enc += n
        add += n
    if "totals" in traffic:
        senders, values = traffic["totals"]
        per_sender = -(-values // layout.slots)
        up += senders * per_sender
        enc += senders * per_sender
        add += max(senders - 1, 0) * per_sender
        down += per_sender
        dec += per_sender
    return {
        "encryptions": enc,
        "decryptions": dec,
        "additions": add,
        "ciphertexts_up": up,
        "ciphertexts_down": down,
    }


def _round_draws(traffic: dict) -> tuple | None:
    """The round's draws, (client, sample) pairs (they define its compact layout)."""
    for key in ("dual_up", "proposals_up"):
        if key in traffic:
            return traffic[key]
    return None


def _chunks(layout, traffic: dict, key: str) -> int:
    """Ciphertext chunks of a message: the (clients, samples) pairs recorded under
    ``key``, plus every sample of the clients flagged under ``key + "_all"`` (a chunk
    covers one holder group, each of whose samples the client holds)."""
    n = layout.count_chunks(*traffic[key]) if key in traffic else 0
    if f"{key}_all" in traffic:
        n += _flagged_chunks(layout, traffic[f"{key}_all"])
    return n


def _flagged_chunks(layout, flags) -> int:
    """All the chunks of the clients flagged in ``flags`` (bool, shape (K,))."""
    return int(layout.client_chunks[np.asarray(flags, dtype=bool)].sum())
