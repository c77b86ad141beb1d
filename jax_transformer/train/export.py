"""The run's end: the model WORKDIR/export holds (--export: selection.exported_state) and
its final evaluation (eval.json, the figures); and a fine-tuning run's starting model,
evaluated before the first step as the final evaluation will be (start_eval.json).

    export_and_evaluate(run, state, report, dev_scores)   the export, then eval.json
    evaluate_start(run)                                  the starting model's scores
"""

from __future__ import annotations

import json
import time

from jax_transformer.train import finetune, selection
from jax_transformer.train.inputs import log
from jax_transformer.train.loop import PreparedRun
from jax_transformer.train.records import plots
from jax_transformer.train.records.report import replicas, state_bytes
from jax_transformer.train.records.workdir import METRICS_FILE, write_text_atomically
from jax_transformer.train.step import TrainState
from jax_transformer.train.tasks.metrics import heldout_loss
from transformer_core.checkpoint_dir import directory_written_whole

START_EVAL_FILE = "start_eval.json"  # a fine-tuning run's evaluation before its first step


def export_and_evaluate(run: PreparedRun, state: TrainState, report: dict,
                        dev_scores: tuple[int | None, dict]) -> dict:
    """Export the model --export chooses from the trained `state` and the checkpoints,
    and evaluate it (evaluate); `report`: the training's, to which the trained state's
    digest and size are added; `dev_scores`: the loop's newest evaluation's."""
    settings = run.settings.train
    report.update(replicas(state), **state_bytes(state))  # the trained state
    exported, export_record = selection.exported_state(
        settings.export, state, run.checkpointer, settings.averaged_checkpoints,
        run.trainer.state_shardings.params, log)
    export(run, exported)
    return evaluate(run, exported, report, export_record, dev_scores)


def export(run: PreparedRun, state: TrainState) -> None:
    """WORKDIR/export: the model and its tokenizer as a checkpoint directory."""
    model = run.trainer.local_model(state)  # every process: with --fsdp, a gathering
    if run.primary:  # whole or not at all: a failure keeps the earlier export
        with directory_written_whole(run.workdir / "export") as tmp:
            if run.init is not None:  # the tokenizer files it came with
                model.save_pretrained(tmp)
                names = finetune.copy_tokenizer(run.workdir, tmp)
            else:
                model.save_pretrained(tmp, tokenizer=run.tokenizer.path)
                names = [run.tokenizer.path.name]
        log(f"exported {run.workdir / 'export'} (config.json, model.safetensors, "
            f"{', '.join(names)})")


def evaluate(run: PreparedRun, state: TrainState, report: dict, export_record: dict,
             dev_scores: tuple[int | None, dict]) -> dict:
    """The exported model's (`state`: --export's choice) held-out losses, dev scores
    and test evaluation (the test set decoded); writes eval.json (with this process's
    training `report`, which holds every process's digest of the trained state, and
    what was exported) and the figures."""
    model = run.trainer.local_model(state)
    results = {"step": int(state.step), "export": export_record, "training": report}
    for split in ("dev", "test"):
        results[split] = heldout_loss(run.trainer, state, run.batches[split])
    results["dev"].update(final_dev_scores(run, model, state, export_record, dev_scores))
    started = time.time()
    decoded = run.task.evaluate_test(model, run.tokenizer, run.data.examples("test"),
                                     run.settings.train, log)
    results["decoding"], results["samples"] = decoded["decoding"], decoded["samples"]
    results["test"].update(decoded["test"])
    results["test"]["decode_seconds"] = round(time.time() - started, 1)
    if run.start_scores is not None:
        results["start"] = run.start_scores
    if not run.primary:
        return results
    write_text_atomically(run.workdir / "eval.json", json.dumps(results, indent=2) + "\n")
    plots.loss_curve(run.workdir / METRICS_FILE, run.workdir / "loss.png")
    if results["samples"]:
        run.task.attention_figure(model, run.tokenizer, results["samples"][0],
                                  run.workdir / "attention.png")
    return results


def final_dev_scores(run: PreparedRun, model, state: TrainState, export_record: dict,
                     dev_scores: tuple[int | None, dict]) -> dict:
    """The exported model's dev BLEU and chrF: the loop's last evaluation's
    (`dev_scores`) where it judged this model (--export last, trained up to here),
    else translated now."""
    step, scores = dev_scores
    if export_record["model"] == "last" and step == int(state.step):
        return scores
    return run.task.dev_scores(model, run.tokenizer, run.data.examples("dev"),
                               run.settings.train)


def evaluate_start(run: PreparedRun) -> dict | None:
    """A fine-tuning run's starting model before its first step: the held-out losses
    and the test evaluation (BLEU, ...) the final evaluation repeats, logged and kept
    in WORKDIR/start_eval.json (a resumed run reads them back)."""
    path = run.workdir / START_EVAL_FILE
    if run.resuming:  # the weights are the checkpoint's now, not the starting ones
        if path.exists():
            return json.loads(path.read_text())
        log(f"{path} is missing: eval.json will have no \"start\"")
        return None
    state = run.trainer.initial_state
    start = {split: heldout_loss(run.trainer, state, run.batches[split])
             for split in ("dev", "test")}
    decoded = run.task.evaluate_test(run.trainer.local_model(state), run.tokenizer,
                                     run.data.examples("test"), run.settings.train, log)
    start["test"].update(decoded["test"])
    scores = ", ".join(f"{k} {v:.4g}" for k, v in decoded["test"].items()
                       if k in ("bleu", "chrf", "exact_match", "second_half_match"))
    log(f"before fine-tuning: dev loss {start['dev']['loss']:.4f}, test loss "
        f"{start['test']['loss']:.4f}, test {scores}")
    if run.primary:
        write_text_atomically(path, json.dumps(start, indent=2) + "\n")
    return start
