"""Converted checkpoints compute what the original code computes, in both frameworks.

Sources are built here with random weights (nothing downloaded): a small
transformers MarianMTModel and a model wrapping torch.nn.Transformer. Each is
converted with `jaxformer-port`'s `main`, loaded by the Flax
model and by torch_reference, and compared with the original: logits (float32
max |diff| <= 1e-4, float64 <= 1e-10) and greedy tokens.
"""

from __future__ import annotations

import json
import math
import pickle

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn

import torch_reference
from jax_transformer import port
from jax_transformer.commands import port as port_command
from transformer_core.marian_tokenizer import MarianTokenizer
from parity_tests.helpers import (MARIAN_EOS, MARIAN_PAD, TORCH_DEVICE, fast_tier, load_ours,
                                  make_marian, marian_config, our_logits, perturb_,
                                  source_batch, target_batch, to_numpy, to_torch)
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.positions import sinusoidal_positions

transformers = pytest.importorskip("transformers")

PAD, EOS = MARIAN_PAD, MARIAN_EOS


# ------------------------------------------------------------------ helpers

def greedy(logits_fn, src, bos: int, pad: int, width: int = 6):
    """Full-recompute greedy decoding. The prefix sits in a fixed-width buffer
    (pad after it): the decoders are causal, so position t sees only the prefix,
    and one shape means one compilation of each JAX op."""
    tgt = np.full((src.shape[0], width), pad, np.int64)
    tgt[:, 0] = bos
    for t in range(width - 1):
        tgt[:, t + 1] = np.asarray(logits_fn(src, tgt))[:, t].argmax(-1)
    return tgt


def assert_matches(source_fn, directory, src, tgt, bos, pad, dtype, tol, check_greedy=True):
    """Both of our frameworks give the source model's logits and greedy tokens."""
    flax_model, torch_model = load_ours(directory, dtype)
    expected = source_fn(src, tgt)
    flax_out, torch_out = our_logits(flax_model, torch_model, src, tgt)
    assert flax_out.dtype == torch_out.dtype == np.dtype(dtype)
    assert np.abs(flax_out - expected).max() <= tol, np.abs(flax_out - expected).max()
    assert np.abs(torch_out - expected).max() <= tol, np.abs(torch_out - expected).max()
    if not check_greedy:  # the float32 tests check tokens; float64 adds nothing but time
        return
    want = greedy(source_fn, src, bos, pad, tgt.shape[1])
    for side in (0, 1):  # Flax, torch_reference
        got = greedy(lambda s, t: our_logits(flax_model, torch_model, s, t)[side], src, bos, pad,
                     tgt.shape[1])
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ Hugging Face Marian

def marian_logits_fn(model):
    def logits(src, tgt):
        src_t = to_torch(src)
        with torch.no_grad():
            out = model(input_ids=src_t, attention_mask=(src_t != model.config.pad_token_id),
                        decoder_input_ids=to_torch(tgt)).logits
        return to_numpy(out)
    return logits


MARIAN_VARIANTS = {
    "opus-like": dict(),  # shared, tied, silu, scaled embeddings
    "separate-vocab-untied-relu": dict(share_encoder_decoder_embeddings=False,
                                       decoder_vocab_size=120, tie_word_embeddings=False,
                                       activation_function="relu", scale_embedding=False),
}


@pytest.mark.parametrize("variant", fast_tier(MARIAN_VARIANTS, fast={"separate-vocab-untied-relu"}))
def test_marian_float32_logits_and_greedy(tmp_path, variant):
    model, src_dir = make_marian(tmp_path, **MARIAN_VARIANTS[variant])
    out_dir = tmp_path / "ours"
    assert port_command.main(["--from", "hf-marian", str(src_dir), str(out_dir)]) == 0
    config = TransformerConfig.from_json(out_dir / "config.json")
    assert (config.activation, config.position_layout, config.bos_id, config.eos_id,
            config.pad_id) == (model.config.activation_function.replace("swish", "silu"),
                               "half_split", PAD, EOS, PAD)
    vocab_tgt = config.tgt_vocab_size
    src, tgt = source_batch(100, PAD, EOS), target_batch(vocab_tgt, PAD)
    assert_matches(marian_logits_fn(model), out_dir, src, tgt, PAD, PAD, "float32", 1e-4)


