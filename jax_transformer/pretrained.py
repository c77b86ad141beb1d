"""The Flax model's parameters as torch-named tensors, and the checkpoint directory.

The naming rule itself is transformer_core.checkpoint_dir.flax_path_to_torch_key
(written once). Nothing here imports the model: it works on any nnx.Module whose
parameter paths follow that rule and that has a `config`. A model whose layer
stacks are scanned (jax_transformer/scanned.py) reads and writes the same
per-layer tensors.
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer import scanned
from transformer_core import checkpoint_dir


def to_torch_state_dict(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's parameters as torch-named, torch-layout numpy arrays."""
    tensors = {}
    params = scanned.per_layer_state(nnx.state(model, nnx.Param))
    for path, variable in nnx.to_flat_state(params):
        key, transpose = checkpoint_dir.flax_path_to_torch_key(path)
        value = np.asarray(variable.get_value())
        tensors[key] = np.array(value.T if transpose else value)  # writable, contiguous
    return tensors


def load_torch_state_dict(model: nnx.Module, state_dict: Mapping[str, object]) -> nnx.Module:
    """Copy torch-named tensors (numpy arrays or torch tensors) into `model`, in place.

    Every key and shape is checked before any parameter is written, so a bad
    state dict leaves the model untouched. Values keep their dtype.
    """
    tensors = {k: _to_numpy(v) for k, v in state_dict.items()}
    checkpoint_dir.check_state_dict(tensors, model.config)
    params = scanned.per_layer_state(nnx.state(model, nnx.Param))
    for path, variable in nnx.to_flat_state(params):
        key, transpose = checkpoint_dir.flax_path_to_torch_key(path)
        value = tensors[key].T if transpose else tensors[key]
        variable.set_value(jnp.asarray(value))
    nnx.update(model, scanned.stacked_state(params) if scanned.is_scanned(model) else params)
    return model


def save_pretrained(model: nnx.Module, directory, tokenizer=None):
    return checkpoint_dir.save_dir(directory, model.config, to_torch_state_dict(model),
                                   tokenizer=tokenizer)


def load_pretrained(model_class, directory, *, dtype=None, param_dtype=None, seed: int = 0):
    """Build a `model_class(config, rngs=..., dtype=..., param_dtype=...)` from a
    checkpoint directory.

    `param_dtype` defaults to the dtype stored in the file; `dtype` (compute)
    defaults to `param_dtype`.
    """
    config, tensors = checkpoint_dir.load_dir(directory)
    return from_tensors(model_class, config, tensors, dtype=dtype, param_dtype=param_dtype,
                        seed=seed)


def from_tensors(model_class, config, tensors: Mapping[str, np.ndarray], *, dtype=None,
                 param_dtype=None, seed: int = 0):
    """`model_class(config, ...)` holding a checkpoint's torch-named `tensors` (as
    load_pretrained, from tensors already read)."""
    param_dtype = param_dtype or next(iter(tensors.values())).dtype
    model = model_class(config, rngs=nnx.Rngs(seed), dtype=dtype or param_dtype,
                        param_dtype=param_dtype)
    return load_torch_state_dict(model, {k: v.astype(param_dtype) for k, v in tensors.items()})


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor; torch itself is not imported here
        value = value.detach().cpu().numpy()
    return np.asarray(value)
