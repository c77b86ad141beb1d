"""Models built on torch.nn.TransformerEncoder, converted with `jaxformer-port --from torch-nn-encoder`, compute what the original module
computes in both of our frameworks: logits (float32 <= 1e-4, float64 <= 1e-10)
and, for the causal language models, the same greedy continuation.

The source is the PyTorch language-modelling tutorial's model (embedding,
PositionalEncoding buffer, nn.TransformerEncoder, linear head), with random
weights, in several shapes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
from flax import nnx

import torch_reference.model
from jax_transformer import model as flax_model_module
from jax_transformer import port
from jax_transformer.commands import port as port_command
from parity_tests.helpers import TORCH_DEVICE, fast_tier, perturb_, to_numpy, to_torch
from transformer_core.config import TransformerConfig
from transformer_core.positions import sinusoidal_positions

VOCAB, D, MAX_LEN = 100, 32, 64


class PositionalEncoding(nn.Module):
    """The tutorial's: a `pe` buffer, (max_len, 1, D) for (L, B, D) inputs or
    (1, max_len, D) for batch_first. Exact (float64) here, so float64 parity holds."""

    def __init__(self, d, max_len, batch_first, layout="interleaved"):
        super().__init__()
        self.batch_first = batch_first
        pe = torch.from_numpy(sinusoidal_positions(max_len, d, layout).copy())
        self.register_buffer("pe", pe[None] if batch_first else pe[:, None])

    def forward(self, x):
        pe = self.pe[:, : x.size(1)] if self.batch_first else self.pe[: x.size(0)]
        return x + pe.to(x.dtype)


class EncoderLM(nn.Module):
    """embedding (* sqrt(D)) + positions -> nn.TransformerEncoder (causal: a square
    subsequent mask) -> linear. Takes and returns batch-major tensors; a
    batch_first=False model transposes around the encoder, as the tutorial's
    callers do."""

    def __init__(self, causal=True, batch_first=True, norm_first=False, activation="relu",
                 positions="sinusoidal", final_norm=False, head="untied", bias=True,
                 scale=True, eps=1e-5, dropout=0.2, layers=2):
        super().__init__()
        self.causal, self.batch_first, self.positions, self.scale = (causal, batch_first,
                                                                     positions, scale)
        self.embedding = nn.Embedding(VOCAB, D)
        if positions == "sinusoidal":
            self.pos_encoder = PositionalEncoding(D, MAX_LEN, batch_first)
        elif positions == "learned":
            self.pos_embedding = nn.Embedding(MAX_LEN, D)
        layer = nn.TransformerEncoderLayer(D, 4, 64, dropout, activation, eps, batch_first,
                                           norm_first, bias=bias)
        self.transformer_encoder = nn.TransformerEncoder(
            layer, layers, norm=nn.LayerNorm(D, eps) if final_norm else None,
            enable_nested_tensor=False)
        if head != "none":
            self.linear = nn.Linear(D, VOCAB, bias=bias)
        if head == "tied":
            self.linear.weight = self.embedding.weight

    def forward(self, ids):  # (B, L) -> (B, L, V), or (B, L, D) without a head
        x = ids if self.batch_first else ids.T  # (L, B) for batch_first=False
        h = self.embedding(x) * (math.sqrt(D) if self.scale else 1.0)
        if self.positions == "sinusoidal":
            h = self.pos_encoder(h)
        elif self.positions == "learned":
            pe = self.pos_embedding(torch.arange(ids.shape[1], device=ids.device))  # (L, D)
            h = h + (pe[None] if self.batch_first else pe[:, None])
        mask = (nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
                if self.causal else None)
        h = self.transformer_encoder(h, mask=mask)
        out = self.linear(h) if hasattr(self, "linear") else h
        return out if self.batch_first else out.transpose(0, 1)


VARIANTS = {
    # The tutorial's language model: (L, B) inputs, post-LN, sinusoids, untied head.
    "causal tutorial": dict(batch_first=False),
    "causal pre-LN final-norm gelu learned tied": dict(
        norm_first=True, final_norm=True, activation="gelu", positions="learned", head="tied",
        eps=1e-6),
    "causal batch-first no positions no biases unscaled": dict(
        positions="none", bias=False, scale=False, layers=3),
    "bidirectional post-LN final-norm learned": dict(
        causal=False, batch_first=False, final_norm=True, positions="learned"),
    "bidirectional pre-LN batch-first sinusoidal tied": dict(
        causal=False, norm_first=True, head="tied"),
    "bidirectional without a head": dict(causal=False, head="none", activation="gelu"),
}


def make_model(tmp_path, **kwargs):
    torch.manual_seed(0)
    model = EncoderLM(**kwargs).eval()
    perturb_(model)  # biases and norms random too; position tables stay exact
    path = tmp_path / "lm.pt"
    torch.save(model.state_dict(), path)
    return model.to(TORCH_DEVICE), path


def convert(model, path, out_dir, kwargs):
    """The command line a user of `model` would write; the layers' own arguments
    (heads, norm_first, activation, eps, dropout) read from the module."""
    spec = port.encoder_spec(model.transformer_encoder)
    argv = ["--from", "torch-nn-encoder", str(path), str(out_dir),
            "--architecture", "decoder_only" if kwargs.get("causal", True) else "encoder_only",
            "--num-heads", str(spec["num_heads"]), "--activation", spec["activation"],
            "--layer-norm-eps", str(spec["layer_norm_eps"]), "--dropout", str(spec["dropout"]),
            "--norm-first" if spec["norm_first"] else "--no-norm-first"]
    positions = kwargs.get("positions", "sinusoidal")
    if positions == "learned":
        argv += ["--positions", "learned", "--position-key", "pos_embedding.weight"]
    elif positions == "none":
        argv += ["--positions", "none", "--max-len", str(MAX_LEN)]
    head = kwargs.get("head", "untied")
    argv += ["--output", "" if head == "none" else "linear"]  # tied: found equal
    if not kwargs.get("scale", True):
        argv.append("--no-scale-embeddings")
    assert port_command.main(argv) == 0
    return TransformerConfig.from_json(out_dir / "config.json")


def load_ours(directory, dtype):
    flax_model = nnx.view(flax_model_module.from_pretrained(directory,
                                                            param_dtype=jnp.dtype(dtype)),
                          deterministic=True)
    torch_model = torch_reference.model.from_pretrained(
        directory, dtype=getattr(torch, dtype), device=TORCH_DEVICE).eval()
    return flax_model, torch_model


@nnx.jit(static_argnums=2)  # one compilation per model and shape: the greedy loop is fast
def flax_forward(flax_model, ids, hidden):
    return flax_model.encode(ids)[0] if hidden else flax_model(ids)


def our_outputs(flax_model, torch_model, ids, hidden=False):
    """Logits, or (hidden) the last layer's states, of both of our models."""
    flax_out = flax_forward(flax_model, jnp.asarray(ids, jnp.int32), hidden)
    with torch.no_grad():
        torch_out = torch_model.encode(to_torch(ids))[0] if hidden else torch_model(to_torch(ids))
    return np.asarray(flax_out), to_numpy(torch_out)


