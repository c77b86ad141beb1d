"""Training checkpoints with orbax: periodic, atomic, keep the last N, async.

A run's work directory:

    WORKDIR/config.json          the model config
    WORKDIR/tokenizer.model      the SentencePiece model
    WORKDIR/checkpoints/<step>/  params | train (step, dropout RNG, optimizer) | data (iterator position)
    WORKDIR/export/              the final model in the checkpoint directory format

Orbax writes each step into a temporary directory and renames it when complete,
so a run killed mid-save leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

from jax_transformer.model import Transformer
from jax_transformer.train.step import TrainState
from transformer_core.checkpoint_dir import CONFIG_FILE
from transformer_core.config import TransformerConfig

CHECKPOINTS = "checkpoints"


class Checkpointer:
    def __init__(self, workdir: str | Path, keep: int = 3, async_save: bool = True):
        self.manager = ocp.CheckpointManager(
            Path(workdir).absolute() / CHECKPOINTS,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                 enable_async_checkpointing=async_save))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: TrainState, data_state: dict) -> None:
        step = int(state.step)
        self.manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            train=ocp.args.StandardSave({"step": state.step, "rngs": state.rngs,
                                         "opt_state": state.opt_state}),
            data=ocp.args.JsonSave(data_state)), force=True)

    def restore(self, like: TrainState, step: int | None = None) -> tuple[TrainState, dict]:
        """Restore into the structure, dtypes and shardings of `like`."""
        restored = self._restore(step, params=like.params, data=None, train={
            "step": like.step, "rngs": like.rngs, "opt_state": like.opt_state})
        train = restored.train
        state = dataclasses.replace(like, step=train["step"], params=restored.params,
                                    rngs=train["rngs"], opt_state=train["opt_state"])
        return state, restored.data

    def restore_params(self, like: nnx.State, step: int | None = None) -> nnx.State:
        """Only the parameters, into the structure of `like`."""
        return self._restore(step, params=like).params

    def _restore(self, step: int | None, **likes):
        """Restore the named items: a pytree into the structure, dtypes and shardings
        of its `like`, or JSON where `like` is None. The latest step by default."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.manager.directory}")
        args = {name: ocp.args.JsonRestore() if like is None else ocp.args.StandardRestore(
                    jax.tree.map(ocp.utils.to_shape_dtype_struct, like))
                for name, like in likes.items()}
        return self.manager.restore(step, args=ocp.args.Composite(**args))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def run_directory(path: str | Path) -> Path:
    """A run's work directory, given it or its checkpoints/ directory."""
    path = Path(path)
    if path.name == CHECKPOINTS and not (path / CONFIG_FILE).exists():
        path = path.parent
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a train.py work directory (no {CONFIG_FILE})")
    return path


def restore_model(path: str | Path, step: int | None = None) -> Transformer:
    """The model (float32 parameters) from a training run's work directory or its
    checkpoints/ directory; the latest step unless `step` is given."""
    workdir = run_directory(path)
    model = Transformer(TransformerConfig.from_json(workdir / CONFIG_FILE), rngs=nnx.Rngs(0))
    checkpointer = Checkpointer(workdir)
    try:
        nnx.update(model, checkpointer.restore_params(nnx.state(model, nnx.Param), step))
    finally:
        checkpointer.close()
    return model
