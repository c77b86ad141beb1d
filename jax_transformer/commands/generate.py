"""Continue text with a decoder-only checkpoint directory.

    jaxformer-generate --checkpoint DIR --prompt "Once upon a time"
    jaxformer-generate --checkpoint DIR --prompt "a" --prompt "b" \\
        --temperature 0.8 --top-k 40 --top-p 0.9 --seed 1 --max-new-tokens 100
    jaxformer-generate --checkpoint DIR --prompt-file prompts.txt --beam-size 4
    jaxformer-generate --checkpoint DIR --prompt "..." --framework torch

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

import sys
from pathlib import Path

from jax_transformer.commands import exit_codes, parsing
from jax_transformer.applications.generator import GenerateError, generate, load
from transformer_core.generation import check_alpha
from transformer_core.text import split_lines


def parse_args(argv=None):
    p = parsing.ArgumentParser(prog="jaxformer-generate",
                                description="Continue prompts with a decoder-only model.")
    p.add_argument("--checkpoint", required=True, type=parsing.path,
                   help="checkpoint directory (config.json, model.safetensors, tokenizer.model)")
    p.add_argument("--prompt", action="append", default=[],
                   help="text to continue; repeat for several prompts")
    p.add_argument("--prompt-file", type=parsing.path, help="more prompts, one per line")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="most tokens per continuation (default: as many as fit the model's "
                        "max_len after the longest prompt, at most 100)")
    parsing.add_sampling_flags(p)
    p.add_argument("--beam-size", type=int, default=1,
                   help="> 1: beam search (deterministic; no sampling flags)")
    p.add_argument("--alpha", type=float, default=0.6, help="beam length penalty (default 0.6)")
    p.add_argument("--framework", choices=("jax", "torch"), default="jax",
                   help="jax: our Flax model; torch: torch_reference, without importing JAX "
                        "(default: jax)")
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


def generate_command(argv=None) -> int:
    args = parse_args(argv)
    check_alpha(args.alpha)
    sampling = parsing.sampling_from(args)
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
    """The command line; returns the exit code (exit_codes)."""
    return exit_codes.run(generate_command, argv)


if __name__ == "__main__":
    sys.exit(main())
