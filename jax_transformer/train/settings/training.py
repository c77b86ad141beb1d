"""TrainSettings: optimisation, checkpoints, evaluation, output and the processes;
the defaults that differ by task, preset or fine-tuning."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from jax_transformer.train.settings.fields import (flag, name_metavars, refuse_empty_paths,
                                                   require, setting)

MAX_SEED = 2**32 - 1  # jax.random.key(seed) keeps a seed's low 32 bits (without x64)
MAX_WAIT_SECONDS = 86400  # --peer-timeout and --join-timeout: a day
# --cpu-devices: more devices than the CPU has cores only run slower, and JAX's start-up
# grows faster than the count (minutes for tens of thousands); no CPU has more cores.
MAX_CPU_DEVICES = 1024
# Defaults that differ by task: the built-in counting text is learnt in fewer steps
# than the number translations.
TASK_DEFAULTS = {"lm": {"steps": 400}}
# The learning-rate schedules (--lr-schedule): the paper's, for training from scratch,
# and the two that fine-tuning uses (fairseq's and Hugging Face's choices).
SCHEDULES = ("paper", "constant", "inverse_sqrt")
# Defaults that differ when train.py fine-tunes a checkpoint (--init-from): a short
# linear warm-up to --lr, then 1/sqrt(step).
FINETUNE_DEFAULTS = {"lr_schedule": "inverse_sqrt", "warmup": 100}
FREEZE_CHOICES = ("none", "embeddings")
SCAN_CHOICES = ("auto", "on", "off")  # --scan-layers
# --keep-best's metrics (metrics.jsonl's names), and whether higher or lower is better.
BEST_METRICS = {"dev_bleu": "max", "dev_chrf": "max", "dev_loss": "min"}
EXPORTS = ("last", "best", "average")  # --export
DEFAULT_AVERAGE_LAST = 5  # --export average's checkpoints: the paper's base models'
# The test translation of the paper's models: beam 4, length penalty 0.6 (--alpha's default).
PRESET_TRAIN_DEFAULTS = {"base": {"beam": 4}, "big": {"beam": 4}}


def default_compile_cache() -> str:
    """$JAX_COMPILATION_CACHE_DIR if set, else the user cache directory's
    jax_transformer/xla: compiled programs are shared by every run of this user."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(Path(cache_home, "jax_transformer",
                                                                   "xla"))


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Optimisation, checkpoints, evaluation and output."""
    workdir: str = setting("runs/numbers", "where checkpoints, metrics.jsonl, eval.json, "
                           "figures and the exported model go; an existing run there is resumed",
                           resumable=True)
    init_from: str | None = setting(
        None, "fine-tune: start from this checkpoint directory (a run's export/, or one "
              "jaxformer-port wrote) with its config, weights and own tokenizer (none is "
              "trained); the model flags default to its config.json and may only repeat it "
              "(--dropout may differ), --max-len to its max_len; --lr-schedule defaults to "
              f"{FINETUNE_DEFAULTS['lr_schedule']} and --warmup to {FINETUNE_DEFAULTS['warmup']}. "
              "The run evaluates the starting model before the first step. Its fingerprint "
              "is recorded: a resume needs the same DIR", metavar="DIR", resumable=True)
    src_lang_code: str | None = setting(
        None, "--init-from an M2M100/NLLB directory (required there, refused elsewhere): the "
              "corpus's source language as its tokenizer names it (fr, fra_Latn), put before "
              "each source sentence", metavar="CODE")
    tgt_lang_code: str | None = setting(
        None, "--init-from an M2M100/NLLB directory: the target language code, first in "
              "each target (the decoder learns it after </s>) and forced as the first token "
              "when the run translates the test set", metavar="CODE")
    steps: int = setting(1200, "optimizer updates in total; --task lm defaults to "
                               f"{TASK_DEFAULTS['lm']['steps']}", resumable=True)
    time_budget: float | None = setting(
        None, "dispatch no step once this many seconds since the start have passed (corpus, "
              "tokenizer and compiling count); the steps in flight (one, at most two) finish "
              "and the last is saved, then the run exports and evaluates as usual; a resumed "
              "run gets a fresh budget (default: no limit)",
        metavar="SECONDS", resumable=True)
    warmup: int = setting(400, "warm-up steps: the paper's schedule's, or the linear warm-up "
                               f"to --lr; --init-from defaults to {FINETUNE_DEFAULTS['warmup']}")
    lr_scale: float = setting(1.0, "multiplies the schedule d_model^-0.5 * min(step^-0.5, "
                                   "step * warmup^-1.5)")
    lr_schedule: str = setting(
        "paper", "paper: the paper's warm-up and decay scaled by --lr-scale (the default from "
                 "scratch); constant, or inverse_sqrt (the default with --init-from): a "
                 "linear warm-up over --warmup steps to --lr, then constant, or --lr * "
                 "sqrt(warmup / step) (fairseq's inverse_sqrt)", choices=SCHEDULES)
    lr: float = setting(5e-5, "peak learning rate of --lr-schedule constant and inverse_sqrt "
                              "(the paper's schedule is scaled by --lr-scale instead)")
    freeze: str = setting("none", "embeddings: keep the token embeddings (and a learned "
                                  "position table) as they are; a tied output projection is "
                                  "the target embedding, so it stays too", choices=FREEZE_CHOICES)
    label_smoothing: float = setting(0.1, "mass spread over the vocabulary; padding is ignored")
    clip_norm: float = setting(0.0, "clip gradients to this global norm; 0 = off")
    accumulate: int = setting(1, "micro-batches per update, gradients summed exactly")
    dtype: str = setting("float32", "compute dtype; parameters and optimizer state stay "
                                    "float32", choices=("float32", "bfloat16"))
    scan_layers: str = setting(
        "auto", "on: run each layer stack as one nnx scan over layers stacked on a leading "
                "axis, so the step compiles in about the same time at any depth; off: a "
                "loop, every layer compiled on its own; auto: the backend's default "
                "(jax_transformer.scanned.SCAN_BY_DEFAULT). Checkpoints are the same either "
                "way: a run resumes with the other setting", choices=SCAN_CHOICES, resumable=True)
    scan_unroll: int = setting(1, "with scanning on, layers per iteration of the scan "
                                  "(jax.lax.scan's unroll): more compiles longer", resumable=True)
    seed: int = setting(0, "seeds the corpus split, data order, initialisation and dropout "
                           f"(0 to {MAX_SEED})")
    checkpoint_every: int = setting(200, "steps between orbax checkpoints", resumable=True)
    keep: int = setting(3, "checkpoints kept (the newest)", resumable=True)
    eval_every: int = setting(200, "steps between evaluations: the dev loss, and dev BLEU and "
                                   "chrF (--dev-bleu-sentences)", resumable=True)
    dev_bleu_sentences: int = setting(
        1000, "translation: dev sentences (the first N) translated at each evaluation with "
              "the test translation's search, for dev BLEU and chrF; 0 = none", metavar="N",
        resumable=True)
    keep_best: str | None = setting(
        None, "also keep the checkpoint with the best METRIC (dev_loss, or dev_bleu or "
              "dev_chrf of a translation run) besides the newest --keep ones; each evaluation "
              "then saves a checkpoint", choices=tuple(BEST_METRICS), metavar="METRIC",
        resumable=True)
    patience: int | None = setting(
        None, "stop once --keep-best's metric has not improved for N evaluations in a row "
              "(every process after the same step); the run is saved, exported and "
              "evaluated, and the same command again finishes it without training",
        metavar="N", resumable=True)
    export: str = setting(
        "last", "the model WORKDIR/export holds, and the final evaluation judges: last: the "
                "trained one; best: --keep-best's checkpoint; average: the mean of the newest "
                "--average-last checkpoints (the paper's)", choices=EXPORTS, resumable=True)
    average_last: int | None = setting(
        None, f"--export average: how many of the newest checkpoints (default "
              f"{DEFAULT_AVERAGE_LAST}; the paper: 5 for base models, 20 for big); --keep must be "
              "at least this", metavar="N", resumable=True)
    log_every: int = setting(1, "steps between reads of the training metrics (loss, gradient "
                                "norm) from the devices; each read waits only for the step "
                                "before the one just started, so the devices never idle on it",
                                resumable=True)
    beam: int = setting(1, "beam size of the test (and dev BLEU) translation; 1 = greedy, "
                           "quick enough to translate the dev set at every evaluation on a "
                           "CPU; --preset base and big default to 4, the paper's and "
                           "jaxformer-translate's default", resumable=True)
    alpha: float = setting(0.6, "beam search's length penalty ((5 + length) / 6) ** alpha "
                                "(GNMT's; the paper's 0.6)", resumable=True)
    decode_batch_size: int = setting(250, "sentences per batch when translating the test and "
                                          "dev sets", resumable=True)
    samples: int = setting(5, "sample translations (or continuations) printed at the end",
                           resumable=True)
    temperature: float = setting(0.8, "--task lm: sampling temperature of the printed "
                                      "continuations; 0 = greedy", resumable=True)
    distributed: bool = setting(False, "several processes (hosts) as one run: join JAX's "
                                       "distributed runtime (docs/distributed.md); the three "
                                       "settings below, else JAX_COORDINATOR_ADDRESS, "
                                       "JAX_NUM_PROCESSES, JAX_PROCESS_ID, else the cluster's "
                                       "(Cloud TPU, SLURM, Open MPI)", resumable=True)
    coordinator_address: str | None = setting(None, "--distributed: HOST:PORT where process 0 "
                                              "serves the coordinator", metavar="HOST:PORT",
                                              resumable=True)
    coordinator_bind_all_interfaces: bool = setting(
        False, "--distributed: process 0's coordinator listens on every network interface "
               "at the coordinator's port, not only on the --coordinator-address it is given "
               "(for a host that others reach by an address it does not hold, behind NAT); "
               "whoever reaches the port can end or stall the run (docs/distributed.md)",
        resumable=True)
    num_processes: int | None = setting(None, "--distributed: how many processes the run has",
                                        resumable=True)
    process_id: int | None = setting(None, "--distributed: this process's number, 0 to "
                                     "--num-processes - 1", resumable=True)
    peer_timeout: float = setting(20.0, "--distributed: a process that stops answering for "
                                        "this many seconds ends the run on every process "
                                        f"(at most {MAX_WAIT_SECONDS})",
                                  metavar="SECONDS", resumable=True)
    join_timeout: float = setting(300.0, "--distributed: how long a process waits at the start "
                                         "for every process to join the run (process 0 serves "
                                         "the coordinator the others connect to); it says what "
                                         "it waits for after a few seconds "
                                         f"(at most {MAX_WAIT_SECONDS})",
                                  metavar="SECONDS", resumable=True)
    cpu_devices: int | None = setting(
        None, f"on a CPU: JAX devices to split it into (at most {MAX_CPU_DEVICES}), each "
              "running its share of a batch's rows (data parallel); default: JAX_NUM_CPU_DEVICES or XLA_FLAGS' count if "
              "set, else 2 where the cores and a batch's rows allow (faster on 2 cores, "
              "docs/performance.md); a resumed run may change it to a number dividing the "
              "device count its checkpoint was saved on (its batches keep their rows, which "
              "are rounded down to a multiple of that count), not to another",
        metavar="N", resumable=True)
    fsdp: int = setting(1, "fully sharded data parallelism: split every parameter and Adam "
                           "moment over N devices, so each holds 1/N of the model's training "
                           "state (docs/training.md); N must divide the device count; 1: "
                           "every device holds all of it; a resumed run may change it",
                        metavar="N", resumable=True)
    quiet: bool = setting(False, "no progress bar", resumable=True)
    tensorboard: bool = setting(True, "write TensorBoard event files in WORKDIR/tensorboard/, "
                                      "for `tensorboard --logdir WORKDIR`", resumable=True)
    compile_cache: str | None = setting(
        help="JAX's persistent compilation cache: a repeated or resumed run loads its "
             "compiled programs from here (--no-compile-cache: none)",
        factory=default_compile_cache, metavar="DIR", resumable=True)

    def __post_init__(self):
        refuse_empty_paths(self)
        for name in ("steps", "warmup", "accumulate", "checkpoint_every", "keep", "eval_every",
                     "log_every", "beam", "decode_batch_size", "scan_unroll", "fsdp"):
            require(getattr(self, name) >= 1, f"{flag(name)} must be at least 1, "
                                              f"got {getattr(self, name)}")
        require(self.cpu_devices is None or 1 <= self.cpu_devices <= MAX_CPU_DEVICES,
                f"--cpu-devices must be from 1 to {MAX_CPU_DEVICES} (no CPU has more cores to "
                "give them, and JAX takes minutes to start tens of thousands of devices), "
                f"got {self.cpu_devices}")
        require(self.lr_scale > 0, f"--lr-scale must be positive, got {self.lr_scale}")
        require(self.lr > 0, f"--lr must be positive, got {self.lr}")
        require(self.lr_schedule in SCHEDULES, f"--lr-schedule must be one of "
                                               f"{', '.join(SCHEDULES)}, got {self.lr_schedule!r}")
        require(self.scan_layers in SCAN_CHOICES, f"--scan-layers must be one of "
                f"{', '.join(SCAN_CHOICES)}, got {self.scan_layers!r}")
        require(self.freeze in FREEZE_CHOICES, f"--freeze must be one of "
                                               f"{', '.join(FREEZE_CHOICES)}, got {self.freeze!r}")
        require(self.time_budget is None or self.time_budget > 0,
                f"--time-budget must be positive (seconds), got {self.time_budget}")
        for name in ("src_lang_code", "tgt_lang_code"):
            require(self.init_from or getattr(self, name) is None,
                    f"{flag(name)} names a language of the tokenizer of an M2M100/NLLB "
                    "checkpoint to fine-tune; it needs --init-from DIR")
        require(0 <= self.label_smoothing < 1,
                f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        require(self.clip_norm >= 0, f"--clip-norm must be 0 (off) or positive, "
                                     f"got {self.clip_norm}")
        require(0 <= self.temperature < math.inf, f"--temperature must be 0 (greedy) or "
                f"positive, got {self.temperature}")
        # JAX keys take 32 bits of a seed: 2**32 would be seed 0 again; numpy refuses -1.
        require(0 <= self.seed <= MAX_SEED, f"--seed must be from 0 to {MAX_SEED}, "
                                            f"got {self.seed}")
        require(self.samples >= 0, f"--samples must be 0 or more, got {self.samples}")
        for name in ("peer_timeout", "join_timeout"):  # JAX takes whole seconds in a C int
            require(0 < getattr(self, name) <= MAX_WAIT_SECONDS, f"{flag(name)} must be "
                    f"positive and at most {MAX_WAIT_SECONDS} (seconds, a day), "
                    f"got {getattr(self, name)}")
        self.check_selection()
        coordinates = [flag(name) for name in ("coordinator_address", "num_processes",
                                               "process_id") if getattr(self, name) is not None]
        if self.coordinator_bind_all_interfaces:
            coordinates.append(flag("coordinator_bind_all_interfaces"))
        require(self.distributed or not coordinates,
                f"{' '.join(coordinates)} place this process in a distributed run: add "
                "--distributed")

    def check_selection(self) -> None:
        """--keep-best, --patience, --export, --average-last and the dev translation."""
        require(self.dev_bleu_sentences >= 0, f"--dev-bleu-sentences must be 0 (none) or "
                                              f"more, got {self.dev_bleu_sentences}")
        require(0 <= self.alpha < math.inf, f"--alpha must be a number >= 0 (0: no length "
                                            f"penalty), got {self.alpha}")
        require(self.keep_best is None or self.keep_best in BEST_METRICS,
                f"--keep-best must be one of {', '.join(BEST_METRICS)}, got {self.keep_best!r}")
        require(self.patience is None or self.patience >= 1,
                f"--patience must be at least 1, got {self.patience}")
        require(self.patience is None or self.keep_best,
                f"--patience {self.patience} counts evaluations without improvement of "
                f"--keep-best's metric: give --keep-best {' | '.join(BEST_METRICS)}")
        require(self.export in EXPORTS, f"--export must be one of {', '.join(EXPORTS)}, "
                                        f"got {self.export!r}")
        require(self.export != "best" or self.keep_best,
                f"--export best exports --keep-best's checkpoint: give --keep-best "
                f"{' | '.join(BEST_METRICS)}")
        require(self.average_last is None or self.average_last >= 1,
                f"--average-last must be at least 1, got {self.average_last}")
        require(self.average_last is None or self.export == "average",
                f"--average-last {self.average_last} counts the checkpoints --export average "
                f"averages, and the export is --export {self.export}: add --export average, "
                "or drop --average-last")
        require(self.export != "average" or self.keep >= self.averaged_checkpoints,
                f"--export average averages the newest --average-last "
                f"{self.averaged_checkpoints} checkpoints: --keep must be at least "
                f"{self.averaged_checkpoints}, got {self.keep}")
        require(self.keep_best not in ("dev_bleu", "dev_chrf") or self.dev_bleu_sentences,
                f"--keep-best {self.keep_best} needs the dev set translated: "
                "--dev-bleu-sentences must be at least 1")

    @property
    def averaged_checkpoints(self) -> int:
        """--export average: how many of the newest checkpoints it averages."""
        return self.average_last or DEFAULT_AVERAGE_LAST


name_metavars(TrainSettings)
