"""The encoder-only and decoder-only architectures: Flax and torch compute the same
hidden states, logits and attention weights given the same weights, with the
masks each architecture means (padding for the encoder, causal for the decoder).

Tolerances as for the translator: float32 logits and hidden states <= 1e-5,
attention weights <= 1e-6, float64 logits <= 1e-12.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import torch_reference
from jax_transformer import masks as jax_masks
from jax_transformer import model as flax_models
from parity_tests.helpers import (SINGLE_STACK_CONFIGS, TORCH_DEVICE, assert_close, build_pair,
                                  fast_tier, precision, to_numpy, to_torch)
from torch_reference import masks as torch_masks
from transformer_core.config import ConfigError

F32_LOGITS, F32_HIDDEN, F32_WEIGHTS, F64_LOGITS = 1e-5, 1e-5, 1e-6, 1e-12
FAST = {"encoder_only_pre_ln_learned", "decoder_only_pre_ln_untied"}


def make_ids(config, batch: str) -> np.ndarray:
    """Right-padded rows of unequal length, one row, or length-1 rows."""
    rng = np.random.default_rng(3)
    shape = {"padded": (3, 9), "batch1": (1, 6), "len1": (2, 1)}[batch]
    ids = rng.integers(4, config.vocab_size, size=shape)
    if batch == "padded":
        ids[0, 5:] = config.pad_id
        ids[2, 2:] = config.pad_id
    return ids


def run_both(flax_model, torch_model, ids) -> list[dict]:
    """Hidden states, logits and attention weights from each side."""
    outputs = []
    for model, as_ids in ((flax_model, jnp.asarray), (torch_model, to_torch)):
        with torch.no_grad():
            x = as_ids(ids)
            stack = model.encode if model.config.architecture == "encoder_only" else model.decode
            hidden, _ = stack(x)
            logits, attention = model(x, return_attention=True)
        (weights,) = attention.values()
        outputs.append(dict(hidden=hidden, logits=logits, weights=weights))
    return outputs


@pytest.mark.parametrize("batch", fast_tier(["padded", "batch1", "len1"], fast={"padded"}))
@pytest.mark.parametrize("name", fast_tier(list(SINGLE_STACK_CONFIGS), fast=FAST))
def test_forward_float32(name, batch, direction):
    config = SINGLE_STACK_CONFIGS[name]
    ids = make_ids(config, batch)
    with precision("float32") as dtypes:
        f, t = run_both(*build_pair(config, direction, dtypes), ids)
    assert_close(f["hidden"], t["hidden"], F32_HIDDEN, "hidden states")
    assert_close(f["logits"], t["logits"], F32_LOGITS, "logits")
    layers = (config.num_encoder_layers if config.architecture == "encoder_only"
              else config.num_decoder_layers)
    assert len(f["weights"]) == len(t["weights"]) == layers
    for i, (a, b) in enumerate(zip(f["weights"], t["weights"])):
        assert_close(a, b, F32_WEIGHTS, f"attention weights, layer {i}")


@pytest.mark.parametrize("name", fast_tier(list(SINGLE_STACK_CONFIGS),
                                           fast={"decoder_only_pre_ln_untied"}))
def test_forward_float64(name, direction):
    config = SINGLE_STACK_CONFIGS[name]
    with precision("float64") as dtypes:
        f, t = run_both(*build_pair(config, direction, dtypes), make_ids(config, "padded"))
        assert f["logits"].dtype == jnp.float64 and t["logits"].dtype == torch.float64
    assert_close(f["logits"], t["logits"], F64_LOGITS, "float64 logits")


@pytest.mark.parametrize("name", ["encoder_only_pre_ln_learned", "decoder_only_pre_ln_untied"])
def test_masks_mean_what_the_architecture_says(name):
    """Decoder-only: a later token never changes an earlier position's logits, and
    an earlier token changes every later one. Encoder-only: a token changes every
    real position's logits, and keys the padding mask hides change none."""
    config = SINGLE_STACK_CONFIGS[name]
    ids = make_ids(config, "padded")[:1]  # one row: 5 real tokens, then 4 pads
    other = ids.copy()
    with precision("float32") as dtypes:
        for model, as_ids, masks in zip(build_pair(config, "flax_to_torch", dtypes),
                                        (jnp.asarray, to_torch), (jax_masks, torch_masks)):
            def logits(x, mask=None):
                with torch.no_grad():
                    return to_numpy(model(as_ids(x), mask))[0]  # (L, V)
            before = logits(ids)
            if config.architecture == "decoder_only":
                other[0, 3] = ids[0, 3] % (config.vocab_size - 4) + 4
                after = logits(other)
                assert np.array_equal(after[:3], before[:3]), "a later token leaked back"
                assert np.all(np.abs(after[3:] - before[3:]).max(-1) > 1e-4)
            else:
                other[0, 0] = ids[0, 0] % (config.vocab_size - 4) + 4
                assert np.all(np.abs(logits(other)[:5] - before[:5]).max(-1) > 1e-4)
                hidden_keys = ids.copy()
                hidden_keys[0, 5:] = 7  # real ids where the (original) padding mask hides them
                mask = masks.padding_mask(as_ids(ids), config.pad_id)
                assert_close(logits(hidden_keys, mask)[:5], before[:5], 1e-6,
                             "logits with other ids under masked keys")


@pytest.mark.parametrize("architecture", ["encoder_only", "decoder_only"])
def test_checkpoint_directory_round_trip(architecture, tmp_path):
    """save_pretrained in one framework, from_pretrained in the other: the class is
    picked from config.json, and the wrong class is refused with a clear error."""
    config = SINGLE_STACK_CONFIGS[architecture].replace(position_encoding="learned")
    torch.manual_seed(0)
    torch_model = torch_reference.build_model(config).eval()
    torch_model.save_pretrained(tmp_path)
    flax_model = nnx.view(flax_models.from_pretrained(tmp_path), deterministic=True)
    assert type(flax_model).__name__ == type(torch_model).__name__
    ids = make_ids(config, "padded")
    with torch.no_grad():
        expected = torch_model.to(TORCH_DEVICE)(to_torch(ids))
    assert_close(flax_model(jnp.asarray(ids)), expected, F32_LOGITS, "logits after loading")
    assert type(torch_reference.from_pretrained(tmp_path)) is type(torch_model)
    with pytest.raises(ConfigError, match=f"the config is '{architecture}'.*build_model"):
        flax_models.Transformer.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=f"the config is '{architecture}'"):
        torch_reference.Transformer.from_pretrained(tmp_path)
