"""Tiny train.py runs shared by the training tests: flags, in-process runs, metrics."""

from __future__ import annotations

import json
from pathlib import Path

import train
from jax_transformer.train import settings
from jax_transformer.train.loop import run

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = ["--num-train", "1500", "--num-dev", "40", "--num-test", "40", "--max-number", "10000",
        "--vocab-size", "200", "--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "1",
        "--max-tokens", "512", "--warmup", "4", "--checkpoint-every", "4", "--eval-every", "6",
        "--decode-batch-size", "40", "--samples", "2", "--quiet"]


def tiny_settings(workdir, *extra):
    """(data, model, train) settings as train.py parses them from its flags."""
    return settings.from_flags(vars(train.parse_args(["--workdir", str(workdir), *TINY, *extra])))


def tiny_run(workdir, *extra):
    return run(*tiny_settings(workdir, *extra))


def records(workdir) -> list[dict]:
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def losses(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in records(workdir) if "loss" in r]


def dev_losses(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["dev_loss"]) for r in records(workdir) if "dev_loss" in r]
