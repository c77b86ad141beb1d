"""jaxformer-parity: the layer-by-layer parity report of one checkpoint, both frameworks,
the same batch (jax_transformer.applications.parity); exit code 1 when any tensor is over its
tolerance, so the report can gate CI.

    jaxformer-parity CHECKPOINT_DIR [--sentences FILE]
        [--dtypes float32 float64 bfloat16] [--device cpu|gpu]
"""

from __future__ import annotations

import sys
from pathlib import Path

from jax_transformer.applications.parity import (DEFAULT_TOLERANCE, DTYPES, generated_batch,
                                                 print_reports, run, sentence_batch)
from jax_transformer.commands import exit_codes, parsing
from transformer_core import checkpoint_dir
from transformer_core.errors import InputError
from transformer_core.text import split_lines


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code (exit_codes; 1 when parity fails)."""
    return exit_codes.run(report_command, argv)


def report_command(argv: list[str] | None = None) -> int:
    parser = parsing.ArgumentParser(prog="jaxformer-parity",
                                    description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=parsing.path,
                        help="checkpoint directory (config.json + model.safetensors)")
    parser.add_argument("--sentences", type=parsing.path,
                        help="text file, one source sentence per line, tokenized with the "
                             "checkpoint's tokenizer (default: random ids)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        help=f"any of {', '.join(DTYPES)} (default: float32 float64)")
    parser.add_argument("--device", choices=("cpu", "gpu"),
                        help="where both frameworks run (default: JAX's default backend, "
                             "torch on CUDA when it sees a GPU)")
    parser.add_argument("--batch-size", type=int, default=2,
                        help="without --sentences: rows of the random batch (default: "
                             "%(default)s)")
    parser.add_argument("--src-len", type=int, default=9,
                        help="without --sentences: the random batch's source length in tokens, "
                             "at most the model's max_len (default: %(default)s)")
    parser.add_argument("--tgt-len", type=int, default=7,
                        help="without --sentences: the random batch's target length in tokens, "
                             "at most the model's max_len (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="without --sentences: seeds the random batch (default: "
                             "%(default)s)")
    parser.add_argument("--tol32", type=float, default=DEFAULT_TOLERANCE["float32"],
                        help="float32: the largest |difference| a tensor may show between the "
                             "frameworks (default: %(default)g)")
    parser.add_argument("--tol64", type=float, default=DEFAULT_TOLERANCE["float64"],
                        help="float64: the largest |difference| a tensor may show (default: "
                             "%(default)g)")
    args = parser.parse_args(argv)
    config, _ = checkpoint_dir.load_dir(args.checkpoint)
    if args.sentences:
        text = Path(args.sentences).read_bytes()
        lines = [line.strip() for line in split_lines(text, f"--sentences {args.sentences}")
                 if line.strip()]
        if not lines:
            raise InputError(f"{args.sentences} has no sentences")
        src, tgt = sentence_batch(args.checkpoint, config, lines)
        what = f"{len(lines)} sentence(s) from {args.sentences}"
    else:
        src, tgt = generated_batch(config, args.batch_size, args.src_len, args.tgt_len,
                                   args.seed)
        what = f"generated, seed {args.seed}"
    dtypes = [d for item in args.dtypes for d in item.split(",") if d]  # "a,b" works too
    reports = run(args.checkpoint, dtypes, src=src, tgt=tgt, device=args.device,
                  tolerances={"float32": args.tol32, "float64": args.tol64})
    lengths = {"encoder_decoder": f"src {src.shape[1]} / tgt {tgt.shape[1]}",
               "encoder_only": f"{src.shape[1]}", "decoder_only": f"{tgt.shape[1]}"}
    print_reports(reports, f"checkpoint {args.checkpoint} ({config.architecture}): batch "
                           f"{src.shape[0]} x {lengths[config.architecture]} tokens ({what})")
    ok = all(r.ok for r in reports)
    print("\nparity: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
