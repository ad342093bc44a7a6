"""The ``hyfl`` command. It only parses flags and prints; the work is in
:mod:`hyfl.experiments`."""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.markup import escape
from rich.table import Table

from hyfl._format import format_seconds as _seconds
from hyfl._names import (
    ALGORITHM_NAMES,
    CLASS_WEIGHTS,
    DEFAULT_HE_COSTS,
    DEFAULT_HE_LAYOUT,
    HE_COST_SOURCES,
    LOSS_NAMES,
    REPORT_FORMATS,
    STEP_RULES,
)
from hyfl._names import CIPHER_NAMES as CIPHERS
from hyfl._threads import THREADS_VARIABLE
from hyfl.cli_tables import (
    console,
    name_column,
    number_column,
    print_comparison,
    print_costs,
    print_experiment,
    print_neural_summary,
    print_summary,
)
from hyfl.deploy.cli import app as deploy_app
from hyfl.errors import HyflError, fail

app = typer.Typer(
    add_completion=True,  # --install-completion: the shell completes choices
    no_args_is_help=True,
    help="Hybrid federated learning of linear models (HyFDCA and baselines).",
    # A traceback's locals can hold key material and data ids: never print them.
    pretty_exceptions_show_locals=False,
)
# No emoji codes: an error quoting a user's text shows ":x:" as typed.


def _show_version(value: bool) -> None:
    if value:
        from hyfl import __version__

        console.print(f"hyfl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print hyfl's version and exit.",
        ),
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            help="Threads for hyfl's own parallel work (a HyFDCA round's clients, the packed "
            "cipher); default: every core. Results do not depend on it.",
        ),
    ] = None,
) -> None:
    """Hybrid federated learning of linear models (HyFDCA and baselines)."""
    if threads is not None:  # for this process and every process it starts
        os.environ[THREADS_VARIABLE] = str(threads)


def _choice(names) -> click.Choice:
    """A fixed set of names as a Click choice: ``--help`` lists them, shells complete them and
    a wrong value gets Click's error naming them. The names come from :mod:`hyfl._names`, so
    building the choice imports none of the modules that implement them."""
    return click.Choice(list(names))


def _complete_algorithm(incomplete: str) -> list[str]:
    return [name for name in ALGORITHM_NAMES if name.startswith(incomplete)]


# Options shared by `run` and `compare`, declared once.
Data = Annotated[str, typer.Option(help="Dataset name (see `hyfl datasets`) or LIBSVM file.")]
Val = Annotated[str | None, typer.Option(help="Validation set: dataset name or file.")]
ValFraction = Annotated[float | None, typer.Option(help="Hold out this fraction for validation.")]
# Choices get a short metavar and are listed in the help text: as a metavar
# ("[hinge|logistic|...]") they squeeze the help column to 20 characters at 80 columns.
Loss = Annotated[str, typer.Option(click_type=_choice(LOSS_NAMES), metavar="LOSS",
                                   help=f"Loss function: {', '.join(LOSS_NAMES)}.")]