def greedy(logits_fn, prompt, width=10):
    """Full-recompute greedy continuation of `prompt` in a fixed-width buffer (causal:
    position t sees only the prefix), the checked batch's shape: no new compilation."""
    ids = np.ones((prompt.shape[0], width), np.int64)
    ids[:, : prompt.shape[1]] = prompt
    for t in range(prompt.shape[1] - 1, width - 1):
        ids[:, t + 1] = np.asarray(logits_fn(ids))[:, t].argmax(-1)
    return ids


def check(model, directory, kwargs, dtype, tol, check_greedy):
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(2, 10))  # no pad (0)
    hidden = kwargs.get("head") == "none"
    flax_model, torch_model = load_ours(directory, dtype)
    with torch.no_grad():
        expected = to_numpy(model(to_torch(ids)))
    for got in our_outputs(flax_model, torch_model, ids, hidden):
        assert got.dtype == np.dtype(dtype)
        assert np.abs(got - expected).max() <= tol, np.abs(got - expected).max()
    if check_greedy:
        def source(x):
            with torch.no_grad():
                return to_numpy(model(to_torch(x)))
        want = greedy(source, ids[:, :3])
        for side in (0, 1):  # Flax, torch_reference
            got = greedy(lambda x: our_outputs(flax_model, torch_model, x)[side], ids[:, :3])
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("variant", fast_tier(VARIANTS, fast={"causal tutorial"}))
def test_torch_nn_encoder_float32(tmp_path, variant):
    kwargs = VARIANTS[variant]
    model, path = make_model(tmp_path, **kwargs)
    config = convert(model, path, tmp_path / "ours", kwargs)
    assert config.architecture == ("decoder_only" if kwargs.get("causal", True)
                                   else "encoder_only")
    assert (config.pre_norm, config.final_norm, config.tie_output, config.dropout) == (
        kwargs.get("norm_first", False), kwargs.get("final_norm", False),
        kwargs.get("head", "untied") != "untied", 0.2)
    assert (config.position_encoding, config.max_len) == (kwargs.get("positions", "sinusoidal"),
                                                          MAX_LEN)
    check(model, tmp_path / "ours", kwargs, "float32", 1e-4,
          check_greedy=kwargs.get("causal", True))


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_torch_nn_encoder_float64(tmp_path, variant):
    kwargs = VARIANTS[variant]
    model, path = make_model(tmp_path, **kwargs)
    convert(model, path, tmp_path / "ours", kwargs)
    with jax.enable_x64(True):
        check(model.double(), tmp_path / "ours", kwargs, "float64", 1e-10, check_greedy=False)


@pytest.mark.parametrize("variant", ["causal batch-first no positions no biases unscaled",
                                     "bidirectional without a head"])
