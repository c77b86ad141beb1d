"""Training maths, mirroring jax_transformer/train/step.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_reference.masks import causal_mask, same_segment, segment_masks


def label_smoothed_cross_entropy(logits, labels, pad_id: int, smoothing: float = 0.1):
    """Cross-entropy against (1 - smoothing) * one_hot + smoothing / V, summed over
    the non-pad labels. Returns (loss_sum, num_tokens); the loss is their ratio.

    logits (B, T, V), labels (B, T).
    """
    logits = logits.reshape(-1, logits.shape[-1])  # (B*T, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    loss_sum = F.cross_entropy(logits, labels.reshape(-1), ignore_index=pad_id,
                               label_smoothing=smoothing, reduction="sum")
    return loss_sum, (labels != pad_id).sum()


def model_inputs(batch, architecture: str = "encoder_decoder") -> dict:
    """The model's arguments for a batch. A translation batch holds {"src", "tgt_in"}
    ids; a single-stack model's batch the target side alone: "tgt_in" its input ids
    (and "tgt_out" one label per position: the next tokens for a decoder_only model).
    A packed batch (jax_transformer.data.batches.packed) adds segment ids and positions,
    which become masks that keep each sequence to itself, causal for decoders."""
    if architecture != "encoder_decoder":
        inputs = {"ids": batch["tgt_in"]}
        if "tgt_segments" in batch:
            segments = batch["tgt_segments"]
            mask = same_segment(segments, segments)  # (B, 1, L, L)
            if architecture == "decoder_only":
                mask = mask & causal_mask(segments.shape[1], segments.device)
            inputs.update(mask=mask, positions=batch["tgt_positions"])
        return inputs
    inputs = {"src_ids": batch["src"], "tgt_ids": batch["tgt_in"]}
    if "src_segments" in batch:
        src_mask, tgt_mask, memory_mask = segment_masks(batch["src_segments"],
                                                        batch["tgt_segments"])
        inputs.update(src_mask=src_mask, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      src_positions=batch["src_positions"], tgt_positions=batch["tgt_positions"])
    return inputs


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0):
    """lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step from 1.

    For torch.optim.lr_scheduler.LambdaLR (with base lr 1.0), which counts from 0.
    """
    def schedule(count: int) -> float:
        step = count + 1
        return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)
    return schedule


def make_optimizer(model: torch.nn.Module, schedule):
    """Adam(0.9, 0.98, eps 1e-9) as in the paper, with the schedule as a LambdaLR."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def train_step(model, optimizer, scheduler, micro_batches, label_smoothing: float = 0.1,
               clip_norm: float | None = None) -> dict:
    """One update from one or more micro-batches of {"src", "tgt_in", "tgt_out"} (packed
    ones with segment ids and positions too; a single-stack model's without "src").

    Gradients of the summed losses are accumulated and divided once by the total
    token count: the gradient of one batch holding every micro-batch.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_sum, num_tokens = 0.0, 0
    pad_id, architecture = model.config.pad_id, model.config.architecture
    for batch in micro_batches:
        logits = model(**model_inputs(batch, architecture))  # (B, T, V)
        batch_loss, batch_tokens = label_smoothed_cross_entropy(
            logits, batch["tgt_out"], pad_id, label_smoothing)
        batch_loss.backward()
        loss_sum += batch_loss.detach()
        num_tokens += int(batch_tokens)
    num_tokens = max(num_tokens, 1)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(num_tokens)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    if clip_norm and grad_norm >= clip_norm:
        # g / ||g|| * clip, as optax.clip_by_global_norm (torch's clip_grad_norm_
        # divides by ||g|| + 1e-6 instead).
        for g in grads:
            g.div_(grad_norm).mul_(clip_norm)
    optimizer.step()
    scheduler.step()
    return {"loss": loss_sum / num_tokens, "tokens": num_tokens, "grad_norm": grad_norm}
