"""Layer stacks stored with a leading layer axis and run as one scan, so that a
training step compiles one layer's program whatever the depth.

    scan_layers(model, unroll=1)    every layer stack of `model` scanned, in place
    run_layers(layers, x, *args)    -> x, [per-layer outputs]   (Encoder, Decoder)
    per_layer_state(state)          a scanned model's state in the per-layer layout
    stacked_state(state)            ... and back; map_states: on every State of a pytree

A stack (`Encoder.layers`, `Decoder.layers`) is an nnx.List of identical layers,
run in a Python loop: jit traces and XLA compiles every layer separately, and
compile time grows with depth. `scan_layers` makes each stack a ScannedLayers:
one layer module, `stacked`, whose every variable holds the N layers' values on
a leading axis (N, ...), built by stacking the N built layers (the same
parameters and dropout streams as the unscanned model, so the same masks).
`run_layers` runs it with one `jax.lax.scan` over that axis: each dropout layer
draws from its own layer's stream and its counter advances in the stacked state,
so a resumed run draws the masks it would have drawn. `unroll` (jax.lax.scan's)
trades compile time back for step time.

The files keep the per-layer layout: a scanned model's state path
`encoder/layers/stacked/ffn/W_1/kernel` (N, D, F) is `encoder/layers/{i}/ffn/W_1/kernel`
(D, F) for each i in checkpoint directories (jax_transformer/pretrained.py) and in
orbax training checkpoints (train/checkpoints.py), through `per_layer_state` and
`stacked_state`; a run resumes with either setting.

Incremental decoding (a per-layer key/value cache, one position per step) runs
the stacked layers in a loop, each layer its slice of the stacked variables.

Inside `with layers_gathered(gather):` every layer (looped or scanned) runs on
`gather(its variables)` under jax.checkpoint, which saves the layer's matmul
outputs but not what `gather` returns. A training step with --fsdp passes a
gather that makes a layer's split weights whole (train/step.py): one layer's
weights are whole at a time, gathered again in the backward pass, and the
layer's gradients leave it split (ZeRO-3).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
from flax import nnx

# Whether `train.py --scan-layers auto` scans, per backend (docs/performance.md,
# "Compile time and scanned layer stacks"); TPU as MaxText, which scans there by default.
SCAN_BY_DEFAULT = {"cpu": False, "gpu": True, "tpu": True}
STACKS = "layers"  # the attribute of Encoder and Decoder holding their layers
STACKED = "stacked"  # ScannedLayers' one module, every variable (N, ...)


class ScannedLayers(nnx.Module):
    """N identical layers as one module whose variables have a leading layer axis."""

    def __init__(self, layers, unroll: int = 1):
        self.num_layers, self.unroll = len(layers), unroll
        graphdef = nnx.graphdef(layers[0])
        self.stacked = nnx.merge(graphdef, _stack([nnx.state(layer) for layer in layers]))

    def __len__(self):
        return self.num_layers

    def __iter__(self):
        """The N layers, each with its slice of the stacked variables: copies, for
        decoding (Decoder.init_cache, decode_step), which changes no variable."""
        graphdef, state = nnx.split(self.stacked)
        return iter([nnx.merge(graphdef, _take(state, i)) for i in range(self.num_layers)])


def scan_wanted(choice: str, backend: str) -> bool:
    """--scan-layers: "on", "off", or "auto" (SCAN_BY_DEFAULT for `backend`)."""
    return SCAN_BY_DEFAULT.get(backend, False) if choice == "auto" else choice == "on"


def scan_layers(model: nnx.Module, unroll: int = 1) -> nnx.Module:
    """Make every layer stack of `model` a ScannedLayers, in place; returns `model`."""
    for _, module in list(nnx.iter_modules(model)):
        layers = getattr(module, STACKS, None)
        if isinstance(layers, nnx.List) and len(layers) > 0:
            setattr(module, STACKS, ScannedLayers(layers, unroll=unroll))
    return model


def is_scanned(model: nnx.Module) -> bool:
    """Whether `model` holds any ScannedLayers."""
    return any(isinstance(module, ScannedLayers) for _, module in nnx.iter_modules(model))


def is_stacked(state: nnx.State) -> bool:
    """Whether `state` holds stacked layers (`.../layers/stacked/...`)."""
    return any(_stacked_at(path) is not None for path, _ in nnx.to_flat_state(state))


_GATHER = contextvars.ContextVar("layer_gather", default=None)


@contextlib.contextmanager
def layers_gathered(gather):
    """Within it, each layer runs on `gather(its variables)` (see the docstring above)."""
    token = _GATHER.set(gather)
    try:
        yield
    finally:
        _GATHER.reset(token)


def run_layers(layers, x, *args, per_layer=None):
    """x through each layer in turn, `layer(x, *args[, its item of per_layer])` ->
    (x, *outputs); returns x and, for each output, the list of its N values.
    A ScannedLayers runs as a scan, or, with `per_layer` (a decoding cache), as a
    loop over its layers' slices."""
    if isinstance(layers, ScannedLayers) and per_layer is None:
        return _scan(layers, x, args)
    outputs = []
    for i, layer in enumerate(layers):
        if per_layer is None and _GATHER.get() is not None:
            graphdef, state = nnx.split(layer)
            x, streams, layer_outputs = _layer_function(graphdef, args)(x, state)
            nnx.update(layer, streams)
        else:
            extra = () if per_layer is None else (per_layer[i],)
            x, *layer_outputs = layer(x, *args, *extra)
        outputs.append(layer_outputs)
    return x, *(list(values) for values in zip(*outputs))


