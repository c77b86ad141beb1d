"""The 2017 encoder-decoder Transformer in JAX/Flax NNX.

The model is `jax_transformer.model.Transformer`; README's "Layout" section maps
the rest. This file imports no JAX, so that `python -m jax_transformer.translate
--framework torch` runs without it.
"""

from transformer_core.config import ConfigError, TransformerConfig

__all__ = ["ConfigError", "TransformerConfig"]
