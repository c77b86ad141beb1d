"""Packed batches: both frameworks agree, and packing changes nothing a pair (or a
language model's line) computes.

Several pairs share a row (jax_transformer.data.batches.packed); segment masks keep
attention inside each pair and positions restart per pair; lines of text are
packed alike, as targets without a source. Tolerances as in
test_model_parity: float32 logits <= 1e-5, attention weights <= 1e-6, float64
logits <= 1e-12.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jax_transformer.data.batches.packed import PackedBatches
from jax_transformer.train import step as jax_step
from parity_tests.helpers import (CONFIGS, SINGLE_STACK_CONFIGS, assert_close, build_pair,
                                  fast_tier, precision, to_torch)
from torch_reference import training as torch_training

F32_LOGITS, F32_WEIGHTS, F64_LOGITS = 1e-5, 1e-6, 1e-12
ROW_SHAPE = (24, 20)  # (S, T): several pairs per row


def packed_batch(config, seed: int = 0) -> dict[str, np.ndarray]:
    """One packed batch of random pairs, 2 to 4 per row, with padding at row ends."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, config.src_vocab_size, rng.integers(1, 9)).astype(np.int32)
           for _ in range(9)]
    tgt = [rng.integers(4, config.tgt_vocab_size, rng.integers(1, 7)).astype(np.int32)
           for _ in range(9)]
    data = PackedBatches(src, tgt, max_tokens=4 * max(ROW_SHAPE), row_shapes=[ROW_SHAPE],
                         shuffle=False)
    (shape, rows), = data.epoch_plan(0)
    assert all(len(row) >= 2 for row in rows)
    return data.make_batch(shape, rows)


def text_batch(config, seed: int = 0) -> dict[str, np.ndarray]:
    """One packed batch of random lines of text, up to 4 per row."""
    rng = np.random.default_rng(seed)
    lines = [rng.integers(4, config.vocab_size, rng.integers(1, 7)).astype(np.int32)
             for _ in range(9)]
    data = PackedBatches(None, lines, max_tokens=4 * 20, row_shapes=[(0, 20)], shuffle=False)
    (shape, rows), = data.epoch_plan(0)
    assert sum(len(row) >= 2 for row in rows) >= 2
    return data.make_batch(shape, rows)


def forward(model, batch, as_array):
    """Logits and attention weights of a packed batch (JAX: one compiled program)."""
    architecture = model.config.architecture
    if as_array is jnp.asarray:
        return nnx.jit(lambda m, b: m(**jax_step.model_inputs(b, architecture),
                                      return_attention=True))(
            model, {k: jnp.asarray(v) for k, v in batch.items()})
    with torch.no_grad():
        return model(**torch_training.model_inputs({k: as_array(v) for k, v in batch.items()},
                                                   architecture), return_attention=True)


def packed_and_alone(model, framework: str, batch, *alone_ids):
    """(logits, attention weights) of the packed batch, and the logits of the same
    sequences unpacked (`alone_ids`: one per row, right-padded), as numpy, float64."""
    as_array = jnp.asarray if framework == "jax" else to_torch
    packed, attention = forward(model, batch, as_array)
    if framework == "jax":
        alone = nnx.jit(lambda m, *ids: m(*ids))(model, *map(as_array, alone_ids))
    else:
        with torch.no_grad():
            alone = model(*map(as_array, alone_ids))
    numpy = (lambda x: x.cpu().numpy()) if framework == "torch" else np.asarray
    return numpy(packed), {kind: [numpy(w) for w in layers]
                           for kind, layers in attention.items()}, numpy(alone)


def unpacked(batch, pad_id: int):
    """The pairs of a packed batch one per row, right-padded: (src, tgt_in) and where
    each came from, [(row, source positions, target positions)]."""
    pairs, where = [], []
    for row in range(batch["src"].shape[0]):
        for segment in range(1, batch["src_segments"][row].max() + 1):
            s = batch["src_segments"][row] == segment
            t = batch["tgt_segments"][row] == segment
            pairs.append((batch["src"][row][s], batch["tgt_in"][row][t]))
            where.append((row, s, t))
    src = np.full((len(pairs), batch["src"].shape[1]), pad_id, np.int32)
    tgt = np.full((len(pairs), batch["tgt_in"].shape[1]), pad_id, np.int32)
    for i, (s, t) in enumerate(pairs):
        src[i, :len(s)], tgt[i, :len(t)] = s, t
    return src, tgt, where


@pytest.mark.parametrize("name", fast_tier(list(CONFIGS), fast=set()))
def test_packed_forward_float32(name, direction):
    config = CONFIGS[name]
    batch = packed_batch(config)
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes)
        logits_f, attention_f = forward(flax_model, batch, jnp.asarray)
        logits_t, attention_t = forward(torch_model, batch, to_torch)
    real = batch["tgt_segments"] > 0
    assert_close(np.asarray(logits_f)[real], logits_t.cpu().numpy()[real], F32_LOGITS,
                 "packed logits")
    for kind in ("encoder_self", "decoder_self", "cross"):
        for i, (a, b) in enumerate(zip(attention_f[kind], attention_t[kind])):
            assert_close(a, b, F32_WEIGHTS, f"packed {kind} attention weights, layer {i}")


@pytest.mark.parametrize("name", fast_tier(["post_ln", "pre_ln_final_norm", "untied_bias",
                                            "gelu", "silu_half_split", "odd_width",
                                            "three_layers", "unshared"],
                                           fast=set()))
