"""What the parity tests share: config variants, model pairs with copied weights,
test batches, comparisons, the Flax model's gradients, and the models the port tests
convert (transformers' Marian, FSMT and M2M100 with random weights, their tokenizers).
Imported by tests and by benchmarks/bench_init_from.py; fixtures live in conftest.py.

JAX runs on its default backend (JAX_PLATFORMS=cpu forces the CPU); torch on
PARITY_TORCH_DEVICE, by default CUDA when torch sees a GPU, else the CPU.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
import torch
from flax import nnx

from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from jax_transformer import model as flax_models
from jax_transformer.commands import port as port_command
from jax_transformer.pretrained import load_torch_state_dict, to_torch_state_dict
from jax_transformer.scanned import per_layer_state, scan_layers
from jax_transformer.train import step as jax_training
from torch_reference import model as torch_models

# Small models covering every variant the config can express. dropout > 0 so
# that eval mode is really exercised.
BASE = TransformerConfig(src_vocab_size=37, tgt_vocab_size=37, d_model=32, num_heads=4, d_ff=48,
                         num_encoder_layers=2, num_decoder_layers=2, dropout=0.1, max_len=64)
CONFIGS = {
    "post_ln": BASE,
    "post_ln_final_norm": BASE.replace(final_norm=True),
    "pre_ln": BASE.replace(pre_norm=True),
    "pre_ln_final_norm": BASE.replace(pre_norm=True, final_norm=True),
    "untied": BASE.replace(tie_output=False),
    "untied_bias": BASE.replace(tie_output=False, output_bias=True),
    "tied_bias": BASE.replace(output_bias=True),
    "unshared": BASE.replace(share_embeddings=False, tie_output=False, tgt_vocab_size=41),
    "unshared_tied": BASE.replace(share_embeddings=False, tgt_vocab_size=29),
    "gelu": BASE.replace(activation="gelu"),
    "silu_half_split": BASE.replace(activation="silu", position_layout="half_split",
                                    output_bias=True),
    "unscaled_eps": BASE.replace(scale_embeddings=False, layer_norm_eps=1e-6),
    "odd_width": BASE.replace(d_model=15, num_heads=3, d_ff=23),
    "odd_width_half_split": BASE.replace(d_model=21, num_heads=7, d_ff=11,
                                         position_layout="half_split"),
    # fairseq sinusoids, read from row pad_id + 1 on (FSMT: post-LN, separate vocabularies,
    # untied; M2M100: pre-LN with final norms, shared and tied)
    "fsmt_like": BASE.replace(position_layout="fairseq", position_offset=2, pad_id=1,
                              share_embeddings=False, tie_output=False, tgt_vocab_size=41),
    "m2m100_like": BASE.replace(position_layout="fairseq", position_offset=2, pad_id=1,
                                pre_norm=True, final_norm=True),
    "odd_width_fairseq": BASE.replace(d_model=15, num_heads=3, d_ff=23, position_layout="fairseq",
                                      position_offset=5),
    "one_layer": BASE.replace(num_encoder_layers=1, num_decoder_layers=1),
    "three_layers": BASE.replace(num_encoder_layers=3, num_decoder_layers=3, pre_norm=True,
                                 final_norm=True),
    "learned_positions": BASE.replace(position_encoding="learned", position_offset=2),
    "no_positions": BASE.replace(position_encoding="none", pre_norm=True),
}
# The single-stack architectures, in the variants torch.nn-based models use.
ENCODER_ONLY = BASE.replace(architecture="encoder_only", num_encoder_layers=3)
DECODER_ONLY = BASE.replace(architecture="decoder_only", num_decoder_layers=3)
SINGLE_STACK_CONFIGS = {
    "encoder_only": ENCODER_ONLY,
    "encoder_only_pre_ln_learned": ENCODER_ONLY.replace(
        pre_norm=True, final_norm=True, position_encoding="learned", tie_output=False,
        output_bias=True),
    "encoder_only_no_positions_gelu": ENCODER_ONLY.replace(
        position_encoding="none", activation="gelu", scale_embeddings=False),
    "decoder_only": DECODER_ONLY,
    "decoder_only_pre_ln_untied": DECODER_ONLY.replace(
        pre_norm=True, final_norm=True, tie_output=False, output_bias=True),
    "decoder_only_learned_half_split": DECODER_ONLY.replace(
        position_encoding="learned", position_offset=3, activation="silu"),
    "decoder_only_no_positions": DECODER_ONLY.replace(position_encoding="none"),
    "decoder_only_fairseq_odd_width": DECODER_ONLY.replace(
        d_model=15, num_heads=3, d_ff=23, position_layout="fairseq", position_offset=2,
        pad_id=1),
}
DIRECTIONS = ("flax_to_torch", "torch_to_flax")
TORCH_DEVICE = torch.device(os.environ.get("PARITY_TORCH_DEVICE")
                            or ("cuda" if torch.cuda.is_available() else "cpu"))


def to_torch(array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A numpy (or JAX) array as a torch tensor on TORCH_DEVICE."""
    return torch.as_tensor(np.asarray(array), dtype=dtype, device=TORCH_DEVICE)


