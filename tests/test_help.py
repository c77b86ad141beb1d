"""Every command's --help: each flag says what it does."""

import argparse
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def parser_of(script: str, monkeypatch, *flags: str) -> argparse.ArgumentParser:
    """The parser whose help `script [flags] --help` prints, caught as it prints."""
    shown = []
    monkeypatch.setattr(argparse.ArgumentParser, "print_help",
                        lambda parser, file=None: shown.append(parser))
    module, _, function = SCRIPTS[script].partition(":")
    with pytest.raises(SystemExit) as exit:
        getattr(importlib.import_module(module), function)([*flags, "--help"])
    assert exit.value.code == 0 and len(shown) == 1, script
    return shown[0]


def shown_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An action's help as --help prints it, before wrapping."""
    return parser._get_formatter()._expand_help(action) if action.help else ""


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_flag_of_every_command_has_help(script, monkeypatch):
    parser = parser_of(script, monkeypatch)
    silent = [action.option_strings[0] if action.option_strings else action.dest
              for action in parser._actions
              if not action.help or action.help == argparse.SUPPRESS
              or not shown_help(parser, action).strip()]
    assert not silent, f"{script} --help says nothing of {silent}"