Lam = Annotated[float | None, typer.Option(help="Regularization (default: the dataset's).")]
ClassWeight = Annotated[
    str | None, typer.Option(click_type=_choice(CLASS_WEIGHTS), metavar="balanced",
                             help="balanced: weight each class's loss by N / (classes x its "
                             "count); default: unweighted.", show_default=False)
]
Standardize = Annotated[
    bool, typer.Option("--standardize", help="Divide every feature by its standard deviation, "
                       "from a secure sum of the parties' column statistics (reveals each "
                       "feature's mean and deviation).")
]
Intercept = Annotated[
    str, typer.Option(metavar="S|off", help="Bias: a constant column of value S, its weight "
                      "regularized like the others (as liblinear); larger S regularizes the "
                      "bias less but slows the dual steps; off: none.")
]
PartitionOpt = Annotated[
    str | None,
    typer.Option(
        "--partition",
        help="horizontal:K | vertical:Q | grid:KxQ | nonzero:KxQ | quadrant:C; skewed "
        "samples for grid and horizontal: add @classes:k (k classes per sample group), "
        "@dirichlet:alpha (class shares) or @lognormal:sigma (group sizes) "
        "[default: grid:3x3; party files: their own].",
        show_default=False,
    ),
]
ParticipationOpt = Annotated[
    str | None,
    typer.Option("--participation", help="full | fraction p | cyclic:C | trace:FILE "
                 "[default: 0.5; party files: full].", show_default=False),
]
Iic = Annotated[float | None, typer.Option(help="Inner iterations constant: H = ceil(IIC N / K).")]
LocalSteps = Annotated[int | None, typer.Option(help="H (or Q for FedBCD): local steps.")]
StepRule = Annotated[
    str | None,
    typer.Option(click_type=_choice(STEP_RULES), metavar="RULE",
                 help=f"HyFDCA's step rule: {', '.join(STEP_RULES)} (default {STEP_RULES[0]}). "
                 "FedHybrid's step sizes are --param step_sizes=scaled|raw."),
]
RateA = Annotated[float | None, typer.Option(
    "--a", help="FedAvg/HyFEM rate a/(b + sqrt t); FedHybrid's primal step (multiplier).")]
RateB = Annotated[float | None, typer.Option(
    "--b", help="FedAvg/HyFEM rate a/(b + sqrt t); FedHybrid's dual step (multiplier).")]
Mu = Annotated[float | None, typer.Option(
    help="Proximal weight (HyFEM, FedPBCD, neural); FedHybrid's penalty.")]
Eta0 = Annotated[float | None, typer.Option(help="FedBCD rate eta0 / sqrt(t + 1).")]
BatchSize = Annotated[int | None, typer.Option(help="FedBCD mini-batch size S.")]
Param = Annotated[
    list[str] | None,
    typer.Option(help="Any hyperparameter (`hyfl algorithms`) as KEY=VALUE, or "
                 "ALGORITHM.KEY=VALUE; a list as [1,2]; repeatable."),
]
Iterations = Annotated[
    int, typer.Option(help="Outer iterations (neural algorithms: 20 unless given).")
]
NEURAL_ITERATIONS = 20
"""Outer iterations of a neural run when --iterations is not given (a pass each)."""


def _iterations_for(ctx, algorithms: list[str], iterations: int) -> int:
    """``--iterations``, or :data:`NEURAL_ITERATIONS` for neural runs that did not give it."""
    from hyfl.algorithms import is_neural

    if _from_command_line(ctx, "iterations") or not any(map(is_neural, algorithms)):
        return iterations
    return NEURAL_ITERATIONS
EvalEvery = Annotated[int, typer.Option(help="Evaluate every N outer iterations.")]
Seed = Annotated[int, typer.Option(help="Seed for partition, participation and sampling.")]
DataDir = Annotated[str | None, typer.Option(help="Folder with dataset files.")]
Progress = Annotated[bool, typer.Option(help="Show a progress bar.")]
CipherOpt = Annotated[
    str,
    typer.Option(
        click_type=_choice(CIPHERS),
        metavar="CIPHER",
        help=f"HyFDCA's homomorphic encryption: {', '.join(CIPHERS)}. 'none' simulates it "
        "(ciphertexts and HE operations counted, their time charged only with --he-costs, "
        "nothing encrypted); a real "
        "cipher runs HyFDCA as separate parties with real encryption (slower). Other "
        "algorithms never encrypt (zero HE operations): with them a real cipher only "
        "means that HyFDCA in the same comparison is encrypted."
    ),
]
KeyBits = Annotated[
    int | None,
    typer.Option(help="Paillier modulus size in bits (default 2048; 512 or 1024 for quick tests)."),
]
Latency = Annotated[
    float,
    typer.Option(
        metavar="SECONDS",
        help="Network latency per round trip added to the simulated time "
        "(the paper used 0, 0.2575 and 0.8).",
    ),
]
HeCosts = Annotated[
    str,
    typer.Option(
        metavar="SOURCE",
        help=f"Seconds per HE operation in the simulated time: {', '.join(HE_COST_SOURCES)}, "
        "a cipher name or a JSON file. 'auto': the cipher that runs "
        "prices itself (none: no HE time, operations still counted; a real cipher: its own "
        "costs at its key size, from the `hyfl calibrate` cache or a quick calibration that "
        "is then cached); 'paper': the paper's per-value Paillier figures (18.882 ms "
        "encrypt, 18.865 ms decrypt, 0.054 ms add); 'measured': `hyfl calibrate`'s record "
        f"of the cipher; a cipher name ({', '.join(CIPHERS)}): that cipher's own costs; or a "
        "JSON file.",
    ),
]
HeLayout = Annotated[
    str,
    typer.Option(
        metavar="LAYOUT",
        help="Which ciphertexts the cost model counts (cipher none only): 'cipher' (the "
        "running cipher's layout: one per value for none), 'sample' (one ciphertext per "
        "sample with all its classes, the paper's count) or a cipher name (as that cipher "
        "packs: whole samples per ciphertext).",
    ),
]


