"""FSMT and M2M100 checkpoints, converted, compute what transformers computes.

Small transformers models with random weights (every parameter perturbed, as in
test_port.py; nothing downloaded) are saved, converted with `jaxformer-port`'s `main`, loaded by the Flax model and torch_reference,
and compared with transformers' own forward (float32 max |diff| <= 1e-4,
float64 <= 1e-10) on right-padded batches, and with transformers' greedy
`generate` (num_beams=1, do_sample=False) against both of our greedy decoders.

Logits are compared at real (non-pad) target positions only: fairseq gives a pad
token the zero pad row of its position table, ours gives it its index's row.
Pads are masked as keys and causality hides them from every earlier query, so
every real position sees the same inputs on both sides.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch

from jax_transformer import decoding as jax_decoding
from jax_transformer import port
from jax_transformer.commands import parity as parity_command
from jax_transformer.commands import port as port_command
from transformer_core import positions
from parity_tests.helpers import (FAIRSEQ_EOS, FAIRSEQ_PAD, convert_fairseq, fairseq_batch,
                                  fairseq_config, fast_tier, load_ours, make_fairseq, our_logits,
                                  to_numpy, to_torch)
from torch_reference import decoding as torch_decoding
from transformer_core.config import TransformerConfig
from transformer_core.positions import sinusoidal_positions

transformers = pytest.importorskip("transformers")

PAD, EOS = FAIRSEQ_PAD, FAIRSEQ_EOS
FAMILIES = {
    "fsmt": dict(source="hf-fsmt", vocab=(100, 110), variants={
        "wmt19-like": dict(),  # separate vocabularies, untied projection, relu, scaled
        "tied-gelu-unscaled": dict(tgt_vocab_size=100, tie_word_embeddings=True,
                                   activation_function="gelu", scale_embedding=False)}),
    "m2m100": dict(source="hf-m2m100", vocab=(100, 100), variants={
        "m2m100-like": dict(),  # shared and tied, relu, scaled
        "untied-silu": dict(tie_word_embeddings=False, activation_function="swish")}),
}


def hf_logits_fn(model, family: str):
    def logits(src, tgt):
        src_t = to_torch(src)
        # FSMT's forward leaves out the causal mask unless use_cache=False.
        extra = dict(use_cache=False) if family == "fsmt" else {}
        with torch.no_grad():
            out = model(input_ids=src_t, attention_mask=(src_t != PAD),
                        decoder_input_ids=to_torch(tgt), **extra).logits
        return to_numpy(out)
    return logits


def hf_greedy(model, src, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' greedy search as our decoders return it: tokens (B, max_len) without
    the start token, pad after eos, and scores (B,), summed log-probabilities up to eos
    (tokens alone miss a change in a model that, as random tied ones do, repeats one
    token). No forced first token (M2M100's forced_bos_token_id, a target language
    code) and no forced eos at max_len (FSMT's forced_eos_token_id): ours have neither."""
    src_t = to_torch(src)
    with torch.no_grad():
        out = model.generate(input_ids=src_t, attention_mask=(src_t != PAD), num_beams=1,
                             do_sample=False, max_new_tokens=max_len, max_length=None,
                             forced_eos_token_id=None, forced_bos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
    sequences = to_numpy(out.sequences)
    assert (sequences[:, 0] == EOS).all()  # decoder_start_token_id
    tokens = np.full((src.shape[0], max_len), PAD)
    tokens[:, : sequences.shape[1] - 1] = sequences[:, 1:]
    scores = np.zeros(src.shape[0])
    for t, logits in enumerate(out.logits):
        log_probs = torch.log_softmax(logits.double(), -1).cpu().numpy()
        for b in range(src.shape[0]):
            if EOS not in tokens[b, :t]:
                scores[b] += log_probs[b, tokens[b, t]]
    for row in tokens:  # a pad before eos would get fairseq's pad row as its position
        ended = np.flatnonzero(row == EOS)
        assert PAD not in row[: ended[0] if ended.size else max_len], row
    return tokens, scores


def assert_logits_match(model, family, out_dir, dtype: str, tol: float):
    config = TransformerConfig.from_json(out_dir / "config.json")
    src, tgt = fairseq_batch(config.src_vocab_size, config.tgt_vocab_size)
    expected = hf_logits_fn(model, family)(src, tgt)
    flax_model, torch_model = load_ours(out_dir, dtype)
    real = tgt != PAD  # (B, T): compare real target positions only (see the module doc)
    for side, got in zip(("Flax", "torch_reference"), our_logits(flax_model, torch_model,
                                                                 src, tgt)):
        assert got.dtype == np.dtype(dtype)
        diff = float(np.abs(got[real] - expected[real]).max())
        assert diff <= tol, f"{side}: max |diff| {diff:.3g} > {tol:g}"
    return flax_model, torch_model, src


CASES = [f"{family}/{variant}" for family, spec in FAMILIES.items() for variant in spec["variants"]]


@pytest.mark.parametrize("case", fast_tier(CASES, fast={"fsmt/wmt19-like", "m2m100/m2m100-like"}))
def test_float32_logits_and_greedy(tmp_path, case):
    family, variant = case.split("/")
    model, src_dir = make_fairseq(tmp_path, family, **FAMILIES[family]["variants"][variant])
    config = convert_fairseq(family, src_dir, tmp_path / "ours")
    flax_model, torch_model, src = assert_logits_match(model, family, tmp_path / "ours",
                                                       "float32", 1e-4)
    want, want_scores = hf_greedy(model, src, max_len=10)
    for tokens, scores in (jax_decoding.greedy_search(flax_model, src, max_len=10),
                           torch_decoding.greedy_search(torch_model, to_torch(src), max_len=10)):
        np.testing.assert_array_equal(to_numpy(tokens), want)
        assert np.abs(to_numpy(scores) - want_scores).max() <= 1e-4
    assert (config.position_layout, config.position_offset, config.pad_id, config.bos_id,
            config.eos_id) == ("fairseq", PAD + 1, PAD, EOS, EOS)
    assert (config.pre_norm, config.final_norm) == ((family == "m2m100"),) * 2


def exact_tables_(model, family: str) -> None:
    """transformers computes the sinusoids in float32 (see fairseq.POSITION_TOLERANCE_PER_ROW);
    give the float64 source the exact table, pad row zero, so that 1e-10 is fair."""
    for stack in (model.model.encoder, model.model.decoder):
        name = "weight" if family == "fsmt" else "weights"
        table = getattr(stack.embed_positions, name)
        exact = sinusoidal_positions(table.shape[0], table.shape[1], "fairseq").copy()
        exact[PAD] = 0.0
        table.data = to_torch(exact)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_float64_logits(tmp_path, monkeypatch, family):
    # FSMT's causal mask goes through float32, which cannot hold float64's min (a
    # RuntimeError in transformers 5.23): build it in the mask's own dtype.
    monkeypatch.setattr(transformers.models.fsmt.modeling_fsmt, "fill_with_neg_inf",
                        lambda t: t.fill_(torch.finfo(t.dtype).min))
    model, src_dir = make_fairseq(tmp_path, family)
    convert_fairseq(family, src_dir, tmp_path / "ours")
    model = model.double()
    exact_tables_(model, family)
    with jax.enable_x64(True):
        assert_logits_match(model, family, tmp_path / "ours", "float64", 1e-10)


@pytest.mark.slow  # 16 s; the fast tier's m2m100_like model parity covers the same ground
@pytest.mark.parametrize("family", list(FAMILIES))
def test_parity_report_passes_on_converted_model(tmp_path, family, capsys):
    _, src_dir = make_fairseq(tmp_path, family)
    convert_fairseq(family, src_dir, tmp_path / "ours")
    assert parity_command.main([str(tmp_path / "ours")]) == 0
    out = capsys.readouterr().out
    assert "float32: PASS" in out and "float64: PASS" in out


def test_stored_position_table_is_checked(tmp_path, capsys):
    """FSMT stores its sinusoid tables; a table that is not fairseq's is refused."""
    _, src_dir = make_fairseq(tmp_path, "fsmt")
    weights = src_dir / "model.safetensors"
    tensors = safetensors.numpy.load_file(weights)
    key = "model.encoder.embed_positions.weight"
    rows, d = tensors[key].shape
    tensors[key] = sinusoidal_positions(rows, d, "half_split").astype(np.float32)
    safetensors.numpy.save_file(tensors, weights)
    assert port_command.main(["--from", "hf-fsmt", str(src_dir), str(tmp_path / "out")]) == 2
    assert "encoder.embed_positions.weight is not fairseq's" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family, change, message", [
    ("fsmt", dict(decoder_attention_heads=2), "decoder_attention_heads"),
    ("fsmt", dict(tie_word_embeddings=True), "tie_word_embeddings"),  # vocabularies differ
    ("fsmt", dict(model_type="bart"), "model_type"),
    ("fsmt", dict(decoder_start_token_id=PAD), "decoder_start_token_id"),
    ("fsmt", dict(pad_token_id="1"), "pad_token_id"),
    ("m2m100", dict(activation_function="gelu_new"), "activation_function"),
    ("m2m100", dict(encoder_ffn_dim=48), "encoder_ffn_dim"),
    ("m2m100", dict(architectures=["NllbMoeForConditionalGeneration"]), "architectures"),
    ("m2m100", dict(d_model=30), "d_model"),  # not divisible by the 4 heads
])
def test_unsupported_config_is_an_error(tmp_path, capsys, family, change, message):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    (src_dir / "config.json").write_text(json.dumps({**fairseq_config(family).to_dict(), **change}))
    source = FAMILIES[family]["source"]
    assert port_command.main(["--from", source, str(src_dir), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sizes_a_config_leaves_out_are_transformers_defaults(family):
    """A hand-written config.json may leave sizes out; transformers then builds its
    defaults (ffn dims 4096, ...), so ours must read the same model. Before: the
    decoder's left out and the encoder's given at 4096 was refused, "4096 != None"
    (the check's default for a missing ffn dim was the heads' 16)."""
    sizes = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
             "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
             "max_position_embeddings")
    written = {k: v for k, v in fairseq_config(family).to_dict().items() if k not in sizes}
    defaults = type(fairseq_config(family))(**written)
    written |= {"encoder_ffn_dim": defaults.encoder_ffn_dim,  # the encoder's given, at
                "encoder_attention_heads": defaults.encoder_attention_heads}  # their default
    theirs = type(fairseq_config(family))(**written)  # what transformers builds from that file
    ours = port.m2m100_config(written) if family == "m2m100" else port.fsmt_config(written)
    assert (ours.d_model, ours.num_encoder_layers, ours.num_decoder_layers, ours.num_heads,
            ours.d_ff, ours.max_len) == (
        theirs.d_model, theirs.encoder_layers, theirs.decoder_layers,
        theirs.encoder_attention_heads, theirs.encoder_ffn_dim, theirs.max_position_embeddings)


def test_untied_lm_head_under_tied_config_is_an_error(tmp_path):
    """transformers 5 leaves a stored lm_head that differs from `shared` untied: a
    tied config would then describe another model."""
    model, src_dir = make_fairseq(tmp_path, "m2m100")
    state = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    src_dir = tmp_path / "bin"
    src_dir.mkdir()
    model.config.to_json_file(src_dir / "config.json")
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, src_dir / "pytorch_model.bin")
    with pytest.raises(port.PortError, match="lm_head.weight differs"):
        port.convert_hf_m2m100(src_dir, tmp_path / "out")


def test_fairseq_layout_equals_transformers_table():
    fsmt = pytest.importorskip("transformers.models.fsmt.modeling_fsmt")
    for d_model in (32, 33):
        theirs = fsmt.SinusoidalPositionalEmbedding.get_embedding(50, d_model, 1).numpy()
        ours = positions.sinusoidal_positions(50, d_model, "fairseq").copy()
        ours[1] = 0  # fairseq zeroes the pad row; we never read rows below the offset
        np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-5)  # theirs is float32 maths
