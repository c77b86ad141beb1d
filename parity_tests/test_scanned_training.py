"""A model trained with its layer stacks scanned (train.py --scan-layers on) exports
the checkpoint format: per-layer tensors that Flax loads unscanned and torch_reference
loads, computing the same logits; a scanned model saves the unscanned model's bytes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jax_transformer.model import Transformer as FlaxTransformer
from jax_transformer.scanned import is_scanned, scan_layers
from jax_transformer.train.checkpoints import restore_model
from parity_tests.helpers import CONFIGS, TORCH_DEVICE, to_numpy, to_torch
from torch_reference.model import Transformer as TorchTransformer
from transformer_core import checkpoint_dir

F32_LOGITS = 1e-5  # as test_model_parity.py


def test_a_scanned_model_saves_the_unscanned_model_s_bytes(tmp_path):
    model = FlaxTransformer(CONFIGS["post_ln"], rngs=nnx.Rngs(0))
    model.save_pretrained(tmp_path / "loop")
    scan_layers(nnx.clone(model)).save_pretrained(tmp_path / "scan")
    for name in (checkpoint_dir.CONFIG_FILE, checkpoint_dir.WEIGHTS_FILE):
        assert (tmp_path / "scan" / name).read_bytes() == (tmp_path / "loop" / name).read_bytes()


@pytest.fixture(scope="module")
def scanned_run(tmp_path_factory):
    from tests.train.runs import tiny_run
    workdir = tmp_path_factory.mktemp("scanned_run")
    tiny_run(workdir, "--layers", "2", "--scan-layers", "on", "--steps", "8")
    return workdir


@pytest.mark.slow
def test_a_scanned_run_exports_what_both_frameworks_load_unscanned(scanned_run):
    """The run's export/ (and its orbax checkpoint, through jaxformer-port's reader):
    Flax loads it unscanned, torch_reference loads it, the same logits; scanned again,
    the same logits too."""
    export = scanned_run / "export"
    _, tensors = checkpoint_dir.load_dir(export)
    assert {key.split(".")[2] for key in tensors if ".layers." in key} == {"0", "1"}
    flax_model = FlaxTransformer.from_pretrained(export)
    assert not is_scanned(flax_model)
    rng = np.random.default_rng(0)
    vocab = flax_model.config.src_vocab_size
    src, tgt = rng.integers(4, vocab, (3, 9)), rng.integers(4, vocab, (3, 7))
    logits = np.asarray(nnx.view(flax_model, deterministic=True)(jnp.asarray(src),
                                                                 jnp.asarray(tgt)))
    with torch.no_grad():
        torch_model = TorchTransformer.from_pretrained(export).to(TORCH_DEVICE).eval()
        torch_logits = to_numpy(torch_model(to_torch(src), to_torch(tgt)))
    np.testing.assert_allclose(torch_logits, logits, atol=F32_LOGITS, rtol=0)
    from_orbax = nnx.view(restore_model(scanned_run), deterministic=True)
    np.testing.assert_array_equal(np.asarray(from_orbax(jnp.asarray(src), jnp.asarray(tgt))),
                                  logits)
    rescanned = nnx.view(scan_layers(FlaxTransformer.from_pretrained(export)), deterministic=True)
    np.testing.assert_allclose(np.asarray(rescanned(jnp.asarray(src), jnp.asarray(tgt))), logits,
                               atol=F32_LOGITS, rtol=0)