TRIVIAL_EXIT_CODE = 3
"""Exit code of run, compare and demo when a model is no better than trivial (outputs written)."""
TRIVIAL_EPILOG = (
    f"Exit codes: 0 done; 2 an error; {TRIVIAL_EXIT_CODE} done (every output written), but a "
    "model is no better than trivial -- its primal objective is not below the zero model's, or "
    "its accuracy not above always predicting the majority class (a warning says which; "
    "run.json records it as no_better_than_trivial)."
)


def _warn_trivial(outcomes) -> bool:
    """Print a warning for each run no better than trivial; whether there was one."""
    from hyfl.experiments.runner import trivial_advice, trivial_runs

    found = trivial_runs(list(outcomes))
    seeds = {o.spec.seed for o in outcomes}
    for outcome, trivial in found:
        name = outcome.summary.get("algorithm", outcome.spec.algorithm)
        if len(seeds) > 1:
            name += f" (seed {outcome.spec.seed})"
        after = f" after {trivial.iteration} outer iterations" if trivial.iteration else ""
        where = f" ({outcome.out_dir}/run.json)" if outcome.out_dir is not None else ""
        console.print(
            f"[bold yellow]warning:[/] {escape(name)}'s model is no better than trivial"
            f"{after}: {escape(trivial.reason)}{escape(where)}. {escape(trivial_advice(outcome))}",
            soft_wrap=True,
        )
    return bool(found)


def _exit_if_trivial(outcomes) -> None:
    """Warn about trivial runs and exit with :data:`TRIVIAL_EXIT_CODE` if there was one."""
    if _warn_trivial(outcomes):
        raise typer.Exit(code=TRIVIAL_EXIT_CODE)


def _fail(err: HyflError) -> None:
    console.print(f"[bold red]error:[/] {escape(str(err))}")
    raise typer.Exit(code=2)


def _say(message: str) -> None:
    console.print(escape(message), soft_wrap=True)


@app.command(epilog=TRIVIAL_EPILOG)
def demo(
    out: Annotated[Path, typer.Option(help="Folder for the outputs.")] = Path("hyfl-demo"),
    iterations: Annotated[int | None, typer.Option(
        help="Outer iterations (default 600; the default settles at 1e-3 by ~450).")] = None,
):
    """HyFDCA on a 3x3 hybrid grid of the bundled breast-cancer data, half the clients per round."""
    from hyfl.experiments.demo import DEMO_SPEC
    from hyfl.experiments.runner import execute

    spec = (DEMO_SPEC if iterations is None else
            dataclasses.replace(DEMO_SPEC, iterations=iterations))
    console.print(
        f"[bold]hyfl demo[/]: {spec.algorithm} on [cyan]{spec.data}[/] ({spec.loss} loss), "
        f"partition {spec.partition_spec()}, participation {spec.participation_spec()}"
    )
    try:
        # The demo may replace its own default folder (run it twice and it just works);
        # a folder the user names is protected like any other results folder.
        outcome = execute(spec, out, progress=True, overwrite=out == Path("hyfl-demo"),
                          log=_say)
    except HyflError as err:
        _fail(err)
    print_summary(outcome)
    _exit_if_trivial([outcome])


