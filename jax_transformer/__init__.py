"""The 2017 encoder-decoder Transformer in JAX/Flax NNX.

The models are in `jax_transformer.model` (`Transformer`, the encoder-decoder;
`EncoderOnlyTransformer`; `DecoderOnlyTransformer`; `build_model(config)`); docs/layout.md maps
the rest. This file imports no JAX, so that `jaxformer-translate --framework torch`
runs without it. The commands live in `jax_transformer.commands`.
"""

from transformer_core.config import ConfigError, TransformerConfig

__all__ = ["ConfigError", "TransformerConfig"]
