"""The ``hyfl`` command. It only parses flags and prints; the work is in
:mod:`hyfl.experiments`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from hyfl.errors import HyflError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Hybrid federated learning of linear models (HyFDCA and friends).",
)
console = Console()


def _fail(err: HyflError) -> None:
    console.print(f"[bold red]error:[/] {err}")
    raise typer.Exit(code=2)


@app.command()
def demo(
    out: Path = typer.Option(Path("hyfl-demo"), help="Folder for metrics.csv, run.json, loss.png."),
    iterations: int = typer.Option(1500, help="Outer iterations."),
):
    """HyFDCA on a 3x3 hybrid grid of the bundled breast-cancer data, half the clients per round."""
    from hyfl.experiments.demo import DEMO_SPEC
    from hyfl.experiments.runner import execute

    spec = DEMO_SPEC.__class__(**{**DEMO_SPEC.__dict__, "iterations": iterations})
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
    algorithm: str = typer.Option("hyfdca", help="Algorithm: hyfdca."),
    data: str = typer.Option(
        "breast_cancer", help="Dataset name (see `hyfl datasets`) or LIBSVM file."
    ),
    val: str | None = typer.Option(None, help="Validation set: dataset name or file."),
    val_fraction: float | None = typer.Option(None, help="Hold out this fraction for validation."),
    loss: str = typer.Option("hinge", help="hinge | logistic | squared | smoothed_hinge."),
    lam: float | None = typer.Option(
        None, help="Regularization (default: the dataset's, else 1e-4)."
    ),
    partition: str = typer.Option(
        "grid:3x3", help="horizontal:K | vertical:Q | grid:KxQ | nonzero:KxQ | quadrant:C."
    ),
    participation: str = typer.Option("0.5", help="full | fraction p | cyclic:C | trace:FILE."),
    iic: float | None = typer.Option(
        None, help="Inner iterations constant: H = ceil(IIC N / clients)."
    ),
    local_steps: int | None = typer.Option(None, help="H, local dual steps per client and round."),
    step_rule: str = typer.Option("safe", help="safe | theory | paper."),
    refresh_inner_products: bool = typer.Option(
        False, help="Run the second SecureInnerProduct each round (the paper skips it)."
    ),
    iterations: int = typer.Option(2000, help="Outer iterations."),
    eval_every: int = typer.Option(1, help="Evaluate every N outer iterations."),
    seed: int = typer.Option(0, help="Seed for partition, participation and sampling."),
    data_dir: str | None = typer.Option(None, help="Folder with dataset files."),
    out: Path = typer.Option(Path("hyfl-run"), help="Output folder."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
):
    """Run one federated training job and write DIR/metrics.csv, DIR/run.json and DIR/loss.png."""
    from hyfl.experiments.runner import RunSpec, execute

    try:
        spec = RunSpec(
            algorithm=algorithm,
            data=data,
            val=val,
            val_fraction=val_fraction,
            loss=loss,
            lam=lam,
            partition=partition,
            participation=participation,
            iic=iic,
            local_steps=local_steps,
            step_rule=step_rule,
            refresh_inner_products=refresh_inner_products,
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
def datasets():
    """List the named datasets and where their files are looked for."""
    from hyfl.data import DATASETS, default_lambda

    table = Table("name", "task", "paper lambda")
    for name, entry in DATASETS.items():
        lam = default_lambda(name)
        table.add_row(name, str(getattr(entry, "task", "")), f"{lam:g}" if lam else "-")
    console.print(table)


def _print_summary(outcome) -> None:
    s = outcome.summary
    final = s["final"]
    table = Table(title="HyFDCA against the centralized optimum")
    table.add_column("")
    table.add_column(outcome.spec.algorithm, justify="right")
    table.add_column("centralized", justify="right")
    table.add_row("primal P(w)", f"{final['primal']:.6g}", f"{outcome.optimum_primal:.6g}")
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
