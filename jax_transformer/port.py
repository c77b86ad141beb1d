"""Convert checkpoints trained elsewhere into our checkpoint directory.

    python -m jax_transformer.port --from hf-marian          SRC_DIR   OUT_DIR
    python -m jax_transformer.port --from torch-nn-transformer MODEL.pt OUT_DIR --num-heads 8 ...
    python -m jax_transformer.port --from torch-reference    MODEL.pt  OUT_DIR --config config.json
    python -m jax_transformer.port --from jax-orbax          WORKDIR/checkpoints OUT_DIR [--step N]

Every converter builds a TransformerConfig and a dict of torch-named numpy
tensors and writes them with `interchange.save_dir`, which checks every key and
shape. Source values we cannot express are errors (PortError), never a quietly
different model. Pickled weights are read with `torch.load(weights_only=True)`,
so a checkpoint cannot run code; safetensors need no torch at all.

Marian (Hugging Face MarianMTModel) is the paper's post-LN model with silu
("swish"), half-split sinusoids, sqrt(d_model) embedding scaling, shared
embeddings, a tied output projection and a `final_logits_bias`. Its tokenizer is
source.spm / target.spm plus vocab.json (piece -> model id; the model ids are NOT
the SentencePiece ids); those files are copied next to our checkpoint and read
by `MarianTokenizer` below.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jax_transformer import interchange
from jax_transformer.config import ConfigError, TransformerConfig

SOURCES = ("hf-marian", "torch-nn-transformer", "torch-reference", "jax-orbax")
MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json",
                          "tokenizer_config.json", "special_tokens_map.json")


class PortError(ValueError):
    """The source checkpoint cannot be converted faithfully; the message says why."""


# ------------------------------------------------------------------ reading weights

def read_weights(path: str | Path) -> dict[str, np.ndarray]:
    """A flat {name: numpy array} from .safetensors or a pickled torch state dict.

    Pickles are opened with `torch.load(weights_only=True)`: tensors and plain
    containers only, no code. A dict wrapping the state dict under "state_dict"
    or "model" is unwrapped.
    """
    path = Path(path)
    if not path.is_file():
        raise PortError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        import safetensors.numpy
        try:
            return dict(safetensors.numpy.load_file(path))
        except (TypeError, ValueError):  # e.g. bfloat16, which numpy lacks: go through torch
            import safetensors.torch
            return {k: _torch_to_numpy(v) for k, v in safetensors.torch.load_file(path).items()}
    obj = _torch_load(path)
    if isinstance(obj, Mapping):
        for wrapper in ("state_dict", "model"):
            if isinstance(obj.get(wrapper), Mapping):
                obj = obj[wrapper]
                break
    if not isinstance(obj, Mapping):
        raise PortError(f"{path} holds a {type(obj).__name__}, not a state dict")
    tensors = {}
    for key, value in obj.items():
        if not hasattr(value, "detach"):
            raise PortError(f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor")
        tensors[key] = _torch_to_numpy(value)
    return tensors


def _torch_load(path: Path):
    try:
        import torch
    except ImportError as e:
        raise PortError(f"reading {path} needs torch (pip install '.[torch]')") from e
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError and friends
        raise PortError(f"cannot read {path} with torch.load(weights_only=True) (pickles that "
                        f"need code to load are refused): {e}") from e


def _torch_to_numpy(tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
        tensor = tensor.float()
    return tensor.numpy().copy()


class _Consumer:
    """Pops source tensors by name and reports the ones nobody asked for."""

    def __init__(self, tensors: Mapping[str, np.ndarray], source: str):
        self.tensors, self.source, self.used = dict(tensors), source, set()

    def __contains__(self, key):
        return key in self.tensors

    def take(self, key: str) -> np.ndarray:
        if key not in self.tensors:
            raise PortError(f"{self.source} has no tensor {key!r}")
        self.used.add(key)
        return self.tensors[key]

    def ignore(self, key: str) -> None:
        self.used.add(key)

    def check_all_used(self, hint: str = "") -> None:
        left = sorted(set(self.tensors) - self.used)
        if left:
            raise PortError(f"{self.source} has tensors this converter does not understand: "
                            f"{', '.join(left[:10])}" + (f" (+{len(left) - 10} more)"
                                                         if len(left) > 10 else "") + hint)


# ------------------------------------------------------------------ Hugging Face Marian

MARIAN_ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}


def marian_config(hf: Mapping[str, Any]) -> TransformerConfig:
    """Map a Hugging Face MarianConfig (config.json as a dict) to ours, or raise PortError."""
    def get(name, default=None):
        value = hf.get(name, default)
        return default if value is None else value

    def require(condition, message):
        if not condition:
            raise PortError(f"unsupported Marian config: {message}")

    require(get("model_type") == "marian", f"model_type is {hf.get('model_type')!r}, not 'marian'")
    archs = get("architectures", [])
    require(all(a in ("MarianMTModel", "MarianModel") for a in archs),
            f"architectures {archs} (only MarianMTModel / MarianModel are encoder-decoders)")
    act = get("activation_function", "gelu")
    require(act in MARIAN_ACTIVATIONS, f"activation_function {act!r}; supported: "
            f"{sorted(MARIAN_ACTIVATIONS)} (gelu means exact erf GELU)")
    for flag, ok in (("normalize_before", False), ("normalize_embedding", False),
                     ("add_final_layer_norm", False), ("add_bias_logits", False),
                     ("static_position_embeddings", True)):
        require(get(flag, ok) == ok, f"{flag}={hf.get(flag)!r} (Marian's MarianMTModel needs {ok})")
    require(get("encoder_attention_heads", 16) == get("decoder_attention_heads", 16),
            "encoder_attention_heads != decoder_attention_heads")
    require(get("encoder_ffn_dim", 4096) == get("decoder_ffn_dim", 4096),
            "encoder_ffn_dim != decoder_ffn_dim")
    eps = get("layer_norm_eps", 1e-5)
    require(eps == 1e-5, f"layer_norm_eps={eps!r}: MarianMTModel ignores it and uses torch's "
            "1e-5, so the checkpoint's meaning is ambiguous")
    share = bool(get("share_encoder_decoder_embeddings", True))
    vocab = get("vocab_size", 58101)
    decoder_vocab = get("decoder_vocab_size", vocab)
    require(not share or decoder_vocab == vocab,
            f"share_encoder_decoder_embeddings with decoder_vocab_size {decoder_vocab} != "
            f"vocab_size {vocab}")
    pad = get("pad_token_id")
    require(pad is not None, "pad_token_id is missing")
    eos = get("eos_token_id", 0)
    if isinstance(eos, list):
        require(len(eos) == 1, f"eos_token_id {eos} (one end token expected)")
        eos = eos[0]
    dropout = float(get("dropout", 0.1))
    for name in ("attention_dropout", "activation_dropout", "encoder_layerdrop",
                 "decoder_layerdrop"):
        if float(get(name, 0.0)) not in (0.0, dropout):
            warnings.warn(f"Marian {name}={hf[name]} is not expressed (our model uses one "
                          f"dropout rate, {dropout}); this affects training only", stacklevel=2)
    try:
        return TransformerConfig(
            src_vocab_size=vocab, tgt_vocab_size=vocab if share else decoder_vocab,
            d_model=get("d_model", 1024), num_heads=get("encoder_attention_heads", 16),
            d_ff=get("encoder_ffn_dim", 4096), num_encoder_layers=get("encoder_layers", 12),
            num_decoder_layers=get("decoder_layers", 12), dropout=dropout,
            max_len=get("max_position_embeddings", 1024), pad_id=pad,
            bos_id=get("decoder_start_token_id", pad), eos_id=eos,
            pre_norm=False, final_norm=False, activation=MARIAN_ACTIVATIONS[act],
            layer_norm_eps=1e-5, scale_embeddings=bool(get("scale_embedding", False)),
            position_layout="half_split", share_embeddings=share,
            tie_output=bool(get("tie_word_embeddings", True)), output_bias=True)
    except ConfigError as e:
        raise PortError(f"Marian config maps to an invalid config: {e}") from e


def marian_tensors(hf_tensors: Mapping[str, np.ndarray],
                   config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF MarianMTModel / MarianModel state dict -> our torch-named tensors."""
    # MarianMTModel prefixes the body with "model."; a bare MarianModel does not.
    src = {(k[len("model."):] if k.startswith("model.") else k): v for k, v in hf_tensors.items()}
    c = _Consumer(src, "Marian state dict")
    out: dict[str, np.ndarray] = {}

    def linear(hf_name, ours):
        out[f"{ours}.weight"] = c.take(f"{hf_name}.weight")
        out[f"{ours}.bias"] = c.take(f"{hf_name}.bias")

    def attention(hf_name, ours):
        for hf_proj, our_proj in (("q_proj", "W_q"), ("k_proj", "W_k"), ("v_proj", "W_v"),
                                  ("out_proj", "W_o")):
            linear(f"{hf_name}.{hf_proj}", f"{ours}.{our_proj}")

    def embedding(*candidates):  # tied copies may or may not be stored; all must agree
        present = [k for k in candidates if k in c]
        if not present:
            raise PortError(f"Marian state dict has none of {', '.join(candidates)}")
        table = c.take(present[0])
        for k in present[1:]:
            if not np.array_equal(c.take(k), table):
                raise PortError(f"{k} differs from {present[0]}, but the config says they "
                                "are one tied table")
        return table

    if config.share_embeddings:
        out["shared_embed.weight"] = embedding("shared.weight", "encoder.embed_tokens.weight",
                                               "decoder.embed_tokens.weight")
    else:
        out["src_embed.weight"] = embedding("encoder.embed_tokens.weight")
        out["tgt_embed.weight"] = embedding("decoder.embed_tokens.weight")
        if "shared.weight" in c:
            c.ignore("shared.weight")  # unused by MarianModel when not shared
    for stack, n in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        for i in range(n):
            p = f"{stack}.layers.{i}"
            attention(f"{p}.self_attn", f"{p}.self_attn")
            linear(f"{p}.self_attn_layer_norm", f"{p}.self_attn_norm")
            if stack == "decoder":
                attention(f"{p}.encoder_attn", f"{p}.cross_attn")
                linear(f"{p}.encoder_attn_layer_norm", f"{p}.cross_attn_norm")
            linear(f"{p}.fc1", f"{p}.ffn.W_1")
            linear(f"{p}.fc2", f"{p}.ffn.W_2")
            linear(f"{p}.final_layer_norm", f"{p}.ffn_norm")
        # The sinusoidal table is static in Marian; ours is computed, so check they agree.
        key = f"{stack}.embed_positions.weight"
        if key in c:
            _check_marian_positions(c.take(key), config, key)

    target_vocab = config.tgt_vocab_size
    bias = c.take("final_logits_bias") if "final_logits_bias" in c else np.zeros((1, target_vocab))
    bias = np.asarray(bias).reshape(-1)
    embed_dtype = out.get("shared_embed.weight", out.get("tgt_embed.weight")).dtype
    bias = bias.astype(embed_dtype)
    if config.tie_output:
        if "lm_head.weight" in c:  # HF re-ties lm_head to the embedding on load
            head, table = c.take("lm_head.weight"), out.get("shared_embed.weight",
                                                             out.get("tgt_embed.weight"))
            if not np.array_equal(head, table):
                warnings.warn("lm_head.weight differs from the embedding, but "
                              "tie_word_embeddings is true: using the embedding, as "
                              "transformers does", stacklevel=2)
        out["output_bias"] = bias
    else:
        out["output_projection.weight"] = c.take("lm_head.weight")
        out["output_projection.bias"] = bias
    c.check_all_used()
    return out


