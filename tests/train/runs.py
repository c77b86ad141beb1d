"""Tiny train.py runs shared by the training tests: flags, in-process runs, metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from jax_transformer.commands import train as train_command
from jax_transformer.train.run import run

REPO_ROOT = Path(__file__).resolve().parents[2]
# The model flags in their old spellings (--heads, --layers), which must keep working.
TINY = ["--num-train", "1500", "--num-dev", "40", "--num-test", "40", "--max-number", "10000",
        "--vocab-size", "200", "--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "1",
        "--max-tokens", "512", "--warmup", "4", "--checkpoint-every", "4", "--eval-every", "6",
        "--decode-batch-size", "40", "--samples", "2", "--quiet"]


def tiny_settings(workdir, *extra):
    """(data, model, train) settings as train.py parses them from its flags."""
    return train_command.parse_args(["--workdir", str(workdir), *TINY, *extra])


def tiny_run(workdir, *extra):
    return run(tiny_settings(workdir, *extra))


def resumable_copy(run: Path, workdir: Path, step: int) -> Path:
    """A copy of `run` whose newest checkpoint is `step`."""
    shutil.copytree(run, workdir)
    for saved in (workdir / "checkpoints").iterdir():
        if int(saved.name) > step:
            shutil.rmtree(saved)
    return workdir


def records(workdir) -> list[dict]:
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def losses(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in records(workdir) if "loss" in r]


def dev_losses(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["dev_loss"]) for r in records(workdir) if "dev_loss" in r]


# metrics.jsonl key -> the TensorBoard tag train.py must write it under (spelled out
# here rather than read from jax_transformer.train.records.tensorboard, so a dropped tag fails)
TENSORBOARD_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
                    "tokens_per_s": "train/tgt_tokens_per_s", "dev_loss": "dev/loss",
                    "dev_nll": "dev/nll", "dev_perplexity": "dev/perplexity",
                    "dev_bleu": "dev/bleu", "dev_chrf": "dev/chrf",
                    "dev_decode_seconds": "dev/decode_seconds",
                    "compile_seconds": "compile/seconds"}


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard's own reader loads the event files under
    `directory` (every point kept, restarts handled as TensorBoard handles them)."""
    from tensorboard.backend.event_processing import event_accumulator
    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def metrics_scalars(workdir) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's numbers per TensorBoard tag, as float32 (TensorBoard's scalars)."""
    scalars = {}
    for record in records(workdir):
        for key, tag in TENSORBOARD_TAGS.items():
            if key in record:
                scalars.setdefault(tag, []).append((record["step"],
                                                    float(np.float32(record[key]))))
    return scalars


def random_batches(count: int, vocab: int, src_len: int, tgt_len: int, rows: int = 16):
    """`count` translation batches of random ids (seed 0), the last 3 positions padded in
    every third source row and every second target row."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        src = rng.integers(4, vocab, (rows, src_len)).astype(np.int32)
        tgt = rng.integers(4, vocab, (rows, tgt_len)).astype(np.int32)
        src[::3, src_len - 3:] = 0
        tgt[::2, tgt_len - 3:] = 0
        batches.append({"src": src, "tgt_in": tgt, "tgt_out": np.roll(tgt, -1, axis=1)})
    return batches
