"""Write the paper-study configs (HyFDCA paper, section 7) into this folder.

    python configs/paper/make_configs.py

Layout: ``<dataset>/<budget>/<setting>.toml`` with budget ``iterations``
(equal outer iterations) or ``time`` (equal simulated time: 0.2575 s per
round trip plus the paper's per-operation HE costs), nine settings per
dataset (three client counts x participation 0.1, 0.5, 0.9), each running
HyFDCA, FedAvg and HyFEM with the paper's tuned hyperparameters (Tables 2-4).

HE operations are counted as the paper's figures assume: one ciphertext per
sample, all of an MNIST sample's ten one-vs-rest values in it (``he_layout =
"sample"``; the paper's section 7.1 and Table 6), each priced at the paper's
per-operation Paillier cost (``he_costs = "paper"``).

``budget`` is the paper's budget scaled down (see ``DATASETS``);
``full_budget`` is the paper's own (section 7.1: 2,500 / 10,000 / 30,000
outer iterations, 10,800 s), which ``hyfl study configs/paper --full`` runs.
``hyfl study configs/paper`` runs them all; see docs/reproduction.md for the
scaling of the budgets and every difference from the paper.
"""

from __future__ import annotations

from pathlib import Path

import tomli_w

HERE = Path(__file__).resolve().parent
FRACTIONS = ("0.1", "0.5", "0.9")
LATENCY = 0.2575  # s per round trip (US-Singapore), the paper's moderate case

# (HyFDCA IIC), (FedAvg IIC, a, b), (HyFEM IIC, a, b, mu) per (clients, fraction):
# Tables 2 (MNIST), 3 (News20) and 4 (Covtype) of the paper's supplement.
MNIST_TABLE = {
    ("5", "0.1"): (1.876e-4, (0.04872, 0.05857, 0.1124), (0.00568, 6.007e-5, 1.015, 6.296)),
    ("5", "0.5"): (0.001564, (0.04872, 0.05857, 0.1124), (0.00568, 6.007e-5, 1.015, 6.296)),
    ("5", "0.9"): (0.002816, (0.01718, 0.02867, 4.823e-4), (0.00568, 6.007e-5, 1.015, 6.296)),
    ("500", "0.1"): (0.03827, (0.01718, 0.02867, 4.823e-4), (0.05594, 4.672e-4, 0.05344, 2.797)),
    ("500", "0.5"): (0.002252, (0.06561, 0.04185, 4.166e-5), (0.00568, 6.007e-5, 1.015, 6.296)),
    ("500", "0.9"): (0.08337, (0.04872, 0.05857, 0.1124), (0.00568, 6.007e-5, 1.015, 6.296)),
    ("5000", "0.1"): (0.002673, (1.618, 0.003995, 0.8498), (0.05594, 4.672e-4, 0.05344, 2.797)),
    ("5000", "0.5"): (3.154e-4, (1.618, 0.003995, 0.8498), (0.00568, 6.007e-5, 1.015, 6.296)),
    ("5000", "0.9"): (0.02195, (1.618, 0.003995, 0.8498), (0.05594, 4.672e-4, 0.05344, 2.797)),
}
NEWS20_TABLE = {
    ("3x3", "0.1"): (0.01448, (0.003037, 0.8753, 0.4597), (0.003037, 0.8753, 0.4597, 1.0)),
    ("3x3", "0.5"): (0.01187, (0.002873, 4.891, 4.496), (0.002873, 4.891, 4.496, 1.0)),
    ("3x3", "0.9"): (0.01122, (0.002873, 4.891, 4.496), (0.002873, 4.891, 4.496, 1.0)),
    ("5x5", "0.1"): (0.03072, (0.002873, 4.891, 4.496), (0.002873, 4.891, 4.496, 1.0)),
    ("5x5", "0.5"): (0.0286, (0.003037, 0.8753, 0.4597), (0.003037, 0.8753, 0.4597, 1.0)),
    ("5x5", "0.9"): (0.03072, (0.002873, 4.891, 4.496), (0.002873, 4.891, 4.496, 1.0)),
    ("12x12", "0.1"): (0.08568, (4.542, 3.792, 0.1815), (0.03, 3.792, 0.1815, 1.0)),
    ("12x12", "0.5"): (0.08504, (4.542, 3.792, 0.1815), (4.542, 3.792, 0.1815, 1.0)),
    ("12x12", "0.9"): (0.07564, (4.542, 3.792, 0.1815), (4.542, 3.792, 0.1815, 1.0)),
}
COVTYPE_TABLE = {
    ("3x3", "0.1"): (1.326e-4, (0.02291, 0.4475, 3.501e-4), (0.03747, 0.6675, 0.01209, 0.01458)),
    ("3x3", "0.5"): (2.643e-4, (0.02291, 0.4475, 3.501e-4), (0.03747, 0.6675, 0.01209, 0.01458)),
    ("3x3", "0.9"): (5.533e-5, (0.02291, 0.4475, 3.501e-4), (0.02038, 0.4948, 0.08829, 0.01155)),
    ("5x5", "0.1"): (7.376e-5, (0.03647, 0.3247, 4.514), (0.413, 1.982, 1.058, 0.02459)),
    ("5x5", "0.5"): (8.319e-4, (0.02291, 0.4475, 3.501e-4), (4.909e-5, 1.913, 4.679, 0.6115)),
    ("5x5", "0.9"): (1.326e-4, (0.03647, 0.3247, 4.514), (0.05226, 2.41, 0.0142, 0.06684)),
    ("12x12", "0.1"): (8.319e-4, (5.59e-4, 0.05344, 0.004065), (1.02e-4, 0.1264, 3.874e-4, 8.775)),
    ("12x12", "0.5"): (7.434e-4, (5.59e-4, 0.05344, 0.004065), (0.03747, 0.6675, 0.01209, 0.01458)),
    ("12x12", "0.9"): (7.434e-4, (0.2494, 11.93, 0.05131), (0.05226, 2.41, 0.0142, 0.06684)),
}

