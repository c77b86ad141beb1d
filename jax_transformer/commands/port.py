"""jaxformer-port: convert a checkpoint into our directory format, or
(--to) one of ours into another format.

    jaxformer-port --from hf-marian          SRC_DIR   OUT_DIR
    jaxformer-port --from hf-fsmt            SRC_DIR   OUT_DIR   (fairseq WMT19)
    jaxformer-port --from hf-m2m100          SRC_DIR   OUT_DIR   (M2M100, NLLB dense)
    jaxformer-port --from torch-nn-transformer MODEL.pt OUT_DIR --num-heads 8 ...
    jaxformer-port --from torch-nn-encoder   MODEL.pt  OUT_DIR --num-heads 8 \
        --architecture decoder_only ...                     (nn.TransformerEncoder models)
    jaxformer-port --from torch-reference    MODEL.pt  OUT_DIR --config config.json
    jaxformer-port --from jax-orbax          WORKDIR/checkpoints OUT_DIR [--step N]
    jaxformer-port --to hf-marian            CKPT_DIR  OUT_DIR   (hf_export.py)
    jaxformer-port --to ctranslate2          CKPT_DIR  OUT_DIR   (ctranslate2.py; the serve extra)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jax_transformer.commands import exit_codes, parsing
from jax_transformer.port.formats import EXPORTS, IMPORTS, OPTION_GROUPS, group_of
from jax_transformer.port.options import Format, OptionGroup, default, fields, flag, types
from jax_transformer.port.reading import PortError, read_mapping


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code (exit_codes)."""
    return exit_codes.run(convert, argv)


def build_parser() -> argparse.ArgumentParser:
    """jaxformer-port's command line: the direction, SRC and OUT, and each source's flags."""
    parser = parsing.ArgumentParser(
        prog="jaxformer-port",
        description="Convert a checkpoint into our directory format (config.json + "
                    "model.safetensors), then check it: jaxformer-parity OUT_DIR. "
                    "Or, with --to, export one of our checkpoint directories: --to hf-marian "
                    "writes a directory transformers' MarianMTModel and MarianTokenizer load "
                    "(models Marian cannot compute are refused, naming the config field); "
                    "--to ctranslate2 writes a ctranslate2.Translator model directory with our "
                    "tokenizer beside it (needs pip install 'jax-transformer[serve]').")
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from", dest="source", choices=tuple(IMPORTS),
                           help="convert SRC from this format into our directory format")
    direction.add_argument("--to", dest="target", choices=tuple(EXPORTS),
                           help="export SRC, our checkpoint directory (config.json, "
                                "model.safetensors, tokenizer.model), to this format")
    parser.add_argument("src", type=parsing.path,
                        help="hf-marian: a directory; torch-*: a .pt/.bin/.safetensors "
                             "state dict; jax-orbax: the checkpoints directory; "
                             "--to: our checkpoint directory")
    parser.add_argument("out", type=parsing.path, help="output directory")
    for group in OPTION_GROUPS:
        add_option_group(parser.add_argument_group(group.title), group)
    return parser


def add_option_group(g, group: OptionGroup) -> None:
    """A group's flags: --mapping, when its formats read one, and their options."""
    formats = {f.name: f.options for f in group.formats if f.options is not None}
    if group.mapping:
        g.add_argument("--mapping", type=parsing.path,
                       help="JSON file with any of the mapping fields: "
                            + "; ".join(f"{name}: {', '.join(fields(options))}"
                                        for name, options in formats.items()))
    add_option_flags(g, formats)


def add_option_flags(g, formats: dict[str, type]) -> None:
    """One flag for each field of the formats' options dataclasses (a field several of
    them take is one flag), in an order that keeps each one's, with None as the default:
    a flag not given leaves the field to the format."""
    for name in merged_order([list(fields(options)) for options in formats.values()]):
        taking = {source: options for source, options in formats.items()
                  if name in fields(options)}
        options = next(iter(taking.values()))
        parsing.add_field_flag(g, fields(options)[name], types(options)[name],
                               help=option_help(name, taking, len(taking) < len(formats)))


def option_help(name: str, taking: dict[str, type], some: bool) -> str:
    """The field's help, after the formats that take it when only `some` do, and then
    their default: "(default: X)", or "(default: X; FORMAT: Y)" where they differ."""
    first = fields(next(iter(taking.values())))[name]
    text = f"{', '.join(taking)}: {first.metadata['help']}" if some else first.metadata["help"]
    said = {source: default_text(fields(options)[name]) for source, options in taking.items()}
    values = list(said.values())
    if values.count(values[0]) == len(values):  # one default
        return text if values[0] is None else f"{text} (default: {values[0]})"
    parts = [value if i == 0 else f"{source}: {value}"
             for i, (source, value) in enumerate(said.items()) if value is not None]
    return f"{text} (default: {'; '.join(parts)})"


def default_text(field) -> str | None:
    """How --help says a field's default: None (unsaid) for None without an "unset"
    meaning, and for an empty list."""
    value = default(field)
    if value is None:
        return field.metadata.get("unset")
    if value == []:
        return None
    return "''" if value == "" else str(value)


def merged_order(orders: list[list[str]]) -> list[str]:
    """Every name in `orders`, once, in an order that keeps each list's (where they
    cannot all be kept, the first's)."""
    orders, merged = [list(order) for order in orders], []
    while any(orders):
        heads = [order[0] for order in orders if order]
        name = next((h for h in heads if not any(h in order[1:] for order in orders)), heads[0])
        merged.append(name)
        for order in orders:
            if name in order:
                order.remove(name)
    return merged


def convert(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if Path(args.out).resolve() == Path(args.src).resolve():  # the output replaces OUT whole
        raise PortError(f"the output directory {args.out} is the source: choose another")
    if args.target is not None:
        print(f"wrote {args.out} {EXPORTS[args.target].convert(args.src, args.out, {})}")
    else:
        source = IMPORTS[args.source]
        config = source.convert(args.src, args.out, given(args, source))
        print(f"wrote {args.out}: {config.summary()}")
    return 0


def given(args: argparse.Namespace, source: Format) -> dict:
    """The options of `source` given as flags, over its --mapping file's fields when its
    group reads one; in an exclusive group, a flag that only another format of the
    group takes is an error rather than ignored."""
    if source.options is None:
        return {}
    group, here = group_of(source), fields(source.options)
    for other in group.formats if group and group.exclusive else ():
        flags = [field for name, field in fields(other.options).items()
                 if name not in here and getattr(args, name) is not None]
        if other is not source and flags:
            raise PortError(", ".join(flag(field) for field in flags)
                            + f" belong(s) to --from {other.name}, not --from {source.name}")
    options = read_mapping(args.mapping) if group and group.mapping and args.mapping else {}
    for name in here:
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return options


if __name__ == "__main__":
    sys.exit(main())
