"""The race's results: each contender's runs summarized (medians and their spread),
the markdown page (when train.py reached the peer's final dev loss, and each run's dev
and training losses at its evaluations, among its figures) and the dev-loss figure.
benchmarks/race.py runs the race and writes them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.report import Report, Table

COLLAPSED_SHARE = 0.5  # more of the lines empty or one same line: a collapsed output

FIGURES = ("steps", "tgt_tokens_per_s", "tgt_tokens_per_step", "first_step_seconds",
           "training_seconds", "compile_seconds", "programs_compiled", "compile_cache_hits",
           "steady_tgt_tokens_per_s", "host_seconds_per_step", "bleu", "chrf", "length_ratio",
           "dev_loss", "peak_memory_bytes", "wall_seconds", "matmul_peak_flops_per_s")


def median_of(values: list) -> float | None:
    """The median of the known values; of counts (ints), the lower one: a count."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return (statistics.median_low if all(isinstance(v, int) for v in known)
            else statistics.median)(known)


def summarize(rows: list[dict]) -> dict:
    """One contender's runs as one row: the first run's row with each figure (and the bare
    step's) the median over the runs, "spread" each figure's [min, max], "runs" the count."""
    summary = {**rows[0], "runs": len(rows), "spread": {}}
    for name in FIGURES:
        values = [row.get(name) for row in rows]
        summary[name] = median_of(values)
        known = [v for v in values if v is not None]
        summary["spread"][name] = [min(known), max(known)] if known else None
    if rows[0].get("bare_step"):
        summary["bare_step"] = {k: median_of([row["bare_step"][k] for row in rows])
                                for k, v in rows[0]["bare_step"].items()
                                if isinstance(v, (int, float))}
    summary["collapsed_runs"] = sum(row["collapsed"] for row in rows)
    return summary


def describe(result: dict) -> Report:
    """The page of a results dict: each side's headline figures, then how it trained."""
    sides = result["sides"].values()
    memory = ("peak device memory (GiB)" if result["device"] == "cuda"
              else "peak RSS (GiB)")
    headline = [[row["what"], f"{row['steps']:,}", f"{row['tgt_tokens_per_s']:,.0f}",
                 "-" if row["first_step_seconds"] is None else f"{row['first_step_seconds']:.1f}",
                 f"{row['compile_seconds']:.1f}", f"{row['bleu']:.1f}", f"{row['chrf']:.1f}",
                 f"{row['dev_loss']:.3f}", f"{row['peak_memory_bytes'] / 2 ** 30:.2f}"]
                for row in sides]
    training = [[row["what"], row["stopped_by"], f"{row['tgt_tokens_per_step']:,.0f}",
                 f"{row['training_seconds']:.1f}", f"{row['wall_seconds']:.1f}",
                 row["programs_compiled"], row["compile_cache_hits"],
                 len(row["dev_curve"])] for row in sides]
    def figure(value, form):
        return "-" if value is None else format(value, form)

    steps = [[row["what"], figure(row.get("steady_tgt_tokens_per_s"), ",.0f"),
              figure(row.get("bare_step", {}).get("tgt_tokens_per_s"), ",.0f"),
              figure(row["steady_tgt_tokens_per_s"] / row["bare_step"]["tgt_tokens_per_s"]
                     if row.get("bare_step") and row.get("steady_tgt_tokens_per_s") else None,
                     ".1%"),
              figure(row.get("host_seconds_per_step"), ".4f"),
              figure(row.get("bare_step", {}).get("mfu"), ".1%"),
              figure(row["bare_step"]["matmul_peak_flops_per_s"] / 1e9
                     if row.get("bare_step") else None, ",.0f")] for row in sides]
    tokenizers = {True: "byte-identical", False: "different",
                  None: "not compared (one side ran)"}[result["same_tokenizer"]]
    rounds = rounds_part(result) if "runs" in result else ([], [])
    losses = losses_part(result)
    return Report(
        title="The race: train.py against Hugging Face Marian",
        script="benchmarks/race.py",
        notes=[*rounds[0], f"Each side trained for {result['time_budget']:g} s of wall time from its "
               f"start, then greedy-decoded the test set. The two sides' SentencePiece "
               f"models: {tokenizers}. Memory: {result['memory']}. The dev loss against "
               "wall time is plotted in the .png of the same name.",
               "Steady state: the median rate over the second half of the steps, evaluations "
               "left out. The bare step (benchmarks/bare_step.py, after the race): the "
               "compiled step alone on the run's first batches, each waited for; its MFU "
               "counts matmul FLOPs against a matmul peak measured just before and after it. "
               "Host s per step: the CPU time of train.py's loop thread taking a "
               "prefetched batch and dispatching the step, its waits for the devices not "
               "counted (median; in runs before 2026-11-26, its wall time).", *losses[0]],
        tables=[Table(("side", "steps", "real target tokens/s", "first step (s)",
                       "compile (s)", "BLEU", "chrF", "dev loss", memory), headline,
                      align="lrrrrrrrr"),
                Table(("side", "stopped by", "real target tokens per step", "training (s)",
                       "wall (s)", "programs compiled", "compile cache hits",
                       "dev losses on the way"), training, align="llrrrrrr"),
                Table(("side", "steady-state real target tokens/s", "bare step's (same batches)",
                       "steady / bare", "host s per step", "bare step's MFU",
                       "matmul peak (GFLOP/s)"), steps, align="lrrrrrr"),
                *rounds[1], *losses[1]],
        settings={k: v for k, v in result["settings"].items()
                  if k not in ("out", "render_only")},
        device=f"{result['device_name']} (--device {result['device']}).",
        versions=result["versions"])


