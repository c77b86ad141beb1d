"""Continue text with a decoder-only checkpoint directory: the library behind
`jaxformer-generate`.

The checkpoint directory holds config.json (architecture "decoder_only"),
model.safetensors and tokenizer.model, as save_pretrained writes them (e.g. the
export/ of a train.py run). Each prompt becomes [bos] + its pieces. Prompt i
samples with row i of the shared uniforms (transformer_core.generation), so both
frameworks give the same text for the same seed. `framework="torch"` runs
torch_reference and does not import JAX.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.errors import InputError
from transformer_core.generation import Sampling, pad_prompts
from transformer_core.tokenizer import Tokenizer


class GenerateError(InputError):
    """The generation request cannot be served as given."""


def load(checkpoint, framework: str):
    """(model, tokenizer) from a decoder-only checkpoint directory, or a clear error."""
    directory = Path(checkpoint)
    if not directory.is_dir():
        raise GenerateError(f"checkpoint directory {directory} does not exist")
    for name in (checkpoint_dir.CONFIG_FILE, checkpoint_dir.WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise GenerateError(checkpoint_dir.missing_file(directory, name))
    config_file = directory / checkpoint_dir.CONFIG_FILE
    architecture = TransformerConfig.from_json(config_file).architecture
    if architecture != "decoder_only":
        hint = (" (jaxformer-translate runs encoder_decoder ones)"
                if architecture == "encoder_decoder" else "")
        raise GenerateError(f"{directory} holds an {architecture} model; generate continues "
                            f"text with decoder_only models{hint}")
    tokenizer_file = checkpoint_dir.tokenizer_path(directory)
    if tokenizer_file is None:
        raise GenerateError(f"{directory} has no {checkpoint_dir.TOKENIZER_FILE}; save the "
                            "checkpoint with its tokenizer (save_pretrained(dir, tokenizer=path))")
    if framework == "torch":
        import torch

        import torch_reference
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = torch_reference.DecoderOnlyTransformer.from_pretrained(directory, device=device)
    else:
        from jax_transformer.model import DecoderOnlyTransformer
        model = DecoderOnlyTransformer.from_pretrained(directory)
    tokenizer = Tokenizer(tokenizer_file)
    tokenizer.check_fits(model.config)
    return model, tokenizer


def generate(prompts, model, tokenizer, *, framework="jax", sampling=Sampling(),
             max_new_tokens=None, beam_size=1, alpha=0.6) -> list[str]:
    """Each prompt's continuation, as text. One batch: prompt i samples with row i
    of sampling.uniforms(len(prompts), max_new_tokens). `max_new_tokens` defaults
    to what fits the model's max_len after the longest prompt, at most 100."""
    config = model.config
    if framework == "torch":
        from torch_reference import lm_decoding
    else:
        from jax_transformer import lm_decoding
    ids, lengths = pad_prompts([[config.bos_id] + tokenizer.encode(p) for p in prompts],
                               config.pad_id)
    if max_new_tokens is None:
        max_new_tokens = min(100, config.max_len - ids.shape[1])
        if max_new_tokens < 1:  # the default: no flag to name
            raise GenerateError(f"the longest prompt ({ids.shape[1]} tokens with bos) leaves no "
                                f"room for a continuation in the model's max_len "
                                f"{config.max_len}; shorten it")
    if max_new_tokens < 1 or ids.shape[1] + max_new_tokens > config.max_len:
        raise GenerateError(f"the longest prompt ({ids.shape[1]} tokens with bos) and "
                            f"--max-new-tokens {max_new_tokens} exceed the model's max_len "
                            f"{config.max_len}")
    if beam_size > 1:
        tokens, _ = lm_decoding.beam_search(model, ids, lengths, max_new_tokens=max_new_tokens,
                                            beam_size=beam_size, alpha=alpha)
        tokens = tokens[:, 0]  # the best beam
    else:
        tokens, _ = lm_decoding.sample(model, ids, lengths, max_new_tokens=max_new_tokens,
                                       sampling=sampling)
    tokens = np.asarray(tokens.cpu() if framework == "torch" else tokens)
    return [tokenizer.decode(row.tolist()) for row in tokens]
