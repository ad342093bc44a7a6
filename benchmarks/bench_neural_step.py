"""JAX against PyTorch on the two workloads of the neural algorithms (docs/neural.md).

1. An epoch of HyFEM's view model on one client: 468 SGD steps of 64 samples of
   a 196-128-64-128-10 MLP (a quadrant extractor and the inference model).
2. One SGD step of FedBCD's MNIST party CNN (two 3x3 convolutions of 64
   channels, with and without 2x2 pooling, a dense layer of 256 and a top of
   10) on a batch of 256 half images (28 x 14).

Each workload runs in a fresh subprocess per framework, interleaved
(JAX, PyTorch, JAX, PyTorch, ...), and prints wall and CPU seconds. A framework
that is not installed is skipped. PyTorch is not a dependency of hyfl; install
it in a separate venv to compare (``pip install torch==2.13.0``), and point
``--torch-python`` at that venv's python.

Usage::

    python benchmarks/bench_neural_step.py --repeats 2
    python benchmarks/bench_neural_step.py --torch-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import sys

JAX_CODE = r'''
import time, numpy as np, jax, jax.numpy as jnp, optax
rng = np.random.default_rng(0)
def timed(fn, *args):
    jax.block_until_ready(fn(*args))  # compile
    c, w = time.process_time(), time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - w, time.process_time() - c
# 1. MLP epoch
sizes = (196, 128, 64, 128, 10)
p = [{"W": jnp.asarray(rng.normal(size=(a, b)).astype("f4") * 0.1), "b": jnp.zeros(b)}
     for a, b in zip(sizes[:-1], sizes[1:])]
def f(p, x):
    for i, l in enumerate(p):
        x = x @ l["W"] + l["b"]
        x = jax.nn.relu(x) if i < len(p) - 1 else x
    return x
X = jnp.asarray(rng.random((30000, 196), dtype="f4")); Y = jnp.asarray(rng.integers(0, 10, 30000))
idx = jnp.asarray(rng.permutation(30000)[: 468 * 64].reshape(468, 64))
@jax.jit
def epoch(p):
    def step(p, ids):
        g = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
            f(p, X[ids]), Y[ids]).mean())(p)
        return jax.tree.map(lambda a, b: a - 0.05 * b, p, g), None
    return jax.lax.scan(step, p, idx)[0]
print("mlp-epoch", *timed(epoch, p))
# 2. CNN step
def conv(x, w, b, pool):
    y = jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC")) + b)
    return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                 "SAME") if pool else y
for pool in (True, False):
    n_flat = (7 * 4 if pool else 28 * 14) * 64
    q = {"c1": jnp.asarray(rng.normal(size=(3, 3, 1, 64)).astype("f4") * 0.3),
         "c2": jnp.asarray(rng.normal(size=(3, 3, 64, 64)).astype("f4") * 0.04),
         "d": jnp.asarray(rng.normal(size=(n_flat, 256)).astype("f4") * 0.01),
         "t": jnp.asarray(rng.normal(size=(256, 10)).astype("f4") * 0.05)}
    def g(q, x):
        h = conv(conv(x, q["c1"], 0.0, pool), q["c2"], 0.0, pool).reshape(x.shape[0], -1)
        return jax.nn.relu(h @ q["d"]) @ q["t"]
    x = jnp.asarray(rng.random((256, 28, 14, 1), dtype="f4"))
    y = jnp.asarray(rng.integers(0, 10, 256))
    step = jax.jit(lambda q: jax.tree.map(lambda a, b: a - 0.1 * b, q, jax.grad(
        lambda q: optax.softmax_cross_entropy_with_integer_labels(g(q, x), y).mean())(q)))
    print("cnn-step-pool" if pool else "cnn-step", *timed(step, q))
'''

TORCH_CODE = r'''
import time, torch, torch.nn as nn
torch.manual_seed(0)
def timed(fn):
    fn()
    c, w = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - w, time.process_time() - c
m = nn.Sequential(nn.Linear(196, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                  nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.05)
X = torch.rand(30000, 196); Y = torch.randint(0, 10, (30000,))
idx = torch.randperm(30000)[: 468 * 64].reshape(468, 64)
def epoch():
    for ids in idx:
        opt.zero_grad(); nn.functional.cross_entropy(m(X[ids]), Y[ids]).backward(); opt.step()
print("mlp-epoch", *timed(epoch))
for pool in (True, False):
    P = [nn.MaxPool2d(2, ceil_mode=True)] if pool else []
    c = nn.Sequential(nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(), *P,
                      nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), *P, nn.Flatten(),
                      nn.Linear((7 * 4 if pool else 28 * 14) * 64, 256), nn.ReLU(),
                      nn.Linear(256, 10))
    o = torch.optim.SGD(c.parameters(), lr=0.1)
    x = torch.rand(256, 1, 28, 14); y = torch.randint(0, 10, (256,))
    def step():
        o.zero_grad(); nn.functional.cross_entropy(c(x), y).backward(); o.step()
    print("cnn-step-pool" if pool else "cnn-step", *timed(step))
'''


def measure(python: str, code: str) -> dict[str, tuple[float, float]] | None:
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    out = {}
    for line in done.stdout.splitlines():
        name, wall, cpu = line.split()
        out[name] = (float(wall), float(cpu))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--jax-python", default=sys.executable)
    parser.add_argument("--torch-python", default=sys.executable)
    args = parser.parse_args()
    print("| workload | framework | wall s | CPU s |")
    print("| --- | --- | --- | --- |")
    for _ in range(args.repeats):
        for framework, python, code in (("jax", args.jax_python, JAX_CODE),
                                        ("torch", args.torch_python, TORCH_CODE)):
            result = measure(python, code)
            if result is None:
                print(f"| - | {framework} | not installed in {python} | |")
                continue
            for name, (wall, cpu) in result.items():
                print(f"| {name} | {framework} | {wall:.3f} | {cpu:.3f} |")


if __name__ == "__main__":
    main()
