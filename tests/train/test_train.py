"""train.py end to end on a tiny model: outputs, exact resume, SIGKILL, NaN stop,
bad data, compilation count, bf16, and the export running in torch_reference."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.commands import port as port_command
from jax_transformer.commands import train as train_command
from jax_transformer.data import corpora
from jax_transformer.train import checkpoints
from transformer_core import checkpoint_dir
from jax_transformer.data.batches.packed import PackedBatches
from transformer_core.config import TransformerConfig
from jax_transformer.model import Transformer as FlaxTransformer
from transformer_core.errors import RunFailed, TrainError
from jax_transformer.train.settings.model import DERIVED_MODEL_FIELDS, ModelSettings
from tests.train.runs import (REPO_ROOT, TENSORBOARD_TAGS, TINY, losses, metrics_scalars,
                              records, tensorboard_scalars, tiny_run, tiny_settings)
from jax_transformer.train import loop
from jax_transformer.train.settings.history import ADDED_SETTINGS
from jax_transformer.train.settings.resume import check_run_settings, recorded_settings
from jax_transformer.train.step import Trainer, make_optimizer, paper_schedule


def recorded(workdir, *extra):
    return recorded_settings(tiny_settings(workdir, *extra))


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted 12-step run."""
    workdir = tmp_path_factory.mktemp("reference")
    summary = tiny_run(workdir, "--steps", "12")
    return workdir, summary


@pytest.mark.slow
def test_run_writes_everything(reference_run):
    workdir, summary = reference_run
    for name in ("metrics.jsonl", "eval.json", "loss.png", "attention.png", "config.json",
                 "tokenizer.model", "export/config.json", "export/model.safetensors",
                 "export/tokenizer.model"):
        assert (workdir / name).is_file(), name
    assert [s for s, _ in losses(workdir)] == list(range(1, 13))
    results = json.loads((workdir / "eval.json").read_text())
    for key in ("loss", "perplexity", "exact_match", "bleu", "chrf"):
        assert math.isfinite(results["test"][key]), key
    assert results["test"]["sentences"] == 40 and len(results["samples"]) == 2
    assert summary["step"] == 12
    printed = train_command.final_results(tiny_settings(workdir, "--steps", "12"), summary)
    assert printed["test_decoding"] == results["decoding"] == "greedy"  # docs/decoding.md


@pytest.mark.slow
def test_tensorboard_holds_every_metric_at_its_global_step(reference_run):
    """WORKDIR/tensorboard/, read by TensorBoard's own loader: every tag, at the steps
    and with the values (as float32) of metrics.jsonl."""
    workdir, summary = reference_run
    scalars = tensorboard_scalars(workdir / "tensorboard")
    assert sorted(scalars) == sorted(TENSORBOARD_TAGS.values())
    assert scalars == metrics_scalars(workdir)
    assert [step for step, _ in scalars["train/loss"]] == list(range(1, 13))
    assert [step for step, _ in scalars["dev/perplexity"]] == [6, 12]
    compiled = summary["training"]["compile_ahead_seconds"]
    assert scalars["compile/seconds"] == [(1, float(np.float32(compiled)))]


@pytest.mark.slow
def test_the_progress_line_names_the_label_smoothed_loss_and_the_nll(tmp_path):
    """Before: `step 6: train loss 4.3450, dev loss 4.3113, dev perplexity 57.226`: the
    loss is label-smoothed and the perplexity exp of the nll, which was shown nowhere (a
    converged run printed "dev loss 1.271, dev perplexity 1.301"). With the progress bar
    on (no --quiet) and stderr not a terminal, the log is lines: a progress line at most
    every 30 s, none in a run this short but for one when training outlasts 30 s under
    load. Before: a carriage-return update of the bar at every step and around every
    line printed."""
    flags = [flag for flag in TINY if flag != "--quiet"]
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(tmp_path), *flags,
                             "--steps", "6"], cwd=REPO_ROOT, capture_output=True,
                            timeout=300)  # bytes: text mode would read "\r" as a line end
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr[-3000:]
    assert "\r" not in stderr, stderr[-3000:]
    assert len([line for line in stderr.splitlines() if line.startswith("train:")]) <= 2
    [line] = [line for line in stderr.splitlines() if line.startswith("step 6: ")]
    [train] = [r["loss"] for r in records(tmp_path) if r["step"] == 6 and "loss" in r]
    [dev] = [r for r in records(tmp_path) if "dev_loss" in r]
    assert line.startswith(
        f"step 6: label-smoothed loss: train {train:.4f}, dev {dev['dev_loss']:.4f}; "
        f"dev nll {dev['dev_nll']:.4f}, dev perplexity {dev['dev_perplexity']:.3f} "
        f"(exp of the nll), dev BLEU {dev['dev_bleu']:.2f}, chrF {dev['dev_chrf']:.2f} (40 "
        "sentences translated in "), line
    assert dev["dev_perplexity"] == pytest.approx(math.exp(dev["dev_nll"]))


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(reference_run, tmp_path):
    reference, _ = reference_run
    tiny_run(tmp_path, "--steps", "8")
    tiny_run(tmp_path, "--steps", "12")  # resumes from the step-8 checkpoint
    assert losses(tmp_path) == losses(reference)
    scalars = tensorboard_scalars(tmp_path / "tensorboard")  # two event files, one curve
    assert scalars == metrics_scalars(tmp_path)
    assert [step for step, _ in scalars["compile/seconds"]] == [1, 9]