@pytest.mark.slow
def test_marian_float64_from_pytorch_model_bin(tmp_path):
    model, src_dir = make_marian(tmp_path, weights="bin")
    out_dir = tmp_path / "ours"
    assert port_command.main(["--from", "hf-marian", str(src_dir), str(out_dir)]) == 0
    model = model.double()
    # HF builds its sinusoid table in float64 but stores it through float32; give the
    # float64 source the exact table (it equals ours: see test_marian_positions_equal_ours).
    for stack in (model.model.encoder, model.model.decoder):
        table = stack.embed_positions.weight
        table.data = to_torch(sinusoidal_positions(table.shape[0], table.shape[1],
                                                   "half_split"))
    src, tgt = source_batch(100, PAD, EOS), target_batch(100, PAD)
    with jax.enable_x64(True):
        assert_matches(marian_logits_fn(model), out_dir, src, tgt, PAD, PAD, "float64", 1e-10,
                       check_greedy=False)


def test_marian_positions_equal_ours():
    model = transformers.MarianMTModel(marian_config(d_model=32, max_position_embeddings=64))
    for stack in (model.model.encoder, model.model.decoder):
        hf = stack.embed_positions.weight.detach().numpy()
        ours = sinusoidal_positions(64, 32, "half_split")
        np.testing.assert_allclose(hf, ours, rtol=0, atol=1e-6)
        assert not np.allclose(hf, sinusoidal_positions(64, 32, "interleaved"), atol=1e-2)


def test_marian_tokenizer_files_are_copied_and_used(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    import io
    text = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
            "hello world how are you today"] * 20
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buf, vocab_size=40,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    model, src_dir = make_marian(tmp_path)
    for name in ("source.spm", "target.spm"):
        (src_dir / name).write_bytes(buf.getvalue())
    proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())
              if proc.id_to_piece(i) not in ("<unk>", "<s>", "</s>")]
    # Marian ids are not SentencePiece ids: </s>=0, <unk>=1, pieces..., <pad> last.
    vocab = {"</s>": EOS, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}, "<pad>": PAD}
    (src_dir / "vocab.json").write_text(json.dumps(vocab))
    out_dir = tmp_path / "ours"
    assert port_command.main(["--from", "hf-marian", str(src_dir), str(out_dir)]) == 0
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (out_dir / name).read_bytes() == (src_dir / name).read_bytes()
    assert not (out_dir / "tokenizer.model").exists()  # its ids would be the wrong ones
    tok = MarianTokenizer(out_dir)
    ids = tok.encode("the lazy fox")
    assert ids[-1] == EOS and all(0 <= i < 100 for i in ids)
    assert ids[:-1] == [vocab.get(p, 1) for p in proc.encode("the lazy fox", out_type=str)]
    assert tok.decode(ids) == "the lazy fox"
    from jax_transformer.applications import parity  # the parity report tokenizes with these files
    config = TransformerConfig.from_json(out_dir / "config.json")
    src, tgt = parity.sentence_batch(out_dir, config, ["the lazy fox"])
    assert src[0].tolist() == ids and tgt[0].tolist() == [PAD] + ids[:-1]


@pytest.mark.parametrize("change, message", [
    (dict(activation_function="gelu_new"), "activation_function"),
    (dict(normalize_before=True), "normalize_before"),
    (dict(static_position_embeddings=False), "static_position_embeddings"),
    (dict(decoder_attention_heads=2), "attention_heads"),
    (dict(layer_norm_eps=1e-6), "layer_norm_eps"),
    (dict(model_type="bart"), "model_type"),
])
def test_marian_unsupported_config_is_an_error(tmp_path, capsys, change, message):
    src_dir = tmp_path / "marian"
    src_dir.mkdir()
    values = {**marian_config().to_dict(), **change}
    (src_dir / "config.json").write_text(json.dumps(values))
    assert port_command.main(["--from", "hf-marian", str(src_dir), str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_marian_unknown_tensor_is_an_error(tmp_path):
    model, src_dir = make_marian(tmp_path, weights="bin")
    state = torch.load(src_dir / "pytorch_model.bin", weights_only=True)
    state["model.encoder.layernorm_embedding.weight"] = torch.ones(32)
    torch.save(state, src_dir / "pytorch_model.bin")
    with pytest.raises(port.PortError, match="layernorm_embedding"):
        port.convert_hf_marian(src_dir, tmp_path / "out")


class Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickles_that_need_code_are_refused(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"x": Evil()}, f)
    assert port_command.main(["--from", "torch-reference", str(path), str(tmp_path / "out")]) == 2
    with pytest.raises(port.PortError, match="weights_only"):
        port.read_weights(path)
    assert "this must never run" not in capsys.readouterr().out


# ------------------------------------------------------------------ torch.nn.Transformer

class NNTransformerModel(nn.Module):
    """A translation model built on torch.nn.Transformer, as in the PyTorch tutorial."""

    def __init__(self, vocab=100, d=32, heads=4, layers=2, ff=64, norm_first=False,
                 activation="relu", share=False, tie=False, bias=True, pad=0, max_len=64):
        super().__init__()
        self.d, self.pad = d, pad
        self.src_tok_emb = nn.Embedding(vocab, d)
        self.tgt_tok_emb = self.src_tok_emb if share else nn.Embedding(vocab + 7, d)
        self.transformer = nn.Transformer(d, heads, layers, layers, ff, dropout=0.1,
                                          activation=activation, batch_first=True,
                                          norm_first=norm_first, bias=bias)
        self.generator = nn.Linear(d, self.tgt_tok_emb.num_embeddings, bias=bias)
        if tie:
            self.generator.weight = self.tgt_tok_emb.weight
        position = torch.arange(max_len, dtype=torch.float64)[:, None]
        div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
        pe = torch.zeros(max_len, d, dtype=torch.float64)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
        self.register_buffer("pos_embedding", pe)

    def embed(self, table, ids):
        x = table(ids) * math.sqrt(self.d)
        return x + self.pos_embedding[: ids.shape[1]].to(x.dtype)

    def forward(self, src, tgt):
        src_pad = src == self.pad  # torch masks: True = NOT allowed
        causal = torch.triu(torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool,
                                       device=tgt.device), 1)
        out = self.transformer(self.embed(self.src_tok_emb, src), self.embed(self.tgt_tok_emb, tgt),
                               tgt_mask=causal, src_key_padding_mask=src_pad,
                               memory_key_padding_mask=src_pad)
        return self.generator(out)