def rounds_part(result: dict) -> tuple[list[str], list[Table]]:
    """The notes and tables of a run with rounds and peer variants (results before
    2026-12 had neither): medians and spread, each run, the footing, the output."""
    def spread(row, name, form, scale=1):
        if row[name] is None:
            return "-"
        low, high = (value / scale for value in row["spread"][name])
        middle = row[name] / scale
        return (format(middle, form) if row["runs"] == 1
                else f"{middle:{form}} ({low:{form}}-{high:{form}})")

    contenders = ([result["sides"]["ours"]] if "ours" in result["sides"] else []) + list(
        result["peer_variants"].values())
    best = result["best_peer_variant"]
    medians = [[row["what"] + (" **(the race's peer)**" if row.get("variant") == best
                               and best is not None else ""), row["runs"],
                spread(row, "tgt_tokens_per_s", ",.0f"),
                spread(row, "steady_tgt_tokens_per_s", ",.0f"),
                spread(row, "first_step_seconds", ".1f"), spread(row, "dev_loss", ".3f"),
                spread(row, "bleu", ".1f"), spread(row, "chrf", ".1f"),
                spread(row, "length_ratio", ".2f"),
                spread(row, "matmul_peak_flops_per_s", ",.0f", 1e9)]
               for row in contenders]
    runs = [[row["position"] + 1, row["round"], row["what"], f"{row['steps']:,}",
             f"{row['tgt_tokens_per_s']:,.0f}", f"{row['dev_loss']:.3f}",
             f"{row['bleu']:.1f}", f"{row['chrf']:.1f}", f"{row['length_ratio']:.2f}",
             "**collapsed**" if row["collapsed"] else "no",
             f"{row['matmul_peak_flops_per_s'] / 1e9:,.0f}", row["translations"]]
            for row in result["runs"]]
    footing = [[row["what"], row["environment"]["threads"], row["environment"]["devices"],
                row["environment"]["allocator"],
                ", ".join(f"{k} {v}" for k, v in row["environment"]["versions"].items())]
               for row in {row["what"]: row for row in result["runs"]}.values()]
    signatures = sorted({(row["bleu_signature"], row["chrf_signature"])
                         for row in result["runs"]})
    collapsed = [f"round {row['round']}, {row['what']}" for row in result["runs"]
                 if row["collapsed"]]
    notes = [f"{result['rounds']} round(s) of every contender, alternating (ABBA), each run "
             "a process of its own on the same cores, a matmul peak measured just before "
             "it; figures are medians (min-max over the rounds). The race's peer is the "
             "variant with the lowest median final dev loss"
             + (f": {best}." if best else "."),
             "Scores: " + "; ".join(f"BLEU `{b}`, chrF `{c}`" for b, c in signatures)
             + ". Length ratio: the output's BLEU tokens over the references'. A collapsed "
             f"output has over {COLLAPSED_SHARE:.0%} of its lines empty or one same line."]
    if collapsed:
        notes.append("**Collapsed output** (its BLEU says nothing of the model): "
                     + "; ".join(collapsed) + ".")
    if "ours" in result["sides"] and best is not None:
        notes.append(reaching_note(result, result["peer_variants"][best]))
    return notes, [
        Table(("contender", "rounds", "real target tokens/s", "steady-state tokens/s",
               "first step (s)", "dev loss", "BLEU", "chrF", "length ratio",
               "matmul peak (GFLOP/s)"), medians, align="lrrrrrrrrr"),
        Table(("run", "round", "contender", "steps", "real target tokens/s", "dev loss",
               "BLEU", "chrF", "length ratio", "collapsed", "matmul peak (GFLOP/s)",
               "test translations"), runs, align="rrlrrrrrrlrl"),
        Table(("contender", "threads", "devices", "allocator", "versions"), footing,
              align="lrlll")]


