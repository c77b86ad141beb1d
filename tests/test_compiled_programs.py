"""Compiled programs give their memory mappings back when JAX's caches are cleared.

The test session relies on it: conftest.py's _release_compiled_programs clears the
caches before a test worker reaches the kernel's limit on memory mappings
(vm.max_map_count), where XLA:CPU's next compile segfaults."""

import gc
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.model import Transformer
from transformer_core.config import TransformerConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts the lines of /proc/self/maps")


def memory_mappings() -> int:
    with open("/proc/self/maps", "rb") as maps:
        return maps.read().count(b"\n")


@pytest.mark.slow
def test_clearing_the_caches_unmaps_the_programs_code():
    config = TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=16, num_heads=2,
                               d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
    model = Transformer(config, rngs=nnx.Rngs(0))
    jax.clear_caches()
    gc.collect()
    before = memory_mappings()
    for length in (3, 4):  # eager calls: every new shape compiles new small programs
        ids = jnp.asarray(np.arange(2 * length).reshape(2, length) % 49 + 1)
        model(ids, ids).block_until_ready()
    grown = memory_mappings() - before
    assert grown > 100, grown
    jax.clear_caches()
    gc.collect()
    assert memory_mappings() - before < grown / 4, (grown, memory_mappings() - before)