NN_VARIANTS = {
    "post-LN relu separate untied": dict(),
    "pre-LN gelu shared tied": dict(norm_first=True, activation="gelu", share=True, tie=True),
    "post-LN no biases shared": dict(share=True, bias=False),
}


def make_nn(tmp_path, **kwargs):
    torch.manual_seed(0)
    model = NNTransformerModel(**kwargs).eval()
    perturb_(model)
    path = tmp_path / "nn.pt"
    torch.save(model.state_dict(), path)
    return model.to(TORCH_DEVICE), path


def nn_logits_fn(model):
    def logits(src, tgt):
        with torch.no_grad():
            return to_numpy(model(to_torch(src), to_torch(tgt)))
    return logits


def convert_nn(path, out_dir, kwargs):
    argv = ["--from", "torch-nn-transformer", str(path), str(out_dir), "--num-heads", "4",
            "--src-embed", "src_tok_emb", "--tgt-embed", "tgt_tok_emb",
            "--output", "generator", "--ignore", "pos_embedding", "--pad-id", "0",
            "--bos-id", "1", "--eos-id", "2", "--max-len", "64"]
    if kwargs.get("norm_first"):
        argv.append("--norm-first")
    if kwargs.get("activation"):
        argv += ["--activation", kwargs["activation"]]
    assert port_command.main(argv) == 0


@pytest.mark.parametrize("variant", fast_tier(NN_VARIANTS, fast={"pre-LN gelu shared tied"}))
def test_torch_nn_transformer_float32(tmp_path, variant):
    kwargs = NN_VARIANTS[variant]
    model, path = make_nn(tmp_path, **kwargs)
    convert_nn(path, tmp_path / "ours", kwargs)
    config = TransformerConfig.from_json(tmp_path / "ours" / "config.json")
    assert config.final_norm and config.pre_norm == bool(kwargs.get("norm_first"))
    assert config.share_embeddings == bool(kwargs.get("share"))
    assert config.tie_output == bool(kwargs.get("tie"))
    src = source_batch(100, pad=0, eos=2)
    tgt = target_batch(config.tgt_vocab_size - 7, bos=1)
    assert_matches(nn_logits_fn(model), tmp_path / "ours", src, tgt, 1, 0, "float32", 1e-4)


@pytest.mark.slow
def test_torch_nn_transformer_float64(tmp_path):
    kwargs = NN_VARIANTS["post-LN relu separate untied"]
    model, path = make_nn(tmp_path, **kwargs)
    convert_nn(path, tmp_path / "ours", kwargs)
    model = model.double()
    src, tgt = source_batch(100, pad=0, eos=2), target_batch(100, bos=1)
    with jax.enable_x64(True):
        assert_matches(nn_logits_fn(model), tmp_path / "ours", src, tgt, 1, 0, "float64", 1e-10,
                       check_greedy=False)


