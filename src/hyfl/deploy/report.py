"""What a deployed run reports: a line per round, a summary table, and whether it learned.

``hyfl deploy local`` and ``hyfl deploy run`` follow their job through the
``deploy.json`` the coordinator rewrites after every round
(:func:`hyfl.deploy.local.wait_for_results`) and show each round as it ends
(:class:`RoundDisplay`: a live progress line on a terminal, plain lines
otherwise). At the end they print :func:`summary_table` of :func:`summarize`
and judge the run with :func:`judge_progress`: a run in which no round was
accepted, or whose objective did not fall, ends with exit code
:data:`NO_PROGRESS_EXIT` and a message saying what to change -- its results
are written all the same.

What is known where: the coordinator has no data, so ``deploy.json`` tells
the rounds' verdicts, participants, seconds and bytes, but not the objective.
``hyfl deploy local`` has all the data on its machine and evaluates the
objective of every round's ``w``; for ``hyfl deploy run`` only "no round was
accepted" (or nobody took part) can be judged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyfl._format import format_bytes, format_seconds
from hyfl.algorithms.step_rules import RULES, StepRule

__all__ = [
    "NO_PROGRESS_EXIT",
    "Judgement",
    "RoundDisplay",
    "judge_progress",
    "objective_shape",
    "round_line",
    "summarize",
    "summary_table",
]

NO_PROGRESS_EXIT = 3
"""Exit code of a run that completed without learning (1: the run failed, 2: bad input)."""


# ----------------------------------------------------------------------------- judgement


@dataclass(frozen=True)
class Judgement:
    """Whether a deployed run learned; if not, what happened and what to change.

    Attributes
    ----------
    progressed : bool
    reason : str
        What went wrong ("" if the run progressed).
    advice : str
        What to change, naming the options ("" if the run progressed).
    """

    progressed: bool
    reason: str = ""
    advice: str = ""

    def message(self) -> str:
        """One paragraph for the user ("" if the run progressed)."""
        return "" if self.progressed else f"no progress: {self.reason}. {self.advice}"


def judge_progress(results: Mapping[str, Any],
                   relative_loss: Sequence[float] | None = None) -> Judgement:
    """Judge whether a deployed run learned.

    A run has not progressed if no party took part in any round, if no
    round was accepted, or -- when the objective is known -- if no round's
    weights were better than the zero model it started from (``hyfl deploy
    local`` keeps the best weights seen, so a run that went below the start
    and came back up still returns a model better than nothing). A run that
    did not progress is told apart by the shape of its objective: *rising*
    (the last round's objective is the highest after the start: the rule is
    moving away from the optimum), an *overshoot* (it rose above the start
    and has been falling since its peak: more rounds will bring it down), or
    flat.

    Parameters
    ----------
    results : mapping
        The run's ``deploy.json`` (its ``config`` and ``rounds``).
    relative_loss : sequence of float, optional
        Relative loss of the server's ``w`` at the start (index 0, ``w = 0``)
        and after each round; known only where the data are (``hyfl deploy
        local``).

    Returns
    -------
    Judgement
        The advice names the command-line options of ``hyfl deploy local``
        and ``hyfl deploy run`` (the same for both).
    """
    rounds = list(results.get("rounds", []))
    config = results.get("config", {})
    rule = _step_rule(config)
    participation = str(config.get("participation", "full"))
    T = len(rounds)
    more = f"--iterations {max(2 * T, 10)}"
    if T == 0:
        return Judgement(False, "no round ran", "Pass --iterations 1 or more.")
    taken = [r for r in rounds if r.get("active")]
    if not taken:
        absent = sorted({k for r in rounds for k in r.get("absent", [])})
        if absent:
            advice = (f"Part{'ies' if len(absent) > 1 else 'y'} "
                      f"{', '.join(map(str, absent))} did not answer within the reply timeout: "
                      "check their SuperNodes and logs, or raise --reply-timeout.")
        else:
            advice = (f"The participation schedule ({participation}) left every party out: "
                      f"use --participation full or a larger fraction, or run more rounds "
                      f"({more}).")
        return Judgement(False, f"no party took part in any of the {T} rounds", advice)
    accepted = [r for r in taken if r.get("accepted")]
    if not accepted:
        advice = _rule(rule).advice("rejected", more=more, participation=participation)
        return Judgement(False, f"no round was accepted (all {len(taken)} rounds with parties "
                         f"were rejected by the {rule} rule's test)", advice)
    if relative_loss is None or len(relative_loss) < 2:
        return Judgement(True)
    trace = np.asarray(relative_loss, dtype=float)
    start, end = float(trace[0]), float(trace[-1])
    finite = trace[np.isfinite(trace)]
    if finite.size and float(finite.min()) < start:
        return Judgement(True)
    shape = objective_shape(trace)
    peak = 1 + int(np.nanargmax(trace[1:])) if np.isfinite(trace[1:]).any() else T
    reason = {
        "not finite": "the objective is not finite",
        "rising": "the objective is rising (the last round's is the highest since the start)",
        "overshoot": (f"the objective overshot and is falling again (highest at round {peak}: "
                      f"{float(trace[peak]):.3g})"),
    }.get(shape, "the objective did not fall")
    reason += (f": relative loss {start:.3g} at the start, {end:.3g} after {T} "
               f"round{'s' if T > 1 else ''} ({len(accepted)} accepted)")
    advice = _rule(rule).advice("rising" if shape == "rising" else "not falling", more=more,
                                    participation=participation)
    hyper = config.get("hyper", {})
    if isinstance(hyper, Mapping) and str(hyper.get("gamma", 1)) not in ("1", "1.0"):
        advice += " gamma below 1 shrinks every step (--param gamma=1)."
    if participation != "full":
        advice += (f" With --participation {participation} only some parties work in each "
                   "round; --participation full learns faster per round.")
    return Judgement(False, reason, advice)


def _rule(name: str) -> StepRule:
    """The rule of that name; an unknown one (another version's) gets the general advice."""
    return RULES.get(name) or StepRule(name)


def _step_rule(config: Mapping[str, Any]) -> str:
    algorithm = config.get("algorithm")
    if isinstance(algorithm, Mapping) and algorithm.get("step_rule"):
        return str(algorithm["step_rule"])
    hyper = config.get("hyper")
    if isinstance(hyper, Mapping) and hyper.get("step_rule"):
        return str(hyper["step_rule"])
    from hyfl.algorithms.hyfdca import HyFDCA

    return HyFDCA().step_rule  # what an empty hyper runs


def objective_shape(relative_loss: Sequence[float]) -> str:
    """How a run's objective moved: ``"not finite"``, ``"improved"`` (below the start at
    some round), ``"rising"`` (never below the start and the last round the highest since
    it), ``"overshoot"`` (above the start, and lower at the end than at its peak) or
    ``"flat"`` (never away from the start).

    ``relative_loss`` holds the start (index 0) and one value per round.
    """
    trace = np.asarray(relative_loss, dtype=float)
    if trace.size == 0 or not np.all(np.isfinite(trace)):
        return "not finite"
    start, after = float(trace[0]), trace[1:]
    if after.size == 0 or float(after.max()) <= start:
        return "improved" if after.size and float(after.min()) < start else "flat"
    if float(after.min()) < start:
        return "improved"
    return "rising" if float(after[-1]) >= float(after.max()) else "overshoot"


# ----------------------------------------------------------------------------- summary

_COUNTS = ("encryptions", "decryptions", "additions")


def summarize(results: Mapping[str, Any], relative_loss: Sequence[float] | None = None,
              comparison: Mapping[str, Any] | None = None, *,
              round_relative_loss: Sequence[float] | None = None,
              model_round: int | None = None) -> dict[str, Any]:
    """The numbers of a deployed run's summary (set-up excluded, as in ``metrics.csv``).

    Parameters
    ----------
    results : mapping
        The run's ``deploy.json``.
    relative_loss : sequence of float, optional
        At the start and after each round (``hyfl deploy local``).
    comparison : mapping, optional
        :func:`hyfl.deploy.local.compare_with_protocol`'s result (``--compare``).
    round_relative_loss : sequence of float, optional
        Of each round's own ``w`` (the start included), where ``relative_loss`` is
        of the model reported (the best ``w`` seen, of round ``model_round``).
    model_round : int, optional
        The round whose ``w`` is the model reported (0: the zero model of the start).

    Returns
    -------
    dict
        ``parties``, ``cipher``, ``step_rule``, ``rounds``, ``accepted``,
        ``absences``, ``relative_loss_start`` and ``relative_loss_final``
        (None if unknown), ``model_round`` and ``relative_loss_last_round`` (the
        last round's own ``w``; None if unknown), ``round_seconds_median``, ``seconds_total``,
        ``payload_bytes_up``/``down`` (measured messages),
        ``bytes_up``/``down`` (HyFDCA's count, as the engines'), the HE
        operation counts, and ``comparison``.
    """
    rounds = list(results.get("rounds", []))
    seconds = [float(r.get("round_seconds", np.nan)) for r in rounds]
    known = relative_loss is not None and len(relative_loss) > 0

    def total(key: str) -> float:
        return float(sum(float(r.get(key, 0) or 0) for r in rounds))

    return {
        "parties": len(results.get("parties", {})) or results.get("config", {}).get("parties"),
        "cipher": (results.get("cipher") or {}).get("name", results.get("config", {})
                                                      .get("cipher")),
        "step_rule": _step_rule(results.get("config", {})),
        "rounds": len(rounds),
        "accepted": sum(bool(r.get("accepted")) and bool(r.get("active")) for r in rounds),
        "absences": sum(len(r.get("absent", [])) for r in rounds),
        "relative_loss_start": float(relative_loss[0]) if known else None,
        "relative_loss_final": float(relative_loss[-1]) if known else None,
        "model_round": None if model_round is None else int(model_round),
        "relative_loss_last_round": (float(round_relative_loss[-1]) if round_relative_loss
                                     is not None and len(round_relative_loss) else None),
        "round_seconds_median": float(np.median(seconds)) if seconds else None,
        "seconds_total": (results.get("seconds") or {}).get("total"),
        **{key: total(key) for key in ("payload_bytes_up", "payload_bytes_down", "bytes_up",
                                       "bytes_down", *_COUNTS)},
        "comparison": dict(comparison) if comparison else None,
    }


def summary_table(summary: Mapping[str, Any]):
    """A Rich table of :func:`summarize`'s numbers; an ``in-process`` column with --compare.

    Laid out like ``hyfl run``'s summary: one row per quantity, the
    deployment's value, and with a comparison ``run_protocol``'s value for
    the same seed and keys.
    """
    from rich.table import Table

    c = summary.get("comparison")
    caption = "sent: the messages as measured; HyFDCA's count: as the engines count"
    if c is not None:
        caption += "; in-process: run_protocol, same seed, keys and parties"
    table = Table(title=f"hyfdca on Flower, {summary['parties']} parties", caption=caption)
    # Labels wrap; values never (a number cut or split over two lines misreads).
    table.add_column("", overflow="fold")
    table.add_column("deployed", justify="right", no_wrap=True)
    if c is not None:
        table.add_column("in-process", justify="right", no_wrap=True)

    def row(label: str, deployed: str, in_process: str = "") -> None:
        table.add_row(label, deployed, *([in_process] if c is not None else []))

    def count(value) -> str:
        return "-" if value is None else f"{int(value):,}"

    row("step rule, cipher", f"{summary['step_rule']}, {summary['cipher']}")
    row("rounds (accepted)", f"{summary['rounds']} ({summary['accepted']})",
        "" if c is None else f"{c.get('rounds', '-')} ({c.get('protocol_accepted', '-')})")
    if summary["absences"]:
        row("absences (party-rounds)", str(summary["absences"]))
    start, final = summary["relative_loss_start"], summary["relative_loss_final"]
    if final is not None:
        # Which model: the best w seen (what model.npz holds), not the last round's.
        kept = summary.get("model_round")
        label = ("relative loss" if kept is None else
                 f"relative loss (best w: {_whose(kept)})")
        row(label, f"{start:.3g} -> {final:.3g}",
            "" if c is None or c.get("protocol_relative_loss") is None
            else f"{start:.3g} -> {c['protocol_relative_loss']:.3g}")
        last = summary.get("relative_loss_last_round")
        if last is not None and kept is not None and kept != summary["rounds"]:
            row("relative loss, last round's w", f"{last:.3g}")
    row("s per round (median)", format_seconds(summary["round_seconds_median"]),
        "" if c is None else format_seconds(c.get("protocol_round_seconds_median")))
    if summary.get("seconds_total") is not None:
        row("total, with set-up", format_seconds(summary["seconds_total"]))
    table.add_section()
    row("bytes up (sent)", format_bytes(summary["payload_bytes_up"]))
    row("bytes down (sent)", format_bytes(summary["payload_bytes_down"]))
    totals = (c or {}).get("protocol_totals", {})
    for key, label in (("bytes_up", "bytes up (HyFDCA's count)"),
                       ("bytes_down", "bytes down (HyFDCA's count)")):
        row(label, format_bytes(summary[key]),
            format_bytes(totals[key]) if key in totals else "")
    table.add_section()
    for key in _COUNTS:
        row(key, count(summary[key]), count(totals.get(key)) if totals else "")
    if c is not None:
        table.add_section()
        row("max |w difference|", "", f"{c['max_abs_weight_difference']:.3g}")
    return table


# ----------------------------------------------------------------------------- per round


def round_line(record: Mapping[str, Any], *, total: int | None = None,
               relative_loss: float | None = None, show_loss: bool = False) -> str:
    """One round of a deployed run as a line of plain text.

    ``round 3/5  parties 0,1,3  absent 2  accepted  rel. loss 3.58 (this round's w;
    reported: round 2's, 3.41, no better w since)  round start: gap 0.12, acc. 0.912
    31.2 s  up 1.2 MB  down 3.4 MB`` -- the parties that took part, those the schedule
    chose but that did not answer (absent), the verdict of the step rule's test
    (``no parties`` when nobody took part), the relative loss of the round's own
    ``w`` (with ``show_loss``; ``-`` when not known) and, when the record has a
    ``reported`` entry (``{"round": r, "relative_loss": x}``, what ``hyfl deploy
    local`` reports: the best ``w`` seen), which model is reported and why it is
    an earlier round's; then the duality gap and accuracy that the parties'
    secure sums certify (where they are exact) -- of the ``w`` the round *started*
    from, not of its result --, the round's wall time and the measured bytes of its
    messages; ``N attempts`` when the round was restarted after an absence.

    An accepted round is one whose step the rule's test let through; the cocoa
    rule explores ahead of what it certifies, so its ``w`` may get worse for a
    while although every round is accepted: the reported model never does.
    """
    t = int(record["iteration"])
    width = len(str(total)) if total else 0
    parts = [f"round {t:>{width}}/{total}" if total else f"round {t}"]
    active, absent = record.get("active", []), record.get("absent", [])
    parts.append(f"parties {','.join(map(str, active)) or '-'}")
    parts.append(f"absent {','.join(map(str, absent)) or '-'}")
    parts.append(_verdict(record))
    if show_loss:
        known = relative_loss is not None and math.isfinite(relative_loss)
        loss = f"rel. loss {relative_loss:.3g}" if known else "rel. loss -"
        reported = record.get("reported")
        if reported is not None:
            loss += f" ({_reported(t, reported)})"
        parts.append(loss)
    certificate = record.get("certificate")
    if certificate:  # the round start's, from the parties' secure sums
        start = f"round start: gap {certificate['gap']:.3g}"
        if "accuracy" in certificate:
            start += f", acc. {certificate['accuracy']:.3f}"
        parts.append(start)
    parts.append(format_seconds(record.get("round_seconds")))
    parts.append(f"up {format_bytes(float(record.get('payload_bytes_up', 0)))}")
    parts.append(f"down {format_bytes(float(record.get('payload_bytes_down', 0)))}")
    if int(record.get("attempts", 1)) > 1:
        parts.append(f"{record['attempts']} attempts")
    return "  ".join(parts)


def _whose(round_: int) -> str:
    """``round 3's`` (``the start's`` for round 0, the zero model)."""
    return "the start's" if int(round_) == 0 else f"round {int(round_)}'s"


def _reported(t: int, reported: Mapping[str, Any]) -> str:
    """Which model a deployed round reports beside its own ``w``, and why an earlier one."""
    kept = int(reported["round"])
    if kept == t:
        return "this round's w, reported"
    value = reported.get("relative_loss")
    value = "" if value is None or not math.isfinite(value) else f", {value:.3g}"
    zero = " (w = 0)" if kept == 0 else ""
    return f"this round's w; reported: {_whose(kept)}{zero}{value}, no better w since"


def _verdict(record: Mapping[str, Any]) -> str:
    if not record.get("active"):
        return "no parties"
    return "accepted" if record.get("accepted") else "rejected"


class RoundDisplay:
    """Shows each round of a deployed run as it ends.

    On a terminal: a live progress bar (rounds done, the latest verdict and
    relative loss, elapsed time) with one line per finished round above it.
    Elsewhere (a pipe, a log file, the tests): the same lines, plain, one per
    round.

    Parameters
    ----------
    console : rich.console.Console
    total : int
        Rounds the job runs.
    show_loss : bool, default False
        Whether the relative loss is known (``hyfl deploy local``).

    Use it as a context manager and pass :meth:`show` as the per-round callback.
    """

    def __init__(self, console, total: int, *, show_loss: bool = False):
        self.console, self.total, self.show_loss = console, int(total), show_loss
        self._progress = None

    def __enter__(self) -> RoundDisplay:
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]rounds"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                console=self.console, transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("rounds", total=self.total, status="")
        return self

    def show(self, record: Mapping[str, Any], relative_loss: float | None = None) -> None:
        """Show one finished round (a record of ``deploy.json``'s ``rounds``)."""
        line = round_line(record, total=self.total, relative_loss=relative_loss,
                          show_loss=self.show_loss)
        if self._progress is None:
            # Plain: no markup, no highlighting, no wrapping (one record per line).
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        style = ("yellow" if not record.get("active") or not record.get("accepted") else
                 "red" if record.get("absent") else "")
        self._progress.console.print(line, style=style or None, markup=False, highlight=False,
                                     soft_wrap=True)
        status = _verdict(record)
        if self.show_loss and relative_loss is not None and math.isfinite(relative_loss):
            status += f", rel. loss {relative_loss:.3g}"
            reported = record.get("reported")
            if reported is not None and int(reported["round"]) != int(record["iteration"]):
                value = reported.get("relative_loss")
                status += f" (reported: {_whose(reported['round'])}" + (
                    f", {value:.3g})" if value is not None and math.isfinite(value) else ")")
        self._progress.update(self._task, completed=int(record["iteration"]), status=status)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None