def test_resume_refuses_other_settings(tmp_path):
    check_run_settings(tmp_path, recorded(tmp_path, "--steps", "4"), resuming=False)
    # Length and visibility flags may change on resume...
    check_run_settings(tmp_path, recorded(tmp_path, "--steps", "8", "--eval-every", "2",
                                          "--time-budget", "60"), resuming=True)
    # ...anything that changes the model or the data order may not.
    with pytest.raises(TrainError, match="--d-ff 64 -> 48"):
        check_run_settings(tmp_path, recorded(tmp_path, "--d-ff", "48"), resuming=True)


def test_model_flags_are_the_config_s_fields_and_old_spellings_still_work(tmp_path):
    new = ["--num-heads", "2", "--num-encoder-layers", "2", "--num-decoder-layers", "2"]
    assert tiny_settings(tmp_path, *new) == tiny_settings(tmp_path, "--heads", "2",
                                                          "--layers", "2")
    config = tiny_settings(tmp_path, "--layers", "2", "--num-decoder-layers", "1").model.config(
        200, 64)
    assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 1)  # fields win
    assert tiny_settings(tmp_path, "--pre-norm").model.config(200, 64).final_norm  # as before


def test_presets_give_the_paper_s_sizes(tmp_path):
    base = train_command.parse_args(["--preset", "base"]).model.config(8000, 256)
    paper = TransformerConfig()  # its defaults are the paper's base model
    assert base == paper.replace(max_len=256)
    big = train_command.parse_args(["--preset", "big", "--dropout", "0.1"]).model
    assert (big.d_model, big.num_heads, big.d_ff, big.dropout) == (1024, 16, 4096, 0.1)
    tiny = train_command.parse_args([]).model
    assert (tiny.d_model, tiny.num_heads, tiny.d_ff, tiny.num_encoder_layers) == (128, 4, 512, 3)


def test_the_model_settings_are_the_config_s_fields():
    """ModelSettings is written out field by field: every TransformerConfig field the
    data do not decide is a model flag, of the same type and with the same help."""
    config_fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    model_fields = {f.name: f for f in dataclasses.fields(ModelSettings)}
    assert set(model_fields) == set(config_fields) - set(DERIVED_MODEL_FIELDS)
    config_types = typing.get_type_hints(TransformerConfig)
    model_types = typing.get_type_hints(ModelSettings)
    for name, field in model_fields.items():
        assert model_types[name] == config_types[name], name
        assert field.metadata["help"] == config_fields[name].metadata["help"], name


def test_a_resumable_setting_is_left_out_of_run_args(tmp_path):
    """Settings marked resumable where they are defined may change on resume: they are
    not recorded; the others are."""
    values = recorded(tmp_path)
    assert "steps" not in values and "workdir" not in values and "data" not in values
    assert {"d_model", "seed", "max_tokens", "lr_schedule"} <= set(values)
    check_run_settings(tmp_path, recorded(tmp_path), resuming=False)
    check_run_settings(tmp_path, recorded(tmp_path, "--steps", "9", "--eval-every", "3"),
                       resuming=True)


