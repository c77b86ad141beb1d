"""Our own checkpoints in their other forms -> the checkpoint directory: torch_reference
state dicts (--from torch-reference) and train.py's orbax training checkpoints (--from
jax-orbax)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from jax_transformer.port.options import Format, like, option
from jax_transformer.port.reading import PortError, read_weights, torch_load
from transformer_core import checkpoint_dir
from transformer_core.config import ConfigError, TransformerConfig


@dataclasses.dataclass(frozen=True)
class TorchReferenceOptions:
    """--from torch-reference's flags."""
    config: str | None = option(None, "our config.json for the state dict", path=True)
    tokenizer: str | None = option(None, "a SentencePiece model to copy as tokenizer.model",
                                   path=True)


@dataclasses.dataclass(frozen=True)
class JaxOrbaxOptions:
    """--from jax-orbax's flags."""
    tokenizer: str | None = like(TorchReferenceOptions, "tokenizer")
    step: int | None = option(None, "the step to restore", unset="latest")


def convert_torch_reference(src: str | Path, out_dir: str | Path,
                            config_path: str | Path | None = None,
                            tokenizer: str | Path | None = None) -> TransformerConfig:
    """A torch.save'd torch_reference state dict (or {"config": dict, "state_dict": ...})."""
    config = None
    if config_path is not None:
        config = TransformerConfig.from_json(config_path)
    else:
        obj = torch_load(Path(src)) if Path(src).suffix != ".safetensors" else None
        if isinstance(obj, Mapping) and isinstance(obj.get("config"), Mapping):
            try:
                config = TransformerConfig.from_dict(dict(obj["config"]))
            except ConfigError as e:
                raise PortError(f"{src}: {e}") from e
    if config is None:
        raise PortError("--config config.json is required: the state dict does not carry one")
    tensors = read_weights(src)
    tensors.pop("config", None)
    try:
        with checkpoint_dir.directory_written_whole(out_dir) as tmp:
            checkpoint_dir.save_dir(tmp, config, tensors, tokenizer=tokenizer)
    except checkpoint_dir.CheckpointError as e:
        raise PortError(str(e)) from e
    return config


def convert_jax_orbax(src: str | Path, out_dir: str | Path, step: int | None = None,
                      tokenizer: str | Path | None = None) -> TransformerConfig:
    """A training checkpoint written by train.py (orbax, under WORKDIR/checkpoints)."""
    from jax_transformer.train.checkpoints import restore_model, run_directory
    try:
        model = restore_model(src, step=step)
    except FileNotFoundError as e:
        raise PortError(str(e)) from e
    if tokenizer is None:  # the run's own tokenizer, when it has one
        tokenizer = checkpoint_dir.tokenizer_path(run_directory(src))
    with checkpoint_dir.directory_written_whole(out_dir) as tmp:
        model.save_pretrained(tmp, tokenizer=tokenizer)
    return model.config


def _torch_reference(src: str, out: str, options: Mapping[str, Any]) -> TransformerConfig:
    return convert_torch_reference(src, out, options.get("config"), options.get("tokenizer"))


def _jax_orbax(src: str, out: str, options: Mapping[str, Any]) -> TransformerConfig:
    return convert_jax_orbax(src, out, options.get("step"), options.get("tokenizer"))


TORCH_REFERENCE = Format("torch-reference", _torch_reference, TorchReferenceOptions)
JAX_ORBAX = Format("jax-orbax", _jax_orbax, JaxOrbaxOptions)
