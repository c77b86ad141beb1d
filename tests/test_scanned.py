"""Scanned layer stacks (jax_transformer/scanned.py) against the loop: the same
outputs and dropout masks, the same dropout streams afterwards, the per-layer
layout of the files, and a traced step whose size does not grow with depth."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer import scanned
from jax_transformer.model import build_model
from jax_transformer.train import step as training
from transformer_core.config import TransformerConfig

CONFIGS = {
    "encoder_decoder": TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16,
                                         num_heads=2, d_ff=32, num_encoder_layers=2,
                                         num_decoder_layers=3, dropout=0.2),
    "decoder_only": TransformerConfig(architecture="decoder_only", src_vocab_size=30,
                                      tgt_vocab_size=30, d_model=16, num_heads=2, d_ff=32,
                                      num_decoder_layers=3, dropout=0.2, pre_norm=True,
                                      final_norm=True),
    "encoder_only": TransformerConfig(architecture="encoder_only", src_vocab_size=30,
                                      tgt_vocab_size=30, d_model=16, num_heads=2, d_ff=32,
                                      num_encoder_layers=3, dropout=0.2),
}
LOGITS, WEIGHTS = 1e-5, 1e-6  # float32, as parity_tests/test_model_parity.py


@pytest.fixture(autouse=True)
def _ieee_float32_matmuls():
    """float32 matmuls in float32 on every device, as in the parity suite: a GPU's default
    runs them as TF32, where the loop's and the scan's differently fused programs gave
    logits 1.2e-3 apart with dropout on (an H200, 2026-11-27)."""
    with jax.default_matmul_precision("highest"):
        yield


def batch(config):
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(4, 30, (2, 7)), jnp.int32)
    if config.architecture == "encoder_decoder":
        return {"src_ids": ids, "tgt_ids": jnp.asarray(rng.integers(4, 30, (2, 5)), jnp.int32)}
    return {"ids": ids}


def pair(config, unroll: int = 1):
    """The same model (same seed) looped and scanned."""
    loop = build_model(config, rngs=nnx.Rngs(0))
    return loop, scanned.scan_layers(build_model(config, rngs=nnx.Rngs(0)), unroll)


def plain(state: nnx.State) -> list[np.ndarray]:
    """The state's leaves as numpy arrays (random keys as their key data)."""
    return [np.asarray(jax.random.key_data(leaf) if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
                       else leaf) for leaf in jax.tree.leaves(state)]


# The fast tier: each architecture once, each unroll and mode at least once.
FAST_SCAN_CASES = {("encoder_decoder", False, 2), ("encoder_only", True, 1),
                   ("decoder_only", False, 1)}


@pytest.mark.parametrize("architecture, deterministic, unroll", [
    pytest.param(a, d, u, id=f"{a}-{'eval' if d else 'dropout'}-{u}",
                 marks=() if (a, d, u) in FAST_SCAN_CASES else pytest.mark.slow)
    for a in CONFIGS for d in (True, False) for u in (1, 2)])
def test_the_scan_computes_what_the_loop_computes(architecture, deterministic, unroll):
    """Logits and every layer's attention weights, in eval mode and with dropout (the
    same masks: each layer draws from its own stream), at unroll 1 and 2 (3 layers:
    a remainder)."""
    config = CONFIGS[architecture]
    loop, scan = pair(config, unroll)
    inputs = batch(config)
    out_loop, weights_loop = nnx.view(loop, deterministic=deterministic)(
        **inputs, return_attention=True)
    out_scan, weights_scan = nnx.view(scan, deterministic=deterministic)(
        **inputs, return_attention=True)
    np.testing.assert_allclose(out_scan, out_loop, atol=LOGITS, rtol=0)
    assert weights_scan.keys() == weights_loop.keys()
    for kind in weights_loop:
        assert len(weights_scan[kind]) == len(weights_loop[kind]) > 0
        for a, b in zip(weights_scan[kind], weights_loop[kind]):
            np.testing.assert_allclose(a, b, atol=WEIGHTS, rtol=0)
    if not deterministic:  # dropout really drew: the eval logits differ
        assert not np.allclose(out_loop, nnx.view(loop, deterministic=True)(**inputs),
                               atol=1e-3)


def test_dropout_streams_advance_as_the_loop_s_do():
    """After two training forwards the scanned model's dropout counters (written back
    from the scan) are the loop's, so a third draws the loop's masks again."""
    config = CONFIGS["encoder_decoder"]
    loop, scan = pair(config)
    inputs = batch(config)
    for _ in range(2):
        nnx.view(loop, deterministic=False)(**inputs)
        nnx.view(scan, deterministic=False)(**inputs)
    streams = scanned.per_layer_state(nnx.state(scan, nnx.RngState))
    assert jax.tree.structure(streams) == jax.tree.structure(nnx.state(loop, nnx.RngState))
    for a, b in zip(plain(streams), plain(nnx.state(loop, nnx.RngState))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(nnx.view(scan, deterministic=False)(**inputs),
                               nnx.view(loop, deterministic=False)(**inputs), atol=LOGITS,
                               rtol=0)


def test_the_files_keep_the_per_layer_layout():
    """per_layer_state of a scanned model is the loop's state, leaf for leaf (11 layers:
    layer 10 after layer 9), and stacked_state gives the scanned state back."""
    config = CONFIGS["decoder_only"].replace(num_decoder_layers=11)
    loop, scan = pair(config)
    assert scanned.is_scanned(scan) and not scanned.is_scanned(loop)
    assert scanned.is_stacked(nnx.state(scan)) and not scanned.is_stacked(nnx.state(loop))
    per_layer = scanned.per_layer_state(nnx.state(scan))
    assert jax.tree.structure(per_layer) == jax.tree.structure(nnx.state(loop))
    for a, b in zip(plain(per_layer), plain(nnx.state(loop))):
        np.testing.assert_array_equal(a, b)
    stacked = scanned.stacked_state(per_layer)
    assert jax.tree.structure(stacked) == jax.tree.structure(nnx.state(scan))
    for a, b in zip(plain(stacked), plain(nnx.state(scan))):
        np.testing.assert_array_equal(a, b)


def lowered_step_lines(layers: int, scan: bool) -> int:
    """Lines of the training step's program as jit hands it to XLA (StableHLO)."""
    config = CONFIGS["encoder_decoder"].replace(num_encoder_layers=layers,
                                                num_decoder_layers=layers)
    model = build_model(config, rngs=nnx.Rngs(0))
    if scan:
        scanned.scan_layers(model)
    trainer = training.Trainer(model, training.make_optimizer(training.paper_schedule(16, 4)))
    rows = np.full((2, 6), 5, np.int32)
    lowered = trainer.train_step.lower(trainer.initial_state,
                                       {"src": rows, "tgt_in": rows, "tgt_out": rows})
    return len(lowered.as_text().splitlines())


@pytest.mark.slow  # compiles the step at several depths
def test_the_scanned_step_does_not_grow_with_depth():
    """What XLA compiles: the scanned step at 4 layers is as long as at 2 (the scan's
    body is one layer of each stack), where the loop's doubles."""
    assert lowered_step_lines(4, scan=True) == lowered_step_lines(2, scan=True)
    assert lowered_step_lines(4, scan=False) > 1.5 * lowered_step_lines(2, scan=False)


def test_auto_follows_the_backend():
    assert scanned.scan_wanted("on", "cpu") and not scanned.scan_wanted("off", "gpu")
    for backend, default in scanned.SCAN_BY_DEFAULT.items():
        assert scanned.scan_wanted("auto", backend) == default
