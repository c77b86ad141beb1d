"""What both frameworks share, importing neither JAX nor torch.

    config          TransformerConfig, the one model configuration (JSON)
    checkpoint_dir  the checkpoint directory: config.json + model.safetensors (+ tokenizer.model)
    positions       the sinusoidal position table, in float64 numpy
    tokenizer       the SentencePiece tokenizer and the special token ids
    errors          InputError, the base of every error a user's input can cause
"""

from transformer_core.checkpoint_dir import CheckpointError
from transformer_core.config import ConfigError, TransformerConfig
from transformer_core.errors import InputError

__all__ = ["CheckpointError", "ConfigError", "InputError", "TransformerConfig"]
