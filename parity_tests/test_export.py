"""Export to Hugging Face Marian: `jaxformer-port --to hf-marian`.

- Round trip: a random transformers MarianMTModel, saved, imported (--from hf-marian)
  and exported again gives back every tensor bit for bit, loads with no missing or
  unexpected key, and keeps the config fields that define the model.
- Ours -> Marian: a random torch_reference model, with either sinusoid layout train.py
  makes, gives its logits (float32, 1e-5) and greedy tokens in MarianMTModel, and imported
  back, its logits; MarianTokenizer encodes to our ids and decodes back.
- A model trained by train.py (its default, interleaved sinusoids), converted from its
  orbax checkpoint and exported, gives our greedy tokens on 50 sentences, our Flax
  model's logits (float32, 1e-4) and our beam tokens in `generate`.
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
import torch_reference.decoding
from jax_transformer import port
from jax_transformer.commands import port as port_command
from transformer_core.marian_tokenizer import MarianTokenizer
from parity_tests.helpers import (fast_tier, load_hf, make_marian, marian_config,
                                  number_sentences, perturb_, source_batch, target_batch)
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
    assert port_command.main(["--to", "hf-marian", str(src), str(out)]) == 0


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
    assert port_command.main(["--from", "hf-marian", str(tmp_path / "hf"), str(tmp_path / "ours")]) == 0
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
    # train.py's default model: the paper's sinusoids, exported with their columns reordered
    "interleaved": dict(position_layout="interleaved", activation="relu"),
    "interleaved-odd-width-untied-bias": dict(position_layout="interleaved", d_model=21,
                                              num_heads=7, d_ff=11, tie_output=False,
                                              output_bias=True),
    "interleaved-separate-tied-bias": dict(position_layout="interleaved", share_embeddings=False,
                                           tgt_vocab_size=90, output_bias=True),
}


def first_sentence(row) -> list[int]:
    """Generated ids up to and including the first </s>."""
    row = [int(i) for i in row]
    return row[: row.index(EOS) + 1] if EOS in row else row


def save_ours(directory, config, seed=0, tokenizer=None):
    torch.manual_seed(seed)
    model = torch_reference.Transformer(config).eval()
    perturb_(model)  # biases and norms too
    model.save_pretrained(directory, tokenizer=tokenizer)
    return model


@pytest.mark.parametrize("variant", fast_tier(OURS, fast={"tied-no-bias", "separate-untied",
                                                          "odd-width", "interleaved"}))
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
    assert np.abs(got - want).max() <= 1e-5, np.abs(got - want).max()
    # From labels, MarianMTModel builds the decoder input with config.decoder_start_token_id.
    labels = torch.as_tensor(np.concatenate([tgt[:, 1:], np.full((len(tgt), 1), EOS)], axis=1))
    with torch.no_grad():
        from_labels = hf(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != PAD),
                         labels=labels).logits.numpy()
    np.testing.assert_array_equal(from_labels, got)
    # generate() reads the start, end and pad ids from the export: it gives
    # torch_reference's cached greedy tokens, running to max_len (no forced </s>).
    tokens, _ = torch_reference.decoding.greedy_search(ours, torch.as_tensor(src),
                                                       max_len=config.max_len)
    src_t = torch.as_tensor(src)
    hf_tokens = hf.generate(input_ids=src_t, attention_mask=src_t != PAD, do_sample=False,
                            max_new_tokens=config.max_len)
    assert [first_sentence(r[1:]) for r in hf_tokens.tolist()] == [
        first_sentence(r) for r in tokens.tolist()]


def test_generate_takes_the_callers_length_bound_without_a_warning(tmp_path):
    """generate(max_new_tokens=N) and generate(max_length=N) on the export: N bounds the
    output and transformers says nothing. Before: generation_config.json held max_length,
    and max_new_tokens drew `Both max_new_tokens (=3) and max_length(=65) seem to have
    been set`."""
    import logging
    import warnings
    save_ours(tmp_path / "ours", EXPORTABLE)
    export(tmp_path / "ours", tmp_path / "hf")
    hf = load_hf(tmp_path / "hf")
    src = torch.as_tensor(source_batch(EXPORTABLE.src_vocab_size, PAD, EOS))
    said = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            new_tokens = hf.generate(input_ids=src, attention_mask=src != PAD, do_sample=False,
                                     max_new_tokens=3)
            length = hf.generate(input_ids=src, attention_mask=src != PAD, do_sample=False,
                                 max_length=5)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert said == [] and [str(w.message) for w in warned] == []
    assert new_tokens.shape[1] <= 1 + 3 and length.shape[1] <= 5


@pytest.mark.parametrize("variant", fast_tier(OURS, fast={"interleaved"}))
def test_an_export_imports_back_as_the_same_model(tmp_path, variant):
    """Ours -> Marian -> ours: a half_split model (whatever the layout it had) whose
    logits are the original's."""
    config = EXPORTABLE.replace(**OURS[variant])
    ours = save_ours(tmp_path / "ours", config)
    export(tmp_path / "ours", tmp_path / "hf")
    assert port_command.main(["--from", "hf-marian", str(tmp_path / "hf"),
                              str(tmp_path / "back")]) == 0
    back = torch_reference.Transformer.from_pretrained(tmp_path / "back").eval()
    assert back.config.position_layout == "half_split"
    src = torch.as_tensor(source_batch(config.src_vocab_size, PAD, EOS))
    tgt = torch.as_tensor(target_batch(config.tgt_vocab_size, BOS))
    with torch.no_grad():
        diff = (back(src, tgt) - ours(src, tgt)).abs().max().item()
    assert diff <= 1e-5, diff


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
    assert port_command.main(["--from", "hf-marian", str(src_dir), str(tmp_path / "ours")]) == 0
    export(tmp_path / "ours", tmp_path / "back")
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (tmp_path / "back" / name).read_bytes() == (src_dir / name).read_bytes(), name
    hf_tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "back")
    assert hf_tok("the lazy fox").input_ids == MarianTokenizer(tmp_path / "ours").encode(
        "the lazy fox")


