"""Compile once: the step programs are compiled ahead of time, once per batch shape,
and a resumed run loads every program from the persistent cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.train.runs import REPO_ROOT, TINY

pytestmark = pytest.mark.slow  # train.py subprocesses


def train(workdir, cache, *flags) -> tuple[dict, str]:
    """A train.py run with JAX's compile log on: (eval.json's training report, stderr)."""
    env = {**os.environ, "JAX_LOG_COMPILES": "1"}
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *TINY,
                             "--compile-cache", str(cache), *flags], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((workdir / "eval.json").read_text())["training"], result.stderr


def compile_log(log: str) -> tuple[list[str], int]:
    """From JAX's compile log: the programs it finished ("Finished XLA compilation of
    ...", said for each program) and how many of them it loaded from the persistent
    cache instead of compiling ("Persistent compilation cache hit for ...")."""
    finished = [line.split("Finished XLA compilation of ")[1].split(" in ")[0]
                for line in log.splitlines() if "Finished XLA compilation of " in line]
    return finished, sum("Persistent compilation cache hit for" in line
                         for line in log.splitlines())


def test_a_resumed_run_compiles_nothing(tmp_path):
    cache = tmp_path / "xla"
    started = time.monotonic()
    first, log = train(tmp_path / "run", cache, "--steps", "4")
    wall = time.monotonic() - started
    # The first step ends after the loop starts, and within the process's life
    assert first["seconds_before_training"] < first["first_step_done_seconds"] < wall
    finished, hits = compile_log(log)
    # One train and one eval program for the one batch shape, compiled ahead...
    assert len(first["batch_shapes"]) == 1 and hits == 0
    assert finished.count("jit(_train_step)") == finished.count("jit(_eval_step)") == 1
    assert "compiled train step" in log and "compiled eval step" in log
    assert first["compiled"]["programs"] >= 2 and first["compiled"]["cache_hits"] == 0
    assert first["real_token_fraction"] > 0.8 and first["tgt_tokens_per_s"] > 0
    # ...and a resumed run (same command, more steps) loads every program it needs.
    resumed, log = train(tmp_path / "run", cache, "--steps", "8")
    finished, hits = compile_log(log)
    assert resumed["steps"] == 4
    assert "jit(_train_step)" in finished and hits == len(finished)
    assert resumed["compiled"]["programs"] == 0 and resumed["compiled"]["cache_hits"] >= 2


def test_no_compile_cache_keeps_nothing(tmp_path):
    _, log = train(tmp_path / "run", tmp_path / "unused", "--steps", "1", "--no-compile-cache")
    finished, hits = compile_log(log)
    assert "no cache" in log and finished and hits == 0
    assert not (tmp_path / "unused").exists()