def test_a_run_args_json_from_before_the_config_vocabulary_resumes(tmp_path):
    """run_args.json written before the model flags became TransformerConfig's fields
    (heads, layers; none of the variant fields): the same run resumes, another not."""
    old = {k: v for k, v in recorded(tmp_path).items()
           if k not in {"num_heads", "num_encoder_layers", "num_decoder_layers",
                        *ADDED_SETTINGS}}
    (tmp_path / "run_args.json").write_text(json.dumps({**old, "heads": 4, "layers": 1}))
    check_run_settings(tmp_path, recorded(tmp_path), resuming=True)
    with pytest.raises(TrainError, match="--num-encoder-layers 1 -> 2"):
        check_run_settings(tmp_path, recorded(tmp_path, "--layers", "2"), resuming=True)


def test_marian_flags_leave_the_default_model_and_old_runs_alone(tmp_path):
    """--position-layout half_split (+ --activation silu) makes Marian's own variant;
    without them the model is the paper's, as before."""
    marian = tiny_settings(tmp_path, "--position-layout", "half_split", "--activation", "silu")
    config = marian[1].config(200, 64)
    assert (config.position_layout, config.activation) == ("half_split", "silu")
    default = tiny_settings(tmp_path)[1].config(200, 64)
    assert default == TransformerConfig(**{**default.to_dict(), "activation": "relu",
                                           "position_layout": "interleaved"})
    # A run_args.json from before these flags resumes as the defaults; not as others.
    old = {k: v for k, v in recorded(tmp_path).items()
           if k not in ("activation", "position_layout")}
    (tmp_path / "run_args.json").write_text(json.dumps(old))
    check_run_settings(tmp_path, recorded(tmp_path), resuming=True)
    with pytest.raises(TrainError, match="--position-layout 'interleaved' -> 'half_split'"):
        check_run_settings(tmp_path, recorded(tmp_path, "--position-layout", "half_split"),
                           resuming=True)


@pytest.mark.slow
def test_a_time_budget_stops_after_the_step_in_which_it_runs_out_and_saves_it(reference_run,
                                                                            tmp_path):
    # The reference run compiled this run's programs: the budget covers setting up again
    # (at most as long, now that the compiles are cached) and then a few seconds of steps.
    budget = json.loads((reference_run[0] / "eval.json").read_text())[
        "training"]["seconds_before_training"] + 3.0
    summary = tiny_run(tmp_path, "--steps", "100000", "--time-budget", str(budget),
                       "--eval-every", "100000", "--checkpoint-every", "100000")
    steps = [step for step, _ in losses(tmp_path)]
    assert steps == list(range(1, len(steps) + 1)) and 2 <= len(steps) < 100000
    assert summary["step"] == steps[-1]
    assert checkpoints.Checkpointer(tmp_path).latest_step() == steps[-1]
    training = json.loads((tmp_path / "eval.json").read_text())["training"]
    assert training["stopped_by"] == "time_budget" and training["steps"] == steps[-1]
    # Seconds from the run's start to each step's start (the loop does not wait for a
    # step before it starts the next). The deadline is checked before each step starts:
    # the last step started before the budget ran out (0.002 s covers the 1 ms rounding
    # of both numbers), and the next check, one step boundary later, found it spent (a
    # step of this model takes well under 2 s, however loaded the machine).
    starts = [training["seconds_before_training"] + r["elapsed"]
              for r in records(tmp_path) if "loss" in r]
    assert starts[-1] - 0.002 < budget <= starts[-1] + 2.0


