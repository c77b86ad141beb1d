"""A training run: the job behind train.py, from its settings to eval.json.

    TrainingRun(settings).run()   open the work directory, prepare, train, export, evaluate

The task (--task, train.task) decides the corpus, the architecture and the final
evaluation; the rest is shared. Resuming: a work directory that holds
checkpoints is resumed from the latest one with the same settings, tokenizer,
data order and dropout stream, so the losses continue exactly as in an
uninterrupted run. Fine-tuning (--init-from DIR, train.finetune): the model, its
weights and its tokenizer come from DIR, and the starting model is evaluated before
the first step (WORKDIR/start_eval.json, eval.json's "start").
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import jax
import numpy as np

from jax_transformer.data.prepared import SPLITS
from jax_transformer.train import (disk_full, distributed, finetune,
                                   selection)
from jax_transformer.train.checkpoints import Checkpointer
from jax_transformer.train.inputs import (batch_multiple, log, make_batches, prepared_corpus,
                                          run_tokenizer, set_data_position)
from jax_transformer.train.inputs import Prefetcher
from jax_transformer.train.records import plots
from jax_transformer.train.records.late_metrics import LateMetrics, TrainingDiverged
from jax_transformer.train.records.report import replicas, state_bytes, training_report
from jax_transformer.train.records.tensorboard import TENSORBOARD_DIR
from jax_transformer.train.records.workdir import (METRICS_FILE, MetricsLog, open_workdir,
                                                   write_text_atomically)
from jax_transformer.train.settings.resume import FINGERPRINT, check_run_settings, recorded_settings
from jax_transformer.train.runtime import (compiling, cpu_devices, host_memory, interrupts, jax_variables,
                                           sharding, signals)
from jax_transformer.train.settings import RunSettings
from jax_transformer.train.settings.training import default_compile_cache
from jax_transformer.train.step import build_trainer, layers_scanned
from jax_transformer.train.tasks import TASKS
from jax_transformer.train.tasks.metrics import heldout_loss
from transformer_core import checkpoint_dir
from transformer_core.checkpoint_dir import (CONFIG_FILE, directory_written_whole,
                                            write_atomically)
from transformer_core.config import TransformerConfig
from transformer_core.errors import TrainError, counted
from transformer_core.progress import progress_bar
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID

START_EVAL_FILE = "start_eval.json"  # a fine-tuning run's evaluation before its first step


class TrainingRun:
    """One run in its work directory: the settings, the corpus and its batches, the
    tokenizer, the model's trainer, the checkpointer and the metrics log."""

    def __init__(self, settings: RunSettings, init: finetune.InitDir | None = None):
        """`init`: --init-from's directory as the command read and checked it (else the
        run reads and checks it)."""
        self.settings = settings
        self.task = TASKS[settings.data.task]
        self.started = time.monotonic()  # --time-budget counts from here
        self.init, self.start = init, None  # fine-tuning: DIR, and the starting model's scores
        self.dev_scores = None, {}  # the newest evaluation's step and dev BLEU and chrF

    def run(self) -> dict:
        """Train (or resume), then export and evaluate; returns eval.json's contents plus
        "train_seconds". A full disk, or a checkpoints directory that refuses writes, is
        one DiskFull or WritesRefused error (exit 1) that says so, where, and which
        checkpoint a resume starts from (disk_full.py). --distributed: this process
        joins the others first, and ends with them (train.distributed)."""
        settings = self.settings.train
        disk_full.quiet_echoes(Path(settings.workdir))
        distributed.check_environment(settings)
        cpu_devices.split_cpu(settings.cpu_devices, self.settings.data.fewest_rows)
        host_memory.keep_freed_memory()
        if settings.distributed:
            distributed.initialize(settings)
        jax_variables.start_backends()
        sharding.check_fsdp(settings.fsdp, jax.device_count())  # before the corpus is read
        if not settings.distributed:
            return self._run_or_disk_fault()
        with distributed.together(settings, lambda: distributed.resume_hint(
                Path(settings.workdir))):
            return self._run_or_disk_fault()

    def _run_or_disk_fault(self) -> dict:
        try:
            return self._run()
        except Exception as error:
            fault = disk_full.disk_fault(Path(self.settings.train.workdir),
                                         getattr(self, "checkpointer", None), error)
            if fault is None:
                raise
            raise fault from None

    def compile_cache_unsafe(self) -> bool:
        """Whether this run's programs must not come from the compilation cache, and if
        so, a line in the log that says why: with --fsdp on the CPU, a step that XLA:CPU
        (jaxlib 0.10.2) loads from the cache can deadlock in its devices' collectives
        until XLA aborts the process (docs/training.md, --fsdp)."""
        settings = self.settings.train
        if settings.fsdp == 1 or settings.compile_cache is None or jax.default_backend() != "cpu":
            return False
        log("compilation cache: off, as with --no-compile-cache: with --fsdp on the CPU, "
            "programs loaded from it can deadlock (docs/training.md)")
        return True

    def _run(self) -> dict:
        settings = self.settings.train
        self.compile_cache = compiling.use_compilation_cache(
            None if self.compile_cache_unsafe() else settings.compile_cache, warn=log,
            default=default_compile_cache())
        compiling.CompileCounter.start()
        self.primary = jax.process_index() == 0  # writes the run's files, holds the lock
        self.workdir, lock = (open_workdir(settings.workdir) if self.primary
                              else (Path(settings.workdir), None))
        try:
            self.prepare()
            self.start = self.evaluate_start() if self.init is not None else None
            started = time.time()
            state, report = self.train()
            train_seconds = time.time() - started
            with signals.signal_handlers(signals.exit_at_once(
                    f"stopped during the final export and evaluation; training is saved at "
                    f"step {int(state.step)}; run the same command to finish them")):
                report.update(replicas(state), **state_bytes(state))  # the trained state
                exported, export = selection.exported_state(
                    settings.export, state, self.checkpointer, settings.averaged_checkpoints,
                    self.trainer.state_shardings.params, log)
                self.export(exported)
                summary = self.evaluate(exported, report, export)
            summary["train_seconds"] = round(train_seconds, 1)
            return summary
        finally:  # on an error too: orbax's background work (cleaning up unfinished
            # saves, saving) must end before the interpreter does, or it prints tracebacks
            if getattr(self, "checkpointer", None) is not None:
                self.checkpointer.close()
            if lock is not None:
                lock.release()

    def prepare(self) -> None:
        """Check the settings against a resumed run's; prepare the corpus (or reuse its
        preparation), and build the batches, the model and its trainer."""
        settings = self.settings.train
        self.checkpointer = Checkpointer(self.workdir, keep=settings.keep, clean_up=True,
                                         best=settings.keep_best)
        self.resuming = self.checkpointer.latest_step() is not None
        if self.init is None and settings.init_from:
            self.init = finetune.read_init_dir(settings.init_from)
            finetune.check_settings(self.settings, self.init)
        init, recorded = self.init, recorded_settings(self.settings)
        if init is not None:
            recorded[FINGERPRINT] = finetune.fingerprint(init.directory)
            log(f"fine-tuning {init.directory} (fingerprint {recorded[FINGERPRINT]})")
        check_run_settings(self.workdir, recorded, self.resuming, self.primary)
        special_ids = self.prepare_data(recorded.get(FINGERPRINT))
        config = self.model_config()
        saved = self.checkpointer.data_state() if self.resuming else None
        vocab_sizes = config.src_vocab_size, config.tgt_vocab_size  # the ids the model embeds
        self.batches = make_batches({split: self.data.sides(split, vocab_sizes)
                                     for split in SPLITS},
                                    self.settings.data, settings.seed, special_ids,
                                    {split: self.data.fingerprint(split) for split in SPLITS},
                                    batch_multiple(saved))
        weights = None
        if init is not None and not self.resuming:  # a resume restores its own weights
            _, tensors = checkpoint_dir.load_dir(init.directory)
            weights = {k: v.astype(np.float32) for k, v in tensors.items()}
        self.trainer = build_trainer(config, settings, weights)
        num_params = sum(p.size for p in jax.tree.leaves(self.trainer.initial_state.params))
        layers = (f"{config.num_encoder_layers}+{config.num_decoder_layers}"
                  if config.architecture == "encoder_decoder" else config.num_decoder_layers)
        scan = " (scanned)" if layers_scanned(settings) else ""
        log(f"model: {config.architecture}, {num_params / 1e6:.2f}M parameters, d_model "
            f"{config.d_model}, {layers} layers{scan}, {settings.dtype} compute, "
            f"{jax.device_count()} {jax.devices()[0].platform} device(s)")
        if settings.fsdp > 1:
            held = {k: v / 2**20 for k, v in state_bytes(self.trainer.initial_state).items()}
            log(f"--fsdp {settings.fsdp}: each device holds {held['device_state_bytes']:,.1f} "
                f"MiB of the {held['state_bytes']:,.1f} MiB of parameters and Adam moments")

    def prepare_data(self, init_fingerprint: str | None) -> tuple[int, int, int]:
        """The prepared corpus and the tokenizer (fine-tuning: the checkpoint's own, never
        a new one); returns the special ids (pad, bos, eos) the batches use."""
        workdir, resumed_step, init = self.workdir, self.checkpointer.latest_step(), self.init
        if init is None:
            self.data = prepared_corpus(workdir, self.settings, resumed_step, self.primary)
            self.tokenizer = run_tokenizer(workdir, self.data, self.resuming, self.primary)
            return PAD_ID, BOS_ID, EOS_ID
        codes = finetune.language_codes(self.settings)
        self.tokenizer = finetune.install_tokenizer(init, workdir, codes, self.primary)
        log(f"tokenizer: {init.directory}'s ({type(self.tokenizer).__name__}: "
            f"{', '.join(finetune.tokenizer_files(init.directory))})"
            + (" {} -> {}".format(*codes) if any(codes) else ""))
        self.data = prepared_corpus(workdir, self.settings, resumed_step, self.primary,
                                    self.tokenizer, f"{init_fingerprint} {codes}")
        return init.config.pad_id, init.config.bos_id, init.config.eos_id

    def model_config(self) -> TransformerConfig:
        """A resumed run's config.json; else the new one (from --init-from's and the model
        flags, or the flags alone), written to the work directory."""
        config_path = self.workdir / CONFIG_FILE
        if self.resuming and config_path.exists():
            return TransformerConfig.from_json(config_path)
        data_settings, model_settings, _ = self.settings
        if self.init is not None:
            config = finetune.run_config(self.init.config, model_settings)
        else:
            config = model_settings.config(self.tokenizer.vocab_size, data_settings.max_len,
                                           data_settings.architecture)
        if self.primary:
            write_atomically(config_path, config.to_json)
        return config

    def train(self):
        """The loop: steps up to --steps, or until --time-budget has passed; metrics,
        evaluations, checkpoints. Returns the final state, saved, and the run's report
        (batches, compiling, speed, what stopped it). SIGINT/SIGTERM: the step finishes
        and is saved (train.runtime.interrupts), then signals.Interrupted says so. The host
        reads no device value between the logging points (late_metrics.py)."""
        settings, checkpointer = self.settings.train, self.checkpointer
        compiled_before = compiling.CompileCounter.snapshot()
        state, batches = self.restore()
        start_step = step = int(jax.device_get(state.step))  # counted on the host from here on
        # Opened before compiling, so that once "compiled in" is printed a stop is deferred
        # to the end of a step (and saved) without a gap.
        metrics_log = MetricsLog(self.workdir / METRICS_FILE, start_step, enabled=self.primary,
                                 tensorboard=self.workdir / TENSORBOARD_DIR
                                 if settings.tensorboard else None)
        policy = selection.Policy(settings, self.workdir / METRICS_FILE if self.primary else None)
        finished = policy.patience.spent()  # a resumed run that stopped early: finish it untrained
        ahead_seconds = 0.0 if finished else self.compile_ahead(state, step)
        updates = Prefetcher(batches, self.trainer.shard_batch, settings.accumulate)
        data_state = batches.get_state()  # the position of the batches trained on so far
        real_tokens, started = 0, time.time()
        seconds_before_training = time.monotonic() - self.started
        deadline = (self.started + settings.time_budget if settings.time_budget is not None
                    else None)
        self.last_saved = start_step if self.resuming else None
        late = LateMetrics(settings.log_every, started)
        host_seconds = []  # per step, the loop thread's CPU time: its batch taken, dispatched
        progress = progress_bar(total=settings.steps, initial=start_step, desc="train",
                                unit="step", disable=settings.quiet or not self.primary)
        with interrupts.deferred_stops(deadline) as stops, progress, \
                contextlib.closing(metrics_log), contextlib.closing(updates):
            programs_ahead = 0 if finished else self.log_compiled(
                compiled_before, ahead_seconds, start_step, metrics_log)
            if finished:
                stops.stop_early()
            while step < settings.steps and not stops.agreed(step):
                began, began_cpu = time.time(), time.thread_time()  # the budget had time left
                update = next(updates)
                state, metrics = self.step(state, update.micro_batches)
                step, data_state = step + 1, update.data_state
                real_tokens += update.tokens
                late.add(step, metrics, update.tokens, began)
                host_seconds.append(time.thread_time() - began_cpu)
                self.after_step(state, step, data_state, late, (metrics_log, progress),
                                policy, stops)
            self.write_metrics(late, True, metrics_log, progress)  # before the final save
            self.say_why_stopped(stops, policy.patience, step, start_step, seconds_before_training)
            if step != self.last_saved:  # a signal or the budget between checkpoints
                checkpointer.save(state, data_state)
            checkpointer.wait()
        if stops.signum is not None:
            raise signals.Interrupted(f"{signal.Signals(stops.signum).name}: saved step "
                                      f"{step} in {checkpointer.manager.directory}; "
                                      "run the same command to resume", stops.signum)
        report = training_report(
            self.batches["train"], steps=step - start_step, compiled_before=compiled_before,
            ahead_seconds=ahead_seconds, seconds=time.time() - started, real_tokens=real_tokens,
            seconds_before_training=seconds_before_training,
            first_step_done=late.first_step_done, stopped_by=stops.stopped_by(),
            host_seconds=host_seconds, data_bytes=self.data.split_bytes("train"))
        self.log_trained(report, programs_ahead)
        return state, report

    def after_step(self, state, step: int, data_state: dict, late: LateMetrics, outputs,
                   policy: selection.Policy, stops: interrupts.StopRequests) -> None:
        """What `policy` says is due after `step`: the metrics read into `outputs` (the
        metrics log and the progress bar), an evaluation, a checkpoint (with the
        evaluation's scores); a stop request once --patience has run out."""
        evaluate, save = policy.due(step)
        if late.due() or evaluate or save:
            loss = self.write_metrics(late, evaluate or save, *outputs)
        scores = self.evaluate_dev(state, step, loss, outputs[0]) if evaluate else None
        if scores and policy.judge(step, scores):
            stops.stop_early()
        if save:
            self.checkpointer.save(state, data_state, metrics=scores)
            self.last_saved = step

    def restore(self):
        """The state to train from and the training batches' iterator: a resumed run's
        newest intact checkpoint and its data position, or the initial state."""
        state = self.trainer.initial_state
        batches = self.batches["train"].iterator(local_rows=self.trainer.local_rows)
        if self.resuming:
            state, data_state = self.checkpointer.restore_newest_intact(state, warn=log)
            step = int(jax.device_get(state.step))
            set_data_position(batches, data_state, self.settings.data, step)
            log(f"resumed from step {step} ({self.checkpointer.manager.directory})")
        return state, batches

    def log_compiled(self, compiled_before, ahead_seconds: float, start_step: int,
                     metrics_log: MetricsLog) -> int:
        """What compiling took, printed and (with a fine-tuning run's starting scores, at
        step 0) written to the metrics log; returns the programs compiled or loaded."""
        compiled = compiling.CompileCounter.since(compiled_before)  # once stops are deferred
        log(f"compiled in {ahead_seconds:.1f} s: {counted(compiled['programs'], 'program')} "
            f"compiled, {compiled['cache_hits']} loaded from the cache")
        if self.start is not None and start_step == 0:  # the starting model, at step 0
            metrics_log.write(step=0, dev_loss=self.start["dev"]["loss"],
                              dev_nll=self.start["dev"]["nll"],
                              dev_perplexity=self.start["dev"]["perplexity"])
        if start_step < self.settings.train.steps:  # at the first step these programs train
            metrics_log.write(step=start_step + 1, compile_seconds=round(ahead_seconds, 2))
        return compiled["programs"] + compiled["cache_hits"]

    @staticmethod
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

    def write_metrics(self, late: LateMetrics, all_steps: bool, metrics_log: MetricsLog,
                      progress) -> float | None:
        """The late metrics read (every step's when `all_steps`) into the metrics log and
        the progress bar; returns the newest loss read."""
        read = self.checked(late, all_steps, self.last_saved)
        for m in read:
            metrics_log.write(step=m.step, loss=m.loss, lr=m.lr, grad_norm=m.grad_norm,
                              tokens=m.tokens, tokens_per_s=round(m.tokens_per_s, 1),
                              elapsed=round(m.elapsed, 3))
            progress.set_postfix(loss=f"{m.loss:.3f}", lr=f"{m.lr:.2e}",
                                 tok_s=f"{m.tokens_per_s:,.0f}", refresh=False)
            progress.update(1)
        return read[-1].loss if read else None

    def evaluate_dev(self, state, step: int, loss: float, metrics_log: MetricsLog) -> dict:
        """The dev loss at `step` (label-smoothed, as training's), the dev nll and perplexity
        exp(nll) and, translating, BLEU and chrF of the dev set translated
        (--dev-bleu-sentences), written and printed beside the newest training loss;
        returns the scores as --keep-best names them."""
        dev = heldout_loss(self.trainer, state, self.batches["dev"])
        with jax.transfer_guard("allow"):  # the translation puts its sources on the device
            scores = self.task.dev_scores(self.trainer.local_model(state), self.tokenizer,
                                          self.data.examples("dev"), self.settings.train)
        self.dev_scores = step, scores
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

    def say_why_stopped(self, stops: interrupts.StopRequests, patience: selection.Patience,
                        step: int, start_step: int, setting_up: float) -> None:
        """A line when --time-budget or --patience stopped the run (see budget_spent)."""
        if stops.out_of_time:
            self.budget_spent(step, start_step, setting_up)
        if stops.stopped_early:
            log(f"{patience.reason()}: stopping after step {step}" if self.primary
                else f"--patience: stopping after step {step}, as process 0 decided")

    def budget_spent(self, step: int, start_step: int, setting_up: float) -> None:
        """After --time-budget ran out: a TrainError when it did before the first step of
        a new run (nothing trained, so nothing is saved or exported); else a line saying
        so, after one more when it did before the first step of a resumed run (whose
        saved model is exported)."""
        budget = self.settings.train.time_budget
        if step == start_step == 0:
            raise TrainError(f"--time-budget {budget:g} s ran out before the first training "
                             f"step (setting up took {setting_up:.1f} s: the corpus, the "
                             "tokenizer and compiling): no step ran, so no checkpoint was "
                             "saved and no model exported; give a longer budget")
        if step == start_step:
            log(f"--time-budget {budget:g} s ran out before this run's first step: no step "
                f"ran; exporting and evaluating step {step} as it was saved")
        log(f"--time-budget {budget:g} s spent: stopping after step {step}")

    def compile_ahead(self, state, step: int) -> float:
        """Compile the step's programs for every batch shape before the first step (or
        load them from the cache); returns the seconds it took."""
        settings = self.settings.train
        programs = self.trainer.programs(state, self.batches["train"].shapes(),
                                         settings.accumulate)
        with signals.signal_handlers(signals.exit_at_once(
                f"stopped while compiling, before step {step + 1}; saved checkpoints "
                "are intact; run the same command to resume")):
            log(f"compiling {counted(len(programs), 'program')} ahead of time ("
                + (f"cache {self.compile_cache})" if self.compile_cache else "no cache)"))
            return compiling.compile_ahead(programs, log)

    def step(self, state, micro_batches):
        """One optimizer update on --accumulate micro-batches: (state, device metrics)."""
        if len(micro_batches) == 1:
            return self.trainer.train_step(state, micro_batches[0])
        return self.trainer.accumulate(state, micro_batches)

    def checked(self, late: LateMetrics, all_steps: bool, last_saved: int | None):
        """The late metrics; a non-finite one stops the run before any save, saying which
        checkpoint is the last good one."""
        try:
            return late.read(all_steps)
        except TrainingDiverged as e:
            self.checkpointer.wait()
            where = (f"the last good checkpoint is step {last_saved} in "
                     f"{self.checkpointer.manager.directory}" if last_saved is not None
                     else "no checkpoint was written")
            raise TrainingDiverged(f"{e}; {where}") from None

    def export(self, state) -> None:
        """WORKDIR/export: the model and its tokenizer as a checkpoint directory."""
        model = self.trainer.local_model(state)  # every process: with --fsdp, a gathering
        if self.primary:  # whole or not at all: a failure keeps the earlier export
            with directory_written_whole(self.workdir / "export") as tmp:
                if self.init is not None:  # the tokenizer files it came with
                    model.save_pretrained(tmp)
                    names = finetune.copy_tokenizer(self.workdir, tmp)
                else:
                    model.save_pretrained(tmp, tokenizer=self.tokenizer.path)
                    names = [self.tokenizer.path.name]
            log(f"exported {self.workdir / 'export'} (config.json, model.safetensors, "
                f"{', '.join(names)})")

    def evaluate(self, state, report: dict, export: dict) -> dict:
        """The exported model's (`state`: --export's choice) held-out losses, dev scores
        and test evaluation (the test set decoded); writes eval.json (with this process's
        training `report`, which holds every process's digest of the trained state, and
        what was exported) and the figures."""
        model = self.trainer.local_model(state)
        results = {"step": int(state.step), "export": export, "training": report}
        for split in ("dev", "test"):
            results[split] = heldout_loss(self.trainer, state, self.batches[split])
        results["dev"].update(self.final_dev_scores(model, state, export))
        started = time.time()
        decoded = self.task.evaluate_test(model, self.tokenizer, self.data.examples("test"),
                                          self.settings.train, log)
        results["decoding"], results["samples"] = decoded["decoding"], decoded["samples"]
        results["test"].update(decoded["test"])
        results["test"]["decode_seconds"] = round(time.time() - started, 1)
        if self.start is not None:
            results["start"] = self.start
        if not self.primary:
            return results
        write_text_atomically(self.workdir / "eval.json", json.dumps(results, indent=2) + "\n")
        plots.loss_curve(self.workdir / METRICS_FILE, self.workdir / "loss.png")
        if results["samples"]:
            self.task.attention_figure(model, self.tokenizer, results["samples"][0],
                                       self.workdir / "attention.png")
        return results

    def final_dev_scores(self, model, state, export: dict) -> dict:
        """The exported model's dev BLEU and chrF: the last evaluation's where it judged
        this model (--export last, trained up to here), else translated now."""
        step, scores = self.dev_scores
        if export["model"] == "last" and step == int(state.step):
            return scores
        return self.task.dev_scores(model, self.tokenizer, self.data.examples("dev"),
                                    self.settings.train)

    def evaluate_start(self) -> dict:
        """A fine-tuning run's starting model before its first step: the held-out losses
        and the test evaluation (BLEU, ...) the final evaluation repeats, logged and kept
        in WORKDIR/start_eval.json (a resumed run reads them back)."""
        path = self.workdir / START_EVAL_FILE
        if self.resuming:  # the weights are the checkpoint's now, not the starting ones
            if path.exists():
                return json.loads(path.read_text())
            log(f"{path} is missing: eval.json will have no \"start\"")
            return None
        state = self.trainer.initial_state
        start = {split: heldout_loss(self.trainer, state, self.batches[split])
                 for split in ("dev", "test")}
        decoded = self.task.evaluate_test(self.trainer.local_model(state), self.tokenizer,
                                          self.data.examples("test"), self.settings.train,
                                          log)
        start["test"].update(decoded["test"])
        scores = ", ".join(f"{k} {v:.4g}" for k, v in decoded["test"].items()
                           if k in ("bleu", "chrf", "exact_match", "second_half_match"))
        log(f"before fine-tuning: dev loss {start['dev']['loss']:.4f}, test loss "
            f"{start['test']['loss']:.4f}, test {scores}")
        if self.primary:
            write_text_atomically(path, json.dumps(start, indent=2) + "\n")
        return start
