"""jaxformer-natural-corpus: write a synthetic parallel corpus with natural sentence
lengths (jax_transformer.data.natural), for benchmarks and runs by hand.

    jaxformer-natural-corpus --pairs 100000 --out-dir corpus/   # corpus/train.src, train.tgt
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jax_transformer.commands import exit_codes, parsing
from jax_transformer.data.natural import natural_length_corpus
from transformer_core.checkpoint_dir import write_atomically


def write_corpus(argv: Sequence[str] | None) -> None:
    """Write DIR/train.src and DIR/train.tgt, one sentence a line; print their lengths."""
    parser = parsing.ArgumentParser(
        prog="jaxformer-natural-corpus",
        description="Write a synthetic parallel corpus with natural sentence lengths.")
    parser.add_argument("--pairs", type=int, required=True, help="number of sentence pairs")
    parser.add_argument("--seed", type=int, default=0, help="picks the sentences (default 0)")
    parser.add_argument("--out-dir", type=parsing.path, required=True,
                        help="where to write train.src and train.tgt (created if missing)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    pairs = natural_length_corpus(args.pairs, args.seed)
    print(f"{len(pairs)} pairs in {time.perf_counter() - began:.2f} s")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for side, suffix in enumerate(("src", "tgt")):
        path = out_dir / f"train.{suffix}"
        text = "".join(pair[side] + "\n" for pair in pairs)
        write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n"))
        words = np.array([len(pair[side].split()) for pair in pairs])
        print(f"{path}: words per sentence median {np.median(words):g}, "
              f"p90 {np.percentile(words, 90):g}, max {words.max()}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code (exit_codes)."""
    return exit_codes.run(write_corpus, argv)


if __name__ == "__main__":
    sys.exit(main())
