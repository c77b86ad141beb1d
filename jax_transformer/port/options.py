"""What a converter module declares about itself: its format (the NAME of --from / --to
NAME, and the function that converts), and its options as a dataclass whose fields
are jaxformer-port's flags, each with its help and default written once.

    Format        name, convert(src, out, options), options (a dataclass or None)
    OptionGroup   formats whose flags --help shows together; a --mapping file; exclusive
    option(...)   an options field: default, help, argparse options (train.settings' keys)
    like(cls, n)  the field `n` of another options dataclass, perhaps with another default
    defaults(cls), types(cls), flag(field)   what the converters and the command read

The fields' metadata uses train.settings.fields.setting's keys ("help", "custom_args": argparse
options such as choices or action) and adds "flag" (a flag name other than --NAME),
"unset" (what None means: "found in the state dict") and "path" (a file's name, never
empty), so that one helper, jax_transformer.commands.parsing.add_field_flag, makes the
flags of both.
"""

from __future__ import annotations

import dataclasses
import types as builtin_types
import typing
from typing import Any, Callable, Mapping

# convert(SRC, OUT, options) -> an import's config (jaxformer-port prints its summary()
# after "wrote OUT: "), or what an export wrote, in words, printed after "wrote OUT ".
# `options` holds the format's flags that were given, by field name.
Converter = Callable[[str, str, Mapping[str, Any]], Any]
KEEP = object()  # like(): the field's own default


@dataclasses.dataclass(frozen=True)
class Format:
    """One NAME of jaxformer-port --from NAME or --to NAME."""
    name: str
    convert: Converter
    options: type | None = None  # a dataclass of option() fields: this format's flags


@dataclasses.dataclass(frozen=True)
class OptionGroup:
    """Formats whose flags --help shows under `title`. `mapping`: they also read a
    --mapping JSON file, whose fields the flags override. `exclusive`: a flag that only
    another format of the group takes is an error, not ignored."""
    title: str
    formats: tuple[Format, ...]
    mapping: bool = False
    exclusive: bool = False


def option(default: Any = None, help: str = "", *, flag: str | None = None,
           unset: str | None = None, path: bool = False, factory=None, **argparse_options):
    """An options field: its default, its help, and for its flag: a name other than
    --NAME (`flag`), what None means (`unset`), whether it names a file (`path`), and
    argparse options (choices, action)."""
    metadata = {"help": help, "custom_args": dict(argparse_options), "flag": flag,
                "unset": unset, "path": path}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def like(cls: type, name: str, default: Any = KEEP, *, unset: str | None = None):
    """`cls`'s options field `name` (its help, flag and argparse options), with
    `default` (and `unset`, what None means) when given: one flag, two formats."""
    field = fields(cls)[name]
    metadata = dict(field.metadata)
    if default is not KEEP:
        metadata["unset"] = unset
        return dataclasses.field(default=default, metadata=metadata)
    if field.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=field.default_factory, metadata=metadata)
    return dataclasses.field(default=field.default, metadata=metadata)


def fields(cls: type) -> dict[str, dataclasses.Field]:
    """An options dataclass's fields by name, in their order."""
    return {field.name: field for field in dataclasses.fields(cls)}


def default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def defaults(cls: type) -> dict[str, Any]:
    """Each field's default, by name, in the fields' order (a fresh list for a list)."""
    return {name: default(field) for name, field in fields(cls).items()}


def types(cls: type) -> dict[str, Any]:
    """Each field's type, None left out (`int | None` is int: None means the default),
    for reading.check_field_types and the flags' types."""
    found = {}
    for name, annotation in typing.get_type_hints(cls).items():
        if typing.get_origin(annotation) in (typing.Union, builtin_types.UnionType):
            kept = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = kept[0] if len(kept) == 1 else typing.Union[tuple(kept)]
        found[name] = annotation
    return found


def flag(field: dataclasses.Field) -> str:
    """The flag that sets `field`: --NAME with dashes, or its own."""
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")
