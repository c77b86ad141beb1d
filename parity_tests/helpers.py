"""What the parity tests share: config variants, model pairs with copied weights,
test batches, comparisons. Imported by tests; fixtures live in conftest.py.

JAX runs on its default backend (JAX_PLATFORMS=cpu forces the CPU); torch on
PARITY_TORCH_DEVICE, by default CUDA when torch sees a GPU, else the CPU.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from transformer_core.config import TransformerConfig
from jax_transformer import model as flax_models
from jax_transformer.pretrained import load_torch_state_dict, to_torch_state_dict
from jax_transformer.scanned import scan_layers
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
