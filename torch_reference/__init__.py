"""The PyTorch reference of the 2017 Transformer, module for module like jax_transformer.

Runs without JAX: besides torch it needs only transformer_core (config and
checkpoint directory), which imports neither framework.
"""

from transformer_core.config import TransformerConfig
from torch_reference.model import (DecoderOnlyTransformer, EncoderOnlyTransformer, Transformer,
                                   build_model, from_pretrained)

__all__ = ["DecoderOnlyTransformer", "EncoderOnlyTransformer", "Transformer", "TransformerConfig",
           "build_model", "from_pretrained"]