@pytest.mark.slow
def test_sigkill_loses_at_most_the_steps_since_the_last_checkpoint(reference_run, tmp_path):
    """A real process killed with SIGKILL mid-training resumes from its latest
    checkpoint and then reproduces the uninterrupted run's losses."""
    reference, _ = reference_run
    # Started for 1000 steps so that it is surely mid-training when killed; resumed
    # for 12 (the total may change on resume; the schedule does not depend on it).
    command = [sys.executable, "train.py", "--workdir", str(tmp_path), *TINY, "--steps", "1000",
               "--checkpoint-every", "2"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 4:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = max(s for s, _ in losses(tmp_path))
    # Saves are asynchronous: the newest may still be in flight (no checkpoint = step 0).
    latest = checkpoints.Checkpointer(tmp_path).latest_step() or 0
    assert killed_at - 2 * 2 <= latest <= killed_at < 12
    tiny_run(tmp_path, "--steps", "12", "--checkpoint-every", "2")
    assert losses(tmp_path) == losses(reference)


class Watched:
    """A step's metric that records, when the loop reads it, how many steps had been
    dispatched by then."""

    def __init__(self, value, step: int, dispatched: list, reads: list):
        self.value, self.step, self.dispatched, self.reads = value, step, dispatched, reads

    def __array__(self, dtype=None, copy=None):  # what jax.device_get and float() call
        self.reads.append((self.step, len(self.dispatched)))
        return np.asarray(self.value, dtype)

    def __float__(self):
        return float(self.__array__())

    def __int__(self):
        return int(self.__array__())


@pytest.mark.slow
def test_the_loop_reads_no_device_value_between_its_logging_points(tmp_path, monkeypatch):
    """A step's metrics are read only once a later step is dispatched, or at a logging
    point (an evaluation, a checkpoint); with --log-every 4, every 4 steps. A loop
    that reads the loss after every step fails here. metrics.jsonl still has every
    step's line, in order."""
    dispatched, reads = [], []
    step = loop.optimizer_step

    def watched_step(trainer, state, micro_batches):
        state, metrics = step(trainer, state, micro_batches)
        dispatched.append(len(dispatched) + 1)
        return state, {k: Watched(v, len(dispatched), dispatched, reads)
                       for k, v in metrics.items()}
    monkeypatch.setattr(loop, "optimizer_step", watched_step)
    tiny_run(tmp_path, "--steps", "12", "--log-every", "4", "--eval-every", "6",
             "--checkpoint-every", "12")
    assert [step for step, _ in losses(tmp_path)] == list(range(1, 13))
    logging_points = {6, 12}  # --eval-every, --checkpoint-every, the last step
    assert reads and all(then > step or then in logging_points for step, then in reads)
    assert {then for _, then in reads} <= {5, 6, 11, 12}  # every 4 steps, one late


@pytest.mark.slow
def test_the_loop_runs_no_jax_op_of_its_own(tmp_path, monkeypatch):
    """The loop's only transfers are the explicit ones (batches in, metrics out): an op it
    ran itself, such as the learning rate computed on the host for metrics.jsonl, would
    queue behind the step just dispatched (a CPU device runs its programs in order) and
    the host would wait for that step. Its implicit transfer of the step number fails
    here; evaluations and the checkpoint at the end run under the same guard."""
    train = loop.train

    def guarded(run):
        with jax.transfer_guard("disallow"):
            return train(run)
    monkeypatch.setattr(loop, "train", guarded)
    tiny_run(tmp_path, "--steps", "12", "--eval-every", "6", "--checkpoint-every", "12")
    lines = [r for r in records(tmp_path) if "loss" in r]
    assert [r["step"] for r in lines] == list(range(1, 13))
    expected = paper_schedule(32, 4)  # TINY: d_model 32, --warmup 4
    np.testing.assert_allclose([r["lr"] for r in lines],
                               [float(expected(step - 1)) for step in range(1, 13)], rtol=1e-6)


@pytest.mark.slow
def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(RunFailed, match="stopping; the last good checkpoint is step") as info:
        tiny_run(tmp_path, "--steps", "30", "--checkpoint-every", "1", "--lr-scale", "1e30")
    message = str(info.value)
    bad_step = int(message.split(" at step ")[1].split(":")[0])
    good_step = int(message.split("checkpoint is step ")[1].split()[0])
    assert good_step == bad_step - 1
    assert checkpoints.Checkpointer(tmp_path).latest_step() == good_step
    model = checkpoints.restore_model(tmp_path)
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert params and all(np.all(np.isfinite(np.asarray(p))) for p in params)


@pytest.mark.slow
@pytest.mark.parametrize("src, tgt, message", [
    ("one\ntwo\n", "eins\n", "a.txt has 2 lines but .*b.txt has 1"),
    ("", "", "empty"),
])
def test_bad_data_gets_a_clear_error(tmp_path, src, tgt, message):
    (tmp_path / "a.txt").write_text(src)
    (tmp_path / "b.txt").write_text(tgt)
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(tmp_path / "run"),
                             "--src-path", str(tmp_path / "a.txt"),
                             "--tgt-path", str(tmp_path / "b.txt"), "--quiet"],
                            cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2  # bad input, as every command line (commands/exit_codes.py)
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert re.search(message, last_line), last_line


@pytest.mark.slow
def test_help_documents_every_flag():
    result = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0
    parser = train_command.build_parser()
    parser.print_help(io.StringIO())  # simple_parsing adds the dataclasses' flags here
    actions = [a for a in parser._actions if a.option_strings]
    assert len(actions) > 30
    for action in actions:
        assert action.option_strings[-1] in result.stdout, action.option_strings
        assert action.help, f"{action.option_strings} has no help text"


