"""jaxformer-prepare: read, split, tokenize and encode a corpus once, on every core, into a
directory that train.py --data DIR memory-maps (as fairseq-preprocess does).

    jaxformer-prepare --output data/wmt14 --src-path train.en --tgt-path train.de \\
        --dev-src-path newstest2013.en --dev-tgt-path newstest2013.de \\
        --test-src-path newstest2014.en --test-tgt-path newstest2014.de \\
        --tokenizer-type bpe --vocab-size 32000 --max-len 256
    jaxformer-train --workdir runs/wmt14 --data data/wmt14 --preset base

The flags are train.py's data flags (with no corpus flag, its built-in corpus) and
--seed, which holds out dev and test when they are not given. An --output that is
already the preparation of these flags from these files (where they resolve to today,
with the same contents) is kept; another preparation, or an empty directory, is
replaced, whole, once the new one is complete; anything else is refused (docs/data.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence, get_type_hints

from jax_transformer.commands import exit_codes, parsing
from jax_transformer.data.prepared.pipeline import Encoding, key, prepare, stopped_preparing
from jax_transformer.data.prepared.directory import Prepared
from jax_transformer.train.corpus import corpus
from jax_transformer.train.runtime import signals
from jax_transformer.train.settings.data import PREPARED_FIELDS, DataSettings
from jax_transformer.train.settings.training import MAX_SEED
from transformer_core.errors import InputError, TrainError
from transformer_core.tokenizer import TokenizerError


def build_parser() -> argparse.ArgumentParser:
    """--output, --seed, --workers, --quiet and train.py's data flags, with their help."""
    p = parsing.ArgumentParser(prog="jaxformer-prepare", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, metavar="DIR", type=parsing.path,
                   help="the prepared directory to write (train.py --data DIR)")
    p.add_argument("--seed", type=int, default=0,
                   help="shuffles the corpus before dev and test are held out, and picks the "
                        "tokenizer's sample (train.py's --seed; default %(default)s)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes that encode (default: the cores this process may use)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    fields = {f.name: f for f in dataclasses.fields(DataSettings)}
    types = get_type_hints(DataSettings)
    for name in PREPARED_FIELDS:
        parsing.add_field_flag(p, fields[name], types[name], default=fields[name].default)
    return p


def run(argv: Sequence[str] | None) -> None:
    args = build_parser().parse_args(argv)
    if not 0 <= args.seed <= MAX_SEED:
        raise TrainError(f"--seed must be from 0 to {MAX_SEED}, got {args.seed}")
    if args.workers is not None and args.workers < 1:
        raise TrainError(f"--workers must be at least 1, got {args.workers}")
    data = DataSettings(**{name: getattr(args, name) for name in PREPARED_FIELDS})
    wanted = corpus(data, args.seed)
    encoding = Encoding(max_len=data.max_len, seed=args.seed, vocab_size=data.vocab_size,
                        tokenizer_type=data.tokenizer_type)
    try:
        existing = Prepared(args.output)
    except InputError:
        existing = None
    stale = existing.staleness(key(wanted, encoding)) if existing is not None else None
    if existing is not None and stale is None:
        print(f"{args.output} is already the preparation of these flags from these files; "
              "kept as it is", file=sys.stderr)
        return
    if stale:
        print(f"{args.output}: {stale}; preparing it again", file=sys.stderr)
    try:
        with signals.signal_handlers(signals.exit_at_once(stopped_preparing(args.output))):
            prepare(args.output, wanted, encoding, log=lambda line: print(line, file=sys.stderr),
                    progress=not args.quiet, workers=args.workers)
    except TokenizerError as e:
        raise TrainError(f"--vocab-size {data.vocab_size}: {e}") from None
    print(f"prepared {args.output}: train.py --data {args.output}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code (exit_codes: 2 for bad input)."""
    return exit_codes.run(run, argv)


if __name__ == "__main__":
    sys.exit(main())
