"""What the ``hyfl`` commands print: result tables that fit the terminal.

Each table is built for the console's width; a table that cannot fit drops its
least important columns (``*_DROP``, in order) and says which, since
``summary.csv`` has them all. The commands in :mod:`hyfl.cli` call these
printers; nothing here runs or reads anything.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hyfl._format import format_bytes as _bytes
from hyfl._format import format_seconds as _seconds

console = Console(emoji=False)


def _natural_width(table: Table) -> int:
    """Columns ``table`` needs to show every cell whole (its width on an unbounded terminal)."""
    probe = Console(width=10_000, color_system=None, highlight=False)
    with probe.capture() as captured:
        probe.print(table)
    return max((len(line.rstrip()) for line in captured.get().splitlines()), default=0)


def _fitted(make, columns: list[str], drop_order: tuple[str, ...]) -> tuple[Table, list[str]]:
    """``make(columns)``, leaving out columns in ``drop_order`` until it fits the terminal.

    Numbers are never cut or wrapped (a cut ``0.0012`` reads as another number), so a
    table too wide for ``console.width`` loses its least important columns instead;
    the caller names them so the reader knows where to find them.
    """
    shown, dropped = list(columns), []
    table = make(shown)
    for name in drop_order:
        if _natural_width(table) <= console.width:
            break
        if name in shown:
            shown.remove(name)
            dropped.append(name)
            table = make(shown)
    return table, dropped


def _say_dropped(dropped: list[str], where: str) -> None:
    if dropped:
        console.print(
            f"[dim]left out at this terminal width: {escape(', '.join(dropped))} "
            f"(see {escape(where)})[/]"
        )


def name_column(table: Table, header: str) -> None:
    """A text column that folds a long name rather than cutting it to ``algorit…``."""
    table.add_column(header, overflow="fold", min_width=min(10, max(len(header), 4)))


def number_column(table: Table, header: str) -> None:
    # Whole numbers or nothing: a number split over two lines or cut with an ellipsis
    # misreads; tables that cannot fit drop columns instead (:func:`_fitted`).
    table.add_column(header, justify="right", no_wrap=True)


# Columns the summary tables leave out first when the terminal is narrow (all are in
# summary.csv): the stricter/looser thresholds and the smaller cost components.
_CONVERGENCE_DROP = ("rounds_to_auc_0.7", "rounds_to_auc_0.75", "rounds_to_auc_0.8",
                     "settled_acc_0.001", "rounds_to_acc_0.001", "settled_acc_0.01",
                     "settled_1e-3", "rounds_to_1e-1", "rounds_to_1e-3", "median_round_ms",
                     "round_trips", "settled_1e-2", "best_val_auc", "best_val_accuracy")


_COST_DROP = ("decryptions", "time_latency_per_iter", "time_server_per_iter", "bytes_down",
              "encryptions", "time_encryption_per_iter", "time_client_per_iter", "bytes_up")


_EXPERIMENT_DROP = ("settled_acc_0.01", "round_trips", "rounds_to_acc_0.01", "settled_1e-2",
                    "best_val_auc", "best_val_accuracy", "seeds")


def print_experiment(result) -> None:
    outcomes = getattr(result, "outcomes", None)
    if outcomes and outcomes[0].summary["engine"] == "neural":
        print_neural_summary(outcomes)
        return
    config = result.config
    title = (
        f"{config.name}: {config.data.dataset}, {config.partition.spec}, "
        f"participation {config.partition.participation}"
    )
    if len(config.seeds) == 1:
        print_comparison(result.rows, title, "simulated cost; seconds per outer iteration")
        return
    headers = {
        "final_relative_loss": "rel. loss",
        "best_val_accuracy": "best val. acc.",
        "best_val_auc": "best val. AUC",
        "settled_1e-2": "settled 1e-2",
        "rounds_to_acc_0.01": "first acc-1pt",
        "settled_acc_0.01": "settled acc-1pt",
        "round_trips": "round trips",
        "sim_time": "sim_time",
    }

    def make(shown: list[str]) -> Table:
        table = Table(
            title=f"{title}; mean ± std over seeds {list(config.seeds)}",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            pad_edge=False,
        )
        name_column(table, "algorithm")
        for column in shown:
            number_column(table, headers.get(column, column))
        for row in result.rows:
            cells = [row["algorithm"]]
            for column in shown:
                if column == "seeds":
                    cells.append(str(row["n_seeds"]))
                    continue
                # (.get: rows of results written before a column existed lack it)
                mean, std = row.get(f"{column}_mean"), row.get(f"{column}_std")
                cells.append(
                    "-"
                    if mean is None
                    else f"{_summary_cell(column, mean)} ± {_summary_cell(column, std)}"
                )
            table.add_row(*cells)
        return table

    table, dropped = _fitted(make, ["seeds", *headers], _EXPERIMENT_DROP)
    console.print(table)
    _say_dropped([headers.get(c, c) for c in dropped], "summary.csv")
    _say_levels([c for c in headers if c not in dropped])


def print_comparison(rows, title: str, cost_title: str) -> None:
    from hyfl.experiments.outputs import CONVERGENCE_COLUMNS, COST_SUMMARY_COLUMNS

    cost_columns = [c for c in COST_SUMMARY_COLUMNS if c != "engine"]
    for columns, caption, drop_order in [
        (CONVERGENCE_COLUMNS, title, _CONVERGENCE_DROP),
        (cost_columns, cost_title, _COST_DROP),
    ]:

        def make(shown: list[str], caption=caption) -> Table:
            table = Table(title=caption, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
            for column in shown:
                header = _HEADERS.get(column, column)
                if column == "algorithm":
                    name_column(table, header)
                else:
                    number_column(table, header)
            for row in rows:
                table.add_row(*[_summary_cell(c, row[c]) for c in shown])
            return table

        table, dropped = _fitted(make, list(columns), drop_order)
        console.print(table)
        _say_dropped([_HEADERS.get(c, c) for c in dropped], "summary.csv")
        if columns is CONVERGENCE_COLUMNS:
            _say_levels([c for c in columns if c not in dropped])


def _say_levels(shown: list[str]) -> None:
    """What the level columns of a convergence table mean (those shown)."""
    from hyfl.experiments.outputs import ACCURACY_MARGINS

    if not any(c.startswith(("rounds_to_", "settled_")) for c in shown):
        return
    margins = [m for m in ACCURACY_MARGINS
               if f"rounds_to_acc_{m:g}" in shown or f"settled_acc_{m:g}" in shown]
    words = ["first / settled: the first evaluated round at the level / the round from "
             "which every evaluation stays there"]
    if margins:
        words.append(", ".join(_accuracy_header(m) for m in margins) + ": training accuracy "
                     ">= the central model's minus " + ", ".join(f"{m:g}" for m in margins))
    console.print(f"[dim]{escape('; '.join(words))}[/]")


def _accuracy_header(margin: float) -> str:
    """``acc-1pt`` (the central model's accuracy minus 0.01), ``acc-.1pt`` (minus 0.001)."""
    points = f"{100 * margin:g}"
    return f"acc-{points[1:] if points.startswith('0.') else points}pt"


_HEADERS = {
    "final_relative_loss": "rel. loss",
    "best_val_accuracy": "best val. acc.",
    "best_val_auc": "best val. AUC",
    "rounds_to_1e-1": "first 1e-1",
    "rounds_to_1e-2": "first 1e-2",
    "rounds_to_1e-3": "first 1e-3",
    "settled_1e-2": "settled 1e-2",
    "settled_1e-3": "settled 1e-3",
    "rounds_to_auc_0.7": "first AUC 0.7",
    "rounds_to_auc_0.75": "first AUC 0.75",
    "rounds_to_auc_0.8": "first AUC 0.8",
    "rounds_to_acc_0.01": "first acc-1pt",
    "settled_acc_0.01": "settled acc-1pt",
    "rounds_to_acc_0.001": "first acc-.1pt",
    "settled_acc_0.001": "settled acc-.1pt",
    "round_trips": "round trips",
    "median_round_ms": "wall ms/round",
    "bytes_up": "up",
    "bytes_down": "down",
    "encryptions": "enc.",
    "decryptions": "dec.",
    "time_client_per_iter": "client",
    "time_server_per_iter": "server",
    "time_latency_per_iter": "latency",
    "time_encryption_per_iter": "HE",
}


def _summary_cell(column: str, value) -> str:
    if value is None or value != value:
        return "-"
    if column.startswith("bytes_"):
        return _bytes(value)
    if column == "sim_time" or column.endswith("_per_iter"):
        return _seconds(value)
    if column in ("encryptions", "decryptions"):
        return f"{int(value):,}"
    return _cell(value)


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def algorithm_options(entry) -> list[tuple[str, str]]:
    """An algorithm's options (hyperparameters) and their defaults, read from its dataclass.

    ``entry`` is an :class:`~hyfl.algorithms.AlgorithmEntry`: its class's fields
    in declaration order (``name`` left out), each with the entry's preset
    value if it has one, else the field's default; ``None`` shows as ``auto``
    (the algorithm chooses from the data or its other options).
    """
    import dataclasses

    options = []
    for f in dataclasses.fields(entry.cls):
        if f.name == "name" or not f.init:
            continue
        if f.name in entry.preset:
            value = entry.preset[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = "required"
        options.append((f.name, _option_value(value)))
    return options


def _option_value(value) -> str:
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_option_value(v) for v in value) + ")"
    return str(value)


def print_summary(outcome) -> None:
    s = outcome.summary
    final = s["final"]
    # The solver's name (up to 49 characters) goes in the caption, which wraps: in a
    # column it would squeeze the row names at 80 columns.
    from hyfl.runtime.progress import reported_model

    # Which model the numbers are of: the engines report the best certified pair seen.
    table = Table(title=f"{outcome.spec.algorithm} against the centralized optimum",
                  caption=f"model reported: {reported_model(final)}; "
                  f"centralized optimum: {outcome.optimum_method}; rounds to: the first "
                  "evaluated round at the level (and the round from which it stays there); "
                  "acc-1pt, acc-.1pt: the central model's training accuracy minus 0.01, 0.001")
    table.add_column("", no_wrap=True)
    number_column(table, outcome.spec.algorithm)
    number_column(table, "centralized")
    table.add_row("primal P(w)", f"{final['primal']:.6g}", f"{outcome.optimum_primal:.6g}")
    if final["dual"] == final["dual"]:  # primal-dual methods only
        table.add_row("dual D(alpha)", f"{final['dual']:.6g}", "")
        table.add_row("duality gap", f"{final['gap']:.3g}", "")
    table.add_row("relative loss", f"{final['relative_loss']:.3g}", "0")
    central = s.get("optimum", {})

    def number(value) -> str:
        return "" if value is None or value != value else f"{value:.4f}"

    # Accuracy and AUC beside the central model's, and the majority class's rate (the
    # accuracy of a model that learned nothing); AP: average precision.
    # (short labels: the table must fit 80 columns beside the solver's name)
    for split, majority in (("train", s.get("majority_rate")),
                            ("val", s.get("val_majority_rate"))):
        name = "train" if split == "train" else "val."
        if number(final.get(f"{split}_accuracy")):
            reference = number(central.get(f"{split}_accuracy"))
            if majority is not None:
                reference += f" (majority class {number(majority)})"
            table.add_row(f"accuracy ({name})", number(final[f"{split}_accuracy"]), reference)
        if number(final.get(f"{split}_auc")):
            table.add_row(f"AUC ({name})", number(final[f"{split}_auc"]),
                          number(central.get(f"{split}_auc")))
    if number(final.get("val_ks")):
        table.add_row("KS / AP (val.)",
                      f"{final['val_ks']:.4f} / {final['val_average_precision']:.4f}", "")
    # Rounds to the relative loss levels and to the central model's training accuracy
    # (less 1 and 0.1 point): the first evaluated round there, and where it settled.
    def rounds(first, settled) -> str:
        def one(value) -> str:
            return "-" if value is None or value != value else f"{int(value)}"
        if first is None or first != first:
            return "not reached"
        return f"{one(first)} (settled {one(settled)})"

    reach, settled = s.get("rounds_to_relative_loss", {}), s.get("settled_at_relative_loss", {})
    for level in ("0.01", "0.001"):
        if level in reach:
            table.add_row(f"rounds to {float(level):.0e}".replace("e-0", "e-"),
                          rounds(reach[level], settled.get(level)), "")
    from hyfl.experiments.outputs import ACCURACY_MARGINS, accuracy_reach

    accuracy = accuracy_reach(outcome)
    central_accuracy = central.get("train_accuracy")
    for m in ACCURACY_MARGINS:
        first = accuracy[f"rounds_to_acc_{m:g}"]
        if number(central_accuracy) and number(final.get("train_accuracy")):
            table.add_row(f"rounds to {_accuracy_header(m)}",
                          rounds(first, accuracy[f"settled_acc_{m:g}"]),
                          f"acc. {number(central_accuracy - m)} (train)")
    table.add_row("outer iterations", f"{int(final['iteration'])}", "")
    table.add_row("round trips", f"{final['round_trips']:g}", "")
    # The one time per round of this table: measured; the simulated cost is below.
    table.add_row("wall time / round", f"{1e3 * s['median_round_seconds']:.3f} ms", "")
    console.print(table)
    if s.get("shared_ids"):
        shared = ", ".join(f"{party} {n}" for party, n in s["shared_ids"].items())
        console.print(f"sample IDs shared with another party: {shared}")
    if outcome.out_dir is not None:
        model = ", model.npz" if getattr(outcome, "model", None) is not None else ""
        console.print(
            f"wrote {outcome.out_dir}/metrics.csv, metrics.parquet, run.json{model} and loss.png"
        )


def print_neural_summary(outcomes) -> None:
    """The table of neural runs: accuracy of the global and local models, traffic."""
    from hyfl.neural.runner import summary_rows

    table = Table(title="neural runs (validation = the data's test split)")
    table.add_column("", overflow="fold")
    for o in outcomes:
        number_column(table, o.summary["algorithm"])
    rows = summary_rows(outcomes)
    shown = {
        "final_val_accuracy": ("val. accuracy (final, global)", "{:.4f}"),
        "best_val_accuracy": ("val. accuracy (best)", "{:.4f}"),
        "final_local_val_accuracy": ("local models' val. accuracy", "{:.4f}"),
        "final_val_auc": ("val. AUC (final, global)", "{:.4f}"),
        "rounds_to_0.95": ("first round at 0.95", "{:.0f}"),
        "final_loss": ("training loss", "{:.4g}"),
        "round_trips": ("round trips", "{:,.0f}"),
    }
    for key, (label, form) in shown.items():
        table.add_row(label, *(_maybe(form, r[key]) for r in rows))
    table.add_row("bytes up", *(_bytes(r["bytes_up"]) for r in rows))
    table.add_row("bytes down", *(_bytes(r["bytes_down"]) for r in rows))
    table.add_row("wall time per round (median)", *(_seconds(r["median_round_s"]) for r in rows))
    console.print(table)
    folders = ", ".join(str(o.out_dir) for o in outcomes if o.out_dir is not None)
    if folders and len(outcomes) == 1:
        console.print(f"wrote {folders} (metrics.csv, run.json, participation.csv, model.npz, "
                      "accuracy.png)")


def _maybe(form: str, value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return form.format(value)


def print_costs(outcome) -> None:
    s = outcome.summary
    costs = s["costs"]
    per, totals = costs["per_iteration"], costs["totals"]
    iterations = int(s["final"]["iteration"])
    he = outcome.result.config.get("costs", {}).get("he_costs", {})
    caption = f"HE operations priced by: {he.get('source', outcome.spec.he_costs)}"
    if "he_seconds_measured" in costs:
        caption += (
            f". The real cryptography of this run took {_seconds(costs['he_seconds_measured'])} "
            "of compute; sim_time charges its operations at the per-operation costs above instead"
        )
    title = (f"simulated cost ({s['engine']} engine, cipher {s['cipher']}, "
             f"latency {outcome.spec.latency:g} s)")
    # As wide as the title where the terminal allows, so the title is not wrapped
    # between a number and its unit.
    table = Table(title=title, caption=caption, min_width=min(len(title), console.width))
    table.add_column("", overflow="fold")
    number_column(table, "per iteration")
    number_column(table, f"total ({iterations} it.)")
    number_column(table, "share")
    labels = {
        "time_client": "client compute",
        "time_server": "server compute",
        "time_latency": "latency",
        "time_encryption": "encryption",
    }
    total_time = per["sim_time"]
    for key, label in labels.items():
        share = f"{per[key] / total_time:.1%}" if total_time > 0 else "-"
        table.add_row(label, _seconds(per[key]), _seconds(per[key] * iterations), share)
    table.add_row("[bold]sim_time[/]", _seconds(total_time), _seconds(totals["sim_time"]), "")
    table.add_section()
    table.add_row("bytes up", "", _bytes(totals["bytes_up"]), "")
    table.add_row("bytes down", "", _bytes(totals["bytes_down"]), "")
    for key in ("encryptions", "decryptions", "additions"):
        table.add_row(key, "", f"{int(totals[key]):,}", "")
    table.add_row("round trips", "", f"{totals['round_trips']:.1f}", "")
    console.print(table)