# ------------------------------------------------------------ refusals

def save_zeros(directory, config, tokenizer=None):
    tensors = {k: np.zeros(shape, np.float32)
               for k, shape in checkpoint_dir.expected_shapes(config).items()}
    checkpoint_dir.save_dir(directory, config, tensors, tokenizer=tokenizer)


@pytest.mark.parametrize("change, field", [
    (dict(position_layout="fairseq"), "position_layout"),
    (dict(pre_norm=True), "pre_norm"),
    (dict(final_norm=True), "final_norm"),
    (dict(pre_norm=True, final_norm=True), "pre_norm"),
    (dict(layer_norm_eps=1e-6), "layer_norm_eps"),
])
def test_models_marian_cannot_compute_are_refused(tmp_path, capsys, change, field):
    save_zeros(tmp_path / "ours", EXPORTABLE.replace(**change))
    assert port_command.main(["--to", "hf-marian", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 2
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


def test_a_tokenizer_with_other_special_ids_is_refused(tmp_path):
    spm_model = tmp_path / "tokenizer.model"
    Tokenizer.train(TEXT, spm_model, vocab_size=40)  # pad 0
    save_zeros(tmp_path / "ours", EXPORTABLE.replace(pad_id=1), tokenizer=spm_model)
    with pytest.raises(port.PortError, match="has <pad> at id 0, the model at 1"):
        port.export_hf_marian(tmp_path / "ours", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_from_and_to_together_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        port_command.main(["--from", "hf-marian", "--to", "hf-marian", "a", "b"])
    assert exit_info.value.code == 2 and "not allowed with" in capsys.readouterr().err


# ------------------------------------------------------------ a model trained by train.py

SENTENCES = ["three hundred and forty-two", "seventeen", "one thousand, two hundred and five",
             "nine thousand, nine hundred and ninety-nine", "eight", "four thousand and sixty",
             "twenty-one", "five hundred"]
MAX_LEN = 24  # generated tokens, </s> included; transformers' max_length adds the start token


@pytest.fixture(scope="module")
def trained(trained_translator, tmp_path_factory):
    """(our checkpoint directory of a tiny train.py run (conftest.py), its Marian export)."""
    hf = tmp_path_factory.mktemp("marian_export") / "hf"
    export(trained_translator, hf)
    return trained_translator, hf


@pytest.mark.slow
def test_trained_model_tokenizer_matches_ours(trained):
    ours_dir, hf_dir = trained
    ours = Tokenizer(ours_dir / "tokenizer.model")
    hf_tok = transformers.MarianTokenizer.from_pretrained(hf_dir)
    for text in SENTENCES + ["dreihundertzweiundvierzig", "neuntausendneunhundert"]:
        ids = hf_tok(text).input_ids
        assert ids == ours.encode(text) + [EOS], text
        assert hf_tok.decode(ids, skip_special_tokens=True) == ours.decode(ids) == text


@pytest.mark.slow
def test_trained_model_generates_our_tokens(trained):
    """Greedy: transformers' generate(num_beams=1) against decoding.greedy_search.

    Beam: our beam search ranks finished beams by logprob / ((5 + len) / 6) ** alpha
    (GNMT), transformers' by logprob / len ** length_penalty; they agree only at 0, so
    alpha = length_penalty = 0 (both: summed log-probabilities). The searches still
    differ in two corners, avoided here, not compared: transformers counts beams that
    reach max_length as finished (we return live beams only if none finished: so every
    best beam here must end in </s>), and lets only eos-extensions ranked in the top K of
    the 2K candidates finish, where ours (the Flax WMT example) lets all 2K.
    """
    import jax.numpy as jnp
    from flax import nnx

    from jax_transformer import decoding
    from jax_transformer.model import Transformer as FlaxTransformer
    ours_dir, hf_dir = trained
    hf_tok = transformers.MarianTokenizer.from_pretrained(hf_dir)
    batch = hf_tok(number_sentences(50), padding=True, return_tensors="pt")
    src = batch["input_ids"].numpy()
    flax_model = FlaxTransformer.from_pretrained(ours_dir)
    hf = load_hf(hf_dir)

    tokens, _ = decoding.greedy_search(flax_model, src, max_len=MAX_LEN)
    hf_tokens = hf.generate(**batch, num_beams=1, do_sample=False, max_length=MAX_LEN + 1)
    assert [first_sentence(r[1:]) for r in hf_tokens.tolist()] == [first_sentence(r)
                                                                   for r in np.asarray(tokens)]
    ours_text = [Tokenizer(ours_dir / "tokenizer.model").decode(r) for r in np.asarray(tokens)]
    assert hf_tok.batch_decode(hf_tokens, skip_special_tokens=True) == ours_text
    assert len(set(ours_text)) > 1  # the source matters

    # Teacher-forced on the greedy output, the logits agree too (float32).
    tgt = np.concatenate([np.full((len(src), 1), BOS), np.asarray(tokens)[:, :-1]], axis=1)
    flax_logits = np.asarray(nnx.view(flax_model, deterministic=True)(
        jnp.asarray(src, jnp.int32), jnp.asarray(tgt, jnp.int32)))
    hf_logits = hf_logits_fn(hf, PAD)(src, tgt)
    assert np.abs(hf_logits - flax_logits).max() <= 1e-4, np.abs(hf_logits - flax_logits).max()

    batch = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    src = batch["input_ids"].numpy()
    for beam in (2, 4):
        tokens, scores = decoding.beam_search(flax_model, src, max_len=MAX_LEN, beam_size=beam,
                                              alpha=0.0)
        best = [first_sentence(r) for r in np.asarray(tokens)[:, 0]]
        assert all(r[-1] == EOS for r in best), "a best beam hit max_len: raise MAX_LEN"
        out = hf.generate(**batch, num_beams=beam, do_sample=False, max_length=MAX_LEN + 1,
                          length_penalty=0.0, early_stopping=False, output_scores=True,
                          return_dict_in_generate=True)
        assert [first_sentence(r[1:]) for r in out.sequences.tolist()] == best, beam
        diff = np.abs(out.sequences_scores.numpy() - np.asarray(scores)[:, 0]).max()
        assert diff <= 1e-4, diff


@pytest.mark.slow
def test_a_trained_model_translates_alike_in_both_frameworks(trained):
    """A train.py run's export: the same greedy translations from Flax and torch_reference."""
    from jax_transformer.applications import translator
    from jax_transformer.model import Transformer as FlaxTransformer
    ours_dir, _ = trained
    tokenizer = Tokenizer(ours_dir / "tokenizer.model")
    models = ((FlaxTransformer.from_pretrained(ours_dir), "jax"),
              (torch_reference.Transformer.from_pretrained(ours_dir).eval(), "torch"))
    outputs = [translator.translate_lines(SENTENCES, model, tokenizer, framework=framework,
                                          beam=1, batch_size=8) for model, framework in models]
    assert outputs[0] == outputs[1] and any(outputs[0])