# The Flax model's layer stacks run as a loop or as one scan (jax_transformer/scanned.py).
SCANNING = [pytest.param(False, id="loop"), pytest.param(True, id="scan")]


def number_sentences(count: int) -> list[str]:
    """`count` English number words, none of them special (the built-in corpus's source side)."""
    from num2words import num2words
    rng = np.random.default_rng(29)
    return [num2words(int(n)) for n in rng.choice(10_000, size=count, replace=False)]


def fast_tier(values, fast) -> list:
    """`values` as pytest parameters, all but those in `fast` marked slow: the fast
    tier (pytest -m "not slow") keeps a few cases of each check, the full suite all."""
    return [pytest.param(v, marks=() if v in fast else pytest.mark.slow) for v in values]

DTYPES = {"float32": (jnp.float32, torch.float32), "float64": (jnp.float64, torch.float64)}


def skip_unless_float64() -> None:
    """Skip (with the reason) where a framework's device has no float64."""
    if jax.default_backend() == "tpu":
        pytest.skip("TPUs have no float64: JAX would compute these cases in float32")
    if TORCH_DEVICE.type == "mps":
        pytest.skip("torch's MPS backend has no float64")


@contextlib.contextmanager
def precision(name: str):
    """float64 needs jax_enable_x64 before any array is made; scope it to the test."""
    if name == "float64":
        skip_unless_float64()
    with jax.enable_x64(name == "float64"):
        yield DTYPES[name]


# Weight matrices and embeddings are random at init already; biases and LayerNorm
# parameters start at constants (0 / 1), so a mis-copied one would go unseen. Noise
# on those vectors only keeps activations at init scale: the float32 bounds are
# absolute, and each side's own float32 error is ~2e-7 of the logits' magnitude.
def perturb_flax(model: flax_models.TokenModel, seed: int) -> None:
    """Add noise to every bias and LayerNorm parameter."""
    params = nnx.state(model, nnx.Param)
    key = jax.random.key(seed)
    for i, (_, variable) in enumerate(nnx.to_flat_state(params)):
        value = variable.get_value()
        if value.ndim != 1:
            continue
        noise = jax.random.normal(jax.random.fold_in(key, i), value.shape, value.dtype)
        variable.set_value(value + 0.1 * noise)
    nnx.update(model, params)


