"""The checkpoint directory between the frameworks: Flax -> dir -> torch -> dir -> Flax,
and the in-memory conversion, bit for bit."""

from __future__ import annotations

import pytest
import safetensors.numpy

from jax_transformer.model import Transformer as FlaxTransformer
from jax_transformer.pretrained import to_torch_state_dict
from parity_tests.helpers import (CONFIGS, assert_bit_exact, build_pair, fast_tier, flax_params,
                                  precision, to_numpy)
from torch_reference.model import Transformer as TorchTransformer
from transformer_core import checkpoint_dir

CONFIG = CONFIGS["untied_bias"]


@pytest.mark.parametrize("name", fast_tier(["post_ln", "untied_bias", "unshared",
                                            "pre_ln_final_norm"], fast={"untied_bias"}))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_trip_is_bit_exact(tmp_path, name, dtype):
    """Flax -> dir -> torch -> dir -> Flax gives back the very same bits."""
    with precision(dtype) as dtypes:
        flax_model, _ = build_pair(CONFIGS[name], "flax_to_torch", dtypes)
        original = flax_params(flax_model)
        flax_model.save_pretrained(tmp_path / "a")
        torch_model = TorchTransformer.from_pretrained(tmp_path / "a")
        assert next(torch_model.parameters()).dtype == dtypes[1]
        torch_model.save_pretrained(tmp_path / "b")
        restored = FlaxTransformer.from_pretrained(tmp_path / "b")
        assert_bit_exact(original, flax_params(restored))
        assert_bit_exact(safetensors.numpy.load_file(tmp_path / "a" / checkpoint_dir.WEIGHTS_FILE),
                         safetensors.numpy.load_file(tmp_path / "b" / checkpoint_dir.WEIGHTS_FILE))
        assert checkpoint_dir.load_dir(tmp_path / "b")[0] == CONFIGS[name]


def test_in_memory_conversion_both_ways():
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(CONFIG, "torch_to_flax", dtypes)
        torch_state = {k: to_numpy(v) for k, v in torch_model.state_dict().items()}
        assert_bit_exact(torch_state, to_torch_state_dict(flax_model))
