"""The settings of a training run: typed, frozen dataclasses, and the one vocabulary of
train.py's flags.

A flag is the field it sets (`--d-model` -> `d_model`) and its help text is the
field's metadata: jax_transformer.commands.train generates the command line from
these dataclasses. ModelSettings holds TransformerConfig's own fields, with their
help, less those the data decide (vocabulary, special ids, max_len, architecture)
and final_norm, which follows pre_norm. Each field says where it is defined whether
a resumed run may change it (`resumable`); run_args.json records the others flat
under these names, so a resumed run can be checked flag by flag. Files written
before a setting existed or was renamed still resume: train.run_args keeps that
history.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_origin, get_type_hints

from jax_transformer.data.prepared.store import damaged
from jax_transformer.train.run_args import OLD_FLAGS
from transformer_core.config import (Activation, ConfigError, PositionEncoding, PositionLayout,
                                     TransformerConfig, WeightInit)
from transformer_core.errors import TrainError
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
MIN_MAX_LEN = 8  # the shortest length bucket
MAX_SEED = 2**32 - 1  # jax.random.key(seed) keeps a seed's low 32 bits (without x64)
MAX_WAIT_SECONDS = 86400  # --peer-timeout and --join-timeout: a day
# --cpu-devices: more devices than the CPU has cores only run slower, and JAX's start-up
# grows faster than the count (minutes for tens of thousands); no CPU has more cores.
MAX_CPU_DEVICES = 1024
# What train.py trains, and the architecture each task's model has.
TASK_ARCHITECTURES = {"translate": "encoder_decoder", "lm": "decoder_only"}
# Defaults that differ by task: the built-in counting text is learnt in fewer steps
# than the number translations.
TASK_DEFAULTS = {"lm": {"steps": 400}}
# Named model sizes (--preset), as fairseq's --arch and Flax WMT's configs name them;
# flags given beside a preset override it.
PRESETS = {
    "tiny": dict(d_model=128, num_heads=4, d_ff=512, num_encoder_layers=3,
                 num_decoder_layers=3, dropout=0.1),  # the built-in corpus, on a CPU
    "base": dict(d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6,
                 num_decoder_layers=6, dropout=0.1),  # the paper's base (table 3)
    "big": dict(d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=6,
                num_decoder_layers=6, dropout=0.3),  # the paper's big
}
DEFAULT_PRESET = "tiny"
# TransformerConfig fields the run sets itself: from the tokenizer, --max-len and --task.
DERIVED_MODEL_FIELDS = ("architecture", "src_vocab_size", "tgt_vocab_size", "max_len",
                        "pad_id", "bos_id", "eos_id", "final_norm")
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


def require(condition: bool, message: str) -> None:
    if not condition:
        raise TrainError(message)


def setting(default: Any = None, help: str = "", *, factory=None, aliases=(),
            resumable: bool = False, **argparse_options):
    """A settings field: its default, its --help text, the flag's other spellings and any
    argparse options (choices, metavar) for the flag generated from it (the metadata
    keys simple_parsing reads). `resumable`: the setting only steers how long or how
    visibly a run goes, so a resumed run may change it; the others must repeat the
    run_args.json a run records."""
    custom_args = dict(argparse_options)
    metadata = {"help": help, "alias": list(aliases), "custom_args": custom_args,
                "resumable": resumable}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The settings that name a file or directory. An empty one is an unset shell variable
# (--init-from "$CKPT"), refused rather than read as none or as the current directory.
PATH_SETTINGS = ("data", "text_path", "src_path", "tgt_path", "columns_path", "dev_src_path",
                 "dev_tgt_path", "test_src_path", "test_tgt_path", "workdir", "init_from",
                 "compile_cache")


def refuse_empty_paths(settings) -> None:
    """A TrainError naming the first of `settings`' PATH_SETTINGS that is ""."""
    for name in PATH_SETTINGS:
        require(getattr(settings, name, None) != "",
                f"{flag(name)} is an empty path (an unset shell variable?)")


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The task, its corpus, the tokenizer and the batches (default: the built-in
    number-words corpus; with --task lm, the built-in counting text)."""
    data: str | None = setting(None, "a corpus jaxformer-prepare made, whose corpus flags are "
                               "the defaults (else: prepared in WORKDIR/data)", metavar="DIR",
                               resumable=True)
    task: str = setting("translate", "translate: an encoder-decoder on sentence pairs; lm: a "
                        "decoder-only language model on lines of text, which also prints "
                        "sampled continuations", choices=tuple(TASK_ARCHITECTURES))
    text_path: str | None = setting(None, "--task lm: a UTF-8 text file, one example "
                                    "(sentence, paragraph) per line; --num-dev and --num-test "
                                    "lines are held out")
    src_lang: str = setting("en", "number corpus source language, a num2words code; with "
                            "--task lm, the counting text's language")
    tgt_lang: str = setting("de", "number corpus target language")
    num_train: int = setting(50_000, "number corpus training pairs, or counting text lines")
    max_number: int = setting(1_000_000, "number corpus draws numbers below this; counting "
                              "lines start below it")
    src_path: str | None = setting(None, "parallel text: source file, one sentence per line")
    tgt_path: str | None = setting(None, "parallel text: target file, line-aligned with "
                                   "--src-path")
    columns_path: str | None = setting(None, "a TSV (.tsv) or CSV file with a header row")
    src_column: str = setting("source", "source column of --columns-path")
    tgt_column: str = setting("target", "target column of --columns-path")
    dev_src_path: str | None = setting(None, "parallel text: dev set source (default: hold out "
                                       "--num-dev training pairs)")
    dev_tgt_path: str | None = setting(None, "parallel text: dev set target")
    test_src_path: str | None = setting(None, "parallel text: test set source (default: hold "
                                        "out --num-test training pairs)")
    test_tgt_path: str | None = setting(None, "parallel text: test set target")
    num_dev: int = setting(1000, "held-out pairs (or lines) for the dev set")
    num_test: int = setting(1000, "held-out pairs (or lines) for the test set")
    tokenizer_type: str = setting("unigram", "SentencePiece model type; the paper used "
                                  "byte-pair encoding", choices=("unigram", "bpe"))
    vocab_size: int = setting(8000, "shared SentencePiece vocabulary size; smaller if the text "
                              "has fewer pieces")
    max_len: int = setting(256, "longest sentence in tokens; longer pairs (or lines) are "
                           "skipped and counted")
    max_tokens: int = setting(4096, "token budget per micro-batch (--accumulate of them make "
                              "one update), padding included, like fairseq's --max-tokens")

    def __post_init__(self):
        refuse_empty_paths(self)
        require(self.task in TASK_ARCHITECTURES, f"--task must be one of "
                f"{', '.join(TASK_ARCHITECTURES)}, got {self.task!r}")
        pair_flags = [flag(name) for name in
                      ("src_path", "tgt_path", "columns_path", "dev_src_path", "dev_tgt_path",
                       "test_src_path", "test_tgt_path") if getattr(self, name)]
        if self.task == "lm":
            require(not pair_flags, f"--task lm trains on --text-path (one example per line), "
                                    f"not on sentence pairs: drop {' '.join(pair_flags)}")
        else:
            require(not self.text_path, "--text-path is for --task lm; a translation corpus is "
                                        "--src-path/--tgt-path or --columns-path")
        for split in ("", "dev_", "test_"):
            src, tgt = getattr(self, f"{split}src_path"), getattr(self, f"{split}tgt_path")
            require(bool(src) == bool(tgt), f"{flag(split + 'src_path')} and "
                                            f"{flag(split + 'tgt_path')} go together")
        for name in ("num_train", "num_dev", "num_test", "max_number", "max_tokens"):
            require(getattr(self, name) >= 1, f"{flag(name)} must be at least 1, "
                                              f"got {getattr(self, name)}")
        require(self.vocab_size > len(SPECIAL_IDS), f"--vocab-size must be more than the "
                f"{len(SPECIAL_IDS)} special pieces (pad, unk, bos, eos), got {self.vocab_size}")
        require(self.max_len >= MIN_MAX_LEN, f"--max-len must be at least {MIN_MAX_LEN}, "
                                             f"got {self.max_len}")
        require(self.max_tokens >= self.max_len, f"--max-tokens {self.max_tokens} cannot hold "
                f"one sentence of --max-len {self.max_len} tokens; raise it or lower --max-len")

    @property
    def builtin(self) -> bool:
        return not (self.src_path or self.columns_path or self.text_path)

    def preparation(self) -> dict:
        """What a prepared corpus's key records of these settings: PREPARED_FIELDS."""
        return {name: getattr(self, name) for name in PREPARED_FIELDS}

    def held_out(self, available: int, source: str, unit: str,
                 given: tuple[str, ...] = ()) -> tuple[int, int]:
        """(dev, test): how many of the `available` usable examples of `source` to hold
        out (none for a split in `given`, which has files of its own); a TrainError naming
        --num-dev / --num-test when that leaves none to train on."""
        sizes = {split: 0 if split in given else getattr(self, f"num_{split}")
                 for split in ("dev", "test")}
        if sum(sizes.values()) >= available:
            flags = [f"{flag('num_' + split)} {n}" for split, n in sizes.items() if n]
            raise TrainError(f"{' + '.join(flags)} held-out {unit} leave none of the "
                             f"{available} usable {unit} of {source} to train on; lower "
                             + ("them" if len(flags) > 1 else "it"))
        return sizes["dev"], sizes["test"]

    @property
    def architecture(self) -> str:
        return TASK_ARCHITECTURES[self.task]


