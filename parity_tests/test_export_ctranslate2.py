"""Export to CTranslate2: `jaxformer-port --to ctranslate2`.

- Random models in every variant the export maps (post-/pre-LN, final norms, gelu/silu,
  untied and biased outputs, separate vocabularies, half-split and learned positions,
  no positions, no embedding scale, another LayerNorm epsilon): CTranslate2's
  score_batch gives our per-token log-probabilities (float32, CPU) and the vocabulary
  maps every id to our tokenizer's piece.
- A model trained by train.py: ctranslate2.Translator's greedy and beam-4 tokens equal
  our searches' on 100 sentences (tokenized with the copied tokenizer).
- Models a Translator cannot compute are refused, naming the field.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import torch_reference
from jax_transformer.commands import port as port_command
from parity_tests.helpers import fast_tier, number_sentences, perturb_
from transformer_core.config import TransformerConfig
from transformer_core.tokenizer import Tokenizer

ctranslate2 = pytest.importorskip("ctranslate2")

VOCAB = 48
BASE = TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, num_heads=4,
                         d_ff=64, num_encoder_layers=2, num_decoder_layers=2, max_len=40)
VARIANTS = {
    "post-ln": {},
    "pre-ln-final-norm": dict(pre_norm=True, final_norm=True),
    "pre-ln-no-final-norm": dict(pre_norm=True),
    "gelu-untied-bias": dict(activation="gelu", tie_output=False, output_bias=True),
    "silu-half-split-tied-bias": dict(activation="silu", position_layout="half_split",
                                      output_bias=True),
    "separate-vocabularies": dict(share_embeddings=False, tie_output=False, tgt_vocab_size=56),
    "learned-offset": dict(position_encoding="learned", position_offset=2),
    "fairseq-positions": dict(position_layout="fairseq", position_offset=2),
    # an epsilon far from CTranslate2's default 1e-5, so that a lost one shows
    "no-positions-unscaled-eps": dict(position_encoding="none", scale_embeddings=False,
                                      layer_norm_eps=1e-2),
}
TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
        "hello world how are you today"] * 20
SCORED = [("the lazy dog", "a quick fox"), ("hello world", "how are you today now"),
          ("a stitch in time saves nine the fox", "hello")]


def export(src, out) -> None:
    assert port_command.main(["--to", "ctranslate2", str(src), str(out)]) == 0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.train(TEXT, tmp_path_factory.mktemp("spm") / "tokenizer.model",
                           vocab_size=40)


def save_random(directory, config, tokenizer):
    torch.manual_seed(0)
    model = torch_reference.Transformer(config).eval()
    perturb_(model)  # biases and norms too, so a misplaced one shows
    model.save_pretrained(directory, tokenizer=tokenizer.path)
    return model


def our_log_probs(model, src: list[int], tgt: list[int]) -> np.ndarray:
    """log p(tgt[t] | src, bos + tgt[:t]) for each t, from torch_reference (float32)."""
    decoder_input = [model.config.bos_id] + tgt[:-1]
    with torch.no_grad():
        logits = model(torch.tensor([src]), torch.tensor([decoder_input]))[0]  # (T, V)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    return log_probs[torch.arange(len(tgt)), torch.tensor(tgt)].numpy()


@pytest.mark.parametrize("variant", fast_tier(VARIANTS, fast={"post-ln", "pre-ln-final-norm",
                                                               "separate-vocabularies"}))
def test_scores_match_ours(tmp_path, tokenizer, variant):
    config = BASE.replace(**VARIANTS[variant])
    model = save_random(tmp_path / "ours", config, tokenizer)
    export(tmp_path / "ours", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu",
                                        compute_type="float32")
    sp = Tokenizer(tmp_path / "ct2" / "tokenizer.model").sp  # the copy beside the model
    sources = [sp.encode(s, out_type=str) for s, _ in SCORED]  # CTranslate2 appends </s>
    targets = [sp.encode(t, out_type=str) for _, t in SCORED]
    results = translator.score_batch(sources, targets)
    for (src, tgt), result in zip(SCORED, results):
        tgt_ids = tokenizer.encode(tgt) + [config.eos_id]
        ours = our_log_probs(model, tokenizer.encode_source(src), tgt_ids)
        assert result.tokens == [sp.id_to_piece(i) for i in tgt_ids]
        np.testing.assert_allclose(result.log_probs, ours, atol=1e-4, rtol=0)


def test_vocabulary_and_special_tokens_are_ours(tmp_path, tokenizer):
    config = BASE.replace(share_embeddings=False, tie_output=False, tgt_vocab_size=56)
    save_random(tmp_path / "ours", config, tokenizer)
    export(tmp_path / "ours", tmp_path / "ct2")
    out = tmp_path / "ct2"
    assert (out / "tokenizer.model").read_bytes() == tokenizer.path.read_bytes()
    pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    source = json.loads((out / "source_vocabulary.json").read_text())
    target = json.loads((out / "target_vocabulary.json").read_text())
    assert source == pieces + [f"<unused_{i}>" for i in range(40, VOCAB)]
    assert target == pieces + [f"<unused_{i}>" for i in range(40, 56)]
    ct2_config = json.loads((out / "config.json").read_text())
    assert {k: ct2_config[k] for k in ("unk_token", "bos_token", "decoder_start_token",
                                       "eos_token", "add_source_eos", "add_source_bos")} == {
        "unk_token": pieces[1], "bos_token": pieces[config.bos_id],
        "decoder_start_token": pieces[config.bos_id], "eos_token": pieces[config.eos_id],
        "add_source_eos": True, "add_source_bos": False}


REFUSED = {
    "decoder-only": (dict(architecture="decoder_only"), "architecture='decoder_only'"),
    "encoder-only": (dict(architecture="encoder_only"), "architecture='encoder_only'"),
    "post-ln-final-norm": (dict(final_norm=True), "final_norm=True with pre_norm=False"),
}


@pytest.mark.parametrize("variant", REFUSED)
def test_models_a_translator_cannot_compute_are_refused(tmp_path, tokenizer, capsys, variant):
    change, message = REFUSED[variant]
    torch_reference.build_model(BASE.replace(**change)).save_pretrained(
        tmp_path / "ours", tokenizer=tokenizer.path)
    assert port_command.main(["--to", "ctranslate2", str(tmp_path / "ours"),
                              str(tmp_path / "ct2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot export to CTranslate2: ") and message in err, err
    assert not (tmp_path / "ct2").exists()


def test_a_checkpoint_without_our_tokenizer_is_refused(tmp_path, capsys):
    torch_reference.Transformer(BASE).save_pretrained(tmp_path / "ours")
    assert port_command.main(["--to", "ctranslate2", str(tmp_path / "ours"),
                              str(tmp_path / "ct2")]) == 2
    assert "has no tokenizer.model: CTranslate2 needs every id's token" in capsys.readouterr().err
    assert not (tmp_path / "ct2").exists()


# ------------------------------------------------------------ a model trained by train.py

MAX_LEN = 24  # generated tokens, </s> included: our max_len, CTranslate2's max_decoding_length


def until_eos(row, eos: int) -> list[int]:
    row = [int(i) for i in row]
    return row[: row.index(eos)] if eos in row else row


@pytest.mark.slow
def test_a_trained_model_translates_alike_in_ctranslate2(trained_translator, tmp_path):
    """Greedy and beam-4 tokens of 100 sentences: ctranslate2.Translator (float32, CPU)
    against jax_transformer.decoding. Beam scores: CTranslate2 stops a sentence when its
    best candidate ends and ranks finished beams by logprob / len ** length_penalty (len
    without </s>), so length_penalty 0 and our "hf" style (only the K best candidates may
    finish, as in CTranslate2) with alpha 0 rank alike: by summed log-probabilities.
    Teacher-forced on the greedy translations, every log-probability agrees too."""
    from jax_transformer import decoding
    from jax_transformer.model import Transformer as FlaxTransformer
    export(trained_translator, tmp_path / "ct2")
    model = FlaxTransformer.from_pretrained(trained_translator)
    tokenizer = Tokenizer(tmp_path / "ct2" / "tokenizer.model")
    texts = number_sentences(100)
    sources = [tokenizer.encode_source(text) for text in texts]
    src = np.full((len(sources), max(map(len, sources))), model.config.pad_id, np.int32)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = ids
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu",
                                        compute_type="float32")
    pieces = [tokenizer.sp.encode(text, out_type=str) for text in texts]

    def ctranslate2_tokens(beam: int) -> list[list[str]]:
        results = translator.translate_batch(pieces, beam_size=beam, length_penalty=0.0,
                                             max_decoding_length=MAX_LEN, min_decoding_length=0)
        return [result.hypotheses[0] for result in results]

    greedy, _ = decoding.greedy_search(model, src, max_len=MAX_LEN)
    beam, _ = decoding.beam_search(model, src, max_len=MAX_LEN, beam_size=4, alpha=0.0,
                                   length_penalty_style="hf")
    for size, tokens in ((1, greedy), (4, np.asarray(beam)[:, 0])):
        ours = [until_eos(row, model.config.eos_id) for row in np.asarray(tokens)]
        theirs = [[tokenizer.sp.piece_to_id(p) for p in hypothesis]
                  for hypothesis in ctranslate2_tokens(size)]
        assert theirs == ours, size
        assert len({tuple(t) for t in ours}) > 1  # the source matters

    reference = torch_reference.Transformer.from_pretrained(trained_translator).eval()
    for ids, result in zip(sources, translator.score_batch(pieces, ctranslate2_tokens(1))):
        target = [tokenizer.sp.piece_to_id(p) for p in result.tokens]  # ends in </s>
        np.testing.assert_allclose(result.log_probs, our_log_probs(reference, ids, target),
                                   atol=1e-4, rtol=0)