@app.command(epilog=TRIVIAL_EPILOG)
def run(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Argument(
            help="Experiment config (TOML, see hyfl.experiments.config): run every algorithm "
            "and seed it lists. Flags given override its values (recorded in config.toml "
            "and run.json); --out overrides its folder.",
            metavar="CONFIG.toml",
            show_default=False,
        ),
    ] = None,
    # Not a strict choice: with CONFIG it may name one of the config's labels.
    algorithm: Annotated[
        str,
        typer.Option(
            autocompletion=_complete_algorithm,
            help=f"{', '.join(ALGORITHM_NAMES)} (see `hyfl algorithms`); with CONFIG, one of "
            "its [algorithms.LABEL] tables.",
        ),
    ] = "hyfdca",
    data: Data = "breast_cancer",
    val: Val = None,
    val_fraction: ValFraction = None,
    loss: Loss = "hinge",
    lam: Lam = None,
    intercept: Intercept = "1",
    class_weight: ClassWeight = None,
    standardize: Standardize = False,
    partition: PartitionOpt = None,
    participation: ParticipationOpt = None,
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
    cipher: CipherOpt = "none",
    key_bits: KeyBits = None,
    latency: Latency = 0.0,
    he_costs: HeCosts = DEFAULT_HE_COSTS,
    he_layout: HeLayout = DEFAULT_HE_LAYOUT,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Output folder (default: hyfl-run; with a config, the out key of its "
            "experiment table, else runs/<name>).",
            show_default=False,
        ),
    ] = None,
    progress: Progress = True,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="With a config: skip the runs already finished in the output folder and "
            "continue interrupted ones from their checkpoints.",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace the results in an existing output folder."),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bars or tables.")
    ] = False,
):
    """Run one federated training job, or every run of an experiment config.

    Without CONFIG: one job from the flags; writes DIR/metrics.csv, metrics.parquet,
    run.json, model.npz and loss.png, and prints the result against the centralized optimum and
    the simulated cost (time per outer iteration by component, bytes, HE operations).

    With CONFIG.toml: every (algorithm, seed) of the config; writes DIR/config.toml
    (resolved), environment.json, summary.csv, summary.md, compare.png, costs.png and
    DIR/<algorithm>/seed-<s>/ (metrics.parquet, metrics.csv, run.json, model.npz,
    checkpoint.npz).
    """
    from hyfl.experiments.runner import RunSpec, execute

    show = progress and not quiet
    try:
        hyper = _hyper(iic, local_steps, step_rule, a, b, mu, eta0, batch_size, param)
        if config is not None:
            _run_config(ctx, config, out, hyper, resume=resume, overwrite=overwrite,
                        progress=show, quiet=quiet)
            return
        if resume:
            raise fail(
                "--resume",
                "needs an experiment config",
                "Run `hyfl run CONFIG.toml --resume` (single runs from flags have no checkpoints).",
            )
        iterations = _iterations_for(ctx, [algorithm], iterations)
        spec = RunSpec.from_options(ctx.params, hyper=hyper, iterations=iterations)
        outcome = execute(spec, out if out is not None else Path("hyfl-run"), progress=show,
                          overwrite=overwrite, log=None if quiet else _say)
    except HyflError as err:
        _fail(err)
    if quiet:
        console.print(f"wrote {outcome.out_dir}")
    elif outcome.summary["engine"] == "neural":
        print_neural_summary([outcome])
    else:
        print_summary(outcome)
        print_costs(outcome)
    _exit_if_trivial([outcome])


def _from_command_line(ctx, name: str) -> bool:
    """Whether flag ``name`` was given on the command line (not a default or env value)."""
    source = ctx.get_parameter_source(name)
    return getattr(source, "name", None) == "COMMANDLINE"


