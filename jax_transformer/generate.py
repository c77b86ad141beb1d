"""Continue text with a decoder-only checkpoint directory.

    python -m jax_transformer.generate --checkpoint DIR --prompt "Once upon a time"
    python -m jax_transformer.generate --checkpoint DIR --prompt "a" --prompt "b" \\
        --temperature 0.8 --top-k 40 --top-p 0.9 --seed 1 --max-new-tokens 100
    python -m jax_transformer.generate --checkpoint DIR --prompt-file prompts.txt --beam-size 4
    python -m jax_transformer.generate --checkpoint DIR --prompt "..." --framework torch

The checkpoint directory holds config.json (architecture "decoder_only"),
model.safetensors and tokenizer.model, as save_pretrained writes them (e.g. the
export/ of a train.py run). Each prompt (a --prompt, or a line of
--prompt-file, UTF-8; an empty one starts from bos alone) becomes [bos] +
its pieces; one line per prompt is printed, in order: the continuation, up
to eos or --max-new-tokens tokens. Temperature 0 is greedy; --beam-size > 1
runs beam search instead of sampling. Prompt i uses row i of the shared
uniforms (transformer_core.generation), so both frameworks print the same text
for the same --seed. `--framework torch` runs torch_reference and does not
import JAX.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from jax_transformer import cli
from jax_transformer.translate import split_lines
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.errors import InputError
from transformer_core.generation import Sampling, pad_prompts
from transformer_core.tokenizer import Tokenizer


class GenerateError(InputError):
    """The generation request cannot be served as given."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m jax_transformer.generate",
                                description="Continue prompts with a decoder-only model.")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint directory (config.json, model.safetensors, tokenizer.model)")
    p.add_argument("--prompt", action="append", default=[],
                   help="text to continue; repeat for several prompts")
    p.add_argument("--prompt-file", help="more prompts, one per line")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="most tokens per continuation (default: as many as fit the model's "
                        "max_len after the longest prompt, at most 100)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample from the k most likely tokens; 0 = all (default)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample from the smallest set of most likely tokens whose probability "
                        "reaches p; 1 = all (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--beam-size", type=int, default=1,
                   help="> 1: beam search (deterministic; no sampling flags)")
    p.add_argument("--alpha", type=float, default=0.6, help="beam length penalty (default 0.6)")
    p.add_argument("--framework", choices=("jax", "torch"), default="jax")
    args = p.parse_args(argv)
    for name in ("max_new_tokens", "beam_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    sampling_flags = [f"--{name.replace('_', '-')}" for name in ("temperature", "top_k", "top_p")
                      if getattr(args, name) is not None]
    if args.beam_size > 1 and sampling_flags:
        p.error(f"--beam-size {args.beam_size} searches deterministically; drop "
                f"{' '.join(sampling_flags)}")
    if not args.prompt and not args.prompt_file:
        p.error("give at least one --prompt TEXT or a --prompt-file")
    return args


def sampling_settings(args) -> Sampling:
    """The sampling flags, checked (a SamplingError names the bad one)."""
    return Sampling(temperature=1.0 if args.temperature is None else args.temperature,
                    top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
                    seed=args.seed)


def load(checkpoint, framework: str):
    """(model, tokenizer) from a decoder-only checkpoint directory, or a clear error."""
    directory = Path(checkpoint)
    if not directory.is_dir():
        raise GenerateError(f"checkpoint directory {directory} does not exist")
    config_file = directory / checkpoint_dir.CONFIG_FILE
    if not config_file.is_file():
        hint = (f" (a train.py workdir? its model is in {directory / 'export'})"
                if (directory / "export" / checkpoint_dir.CONFIG_FILE).is_file() else "")
        raise GenerateError(f"{directory} has no {checkpoint_dir.CONFIG_FILE}{hint}")
    architecture = TransformerConfig.from_json(config_file).architecture
    if architecture != "decoder_only":
        hint = (" (python -m jax_transformer.translate runs encoder_decoder ones)"
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


def generate_command(argv=None) -> int:
    args = parse_args(argv)
    sampling = sampling_settings(args)
    prompts = list(args.prompt)
    if args.prompt_file:
        try:
            data = Path(args.prompt_file).read_bytes()
        except OSError as e:
            raise GenerateError(f"cannot read --prompt-file {args.prompt_file}: {e}") from e
        prompts += split_lines(data, f"--prompt-file {args.prompt_file}")
    if not prompts:
        raise GenerateError(f"--prompt-file {args.prompt_file} holds no prompts")
    model, tokenizer = load(args.checkpoint, args.framework)
    texts = generate(prompts, model, tokenizer, framework=args.framework, sampling=sampling,
                     max_new_tokens=args.max_new_tokens, beam_size=args.beam_size,
                     alpha=args.alpha)
    sys.stdout.write("".join(text + "\n" for text in texts))
    sys.stdout.flush()
    return 0


def main(argv=None) -> int:
    """The command line; returns the exit code (jax_transformer.cli)."""
    return cli.run(generate_command, argv)


if __name__ == "__main__":
    sys.exit(main())
