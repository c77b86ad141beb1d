"""What every command's parser shares: flags spelled out in full, and a bad command line
as one `error: ...` line and one hint, exit code 2.

argparse's own parser prints the whole usage (48 lines for train.py) before
`PROG: error: ...`, and takes any unambiguous prefix of a flag (`--pres` for `--preset`),
which slips past checks that look for a flag by its name.

    ArgumentParser        argparse's, made so; OneLineErrors makes another parser class so
    path(text)            type= for a flag that names a file or directory: refuses ""
    add_field_flag        the flag of a settings dataclass field, from the field's metadata
    add_sampling_flags    --temperature, --top-k, --top-p, --seed; sampling_from(args) reads them
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

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


def add_field_flag(p, field: dataclasses.Field, annotation: Any, *, help: str | None = None,
                   default: Any = None) -> None:
    """The flag of a settings dataclass field declared with its help and argparse options
    in its metadata (train.settings.fields.setting, port.options.option): --NAME, or the
    field's own "flag", setting `field.name`; `help` when given, else the field's; the
    type from `annotation`, None left out: a bool has a --no- form, a list is repeatable,
    a "path" field refuses "" (path); then the field's "custom_args" (choices, metavar)."""
    options = dict(field.metadata.get("custom_args", {}))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if annotation is bool:
        options.setdefault("action", argparse.BooleanOptionalAction)
    elif typing.get_origin(annotation) is list:
        options.setdefault("action", "append")
    elif field.metadata.get("path"):
        options["type"] = path
    elif annotation in (int, float, str):
        options["type"] = annotation
    name = field.metadata.get("flag") or "--" + field.name.replace("_", "-")
    p.add_argument(name, dest=field.name, default=default,
                   help=field.metadata["help"] if help is None else help, **options)


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
