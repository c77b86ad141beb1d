"""What every command's parser shares: flags spelled out in full, and a bad command line
as one `error: ...` line and one hint, exit code 2.

argparse's own parser prints the whole usage (48 lines for train.py) before
`PROG: error: ...`, and takes any unambiguous prefix of a flag (`--pres` for `--preset`),
which slips past checks that look for a flag by its name.

    ArgumentParser        argparse's, made so; OneLineErrors makes another parser class so
    path(text)            type= for a flag that names a file or directory: refuses ""
"""

from __future__ import annotations

import argparse


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