def _check_marian_positions(table: np.ndarray, config: TransformerConfig, key: str) -> None:
    from jax_transformer.model import sinusoidal_positions  # float64 numpy, no arrays made
    ours = sinusoidal_positions(table.shape[0], config.d_model, "half_split")
    if table.shape != ours.shape:
        raise PortError(f"{key} has shape {table.shape}, expected {ours.shape}")
    diff = float(np.max(np.abs(table.astype(np.float64) - ours)))
    if diff > 1e-5:
        raise PortError(f"{key} is not the half-split sinusoid table (max |diff| {diff:.3g}); "
                        "learned position embeddings are not supported")


def convert_hf_marian(src_dir: str | Path, out_dir: str | Path) -> TransformerConfig:
    src_dir = Path(src_dir)
    if not (src_dir / "config.json").is_file():
        raise PortError(f"{src_dir} has no config.json (expected a Hugging Face Marian directory)")
    hf_config = json.loads((src_dir / "config.json").read_text())
    config = marian_config(hf_config)
    tensors = marian_tensors(_read_hf_weights(src_dir), config)
    interchange.save_dir(out_dir, config, tensors)
    copied = [name for name in MARIAN_TOKENIZER_FILES if (src_dir / name).is_file()]
    for name in copied:
        shutil.copyfile(src_dir / name, Path(out_dir) / name)
    if "vocab.json" in copied:
        MarianTokenizer(out_dir).check_fits(config)
    return config


