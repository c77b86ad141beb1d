"""train.py --init-from: fine-tuning a checkpoint directory (a train.py export here; a
converted Marian model against transformers in parity_tests/test_finetune.py).

- Step 1 starts from exactly the exported weights, and the starting model's dev loss
  is the one the exporting run reported; resuming the fine-tuning run gives the
  uninterrupted run's losses bit for bit; another DIR (or none) is refused on resume.
- A mismatched model flag, an unreadable DIR, a DIR without a tokenizer and a corpus
  of mostly unknown pieces each give one `error:` line (exit 2) before any training.
- The fine-tuning schedules, --freeze embeddings, the model's special ids in batches.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from jax_transformer.commands import train as train_command
from jax_transformer.data import corpora
from jax_transformer.data.batches.packed import PackedBatches
from jax_transformer.pretrained import to_torch_state_dict
from jax_transformer.train import finetune
from jax_transformer.train.checkpoints import Checkpointer
from jax_transformer.train.run import prepare
from jax_transformer.train.settings.training import TrainSettings
from jax_transformer.train.step import freeze, make_optimizer, make_schedule, warmup_schedule
from tests.helpers import run_command
from tests.train.runs import REPO_ROOT, TINY, losses, records, tiny_run, tiny_settings
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.errors import TrainError
from transformer_core.tokenizer import Tokenizer

# TINY without the model flags: --init-from brings the model (TINY's repeat it, also fine).
DATA = TINY[: TINY.index("--d-model")] + TINY[TINY.index("--max-tokens"):]


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory) -> Path:
    """A checkpoint directory made without training: random weights, a tokenizer trained
    on number words (what train.py's built-in corpus holds)."""
    import torch

    import torch_reference
    tmp = tmp_path_factory.mktemp("small_dir")
    pairs = corpora.number_corpus("en", "de", num_train=300, num_dev=1, num_test=1,
                                  max_number=1000, seed=0)["train"]
    tokenizer = Tokenizer.train([s for pair in pairs for s in pair], tmp / "spm.model", 100)
    config = TransformerConfig(src_vocab_size=tokenizer.vocab_size,
                               tgt_vocab_size=tokenizer.vocab_size, d_model=16, num_heads=2,
                               d_ff=32, num_encoder_layers=1, num_decoder_layers=1, max_len=64)
    torch.manual_seed(0)
    torch_reference.Transformer(config).save_pretrained(tmp / "ckpt", tokenizer=tmp / "spm.model")
    return tmp / "ckpt"


def broken(small_dir: Path, tmp: Path, kind: str) -> Path:
    """A copy of `small_dir` damaged as `kind` says."""
    out = tmp / kind
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        (out / name).write_bytes((small_dir / name).read_bytes())
    if kind == "no-tokenizer":
        (out / "tokenizer.model").unlink()
    elif kind == "bad-config":
        (out / "config.json").write_text('{"d_model": "wide"}')
    elif kind == "cut-weights":
        data = (small_dir / "model.safetensors").read_bytes()
        (out / "model.safetensors").write_bytes(data[: len(data) // 2])
    return out


def run_train(*flags, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", "--quiet", *flags], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flags, message", [
    (["--d-model", "32", "--heads", "4", "--dropout", "0"],
     "--init-from {dir} fixes the model: --d-model 32 (its config.json: 16), --num-heads 4 "
     "(its config.json: 2); drop these flags (only --dropout may differ)"),
    (["--preset", "base"], "--preset picks a new model's sizes"),
    (["--task", "lm"], "--task lm trains decoder_only models"),
    (["--max-len", "65"], "--max-len 65 is longer than the positions of --init-from {dir}"),
    (["DIR=missing"], "--init-from {tmp}/missing: no such directory"),
    (["DIR=bad-config"], "--init-from {tmp}/bad-config: {tmp}/bad-config/config.json: d_model "
                         "must be an integer"),
    (["DIR=cut-weights"], "--init-from {tmp}/cut-weights: {tmp}/cut-weights/model.safetensors "
                          "is corrupt or truncated"),
    (["DIR=no-tokenizer"], "--init-from {tmp}/no-tokenizer: {tmp}/no-tokenizer has no "
                           "tokenizer.model (nor Marian's source.spm + vocab.json)"),
])
def test_a_bad_init_dir_or_model_flag_is_one_line_before_any_work(small_dir, tmp_path, capsys,
                                                                   flags, message):
    directory = small_dir
    if flags[0].startswith("DIR="):
        kind = flags.pop(0)[4:]
        directory = tmp_path / kind if kind == "missing" else broken(small_dir, tmp_path, kind)
    code, _, stderr = run_command(train_command.main, ["--quiet", "--workdir", tmp_path / "run",
                                                       "--init-from", directory, *DATA, *flags],
                                  capsys)  # in this process: refused before JAX loads
    assert code == 2, stderr[-2000:]
    [line] = stderr.strip().splitlines()
    assert line.startswith("error: " + message.format(dir=small_dir, tmp=tmp_path)), line
    assert not (tmp_path / "run").exists()  # refused while parsing the flags


@pytest.mark.slow
def test_an_abbreviated_flag_is_not_taken_for_another(small_dir, tmp_path):
    """Before: `--pres base` (to argparse, a prefix of --preset) slipped past the check
    that refuses --preset beside --init-from, and the run trained DIR's model, exit 0."""
    result = run_train("--workdir", str(tmp_path / "run"), "--init-from", str(small_dir),
                       *DATA, "--steps", "1", "--pres", "base")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.splitlines() == ["error: unrecognized arguments: --pres base",
                                          "see jaxformer-train --help"]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("relation", ["is", "holds", "sits inside"])
def test_a_workdir_in_the_init_dir_is_refused(small_dir, tmp_path, relation):
    """Before: `--workdir X --init-from X` trained, writing its config.json and
    checkpoints into the checkpoint it started from, whose fingerprint then changed, so
    the run refused to resume for ever."""
    directory = tmp_path / "ckpt"
    shutil.copytree(small_dir, directory)
    workdir = {"is": directory, "holds": tmp_path, "sits inside": directory / "run"}[relation]
    before = sorted(path.read_bytes() for path in directory.rglob("*") if path.is_file())
    result = run_train("--workdir", str(workdir), "--init-from", str(directory), *DATA,
                       "--steps", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        f"error: --workdir {workdir} {relation} --init-from {directory}: the run would write "
        "its files into the checkpoint it starts from; give a --workdir outside it"]
    assert sorted(path.read_bytes() for path in directory.rglob("*") if path.is_file()) == before


@pytest.mark.slow
def test_a_tokenizer_file_linked_out_of_the_init_dir_is_refused(small_dir, tmp_path):
    """Before: the link's target (any file the user can read) was copied into
    WORKDIR/tokenizer/ and into the shareable export/ as special_tokens_map.json."""
    directory = tmp_path / "ckpt"
    shutil.copytree(small_dir, directory)
    secret = tmp_path / "secret.json"
    secret.write_text('{"password": "hunter2"}')
    (directory / "special_tokens_map.json").symlink_to(secret)
    result = run_train("--workdir", str(tmp_path / "run"), "--init-from", str(directory),
                       *DATA, "--steps", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    link = directory / "special_tokens_map.json"
    assert result.stderr.splitlines() == [
        f"error: --init-from {directory}: {link} is a link to {secret}, outside {directory}; "
        f"copy the file itself into {directory}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a train.py subprocess
def test_a_corpus_of_mostly_unknown_pieces_is_refused_before_training(small_dir, tmp_path):
    greek = [" ".join(["αβγ δεζ ηθι"] * (1 + i % 3)) for i in range(60)]
    (tmp_path / "src.txt").write_text("\n".join(greek) + "\n")
    (tmp_path / "tgt.txt").write_text("\n".join(["eins zwei drei"] * 60) + "\n")
    result = run_train("--workdir", str(tmp_path / "run"), "--init-from", str(small_dir),
                       "--src-path", str(tmp_path / "src.txt"), "--tgt-path",
                       str(tmp_path / "tgt.txt"), "--num-dev", "10", "--num-test", "10")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and ("of 10 pairs (100.0%) are 25% or more unknown pieces "
                                           "(<unk>) to the tokenizer: is the text in the "
                                           "languages") in last, last
    assert not list((tmp_path / "run" / "checkpoints").glob("*"))  # no step saved
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nor any step taken


def test_help_says_which_schedule_init_from_uses(small_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_command.parse_args(["--help"])
    assert "inverse_sqrt (the default with --init-from)" in " ".join(
        capsys.readouterr().out.split())
    scratch = train_command.parse_args([]).train
    tuned = train_command.parse_args(["--init-from", str(small_dir)])
    assert (scratch.lr_schedule, scratch.warmup) == ("paper", 400)
    assert (tuned.train.lr_schedule, tuned.train.warmup, tuned.train.lr) == ("inverse_sqrt", 100,
                                                                            5e-5)
    assert (tuned.model.d_model, tuned.data.max_len) == (16, 64)  # DIR's, not the preset's


def test_fine_tuning_schedules_warm_up_linearly_to_the_peak():
    lrs = [float(warmup_schedule("inverse_sqrt", 1e-3, 4)(n)) for n in range(16)]
    np.testing.assert_allclose(lrs[:4], [2.5e-4, 5e-4, 7.5e-4, 1e-3], rtol=1e-6)
    np.testing.assert_allclose(lrs[15], 1e-3 * (4 / 16) ** 0.5, rtol=1e-6)
    constant = [float(warmup_schedule("constant", 1e-3, 4)(n)) for n in range(16)]
    np.testing.assert_allclose(constant, lrs[:4] + [1e-3] * 12, rtol=1e-6)
    train = TrainSettings(lr_schedule="constant", lr=2e-4, warmup=1)
    assert float(make_schedule(train, 512)(10)) == pytest.approx(2e-4)


def test_freeze_embeddings_keeps_them_bit_for_bit():
    params = {"shared_embed": {"embedding": np.ones((5, 2), np.float32)},
              "position_embed": {"embedding": np.ones((3, 2), np.float32)},
              "encoder": {"W_1": {"kernel": np.ones((2, 2), np.float32)}}}
    optimizer = freeze(make_optimizer(lambda count: 0.1))
    grads = jax.tree.map(lambda v: np.full_like(v, 0.5), params)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    new = optax.apply_updates(params, updates)
    assert np.array_equal(new["shared_embed"]["embedding"], params["shared_embed"]["embedding"])
    assert np.array_equal(new["position_embed"]["embedding"],
                          params["position_embed"]["embedding"])
    assert not np.array_equal(new["encoder"]["W_1"]["kernel"], params["encoder"]["W_1"]["kernel"])


def test_batches_use_the_model_s_special_ids():
    """A Marian model: <pad> 97 starts the decoder and pads, </s> 0 ends each side."""
    batches = PackedBatches([np.array([5, 6]), np.array([7])], [np.array([8]), np.array([9, 4])],
                            max_tokens=16, row_shapes=[(8, 8)], shuffle=False,
                            special_ids=(97, 97, 0))
    batch = next(batches.epoch(0))
    row = batch["tgt_segments"][0] > 0
    assert sorted(batch["tgt_in"][0][row].tolist()) == [4, 8, 9, 97, 97]
    assert sorted(batch["tgt_out"][0][row].tolist()) == [0, 0, 4, 8, 9]
    assert set(batch["tgt_out"][0][~row].tolist()) == {97}  # padding: ignored by the loss
    assert sorted(batch["src"][0][batch["src_segments"][0] > 0].tolist()) == [0, 0, 5, 6, 7]


def test_the_tokenizer_files_are_those_the_port_writes():
    """Ours, Marian's, FSMT's and M2M100/NLLB's (whose converted directories the
    parity_tests/test_finetune_fairseq.py runs also check file by file)."""
    from jax_transformer.port import fairseq_tokens
    from jax_transformer.port.marian import MARIAN_TOKENIZER_FILES
    from transformer_core import fairseq_tokenizer
    fsmt = {*fairseq_tokens.FSMT_COPIED_FILES, fairseq_tokens.SETTINGS_FILE}
    m2m100_and_nllb = {fairseq_tokenizer.SPM_FILE, fairseq_tokenizer.FAST_FILE,
                       fairseq_tokenizer.VOCAB_FILE}
    assert set(finetune.TOKENIZER_FILES) == {checkpoint_dir.TOKENIZER_FILE,
                                             *MARIAN_TOKENIZER_FILES, *fsmt, *m2m100_and_nllb}


# ------------------------------------------------------------ a train.py export, fine-tuned

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A 4-step train.py run (its export/ is the checkpoint to fine-tune), then an
    uninterrupted 8-step fine-tuning run of it with --freeze embeddings."""
    source = tmp_path_factory.mktemp("source")
    tiny_run(source, "--steps", "4")
    tuned = tmp_path_factory.mktemp("tuned")
    tiny_run(tuned, *FINETUNE, "--init-from", str(source / "export"), "--steps", "8")
    return source, tuned


FINETUNE = ("--lr", "3e-3", "--warmup", "3", "--freeze", "embeddings")


@pytest.mark.slow
def test_step_one_starts_from_exactly_the_exported_weights(exported, tmp_path):
    source, tuned = exported
    settings = tiny_settings(tmp_path, *FINETUNE, "--init-from", str(source / "export"))
    with Checkpointer(tmp_path) as checkpointer:
        run = prepare(settings, None, tmp_path, True, checkpointer, compile_cache=None,
                      started_at=time.monotonic())
    _, want = checkpoint_dir.load_dir(source / "export")
    got = to_torch_state_dict(run.trainer.model(run.trainer.initial_state))
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
    # ...so before its first step the run measures the dev loss the source run ended with.
    start = json.loads((tuned / "start_eval.json").read_text())
    assert start["dev"]["loss"] == json.loads((source / "eval.json").read_text())["dev"]["loss"]
    assert records(tuned)[0] == {"step": 0, "dev_loss": start["dev"]["loss"],
                                 "dev_nll": start["dev"]["nll"],
                                 "dev_perplexity": start["dev"]["perplexity"]}
    assert json.loads((tuned / "eval.json").read_text())["start"] == start
    # --freeze embeddings: the tied embedding is the exported one still, the layers moved.
    _, after = checkpoint_dir.load_dir(tuned / "export")
    assert np.array_equal(after["shared_embed.weight"], want["shared_embed.weight"])
    assert not np.array_equal(after["encoder.layers.0.ffn.W_1.weight"],
                              want["encoder.layers.0.ffn.W_1.weight"])
    assert (tuned / "export" / "tokenizer.model").read_bytes() == (
        source / "export" / "tokenizer.model").read_bytes()


@pytest.mark.slow
def test_a_resumed_fine_tuning_run_gives_the_uninterrupted_losses(exported, tmp_path):
    source, tuned = exported
    init = ("--init-from", str(source / "export"))
    tiny_run(tmp_path, *FINETUNE, *init, "--steps", "4")
    start = (tmp_path / "start_eval.json").read_text()
    other = tmp_path.parent / f"{tmp_path.name}-other"  # the same model, one weight changed
    config, tensors = checkpoint_dir.load_dir(source / "export")
    tensors["encoder.layers.0.ffn.W_1.bias"][0] += 1.0
    checkpoint_dir.save_dir(other, config, tensors, tokenizer=source / "export" / "tokenizer.model")
    with pytest.raises(TrainError, match="another checkpoint .* than the one the run"):
        tiny_run(tmp_path, *FINETUNE, "--init-from", str(other), "--steps", "8")
    with pytest.raises(TrainError, match="holds a fine-tuning run .* resume it with "
                                                  "the same --init-from DIR"):
        tiny_run(tmp_path, *FINETUNE, "--steps", "8")
    tiny_run(tmp_path, *FINETUNE, *init, "--steps", "8")
    assert losses(tmp_path) == losses(tuned)
    assert (tmp_path / "start_eval.json").read_text() == start  # not evaluated again
