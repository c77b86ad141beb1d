"""Figures written to the work directory: the loss curve and an attention heatmap.

matplotlib loads on the first figure, not with train.py: its import (0.4 s) would
otherwise come before the first step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np


def pyplot():
    """matplotlib.pyplot, drawing to files (the Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def loss_curve(metrics_path: Path, out_path: Path) -> Path:
    """Training loss per step and held-out loss at each evaluation, from metrics.jsonl."""
    train, dev = [], []
    for line in Path(metrics_path).read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            train.append((record["step"], record["loss"]))
        if "dev_loss" in record:
            dev.append((record["step"], record["dev_loss"]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.8, label="train (label-smoothed)")
    if dev:
        ax.plot(*zip(*dev), "o-", label="held-out")
    ax.set(xlabel="step", ylabel="loss per target token", yscale="log", title="Loss")
    ax.grid(alpha=0.3)
    if train or dev:  # matplotlib warns about a legend of nothing
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def attention_heatmap(weights: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                      out_path: Path, title: str) -> Path:
    """weights (H, T, S): one panel per head plus their mean."""
    panels = [weights.mean(0), *weights]
    names = ["mean of heads"] + [f"head {h}" for h in range(len(weights))]
    cols = min(len(panels), 5)
    rows = -(-len(panels) // cols)
    scale = 0.3 * max(len(src_tokens), len(tgt_tokens)) + 1.5
    plt = pyplot()
    fig, axes = plt.subplots(rows, cols, figsize=(cols * scale, rows * scale), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, panel, name in zip(axes.flat, panels, names):
        ax.imshow(panel, cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt_tokens)), tgt_tokens, fontsize=7)
        ax.set_title(name, fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
