"""The PyTorch reference of the 2017 Transformer, module for module like jax_transformer.

Runs without JAX: it uses only jax_transformer.config and
jax_transformer.interchange, which need neither JAX nor torch.
"""

from jax_transformer.config import TransformerConfig
from torch_reference.model import Transformer

__all__ = ["Transformer", "TransformerConfig"]