# Where the paper's values diverge on a stand-in data set, the paper's own remedy
# (Table 3, footnote 1: HyFEM's IIC lowered to 0.03 on News20 12x12, 0.1) is applied
# to the other fractions too; see docs/reproduction.md.
# (dataset, clients, fraction, algorithm) -> overrides.
ADJUSTED: dict[tuple[str, str, str, str], dict[str, float]] = {
    ("reuters", "12x12", "0.5", "hyfem"): {"iic": 0.03},
    ("reuters", "12x12", "0.9", "hyfem"): {"iic": 0.03},
}

# dataset -> partition per paper client count, hyperparameter table, budgets, validation.
# Budgets are the paper's scaled down (10x fewer outer iterations, 20x for Covtype, and
# 10x less simulated time, with a cap on outer iterations); full_iterations and
# FULL_SIM_TIME are the paper's own (section 7.1), with caps 10x the scaled ones.
SIM_TIME = 1080.0  # simulated seconds (paper: 10,800)
FULL_SIM_TIME = 10800.0  # the paper's 3 hours
NONZERO = {"3x3": "nonzero:3x3", "5x5": "nonzero:5x5", "12x12": "nonzero:12x12"}


def nonzero_dataset(table, table_name: str, iterations: int, full_iterations: int,
                    eval_every: int, **data) -> dict:
    """A data set with the paper's non-zero-balanced (K, Q) groups (Covtype, News20)."""
    return dict(
        partitions=NONZERO,
        table=table,
        table_name=table_name,
        iterations=iterations,
        full_iterations=full_iterations,
        eval_every=eval_every,
        max_iterations=8000,
        data=data,
    )


