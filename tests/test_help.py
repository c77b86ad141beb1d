"""Every command's --help: each flag says what it does, and train.py's also its default,
under group headers a user would write."""

import argparse
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
DESCRIPTION_WIDTH = 100  # the source's line limit: a description kept as written fits it


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


def test_every_command_keeps_its_description_as_written(monkeypatch):
    """A description laid out by hand (examples, one per line) comes out as written: a
    `\\` line continuation lost in the source joins two example lines into one."""
    wide = {}
    for script in sorted(SCRIPTS):
        parser = parser_of(script, monkeypatch)
        if issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter):
            wide[script] = [line for line in (parser.description or "").splitlines()
                            if len(line) > DESCRIPTION_WIDTH]
    assert "jaxformer-train" in wide, "train.py's examples are no longer kept as written"
    assert not any(wide.values()), f"--help runs lines together: {wide}"


def test_train_help_shows_each_default_under_readable_headers(monkeypatch):
    parser = parser_of("jaxformer-train", monkeypatch)
    switches = (argparse._HelpAction, argparse._StoreTrueAction)
    without = [action.option_strings[0] for action in parser._actions
               if action.default is not None and not isinstance(action, switches)
               and "(default: " not in shown_help(parser, action)]
    assert not without, f"jaxformer-train --help shows no default for {without}"
    text = parser.format_help()
    assert "Settings" not in text and "['" not in text, "simple_parsing's group titles"
    for title in ("data:", "model:", "training:"):
        assert f"\n{title}\n" in text, title
    assert "[--quiet | --no-quiet]" in parser.format_usage(), "a switch, not --quiet [bool]"
    maybe = [action.option_strings[0] for action in parser._actions if action.nargs == "?"]
    assert not maybe, f"{maybe} take a value or none: `--init-from` alone would mean no DIR"


def test_train_help_shows_the_defaults_the_command_line_chose(monkeypatch):
    """--preset base and --task lm change other flags' defaults; --help shows those."""
    parser = parser_of("jaxformer-train", monkeypatch, "--preset", "base", "--task", "lm")
    text = " ".join(parser.format_help().split())
    assert "--d-model D_MODEL model width: embeddings and every sublayer output " \
           "(default: 512)" in text
    assert "--steps STEPS optimizer updates in total; --task lm defaults to 400 " \
           "(default: 400)" in text
