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
from jax_transformer.port.ours import convert_jax_orbax, convert_torch_reference
from jax_transformer.port.reading import PortError
from jax_transformer.port.torch_nn import (TORCH_NN_DEFAULTS, convert_torch_nn_transformer,
                                           read_mapping)
from jax_transformer.port.torch_nn_encoder import (ARCHITECTURES, POSITIONS,
                                                   TORCH_NN_ENCODER_DEFAULTS,
                                                   convert_torch_nn_encoder)

# The torch.nn sources' mapping fields (flags under the same names, dashed).
TORCH_NN_SPECS = {"torch-nn-transformer": TORCH_NN_DEFAULTS,
                  "torch-nn-encoder": TORCH_NN_ENCODER_DEFAULTS}
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
                   + "; ".join(f"{source}: {', '.join(fields)}"
                               for source, fields in TORCH_NN_SPECS.items()))
    g.add_argument("--transformer-prefix", dest="transformer")
    g.add_argument("--src-embed", help="source embedding module or key (default src_embed)")
    g.add_argument("--tgt-embed", help="target embedding module or key (default tgt_embed)")
    g.add_argument("--architecture", choices=ARCHITECTURES,
                   help="torch-nn-encoder, required: decoder_only when the forward passes a "
                        "square subsequent mask (a language model), else encoder_only")
    g.add_argument("--encoder-prefix", dest="encoder",
                   help="torch-nn-encoder: the nn.TransformerEncoder (found when not given)")
    g.add_argument("--embed", help="torch-nn-encoder: token embedding (default embedding)")
    g.add_argument("--positions", choices=POSITIONS,
                   help="torch-nn-encoder: a stored sinusoid table, checked (default); a "
                        "learned one, copied; none")
    g.add_argument("--position-key", help="torch-nn-encoder: the position table's key "
                                          "(default pos_encoder.pe; '' when not stored)")
    g.add_argument("--output", help="output nn.Linear (default generator, torch-nn-encoder: "
                                    "linear); the embedding's name if tied; torch-nn-encoder "
                                    "encoder_only: '' for none")
    g.add_argument("--ignore", action="append", help="drop keys with this prefix (repeatable)")
    g.add_argument("--num-heads", type=int)
    g.add_argument("--activation", choices=("relu", "gelu", "silu"))
    g.add_argument("--norm-first", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--layer-norm-eps", type=float)
    g.add_argument("--scale-embeddings", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--position-layout", choices=("interleaved", "half_split"),
                   help="default interleaved; torch-nn-encoder: the layout its table matches")
    g.add_argument("--max-len", type=int, help="default 512; torch-nn-encoder: the position "
                                               "table's rows")
    g.add_argument("--dropout", type=float)
    g.add_argument("--pad-id", type=int)
    g.add_argument("--bos-id", type=int)
    g.add_argument("--eos-id", type=int)


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
    fields = TORCH_NN_SPECS[args.source]
    for other, other_fields in TORCH_NN_SPECS.items():
        given = [f for f in other_fields if f not in fields and getattr(args, f) is not None]
        if other != args.source and given:
            flags = {"transformer": "transformer-prefix", "encoder": "encoder-prefix"}
            raise PortError(", ".join("--" + flags.get(f, f).replace("_", "-") for f in given)
                            + f" belong(s) to --from {other}, not --from {args.source}")
    spec = read_mapping(args.mapping) if args.mapping else {}
    for name in fields:
        if getattr(args, name, None) is not None:
            spec[name] = getattr(args, name)
    return spec


if __name__ == "__main__":
    sys.exit(main())