DATASETS = {
    "mnist": dict(
        partitions={"5": "quadrant:4", "500": "quadrant:500", "5000": "quadrant:5000"},
        table=MNIST_TABLE,
        table_name="Table 2 (MNIST)",
        iterations=250,
        full_iterations=2500,
        eval_every=5,
        max_iterations=400,
        data={},
    ),
    "covtype": nonzero_dataset(
        COVTYPE_TABLE, "Table 4 (Covtype)", 1500, 30000, 10, val_fraction=0.2
    ),
    # reuters stands in for News20, which is not available (see docs/reproduction.md).
    "reuters": nonzero_dataset(
        NEWS20_TABLE, "Table 3 (News20, which reuters stands in for)", 1000, 10000, 5
    ),
    "news20": nonzero_dataset(NEWS20_TABLE, "Table 3 (News20)", 1000, 10000, 5,
                              val_fraction=0.2),
}


STUDY = ("mnist", "covtype", "reuters")  # what `hyfl study configs/paper` runs


def algorithms(dataset: str, clients: str, fraction: str, table) -> dict:
    hyfdca_iic, (fa_iic, fa_a, fa_b), (fe_iic, fe_a, fe_b, fe_mu) = table[(clients, fraction)]
    out = {
        # HyFDCA's defaults (the cocoa rule), untuned.
        "hyfdca": {},
        # The paper's setting: per-sample steps with its tuned IIC (under the safe rule);
        # sip_scope "paper": its count of encrypted inner products (section 7.1).
        "hyfdca-paper": {
            "algorithm": "hyfdca", "step_rule": "safe", "iic": hyfdca_iic, "sip_scope": "paper",
        },
        "fedavg": {"iic": fa_iic, "a": fa_a, "b": fa_b},
        "hyfem": {"iic": fe_iic, "a": fe_a, "b": fe_b, "mu": fe_mu},
    }
    for name, hyper in out.items():
        hyper.update(ADJUSTED.get((dataset, clients, fraction, name), {}))
    return out


def config(dataset: str, clients: str, fraction: str, budget: str) -> dict:
    d = DATASETS[dataset]
    partition = d["partitions"][clients]
    name = f"{dataset}-{budget}-{clients}-{fraction}"
    equal = "outer iterations" if budget == "iterations" else "simulated time"
    if budget == "iterations":
        budget_table = {"iterations": d["iterations"]}
        full_table = {"iterations": d["full_iterations"]}
        eval_every = d["eval_every"]
    else:  # equal simulated time; every round evaluated (round counts differ a lot)
        budget_table = {"sim_time": SIM_TIME, "max_iterations": d["max_iterations"]}
        full_table = {"sim_time": FULL_SIM_TIME, "max_iterations": 10 * d["max_iterations"]}
        eval_every = 1
    return {
        "experiment": {
            "name": name,
            "description": (
                f"Paper study, {dataset}, {clients} clients ({partition}), participation "
                f"{fraction}, equal {equal}; "
                f"hyperparameters from the paper's {d['table_name']}."
            ),
            "seeds": [0],
            "eval_every": eval_every,
            "budget": budget_table,
            "full_budget": full_table,
        },
        # The paper trains without an intercept (mnist carries its own bias feature).
        "data": {"dataset": dataset, "loss": "hinge", "intercept": False, **d["data"]},
        "partition": {"spec": partition, "participation": fraction},
        # The paper's count (one ciphertext per sample) at its per-operation Paillier costs.
        "costs": {"cipher": "none", "latency": LATENCY, "he_costs": "paper",
                  "he_layout": "sample"},
        "algorithms": algorithms(dataset, clients, fraction, d["table"]),
    }


def main() -> None:
    written = 0
    for dataset, d in DATASETS.items():
        for budget in ("iterations", "time"):
            # Covtype and News20 proper live in ../paper-full-data (ready for their files).
            root = HERE if dataset in STUDY else HERE.parent / "paper-full-data"
            folder = root / dataset / budget
            folder.mkdir(parents=True, exist_ok=True)
            for clients in d["partitions"]:
                for fraction in FRACTIONS:
                    path = folder / f"{clients}-{fraction}.toml"
                    path.write_text(tomli_w.dumps(config(dataset, clients, fraction, budget)))
                    written += 1
    print(f"wrote {written} configs under {HERE} and {HERE.parent / 'paper-full-data'}")


if __name__ == "__main__":
    main()
