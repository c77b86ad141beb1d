"""The 2017 encoder-decoder Transformer in JAX/Flax NNX.

`jax_transformer.config` and `jax_transformer.interchange` need neither JAX nor
torch; everything else imports JAX. Attributes below load lazily so that
torch_reference can use the config without importing JAX.
"""

from jax_transformer.config import ConfigError, TransformerConfig

__all__ = ["ConfigError", "TransformerConfig", "Transformer"]


def __getattr__(name):
    if name == "Transformer":
        from jax_transformer.model import Transformer
        return Transformer
    raise AttributeError(f"module 'jax_transformer' has no attribute {name!r}")
