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
from jax_transformer.port import ctranslate2
from jax_transformer.port.fairseq import convert_hf_fsmt, convert_hf_m2m100
from jax_transformer.port.hf_export import export_hf_marian
from jax_transformer.port.marian import convert_hf_marian
from jax_transformer.port.options import default, fields, flag, types
from jax_transformer.port.ours import convert_jax_orbax, convert_torch_reference
from jax_transformer.port.reading import PortError, read_mapping
from jax_transformer.port.torch_nn import TorchNNMapping, convert_torch_nn_transformer
from jax_transformer.port.torch_nn_encoder import TorchNNEncoderMapping, convert_torch_nn_encoder

# The torch.nn sources' mappings: their fields are the flags (dashed), with help and defaults.
TORCH_NN_SPECS = {"torch-nn-transformer": TorchNNMapping, "torch-nn-encoder": TorchNNEncoderMapping}
# --from NAME: the converter, given the parsed flags; it writes OUT and returns the config.
IMPORTS = {
    "hf-marian": lambda args: convert_hf_marian(args.src, args.out),
    "hf-fsmt": lambda args: convert_hf_fsmt(args.src, args.out),
    "hf-m2m100": lambda args: convert_hf_m2m100(args.src, args.out),
    "torch-nn-transformer": lambda args: convert_torch_nn_transformer(args.src, args.out,
                                                                      torch_nn_spec(args)),
    "torch-nn-encoder": lambda args: convert_torch_nn_encoder(args.src, args.out,
                                                              torch_nn_spec(args)),
    "torch-reference": lambda args: convert_torch_reference(args.src, args.out, args.config,
                                                            args.tokenizer),
    "jax-orbax": lambda args: convert_jax_orbax(args.src, args.out, args.step, args.tokenizer),
}
# --to NAME: the exporter, given our checkpoint directory and OUT; returns what it wrote.
def to_marian(src: str, out: str) -> str:
    config, tokenizer = export_hf_marian(src, out)
    return f"(Marian, tokenizer {tokenizer}): {config}"


def to_ctranslate2(src: str, out: str) -> str:
    return f"(CTranslate2, tokenizer copied): {ctranslate2.export_ctranslate2(src, out)}"


EXPORTS = {"hf-marian": to_marian, ctranslate2.TARGET: to_ctranslate2}


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
    g = parser.add_argument_group("torch-reference / jax-orbax")
    g.add_argument("--config", type=parsing.path,
                   help="torch-reference: our config.json for the state dict")
    g.add_argument("--tokenizer", type=parsing.path,
                   help="a SentencePiece model to copy as tokenizer.model")
    g.add_argument("--step", type=int, help="jax-orbax: the step to restore (default: latest)")
    add_torch_nn_arguments(parser.add_argument_group(
        "torch-nn-transformer and torch-nn-encoder (flags override --mapping; defaults follow "
        "torch.nn and the PyTorch translation / language-modelling tutorials)"))
    return parser


def add_torch_nn_arguments(g) -> None:
    """The torch.nn sources' flags: where their tensors are (the mapping) and what the
    state dict cannot say (heads, activation, norms, positions, special ids)."""
    g.add_argument("--mapping", type=parsing.path, help="JSON file with any of the mapping fields: "
                   + "; ".join(f"{source}: {', '.join(fields(mapping))}"
                               for source, mapping in TORCH_NN_SPECS.items()))
    add_option_flags(g, TORCH_NN_SPECS)


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
    each one's default: "(default: X)", or "(default: X; FORMAT: Y)" where they differ."""
    first = fields(next(iter(taking.values())))[name]
    text = f"{', '.join(taking)}: {first.metadata['help']}" if some else first.metadata["help"]
    said = {source: default_text(fields(options)[name]) for source, options in taking.items()}
    if len(set(said.values())) == 1:
        return text if first_value(said) is None else f"{text} (default: {first_value(said)})"
    parts = [value if i == 0 else f"{source}: {value}"
             for i, (source, value) in enumerate(said.items()) if value is not None]
    return f"{text} (default: {'; '.join(parts)})"


def first_value(said: dict):
    return next(iter(said.values()))


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
        print(f"wrote {args.out} {EXPORTS[args.target](args.src, args.out)}")
    else:
        print(f"wrote {args.out}: {IMPORTS[args.source](args)}")
    return 0


def torch_nn_spec(args: argparse.Namespace) -> dict:
    """--mapping's fields, overridden by flags; a flag of the other torch.nn source is
    an error rather than ignored."""
    fields_here = fields(TORCH_NN_SPECS[args.source])
    for other, other_mapping in TORCH_NN_SPECS.items():
        given = [field for name, field in fields(other_mapping).items()
                 if name not in fields_here and getattr(args, name) is not None]
        if other != args.source and given:
            raise PortError(", ".join(flag(field) for field in given)
                            + f" belong(s) to --from {other}, not --from {args.source}")
    spec = read_mapping(args.mapping) if args.mapping else {}
    for name in fields_here:
        if getattr(args, name, None) is not None:
            spec[name] = getattr(args, name)
    return spec


if __name__ == "__main__":
    sys.exit(main())