def _read_hf_weights(src_dir: Path) -> dict[str, np.ndarray]:
    if (src_dir / "model.safetensors").is_file():
        return read_weights(src_dir / "model.safetensors")
    index = src_dir / "model.safetensors.index.json"
    if index.is_file():
        tensors = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            tensors.update(read_weights(src_dir / shard))
        return tensors
    if (src_dir / "pytorch_model.bin").is_file():
        return read_weights(src_dir / "pytorch_model.bin")
    raise PortError(f"{src_dir} has no model.safetensors, model.safetensors.index.json "
                    "or pytorch_model.bin")


class MarianTokenizer:
    """Marian's tokenizer, as copied into a converted checkpoint directory.

    Text is split into pieces by source.spm (target.spm for target text), and each
    piece is looked up in vocab.json (target_vocab.json for the target side when
    the model has separate vocabularies); unknown pieces become <unk>. Source ids
    end with </s>. This matches transformers' MarianTokenizer without its
    optional Moses punctuation normaliser and language-code handling.
    """

    def __init__(self, directory: str | Path):
        import sentencepiece as spm
        directory = Path(directory)
        self.directory = directory
        self.spm = {}
        for side, name in (("source", "source.spm"), ("target", "target.spm")):
            if (directory / name).is_file():
                self.spm[side] = spm.SentencePieceProcessor(model_file=str(directory / name))
        if "source" not in self.spm or not (directory / "vocab.json").is_file():
            raise PortError(f"{directory} has no Marian tokenizer (source.spm + vocab.json)")
        self.spm.setdefault("target", self.spm["source"])
        self.vocab = {"source": json.loads((directory / "vocab.json").read_text())}
        target_vocab = directory / "target_vocab.json"
        self.vocab["target"] = (json.loads(target_vocab.read_text()) if target_vocab.is_file()
                                else self.vocab["source"])
        for vocab in self.vocab.values():
            for piece in ("</s>", "<unk>", "<pad>"):
                if piece not in vocab:
                    raise PortError(f"{directory}: vocab has no {piece!r}")
        self.eos_id, self.unk_id = self.vocab["source"]["</s>"], self.vocab["source"]["<unk>"]
        self.pad_id = self.vocab["source"]["<pad>"]
        self.pieces = {side: {i: p for p, i in v.items()} for side, v in self.vocab.items()}

    @staticmethod
    def is_present(directory: str | Path) -> bool:
        return (Path(directory) / "source.spm").is_file() and (Path(directory) / "vocab.json").is_file()

    def encode(self, text: str, side: str = "source") -> list[int]:
        """Text -> model ids + [</s>]."""
        vocab = self.vocab[side]
        unk = vocab["<unk>"]
        return [vocab.get(p, unk) for p in self.spm[side].encode(text, out_type=str)] + [vocab["</s>"]]

    def decode(self, ids, side: str = "target") -> str:
        pieces = []
        for i in ids:
            piece = self.pieces[side].get(int(i), "<unk>")
            if piece == "</s>":
                break
            if piece != "<pad>":
                pieces.append(piece)
        return self.spm[side].decode_pieces(pieces)

    def check_fits(self, config: TransformerConfig) -> None:
        for side, size in (("source", config.src_vocab_size), ("target", config.tgt_vocab_size)):
            largest = max(self.vocab[side].values())
            if largest >= size:
                raise PortError(f"{side} vocab has id {largest}, model vocabulary is {size}")
        if (self.pad_id, self.eos_id) != (config.pad_id, config.eos_id):
            raise PortError(f"vocab.json has <pad>={self.pad_id}, </s>={self.eos_id}; the model "
                            f"config has pad_id={config.pad_id}, eos_id={config.eos_id}")


