"""Fine-tuning a converted opus-mt model (train.py --init-from) trains what transformers
would: the same batch, the same loss, and an export transformers loads and runs alike.

A random MarianMTModel with a tokenizer built here (a source and a target
SentencePiece model, their pieces in one vocab.json, Marian's ids: </s> 0, <unk> 1,
<pad> last, and the decoder starting from <pad>), converted with `port --from
hf-marian`, fine-tuned for 50 steps on generated number words (dropout 0):

- step 1's loss is the label-smoothed loss transformers computes for that batch with
  the original model (float32, relative 1e-5). The batch is what a transformers
  fine-tuning script makes: MarianTokenizer(src, text_target=tgt), padded by
  DataCollatorForSeq2Seq(model=...) (labels padded with -100, decoder_input_ids =
  shift_tokens_right(labels): <pad> first), and the loss is the Trainer's
  LabelSmoother(epsilon=0.1): (1 - eps) * mean nll + eps * mean over tokens and
  vocabulary of -log p, over the non--100 labels. Our run packs the same pairs into
  rows; the training set fits one batch, so step 1 sees every pair once.
- the loss falls;
- `port --to hf-marian` of the run's export holds the tokenizer files it came with
  byte for byte, loads in MarianMTModel / MarianTokenizer, and greedy `generate`
  gives our greedy tokens.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from jax_transformer.commands import port as port_command
from jax_transformer.commands import train as train_command
from jax_transformer.data import corpora
from parity_tests.helpers import load_hf, make_marian, write_lines
from tests.train.runs import records

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

SMOOTHING = 0.1
TRAIN, DEV, TEST = 160, 16, 16


def sentencepiece(text: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=model,
                                   vocab_size=vocab_size, model_type="unigram",
                                   hard_vocab_limit=False, minloglevel=2)
    return model.getvalue()


def marian_vocab(*models: bytes) -> dict[str, int]:
    """Marian's vocab.json: </s> 0, <unk> 1, every piece of the models once, <pad> last."""
    pieces = []
    for model in models:
        proc = spm.SentencePieceProcessor(model_proto=model)
        pieces += [p for p in map(proc.id_to_piece, range(proc.get_piece_size()))
                   if p not in ("<unk>", "<s>", "</s>") and p not in pieces]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    return {**vocab, "<pad>": len(vocab)}


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finetune_marian")
    splits = corpora.number_corpus("en", "de", num_train=TRAIN, num_dev=DEV, num_test=TEST,
                                   max_number=2000, seed=0)
    source = sentencepiece([s for s, _ in splits["train"]], 60)
    target = sentencepiece([t for _, t in splits["train"]], 60)
    assert source != target  # separate pieces, one id space
    vocab = marian_vocab(source, target)
    pad = vocab["<pad>"]
    model, src_dir = make_marian(tmp, vocab_size=len(vocab), pad_token_id=pad,
                                 decoder_start_token_id=pad, eos_token_id=0,
                                 forced_eos_token_id=0)
    (src_dir / "source.spm").write_bytes(source)
    (src_dir / "target.spm").write_bytes(target)
    (src_dir / "vocab.json").write_text(json.dumps(vocab))
    assert port_command.main(["--from", "hf-marian", str(src_dir), str(tmp / "ours")]) == 0

    corpus = []
    for split, flag in (("train", ""), ("dev", "dev-"), ("test", "test-")):
        corpus += [f"--{flag}src-path", write_lines(tmp / f"{split}.en", [s for s, _ in splits[split]]),
                   f"--{flag}tgt-path", write_lines(tmp / f"{split}.de", [t for _, t in splits[split]])]
    workdir = tmp / "run"
    assert train_command.main([
        "--workdir", str(workdir), "--init-from", str(tmp / "ours"), *corpus, "--dropout", "0",
        "--label-smoothing", str(SMOOTHING), "--steps", "50", "--lr", "3e-3", "--warmup", "5",
        "--eval-every", "25", "--checkpoint-every", "50", "--samples", "0", "--quiet"]) == 0
    assert port_command.main(["--to", "hf-marian", str(workdir / "export"), str(tmp / "hf")]) == 0
    return model.eval(), src_dir, workdir, tmp / "hf", splits


