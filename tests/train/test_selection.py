"""The end of a run, through the real train.py: dev BLEU at each evaluation, the best
checkpoint kept (--keep-best), early stopping that a rerun finishes (--patience), and
the exported model (--export best | average)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

from jax_transformer.commands import train as train_command
from jax_transformer.train.checkpoints import complete_steps
from jax_transformer.train import run as training_run
from tests.helpers import run_command
from tests.train.runs import REPO_ROOT, TINY, records

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel".split()
# A copy task the tiny model learns in 60 steps; the paper's schedule, scaled up 16x,
# then raises the learning rate until training falls apart: dev BLEU goes up, then down.
# Drawn the paper's way: 32 wide, N(0, 0.02) leaves attention near uniform, and the model
# scores BLEU 0 until step 120.
RISE_AND_FALL = ["--vocab-size", "30", "--d-model", "32", "--heads", "4", "--d-ff", "64",
                 "--layers", "1", "--max-tokens", "512", "--lr-scale", "16", "--warmup", "200",
                 "--steps", "120", "--eval-every", "20", "--checkpoint-every", "1000",
                 "--weight-init", "xavier", "--samples", "0", "--quiet"]


def train(workdir, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *map(str, flags)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def copy_corpus(tmp_path_factory) -> list[str]:
    """Flags for a corpus whose targets repeat their 1 to 3 word sources."""
    directory, rng, flags = tmp_path_factory.mktemp("copy"), random.Random(0), []
    for split, size in (("train", 3000), ("dev", 60), ("test", 60)):
        lines = "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) + "\n"
                        for _ in range(size))
        for side in ("src", "tgt"):
            (directory / f"{split}.{side}").write_text(lines)
            prefix = "" if split == "train" else f"{split}-"
            flags += [f"--{prefix}{side}-path", directory / f"{split}.{side}"]
    return flags


def dev_bleu(workdir) -> dict[int, float]:
    return {r["step"]: r["dev_bleu"] for r in records(workdir) if "dev_bleu" in r}


def export_weights(workdir) -> dict[str, np.ndarray]:
    return safetensors.numpy.load_file(workdir / "export" / "model.safetensors")


def checkpoint_weights(workdir, step: int) -> dict[str, np.ndarray]:
    from jax_transformer.train.checkpoints import restore_model
    model = restore_model(workdir, step)
    with_tmp = workdir.parent / f"step{step}"
    model.save_pretrained(with_tmp)
    return safetensors.numpy.load_file(with_tmp / "model.safetensors")


@pytest.fixture(scope="module")
def best_run(tmp_path_factory, copy_corpus):
    workdir = tmp_path_factory.mktemp("best") / "run"
    result = train(workdir, *copy_corpus, *RISE_AND_FALL, "--keep-best", "dev_bleu", "--keep", "1",
                   "--export", "best")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, result


@pytest.mark.slow
def test_keep_best_keeps_and_exports_the_checkpoint_with_the_best_dev_bleu(best_run):
    """Before: no dev BLEU, and only the newest --keep checkpoints were kept."""
    workdir, result = best_run
    bleu = dev_bleu(workdir)
    assert sorted(bleu) == list(range(20, 121, 20)), bleu
    best = max(bleu, key=bleu.get)
    assert 20 < best < 120 and bleu[120] < bleu[best] - 10, f"not up then down: {bleu}"
    assert complete_steps(workdir) == [best, 120]  # the best beside the newest (--keep 1)
    evaluated = json.loads((workdir / "eval.json").read_text())
    assert evaluated["export"] == {"model": "best", "step": best}
    assert evaluated["step"] == 120
    assert evaluated["dev"]["bleu"] == pytest.approx(bleu[best])  # the best model, judged again
    assert evaluated["dev"]["bleu_signature"].startswith("nrefs:1|case:mixed")
    exported, kept = export_weights(workdir), checkpoint_weights(workdir, best)
    assert all(np.array_equal(exported[k], kept[k]) for k in kept)
    assert f"dev BLEU {bleu[best]:.2f}, chrF " in result.stderr


@pytest.mark.slow
def test_patience_stops_where_the_metric_stopped_improving_and_a_rerun_finishes(
        tmp_path, copy_corpus, best_run):
    """Before: no --patience; a run trained to --steps whatever its dev scores did."""
    bleu = dev_bleu(best_run[0])
    steps, since, best, expected = sorted(bleu), 0, -1.0, None
    for step in steps:  # the first evaluation that is the 2nd without a new best
        since, best = (0, bleu[step]) if bleu[step] > best else (since + 1, best)
        if since == 2:
            expected = step
            break
    assert expected is not None and expected < 120, bleu
    workdir = tmp_path / "run"
    flags = [*copy_corpus, *RISE_AND_FALL, "--keep-best", "dev_bleu", "--patience", "2"]
    stopped = train(workdir, *flags)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert (f"--patience 2: dev_bleu has not improved for 2 evaluations (best "
            f"{max(bleu[s] for s in steps if s <= expected):.4g} at step ") in stopped.stderr
    assert f"stopping after step {expected}" in stopped.stderr
    evaluated = json.loads((workdir / "eval.json").read_text())
    assert evaluated["step"] == expected
    assert evaluated["training"]["stopped_by"] == "patience"
    assert dev_bleu(workdir) == {s: bleu[s] for s in steps if s <= expected}
    before = (workdir / "metrics.jsonl").read_text()
    again = train(workdir, *flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from step {expected} " in again.stderr
    assert "stopping after step" in again.stderr
    assert not [line for line in again.stderr.splitlines() if line.startswith("step ")]
    assert (workdir / "metrics.jsonl").read_text().startswith(before)
    assert not [r for r in records(workdir) if r["step"] > expected]
    assert json.loads((workdir / "eval.json").read_text())["step"] == expected


@pytest.mark.slow
def test_export_average_is_the_mean_of_the_newest_checkpoints(tmp_path):
    """Before: no --export average; the export was the last model."""
    workdir = tmp_path / "run"
    result = train(workdir, *TINY, "--steps", "12", "--export", "average", "--average-last", "3",
                   "--keep", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert complete_steps(workdir) == [4, 8, 12]
    assert "--export average: the mean of checkpoints 4, 8, 12" in result.stderr
    assert json.loads((workdir / "eval.json").read_text())["export"] == {
        "model": "average", "steps": [4, 8, 12]}
    kept = [checkpoint_weights(workdir, step) for step in (4, 8, 12)]
    exported = export_weights(workdir)
    for name, value in exported.items():
        mean = (sum(k[name].astype(np.float64) for k in kept) / 3).astype(np.float32)
        np.testing.assert_array_equal(value, mean, err_msg=name)
    assert not np.array_equal(exported[name], kept[-1][name])


@pytest.mark.parametrize("flags, message", [
    (["--keep-best", "bleu"], "--keep-best"),
    (["--patience", "0", "--keep-best", "dev_loss"], "--patience must be at least 1, got 0"),
    (["--patience", "3"], "--patience 3 counts evaluations without improvement of --keep-best's"),
    (["--export", "best"], "--export best exports --keep-best's checkpoint: give --keep-best"),
    (["--export", "newest"], "--export"),
    (["--export", "average"], "--export average averages the newest --average-last 5 "
                              "checkpoints: --keep must be at least 5, got 3"),
    (["--average-last", "0"], "--average-last must be at least 1, got 0"),
    (["--dev-bleu-sentences", "-1"], "--dev-bleu-sentences must be 0 (none) or more, got -1"),
    (["--alpha", "nan"], "--alpha must be a number >= 0 (0: no length penalty), got nan"),
    (["--alpha", "-0.5"], "--alpha must be a number >= 0"),
    (["--keep-best", "dev_bleu", "--dev-bleu-sentences", "0"],
     "--keep-best dev_bleu needs the dev set translated: --dev-bleu-sentences must be at least 1"),
    (["--task", "lm", "--keep-best", "dev_chrf"],
     "--keep-best dev_chrf scores translations; a --task lm run keeps the best by dev_loss"),
])
def test_bad_selection_flags_are_one_line(tmp_path, capsys, flags, message):
    """In this process: the flags are refused before JAX loads (the console scripts' own
    exit path is tests/test_console_scripts.py's)."""
    code, _, stderr = run_command(train_command.main, ["--workdir", tmp_path / "run", *flags],
                                  capsys)
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and message in errors[0], stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_average_last_without_export_average_is_refused(tmp_path, capsys, monkeypatch):
    """Before: it was ignored without a word, while --patience without --keep-best was
    refused."""
    monkeypatch.setattr(training_run, "run", lambda *_: pytest.fail("the run started"))
    code = train_command.main(["--workdir", str(tmp_path / "run"), "--average-last", "3"])
    assert code == 2 and capsys.readouterr().err.splitlines() == [
        "error: --average-last 3 counts the checkpoints --export average averages, and the "
        "export is --export last: add --export average, or drop --average-last"]
    assert not (tmp_path / "run").exists()


def test_the_paper_presets_translate_the_test_set_with_beam_4_and_alpha_0_6():
    from jax_transformer.commands.train import parse_args
    for preset, beam in (("tiny", 1), ("base", 4), ("big", 4)):
        settings = parse_args(["--preset", preset]).train
        assert (settings.beam, settings.alpha) == (beam, 0.6), preset
    assert parse_args(["--preset", "base", "--beam", "2"]).train.beam == 2


@pytest.mark.parametrize("metric, scores", [("dev_bleu", [5.0, 5.0, 1.0]),
                                            ("dev_loss", [2.0, 2.0, 3.0])])
def test_a_tie_keeps_and_exports_the_earliest_best_as_patience_counts_it(tmp_path, metric,
                                                                         scores):
    """Steps 10 and 20 equally good: --patience names step 10 as the best, so the
    checkpoint kept and exported as the best is step 10's. Before: patience said "best
    at step 10", --export best exported checkpoint 20, and "1 evaluations"."""
    import jax.numpy as jnp
    from flax import nnx

    from jax_transformer.train.checkpoints import Checkpointer
    from jax_transformer.train.selection import Patience
    from jax_transformer.train.step import TrainState
    checkpointer = Checkpointer(tmp_path, keep=1, async_save=False, best=metric)
    patience = Patience(metric, 2, tmp_path / "metrics.jsonl")
    for step, score in zip((10, 20, 30), scores):
        state = TrainState(step=jnp.asarray(step), params=nnx.State({"w": jnp.zeros(2)}),
                           rngs=nnx.State({}), opt_state=())
        checkpointer.save(state, {}, metrics={metric: score})
        patience.add(step, score)
        if step == 20:
            assert "has not improved for 1 evaluation (best" in patience.reason()
    checkpointer.wait()
    assert patience.best_step == checkpointer.best_step() == 10
    assert complete_steps(tmp_path) == [10, 30]  # the best beside the newest (--keep 1)
    assert patience.reason().endswith(f"2 evaluations (best {scores[0]:.4g} at step 10)")
