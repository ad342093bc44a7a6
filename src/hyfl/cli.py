"""The ``hyfl`` command. It only parses flags and prints; the work is in
:mod:`hyfl.experiments`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from hyfl.errors import HyflError, fail

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Hybrid federated learning of linear models (HyFDCA and baselines).",
)
console = Console()

# Options shared by `run` and `compare`, declared once.
Data = Annotated[str, typer.Option(help="Dataset name (see `hyfl datasets`) or LIBSVM file.")]
Val = Annotated[str | None, typer.Option(help="Validation set: dataset name or file.")]
ValFraction = Annotated[float | None, typer.Option(help="Hold out this fraction for validation.")]
Loss = Annotated[str, typer.Option(help="hinge | logistic | squared | smoothed_hinge.")]
Lam = Annotated[float | None, typer.Option(help="Regularization (default: the dataset's).")]
PartitionOpt = Annotated[
    str,
    typer.Option(
        "--partition", help="horizontal:K | vertical:Q | grid:KxQ | nonzero:KxQ | quadrant:C."
    ),
]
ParticipationOpt = Annotated[
    str, typer.Option("--participation", help="full | fraction p | cyclic:C | trace:FILE.")
]
Iic = Annotated[float | None, typer.Option(help="Inner iterations constant: H = ceil(IIC N / K).")]
LocalSteps = Annotated[int | None, typer.Option(help="H (or Q for FedBCD): local steps.")]
StepRule = Annotated[str | None, typer.Option(help="HyFDCA step rule: safe | theory | paper.")]
RateA = Annotated[float | None, typer.Option("--a", help="FedAvg/HyFEM rate a/(b + sqrt t).")]
RateB = Annotated[float | None, typer.Option("--b", help="FedAvg/HyFEM rate a/(b + sqrt t).")]
Mu = Annotated[float | None, typer.Option(help="Proximal weight (HyFEM, FedPBCD, FedHybrid).")]
Eta0 = Annotated[float | None, typer.Option(help="FedBCD rate eta0 / sqrt(t + 1).")]
BatchSize = Annotated[int | None, typer.Option(help="FedBCD mini-batch size S.")]
Param = Annotated[
    list[str] | None,
    typer.Option(help="Any hyperparameter as KEY=VALUE, or ALGORITHM.KEY=VALUE; repeatable."),
]
Iterations = Annotated[int, typer.Option(help="Outer iterations.")]
EvalEvery = Annotated[int, typer.Option(help="Evaluate every N outer iterations.")]
Seed = Annotated[int, typer.Option(help="Seed for partition, participation and sampling.")]
DataDir = Annotated[str | None, typer.Option(help="Folder with dataset files.")]
Progress = Annotated[bool, typer.Option(help="Show a progress bar.")]


def _fail(err: HyflError) -> None:
    console.print(f"[bold red]error:[/] {err}")
    raise typer.Exit(code=2)


def _parse_params(params: list[str] | None) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in params or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--param {item!r}", "is not KEY=VALUE", "Write e.g. --param mu=0.1.")
        out[key.strip()] = _number_or_text(value.strip())
    return out


def _number_or_text(value: str) -> object:
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Folder for the outputs.")] = Path("hyfl-demo"),
    iterations: Iterations = 1500,
):
    """HyFDCA on a 3x3 hybrid grid of the bundled breast-cancer data, half the clients per round."""
    from hyfl.experiments.demo import DEMO_SPEC
    from hyfl.experiments.runner import execute

    spec = dataclasses.replace(DEMO_SPEC, iterations=iterations)
    console.print(
        f"[bold]hyfl demo[/]: {spec.algorithm} on [cyan]{spec.data}[/] ({spec.loss} loss), "
        f"partition {spec.partition}, participation {spec.participation}"
    )
    try:
        outcome = execute(spec, out, progress=True)
    except HyflError as err:
        _fail(err)
    _print_summary(outcome)


@app.command()
def run(
    algorithm: Annotated[str, typer.Option(help="See `hyfl algorithms`.")] = "hyfdca",
    data: Data = "breast_cancer",
    val: Val = None,
    val_fraction: ValFraction = None,
    loss: Loss = "hinge",
    lam: Lam = None,
    partition: PartitionOpt = "grid:3x3",
    participation: ParticipationOpt = "0.5",
    iic: Iic = None,
    local_steps: LocalSteps = None,
    step_rule: StepRule = None,
    a: RateA = None,
    b: RateB = None,
    mu: Mu = None,
    eta0: Eta0 = None,
    batch_size: BatchSize = None,
    param: Param = None,
    iterations: Iterations = 2000,
    eval_every: EvalEvery = 1,
    seed: Seed = 0,
    data_dir: DataDir = None,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("hyfl-run"),
    progress: Progress = True,
):
    """Run one federated training job; write DIR/metrics.csv, DIR/run.json and DIR/loss.png."""
    from hyfl.experiments.runner import RunSpec, execute

    try:
        hyper = _hyper(iic, local_steps, step_rule, a, b, mu, eta0, batch_size, param)
        spec = RunSpec(
            algorithm=algorithm,
            data=data,
            val=val,
            val_fraction=val_fraction,
            loss=loss,
            lam=lam,
            partition=partition,
            participation=participation,
            hyper=hyper,
            iterations=iterations,
            eval_every=eval_every,
            seed=seed,
            data_dir=data_dir,
        )
        outcome = execute(spec, out, progress=progress)
    except HyflError as err:
        _fail(err)
    _print_summary(outcome)


@app.command()
def compare(
    algorithms: Annotated[str, typer.Option(help="Comma-separated, e.g. hyfdca,fedavg,hyfem.")],
    data: Data = "breast_cancer",
    val: Val = None,
    val_fraction: ValFraction = None,
    loss: Loss = "hinge",
    lam: Lam = None,
    partition: PartitionOpt = "grid:3x3",
    participation: ParticipationOpt = "0.5",
    iic: Iic = None,
    local_steps: LocalSteps = None,
    step_rule: StepRule = None,
    a: RateA = None,
    b: RateB = None,
    mu: Mu = None,
    eta0: Eta0 = None,
    batch_size: BatchSize = None,
    param: Param = None,
    iterations: Iterations = 2000,
    eval_every: EvalEvery = 1,
    seed: Seed = 0,
    data_dir: DataDir = None,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("hyfl-compare"),
    progress: Progress = True,
):
    """Run several algorithms on one partition and participation trace; write a summary and plot.

    Shared flags apply to every algorithm that has the hyperparameter; use
    --param ALGORITHM.KEY=VALUE for one algorithm only (e.g. --param fedavg.iic=0.25).
    """
    from hyfl.experiments.runner import RunSpec, summary_rows
    from hyfl.experiments.runner import compare as run_compare

    try:
        hyper = _hyper(iic, local_steps, step_rule, a, b, mu, eta0, batch_size, param)
        names = [n.strip() for n in algorithms.split(",") if n.strip()]
        spec = RunSpec(
            algorithm=names[0] if names else "hyfdca",
            data=data,
            val=val,
            val_fraction=val_fraction,
            loss=loss,
            lam=lam,
            partition=partition,
            participation=participation,
            hyper=hyper,
            iterations=iterations,
            eval_every=eval_every,
            seed=seed,
            data_dir=data_dir,
        )
        outcomes = run_compare(spec, names, out, progress=progress)
    except HyflError as err:
        _fail(err)
    table = Table(title=f"{data}, {partition}, participation {participation}")
    rows = summary_rows(outcomes)
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    for row in rows:
        table.add_row(*[_cell(v) for v in row.values()])
    console.print(table)
    console.print(f"wrote {out}/summary.csv, summary.md, compare.png and one folder per algorithm")


@app.command()
def algorithms():
    """List the registered algorithms."""
    from hyfl.algorithms import ALGORITHMS

    table = Table("name", "what")
    for name, entry in ALGORITHMS.items():
        table.add_row(name, entry.summary)
    console.print(table)


@app.command()
def datasets():
    """List the named datasets."""
    from hyfl.data import DATASETS, default_lambda

    table = Table("name", "task", "paper lambda")
    for name, entry in DATASETS.items():
        lam = default_lambda(name)
        table.add_row(name, str(getattr(entry, "task", "")), f"{lam:g}" if lam else "-")
    console.print(table)


def _hyper(iic, local_steps, step_rule, a, b, mu, eta0, batch_size, param) -> dict:
    named = {
        "iic": iic,
        "local_steps": local_steps,
        "step_rule": step_rule,
        "a": a,
        "b": b,
        "mu": mu,
        "eta0": eta0,
        "batch_size": batch_size,
    }
    return {**{k: v for k, v in named.items() if v is not None}, **_parse_params(param)}


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _print_summary(outcome) -> None:
    s = outcome.summary
    final = s["final"]
    table = Table(title=f"{outcome.spec.algorithm} against the centralized optimum")
    table.add_column("")
    table.add_column(outcome.spec.algorithm, justify="right")
    table.add_column("centralized", justify="right")
    table.add_row("primal P(w)", f"{final['primal']:.6g}", f"{outcome.optimum_primal:.6g}")
    if final["dual"] == final["dual"]:  # primal-dual methods only
        table.add_row("dual D(alpha)", f"{final['dual']:.6g}", "")
        table.add_row("duality gap", f"{final['gap']:.3g}", "")
    table.add_row("relative loss", f"{final['relative_loss']:.3g}", "0")
    if s.get("best_val_accuracy") is not None:
        table.add_row(
            "val. accuracy (final)",
            f"{final['val_accuracy']:.4f}",
            f"{outcome.optimum_val_accuracy:.4f}",
        )
    table.add_row("outer iterations", f"{int(final['iteration'])}", "")
    table.add_row("round trips", f"{final['round_trips']:.1f}", "")
    table.add_row("median time per round", f"{1e3 * s['median_round_seconds']:.3f} ms", "")
    table.add_row("solver", "", outcome.optimum_method)
    console.print(table)
    if outcome.out_dir is not None:
        console.print(f"wrote {outcome.out_dir}/metrics.csv, run.json and loss.png")


if __name__ == "__main__":  # pragma: no cover
    app()
