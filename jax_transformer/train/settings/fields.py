"""How a setting is declared: a frozen dataclass field whose metadata makes its flag
(`--d-model` for `d_model`: its help, other spellings and argparse options) and says
whether a resumed run may change it; the checks the settings groups share."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_origin, get_type_hints

from transformer_core.errors import TrainError


def require(condition: bool, message: str) -> None:
    if not condition:
        raise TrainError(message)


def setting(default: Any = None, help: str = "", *, factory=None, aliases=(),
            resumable: bool = False, **argparse_options):
    """A settings field: its default, its --help text, the flag's other spellings and any
    argparse options (choices, metavar) for the flag generated from it (the metadata
    keys simple_parsing reads). `resumable`: the setting only steers how long or how
    visibly a run goes, so a resumed run may change it; the others must repeat the
    run_args.json a run records."""
    custom_args = dict(argparse_options)
    metadata = {"help": help, "alias": list(aliases), "custom_args": custom_args,
                "resumable": resumable}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The settings that name a file or directory. An empty one is an unset shell variable
# (--init-from "$CKPT"), refused rather than read as none or as the current directory.
PATH_SETTINGS = ("data", "text_path", "src_path", "tgt_path", "columns_path", "dev_src_path",
                 "dev_tgt_path", "test_src_path", "test_tgt_path", "workdir", "init_from",
                 "compile_cache")


def refuse_empty_paths(settings) -> None:
    """A TrainError naming the first of `settings`' PATH_SETTINGS that is ""."""
    for name in PATH_SETTINGS:
        require(getattr(settings, name, None) != "",
                f"{flag(name)} is an empty path (an unset shell variable?)")


def name_metavars(cls) -> None:
    """Each flag of the settings dataclass `cls` shows its value by its field's name
    (--steps STEPS), as argparse shows its own flags; booleans and choices show what
    they take."""
    types = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        custom_args = field.metadata["custom_args"]
        if ("choices" not in custom_args and get_origin(types[field.name]) is not Literal
                and types[field.name] is not bool):
            custom_args.setdefault("metavar", field.name.upper())