def perturb_torch(model: torch_models.TokenModel, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def build_pair(config: TransformerConfig, direction: str, dtypes, seed: int = 0,
               scan: bool = False):
    """A Flax model in eval mode and a torch model in eval mode with the same weights,
    initialised on one side and copied to the other. `scan`: the Flax model's layer
    stacks scanned (jax_transformer/scanned.py) before the weights are copied."""
    jax_dtype, torch_dtype = dtypes
    flax_model = flax_models.build_model(config, rngs=nnx.Rngs(seed), dtype=jax_dtype,
                                         param_dtype=jax_dtype)
    torch.manual_seed(seed)
    torch_model = torch_models.build_model(config).to(torch_dtype)
    if direction == "flax_to_torch":
        perturb_flax(flax_model, seed)
        if scan:
            scan_layers(flax_model)
        state_dict = {k: torch.from_numpy(v) for k, v in to_torch_state_dict(flax_model).items()}
        torch_model.load_state_dict(state_dict)
    else:
        if scan:
            scan_layers(flax_model)
        perturb_torch(torch_model, seed)
        load_torch_state_dict(flax_model, torch_model.state_dict())
    torch_model.to(TORCH_DEVICE)
    return nnx.view(flax_model, deterministic=True), torch_model.eval()


def make_batches(config: TransformerConfig, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(src, tgt_in) id batches: padded with unequal lengths, batch size 1, length 1."""
    rng = np.random.default_rng(seed)

    def ids(vocab, shape):
        return rng.integers(4, vocab, size=shape)

    src = ids(config.src_vocab_size, (3, 9))
    src[0, 5:] = config.pad_id
    src[1, 2:] = config.pad_id
    tgt = ids(config.tgt_vocab_size, (3, 6))
    tgt[:, 0] = config.bos_id
    tgt[0, 4:] = config.pad_id
    tgt[2, 1:] = config.pad_id
    return {
        "padded": (src, tgt),
        "batch1": (ids(config.src_vocab_size, (1, 5)), ids(config.tgt_vocab_size, (1, 7))),
        "len1": (ids(config.src_vocab_size, (2, 1)), ids(config.tgt_vocab_size, (2, 1))),
    }


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_close(actual, expected, atol: float, what: str) -> None:
    actual, expected = to_numpy(actual), to_numpy(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)) and np.all(np.isfinite(expected)), f"{what}: not finite"
    diff = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64)),
                        initial=0.0))
    assert diff <= atol, f"{what}: max |diff| {diff:.3g} > {atol:g}"


def flax_params(model) -> dict[str, np.ndarray]:
    """A Flax model's parameters as torch-named numpy arrays, copied."""
    from jax_transformer.pretrained import to_torch_state_dict
    return {k: v.copy() for k, v in to_torch_state_dict(model).items()}


def assert_bit_exact(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert x.dtype == y.dtype, key
        np.testing.assert_array_equal(x, y, err_msg=key)


def jax_gradients(flax_model, batch, smoothing):
    """d(mean loss)/d(param) for every parameter, torch-named and torch-laid-out."""
    inputs = jax_training.model_inputs({k: jnp.asarray(v) for k, v in batch.items()},
                                       flax_model.config.architecture)

    def loss(model):
        logits = model(**inputs)
        loss_sum, tokens = jax_training.label_smoothed_cross_entropy(
            logits, jnp.asarray(batch["tgt_out"]), model.config.pad_id, smoothing)
        return loss_sum / tokens
    grads = nnx.grad(loss)(flax_model)
    out = {}
    for path, g in nnx.to_flat_state(per_layer_state(grads)):
        key, transpose = checkpoint_dir.flax_path_to_torch_key(path)
        g = np.asarray(g.get_value())
        out[key] = g.T if transpose else g
    return out


# ------------------------------------------------------------------ converted checkpoints
# The models the port tests convert are built here with random weights, nothing
# downloaded. transformers is imported where it is used: the test modules that use
# these builders skip without it.

MARIAN_PAD, MARIAN_EOS = 99, 0  # Marian: pad (= decoder start) is the last id, eos is 0


def perturb_(model: torch.nn.Module, scale: float = 0.1, seed: int = 0) -> None:
    """Random values everywhere (HF inits biases to 0, LayerNorm to 1, final_logits_bias
    to 0), so a wrongly mapped bias, norm or bias buffer cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "pos" in name or not t.is_floating_point():  # sinusoid tables stay exact
                continue
            t.add_(scale * torch.randn(t.shape, generator=g, dtype=t.dtype))


def source_batch(vocab: int, pad: int, eos: int, seed: int = 0):
    """(2, 8) source ids: row 1 is right-padded; no special ids inside the text."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, vocab - 2, size=(2, 8))
    src[src == pad] = 5
    src[src == eos] = 6
    src[0, -1] = eos
    src[1, 5], src[1, 6:] = eos, pad
    return src


def target_batch(vocab: int, bos: int, seed: int = 1):
    tgt = np.random.default_rng(seed).integers(1, vocab - 2, size=(2, 6))
    tgt[:, 0] = bos
    return tgt


def load_ours(directory, dtype: str):
    """A converted checkpoint directory in both of our frameworks, in eval mode."""
    flax_model = nnx.view(flax_models.Transformer.from_pretrained(
        directory, param_dtype=jnp.dtype(dtype)), deterministic=True)
    torch_model = torch_models.Transformer.from_pretrained(
        directory, dtype=getattr(torch, dtype), device=TORCH_DEVICE).eval()
    return flax_model, torch_model


def our_logits(flax_model, torch_model, src, tgt):
    """(Flax's, torch_reference's) logits, as numpy arrays."""
    flax_out = np.asarray(flax_model(jnp.asarray(src, jnp.int32), jnp.asarray(tgt, jnp.int32)))
    with torch.no_grad():
        torch_out = to_numpy(torch_model(to_torch(src), to_torch(tgt)))
    return flax_out, torch_out


def marian_config(**overrides):
    """A small transformers MarianConfig, opus-mt's layout unless `overrides` change it."""
    import transformers
    values = dict(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                  decoder_ffn_dim=64, activation_function="swish", scale_embedding=True,
                  max_position_embeddings=64, pad_token_id=MARIAN_PAD,
                  decoder_start_token_id=MARIAN_PAD, eos_token_id=MARIAN_EOS,
                  forced_eos_token_id=MARIAN_EOS, dropout=0.1)
    values.update(overrides)
    return transformers.MarianConfig(**values)


def make_marian(tmp_path, weights="safetensors", **overrides):
    """A random MarianMTModel (perturbed) saved in tmp_path/marian: model.safetensors, or
    with weights="bin" an old-style pytorch_model.bin; -> the model, on TORCH_DEVICE, and
    its directory."""
    import transformers
    torch.manual_seed(0)
    model = transformers.MarianMTModel(marian_config(**overrides)).eval()
    model.config._attn_implementation = "eager"
    perturb_(model)
    src_dir = tmp_path / "marian"
    if weights == "safetensors":
        model.save_pretrained(src_dir)
    else:  # an old-style pytorch_model.bin: every key, tied copies and positions included
        src_dir.mkdir()
        model.config.to_json_file(src_dir / "config.json")
        torch.save(model.state_dict(), src_dir / "pytorch_model.bin")
    return model.to(TORCH_DEVICE), src_dir


def load_hf(directory):
    """MarianMTModel.from_pretrained, asserting that every key was expected and present."""
    import transformers
    model, info = transformers.MarianMTModel.from_pretrained(
        directory, output_loading_info=True, attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def write_lines(path, lines) -> str:
    """`lines` written to `path`, one a line; -> the path, as a flag's value."""
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


# FSMT and M2M100, fairseq's models as transformers has them. fairseq's dictionary:
# <s> 0, <pad> 1, </s> 2; decoding starts with eos.
FAIRSEQ_PAD, FAIRSEQ_EOS = 1, 2
# The languages of the tokenizers built here: FSMT's pair, M2M100's and NLLB's codes.
LANGS = {"fsmt": ("en", "de"), "m2m100": ("en", "fr"), "nllb": ("eng_Latn", "fra_Latn")}
FSMT_MERGES = 200  # BPE merges learned for an FSMT tokenizer


def fairseq_config(family: str, **overrides):
    """A small transformers FSMTConfig (family "fsmt") or M2M100Config ("m2m100")."""
    import transformers
    sizes = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                 max_position_embeddings=64, dropout=0.1)
    if family == "fsmt":
        values = dict(langs=["en", "de"], src_vocab_size=100, tgt_vocab_size=110,
                      tie_word_embeddings=False, **sizes)
        return transformers.FSMTConfig(**{**values, **overrides})
    values = dict(vocab_size=100, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
                  attention_dropout=0.1, **sizes)
    return transformers.M2M100Config(**{**values, **overrides})


def make_fairseq(tmp_path, family: str, **overrides):
    """A random transformers model of `family` (perturbed) saved in tmp_path/FAMILY;
    -> the model, on TORCH_DEVICE, and its directory."""
    import transformers
    torch.manual_seed(0)
    cls = (transformers.FSMTForConditionalGeneration if family == "fsmt"
           else transformers.M2M100ForConditionalGeneration)
    model = cls(fairseq_config(family, **overrides)).eval()
    model.config._attn_implementation = "eager"
    perturb_(model)  # every parameter but the sinusoid tables
    src_dir = tmp_path / family
    model.save_pretrained(src_dir)
    return model.to(TORCH_DEVICE), src_dir


def convert_fairseq(family: str, src_dir, out_dir) -> TransformerConfig:
    """`jaxformer-port --from hf-FAMILY SRC_DIR OUT_DIR`; -> the converted model's config."""
    assert port_command.main(["--from", f"hf-{family}", str(src_dir), str(out_dir)]) == 0
    return TransformerConfig.from_json(out_dir / "config.json")


def fairseq_batch(src_vocab: int, tgt_vocab: int, seed: int = 0):
    """Right-padded (3, 9) sources (a language-code-like first token, eos last) and
    (3, 7) teacher-forced targets starting with eos, right-padded too."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, src_vocab, size=(3, 9))
    src[:, 0] = src_vocab - 1  # M2M100 puts the source language code first; a token here
    for row, length in enumerate((9, 6, 3)):
        src[row, length - 1], src[row, length:] = FAIRSEQ_EOS, FAIRSEQ_PAD
    tgt = rng.integers(3, tgt_vocab, size=(3, 7))
    tgt[:, 0] = FAIRSEQ_EOS
    tgt[1, 5:], tgt[2, 2:] = FAIRSEQ_PAD, FAIRSEQ_PAD
    return src, tgt


def spm_model(path, sentences: list[str]):
    """A SentencePiece BPE model of 120 pieces learned on `sentences`, written to `path`."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                   vocab_size=120, model_type="bpe", character_coverage=1.0,
                                   minloglevel=2)
    path.write_bytes(model.getvalue())
    return spm.SentencePieceProcessor(model_file=str(path))


def hf_fairseq_tokenizer(tmp_path, family: str, sentences: list[str]):
    """transformers' tokenizer for `family` ("m2m100" or "nllb"; SentencePiece learned on
    `sentences`), saved in a directory of its own; -> it and that directory."""
    import transformers
    src, tgt = LANGS[family]
    work = tmp_path / f"{family}-tok"
    work.mkdir()
    sp = spm_model(work / "sentencepiece.bpe.model", sentences)
    if family == "m2m100":
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for i in range(sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
        (work / "vocab.json").write_text(json.dumps(vocab))
        tok = transformers.M2M100Tokenizer(work / "vocab.json", work / "sentencepiece.bpe.model",
                                           src_lang=src, tgt_lang=tgt)
    else:
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES
        tok = transformers.NllbTokenizer.from_pretrained(
            work, src_lang=src, tgt_lang=tgt, extra_special_tokens=FAIRSEQ_LANGUAGE_CODES)
    return tok, work


def learn_merges(sentences: list[str], count: int) -> list[tuple[str, str]]:
    """fastBPE-style merges on Moses tokens: the most frequent pair first (ties: the
    larger pair), each word's last symbol carrying "</w>"."""
    import sacremoses
    moses = sacremoses.MosesTokenizer(LANGS["fsmt"][0])
    words = Counter(tuple(w[:-1]) + (w[-1] + "</w>",) for s in sentences
                    for w in moses.tokenize(s, aggressive_dash_splits=True, escape=True))
    merges = []
    for _ in range(count):
        pairs = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda pair: (pairs[pair], pair))
        merges.append(best)
        merged = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


def write_bpe_files(directory, sentences: list[str], gaps: bool = True):
    """merges.txt, vocab-src.json and vocab-tgt.json (fairseq's specials 0-3 first), BPE
    learned on `sentences`; `gaps`: every 7th symbol left out of the target's."""
    directory.mkdir()
    merges = learn_merges(sentences, FSMT_MERGES)
    symbols = sorted({a for pair in merges for a in pair} | {a + b for a, b in merges})
    specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocabs = {"src": {**specials, **{s: 4 + i for i, s in enumerate(symbols)}},
              "tgt": {**specials, **{s: 4 + i for i, s in enumerate(
                  s for n, s in enumerate(reversed(symbols)) if n % 7 or not gaps)}}}
    (directory / "merges.txt").write_text("".join(f"{a} {b}\n" for a, b in merges))
    for side, vocab in vocabs.items():
        (directory / f"vocab-{side}.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return vocabs


def hf_fsmt_tokenizer(directory, reverse: bool = False, do_lower_case: bool = False):
    """transformers' FSMTTokenizer on the files in `directory`; `reverse`: target first."""
    import transformers
    langs = LANGS["fsmt"]
    sides = ("tgt", "src") if reverse else ("src", "tgt")
    return transformers.FSMTTokenizer(
        langs=list(langs[::-1] if reverse else langs), do_lower_case=do_lower_case,
        src_vocab_file=str(directory / f"vocab-{sides[0]}.json"),
        tgt_vocab_file=str(directory / f"vocab-{sides[1]}.json"),
        merges_file=str(directory / "merges.txt"))
