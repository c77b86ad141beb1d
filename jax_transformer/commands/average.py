"""jaxformer-average: the mean of checkpoint directories of one model (the paper's
checkpoint averaging; transformer_core.averaging).

    jaxformer-average --output avg/ run/ckpt-a run/ckpt-b run/ckpt-c

The checkpoints must share the config and the tokenizer files; the output is an
ordinary checkpoint directory (config.json, model.safetensors, the tokenizer), so
translate, port and parity take it. train.py averages its own last checkpoints at
export with --export average --average-last N.
"""

from __future__ import annotations

import sys
import time
from typing import Sequence

from jax_transformer.commands import exit_codes, parsing
from transformer_core.averaging import average_dirs


def average_command(argv: Sequence[str] | None) -> None:
    parser = parsing.ArgumentParser(
        prog="jaxformer-average",
        description="Average the parameters of checkpoint directories of one model.")
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", type=parsing.path,
                        help="checkpoint directories (config.json, model.safetensors and the "
                             "tokenizer), e.g. several train.py exports")
    parser.add_argument("--output", required=True, type=parsing.path,
                        help="the directory to write the average to (new, or an earlier "
                             "output, which is replaced whole)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    output = average_dirs(args.checkpoints, args.output)
    print(f"averaged {len(args.checkpoints)} checkpoints into {output} in "
          f"{time.perf_counter() - began:.1f} s", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code (exit_codes)."""
    return exit_codes.run(average_command, argv)


if __name__ == "__main__":
    sys.exit(main())
