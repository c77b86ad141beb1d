"""Layer-by-layer parity report: one checkpoint, both frameworks, the same batch.

    jaxformer-parity CHECKPOINT_DIR [--sentences FILE]
        [--dtypes float32 float64 bfloat16] [--device cpu|gpu]     (commands/parity.py)

Loads the checkpoint into the Flax model and into torch_reference, runs the
same batch through both one step at a time (embeddings; per layer the
attention weights, the attention sublayer output and the layer output; each
stack's output; logits), and prints max |diff| and relative difference
(max |diff| / max |torch|) for every tensor, in float32 and float64. The first
tensor over the tolerance is flagged; the exit code is 1 when any is, so the
report can gate CI. torch_reference is the reference side. Both run with
pinned numerics (jax_transformer.numerics: float32 is IEEE float32 on every device).

bfloat16 is mixed precision as users train: JAX computes in bfloat16 with
float32 parameters, torch runs its float32 model under
torch.autocast(bfloat16). The two apply bfloat16 to different operations, so
they are not compared with each other elementwise: each is compared with
torch_reference in float64, and a row passes when each side's relative RMS
error is within 2x of the other's (numerics.mixed_precision_ok). The
flagged rows are where one side is much further from exact than the other.

Each framework propagates its own activations, so a row shows the error
accumulated up to that point: the first flagged row is where parity breaks.
The intermediates are recorded from one ordinary forward pass of each model
(torch forward hooks; Flax's nnx.capture of every module's outputs), so the
report checks the models' own code, not a copy of their steps.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Sequence, TextIO

import numpy as np

from transformer_core import checkpoint_dir
from transformer_core.checkpoint_dir import CheckpointError
from transformer_core.config import TransformerConfig
from transformer_core.errors import InputError
from transformer_core.tokenizer import TokenizerError
from jax_transformer.numerics import (MIXED_FACTOR, mixed_precision_ok, pinned_numerics,
                                      relative_rms_error, rounding_error)

DEFAULT_TOLERANCE = {"float32": 1e-4, "float64": 1e-10}
DTYPES = ("float32", "float64", "bfloat16")


@dataclasses.dataclass
class Row:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    rel: float
    ok: bool


@dataclasses.dataclass
class MixedRow:
    """A bfloat16 row: each side's relative RMS error against float64."""
    name: str
    shape: tuple[int, ...]
    jax_error: float
    torch_error: float
    ok: bool


@dataclasses.dataclass
class Report:
    dtype: str
    tolerance: float
    rows: list[Row] | list[MixedRow]
    devices: str = ""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def first_failure(self) -> Row | None:
        return next((r for r in self.rows if not r.ok), None)


# ------------------------------------------------------------------ batches