def _scan(layers: ScannedLayers, x, args):
    graphdef, state = nnx.split(layers.stacked)
    run = _layer_function(graphdef, args)

    def one_layer(x, layer_state):
        x, streams, outputs = run(x, layer_state)
        return x, (streams, outputs)

    x, (streams, outputs) = jax.lax.scan(one_layer, x, state, unroll=layers.unroll)
    if _draws_dropout(layers.stacked):  # else nothing advanced (and eval may run under jit)
        nnx.update(layers.stacked, streams)
    return x, *([None if value is None else value[i] for i in range(layers.num_layers)]
                for value in outputs)  # (N, ...) -> a list of N


def _layer_function(graphdef, args):
    """(x, a layer's variables) -> (x, its dropout streams' advanced counters, its
    other outputs): the layer `layer(x, *args)`, on gathered variables within
    `layers_gathered`."""
    gather = _GATHER.get()

    def run(x, state):
        layer = nnx.merge(graphdef, state if gather is None else gather(state))
        x, *outputs = layer(x, *args)
        return x, nnx.state(layer, nnx.RngState), outputs

    if gather is None:
        return run
    return jax.checkpoint(run, policy=jax.checkpoint_policies.dots_saveable)


def _draws_dropout(module: nnx.Module) -> bool:
    """Whether running `module` draws from dropout streams (a Dropout in training mode)."""
    return any(isinstance(m, nnx.Dropout) and not m.deterministic and m.rate > 0
               for _, m in nnx.iter_modules(module))


def _stack(states):
    return jax.tree.map(lambda *values: jnp.stack(values), *states)  # each leaf (N, ...)


def _take(tree, i: int):
    return jax.tree.map(lambda value: value[i], tree)


# ------------------------------------------------------- the per-layer layout

def per_layer_state(state: nnx.State) -> nnx.State:
    """`state` (of a model, or a tree shaped like its state: an optimizer's moments)
    with every `.../layers/stacked/...` leaf (N, ...) split into
    `.../layers/{i}/...` leaves; other leaves as they are."""
    flat = []
    for path, leaf in nnx.to_flat_state(state):
        at = _stacked_at(path)
        if at is None:
            flat.append((path, leaf))
            continue
        count = jax.tree.leaves(leaf)[0].shape[0]
        flat.extend(((*path[:at], i, *path[at + 1:]), _take(leaf, i)) for i in range(count))
    return nnx.from_flat_state(flat)


def stacked_state(state: nnx.State) -> nnx.State:
    """The inverse of `per_layer_state`: every `.../layers/{i}/...` group of leaves
    stacked into one `.../layers/stacked/...` leaf (N, ...)."""
    groups: dict[tuple, list] = {}
    flat = []
    for path, leaf in nnx.to_flat_state(state):
        at = _layer_index_at(path)
        if at is None:
            flat.append((path, leaf))
        else:
            groups.setdefault((*path[:at], STACKED, *path[at + 1:]), []).append((path[at], leaf))
    for path, numbered in groups.items():
        flat.append((path, _stack([leaf for _, leaf in sorted(numbered, key=lambda n: n[0])])))
    return nnx.from_flat_state(flat)


def in_layer_stack(path) -> bool:
    """Whether a state path is a layer's variable: `.../layers/{i}/...` or, scanned,
    `.../layers/stacked/...` (else: embeddings, final norms, the output projection)."""
    return _stacked_at(path) is not None or _layer_index_at(path) is not None


def map_states(function, tree):
    """`function` applied to every nnx.State in a pytree (a TrainState: parameters,
    dropout streams, the optimizer's moments); other leaves unchanged."""
    return jax.tree.map(lambda node: function(node) if isinstance(node, nnx.State) else node,
                        tree, is_leaf=lambda node: isinstance(node, nnx.State))


def _stacked_at(path) -> int | None:
    """Where `stacked` follows `layers` in a state path, or None."""
    return next((i for i in range(1, len(path))
                 if path[i] == STACKED and path[i - 1] == STACKS), None)


def _layer_index_at(path) -> int | None:
    """Where a layer number follows `layers` in a state path, or None."""
    return next((i for i in range(1, len(path))
                 if isinstance(path[i], int) and path[i - 1] == STACKS), None)
