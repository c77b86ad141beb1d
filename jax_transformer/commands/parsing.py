"""What every command's parser shares: flags spelled out in full, and a bad command line
as one `error: ...` line and one hint, exit code 2.

argparse's own parser prints the whole usage (48 lines for train.py) before
`PROG: error: ...`, and takes any unambiguous prefix of a flag (`--pres` for `--preset`),
which slips past checks that look for a flag by its name.

    ArgumentParser        argparse's, made so; OneLineErrors makes another parser class so
    path(text)            type= for a flag that names a file or directory: refuses ""
    add_sampling_flags    --temperature, --top-k, --top-p, --seed; sampling_from(args) reads them
"""

from __future__ import annotations

import argparse

from transformer_core.generation import Sampling


class OneLineErrors:
    """A mixin for an argparse parser class: no abbreviated flags, one-line errors."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {message}\nsee {self.prog} --help\n")


class ArgumentParser(OneLineErrors, argparse.ArgumentParser):
    """argparse.ArgumentParser with OneLineErrors."""


EMPTY_PATH = "an empty path (an unset shell variable?)"


def path(text: str) -> str:
    """A path flag's value, refused when empty: `--init-from ''` is an unset variable,
    never the current directory or "no path"."""
    if not text:
        raise argparse.ArgumentTypeError(EMPTY_PATH)
    return text


SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "seed")


def add_sampling_flags(p: argparse.ArgumentParser, when: str = "") -> None:
    """The sampling flags of translate and generate, None where not given; `when` starts
    each help ("--sample: ")."""
    p.add_argument("--temperature", type=float, default=None,
                   help=f"{when}sampling temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=None,
                   help=f"{when}sample from the k most likely tokens; 0 = all (default)")
    p.add_argument("--top-p", type=float, default=None,
                   help=f"{when}sample from the smallest set of most likely tokens whose "
                        "probability reaches p; 1 = all (default)")
    p.add_argument("--seed", type=int, default=None, help=f"{when}the draws' seed (default 0)")


def sampling_from(args: argparse.Namespace) -> Sampling:
    """The sampling flags as Sampling, defaults filled in (a SamplingError names a bad one)."""
    return Sampling(temperature=1.0 if args.temperature is None else args.temperature,
                    top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
                    seed=args.seed or 0)
