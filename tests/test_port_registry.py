"""jaxformer-port names no format: the registry's promises, for every format it lists.
Each option of a format is a flag that reaches its converter, a field several formats
share is one flag, and --help says each format's default."""

import re
import typing

import pytest

from jax_transformer.commands import port as port_command
from jax_transformer.port import EXPORTS, IMPORTS, OPTION_GROUPS
from jax_transformer.port.options import fields, flag, types


def test_every_format_with_options_is_in_one_group_and_names_are_unique():
    formats = [*IMPORTS.values(), *EXPORTS.values()]
    for format in formats:
        groups = [group for group in OPTION_GROUPS if format in group.formats]
        assert len(groups) == (1 if format.options else 0), format.name
    assert len({f.name for f in IMPORTS.values()}) == len(IMPORTS)


def sample(field, annotation) -> tuple[list[str], object]:
    """A command line's words that give `field` a value, and the value."""
    choices = field.metadata["custom_args"].get("choices")
    if annotation is bool:
        return [flag(field)], True
    if typing.get_origin(annotation) is list:
        return [flag(field), "a", flag(field), "b"], ["a", "b"]
    value = {int: 3, float: 0.5}.get(annotation, choices[0] if choices else "x")
    return [flag(field), str(value)], value


@pytest.mark.parametrize("name", [name for name, f in IMPORTS.items() if f.options])
def test_each_option_of_a_format_is_a_flag_that_reaches_its_converter(name):
    source = IMPORTS[name]
    argv, expected = ["--from", name, "src", "out"], {}
    for field_name, field in fields(source.options).items():
        words, expected[field_name] = sample(field, types(source.options)[field_name])
        argv += words
    args = port_command.build_parser().parse_args(argv)
    assert port_command.given(args, source) == expected
    assert port_command.given(port_command.build_parser().parse_args(argv[:4]), source) == {}


def test_a_field_several_formats_take_is_one_flag_with_one_help_and_type():
    for group in OPTION_GROUPS:
        seen = {}
        for format in group.formats:
            for name, field in fields(format.options).items():
                said = (field.metadata["help"], field.metadata["flag"],
                        field.metadata["custom_args"], types(format.options)[name])
                assert seen.setdefault(name, said) == said, (format.name, name)


def test_help_says_each_formats_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside "torch-nn-encoder"
    with pytest.raises(SystemExit):
        port_command.main(["--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    for said in ("(default: generator; torch-nn-encoder: linear)", "(default: 512; "
                 "torch-nn-encoder: the position table's rows, 512 without one)",
                 "torch-nn-encoder: token embedding module or key (default: embedding)",
                 "jax-orbax: the step to restore (default: latest)",
                 "--transformer-prefix TRANSFORMER torch-nn-transformer: the nn.Transformer's "
                 "module prefix (default: found in the state dict)"):
        assert said in text