def _run_config(ctx, path: Path, out, hyper, *, resume: bool, overwrite: bool, progress: bool,
                quiet: bool):
    """``hyfl run CONFIG``: the flags given on the command line override the config's values."""
    from hyfl.experiments.config import load_config_with_flags
    from hyfl.experiments.runner import run_experiment

    explicit = {name: ctx.params[name] for name in ctx.params if _from_command_line(ctx, name)}
    config = load_config_with_flags(path, explicit, hyper, ctx.params["algorithm"])
    record = config.overrides
    if record and not quiet:
        for key, item in record.items():
            console.print(
                f"[yellow]note:[/] {escape(item['from'])} overrides the config: {key} = "
                f"{escape(repr(item['value']))} (the config had {escape(repr(item['config']))})"
            )
    out_dir = out if out is not None else config.default_out()
    if not quiet:
        budget = config.budget.to_dict()
        console.print(
            f"[bold]{config.name}[/]: {len(config.algorithms)} algorithm(s) x "
            f"{len(config.seeds)} seed(s) on [cyan]{config.data.dataset}[/], partition "
            f"{config.partition.spec}, participation {config.partition.participation}, "
            f"budget {', '.join(f'{k} {v:g}' for k, v in budget.items())}"
        )
    result = run_experiment(
        config,
        out_dir,
        resume=resume,
        overwrite=overwrite,
        progress=progress,
        log=None if quiet else console.print,
    )
    if not quiet:
        print_experiment(result)
    console.print(f"wrote {result.out_dir}")
    _exit_if_trivial(result.outcomes)


@app.command(epilog=TRIVIAL_EPILOG)
def compare(
    ctx: typer.Context,
    # A short example: a long comma-joined word is cut with "…" in a narrow help column.
    algorithms: Annotated[
        str, typer.Option(help="Comma-separated names, e.g. hyfdca,fedavg (`hyfl algorithms`).")
    ],
    data: Data = "breast_cancer",
    val: Val = None,
    val_fraction: ValFraction = None,
    loss: Loss = "hinge",
    lam: Lam = None,
    intercept: Intercept = "1",
    class_weight: ClassWeight = None,
    standardize: Standardize = False,
    partition: PartitionOpt = None,
    participation: ParticipationOpt = None,
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
    cipher: CipherOpt = "none",
    key_bits: KeyBits = None,
    latency: Latency = 0.0,
    he_costs: HeCosts = DEFAULT_HE_COSTS,
    he_layout: HeLayout = DEFAULT_HE_LAYOUT,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("hyfl-compare"),
    progress: Progress = True,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace the results in an existing output folder."),
    ] = False,
):
    """Run several algorithms on one partition and participation trace; write a summary and plot.

    Shared flags apply to every algorithm that has the hyperparameter, and only to those
    (one that none of them has is an error); use --param ALGORITHM.KEY=VALUE for one
    algorithm only (e.g. --param fedavg.iic=0.25).
    Writes DIR/summary.csv, summary.md, compare.png (against outer iterations and
    simulated time) and costs.png (time per outer iteration by component).
    """
    from hyfl.experiments.outputs import summary_rows
    from hyfl.experiments.runner import compare as run_compare
    from hyfl.experiments.spec import RunSpec

    try:
        hyper = _hyper(iic, local_steps, step_rule, a, b, mu, eta0, batch_size, param)
        names = [n.strip() for n in algorithms.split(",") if n.strip()]
        iterations = _iterations_for(ctx, names, iterations)
        spec = RunSpec.from_options(ctx.params, algorithm=names[0] if names else "hyfdca",
                                    hyper=hyper, iterations=iterations)
        outcomes = run_compare(spec, names, out, progress=progress, overwrite=overwrite,
                               log=_say)
    except HyflError as err:
        _fail(err)
    if outcomes and outcomes[0].summary["engine"] == "neural":
        print_neural_summary(outcomes)
        console.print(f"wrote {out}/summary.csv, summary.md, compare.png")
        _exit_if_trivial(outcomes)
        return
    rows = summary_rows(outcomes)
    title = f"{data}, {spec.partition_spec()}, participation {spec.participation_spec()}"
    encrypted = [r["algorithm"] for r in rows if r["engine"] == "protocol"]
    priced = dict.fromkeys(o.summary["costs"]["he_costs"] for o in outcomes)
    cost_title = (
        f"simulated cost (latency {latency:g} s, {'; '.join(priced)}); "
        "client, server, latency and HE: seconds per outer iteration"
        + (f"; {', '.join(encrypted)} really encrypted ({cipher})" if encrypted else "")
    )
    print_comparison(rows, title, cost_title)
    console.print(
        f"wrote {out}/summary.csv, summary.md, compare.png, costs.png and one folder per algorithm"
    )
    _exit_if_trivial(outcomes)


