"""Flax and torch compute the same thing, given the same weights.

Tolerances (issue 2): float32 logits <= 1e-5, attention weights <= 1e-6;
float64 logits <= 1e-12. They are never loosened to make a test pass.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_transformer import masks as jax_masks
from jax_transformer.train.step import label_smoothed_cross_entropy as jax_loss
from parity_tests.helpers import (CONFIGS, TORCH_DEVICE, assert_close, build_pair,
                                  fast_tier, make_batches, precision, to_numpy, to_torch)
from torch_reference import masks as torch_masks
from torch_reference.training import label_smoothed_cross_entropy as torch_loss

F32_LOGITS, F32_HIDDEN, F32_WEIGHTS, F64_LOGITS = 1e-5, 1e-5, 1e-6, 1e-12


def run_both(flax_model, torch_model, src, tgt, pad_id=0):
    """Encoder output, decoder output, logits and attention weights from each side."""
    outputs = []
    sides = ((flax_model, jnp.asarray, jax_masks), (torch_model, to_torch, torch_masks))
    for model, as_ids, masks in sides:
        with torch.no_grad():
            s, t = as_ids(src), as_ids(tgt)
            src_mask = masks.padding_mask(s, pad_id)
            memory, _ = model.encode(s, src_mask)
            hidden, _, _ = model.decode(t, memory, src_mask)
            logits, attention = model(s, t, return_attention=True)
            outputs.append(dict(memory=memory, hidden=hidden, logits=logits, **attention))
    return outputs


@pytest.mark.parametrize("batch", fast_tier(["padded", "batch1", "len1"], fast={"padded"}))
@pytest.mark.parametrize("name", fast_tier(list(CONFIGS), fast={  # one per weight-mapping case
    "pre_ln_final_norm", "untied_bias", "tied_bias", "unshared", "odd_width_half_split",
    "m2m100_like"}))
@pytest.mark.parametrize("scan", fast_tier([False, True], fast={False}),
                         ids=["loop", "scan"])  # scanned fast: test_gradients_match
def test_forward_float32(name, batch, direction, scan):
    config = CONFIGS[name]
    src, tgt = make_batches(config)[batch]
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes, scan=scan)
        f, t = run_both(flax_model, torch_model, src, tgt)
    assert_close(f["memory"], t["memory"], F32_HIDDEN, "encoder output")
    assert_close(f["hidden"], t["hidden"], F32_HIDDEN, "decoder output")
    assert_close(f["logits"], t["logits"], F32_LOGITS, "logits")
    for kind in ("encoder_self", "decoder_self", "cross"):
        assert len(f[kind]) == len(t[kind])
        for i, (a, b) in enumerate(zip(f[kind], t[kind])):
            assert_close(a, b, F32_WEIGHTS, f"{kind} attention weights, layer {i}")


@pytest.mark.parametrize("name", fast_tier(["post_ln", "pre_ln_final_norm", "untied_bias", "gelu",
                                            "silu_half_split", "odd_width", "three_layers",
                                            "unshared", "fsmt_like", "odd_width_fairseq"],
                                           fast={"post_ln", "unshared"}))
def test_forward_float64(name, direction):
    config = CONFIGS[name]
    src, tgt = make_batches(config)["padded"]
    with precision("float64") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes)
        f, t = run_both(flax_model, torch_model, src, tgt)
        assert f["logits"].dtype == jnp.float64 and t["logits"].dtype == torch.float64
    assert_close(f["logits"], t["logits"], F64_LOGITS, "float64 logits")


@pytest.mark.parametrize("name", fast_tier(["post_ln", "pre_ln_final_norm", "odd_width",
                                            "three_layers"], fast={"pre_ln_final_norm"}))
def test_every_attention_layer(name, direction):
    """Each encoder self-, decoder masked self- and cross-attention module, fed the
    same hidden states and mask on both sides, gives the same output and weights."""
    config = CONFIGS[name]
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(2, 5, config.d_model)).astype(np.float32)
    keys = rng.normal(size=(2, 7, config.d_model)).astype(np.float32)
    key_ids = np.array([[5, 6, 7, 0, 0, 0, 0], [5, 6, 7, 8, 9, 10, 11]])
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes)
        cases = []
        for i in range(config.num_encoder_layers):
            cases.append((f"encoder {i} self", flax_model.encoder.layers[i].self_attn,
                          torch_model.encoder.layers[i].self_attn, keys, keys, key_ids))
        for i in range(config.num_decoder_layers):
            layer_f, layer_t = flax_model.decoder.layers[i], torch_model.decoder.layers[i]
            cases.append((f"decoder {i} self", layer_f.self_attn, layer_t.self_attn,
                          queries, queries, "causal"))
            cases.append((f"decoder {i} cross", layer_f.cross_attn, layer_t.cross_attn,
                          queries, keys, key_ids))
        for what, attn_f, attn_t, q, kv, mask_spec in cases:
            if isinstance(mask_spec, str):
                mask_f = jax_masks.causal_mask(q.shape[1])
                mask_t = torch_masks.causal_mask(q.shape[1], TORCH_DEVICE)
            else:
                mask_f = jax_masks.padding_mask(jnp.asarray(mask_spec), 0)
                mask_t = torch_masks.padding_mask(to_torch(mask_spec), 0)
            out_f, weights_f = attn_f(jnp.asarray(q), jnp.asarray(kv), mask_f)
            with torch.no_grad():
                out_t, weights_t = attn_t(to_torch(q), to_torch(kv), mask_t)
            assert_close(out_f, out_t, F32_HIDDEN, f"{what} attention output")
            assert_close(weights_f, weights_t, F32_WEIGHTS, f"{what} attention weights")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("name", fast_tier(["post_ln", "untied_bias", "unshared"],
                                           fast={"untied_bias"}))
def test_label_smoothed_loss(name, smoothing, direction):
    """The loss ignores padding, and is the same number on both sides."""
    config = CONFIGS[name]
    src, tgt = make_batches(config)["padded"]
    labels = np.roll(tgt, -1, axis=1)
    labels[tgt == config.pad_id] = config.pad_id
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes)
        logits_f = flax_model(jnp.asarray(src), jnp.asarray(tgt))
        with torch.no_grad():
            logits_t = torch_model(to_torch(src), to_torch(tgt))
        sum_f, count_f = jax_loss(logits_f, jnp.asarray(labels), config.pad_id, smoothing)
        sum_t, count_t = torch_loss(logits_t, to_torch(labels), config.pad_id, smoothing)
        # Changing the logits at pad labels must not change the loss.
        noisy = logits_f + 100.0 * jnp.asarray(labels == config.pad_id)[..., None]
        sum_noisy, _ = jax_loss(noisy, jnp.asarray(labels), config.pad_id, smoothing)
    assert int(count_f) == int(count_t) == int((labels != config.pad_id).sum())
    assert_close(sum_f / count_f, to_numpy(sum_t) / to_numpy(count_t), 1e-5, "loss")
    assert_close(sum_noisy, sum_f, 1e-4, "loss with changed pad logits")