def test_torch_nn_transformer_in_proj_is_split_q_k_v(tmp_path):
    model, path = make_nn(tmp_path)
    convert_nn(path, tmp_path / "ours", {})
    _, ours = checkpoint_dir.load_dir(tmp_path / "ours")
    attn = model.transformer.decoder.layers[1].multihead_attn
    d = 32
    for j, name in enumerate(("W_q", "W_k", "W_v")):
        np.testing.assert_array_equal(ours[f"decoder.layers.1.cross_attn.{name}.weight"],
                                      to_numpy(attn.in_proj_weight[j * d:(j + 1) * d]))
    np.testing.assert_array_equal(ours["decoder.layers.1.ffn_norm.weight"],
                                  to_numpy(model.transformer.decoder.layers[1].norm3.weight))


def test_torch_nn_transformer_needs_heads_and_names_leftovers(tmp_path, capsys):
    _, path = make_nn(tmp_path)
    out = str(tmp_path / "out")
    assert port_command.main(["--from", "torch-nn-transformer", str(path), out]) == 2
    assert "--num-heads" in capsys.readouterr().err
    assert port_command.main(["--from", "torch-nn-transformer", str(path), out, "--num-heads", "4",
                      "--src-embed", "src_tok_emb", "--tgt-embed", "tgt_tok_emb"]) == 2
    assert "pos_embedding" in capsys.readouterr().err  # not silently dropped


def test_torch_nn_transformer_mapping_file(tmp_path):
    kwargs = NN_VARIANTS["pre-LN gelu shared tied"]
    model, path = make_nn(tmp_path, **kwargs)
    mapping = dict(src_embed="src_tok_emb.weight", tgt_embed="tgt_tok_emb", output="generator",
                   ignore=["pos_embedding"], num_heads=4, activation="gelu", norm_first=True,
                   pad_id=0, bos_id=1, eos_id=2, max_len=64)
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    assert port_command.main(["--from", "torch-nn-transformer", str(path), str(tmp_path / "ours"),
                      "--mapping", str(tmp_path / "map.json")]) == 0
    config = TransformerConfig.from_json(tmp_path / "ours" / "config.json")
    assert config.share_embeddings and config.tie_output and config.output_bias
    src, tgt = source_batch(100, pad=0, eos=2), target_batch(100, bos=1)
    flax_model, torch_model = load_ours(tmp_path / "ours", "float32")
    expected = nn_logits_fn(model)(src, tgt)
    for got in our_logits(flax_model, torch_model, src, tgt):
        assert np.abs(got - expected).max() <= 1e-4


# ------------------------------------------------------------------ our own formats

def small_config(**kw):
    # The Marian test's sizes, so JAX's per-shape op compilations are reused.
    return TransformerConfig(**{**dict(src_vocab_size=100, tgt_vocab_size=100, d_model=32,
                                       num_heads=4, d_ff=64, num_encoder_layers=2,
                                       num_decoder_layers=2, max_len=64), **kw})


@pytest.mark.parametrize("bundle", [False, True])
def test_torch_reference_state_dict(tmp_path, bundle):
    config = small_config(output_bias=True, tie_output=False)
    torch.manual_seed(0)
    model = torch_reference.Transformer(config).eval()
    perturb_(model)
    path = tmp_path / "model.pt"
    argv = ["--from", "torch-reference", str(path), str(tmp_path / "ours")]
    if bundle:
        torch.save({"config": config.to_dict(), "state_dict": model.state_dict()}, path)
    else:
        torch.save(model.state_dict(), path)
        config.to_json(tmp_path / "config.json")
        argv += ["--config", str(tmp_path / "config.json")]
    assert port_command.main(argv) == 0
    loaded = torch_reference.Transformer.from_pretrained(tmp_path / "ours")
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key  # bit-exact
    src, tgt = source_batch(100, pad=0, eos=3), target_batch(100, bos=2)
    with torch.no_grad():
        expected = to_numpy(model.to(TORCH_DEVICE)(to_torch(src), to_torch(tgt)))
    flax_model, torch_model = load_ours(tmp_path / "ours", "float32")
    flax_out, torch_out = our_logits(flax_model, torch_model, src, tgt)
    np.testing.assert_array_equal(torch_out, expected)
    assert np.abs(flax_out - expected).max() <= 1e-4


def test_torch_reference_without_config_is_an_error(tmp_path, capsys):
    torch.save(torch_reference.Transformer(small_config()).state_dict(), tmp_path / "m.pt")
    assert port_command.main(["--from", "torch-reference", str(tmp_path / "m.pt"),
                      str(tmp_path / "out")]) == 2
    assert "--config" in capsys.readouterr().err