@app.command()
def calibrate(
    cipher: Annotated[
        str, typer.Option(click_type=_choice((*CIPHERS, "all")), help="Cipher to measure.")
    ],
    key_bits: KeyBits = None,
    n: Annotated[int, typer.Option(help="Ciphertexts per measured batch.")] = 200,
    output: Annotated[
        Path | None,
        typer.Option(help="JSON file to merge the results into (default: the HE cost cache)."),
    ] = None,
):
    """Measure this machine's seconds per HE operation; `--he-costs measured` then uses them.

    The default file is $HYFL_CACHE/he-costs.json (HYFL_CACHE defaults to ~/.cache/hyfl).
    """
    from hyfl.experiments.runner import calibrate_ciphers

    try:
        records, path = calibrate_ciphers(cipher, key_bits=key_bits, n_values=n, output=output)
    except HyflError as err:
        _fail(err)
    table = Table(title="time per homomorphic operation on this machine")
    for column in ("cipher", "key bits", "slots", "operation", "per ciphertext", "per value"):
        if column in ("cipher", "operation"):
            name_column(table, column)
        else:
            number_column(table, column)
    for name, r in records.items():
        for i, op in enumerate(("encrypt", "decrypt", "add")):
            first = i == 0
            table.add_row(
                name if first else "",
                str(r["key_bits"]) if first else "",
                str(r["slots"]) if first else "",
                op,
                _seconds(r[op]),
                _seconds(r[f"{op}_per_value"]),
            )
        table.add_section()
    console.print(table)
    console.print(f"wrote {path}")


@app.command()
def tune(
    config: Annotated[Path, typer.Argument(help="Experiment config (TOML).")],
    algorithm: Annotated[
        list[str] | None, typer.Option(help="Tune only this [algorithms.LABEL] (repeatable).")
    ] = None,
    seconds: Annotated[float, typer.Option(help="Time budget per algorithm, seconds.")] = 600.0,
    max_trials: Annotated[int | None, typer.Option(help="Stop after this many trials.")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder (default <config out>/tuning).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random search.")] = 0,
):
    """Random search (log-uniform, the paper's bounds) + Gray Relational Analysis selection.

    Writes trials.csv, best.toml and tuning.json per algorithm; paste best.toml's
    table into the config.
    """
    from hyfl.experiments.tuning import tune_config

    try:
        results = tune_config(config, algorithms=algorithm, seconds=seconds,
                              max_trials=max_trials, out_dir=out, seed=seed, progress=True)
    except HyflError as err:
        _fail(err)
    table = Table(title="chosen hyperparameters (Gray Relational Analysis)")
    name_column(table, "algorithm")
    for column in ("trials", "divergent"):
        number_column(table, column)
    table.add_column("best", overflow="fold")  # KEY=VALUE list: wraps between values
    number_column(table, "grade")
    for label, result in results.items():
        best = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in result.best.items())
        table.add_row(label, str(len(result.trials)), str(result.n_divergent), best,
                      f"{result.best_trial.grade:.3f}")
    console.print(table)
    for label, result in results.items():
        console.print(f"{label}: {result.out_dir}")