def generated_batch(config: TransformerConfig, batch_size: int = 2, src_len: int = 9,
                    tgt_len: int = 7, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random source rows of decreasing length (ending in eos, right-padded) and
    target rows starting with bos."""
    rng = np.random.default_rng(seed)
    src_len, tgt_len = min(src_len, config.max_len), min(tgt_len, config.max_len)
    specials = {config.pad_id, config.bos_id, config.eos_id}

    def tokens(vocab, shape):
        ids = rng.integers(0, vocab, size=shape)
        for s in specials:  # move specials to a regular token
            ids = np.where(ids == s, (s + len(specials) + 1) % vocab, ids)
        return ids

    src = tokens(config.src_vocab_size, (batch_size, src_len))
    for b in range(batch_size):
        length = max(2, src_len - 2 * b)
        src[b, length - 1] = config.eos_id
        src[b, length:] = config.pad_id
    tgt = tokens(config.tgt_vocab_size, (batch_size, tgt_len))
    tgt[:, 0] = config.bos_id
    return src.astype(np.int64), tgt.astype(np.int64)


def sentence_batch(directory: str | Path, config: TransformerConfig,
                   sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize with the checkpoint's tokenizer. Source: pieces + eos; target
    (teacher-forced): bos + the same sentence's pieces on the target side."""
    try:
        tok = checkpoint_dir.load_tokenizer(directory)
    except TokenizerError as e:
        raise CheckpointError(f"{e}; or use a generated batch") from None
    src_rows = [tok.encode_source(s) for s in sentences]
    tgt_rows = [[config.bos_id] + tok.encode_target(s) for s in sentences]

    def pad(rows):
        rows = [r[: config.max_len] for r in rows]
        width = max(len(r) for r in rows)
        return np.array([r + [config.pad_id] * (width - len(r)) for r in rows], np.int64)

    return pad(src_rows), pad(tgt_rows)


# ------------------------------------------------------------------ tracing

def traced_outputs(config: TransformerConfig) -> list[tuple[str, str, int, int | None]]:
    """The report's rows, in forward order: (row name, module path, which call of
    that module, which element of its output or None for the whole output). A
    single-stack model has the rows of its one stack (a decoder_only one's without
    cross-attention)."""
    rows = []
    if config.architecture != "decoder_only":
        rows.append(("encoder.embed", "embed", 0, None))
        for i in range(config.num_encoder_layers):
            p = f"encoder.layers.{i}"
            rows += [(f"{p}.self_attn.weights", f"{p}.self_attn", 0, 1),
                     (f"{p}.self_attn.out", f"{p}.self_attn", 0, 0), (f"{p}.out", p, 0, 0)]
        rows.append(("encoder.out", "encoder", 0, 0))
    if config.architecture != "encoder_only":
        after_encoder = int(config.architecture == "encoder_decoder")  # embed's 2nd call
        rows.append(("decoder.embed", "embed", after_encoder, None))
        attentions = (("self_attn", "cross_attn") if config.architecture == "encoder_decoder"
                      else ("self_attn",))
        for i in range(config.num_decoder_layers):
            p = f"decoder.layers.{i}"
            for attn in attentions:
                rows += [(f"{p}.{attn}.weights", f"{p}.{attn}", 0, 1),
                         (f"{p}.{attn}.out", f"{p}.{attn}", 0, 0)]
            rows.append((f"{p}.out", p, 0, 0))
        rows.append(("decoder.out", "decoder", 0, 0))
    return rows + [("logits", "", 0, None)]


def model_inputs(config: TransformerConfig, src: np.ndarray, tgt: np.ndarray) -> tuple:
    """The batch as the model's forward takes it: (src, tgt) for a translator, the
    source rows for an encoder_only model, the target rows (bos first) for a
    decoder_only one."""
    return {"encoder_decoder": (src, tgt), "encoder_only": (src,),
            "decoder_only": (tgt,)}[config.architecture]


def pick(calls: dict, config: TransformerConfig) -> dict:
    """The report's tensors from {module path: [output of each call]}."""
    out = {}
    for name, module, call, element in traced_outputs(config):
        value = calls[module][call]
        out[name] = value if element is None else value[element]
    return out


def trace_jax(directory, dtype: str, src: np.ndarray, tgt: np.ndarray) -> dict[str, np.ndarray]:
    """The report's tensors from one forward pass of the Flax model on JAX's default
    device. bfloat16: bfloat16 compute, float32 parameters."""
    import jax.numpy as jnp
    from flax import nnx

    from jax_transformer.model import from_pretrained
    if dtype == "bfloat16":
        model = from_pretrained(directory, param_dtype=jnp.float32, dtype=jnp.bfloat16)
    else:
        model = from_pretrained(directory, param_dtype=jnp.dtype(dtype))
    model = nnx.view(model, deterministic=True)
    forward = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)
    inputs = [jnp.asarray(ids, jnp.int32) for ids in model_inputs(model.config, src, tgt)]
    _, captured = forward(*inputs)
    # {module path: outputs of its __call__}
    calls = {".".join(map(str, path[:-1] if path[-1] == "__call__" else path)):
             variable.get_value() for path, variable in nnx.to_flat_state(captured)}
    # capture sees methods a class defines itself, not TokenModel.embed: called again
    tables = {"encoder_decoder": (model.source_embedding, model.target_embedding),
              "encoder_only": (model.source_embedding,),
              "decoder_only": (model.target_embedding,)}[model.config.architecture]
    calls["embed"] = [model.embed(table(), ids) for table, ids in zip(tables, inputs)]
    return {k: np.asarray(v) for k, v in pick(calls, model.config).items()}


def trace_torch(directory, dtype: str, src: np.ndarray, tgt: np.ndarray,
                device: str = "cpu") -> dict[str, np.ndarray]:
    """The report's tensors from one forward pass of torch_reference on `device`.
    bfloat16: the float32 model under torch.autocast(bfloat16)."""
    import torch

    from torch_reference.model import from_pretrained
    param_dtype = torch.float32 if dtype == "bfloat16" else getattr(torch, dtype)
    model = from_pretrained(directory, dtype=param_dtype, device=device)
    model.eval()
    calls: dict[str, list] = {}
    hooks = [module.register_forward_hook(
                 lambda _, __, output, name=name: calls.setdefault(name, []).append(output))
             for name, module in model.named_modules()]
    autocast = torch.autocast(torch.device(device).type, torch.bfloat16,
                              enabled=dtype == "bfloat16")
    try:
        with torch.no_grad(), autocast:
            model(*(torch.as_tensor(ids, device=device)
                    for ids in model_inputs(model.config, src, tgt)))
    finally:
        for hook in hooks:
            hook.remove()
    calls["embed"] = calls["embed_dropout"]  # Transformer.embed ends with it
    return {k: v.detach().cpu().to(param_dtype).numpy()
            for k, v in pick(calls, model.config).items()}


def compare(reference: dict[str, np.ndarray], other: dict[str, np.ndarray], dtype: str,
            tolerance: float) -> Report:
    rows = []
    for name, ref in reference.items():
        got = other[name]
        if got.shape != ref.shape:
            rows.append(Row(name, ref.shape, float("inf"), float("inf"), False))
            continue
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        rel = max_abs / scale if scale > 0 else max_abs
        ok = bool(np.isfinite(got).all()) and max_abs <= tolerance
        rows.append(Row(name, tuple(ref.shape), max_abs, rel, ok))
    return Report(dtype, tolerance, rows)


