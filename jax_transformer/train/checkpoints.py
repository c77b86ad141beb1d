"""Training checkpoints with orbax: periodic, atomic, keep the last N, async.

A run's work directory:

    WORKDIR/config.json          the model config
    WORKDIR/tokenizer.model      the SentencePiece model
    WORKDIR/checkpoints/<step>/  params | train (step, dropout RNG, optimizer) | data (iterator position)
    WORKDIR/checkpoints-corrupt/<step>/  checkpoints that could not be read back, set aside
    WORKDIR/export/              the final model in the checkpoint directory format

Orbax writes each step into a temporary directory and renames it when complete,
so a run killed mid-save leaves the previous checkpoint as the latest one. A
checkpoint damaged afterwards (a disk fault, a truncated copy) is set aside on
resume, and the run goes on from the newest one that reads back whole.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Callable

import jax
import orbax.checkpoint as ocp
from flax import nnx

from jax_transformer import scanned
from jax_transformer.model import TokenModel, build_model
from jax_transformer.train import selection
from jax_transformer.train.runtime import peers
from jax_transformer.train.step import TrainState
from transformer_core.checkpoint_dir import CONFIG_FILE, CheckpointError
from transformer_core.config import TransformerConfig

CHECKPOINTS = "checkpoints"
CORRUPT = "checkpoints-corrupt"


class UnreadableCheckpoint(CheckpointError):
    """A saved step cannot be read back (damaged files, or a model it does not fit)."""

    def __init__(self, step: int, message: str):
        super().__init__(message)
        self.step = step


UNFINISHED_SAVE = ".orbax-checkpoint-tmp"  # in the name of a save orbax has not finished


class Checkpointer:
    def __init__(self, workdir: str | Path, keep: int = 3, async_save: bool = True,
                 clean_up: bool = False, best: str | None = None):
        """`best`: a metric (train.settings.training.BEST_METRICS) by which the best checkpoint
        saved with metrics is kept besides the newest `keep`. `clean_up`: remove the
        unfinished saves (orbax's *.orbax-checkpoint-tmp* directories) a killed or failed
        run left, before anything else (the primary process); for the training run, which
        holds the work directory, never for a reader (port, parity) that may look at a
        directory a run is writing. Done here, not by orbax's cleanup_tmp_directories,
        which runs on a thread that close() does not wait for: a run failing early then
        printed its traceback at exit."""
        directory = Path(workdir).absolute() / CHECKPOINTS
        if clean_up and jax.process_index() == 0 and directory.is_dir():
            for unfinished in directory.glob(f"*{UNFINISHED_SAVE}*"):
                shutil.rmtree(unfinished, ignore_errors=True)
        if clean_up:  # the other processes look at the directory once it is clean
            peers.barrier("unfinished saves removed")
        if best is not None:  # saves between evaluations have no metrics, as meant
            logging.getLogger("absl").addFilter(_drop_no_metrics_warning)
        self.manager = ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=async_save, **selection.kept_checkpoints(keep, best)))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        """The step of the best checkpoint saved with metrics (`best`), else the newest."""
        return self.manager.best_step()

    def save(self, state: TrainState, data_state: dict, metrics: dict | None = None) -> None:
        """Save `state` in the per-layer layout, whether or not its layers are scanned;
        `metrics` (an evaluation's) rank it for `best`, saved with the step, which ranks
        ties (selection.kept_checkpoints)."""
        step = int(jax.device_get(state.step))
        if metrics is not None:
            metrics = {**metrics, "step": step}
        params, rngs, opt_state = scanned.map_states(
            scanned.per_layer_state, (state.params, state.rngs, state.opt_state))
        self.manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            train=ocp.args.StandardSave({"step": state.step, "rngs": rngs,
                                         "opt_state": opt_state}),
            data=ocp.args.JsonSave(data_state)), metrics=metrics, force=True)

    def restore(self, like: TrainState, step: int | None = None) -> tuple[TrainState, dict]:
        """Restore into the structure, dtypes and shardings of `like`, its layer stacks
        scanned or not (the checkpoint holds the per-layer layout)."""
        params, rngs, opt_state = scanned.map_states(
            scanned.per_layer_state, (like.params, like.rngs, like.opt_state))
        restored = self._restore(step, params=params, data=None, train={
            "step": like.step, "rngs": rngs, "opt_state": opt_state})
        params, rngs, opt_state = (restored.params, restored.train["rngs"],
                                   restored.train["opt_state"])
        if scanned.is_stacked(like.params):
            params, rngs, opt_state = scanned.map_states(scanned.stacked_state,
                                                         (params, rngs, opt_state))
        state = dataclasses.replace(like, step=restored.train["step"], params=params,
                                    rngs=rngs, opt_state=opt_state)
        return state, restored.data

    def restore_newest_intact(self, like: TrainState,
                              warn: Callable[[str], None] = print) -> tuple[TrainState, dict]:
        """`restore` the newest step that reads back. Newer steps that do not are moved
        to WORKDIR/checkpoints-corrupt/ (kept, not deleted) and named through `warn`;
        if no step reads back, nothing is moved and the newest step's error is raised."""
        unreadable = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self.restore(like, step)
            except UnreadableCheckpoint as error:
                unreadable.append(error)
                continue
            for error in unreadable:
                warn(f"warning: {error}; moved it to {self.set_aside(error.step)} and resumed "
                     f"from step {step}")
            return restored
        if unreadable:
            raise unreadable[0]
        raise FileNotFoundError(f"no checkpoint under {self.manager.directory}")

    def set_aside(self, step: int) -> Path:
        """Move checkpoint `step` out of the checkpoints directory (process 0 moves it);
        returns where it went."""
        target = first = Path(self.manager.directory).parent / CORRUPT / str(step)
        copies = 0
        while target.exists():  # a step set aside before, in an earlier resume
            copies += 1
            target = first.with_name(f"{step}.{copies}")
        if jax.process_index() == 0:
            target.parent.mkdir(exist_ok=True)
            shutil.move(Path(self.manager.directory) / str(step), target)
        self.manager.reload()
        return target

    def data_state(self, step: int | None = None) -> dict | None:
        """Only the data position saved with `step` (the latest by default), or None
        where it cannot be read (restore_newest_intact says why)."""
        try:
            return self._restore(step, data=None).data
        except UnreadableCheckpoint:
            return None

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
        drop_failed_restore_echoes()  # installed before: the reports can come before the raise
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as e:  # orbax, tensorstore and json raise many types for one fault
            cause = root_cause(e)
            reason = str(cause).split("\n")[0][:300]
            raise UnreadableCheckpoint(step, f"checkpoint {step} in {self.manager.directory} "
                                             f"cannot be read: {type(cause).__name__}: {reason}"
                                       ) from e

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def root_cause(error: BaseException) -> BaseException:
    """The error that `error` was raised from (`raise ... from`, followed to its start):
    orbax raises tensorstore's error, which names the array file and what is wrong with
    it, from a bare Exception whose message is the repr of a bound method,
    `<bound method pybind11_detail_function_record_...spec of TensorStore({...`."""
    seen = {id(error)}
    while error.__cause__ is not None and id(error.__cause__) not in seen:
        error = error.__cause__
        seen.add(id(error))
    return error


def complete_steps(workdir: str | Path) -> list[int]:
    """The steps saved whole under WORKDIR/checkpoints, read from the directory alone
    (orbax renames a step's directory to its number once every file is written)."""
    directory = Path(workdir).absolute() / CHECKPOINTS
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def drop_failed_restore_echoes() -> None:
    """Silence the echoes of a failed restore, which come after its own error (raised
    as UnreadableCheckpoint) as dozens of tracebacks: tensorstore reads still in flight
    calling back into orbax's event loop after it closed (unraisable `RuntimeError:
    Event loop is closed`), and the reads of the checkpoint's other arrays, dropped
    with their errors (`failed_read`): unraisable coroutines, asyncio's "exception
    was never retrieved" records, "coroutine ... was never awaited" warnings. Other
    unraisable errors and records still show."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_restore_echoes", False):
        return

    def hook(unraisable):
        if not failed_restore_echo(unraisable.exc_value):
            previous(unraisable)

    hook.drops_restore_echoes = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_drop_failed_reads)
    warnings.filterwarnings("ignore", message=f"coroutine '{ARRAY_READ}' was never awaited",
                            category=RuntimeWarning)


ARRAY_READ = "_read_array_index_and_device_put"  # orbax's coroutine reading one array
# How orbax (wrapping tensorstore's error) and tensorstore say that a read failed.
ORBAX_READ_ERROR = "Encountered error while reading array index"
# tensorstore's read failure, or its failure to open an array's driver on a damaged file.
TENSORSTORE_READ_ERROR = re.compile(r"[A-Z_]+: Error (reading|opening) ")


def failed_read(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is a checkpoint array's read
    failing."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if ORBAX_READ_ERROR in text or TENSORSTORE_READ_ERROR.match(text):
            return True
        error = error.__cause__
    return False


def failed_restore_echo(error: BaseException | None) -> bool:
    """Whether an unraisable error repeats a failed restore (drop_failed_restore_echoes)."""
    return (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
            or failed_read(error))


def _drop_no_metrics_warning(record: logging.LogRecord) -> bool:
    """A logging filter: False for orbax's warning that a save has no metrics."""
    return "did not provide metrics" not in record.getMessage()


def _drop_failed_reads(record: logging.LogRecord) -> bool:
    """A logging filter: False for a record of a failed read (asyncio's "exception was
    never retrieved")."""
    return not (record.exc_info and failed_read(record.exc_info[1]))


def run_directory(path: str | Path) -> Path:
    """A run's work directory, given it or its checkpoints/ directory."""
    path = Path(path)
    if path.name == CHECKPOINTS and not (path / CONFIG_FILE).exists():
        path = path.parent
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a train.py work directory (no {CONFIG_FILE})")
    return path


def restore_model(path: str | Path, step: int | None = None) -> TokenModel:
    """The model (float32 parameters) from a training run's work directory or its
    checkpoints/ directory, of the class its config's architecture names (a --task lm
    run's is decoder_only); the latest step unless `step` is given."""
    workdir = run_directory(path)
    model = build_model(TransformerConfig.from_json(workdir / CONFIG_FILE), rngs=nnx.Rngs(0))
    checkpointer = Checkpointer(workdir)
    try:
        nnx.update(model, checkpointer.restore_params(nnx.state(model, nnx.Param), step))
    finally:
        checkpointer.close()
    return model
