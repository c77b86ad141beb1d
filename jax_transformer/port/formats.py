"""The registry of jaxformer-port's formats: IMPORTS (--from NAME) and EXPORTS (--to
NAME), each a Format its converter module declares (its name, convert(src, out,
options) and the dataclass of its options), and OPTION_GROUPS, the formats whose flags
--help shows together. A format listed here is a choice of the command, and its
options' fields are flags: the command itself names no format.
"""

from __future__ import annotations

from jax_transformer.port import (ctranslate2, fairseq, hf_export, marian, own_checkpoints,
                                  torch_nn, torch_nn_encoder)
from jax_transformer.port.options import Format, OptionGroup


def by_name(*formats: Format) -> dict[str, Format]:
    return {f.name: f for f in formats}


IMPORTS = by_name(marian.FORMAT, fairseq.FSMT_FORMAT, fairseq.M2M100_FORMAT, torch_nn.FORMAT,
                  torch_nn_encoder.FORMAT, own_checkpoints.TORCH_REFERENCE,
                  own_checkpoints.JAX_ORBAX)
EXPORTS = by_name(hf_export.FORMAT, ctranslate2.FORMAT)
OPTION_GROUPS = (
    OptionGroup("torch-reference / jax-orbax",
                (own_checkpoints.TORCH_REFERENCE, own_checkpoints.JAX_ORBAX)),
    OptionGroup("torch-nn-transformer and torch-nn-encoder (flags override --mapping; "
                "defaults follow torch.nn and the PyTorch translation / language-modelling "
                "tutorials)", (torch_nn.FORMAT, torch_nn_encoder.FORMAT),
                mapping=True, exclusive=True),
)


def group_of(format: Format) -> OptionGroup | None:
    """The option group `format` is in, if any."""
    return next((group for group in OPTION_GROUPS if format in group.formats), None)