def compare_mixed(reference: dict[str, np.ndarray], jax_side: dict[str, np.ndarray],
                  torch_side: dict[str, np.ndarray]) -> Report:
    """bfloat16 rows: each side against the float64 reference (mixed_precision_ok)."""
    rows = []
    for name, ref in reference.items():
        errors = [relative_rms_error(side[name], ref) if side[name].shape == ref.shape
                  else float("inf") for side in (jax_side, torch_side)]
        ok = mixed_precision_ok(*errors, rounding_error(ref))
        rows.append(MixedRow(name, tuple(ref.shape), *errors, ok))
    return Report("bfloat16", MIXED_FACTOR, rows)


def devices(device: str | None) -> tuple[object, str]:
    """(JAX device, torch device name) for --device cpu|gpu; None: each framework's
    default (JAX's default backend; CUDA for torch when it sees a GPU)."""
    import jax
    import torch
    if device not in (None, "cpu", "gpu"):
        raise InputError(f"--device must be cpu or gpu, got {device!r}")
    if device == "gpu" and not torch.cuda.is_available():
        raise InputError("--device gpu: torch sees no CUDA device (a CPU-only torch build?)")
    try:
        jax_device = jax.devices(device)[0] if device else jax.devices()[0]
    except RuntimeError as e:
        raise InputError(f"--device {device}: JAX has no such backend ({e})") from None
    torch_device = "cuda" if device == "gpu" or (device is None and torch.cuda.is_available()) \
        else "cpu"
    return jax_device, torch_device


def run(directory, dtypes: Sequence[str] = ("float32", "float64"), *,
        src: np.ndarray | None = None, tgt: np.ndarray | None = None,
        tolerances: dict[str, float] | None = None, device: str | None = None) -> list[Report]:
    """Trace both frameworks on one batch per dtype and compare, with pinned numerics,
    on `device` (cpu, gpu, or None for each framework's default). float64 runs under
    `jax.enable_x64`, so calling this does not change JAX's global setting."""
    import jax
    tolerances = {**DEFAULT_TOLERANCE, **(tolerances or {})}
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise InputError(f"dtypes must be among {', '.join(DTYPES)}, got {dtype!r}")
    config, _ = checkpoint_dir.load_dir(directory)
    if src is None or tgt is None:
        src, tgt = generated_batch(config)
    jax_device, torch_device = devices(device)
    reports = []
    with pinned_numerics(), jax.default_device(jax_device):
        for dtype in dtypes:
            if dtype == "bfloat16":
                with jax.enable_x64(False):
                    ours = trace_jax(directory, dtype, src, tgt)
                reports.append(compare_mixed(
                    trace_torch(directory, "float64", src, tgt, torch_device), ours,
                    trace_torch(directory, dtype, src, tgt, torch_device)))
                continue
            with jax.enable_x64(dtype == "float64"):
                ours = trace_jax(directory, dtype, src, tgt)
            reference = trace_torch(directory, dtype, src, tgt, torch_device)
            reports.append(compare(reference, ours, dtype, tolerances[dtype]))
    for report in reports:
        report.devices = f"Flax on {jax_device.platform}:{jax_device.id}, " \
                         f"torch_reference on {torch_device}"
    return reports


PRECISION = {
    "float32": "float32 parameters and compute; matmuls IEEE float32 (no TF32)",
    "float64": "float64 parameters and compute",
    "bfloat16": "JAX: bfloat16 compute, float32 parameters; torch: float32 parameters under "
                "torch.autocast(bfloat16)",
}


def print_reports(reports: Sequence[Report], header: str = "", file: TextIO | None = None) -> None:
    file = file or sys.stdout
    if header:
        print(header, file=file)
    for report in reports:
        print(f"\n{report.dtype}: {report.devices}\n  {PRECISION[report.dtype]}", file=file)
        width = max(len(r.name) for r in report.rows) + 2
        if report.dtype == "bfloat16":
            print(f"  each side against torch_reference in float64 (relative RMS error); ok when "
                  f"each is within {MIXED_FACTOR:g}x of the other's (errors under one bfloat16 "
                  f"rounding of the tensor count as that)", file=file)
            print(f"  {'tensor':<{width}}{'shape':<18}{'JAX error':>11}{'torch error':>12}",
                  file=file)
        else:
            print(f"  Flax vs torch_reference, tolerance max|diff| <= {report.tolerance:.0e}",
                  file=file)
            print(f"  {'tensor':<{width}}{'shape':<18}{'max|diff|':>11}{'rel diff':>11}",
                  file=file)
        first = report.first_failure
        for r in report.rows:
            flag = "ok" if r.ok else ("FAIL  <-- first over tolerance" if r is first else "FAIL")
            numbers = (f"{r.jax_error:>11.3e}{r.torch_error:>12.3e}" if isinstance(r, MixedRow)
                       else f"{r.max_abs:>11.3e}{r.rel:>11.3e}")
            print(f"  {r.name:<{width}}{str(r.shape):<18}{numbers}  {flag}", file=file)
        verdict = "PASS" if report.ok else f"FAIL (first: {first.name})"
        print(f"  {report.dtype}: {verdict}", file=file)
