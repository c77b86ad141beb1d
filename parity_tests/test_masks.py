"""Mask builders agree across frameworks, and masks do what they say."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_transformer import masks as jax_masks
from parity_tests.helpers import CONFIGS, TORCH_DEVICE, build_pair, precision, to_numpy, to_torch
from torch_reference import masks as torch_masks

IDS = {
    "padded": np.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9], [0, 0, 0, 0, 0]]),
    "single": np.array([[4]]),
    "pad_id_3": np.array([[3, 9, 3, 4]]),
}


@pytest.mark.parametrize("name", list(IDS))
def test_builders_agree(name):
    ids = IDS[name]
    pad_id = 3 if name == "pad_id_3" else 0
    pairs = {
        "padding": (jax_masks.padding_mask(jnp.asarray(ids), pad_id),
                    torch_masks.padding_mask(to_torch(ids), pad_id)),
        "causal": (jax_masks.causal_mask(ids.shape[1]),
                   torch_masks.causal_mask(ids.shape[1], TORCH_DEVICE)),
    }
    for kind, (a, b) in pairs.items():
        a, b = to_numpy(a), to_numpy(b)
        assert a.dtype == b.dtype == np.bool_, kind
        np.testing.assert_array_equal(a, b, err_msg=kind)
    # Polarity and shape: True = may attend, (B, 1, 1, L) / (1, 1, L, L).
    np.testing.assert_array_equal(to_numpy(pairs["padding"][0])[:, 0, 0], ids != pad_id)
    L = ids.shape[1]
    np.testing.assert_array_equal(to_numpy(pairs["causal"][0])[0, 0], np.tri(L, dtype=bool))


@pytest.mark.parametrize("name", ["post_ln", "pre_ln_final_norm"])
def test_masked_keys_get_exactly_zero_weight(name, direction):
    config = CONFIGS[name]
    src = np.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    tgt = np.array([[2, 8, 9, 0], [2, 4, 5, 6]])
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes)
        _, attention_f = flax_model(jnp.asarray(src), jnp.asarray(tgt), return_attention=True)
        with torch.no_grad():
            _, attention_t = torch_model(to_torch(src), to_torch(tgt),
                                         return_attention=True)
    src_keys_hidden = (src == 0)[:, None, None, :]  # (B, 1, 1, S)
    future_hidden = ~np.tri(tgt.shape[1], dtype=bool)[None, None]  # (1, 1, T, T)
    for attention in (attention_f, attention_t):
        for kind, hidden in (("encoder_self", src_keys_hidden), ("cross", src_keys_hidden),
                             ("decoder_self", future_hidden)):
            for weights in attention[kind]:
                weights = to_numpy(weights)
                hidden_weights = np.broadcast_to(hidden, weights.shape)
                assert np.all(weights[hidden_weights] == 0.0), kind
                assert np.all(weights[~hidden_weights] > 0.0), kind
                np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def test_fully_padded_row_stays_finite(direction):
    """A source row of nothing but padding masks every key: outputs stay finite
    (finfo.min, not -inf) and agree across frameworks."""
    config = CONFIGS["post_ln"]
    src = np.array([[0, 0, 0, 0], [5, 6, 7, 0]])
    tgt = np.array([[2, 4, 5], [2, 6, 7]])
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(config, direction, dtypes)
        logits_f, attention_f = flax_model(jnp.asarray(src), jnp.asarray(tgt), return_attention=True)
        with torch.no_grad():
            logits_t, attention_t = torch_model(to_torch(src), to_torch(tgt),
                                                return_attention=True)
    for logits in (logits_f, logits_t):
        assert np.all(np.isfinite(to_numpy(logits)))
    np.testing.assert_allclose(to_numpy(logits_f), to_numpy(logits_t), atol=1e-5, rtol=0)
    for weights in (attention_f["encoder_self"][0], attention_t["encoder_self"][0]):
        assert np.all(np.isfinite(to_numpy(weights)))