@pytest.mark.slow
def test_an_epoch_compiles_once_per_batch_shape(reference_run):
    """Packed batches bound the compilations of the real train step: one per
    announced batch shape, none more in a second epoch."""
    workdir, _ = reference_run
    rng = np.random.default_rng(0)
    lengths = [(3, 4), (6, 5), (10, 6), (20, 3)] * 20  # the source of 20 needs a (32, 16) row
    src = [rng.integers(4, 100, n).astype(np.int32) for n, _ in lengths]
    tgt = [rng.integers(4, 100, n).astype(np.int32) for _, n in lengths]
    batches = PackedBatches(src, tgt, max_tokens=128, row_shapes=[(16, 8), (32, 16)], seed=0)
    assert len(batches.shapes()) == 2 and len(batches.epoch_plan(0)) > 4
    trainer = Trainer(FlaxTransformer.from_pretrained(workdir / "export"),
                      make_optimizer(paper_schedule(32, 4)))
    state = trainer.initial_state
    for epoch in range(2):
        for batch in batches.epoch(epoch):
            state, _ = trainer.train_step(state, trainer.shard_batch(batch))
    assert trainer.train_step._cache_size() == len(batches.shapes())


@pytest.mark.slow
def test_bfloat16_computes_in_bf16_and_keeps_float32_state():
    config = TransformerConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16, num_heads=2,
                               d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
    model = FlaxTransformer(config, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                            param_dtype=jnp.float32)
    src = jnp.array([[5, 6, 7, 3]], jnp.int32)
    tgt_in, tgt_out = jnp.array([[2, 8, 9]], jnp.int32), jnp.array([[8, 9, 3]], jnp.int32)
    assert model(src, tgt_in).dtype == jnp.bfloat16
    trainer = Trainer(model, make_optimizer(paper_schedule(16, 2)))
    state, metrics = trainer.train_step(trainer.initial_state,
                                        {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out})
    assert metrics["loss"].dtype == jnp.float32 and np.isfinite(float(metrics["loss"]))
    leaves = jax.tree.leaves(state.params) + [
        x for x in jax.tree.leaves(state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert leaves and all(x.dtype == jnp.float32 for x in leaves)


@pytest.mark.slow
def test_port_from_a_training_checkpoint(reference_run, tmp_path):
    """--from jax-orbax converts train.py's latest orbax checkpoint into the same
    directory as the run's own export (bit for bit), tokenizer included."""
    workdir, _ = reference_run
    assert port_command.main(["--from", "jax-orbax", str(workdir / "checkpoints"),
                      str(tmp_path / "ported")]) == 0
    config, tensors = checkpoint_dir.load_dir(tmp_path / "ported")
    export_config, export_tensors = checkpoint_dir.load_dir(workdir / "export")
    assert config == export_config and sorted(tensors) == sorted(export_tensors)
    for key in tensors:
        np.testing.assert_array_equal(tensors[key], export_tensors[key], err_msg=key)
    assert (tmp_path / "ported" / "tokenizer.model").read_bytes() == (
        workdir / "tokenizer.model").read_bytes()
    assert port_command.main(["--from", "jax-orbax", str(tmp_path), str(tmp_path / "x")]) == 2



@pytest.mark.slow
def test_a_test_sentence_longer_than_max_len_still_gets_its_attention_plot(tmp_path):
    """The plot shows the first test sentence and its translation, encoded again: their
    first --max-len tokens, however long they are."""
    splits = corpora.number_corpus(num_train=1500, num_dev=0, num_test=10, max_number=10000)
    long_pair = tuple(" ".join([text] * 12) for text in splits["test"][0])  # > 32 pieces
    for split, pairs in (("train", splits["train"]), ("test", [long_pair, *splits["test"]])):
        for side, suffix in enumerate(("src", "tgt")):
            (tmp_path / f"{split}.{suffix}").write_text("".join(p[side] + "\n" for p in pairs))
    summary = tiny_run(tmp_path / "run", "--steps", "1", "--max-len", "32",
                       "--src-path", str(tmp_path / "train.src"),
                       "--tgt-path", str(tmp_path / "train.tgt"),
                       "--test-src-path", str(tmp_path / "test.src"),
                       "--test-tgt-path", str(tmp_path / "test.tgt"))
    assert summary["samples"][0]["source"] == long_pair[0]
    assert (tmp_path / "run" / "attention.png").is_file()