def test_embedding_scale_detected_by_comparing_outputs(variant):
    """Not in a state dict: the forward multiplies, or not. Converted with the wrong
    guess, detect_scale_embeddings runs both and keeps the one matching the module."""
    kwargs = VARIANTS[variant]
    model = EncoderLM(**kwargs).eval()
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    spec = dict(port.encoder_spec(model.transformer_encoder),
                architecture="decoder_only" if kwargs.get("causal", True) else "encoder_only",
                positions=kwargs.get("positions", "sinusoidal"),
                output="" if kwargs.get("head") == "none" else "linear")
    config, tensors = port.torch_nn_encoder_tensors(sd, spec)
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(2, 10))
    with torch.no_grad():
        detected = port.detect_scale_embeddings(lambda x: model(torch.as_tensor(x)), config,
                                                tensors, ids)
    assert detected.scale_embeddings == kwargs.get("scale", True)
    assert detected.replace(scale_embeddings=True) == config.replace(scale_embeddings=True)


def tutorial_table(max_len, d):
    """The tutorial's PositionalEncoding buffer, computed in float32 as it does."""
    position = torch.arange(max_len, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
    pe = torch.zeros(max_len, 1, d)
    pe[:, 0, 0::2], pe[:, 0, 1::2] = torch.sin(position * div_term), torch.cos(position * div_term)
    return pe.numpy()


def test_tutorial_float32_table_is_accepted_and_other_tables_named():
    from jax_transformer.port.torch_nn_encoder import check_sinusoids, position_table
    table = position_table(tutorial_table(5000, 512), "pos_encoder.pe", 512)
    assert check_sinusoids(table, "pos_encoder.pe", None) == "interleaved"
    half = sinusoidal_positions(64, 32, "half_split")[None]  # (1, max_len, D)
    assert check_sinusoids(position_table(half, "pe", 32), "pe", None) == "half_split"
    with pytest.raises(port.PortError, match=r"pe is not one of our sinusoid tables "
                       r"\(half_split layout: position 0, column 1 holds 1, ours 0\); .*"
                       r"--positions learned"):
        check_sinusoids(tutorial_table(64, 32)[:, 0], "pe", "half_split")  # interleaved
    nearly = np.abs(tutorial_table(64, 32)[:, 0]) ** 1.0001  # close to ours, but not ours
    with pytest.raises(port.PortError, match=r"\(interleaved layout: position 1, column 4 holds "
                       r"0.310947, ours 0.310984; half_split layout: position 0"):
        check_sinusoids(nearly, "pe", None)


ERRORS = {
    "no --architecture": ([], ["--architecture"], "--architecture is required"),
    "a flag of torch-nn-transformer": (["--src-embed", "embedding"], [],
                                       "--src-embed belong(s) to --from torch-nn-transformer"),
    "wrong embedding key": (["--embed", "tok_emb"], [], "no tok_emb.weight"),
    "layout for learned positions": (["--positions", "learned", "--position-layout",
                                      "interleaved"], [], "--position-layout applies to"),
    "a causal model without a head": (["--output", ""], [], "needs its output projection"),
    "pad id outside the vocabulary": (["--pad-id", "100"], [],
                                      "--pad-id 100 is not a token of the 100-row"),
    "positions none, but a table stored": (["--positions", "none"], [], "pos_encoder.pe"),
    "mismatched sinusoid table": (["--position-layout", "half_split"], [],
                                  "pos_encoder.pe is not one of our sinusoid tables"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_torch_nn_encoder_errors(tmp_path, capsys, case):
    flags, dropped, message = ERRORS[case]
    torch.save(EncoderLM(batch_first=False).state_dict(), tmp_path / "lm.pt")
    argv = ["--from", "torch-nn-encoder", str(tmp_path / "lm.pt"), str(tmp_path / "out"),
            "--num-heads", "4", *flags]
    if "--architecture" not in dropped:
        argv += ["--architecture", "decoder_only"]
    assert port_command.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_torch_nn_encoder_lists_every_missing_tensor_and_checks_shapes(tmp_path):
    sd = {k: v.numpy() for k, v in EncoderLM().state_dict().items()}
    del sd["transformer_encoder.layers.1.linear2.weight"], sd["embedding.weight"]
    spec = dict(architecture="decoder_only", num_heads=4)
    with pytest.raises(port.PortError, match=r"no embedding.weight, "
                       r"transformer_encoder.layers.1.linear2.weight"):
        port.torch_nn_encoder_tensors(sd, spec)
    sd = {k: v.numpy() for k, v in EncoderLM().state_dict().items()}
    sd["linear.weight"], sd["linear.bias"] = sd["linear.weight"][:90], sd["linear.bias"][:90]
    with pytest.raises(port.PortError, match=r"linear.weight has shape \(90, 32\), but the "
                       r"embedding table embedding.weight has \(100, 32\)"):
        port.torch_nn_encoder_tensors(sd, spec)