@pytest.mark.slow
def test_step_one_loss_is_transformers_label_smoothed_loss(finetuned):
    from transformers.trainer_pt_utils import LabelSmoother
    model, src_dir, workdir, _, splits = finetuned
    tokenizer = transformers.MarianTokenizer.from_pretrained(src_dir)
    features = [tokenizer(s, text_target=t) for s, t in splits["train"]]
    batch = transformers.DataCollatorForSeq2Seq(tokenizer, model=model, return_tensors="pt")(
        features).to(model.device)  # the model is on the suite's torch device
    pad = model.config.pad_token_id
    assert (batch["decoder_input_ids"][:, 0] == pad).all()  # Marian starts from <pad>
    with torch.no_grad():
        outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        decoder_input_ids=batch["decoder_input_ids"])
        want = float(LabelSmoother(epsilon=SMOOTHING)(
            outputs, batch["labels"]))
    step_one = next(r for r in records(workdir) if r["step"] == 1 and "loss" in r)
    # The run's first batch held every training pair: as many target tokens.
    assert step_one["tokens"] == int((batch["labels"] != -100).sum())
    assert abs(step_one["loss"] - want) <= 1e-5 * abs(want), (step_one["loss"], want)


@pytest.mark.slow
def test_the_loss_falls_and_the_start_is_reported(finetuned):
    _, _, workdir, _, _ = finetuned
    losses = [r["loss"] for r in records(workdir) if "loss" in r]
    assert len(losses) == 50 and max(losses[-5:]) < 0.7 * losses[0], losses
    results = json.loads((workdir / "eval.json").read_text())
    dev = {r["step"]: r["dev_loss"] for r in records(workdir) if "dev_loss" in r}
    assert sorted(dev) == [0, 25, 50] and dev[50] < dev[0]
    assert results["start"]["dev"]["loss"] == dev[0] > results["dev"]["loss"]
    for key in ("bleu", "chrf", "exact_match"):
        assert key in results["start"]["test"] and key in results["test"]


def first_sentence(row, eos: int) -> list[int]:
    row = [int(i) for i in row]
    return row[: row.index(eos) + 1] if eos in row else row


@pytest.mark.slow
def test_the_export_keeps_its_tokenizer_and_generates_our_tokens(finetuned):
    from jax_transformer import decoding
    from jax_transformer.model import Transformer as FlaxTransformer
    from transformer_core.marian_tokenizer import MarianTokenizer
    _, src_dir, workdir, hf_dir, splits = finetuned
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (hf_dir / name).read_bytes() == (src_dir / name).read_bytes(), name
        assert (workdir / "export" / name).read_bytes() == (src_dir / name).read_bytes(), name
    hf = load_hf(hf_dir)
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(hf_dir)
    sources = [s for s, _ in splits["test"]]
    batch = hf_tokenizer(sources, padding=True, return_tensors="pt")
    ours = FlaxTransformer.from_pretrained(workdir / "export")
    eos = ours.config.eos_id
    tokens, _ = decoding.greedy_search(ours, batch["input_ids"].numpy(), max_len=24)
    hf_tokens = hf.generate(**batch, num_beams=1, do_sample=False, max_length=25)
    want = [first_sentence(r, eos) for r in np.asarray(tokens)]
    assert [first_sentence(r[1:], eos) for r in hf_tokens.tolist()] == want
    assert len({tuple(r) for r in want}) > 1  # the source matters
    ours_text = [MarianTokenizer(workdir / "export").decode(r) for r in np.asarray(tokens)]
    assert hf_tokenizer.batch_decode(hf_tokens, skip_special_tokens=True) == ours_text