@app.command()
def report(
    results: Annotated[Path, typer.Argument(help="A results folder (from run or compare).")],
    format: Annotated[str, typer.Option(click_type=_choice(REPORT_FORMATS))] = "html",
    out: Annotated[Path | None, typer.Option(help="Output file (default in the folder).")] = None,
):
    """One page with every setting's curves, cost breakdown, tables and comparisons."""
    from hyfl.experiments.report import build_report

    try:
        path = build_report(results, format=format, out=out)
    except HyflError as err:
        _fail(err)
    console.print(f"wrote {path}")


@app.command()
def study(
    configs: Annotated[
        Path, typer.Argument(help="A folder of experiment configs (searched recursively).")
    ] = Path("configs/paper"),
    out: Annotated[
        Path | None,
        typer.Option(
            help="Results folder (default runs/paper, runs/paper-quick with --quick, "
            "runs/paper-full with --full).",
            show_default=False,
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Every budget x 0.1 (a smoke test of the study).")
    ] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Run each config's full_budget instead of its budget: the paper's own budgets "
            "(2,500 / 10,000 / 30,000 outer iterations, 10,800 simulated s) for configs/paper. "
            "Days of compute on a small machine.",
        ),
    ] = False,
    scale: Annotated[
        float | None,
        typer.Option(help="Multiply every budget by this factor in (0, 1] (overrides --quick; "
                     "with --full, of the full budgets)."),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Parallel runs (default: the number of CPUs).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
):
    """Run every config of a study (resuming finished runs) and write OUT/study.md.

    The paper's study: `hyfl study configs/paper --out runs/paper` (see
    docs/reproduction.md); configs whose data files are missing are skipped
    with a note saying which file to provide.
    """
    from hyfl.experiments.study import run_study

    factor = scale if scale is not None else (QUICK_SCALE if quick else 1.0)
    if out is None:
        out = Path("runs/paper-full" if full else "runs/paper-quick" if quick else "runs/paper")
    try:
        if full and quick and scale is None:
            raise fail("--full and --quick", "were both given",
                       "Give one; --full --scale F runs the full budgets x F.")
        run_study(
            configs,
            out,
            scale=factor,
            full=full,
            jobs=jobs,
            log=None if quiet else console.print,
            progress=not quiet,
        )
    except HyflError as err:
        _fail(err)
    console.print(f"wrote {out / 'study.md'}")


QUICK_SCALE = 0.1


@app.command()
def algorithms():
    """List the registered algorithms, each with its options (--param NAME=VALUE) and defaults."""
    from hyfl.algorithms import ALGORITHMS
    from hyfl.cli_tables import algorithm_options

    table = Table(caption="options: --param NAME=VALUE (hyfl run, compare; a list as [1,2]), "
                  "defaults shown; auto: chosen from the data or the other options when "
                  "left unset")
    table.add_column("name", no_wrap=True)  # short registry names: never `algorit…`
    table.add_column("what, and options (defaults)", overflow="fold")
    for name, entry in ALGORITHMS.items():
        options = ", ".join(f"{key}={value}" for key, value in algorithm_options(entry))
        summary = escape(entry.summary)
        table.add_row(name, f"{summary}\n[dim]{escape(options)}[/]" if options else summary)
    console.print(table)


@app.command()
def datasets(data_dir: DataDir = None):
    """List the named datasets, whether their files were found and where they were looked for."""
    from hyfl.data import DATASETS, default_lambda
    from hyfl.data.registry import locate_files, search_dirs

    table = Table()
    table.add_column("name", no_wrap=True)
    table.add_column("task", overflow="fold")
    number_column(table, "paper lambda")
    table.add_column("files", overflow="fold")  # whole paths, folded rather than cut
    for name, entry in DATASETS.items():
        lam = default_lambda(name)
        table.add_row(name, str(getattr(entry, "task", "")), f"{lam:g}" if lam else "-",
                      _files_cell(locate_files(name, data_dir)))
    console.print(table)
    console.print("Dataset files are looked for in, in order (the first that has a file wins):")
    for folder in search_dirs(data_dir):
        state = "" if folder.is_dir() else " (does not exist)"
        console.print(f"  {escape(str(folder))}{state}", soft_wrap=True)


