"""Export to Hugging Face Marian: `python -m jax_transformer.port --to hf-marian`.

- Round trip: a random transformers MarianMTModel, saved, imported (--from hf-marian)
  and exported again gives back every tensor bit for bit, loads with no missing or
  unexpected key, and keeps the config fields that define the model.
- Ours -> Marian: a random torch_reference model gives its logits (float32, 1e-4) and
  greedy tokens in MarianMTModel; MarianTokenizer encodes to our ids and decodes back.
- A model trained by train.py (--position-layout half_split), converted from its orbax
  checkpoint and exported, gives our decoders' greedy and beam tokens in `generate`.
- Models Marian cannot compute are refused, naming the field.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import safetensors.numpy
import torch

import torch_reference
from jax_transformer import port
from parity_tests.helpers import fast_tier
from parity_tests.test_port import (greedy, make_marian, marian_config, perturb_, source_batch,
                                    target_batch)
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

# What train.py --position-layout half_split --activation silu makes: pad 0, bos 2, eos 3.
EXPORTABLE = TransformerConfig(src_vocab_size=100, tgt_vocab_size=100, d_model=32, num_heads=4,
                               d_ff=64, num_encoder_layers=2, num_decoder_layers=2, max_len=64,
                               activation="silu", position_layout="half_split")
PAD, BOS, EOS = EXPORTABLE.pad_id, EXPORTABLE.bos_id, EXPORTABLE.eos_id
TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
        "hello world how are you today"] * 20


def export(src, out) -> None:
    assert port.main(["--to", "hf-marian", str(src), str(out)]) == 0


def load_hf(directory):
    """MarianMTModel.from_pretrained, asserting that every key was expected and present."""
    model, info = transformers.MarianMTModel.from_pretrained(
        directory, output_loading_info=True, attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def hf_logits_fn(model, pad):
    def logits(src, tgt):
        src = torch.as_tensor(src)
        with torch.no_grad():
            return model(input_ids=src, attention_mask=src != pad,
                         decoder_input_ids=torch.as_tensor(tgt)).logits.numpy()
    return logits


# ------------------------------------------------------------ round trip

ROUND_TRIP = {
    "shared-tied": dict(),  # opus-mt's layout
    "shared-untied": dict(tie_word_embeddings=False, activation_function="gelu"),
    "separate-tied": dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=120,
                          activation_function="relu", scale_embedding=False),
    "separate-untied": dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=120,
                            tie_word_embeddings=False),
}
# forced_eos_token_id is not among them: the export writes none (our searches force no
# end token), nor attention_/activation_dropout: ours is one rate, written to all three.
CONFIG_FIELDS = ("vocab_size", "decoder_vocab_size", "share_encoder_decoder_embeddings",
                 "tie_word_embeddings", "d_model", "encoder_layers", "decoder_layers",
                 "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
                 "decoder_ffn_dim", "activation_function", "scale_embedding",
                 "max_position_embeddings", "pad_token_id", "eos_token_id",
                 "decoder_start_token_id", "dropout", "is_encoder_decoder", "model_type")


@pytest.mark.parametrize("variant", list(ROUND_TRIP))
def test_round_trip_is_bit_exact(tmp_path, variant):
    torch.manual_seed(0)
    model = transformers.MarianMTModel(marian_config(**ROUND_TRIP[variant])).eval()
    perturb_(model)  # every parameter and final_logits_bias; the sinusoid tables stay exact
    if variant == "shared-untied":  # transformers keeps three tables here; shared means equal
        with torch.no_grad():
            for stack in (model.model.encoder, model.model.decoder):
                stack.embed_tokens.weight.copy_(model.model.shared.weight)
    model.save_pretrained(tmp_path / "hf")
    assert port.main(["--from", "hf-marian", str(tmp_path / "hf"), str(tmp_path / "ours")]) == 0
    export(tmp_path / "ours", tmp_path / "back")

    saved = safetensors.numpy.load_file(tmp_path / "hf" / "model.safetensors")
    back = safetensors.numpy.load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(saved)  # the keys save_pretrained writes, no more
    for key, value in saved.items():
        assert back[key].dtype == value.dtype and np.array_equal(back[key], value), key
    loaded = load_hf(tmp_path / "back")
    want, got = model.state_dict(), loaded.state_dict()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    for field in CONFIG_FIELDS:
        assert getattr(loaded.config, field) == getattr(model.config, field), field


# ------------------------------------------------------------ ours -> Marian

OURS = {
    "tied-no-bias": dict(),  # train.py's model: zero final_logits_bias
    "untied-bias": dict(tie_output=False, output_bias=True, activation="gelu"),
    "separate-untied": dict(share_embeddings=False, tgt_vocab_size=120, tie_output=False,
                            scale_embeddings=False, activation="relu"),
    "separate-tied-bias": dict(share_embeddings=False, tgt_vocab_size=90, output_bias=True),
    "odd-width": dict(d_model=21, num_heads=7, d_ff=11, output_bias=True),
}


def save_ours(directory, config, seed=0, tokenizer=None):
    torch.manual_seed(seed)
    model = torch_reference.Transformer(config).eval()
    perturb_(model)  # biases and norms too
    model.save_pretrained(directory, tokenizer=tokenizer)
    return model


@pytest.mark.parametrize("variant", fast_tier(OURS, fast={"tied-no-bias", "separate-untied",
                                                          "odd-width"}))
def test_our_model_computes_the_same_in_transformers(tmp_path, variant):
    config = EXPORTABLE.replace(**OURS[variant])
    ours = save_ours(tmp_path / "ours", config)
    export(tmp_path / "ours", tmp_path / "hf")
    hf = load_hf(tmp_path / "hf")
    src = source_batch(config.src_vocab_size, PAD, EOS)
    tgt = target_batch(config.tgt_vocab_size, BOS)

    def our_logits(s, t):
        with torch.no_grad():
            return ours(torch.as_tensor(s), torch.as_tensor(t)).numpy()

    want, got = our_logits(src, tgt), hf_logits_fn(hf, PAD)(src, tgt)
    assert np.abs(got - want).max() <= 1e-4, np.abs(got - want).max()
    np.testing.assert_array_equal(greedy(hf_logits_fn(hf, PAD), src, BOS, PAD),
                                  greedy(our_logits, src, BOS, PAD))


def test_tokenizer_loads_in_transformers_with_our_ids(tmp_path):
    spm_model = tmp_path / "tokenizer.model"
    ours = Tokenizer.train(TEXT, spm_model, vocab_size=40)
    save_ours(tmp_path / "ours", EXPORTABLE, tokenizer=spm_model)
    export(tmp_path / "ours", tmp_path / "hf")
    for name in ("source.spm", "target.spm"):
        assert (tmp_path / "hf" / name).read_bytes() == spm_model.read_bytes()
    vocab = json.loads((tmp_path / "hf" / "vocab.json").read_text())
    assert vocab == {ours.sp.id_to_piece(i): i for i in range(ours.vocab_size)}
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert isinstance(hf_tok, transformers.MarianTokenizer)
    assert (hf_tok.pad_token_id, hf_tok.eos_token_id, hf_tok.unk_token_id) == (PAD, EOS, 1)
    for text in ["the lazy fox", "a quick brown dog saves time", "hello ☃ world"]:
        ids = hf_tok(text).input_ids
        assert ids == ours.encode(text) + [EOS], text  # ☃ is <unk> on both sides
        if "☃" not in text:  # we decode <unk> as " ⁇ ", transformers as "<unk>"
            generated = [BOS] + ids + [PAD, PAD]  # as generate returns it
            assert hf_tok.decode(generated, skip_special_tokens=True) == text
            assert ours.decode(generated[1:]) == text


def test_marian_tokenizer_files_are_copied_back(tmp_path):
    """A checkpoint converted from opus-mt keeps its own tokenizer files, not ours."""
    spm = pytest.importorskip("sentencepiece")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT), model_writer=buf, vocab_size=40,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    _, src_dir = make_marian(tmp_path)
    for name in ("source.spm", "target.spm"):
        (src_dir / name).write_bytes(buf.getvalue())
    proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    pieces = [p for p in map(proc.id_to_piece, range(proc.get_piece_size()))
              if p not in ("<unk>", "<s>", "</s>")]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}, "<pad>": 99}
    (src_dir / "vocab.json").write_text(json.dumps(vocab))
    assert port.main(["--from", "hf-marian", str(src_dir), str(tmp_path / "ours")]) == 0
    export(tmp_path / "ours", tmp_path / "back")
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (tmp_path / "back" / name).read_bytes() == (src_dir / name).read_bytes(), name
    hf_tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "back")
    assert hf_tok("the lazy fox").input_ids == port.MarianTokenizer(tmp_path / "ours").encode(
        "the lazy fox")


# ------------------------------------------------------------ refusals

def save_zeros(directory, config):
    tensors = {k: np.zeros(shape, np.float32)
               for k, shape in checkpoint_dir.expected_shapes(config).items()}
    checkpoint_dir.save_dir(directory, config, tensors)


@pytest.mark.parametrize("change, field", [
    (dict(position_layout="interleaved"), "position_layout"),
    (dict(pre_norm=True), "pre_norm"),
    (dict(final_norm=True), "final_norm"),
    (dict(pre_norm=True, final_norm=True), "pre_norm"),
    (dict(layer_norm_eps=1e-6), "layer_norm_eps"),
])
def test_models_marian_cannot_compute_are_refused(tmp_path, capsys, change, field):
    save_zeros(tmp_path / "ours", EXPORTABLE.replace(**change))
    assert port.main(["--to", "hf-marian", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot export to Marian: " + field) and err.count("\n") == 1
    assert not (tmp_path / "hf").exists()  # refused before anything is written


def test_fields_the_export_does_not_know_must_keep_their_default(tmp_path, monkeypatch):
    """A config field added later is refused unless at its default (here: output_bias
    playing a new field), so the export never silently drops a variant."""
    from jax_transformer.port import hf_export
    monkeypatch.setattr(hf_export, "MARIAN_FREE", hf_export.MARIAN_FREE - {"output_bias"})
    save_zeros(tmp_path / "ours", EXPORTABLE.replace(output_bias=True))
    with pytest.raises(port.PortError, match="output_bias=True .*default, False"):
        port.export_hf_marian(tmp_path / "ours", tmp_path / "hf")
    hf_export.hf_marian_config(EXPORTABLE)  # at its default it exports


def test_from_and_to_together_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        port.main(["--from", "hf-marian", "--to", "hf-marian", "a", "b"])
    assert exit_info.value.code == 2 and "not allowed with" in capsys.readouterr().err