PREPARED_FIELDS = tuple(f.name for f in dataclasses.fields(DataSettings)  # a preparation's
                        if f.name not in ("data", "max_tokens"))


def prepared_settings(recorded: dict, manifest: str | os.PathLike) -> dict:
    """The corpus settings a prepared directory's `manifest` records (its key's "corpus"):
    PREPARED_FIELDS, each of its flag's type; a CorpusError naming the manifest when one
    is missing or of another type."""
    types = get_type_hints(DataSettings)
    for name in PREPARED_FIELDS:
        if name not in recorded:
            problem = f"has no key.corpus.{name}"
        elif not isinstance(recorded[name], types[name]) or isinstance(recorded[name], bool):
            problem = f"has key.corpus.{name} {recorded[name]!r}, not a value {flag(name)} takes"
        else:
            continue
        raise damaged(manifest, problem)
    return {name: recorded[name] for name in PREPARED_FIELDS}


def from_prepared(data: DataSettings, recorded: dict, directory: str) -> DataSettings:
    """`data` with the corpus settings a prepared directory recorded (prepared_settings');
    a TrainError naming the flag when one given differs from them (a flag at its default
    follows them)."""
    for name in PREPARED_FIELDS:
        given, then = getattr(data, name), recorded[name]
        if given != then and given != getattr(DataSettings, name):
            raise TrainError(f"--data {directory} was prepared with {flag(name)} {then!r}; "
                             f"drop {flag(name)} {given!r}, or prepare the corpus again")
    return dataclasses.replace(data, **{name: recorded[name] for name in PREPARED_FIELDS})