def _files_cell(found: dict) -> str:
    """``hyfl datasets``: bundled, found (in which folders) or missing (which files)."""
    if not found:
        return "bundled"
    missing = [slot for slot, path in found.items() if path is None]
    if missing:
        return "[red]missing[/]: " + escape(", ".join(missing))
    folders = dict.fromkeys(str(path.parent) for path in found.values())
    return "[green]found[/] in " + escape(", ".join(folders))


@app.command()
def predict(
    model: Annotated[
        Path,
        typer.Argument(help="A model.npz from a results folder (hyfl run / deploy local).",
                       metavar="MODEL", show_default=False),
    ],
    data: Annotated[
        str,
        typer.Option(help="Dataset name (see `hyfl datasets`, NAME:test for a test split), "
                     "LIBSVM file, or party files with or without labels (a folder, one "
                     "file or parties:a.csv,b.parquet;id=patient), with the training "
                     "data's features (party files: the training columns by name).",
                     show_default=False),
    ],
    out: Annotated[
        Path, typer.Option(help="CSV to write: index (party files: id), prediction, "
                           "decision value(s) (the score), logistic probabilities.")
    ] = Path("predictions.csv"),
    data_dir: Annotated[str | None, typer.Option(help="Folder with dataset files.")] = None,
):
    """Predict with a trained model: one CSV row per sample of DATA.

    The prediction is the original label of the training data (e.g. 0/1 or "benign",
    not -1/+1) or the real value for regression; ``decision`` holds the score, the margin
    (one column per class for multiclass), and a logistic model adds each class's
    probability. Party files need no labels: every row is scored under its own id;
    with labels the accuracy and ranking metrics are reported. Data with other
    features are refused, naming the columns that differ.
    """
    from hyfl.predict import predict_file

    try:
        done = predict_file(model, data, out, data_dir=data_dir)
    except HyflError as err:
        _fail(err)
    line = f"wrote {done.out} ({done.n_samples} predictions)"
    if done.accuracy is not None:
        labelled = getattr(done, "n_labelled", None)
        of = ("" if labelled in (None, done.n_samples) else
              f" ({labelled} labelled rows)")
        line += f"; accuracy against the data's labels{of} {done.accuracy:.4f}"
        ranking = getattr(done, "ranking", None)  # (none for neural models)
        if ranking is not None and ranking["auc"] == ranking["auc"]:
            line += (f", AUC {ranking['auc']:.4f}, KS {ranking['ks']:.4f}, average "
                     f"precision {ranking['average_precision']:.4f}")
        if done.same_data:
            line += " (the training data)"
    for notice in getattr(done, "notices", ()):
        console.print(f"[bold yellow]warning:[/] {escape(notice)}")
    console.print(escape(line))


def _hyper(iic, local_steps, step_rule, a, b, mu, eta0, batch_size, param) -> dict:
    from hyfl.experiments.spec import hyper_from_options

    return hyper_from_options(dict(iic=iic, local_steps=local_steps, step_rule=step_rule, a=a,
                                   b=b, mu=mu, eta0=eta0, batch_size=batch_size), param)


def _unwrap_help(typer_app: typer.Typer) -> None:
    """Join the hard line breaks inside each paragraph of the commands' docstrings.

    Typer's Rich help keeps the line breaks of every paragraph after the first and
    then wraps again at the terminal's width, so a line broken at 90 columns in the
    source shows at 80 as a long line and a one-word line. Blank-line separated
    paragraphs stay paragraphs.
    """
    for info in typer_app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback)
        if doc:
            info.help = "\n\n".join(" ".join(p.splitlines()) for p in doc.split("\n\n"))


_unwrap_help(app)
_unwrap_help(deploy_app)
app.add_typer(deploy_app, name="deploy")

if __name__ == "__main__":  # pragma: no cover
    app()
