"""Small neural networks as pure functions of a parameter pytree (JAX).

A network is a :class:`Net`: ``init(key) -> params`` and ``apply(params, x)``,
with ``x`` of shape (batch, n_in) (images arrive flattened, row-major, and
are reshaped by the convolutional nets). Parameters are plain nested dicts
and lists of arrays, so averaging, matching and saving them needs no
framework: an MLP's parameters are a list of ``{"W": (n_in, n_out), "b":
(n_out,)}`` layers, ``y = x @ W + b``.

Kinds (:data:`NETS`, also the choices of the ``extractor`` / ``bottom``
hyperparameters):

``mlp``
    Fully connected, ReLU after every layer but the output layer (which a
    caller may also ask to be followed by ReLU, for embeddings).
``cnn``
    FedBCD's MNIST party model (its section 8): two 3x3 convolutions with
    ``channels`` filters each, ReLU, then a fully connected layer of
    ``width`` units. ``pool=True`` (hyfl's preset) adds 2x2 max pooling after
    each convolution, which cuts the cost of a step about 2.5 times on a CPU
    (the paper does not say whether it pooled).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyfl.errors import fail
from hyfl.neural import require_jax

NETS = ("mlp", "cnn")


@dataclass(frozen=True)
class Net:
    """A network: its parameter initializer and its forward function."""

    kind: str
    n_in: int
    n_out: int
    init: Callable[[Any], Any]
    apply: Callable[[Any, Any], Any]
    describe: str


def _dense(key, n_in: int, n_out: int):
    jax = require_jax()
    # He initialization: keeps ReLU activations at a stable scale layer to layer.
    W = jax.random.normal(key, (n_in, n_out), dtype="float32") * np.sqrt(2.0 / n_in)
    return {"W": W, "b": jax.numpy.zeros((n_out,), dtype="float32")}


def mlp_params(key, sizes: Sequence[int]) -> list[dict]:
    """Parameters of an MLP with layer widths ``sizes`` (input first)."""
    jax = require_jax()
    keys = jax.random.split(key, len(sizes) - 1)
    return [_dense(k, a, b) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def mlp_apply(params: Sequence[dict], x, relu_last: bool = False):
    """Forward pass of an MLP: ReLU between layers (and after the last with ``relu_last``)."""
    jax = require_jax()
    for i, layer in enumerate(params):
        x = x @ layer["W"] + layer["b"]
        if i < len(params) - 1 or relu_last:
            x = jax.nn.relu(x)
    return x


def make_mlp(n_in: int, hidden: Sequence[int], n_out: int, relu_last: bool = False) -> Net:
    """An MLP ``n_in -> hidden... -> n_out``."""
    sizes = (int(n_in), *(int(h) for h in hidden), int(n_out))
    return Net(
        "mlp", sizes[0], sizes[-1],
        init=lambda key: mlp_params(key, sizes),
        apply=lambda params, x: mlp_apply(params, x, relu_last),
        describe="mlp " + "-".join(map(str, sizes)) + (" relu" if relu_last else ""),
    )


def make_cnn(
    image_shape: tuple[int, int], n_out: int, channels: int = 64, pool: bool = True,
    relu_last: bool = True, positions=None,
) -> Net:
    """FedBCD's party CNN on ``image_shape`` single-channel images: conv-conv-dense.

    ``positions`` (int array, one per input feature) places the inputs in the
    flat ``image_shape`` canvas, zeros elsewhere; default: the inputs fill it.
    """
    jax = require_jax()
    jnp = jax.numpy
    rows, cols = (int(v) for v in image_shape)
    if rows < 4 or cols < 4:
        raise fail(
            "image view", f"has shape {image_shape}, too small for the CNN",
            "Use the mlp network for views smaller than 4 x 4 pixels.",
        )
    # SAME 2x2 pooling with stride 2 rounds up: 28 -> 14 -> 7, 14 -> 7 -> 4.
    pooled = (((rows + 1) // 2 + 1) // 2, ((cols + 1) // 2 + 1) // 2) if pool else (rows, cols)
    n_flat = pooled[0] * pooled[1] * channels

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        conv = lambda k, c_in: {  # noqa: E731
            "W": jax.random.normal(k, (3, 3, c_in, channels), dtype="float32")
            * np.sqrt(2.0 / (9 * c_in)),
            "b": jnp.zeros((channels,), dtype="float32"),
        }
        return {
            "conv1": conv(k1, 1),
            "conv2": conv(k2, channels),
            "dense": _dense(k3, n_flat, n_out),
        }

    def conv(x, layer):
        y = jax.lax.conv_general_dilated(
            x, layer["W"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        y = jax.nn.relu(y + layer["b"])
        if pool:
            y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")
        return y

    fills = positions is None or (
        len(positions) == rows * cols and np.array_equal(positions, np.arange(rows * cols))
    )
    where = None if fills else jnp.asarray(positions)

    def apply(params, x):
        if where is not None:
            x = jnp.zeros((x.shape[0], rows * cols), x.dtype).at[:, where].set(x)
        h = x.reshape(x.shape[0], rows, cols, 1)
        h = conv(conv(h, params["conv1"]), params["conv2"])
        h = h.reshape(h.shape[0], -1) @ params["dense"]["W"] + params["dense"]["b"]
        return jax.nn.relu(h) if relu_last else h

    describe = f"cnn {rows}x{cols} conv3x3x{channels}" + (" pool" if pool else "")
    describe += f" x2 dense {n_out}"
    n_in = rows * cols if positions is None else len(positions)
    return Net("cnn", n_in, int(n_out), init, apply, describe)


def n_parameters(params) -> int:
    """Number of scalars in a parameter pytree."""
    jax = require_jax()
    return int(sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params)))


def to_numpy(params):
    """The pytree with every leaf as a float32 NumPy array (for saving and averaging)."""
    jax = require_jax()
    return jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float32), params)


def flatten_named(params, prefix: str = "") -> dict[str, np.ndarray]:
    """``{"a/0/W": array, ...}``: the pytree's leaves by path (for model files)."""
    out: dict[str, np.ndarray] = {}

    def walk(node, path):
        if isinstance(node, dict):
            for key in sorted(node):
                walk(node[key], f"{path}/{key}" if path else str(key))
        elif isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                walk(item, f"{path}/{i}" if path else str(i))
        else:
            out[path] = np.asarray(node, dtype=np.float32)

    walk(params, prefix)
    return out


def unflatten_named(arrays: dict[str, np.ndarray], prefix: str):
    """The pytree below ``prefix`` from :func:`flatten_named`'s ``{"path": array}``.

    Path parts that are all digits at one level become a list, others a dict.
    """
    tree: dict = {}
    head = prefix + "/"
    for path, value in arrays.items():
        if not path.startswith(head):
            continue
        node = tree
        parts = path[len(head):].split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    if not tree:
        raise fail(f"parameters {prefix!r}", "are missing from the model",
                   "Pass a model.npz written by the same algorithm.")

    def build(node):
        if not isinstance(node, dict):
            return node
        if all(key.isdigit() for key in node):
            return [build(node[key]) for key in sorted(node, key=int)]
        return {key: build(value) for key, value in node.items()}

    return build(tree)