# ------------------------------------------------------------------ torch.nn.Transformer

TORCH_NN_DEFAULTS: dict[str, Any] = {
    # Where the wrapper keeps its tensors (module prefixes or full ".weight" keys).
    "transformer": None,  # prefix of the nn.Transformer; found automatically when None
    "src_embed": "src_embed",
    "tgt_embed": "tgt_embed",  # same as src_embed for a shared table
    "output": "generator",  # an nn.Linear; the tgt_embed name for a tied projection
    "ignore": [],  # key prefixes to drop (e.g. a positional-encoding buffer)
    # What the state dict cannot say: the wrapper's forward and nn.Transformer's args.
    "num_heads": None,  # required
    "activation": "relu",  # nn.Transformer's default
    "norm_first": False,  # nn.Transformer's default (post-LN)
    "layer_norm_eps": 1e-5,
    "scale_embeddings": True,  # embedding * sqrt(d_model), as in the PyTorch tutorial
    "position_layout": "interleaved",
    "max_len": 512,
    "dropout": 0.1,
    "pad_id": 0, "bos_id": 2, "eos_id": 3,
}


def torch_nn_transformer_tensors(sd: Mapping[str, np.ndarray], spec: Mapping[str, Any]
                                 ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """A state dict of a model wrapping torch.nn.Transformer -> (our config, our tensors).

    nn.Transformer packs Q, K, V into one `in_proj_weight` (3D, D), rows in that
    order; they are split here. Its norm1/norm2/norm3 are our self-attn, cross-attn
    (decoder) and FFN norms; it always has a final LayerNorm after each stack.
    Biases that the source lacks (bias=False) become zeros.
    """
    spec = {**TORCH_NN_DEFAULTS, **{k: v for k, v in spec.items() if v is not None}}
    unknown = sorted(set(spec) - set(TORCH_NN_DEFAULTS))
    if unknown:
        raise PortError(f"unknown torch-nn-transformer mapping field(s): {', '.join(unknown)}")
    if spec["num_heads"] is None:
        raise PortError("--num-heads is required: nn.Transformer's nhead is not in the state dict")
    prefix = spec["transformer"]
    if prefix is None:
        hits = [k[: -len("encoder.layers.0.self_attn.in_proj_weight")] for k in sd
                if k.endswith("encoder.layers.0.self_attn.in_proj_weight")
                and not k.endswith("decoder.layers.0.self_attn.in_proj_weight")]
        if len(hits) != 1:
            raise PortError("cannot find one nn.Transformer in the state dict (looked for "
                            f"'*encoder.layers.0.self_attn.in_proj_weight', found {len(hits)}); "
                            "name it with --transformer-prefix")
        prefix = hits[0]
    elif prefix and not prefix.endswith("."):
        prefix += "."
    ignore = tuple(spec["ignore"])
    c = _Consumer({k: v for k, v in sd.items() if not (ignore and k.startswith(ignore))},
                  "torch.nn.Transformer state dict")
    t = lambda name: f"{prefix}{name}"  # noqa: E731

    def count(stack):
        n = 0
        while t(f"{stack}.layers.{n}.self_attn.in_proj_weight") in c:
            n += 1
        return n

    n_enc, n_dec = count("encoder"), count("decoder")
    if not n_enc or not n_dec:
        raise PortError(f"no encoder/decoder layers under {prefix!r}")
    w = c.tensors[t("encoder.layers.0.self_attn.in_proj_weight")]
    d = w.shape[1]
    dtype = w.dtype
    out: dict[str, np.ndarray] = {}

    def bias_or_zeros(key, n):
        return c.take(key) if key in c else np.zeros((n,), dtype)

    def linear(src, ours):
        out[f"{ours}.weight"] = weight = c.take(f"{src}.weight")
        out[f"{ours}.bias"] = bias_or_zeros(f"{src}.bias", weight.shape[0])

    def norm(src, ours):
        out[f"{ours}.weight"] = c.take(f"{src}.weight")
        out[f"{ours}.bias"] = bias_or_zeros(f"{src}.bias", d)

    def attention(src, ours):
        for separate in ("q_proj_weight", "k_proj_weight", "v_proj_weight", "bias_k", "bias_v"):
            if f"{src}.{separate}" in c:
                raise PortError(f"{src}.{separate}: attention with kdim/vdim != d_model or "
                                "add_bias_kv is not supported")
        in_w = c.take(f"{src}.in_proj_weight")  # (3D, D): rows are Q, then K, then V
        in_b = bias_or_zeros(f"{src}.in_proj_bias", 3 * d)
        for j, name in enumerate(("W_q", "W_k", "W_v")):
            out[f"{ours}.{name}.weight"] = in_w[j * d:(j + 1) * d]
            out[f"{ours}.{name}.bias"] = in_b[j * d:(j + 1) * d]
        linear(f"{src}.out_proj", f"{ours}.W_o")

    for i in range(n_enc):
        s, o = t(f"encoder.layers.{i}"), f"encoder.layers.{i}"
        attention(f"{s}.self_attn", f"{o}.self_attn"); norm(f"{s}.norm1", f"{o}.self_attn_norm")
        linear(f"{s}.linear1", f"{o}.ffn.W_1"); linear(f"{s}.linear2", f"{o}.ffn.W_2")
        norm(f"{s}.norm2", f"{o}.ffn_norm")
    for i in range(n_dec):
        s, o = t(f"decoder.layers.{i}"), f"decoder.layers.{i}"
        attention(f"{s}.self_attn", f"{o}.self_attn"); norm(f"{s}.norm1", f"{o}.self_attn_norm")
        attention(f"{s}.multihead_attn", f"{o}.cross_attn")
        norm(f"{s}.norm2", f"{o}.cross_attn_norm")
        linear(f"{s}.linear1", f"{o}.ffn.W_1"); linear(f"{s}.linear2", f"{o}.ffn.W_2")
        norm(f"{s}.norm3", f"{o}.ffn_norm")
    norm(t("encoder.norm"), "encoder.final_norm")
    norm(t("decoder.norm"), "decoder.final_norm")

    strip = lambda name: name[: -len(".weight")] if name.endswith(".weight") else name  # noqa
    src_name, tgt_name, out_name = strip(spec["src_embed"]), strip(spec["tgt_embed"]), strip(spec["output"])
    src_table = c.take(f"{src_name}.weight")
    tgt_table = c.take(f"{tgt_name}.weight")
    share = src_name == tgt_name or (src_table.shape == tgt_table.shape
                                     and np.array_equal(src_table, tgt_table))
    if share:
        out["shared_embed.weight"] = src_table
    else:
        out["src_embed.weight"], out["tgt_embed.weight"] = src_table, tgt_table
    head = c.take(f"{out_name}.weight")
    has_bias = f"{out_name}.bias" in c
    # Tied when named so, or when the weights are equal (then tying computes the same).
    tie = out_name == tgt_name or (head.shape == tgt_table.shape and np.array_equal(head, tgt_table))
    if tie:
        if has_bias:
            out["output_bias"] = c.take(f"{out_name}.bias")
    else:
        out["output_projection.weight"] = head
        if has_bias:
            out["output_projection.bias"] = c.take(f"{out_name}.bias")
    c.check_all_used(hint="; name them in the mapping (src_embed, tgt_embed, output) or drop "
                          "them with --ignore PREFIX")
    try:
        config = TransformerConfig(
            src_vocab_size=src_table.shape[0], tgt_vocab_size=tgt_table.shape[0], d_model=d,
            num_heads=int(spec["num_heads"]), d_ff=out["encoder.layers.0.ffn.W_1.weight"].shape[0],
            num_encoder_layers=n_enc, num_decoder_layers=n_dec, dropout=float(spec["dropout"]),
            max_len=int(spec["max_len"]), pad_id=int(spec["pad_id"]), bos_id=int(spec["bos_id"]),
            eos_id=int(spec["eos_id"]), pre_norm=bool(spec["norm_first"]), final_norm=True,
            activation=spec["activation"], layer_norm_eps=float(spec["layer_norm_eps"]),
            scale_embeddings=bool(spec["scale_embeddings"]),
            position_layout=spec["position_layout"], share_embeddings=share, tie_output=tie,
            output_bias=has_bias)
    except ConfigError as e:
        raise PortError(f"torch.nn.Transformer mapping gives an invalid config: {e}") from e
    return config, out


def convert_torch_nn_transformer(src: str | Path, out_dir: str | Path,
                                 spec: Mapping[str, Any]) -> TransformerConfig:
    config, tensors = torch_nn_transformer_tensors(read_weights(src), spec)
    interchange.save_dir(out_dir, config, tensors)
    return config


# ------------------------------------------------------------------ our own formats

def convert_torch_reference(src: str | Path, out_dir: str | Path,
                            config_path: str | Path | None = None,
                            tokenizer: str | Path | None = None) -> TransformerConfig:
    """A torch.save'd torch_reference state dict (or {"config": dict, "state_dict": ...})."""
    config = None
    if config_path is not None:
        config = TransformerConfig.from_json(config_path)
    else:
        obj = _torch_load(Path(src)) if Path(src).suffix != ".safetensors" else None
        if isinstance(obj, Mapping) and isinstance(obj.get("config"), Mapping):
            config = TransformerConfig.from_dict(dict(obj["config"]))
    if config is None:
        raise PortError("--config config.json is required: the state dict does not carry one")
    tensors = read_weights(src)
    tensors.pop("config", None)
    try:
        interchange.save_dir(out_dir, config, tensors, tokenizer=tokenizer)
    except interchange.CheckpointError as e:
        raise PortError(str(e)) from e
    return config


def convert_jax_orbax(src: str | Path, out_dir: str | Path, step: int | None = None,
                      tokenizer: str | Path | None = None) -> TransformerConfig:
    """A training checkpoint written by train.py (orbax, under WORKDIR/checkpoints)."""
    from jax_transformer.checkpointing import restore_model, run_directory
    try:
        model = restore_model(src, step=step)
    except FileNotFoundError as e:
        raise PortError(str(e)) from e
    if tokenizer is None:  # the run's own tokenizer, when it has one
        tokenizer = interchange.tokenizer_path(run_directory(src))
    model.save_pretrained(out_dir, tokenizer=tokenizer)
    return model.config


# ------------------------------------------------------------------ CLI

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jax_transformer.port",
        description="Convert a checkpoint into our directory format (config.json + "
                    "model.safetensors). Then check it: python -m jax_transformer.parity OUT_DIR")
    parser.add_argument("--from", dest="source", choices=SOURCES, required=True)
    parser.add_argument("src", help="hf-marian: a directory; torch-*: a .pt/.bin/.safetensors "
                                    "state dict; jax-orbax: the checkpoints directory")
    parser.add_argument("out", help="output checkpoint directory")
    g = parser.add_argument_group("torch-reference / jax-orbax")
    g.add_argument("--config", help="torch-reference: our config.json for the state dict")
    g.add_argument("--tokenizer", help="a SentencePiece model to copy as tokenizer.model")
    g.add_argument("--step", type=int, help="jax-orbax: the step to restore (default: latest)")
    g = parser.add_argument_group(
        "torch-nn-transformer (flags override --mapping; defaults follow torch.nn.Transformer "
        "and the PyTorch translation tutorial)")
    g.add_argument("--mapping", help="JSON file with any of: " + ", ".join(TORCH_NN_DEFAULTS))
    g.add_argument("--transformer-prefix", dest="transformer")
    g.add_argument("--src-embed", help="source embedding module or key (default src_embed)")
    g.add_argument("--tgt-embed", help="target embedding module or key (default tgt_embed)")
    g.add_argument("--output", help="output nn.Linear (default generator); the target "
                                    "embedding's name if tied")
    g.add_argument("--ignore", action="append", help="drop keys with this prefix (repeatable)")
    g.add_argument("--num-heads", type=int)
    g.add_argument("--activation", choices=("relu", "gelu", "silu"))
    g.add_argument("--norm-first", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--layer-norm-eps", type=float)
    g.add_argument("--scale-embeddings", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--position-layout", choices=("interleaved", "half_split"))
    g.add_argument("--max-len", type=int)
    g.add_argument("--dropout", type=float)
    g.add_argument("--pad-id", type=int)
    g.add_argument("--bos-id", type=int)
    g.add_argument("--eos-id", type=int)
    args = parser.parse_args(argv)

    try:
        if args.source == "hf-marian":
            config = convert_hf_marian(args.src, args.out)
        elif args.source == "torch-nn-transformer":
            spec = json.loads(Path(args.mapping).read_text()) if args.mapping else {}
            for name in TORCH_NN_DEFAULTS:
                if getattr(args, name, None) is not None:
                    spec[name] = getattr(args, name)
            config = convert_torch_nn_transformer(args.src, args.out, spec)
        elif args.source == "torch-reference":
            config = convert_torch_reference(args.src, args.out, args.config, args.tokenizer)
        else:
            config = convert_jax_orbax(args.src, args.out, args.step, args.tokenizer)
    except (PortError, ConfigError, interchange.CheckpointError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