def losses_part(result: dict) -> tuple[list[str], list[Table]]:
    """The note and the table of each run's dev and training losses at its evaluations;
    neither for results whose evaluations lack the training loss (before 2026-11-28)."""
    runs = result.get("runs", [])
    points = [point for row in runs for point in row["dev_curve"]]
    if not points or any("train_loss" not in point for point in points):
        return [], []
    steps = sorted({point["step"] for point in points})
    rows = []
    for row in runs:
        losses = {point["step"]: f"dev {point['dev_loss']:.3f} / train {point['train_loss']:.3f}"
                  for point in row["dev_curve"]}
        rows.append([row["position"] + 1, row["round"], row["what"],
                     *(losses.get(step, "-") for step in steps)])
    note = ("The losses at each evaluation, by run: the dev loss (label-smoothed, per real "
            "target token, dropout off) and the training loss, the mean of the steps' losses "
            "since the previous evaluation (as minimised: label-smoothed, per real target "
            "token, dropout on).")
    return [note], [Table(("run", "round", "contender", *(f"step {step:,}" for step in steps)),
                          rows, align="rrl" + "r" * len(steps))]


def seconds_to_reach(run: dict, loss: float) -> float | None:
    """When a run's dev loss first came down to `loss`, on its curve of evaluations
    (with its final dev loss at the end of training), linearly between the two around
    it; None if it never did."""
    curve = [*run["dev_curve"], {"seconds": run["training_seconds"], "dev_loss": run["dev_loss"]}]
    for before, point in zip([None, *curve], curve):
        if point["dev_loss"] <= loss:
            if before is None:
                return point["seconds"]
            share = (before["dev_loss"] - loss) / (before["dev_loss"] - point["dev_loss"])
            return before["seconds"] + share * (point["seconds"] - before["seconds"])
    return None


def reaching_note(result: dict, peer: dict) -> str:
    """When each of train.py's runs reached the race's peer's (median) final dev loss,
    against the peer's (median) training time."""
    ours = [row for row in result["runs"] if row["side"] == "ours"]
    reached = [seconds_to_reach(row, peer["dev_loss"]) for row in ours]
    times = ", ".join("never" if seconds is None else
                      f"{seconds:.0f} s ({seconds / peer['training_seconds']:.0%})"
                      for seconds in reached)
    return (f"The race's peer's final dev loss, {peer['dev_loss']:.3f} (median), reached "
            f"by train.py at: {times}, by round, against the peer's "
            f"{peer['training_seconds']:.0f} s of training (median): read off train.py's "
            "dev losses (its evaluations, then its final dev loss at the end of training), "
            "linearly between the two around it; each side's seconds count from where its "
            "time budget starts.")


def plot_dev_loss(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in result.get("runs", result["sides"].values()):  # dev losses, then the final
        curve = [(p["seconds"], p["dev_loss"]) for p in row["dev_curve"]]
        curve.append((row["training_seconds"], row["dev_loss"]))
        label = row["what"] + (f", round {row['round']}" if "round" in row else "")
        ax.plot(*zip(*curve), marker="o", markersize=3, label=label)
    ax.axvline(result["time_budget"], color="grey", linestyle="--", label="time budget")
    ax.set_xlabel("wall seconds since the side's start")
    ax.set_ylabel("dev loss (label-smoothed, per target token)")
    ax.set_title(f"{result['device_name']}: dev loss against wall time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