def test_packed_forward_float64(name, direction):
    config = CONFIGS[name]
    batch = packed_batch(config)
    with precision("float64") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes)
        logits_f, _ = forward(flax_model, batch, jnp.asarray)
        logits_t, _ = forward(torch_model, batch, to_torch)
        assert logits_f.dtype == jnp.float64
    real = batch["tgt_segments"] > 0
    assert_close(np.asarray(logits_f)[real], logits_t.cpu().numpy()[real], F64_LOGITS,
                 "packed float64 logits")


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_no_attention_across_pairs(framework):
    """Every pair of a packed row gives the logits it gives alone in a batch of its
    own, and no attention weight crosses from one pair to another. Without the
    segment masks (or with positions not restarting) this fails."""
    config = CONFIGS["pre_ln_final_norm"]
    batch = packed_batch(config)
    src, tgt, where = unpacked(batch, config.pad_id)
    with precision("float64") as dtypes:
        models = dict(zip(("jax", "torch"), build_pair(config, "flax_to_torch", dtypes)))
        packed, attention, alone = packed_and_alone(models[framework], framework, batch, src,
                                                    tgt)
    for i, (row, _, t) in enumerate(where):
        assert_close(packed[row][t], alone[i][:t.sum()], F64_LOGITS,
                     f"{framework}: pair {i} (row {row}) packed vs alone")
    segments = {"encoder_self": ("src", "src"), "decoder_self": ("tgt", "tgt"),
                "cross": ("tgt", "src")}
    for kind, (query_side, key_side) in segments.items():
        q = batch[f"{query_side}_segments"][:, None, :, None]
        k = batch[f"{key_side}_segments"][:, None, None, :]
        crossing = (q != k) & (q > 0)  # (B, 1, Tq, Tk): a real query, a key of another pair
        for weights in attention[kind]:
            assert np.all(np.where(crossing, weights, 0.0) == 0.0), f"{kind} crosses pairs"


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("name", ["decoder_only_learned_half_split", "encoder_only_pre_ln_learned"])
def test_no_attention_across_lines(name, framework):
    """Every line of a packed row gives the logits it gives alone, right-padded in a
    row of its own, and no attention weight crosses lines: causal within a line for
    the decoder-only model, both ways for the encoder-only one. Learned positions
    must restart per line for this to hold."""
    config = SINGLE_STACK_CONFIGS[name]
    batch = text_batch(config)
    segments = batch["tgt_segments"]
    where = [(row, segments[row] == k) for row in range(len(segments))
             for k in range(1, segments[row].max() + 1)]
    alone = np.full((len(where), segments.shape[1]), config.pad_id, np.int32)
    for i, (row, mine) in enumerate(where):
        alone[i, :mine.sum()] = batch["tgt_in"][row][mine]
    with precision("float64") as dtypes:
        models = dict(zip(("jax", "torch"), build_pair(config, "flax_to_torch", dtypes)))
        packed, attention, alone_logits = packed_and_alone(models[framework], framework, batch,
                                                           alone)
    for i, (row, mine) in enumerate(where):
        assert_close(packed[row][mine], alone_logits[i][:mine.sum()], F64_LOGITS,
                     f"{framework}: line {i} (row {row}) packed vs alone")
    crossing = (segments[:, None, :, None] != segments[:, None, None, :]) & (
        segments[:, None, :, None] > 0)  # (B, 1, T, T): a real query, a key of another line
    (kind, layers), = attention.items()
    for weights in layers:
        assert np.all(np.where(crossing, weights, 0.0) == 0.0), f"{kind} crosses lines"


@pytest.mark.slow
def test_packed_loss_and_gradients_match_across_frameworks():
    """The training loss of a packed batch, and its gradient, agree on both sides."""
    config = CONFIGS["untied_bias"].replace(dropout=0.0)
    batch = packed_batch(config, seed=3)
    with precision("float64") as dtypes:
        flax_model, torch_model = build_pair(config, "flax_to_torch", dtypes)
        trainer = jax_step.Trainer(flax_model, jax_step.make_optimizer(lambda _: 1e-3),
                                   label_smoothing=0.1)
        loss_f, tokens_f, grads_f, _ = trainer._gradients(trainer.initial_state,
                                                          {k: jnp.asarray(v) for k, v in
                                                           batch.items()})
        torch_model.train()
        logits = torch_model(**torch_training.model_inputs(
            {k: to_torch(v, torch.int64) for k, v in batch.items()}))
        loss_t, tokens_t = torch_training.label_smoothed_cross_entropy(
            logits, to_torch(batch["tgt_out"], torch.int64), config.pad_id, 0.1)
        loss_t.backward()
    assert int(tokens_f) == int(tokens_t) == int((batch["tgt_segments"] > 0).sum())
    assert_close(loss_f, loss_t.detach(), 1e-10, "packed loss sum")
    grad_f = np.asarray(grads_f["output_projection"]["kernel"][...])
    assert_close(grad_f.T, torch_model.output_projection.weight.grad, 1e-10,
                 "output projection gradient")
    grad_f = np.asarray(grads_f["encoder"]["layers"][0]["self_attn"]["W_q"]["kernel"][...])
    assert_close(grad_f.T, torch_model.encoder.layers[0].self_attn.W_q.weight.grad, 1e-10,
                 "first encoder layer's W_q gradient")
