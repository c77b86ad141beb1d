"""Convert checkpoints trained elsewhere into our checkpoint directory, and ours
into Hugging Face Marian and CTranslate2.

    formats.py           the registry: IMPORTS (--from NAME), EXPORTS (--to NAME), OPTION_GROUPS
    options.py           what a converter module declares: its Format, its options' fields
    reading.py           safetensors, torch pickles (weights_only), JSON; TensorConsumer, PortError
    bart_config.py       the config.json of BART's family, which the next two read
    marian.py            Hugging Face Marian / opus-mt
    fairseq.py           Hugging Face FSMT (fairseq WMT19) and M2M100 (also NLLB dense)
    fairseq_tokens.py    their tokenizers (FSMT, M2M100, NLLB), converted
    torch_nn.py          models wrapping torch.nn.Transformer
    torch_nn_encoder.py  models built on torch.nn.TransformerEncoder (language models)
    own_checkpoints.py   our own checkpoints in their other forms: torch_reference state
                         dicts and train.py's orbax checkpoints
    hf_export.py         ours -> a directory transformers' MarianMTModel / MarianTokenizer load
    ctranslate2.py       ours -> a ctranslate2.Translator model directory (CTranslate2's spec API)

Each converter module declares its format: a Format with its name, a function
convert(src, out, options) and the dataclass of its options (torch_nn.py's
TorchNNMapping, for one), whose fields, with their help and defaults, are the flags of
jaxformer-port (jax_transformer/commands/port.py), a command that names no format.
Marian's tokenizer lives in transformer_core.marian_tokenizer.

Every converter builds a TransformerConfig and a dict of torch-named numpy
tensors and writes them with `checkpoint_dir.save_dir`, which checks every key
and shape. Source values we cannot express are errors (PortError), never a
quietly different model. The Marian export is marian.py inverted, with the same
name table (interleaved sinusoids written as the half_split model that computes the
same); a model Marian cannot compute (pre-LN, final norms, fairseq's sinusoids,
LayerNorm eps other than 1e-5) is a PortError naming the field, and so is one a
CTranslate2 Translator cannot (a single stack, post-LN with final norms).
"""

from jax_transformer.port.ctranslate2 import export_ctranslate2
from jax_transformer.port.fairseq import (convert_hf_fsmt, convert_hf_m2m100, fsmt_config,
                                          fsmt_tensors, m2m100_config, m2m100_tensors)
from jax_transformer.port.hf_export import (TARGETS, export_hf_marian, hf_marian_config,
                                            hf_marian_tensors)
from jax_transformer.port.marian import convert_hf_marian, marian_config, marian_tensors
from jax_transformer.port.formats import EXPORTS, IMPORTS, OPTION_GROUPS
from jax_transformer.port.options import Format, OptionGroup
from jax_transformer.port.own_checkpoints import (JaxOrbaxOptions, TorchReferenceOptions,
                                                  convert_jax_orbax, convert_torch_reference)
from jax_transformer.port.reading import PortError, read_weights
from jax_transformer.port.torch_nn import (TORCH_NN_DEFAULTS, TorchNNMapping,
                                           convert_torch_nn_transformer,
                                           torch_nn_transformer_tensors)
from jax_transformer.port.torch_nn_encoder import (TORCH_NN_ENCODER_DEFAULTS,
                                                   TorchNNEncoderMapping,
                                                   convert_torch_nn_encoder,
                                                   detect_scale_embeddings, encoder_spec,
                                                   torch_nn_encoder_tensors)

__all__ = ["EXPORTS", "Format", "IMPORTS", "JaxOrbaxOptions", "OPTION_GROUPS", "OptionGroup",
           "PortError", "TARGETS", "TORCH_NN_DEFAULTS", "TORCH_NN_ENCODER_DEFAULTS",
           "TorchNNEncoderMapping", "TorchNNMapping", "TorchReferenceOptions",
           "convert_hf_fsmt", "convert_hf_m2m100", "convert_hf_marian", "convert_jax_orbax",
           "convert_torch_nn_encoder", "convert_torch_nn_transformer",
           "convert_torch_reference", "detect_scale_embeddings", "encoder_spec",
           "export_ctranslate2", "export_hf_marian", "fsmt_config", "fsmt_tensors",
           "hf_marian_config", "hf_marian_tensors", "m2m100_config", "m2m100_tensors",
           "marian_config", "marian_tensors", "read_weights", "torch_nn_encoder_tensors",
           "torch_nn_transformer_tensors"]
