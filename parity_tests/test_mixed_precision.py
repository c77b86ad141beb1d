"""Mixed precision: JAX in bfloat16 against torch under autocast(bfloat16), same weights.

JAX computes in bfloat16 with float32 parameters; torch runs its float32 model
under torch.autocast(bfloat16), as users train. The two round different
operations (autocast keeps the residual stream and LayerNorm in float32, the
Flax model keeps its activations in bfloat16), so they are not compared with
each other. Each side is compared with torch_reference in float64 on the same
weights, and each side's relative RMS error must stay within 2x of the
other's (jax_transformer.numerics.mixed_precision_ok). Measured on CPU, JAX's
error on logits is 1.4-1.8x torch's.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jax_transformer import decoding as jax_decoding
from jax_transformer.model import Transformer as FlaxTransformer
from jax_transformer.pretrained import load_torch_state_dict
from jax_transformer.numerics import mixed_precision_ok, relative_rms_error, rounding_error
from jax_transformer.train.step import label_smoothed_cross_entropy as jax_loss
from parity_tests.helpers import (BASE, CONFIGS, TORCH_DEVICE, build_pair, jax_gradients,
                                  to_numpy, to_torch)
from torch_reference import Transformer as TorchTransformer
from torch_reference import decoding as torch_decoding
from torch_reference import training as torch_training
from torch_reference.training import label_smoothed_cross_entropy as torch_loss

# One per config family: post-/pre-LN, tied/untied output, relu/gelu/silu.
FAMILIES = ["post_ln", "pre_ln_final_norm", "untied_bias", "gelu", "silu_half_split"]


def autocast():
    return torch.autocast(TORCH_DEVICE.type, dtype=torch.bfloat16)


def bfloat16_copy(flax_model: FlaxTransformer) -> FlaxTransformer:
    """The same parameters (float32) in a model that computes in bfloat16."""
    model = FlaxTransformer(flax_model.config, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    nnx.update(model, nnx.state(flax_model, nnx.Param))
    return model


def training_batch(config, seed: int = 0, rows: int = 8, src_len: int = 20, tgt_len: int = 16):
    """Enough tokens that the RMS errors are stable (max errors of a few hundred
    rounding errors vary 2x between seeds); half the rows padded."""
    rng = np.random.default_rng(seed)
    src = rng.integers(4, config.src_vocab_size, (rows, src_len))
    tgt = rng.integers(4, config.tgt_vocab_size, (rows, tgt_len + 1))
    tgt[:, 0] = config.bos_id
    src[::2, src_len // 2:] = config.pad_id
    tgt[::2, tgt_len // 2:] = config.pad_id
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


# Each side gives {"logits", "loss": the label-smoothed loss of every non-pad
# token (one number is too few to compare error levels), "gradients": of the mean
# loss, every parameter's in one vector}, as float64 numpy arrays.

def torch_side(model, batch, smoothing: float = 0.1) -> dict[str, np.ndarray]:
    """Under whatever autocast the caller opened."""
    model.zero_grad(set_to_none=True)
    logits = model(to_torch(batch["src"]), to_torch(batch["tgt_in"]))  # (B, T, V)
    labels = to_torch(batch["tgt_out"])
    loss_sum, tokens = torch_loss(logits, labels, model.config.pad_id, smoothing)
    (loss_sum / tokens).backward()
    real = labels != model.config.pad_id
    token_loss = torch.func.vmap(lambda row, label: torch_loss(
        row[None, None], label[None, None], model.config.pad_id, smoothing)[0])
    with torch.no_grad():
        token_losses = token_loss(logits[real], labels[real])  # (N,)
    return {"logits": to_numpy(logits.detach().double()),
            "loss": to_numpy(token_losses.double()),
            "gradients": np.concatenate([to_numpy(p.grad.double()).ravel()
                                         for _, p in sorted(model.named_parameters())])}


def jax_side(model, batch, smoothing: float = 0.1) -> dict[str, np.ndarray]:
    eval_model = nnx.view(model, deterministic=True)
    logits = eval_model(jnp.asarray(batch["src"]), jnp.asarray(batch["tgt_in"]))  # (B, T, V)
    labels = jnp.asarray(batch["tgt_out"])
    real = np.asarray(labels != model.config.pad_id)
    token_loss = jax.vmap(lambda row, label: jax_loss(row[None, None], label[None, None],
                                                      model.config.pad_id, smoothing)[0])
    grads = jax_gradients(eval_model, batch, smoothing)
    return {"logits": np.asarray(logits, np.float64),
            "loss": np.asarray(token_loss(logits[real], labels[real]), np.float64),
            "gradients": np.concatenate([grads[k].ravel() for k in sorted(grads)])}


def mixed_precision_errors(flax_model, torch_model, batch, reference_model=None):
    """{what: (JAX error, torch error, bfloat16 rounding error)}, each side against
    `reference_model` (default: torch_model) in float64."""
    reference = torch_side(copy.deepcopy(reference_model or torch_model).double(), batch)
    with autocast():
        torch_values = torch_side(torch_model, batch)
    jax_values = jax_side(bfloat16_copy(flax_model), batch)
    return {what: (relative_rms_error(jax_values[what], ref),
                   relative_rms_error(torch_values[what], ref), rounding_error(ref))
            for what, ref in reference.items()}


@pytest.mark.slow  # its first case compiles bfloat16 gradients: ~25 s, a fifth of the fast tier
@pytest.mark.parametrize("name", FAMILIES)
def test_logits_loss_gradients_within_2x(name, direction):
    # Drawn the paper's way. From weight_init "normal"'s N(0, 0.02) JAX's error is
    # 1.9-2.6x torch's here (post_ln logits 0.0065 against 0.0027): each sublayer adds
    # little to a residual stream that the Flax model keeps in bfloat16 and autocast in
    # float32, so the policies' difference, not a port's, decides the ratio.
    config = CONFIGS[name].replace(dropout=0.0, weight_init="xavier")
    batch = training_batch(config)
    flax_model, torch_model = build_pair(config, direction, (jnp.float32, torch.float32))
    for what, (jax_error, torch_error, rounding) in mixed_precision_errors(
            flax_model, torch_model, batch).items():
        assert mixed_precision_ok(jax_error, torch_error, rounding), (
            f"{what}: relative RMS error JAX {jax_error:.3g}, torch {torch_error:.3g} "
            f"(float64 reference; one bfloat16 rounding: {rounding:.3g})")
        assert torch_error > 0, f"{what}: torch autocast changed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("side", ["jax", "torch"])
def test_a_miscopied_weight_fails(side):
    """The check can fail: a classic porting bug on one side, one layer's query and
    key projections swapped, fails every comparison. Drawn the paper's way: from
    N(0, 0.02) the attention is near uniform whichever way round they are, and the loss
    row does not see the swap."""
    config = CONFIGS["pre_ln_final_norm"].replace(dropout=0.0, weight_init="xavier")
    flax_model, torch_model = build_pair(config, "flax_to_torch", (jnp.float32, torch.float32))
    intact = copy.deepcopy(torch_model)
    if side == "jax":
        attention = flax_model.decoder.layers[1].cross_attn
        q, k = attention.W_q.kernel[...], attention.W_k.kernel[...]
        attention.W_q.kernel.set_value(k)
        attention.W_k.kernel.set_value(q)
    else:
        attention = torch_model.decoder.layers[1].cross_attn
        attention.W_q.weight, attention.W_k.weight = attention.W_k.weight, attention.W_q.weight
    for what, errors in mixed_precision_errors(flax_model, torch_model, training_batch(config),
                                               reference_model=intact).items():
        assert not mixed_precision_ok(*errors), (
            f"{what}: a mis-copied weight went unseen (JAX {errors[0]:.3g}, "
            f"torch {errors[1]:.3g}, one rounding {errors[2]:.3g})")


# ------------------------------------------------ decoding a trained model

COPY_CONFIG = BASE.replace(dropout=0.0, max_len=24)


def copy_batch(rng, rows: int):
    """Sentences of 3 to 9 random tokens + eos; the target is the source."""
    src = np.zeros((rows, 10), np.int64)
    tgt = np.zeros((rows, 11), np.int64)
    for row, n in enumerate(rng.integers(3, 10, rows)):
        ids = rng.integers(4, COPY_CONFIG.src_vocab_size, n)
        src[row, :n + 1] = [*ids, COPY_CONFIG.eos_id]
        tgt[row, :n + 2] = [COPY_CONFIG.bos_id, *ids, COPY_CONFIG.eos_id]
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


@pytest.fixture(scope="module")
def trained_model():
    """torch_reference trained for 500 steps (float32) to copy its input: ~94% of
    sentences come out exact. A random model's greedy choices are near-ties that
    any rounding flips; a trained model's are not."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = TorchTransformer(COPY_CONFIG).to(TORCH_DEVICE)
    optimizer, scheduler = torch_training.make_optimizer(
        model, torch_training.paper_schedule(COPY_CONFIG.d_model, 100, scale=2.0))
    for _ in range(500):
        batch = {k: to_torch(v) for k, v in copy_batch(rng, 64).items()}
        torch_training.train_step(model, optimizer, scheduler, [batch], label_smoothing=0.0)
    return model.eval()


@pytest.mark.slow
def test_greedy_tokens_of_a_trained_model_agree(trained_model):
    src = copy_batch(np.random.default_rng(1), 128)["src"]
    flax_model = FlaxTransformer(COPY_CONFIG, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    load_torch_state_dict(flax_model, trained_model.state_dict())
    jax_tokens, _ = jax_decoding.greedy_search(flax_model, src, max_len=12)
    with autocast():
        torch_tokens, _ = torch_decoding.greedy_search(trained_model, src, max_len=12)
    agreement = float(np.mean(np.asarray(jax_tokens) == to_numpy(torch_tokens)))
    assert agreement >= 0.99, f"bfloat16 greedy tokens agree on {agreement:.1%}"
