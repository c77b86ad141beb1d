"""The training loop over a prepared run (PreparedRun): steps up to --steps,
or until --time-budget has passed; metrics, evaluations, checkpoints.

    train(run)   -> (the final state, saved; the training report; the newest dev scores)

The functions below follow the loop's order: the state restored, its programs
compiled ahead, each step dispatched, what is due after it (metrics read, an
evaluation, a checkpoint), and why it stopped. The host reads no device value
between the logging points (late_metrics.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from pathlib import Path

import jax

from jax_transformer.data.batches.packed import PackedBatches
from jax_transformer.data.prepared.directory import Prepared
from jax_transformer.train import finetune, selection
from jax_transformer.train.checkpoints import Checkpointer
from jax_transformer.train.inputs import Prefetcher, log, set_data_position
from jax_transformer.train.records.late_metrics import LateMetrics, TrainingDiverged
from jax_transformer.train.records.report import training_report
from jax_transformer.train.records.tensorboard import TENSORBOARD_DIR
from jax_transformer.train.records.workdir import METRICS_FILE, MetricsLog
from jax_transformer.train.runtime import compiling, interrupts, signals
from jax_transformer.train.settings import RunSettings
from jax_transformer.train.step import TrainState, Trainer
from jax_transformer.train.tasks import Task
from jax_transformer.train.tasks.metrics import heldout_loss
from transformer_core.errors import TrainError, counted
from transformer_core.progress import progress_bar
from transformer_core.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """One run, prepared in its work directory: what the loop and the final evaluation
    read."""
    settings: RunSettings
    task: Task  # TASKS[--task]
    workdir: Path
    primary: bool  # process 0: writes the run's files, holds the lock
    started_at: float  # time.monotonic() when the run began: --time-budget counts from it
    compile_cache: str | None  # the persistent compilation cache in use, if any
    checkpointer: Checkpointer
    resuming: bool  # the work directory holds checkpoints
    init: finetune.InitDir | None  # --init-from's checkpoint directory
    data: Prepared  # the prepared corpus
    tokenizer: Tokenizer
    batches: dict[str, PackedBatches]  # per split
    trainer: Trainer
    start_scores: dict | None = None  # fine-tuning: the starting model's evaluation


@dataclasses.dataclass
class Newest:
    """What the loop keeps from one step to the next: the newest step saved (None
    before a new run's first save), and the newest evaluation's step and dev scores
    (the task's: BLEU and chrF, or none), which the final evaluation may reuse."""
    saved: int | None
    dev_scores: tuple[int | None, dict] = (None, {})


def train(run: PreparedRun) -> tuple[TrainState, dict, tuple[int | None, dict]]:
    """The loop. Returns the final state, saved; the run's report (batches, compiling,
    speed, what stopped it); and Newest.dev_scores. SIGINT/SIGTERM: the step finishes
    and is saved (train.runtime.interrupts), then signals.Interrupted says so."""
    settings, checkpointer = run.settings.train, run.checkpointer
    compiled_before = compiling.CompileCounter.snapshot()
    state, batches = restore(run)
    start_step = step = int(jax.device_get(state.step))  # counted on the host from here on
    # Opened before compiling, so that once "compiled in" is printed a stop is deferred
    # to the end of a step (and saved) without a gap.
    metrics_log = MetricsLog(run.workdir / METRICS_FILE, start_step, enabled=run.primary,
                             tensorboard=run.workdir / TENSORBOARD_DIR
                             if settings.tensorboard else None)
    policy = selection.Policy(settings, run.workdir / METRICS_FILE if run.primary else None)
    finished = policy.patience.spent()  # a resumed run that stopped early: finish it untrained
    ahead_seconds = 0.0 if finished else compile_ahead(run, state, step)
    updates = Prefetcher(batches, run.trainer.shard_batch, settings.accumulate)
    data_state = batches.get_state()  # the position of the batches trained on so far
    real_tokens, started = 0, time.time()
    seconds_before_training = time.monotonic() - run.started_at
    deadline = (run.started_at + settings.time_budget if settings.time_budget is not None
                else None)
    newest = Newest(saved=start_step if run.resuming else None)
    late = LateMetrics(settings.log_every, started)
    host_seconds = []  # per step, the loop thread's CPU time: its batch taken, dispatched
    progress = progress_bar(total=settings.steps, initial=start_step, desc="train",
                            unit="step", disable=settings.quiet or not run.primary)
    with interrupts.deferred_stops(deadline) as stops, progress, \
            contextlib.closing(metrics_log), contextlib.closing(updates):
        programs_ahead = 0 if finished else log_compiled(
            run, compiled_before, ahead_seconds, start_step, metrics_log)
        if finished:
            stops.stop_early()
        while step < settings.steps and not stops.agreed(step):
            began, began_cpu = time.time(), time.thread_time()  # the budget had time left
            update = next(updates)
            state, metrics = optimizer_step(run.trainer, state, update.micro_batches)
            step, data_state = step + 1, update.data_state
            real_tokens += update.tokens
            late.add(step, metrics, update.tokens, began)
            host_seconds.append(time.thread_time() - began_cpu)
            after_step(run, state, step, data_state, late, (metrics_log, progress), policy,
                       stops, newest)
        write_metrics(run, late, True, (metrics_log, progress), newest)  # before the save
        say_why_stopped(run, stops, policy.patience, step, start_step, seconds_before_training)
        if step != newest.saved:  # a signal or the budget between checkpoints
            checkpointer.save(state, data_state)
        checkpointer.wait()
    if stops.signum is not None:
        raise signals.Interrupted(f"{signal.Signals(stops.signum).name}: saved step "
                                  f"{step} in {checkpointer.manager.directory}; "
                                  "run the same command to resume", stops.signum)
    report = training_report(
        run.batches["train"], steps=step - start_step, compiled_before=compiled_before,
        ahead_seconds=ahead_seconds, seconds=time.time() - started, real_tokens=real_tokens,
        seconds_before_training=seconds_before_training,
        first_step_done=late.first_step_done, stopped_by=stops.stopped_by(),
        host_seconds=host_seconds, data_bytes=run.data.split_bytes("train"))
    log_trained(report, programs_ahead)
    return state, report, newest.dev_scores


def restore(run: PreparedRun):
    """The state to train from and the training batches' iterator: a resumed run's
    newest intact checkpoint and its data position, or the initial state."""
    state = run.trainer.initial_state
    batches = run.batches["train"].iterator(local_rows=run.trainer.local_rows)
    if run.resuming:
        state, data_state = run.checkpointer.restore_newest_intact(state, warn=log)
        step = int(jax.device_get(state.step))
        set_data_position(batches, data_state, run.settings.data, step)
        log(f"resumed from step {step} ({run.checkpointer.manager.directory})")
    return state, batches


def compile_ahead(run: PreparedRun, state: TrainState, step: int) -> float:
    """Compile the step's programs for every batch shape before the first step (or
    load them from the cache); returns the seconds it took."""
    settings = run.settings.train
    programs = run.trainer.programs(state, run.batches["train"].shapes(), settings.accumulate)
    with signals.signal_handlers(signals.exit_at_once(
            f"stopped while compiling, before step {step + 1}; saved checkpoints "
            "are intact; run the same command to resume")):
        log(f"compiling {counted(len(programs), 'program')} ahead of time ("
            + (f"cache {run.compile_cache})" if run.compile_cache else "no cache)"))
        return compiling.compile_ahead(programs, log)


def log_compiled(run: PreparedRun, compiled_before, ahead_seconds: float, start_step: int,
                 metrics_log: MetricsLog) -> int:
    """What compiling took, printed and (with a fine-tuning run's starting scores, at
    step 0) written to the metrics log; returns the programs compiled or loaded."""
    compiled = compiling.CompileCounter.since(compiled_before)  # once stops are deferred
    log(f"compiled in {ahead_seconds:.1f} s: {counted(compiled['programs'], 'program')} "
        f"compiled, {compiled['cache_hits']} loaded from the cache")
    start = run.start_scores
    if start is not None and start_step == 0:  # the starting model, at step 0
        metrics_log.write(step=0, dev_loss=start["dev"]["loss"], dev_nll=start["dev"]["nll"],
                          dev_perplexity=start["dev"]["perplexity"])
    if start_step < run.settings.train.steps:  # at the first step these programs train
        metrics_log.write(step=start_step + 1, compile_seconds=round(ahead_seconds, 2))
    return compiled["programs"] + compiled["cache_hits"]


def optimizer_step(trainer: Trainer, state: TrainState, micro_batches: list):
    """One optimizer update on --accumulate micro-batches: (state, device metrics)."""
    if len(micro_batches) == 1:
        return trainer.train_step(state, micro_batches[0])
    return trainer.accumulate(state, micro_batches)


def after_step(run: PreparedRun, state: TrainState, step: int, data_state: dict,
               late: LateMetrics, outputs: tuple, policy: selection.Policy,
               stops: interrupts.StopRequests, newest: Newest) -> None:
    """What `policy` says is due after `step`: the metrics read into `outputs` (the
    metrics log and the progress bar), an evaluation, a checkpoint (with the
    evaluation's scores); a stop request once --patience has run out."""
    evaluate, save = policy.due(step)
    if late.due() or evaluate or save:
        loss = write_metrics(run, late, evaluate or save, outputs, newest)
    scores = evaluate_dev(run, state, step, loss, outputs[0], newest) if evaluate else None
    if scores and policy.judge(step, scores):
        stops.stop_early()
    if save:
        run.checkpointer.save(state, data_state, metrics=scores)
        newest.saved = step


def write_metrics(run: PreparedRun, late: LateMetrics, all_steps: bool, outputs: tuple,
                  newest: Newest) -> float | None:
    """The late metrics read (every step's when `all_steps`) into `outputs`, the metrics
    log and the progress bar; returns the newest loss read. A non-finite one stops the
    run before any save, saying which checkpoint is the last good one."""
    metrics_log, progress = outputs
    try:
        read = late.read(all_steps)
    except TrainingDiverged as e:
        run.checkpointer.wait()
        where = (f"the last good checkpoint is step {newest.saved} in "
                 f"{run.checkpointer.manager.directory}" if newest.saved is not None
                 else "no checkpoint was written")
        raise TrainingDiverged(f"{e}; {where}") from None
    for m in read:
        metrics_log.write(step=m.step, loss=m.loss, lr=m.lr, grad_norm=m.grad_norm,
                          tokens=m.tokens, tokens_per_s=round(m.tokens_per_s, 1),
                          elapsed=round(m.elapsed, 3))
        progress.set_postfix(loss=f"{m.loss:.3f}", lr=f"{m.lr:.2e}",
                             tok_s=f"{m.tokens_per_s:,.0f}", refresh=False)
        progress.update(1)
    return read[-1].loss if read else None


def evaluate_dev(run: PreparedRun, state: TrainState, step: int, loss: float,
                 metrics_log: MetricsLog, newest: Newest) -> dict:
    """The dev loss at `step` (label-smoothed, as training's), the dev nll and perplexity
    exp(nll) and, translating, BLEU and chrF of the dev set translated
    (--dev-bleu-sentences), written and printed beside the newest training loss;
    returns the scores as --keep-best names them."""
    dev = heldout_loss(run.trainer, state, run.batches["dev"])
    with jax.transfer_guard("allow"):  # the translation puts its sources on the device
        scores = run.task.dev_scores(run.trainer.local_model(state), run.tokenizer,
                                     run.data.examples("dev"), run.settings.train)
    newest.dev_scores = step, scores
    translated = {f"dev_{k}": scores[k] for k in ("bleu", "chrf", "decode_seconds")
                  if k in scores}
    metrics_log.write(step=step, dev_loss=dev["loss"], dev_nll=dev["nll"],
                      dev_perplexity=dev["perplexity"], **translated)
    log(f"step {step}: label-smoothed loss: train {loss:.4f}, dev {dev['loss']:.4f}; "
        f"dev nll {dev['nll']:.4f}, dev perplexity {dev['perplexity']:.3f} (exp of the nll)"
        + (f", dev BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} "
           f"({scores['sentences']} sentences translated in {scores['decode_seconds']:.1f} s)"
           if scores else ""))
    return {"dev_loss": dev["loss"], **{k: v for k, v in translated.items()
                                        if k != "dev_decode_seconds"}}


def say_why_stopped(run: PreparedRun, stops: interrupts.StopRequests,
                    patience: selection.Patience, step: int, start_step: int,
                    setting_up: float) -> None:
    """A line when --time-budget or --patience stopped the run (see budget_spent)."""
    if stops.out_of_time:
        budget_spent(run.settings.train.time_budget, step, start_step, setting_up)
    if stops.stopped_early:
        log(f"{patience.reason()}: stopping after step {step}" if run.primary
            else f"--patience: stopping after step {step}, as process 0 decided")


def budget_spent(budget: float, step: int, start_step: int, setting_up: float) -> None:
    """After --time-budget ran out: a TrainError when it did before the first step of
    a new run (nothing trained, so nothing is saved or exported); else a line saying
    so, after one more when it did before the first step of a resumed run (whose
    saved model is exported)."""
    if step == start_step == 0:
        raise TrainError(f"--time-budget {budget:g} s ran out before the first training "
                         f"step (setting up took {setting_up:.1f} s: the corpus, the "
                         "tokenizer and compiling): no step ran, so no checkpoint was "
                         "saved and no model exported; give a longer budget")
    if step == start_step:
        log(f"--time-budget {budget:g} s ran out before this run's first step: no step "
            f"ran; exporting and evaluating step {step} as it was saved")
    log(f"--time-budget {budget:g} s spent: stopping after step {step}")


def log_trained(report: dict, programs_ahead: int) -> None:
    """The training's last line: its steps and speed, and the programs compiled or
    loaded from the cache since it began, `programs_ahead` of them (log_compiled's)
    before the first step and the rest when first needed (evaluations, translations)."""
    compiled = report["compiled"]
    programs = compiled["programs"] + compiled["cache_hits"]
    log(f"trained {counted(report['steps'], 'step')} at {report['tgt_tokens_per_s']:,.0f} "
        f"real target tokens/s; {counted(programs, 'program')} since training began "
        f"({programs_ahead} before the first step, {programs - programs_ahead} when first "
        f"needed): {compiled['programs']} compiled in {compiled['compile_seconds']:.1f} s, "
        f"{compiled['cache_hits']} loaded from the cache")
