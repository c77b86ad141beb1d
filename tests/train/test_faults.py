"""Faults and bad input around train.py, met as a user meets them: signals sent to a
real process at random moments, damaged files in a work directory, two runs on one
directory, a corpus changed under a run, bad flags."""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from jax_transformer.commands import train as train_command
from jax_transformer.data.tokenizing import encode_pairs
from jax_transformer.data.prepared.directory import SPLITS, Prepared
from jax_transformer.train import checkpoints, disk_full, inputs
from jax_transformer.train.records.workdir import MetricsLog, open_workdir
from jax_transformer.train.selection import Patience
from jax_transformer.train.settings.data import DataSettings
from tests.train.runs import (REPO_ROOT, TINY, dev_losses, losses, metrics_scalars,
                              tensorboard_scalars, tiny_run, tiny_settings)
from transformer_core.errors import TrainError
from transformer_core.tokenizer import Tokenizer

STEPS = 60  # the runs interrupted at random moments stop short of this
TRIALS = 6  # signals per kind
# Subprocesses reuse compiled steps through JAX's persistent cache (conftest.py),
# so a trial costs its start-up, not a recompilation.
ENV = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


class TrainProcess:
    """train.py in a subprocess, its stderr collected line by line."""

    def __init__(self, workdir: Path, *extra: str):
        self.started = time.time()
        self.process = subprocess.Popen(
            [sys.executable, "train.py", "--workdir", str(workdir), *TINY, *extra],
            cwd=REPO_ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stderr))
        self.reader.start()

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None, f"exited before {text!r}: {self.stderr}"
            assert time.time() < deadline, f"no {text!r} after {timeout}s: {self.stderr}"
            time.sleep(0.01)

    def send(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def finish(self) -> int:
        code = self.process.wait(timeout=240)
        self.reader.join()
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


def batches_read(workdir: Path, step: int) -> int:
    """How many training batches the data position saved with checkpoint `step` is past."""
    position = data_position(workdir, step)
    data, _, train_settings = tiny_settings(workdir)
    prepared = Prepared(workdir / inputs.DATA_DIR)
    batches = inputs.make_batches({split: prepared.sides(split) for split in SPLITS}, data,
                                  train_settings.seed)["train"]
    return sum(len(batches.epoch_plan(e)) for e in range(position["epoch"])) + position["index"]


def data_position(workdir: Path, step: int) -> dict:
    checkpointer = checkpoints.Checkpointer(workdir)
    try:
        return checkpointer.manager.restore(
            step, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data
    finally:
        checkpointer.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run."""
    workdir = tmp_path_factory.mktemp("reference")
    tiny_run(workdir, "--steps", str(STEPS))
    return workdir


def interrupt_at_random_moments(workdir: Path, signum: int, *extra: str) -> list[int]:
    """TRIALS runs of train.py on `workdir` (with the flags `extra`), each sent `signum`
    at a seeded random moment and sometimes a second time; checks each stop; returns
    the steps saved."""
    rng = random.Random(signum)
    saved_steps = []
    for trial in range(TRIALS):
        process = TrainProcess(workdir, "--steps", str(STEPS), "--checkpoint-every", "1", *extra)
        moment = rng.random()
        if moment < 0.2:  # start-up: imports, corpus, tokenizer
            time.sleep(rng.uniform(0.2, 2.5))
        elif moment < 0.35:  # restoring, compiling ahead
            process.wait_for("model:")
            time.sleep(rng.uniform(0, 1))
        else:  # stepping, evaluating, saving
            process.wait_for("compiled in")
            time.sleep(rng.uniform(0, 3))
        process.send(signum)
        once = rng.random() >= 0.3
        if not once:
            time.sleep(rng.uniform(0, 0.3))
            process.send(signum)
        code = process.finish()
        last_line = process.stderr.strip().splitlines()[-1]
        assert code == 128 + signum, process.stderr[-3000:]
        assert "Traceback" not in process.stderr, process.stderr[-3000:]
        assert last_line.startswith(signal.Signals(signum).name + ": "), last_line
        if moment >= 0.35 and once:  # "compiled in" is said once stops wait for the step
            assert " saved step " in last_line, last_line
        if " saved step " in last_line:
            step = int(last_line.split(" saved step ")[1].split()[0])
            saved_steps.append(step)
            assert max(s for s, _ in losses(workdir)) == step  # its metrics are written...
            if step % 6 == 0:
                assert dev_losses(workdir)[-1][0] == step  # ...its evaluation too
            assert batches_read(workdir, step) == step  # one batch per step, no more
    return saved_steps


@pytest.fixture(scope="module")
def scanned_reference(tmp_path_factory) -> Path:
    """The uninterrupted run, its layer stacks scanned."""
    workdir = tmp_path_factory.mktemp("scanned_reference")
    tiny_run(workdir, "--steps", str(STEPS), "--scan-layers", "on")
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("scan", ["off", "on"])
def test_signals_at_random_moments_leave_runs_that_resume_exactly(request, scan, tmp_path):
    """SIGTERM and SIGINT, TRIALS seeded random moments each (the two series run side
    by side): start-up, compiling ahead, stepping, evaluating, saving (a checkpoint every
    step), and sometimes a second signal that abandons the step. Every stop exits
    128 + the signal number with one line, no traceback; a saved step has its data
    position and its metrics lines; each run then resumes and ends with the
    uninterrupted run's train and dev losses, bit for bit. With the layer stacks
    looped and scanned (--scan-layers)."""
    reference = request.getfixturevalue("reference" if scan == "off" else "scanned_reference")

    def series(signum):
        workdir = tmp_path / signal.Signals(signum).name
        saved_steps = interrupt_at_random_moments(workdir, signum, "--scan-layers", scan)
        finished = TrainProcess(workdir, "--steps", str(STEPS), "--scan-layers", scan)
        assert finished.finish() == 0, finished.stderr[-3000:]
        return workdir, saved_steps

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(series, (signal.SIGTERM, signal.SIGINT)))
    for workdir, saved_steps in results:
        # The seeded moments aim one signal at training 2 (SIGTERM) and 4 (SIGINT) times,
        # and each of those must save; a second signal may or may not leave a save. The
        # others: start-up (SIGTERM, twice), compiling ahead (SIGTERM once and twice,
        # SIGINT once), training twice (both).
        assert len(saved_steps) >= 2, f"few stops mid-training: {saved_steps}"
        assert losses(workdir) == losses(reference)
        assert dev_losses(workdir) == dev_losses(reference)


@pytest.mark.slow
def test_sigterm_leaves_tensorboard_files_with_every_saved_step(tmp_path):
    """A SIGTERM mid-training: the event files are closed with everything up to the
    saved step, as metrics.jsonl has it."""
    process = TrainProcess(tmp_path, "--steps", "100000", "--eval-every", "3")
    process.wait_for("compiled in")
    metrics, deadline = tmp_path / "metrics.jsonl", time.time() + 120
    while not metrics.exists() or metrics.read_text().count("dev_loss") < 2:
        assert time.time() < deadline, process.stderr[-3000:]  # two evaluations written
        time.sleep(0.05)
    process.send(signal.SIGTERM)
    assert process.finish() == 128 + signal.SIGTERM, process.stderr[-3000:]
    saved = int(process.stderr.strip().splitlines()[-1].split(" saved step ")[1].split()[0])
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars == metrics_scalars(tmp_path)
    assert scalars["train/loss"][-1][0] == saved


@pytest.mark.slow
def test_a_second_run_on_a_busy_workdir_is_refused_until_the_first_ends(tmp_path):
    first = TrainProcess(tmp_path, "--steps", "100000")
    try:
        first.wait_for("model:")
        second = subprocess.run([sys.executable, "train.py", "--workdir", str(tmp_path), *TINY,
                                 "--steps", "1"], cwd=REPO_ROOT, env=ENV, capture_output=True,
                                text=True, timeout=240)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1] == (
            f"error: --workdir {tmp_path} is in use by another train.py run (it holds "
            f"{tmp_path / 'train.lock'}); wait for it to end or choose another --workdir")
        assert first.process.poll() is None  # untouched by the refused run
    finally:
        first.send(signal.SIGKILL)
        first.finish()
    _, lock = open_workdir(tmp_path)  # a killed run leaves no stale lock
    lock.release()


def halve(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


DAMAGES = {"every-file": lambda path: True,
           "array-files": lambda path: "ocdbt" in str(path) or path.parent.name == "d",
           # the arrays' chunks, not the OCDBT manifests that index them
           "array-chunks": lambda path: path.parent.name == "d" and "ocdbt" in str(path)}


@pytest.fixture(scope="module", params=list(DAMAGES))
def damaged_resume(request, reference, tmp_path_factory):
    """A run saved at steps 4 and 8, then step 8 damaged (every file halved, or only
    the tensorstore array files, or only their chunks) and a metrics line cut short;
    resumed to step 12."""
    workdir = tmp_path_factory.mktemp(request.param)
    tiny_run(workdir, "--steps", "8")
    for path in (workdir / "checkpoints" / "8").rglob("*"):
        if path.is_file() and DAMAGES[request.param](path):
            halve(path)
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "loss": 4.0')
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *TINY,
                             "--steps", "12"], cwd=REPO_ROOT, env=ENV, capture_output=True,
                            text=True, timeout=300)
    return workdir, result


@pytest.mark.slow
def test_a_damaged_checkpoint_is_set_aside_and_the_run_resumes_from_an_intact_one(
        damaged_resume, reference):
    workdir, result = damaged_resume
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    warning = next(line for line in result.stderr.splitlines() if "cannot be read" in line)
    assert warning.startswith(f"warning: checkpoint 8 in {workdir / 'checkpoints'} cannot be read")
    assert warning.endswith(f"moved it to {workdir / 'checkpoints-corrupt' / '8'} and resumed "
                            "from step 4")
    # orbax's wrapper of a chunk's error is the repr of a bound method: the cause is shown
    assert "<bound method" not in warning and "pybind11" not in result.stderr
    assert any((workdir / "checkpoints-corrupt" / "8").rglob("*"))  # kept, not deleted
    assert losses(workdir) == losses(reference)[:12]


def read_error(text: str) -> Exception:
    """A failed read as orbax raises it: its Exception from tensorstore's ValueError."""
    try:
        try:
            raise ValueError(text)
        except ValueError as cause:
            raise Exception("Encountered error while reading array index: (slice(0, 32, 1),)"
                            ) from cause
    except Exception as error:
        return error


@pytest.mark.parametrize("error, echo", [
    (RuntimeError("Event loop is closed"), True),
    (read_error('OUT_OF_RANGE: Error reading "x.kernel.value/0.0" in OCDBT database'), True),
    (ValueError('OUT_OF_RANGE: Error reading "x.kernel.value/0.0" in OCDBT database'), True),
    (ValueError('DATA_LOSS: Error opening "cast" driver: Error opening "zarr" driver: Error '
                'reading "x.bias.value/.zarray" in OCDBT database'), True),  # seen in CI
    (RuntimeError("another loop error"), False),
    (ValueError("a real error"), False),
])
def test_only_the_echoes_of_a_failed_restore_are_silenced(error, echo):
    """After a damaged checkpoint's restore fails, orbax's reads of its other arrays are
    dropped with their errors: Python prints them as unraisable coroutines and asyncio
    logs them as "exception was never retrieved", tracebacks after the restore's own
    error (seen in CI on the array-chunks damage). Those are dropped, others kept."""
    assert checkpoints.failed_restore_echo(error) is echo
    record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1,
                               "Future exception was never retrieved", None,
                               (type(error), error, error.__traceback__))
    assert checkpoints._drop_failed_reads(record) is not checkpoints.failed_read(error)
    assert checkpoints.failed_read(error) is (echo and "loop" not in str(error))


def refused(path: str) -> PermissionError:
    """What orbax raises where it cannot make a step's directory (`chattr +i` on its
    parent)."""
    return PermissionError(errno.EPERM, "Operation not permitted", path)


def raised_from(error: BaseException) -> RuntimeError:
    try:
        raise RuntimeError("the save failed") from error
    except RuntimeError as wrapper:
        return wrapper


def unreadable(error: BaseException) -> checkpoints.UnreadableCheckpoint:
    """What a restore raises for a checkpoint it cannot read."""
    try:
        raise checkpoints.UnreadableCheckpoint(8, "checkpoint 8 cannot be read") from error
    except checkpoints.UnreadableCheckpoint as wrapper:
        return wrapper


@pytest.mark.parametrize("error, refused_there", [
    (lambda checkpoints: refused(f"{checkpoints}/8.orbax-checkpoint-tmp"), True),
    (lambda checkpoints: raised_from(refused(f"{checkpoints}/8.orbax-checkpoint-tmp")), True),
    (lambda checkpoints: OSError(errno.EROFS, "Read-only file system", f"{checkpoints}/8"),
     True),
    (lambda checkpoints: ValueError(  # tensorstore's
        f'PERMISSION_DENIED: Error writing local file "{checkpoints}/8.orbax-checkpoint-tmp/'
        'params/.zarray": Operation not permitted'), True),
    (lambda checkpoints: PermissionError(errno.EACCES, "Permission denied", "/data/train.en"),
     False),  # a corpus file
    (lambda checkpoints: refused(f"{checkpoints}-corrupt/8"), False),  # beside, not under
    (lambda checkpoints: OSError(errno.ENOSPC, "No space left on device", f"{checkpoints}/8"),
     False),  # a full disk, told apart
    (lambda checkpoints: ValueError("Operation not permitted"), False),  # naming no path
    (lambda checkpoints: ValueError(  # a read
        f'PERMISSION_DENIED: Error reading local file "{checkpoints}/8/params/.zarray"'), False),
    (lambda checkpoints: unreadable(refused(f"{checkpoints}/8/params")), False),
])
def test_a_refused_write_is_the_checkpoints_fault_only_under_them(tmp_path, error,
                                                                  refused_there):
    """Before: a write refused under WORKDIR/checkpoints was `error: [Errno 1] Operation
    not permitted: ...` after three orbax tracebacks (absl's records of it, not dropped)."""
    directory = tmp_path / "run" / "checkpoints"
    error = error(directory)
    assert (disk_full.refused_write(error, directory) is not None) is refused_there
    record = logging.LogRecord("absl", logging.ERROR, __file__, 1, "Failed to run 5 Handler "
                               "Commit operations", None, (type(error), error, None))
    echoes = disk_full._DropWriteFaultEchoes()
    echoes.directory = directory
    assert echoes.filter(record) is not (refused_there or disk_full.is_disk_full(error))


def test_refused_checkpoint_writes_name_the_checkpoint_a_resume_starts_from(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(disk_full._FILTER, "run_stopped", False)
    workdir = tmp_path / "run"
    for step in ("4", "8.orbax-checkpoint-tmp"):
        (workdir / "checkpoints" / step).mkdir(parents=True)
    with warnings.catch_warnings():
        assert disk_full.disk_fault(workdir, None, ValueError("another error")) is None
        assert not disk_full._FILTER.run_stopped
        error = disk_full.disk_fault(workdir, None, raised_from(
            refused(f"{workdir}/checkpoints/8.orbax-checkpoint-tmp")))
    assert isinstance(error, disk_full.WritesRefused)
    assert str(error) == (
        f"writing a checkpoint was refused: Operation not permitted: {workdir}/checkpoints/"
        f"8.orbax-checkpoint-tmp (is the work directory read-only?); the newest complete "
        f"checkpoint, step 4 in {workdir}/checkpoints, is intact: make {workdir} writable, "
        "then run the same command to resume from it")
    assert disk_full._FILTER.run_stopped


def test_a_run_its_disk_stopped_leaves_past_the_threads_of_its_failed_save(tmp_path,
                                                                           monkeypatch, capsys):
    """Orbax's writers of a save whose directory could not be made wait for orbax's
    coordination timeout (300 s), and the interpreter's exit waits for them. Before: the
    process printed its error line, then never exited."""
    monkeypatch.setattr(disk_full._FILTER, "run_stopped", False)
    release = threading.Event()
    writer = threading.Thread(target=release.wait, name="a failed save's writer")
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)

    def train(argv):
        writer.start()
        raise disk_full.disk_fault(tmp_path, None, refused(f"{tmp_path}/checkpoints/8.orbax-"
                                                        "checkpoint-tmp"))

    monkeypatch.setattr(train_command, "train", train)
    try:
        with warnings.catch_warnings():
            assert train_command.main([]) == 1
    finally:
        release.set()
        writer.join()
    assert exits == [1]
    assert capsys.readouterr().err.startswith("error: writing a checkpoint was refused: ")


@pytest.mark.slow
def test_a_metrics_line_cut_short_is_dropped_with_a_warning(damaged_resume, reference):
    workdir, result = damaged_resume
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dropped line" in result.stderr and "not JSON" in result.stderr
    assert [s for s, _ in losses(workdir)] == list(range(1, 13))


@pytest.mark.slow
def test_a_corpus_changed_under_a_run_is_named_on_resume(tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    rng = np.random.default_rng(0)
    words = ["eins", "zwei", "drei", "vier", "fünf", "sechs"]
    lines = [" ".join(rng.choice(words, 4)) for _ in range(300)]
    src.write_text("".join(line + "\n" for line in lines))
    tgt.write_text("".join(line.upper() + "\n" for line in lines))
    flags = ["--src-path", str(src), "--tgt-path", str(tgt), "--num-dev", "10",
             "--num-test", "10"]
    tiny_run(tmp_path / "run", *flags, "--steps", "2")
    src.write_text(src.read_text().replace("eins", "zwei", 1))  # same lines, one word changed
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(tmp_path / "run"),
                             *TINY, *flags, "--steps", "4"], cwd=REPO_ROOT, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: the training data differ from those of checkpoint 2")
    assert "--src-path / --tgt-path" in last_line


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A work directory saved at step 4, for the tests below to copy and damage."""
    workdir = tmp_path_factory.mktemp("saved_run")
    tiny_run(workdir, "--steps", "4")
    return workdir


def files(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def resume_refused(workdir: Path, *flags: str) -> str:
    """Resume `workdir` with train.py: it must exit 2 with one line and change nothing in
    the work directory; returns the line."""
    before = files(workdir)
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *TINY,
                             "--steps", "8", *flags], cwd=REPO_ROOT, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert files(workdir) == before
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["run_args null", "run_args list", "metrics {}",
                                    "metrics bad dev_loss"])
def test_a_settings_or_metrics_file_of_another_shape_is_named(saved_run, tmp_path, damage):
    """Before: run_args.json holding null or [1, 2] was a TypeError traceback
    (dict(None)), a metrics.jsonl line {} a KeyError ('step'), and a dev_loss "bad" a
    TypeError once --patience compared it."""
    workdir = tmp_path / "run"
    shutil.copytree(saved_run, workdir)
    flags = []
    if damage == "metrics bad dev_loss":
        with (workdir / "metrics.jsonl").open("a") as metrics:
            metrics.write('{"step": 4, "dev_loss": "bad"}\n')
        lines = len((workdir / "metrics.jsonl").read_text().splitlines())
        flags = ["--keep-best", "dev_loss", "--patience", "2"]
        message = (f"error: {workdir / 'metrics.jsonl'}: line {lines} is not a metrics record: "
                   'its "dev_loss" is "bad", not a number; delete or mend it')
    elif damage.startswith("run_args"):
        text = "null" if damage.endswith("null") else "[1, 2]"
        (workdir / "run_args.json").write_text(text + "\n")
        message = (f"error: {workdir / 'run_args.json'} holds {text}, not a JSON object of "
                   "settings; restore it or use a new --workdir")
    else:
        lines = (workdir / "metrics.jsonl").read_text().splitlines()
        (workdir / "metrics.jsonl").write_text("\n".join(lines[:2] + ["{}"] + lines[2:]) + "\n")
        message = (f"error: {workdir / 'metrics.jsonl'}: line 3 is not a metrics record (an "
                   "object with an integer \"step\"): '{}'; delete or mend it")
    assert resume_refused(workdir, *flags) == message


@pytest.mark.parametrize("value", ['"bad"', "true", "null", "[2.5]"])
def test_a_metrics_value_that_is_not_a_number_is_named_before_anything_changes(tmp_path,
                                                                               value):
    """Both readers of metrics.jsonl on resume: the log kept up to the restored step, and
    --patience's count. Before: only "step" was checked, and a resume with --keep-best
    dev_loss --patience 2 over {"step": 20, "dev_loss": "bad"} was a TypeError traceback."""
    metrics = tmp_path / "metrics.jsonl"
    text = f'{{"step": 10, "dev_loss": 2.5}}\n{{"step": 20, "dev_loss": {value}}}\n'
    metrics.write_text(text)
    message = (f'{metrics}: line 2 is not a metrics record: its "dev_loss" is {value}, not a '
               "number; delete or mend it")
    with pytest.raises(TrainError) as refused:
        MetricsLog(metrics, resume_step=20)
    assert str(refused.value) == message
    with pytest.raises(TrainError) as refused:
        Patience("dev_loss", 2, metrics)
    assert str(refused.value) == message
    assert metrics.read_text() == text


@pytest.mark.slow
def test_a_resume_without_run_args_is_refused(saved_run, tmp_path):
    """Before: with run_args.json deleted, a resume with other model flags was accepted:
    the old model went on (from config.json), the new flags were written to run_args.json,
    and the right flags were refused from then on."""
    workdir = tmp_path / "run"
    shutil.copytree(saved_run, workdir)
    (workdir / "run_args.json").unlink()
    assert resume_refused(workdir, "--d-model", "64") == (
        f"error: {workdir} holds checkpoints but no run_args.json (the settings they were "
        "trained with); restore it or use a new --workdir")


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--max-tokens", "4"], "--max-tokens 4 cannot hold one sentence of --max-len 256 tokens"),
    (["--vocab-size", "0"], "--vocab-size must be more than the 4 special pieces"),
    (["--vocab-size", "5"], "--vocab-size 5: SentencePiece cannot train 5 pieces on this text"),
    (["--max-len", "2"], "--max-len must be at least 8, got 2"),
    (["--heads", "3"], "--d-model (32) must be divisible by --num-heads (3)"),
    (["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
    (["--label-smoothing", "-0.1"], "--label-smoothing must be in [0, 1), got -0.1"),
    (["--time-budget", "0"], "--time-budget must be positive (seconds), got 0.0"),
    (["--seed", "-1"], "--seed must be from 0 to 4294967295, got -1"),
    (["--seed", "99999999999999999999"], "--seed must be from 0 to 4294967295, got 9999"),
    (["--workdir", "FILE"], "is a file, not a directory"),
])
def test_bad_flags_get_one_line_naming_the_flag_before_any_work(tmp_path, flags, message):
    (tmp_path / "FILE").touch()
    flags = [str(tmp_path / "FILE") if flag == "FILE" else flag for flag in flags]
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(tmp_path / "run"),
                             *TINY, *flags], cwd=REPO_ROOT, env=ENV, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert message in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run" / "tokenizer.model").exists()


def test_max_len_beyond_the_default_buckets_trains(tmp_path):
    """--max-len 600: the buckets run up to it (they stopped at 512)."""
    tokenizer = Tokenizer.train(["a b c d e f g h"] * 20, tmp_path / "spm.model", vocab_size=20)
    long_pair = (" ".join(["a"] * 290), " ".join(["b"] * 250))  # 580 and 500 pieces
    splits = {"train": [long_pair, ("a b", "c d")], "dev": [("a", "b")], "test": [("c", "d")]}
    encoded = {split: encode_pairs(tokenizer, pairs, max_len=600)[:2]
               for split, pairs in splits.items()}
    batches = inputs.make_batches(encoded, DataSettings(max_len=600, max_tokens=1200), 0)
    assert 600 in [src_length for _, src_length, _ in batches["train"].shapes()]