def model_setting(name: str, resumable: bool = False):
    """A model flag: TransformerConfig's field `name` with its help text, defaulting to
    the tiny preset's value (the command line sets the chosen preset's)."""
    field = CONFIG_FIELDS[name]
    return setting(PRESETS[DEFAULT_PRESET].get(name, field.default), field.metadata["help"],
                   aliases=OLD_FLAGS.get(name, ()), resumable=resumable)


CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(TransformerConfig)}


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """TransformerConfig's fields, less those the data decide; --preset picks their
    defaults."""
    # TransformerConfig's fields less DERIVED_MODEL_FIELDS, which the data decide; a
    # field added to TransformerConfig is added here too (tests/train/test_train.py checks).
    d_model: int = model_setting("d_model")
    num_heads: int = model_setting("num_heads")
    d_ff: int = model_setting("d_ff")
    num_encoder_layers: int = model_setting("num_encoder_layers")
    num_decoder_layers: int = model_setting("num_decoder_layers")
    dropout: float = model_setting("dropout")
    pre_norm: bool = model_setting("pre_norm")
    activation: Activation = model_setting("activation")
    layer_norm_eps: float = model_setting("layer_norm_eps")
    scale_embeddings: bool = model_setting("scale_embeddings")
    position_encoding: PositionEncoding = model_setting("position_encoding")
    position_layout: PositionLayout = model_setting("position_layout")
    position_offset: int = model_setting("position_offset")
    share_embeddings: bool = model_setting("share_embeddings")
    tie_output: bool = model_setting("tie_output")
    output_bias: bool = model_setting("output_bias")
    # how the weights were first drawn: a resumed run restores them
    weight_init: WeightInit = model_setting("weight_init", resumable=True)
    init_std: float = model_setting("init_std", resumable=True)

    def __post_init__(self):
        """Valid when the TransformerConfig it makes is: ConfigError's message, with the
        fields named as the flags that set them."""
        try:
            self.config(vocab_size=max(SPECIAL_IDS) + 1, max_len=MIN_MAX_LEN)
        except ConfigError as e:
            names = "|".join(f.name for f in dataclasses.fields(self))
            raise TrainError(re.sub(rf"\b({names})\b", lambda m: flag(m.group(1)),
                                    str(e))) from None

    def config(self, vocab_size: int, max_len: int,
               architecture: str = "encoder_decoder") -> TransformerConfig:
        """The model config: these settings, the tokenizer's vocabulary and special ids,
        --max-len, the task's architecture; final norms with pre-LN (as torch.nn's)."""
        return TransformerConfig(
            **dataclasses.asdict(self), architecture=architecture, src_vocab_size=vocab_size,
            tgt_vocab_size=vocab_size, max_len=max_len, pad_id=PAD_ID, bos_id=BOS_ID,
            eos_id=EOS_ID, final_norm=self.pre_norm)


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


def _name_metavars(*settings_classes) -> None:
    """Each flag's value is shown by its field's name (--steps STEPS), as argparse
    shows its own flags; booleans and choices show what they take."""
    for cls in settings_classes:
        types = get_type_hints(cls)
        for field in dataclasses.fields(cls):
            custom_args = field.metadata["custom_args"]
            if ("choices" not in custom_args and get_origin(types[field.name]) is not Literal
                    and types[field.name] is not bool):
                custom_args.setdefault("metavar", field.name.upper())


_name_metavars(DataSettings, ModelSettings, TrainSettings)


# The settings a resumed run may change (`resumable` fields); --init-from's directory
# may move: its fingerprint, recorded as "init_from_fingerprint", must match. So may
# --data's: the data's fingerprint, saved with each checkpoint's data position, must.
RESUMABLE_CHANGES = frozenset(field.name for cls in (DataSettings, ModelSettings, TrainSettings)
                              for field in dataclasses.fields(cls)
                              if field.metadata["resumable"])


class RunSettings(NamedTuple):
    """Everything a training run is told: data, model, training."""
    data: DataSettings
    model: ModelSettings
    train: TrainSettings
