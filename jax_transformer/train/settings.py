"""The settings of a training run, as typed, frozen configs.

train.py parses its flags into these three at the boundary; the run reads only
them. Field names are the flags' (`--d-model` -> `d_model`), and run_args.json
records them flat under those names, so a resumed run can be checked flag by flag.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from transformer_core.config import TransformerConfig
from transformer_core.errors import InputError
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
MIN_MAX_LEN = 8  # the shortest length bucket
ACTIVATIONS = ("relu", "gelu", "silu")
POSITION_LAYOUTS = ("interleaved", "half_split")
# What train.py trains, and the architecture each task's model has.
TASK_ARCHITECTURES = {"translate": "encoder_decoder", "lm": "decoder_only"}
# Flags whose default differs by task (train.py applies them before parsing the rest):
# the built-in counting text is learnt in fewer steps than the number translations.
TASK_DEFAULTS = {"lm": {"steps": 400}}
# Settings added after run_args.json files were first written: a file without one
# was written by a run that used this value, so it resumes.
ADDED_SETTINGS = {"activation": "relu", "position_layout": "interleaved", "task": "translate",
                  "text_path": None}


class TrainError(InputError):
    """A training run cannot start as asked (settings, work directory)."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise TrainError(message)


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The task, its corpus, the tokenizer and the batches. No paths: the built-in
    number corpus (translate) or counting text (lm)."""
    task: str = "translate"  # or "lm": a decoder-only language model on lines of text
    text_path: str | None = None  # lm: one example per line
    src_lang: str = "en"
    tgt_lang: str = "de"
    num_train: int = 50_000
    max_number: int = 1_000_000
    src_path: str | None = None
    tgt_path: str | None = None
    columns_path: str | None = None
    src_column: str = "source"
    tgt_column: str = "target"
    dev_src_path: str | None = None
    dev_tgt_path: str | None = None
    test_src_path: str | None = None
    test_tgt_path: str | None = None
    num_dev: int = 1000
    num_test: int = 1000
    tokenizer_type: str = "unigram"
    vocab_size: int = 8000
    max_len: int = 256
    max_tokens: int = 4096  # per micro-batch, padding included

    def __post_init__(self):
        require(self.task in TASK_ARCHITECTURES, f"--task must be one of "
                f"{', '.join(TASK_ARCHITECTURES)}, got {self.task!r}")
        pair_flags = [f"--{name.replace('_', '-')}" for name in
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
            if bool(src) != bool(tgt):
                raise TrainError(f"--{split.replace('_', '-')}src-path and "
                                 f"--{split.replace('_', '-')}tgt-path go together")
        for name in ("num_train", "num_dev", "num_test", "max_number"):
            require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1, "
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

    @property
    def architecture(self) -> str:
        return TASK_ARCHITECTURES[self.task]


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The model's size and variant; the vocabulary comes from the tokenizer."""
    d_model: int = 128
    heads: int = 4
    d_ff: int = 512
    layers: int = 3
    dropout: float = 0.1
    pre_norm: bool = False  # pre-LN with final norms instead of the paper's post-LN
    activation: str = "relu"  # the FFN's; silu is opus-mt's ("swish")
    position_layout: str = "interleaved"  # half_split: Marian's, for `port --to hf-marian`

    def __post_init__(self):
        for name in ("d_model", "heads", "d_ff", "layers"):
            require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1, "
                                              f"got {getattr(self, name)}")
        require(self.d_model % self.heads == 0, f"--d-model {self.d_model} must be divisible "
                                                f"by --heads {self.heads}")
        require(0 <= self.dropout < 1, f"--dropout must be in [0, 1), got {self.dropout}")
        for name, choices in (("activation", ACTIVATIONS), ("position_layout", POSITION_LAYOUTS)):
            require(getattr(self, name) in choices, f"--{name.replace('_', '-')} must be one of "
                    f"{', '.join(choices)}, got {getattr(self, name)!r}")

    def config(self, vocab_size: int, max_len: int,
               architecture: str = "encoder_decoder") -> TransformerConfig:
        """The model config; --layers gives each stack its layers (a single-stack
        config keeps num_encoder_layers = num_decoder_layers, unused by one of them)."""
        return TransformerConfig(
            architecture=architecture, src_vocab_size=vocab_size, tgt_vocab_size=vocab_size,
            d_model=self.d_model, num_heads=self.heads, d_ff=self.d_ff,
            num_encoder_layers=self.layers, num_decoder_layers=self.layers,
            dropout=self.dropout, max_len=max_len,
            pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, pre_norm=self.pre_norm,
            final_norm=self.pre_norm, activation=self.activation,
            position_layout=self.position_layout)


def default_compile_cache() -> str:
    """$JAX_COMPILATION_CACHE_DIR if set, else the user cache directory's
    jax_transformer/xla: compiled programs are shared by every run of this user."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(Path(cache_home, "jax_transformer",
                                                                   "xla"))


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Optimisation, checkpoints, evaluation and output."""
    workdir: str = "runs/numbers"
    steps: int = 1200
    warmup: int = 400
    lr_scale: float = 1.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    accumulate: int = 1
    dtype: str = "float32"
    seed: int = 0  # the corpus split, data order, initialisation and dropout
    checkpoint_every: int = 200
    keep: int = 3
    eval_every: int = 200
    beam: int = 1
    decode_batch_size: int = 250
    samples: int = 5
    temperature: float = 0.8  # lm: the printed samples' sampling temperature
    distributed: bool = False
    quiet: bool = False
    tensorboard: bool = True  # event files in WORKDIR/tensorboard/
    compile_cache: str | None = dataclasses.field(default_factory=default_compile_cache)
    time_budget: float | None = None  # seconds from the run's start; None = no limit

    def __post_init__(self):
        require(self.lr_scale > 0, f"--lr-scale must be positive, got {self.lr_scale}")
        require(self.time_budget is None or self.time_budget > 0,
                f"--time-budget must be positive (seconds), got {self.time_budget}")
        require(0 <= self.label_smoothing < 1,
                f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        require(self.clip_norm >= 0, f"--clip-norm must be 0 (off) or positive, "
                                     f"got {self.clip_norm}")
        require(self.temperature >= 0, f"--temperature must be 0 (greedy) or positive, "
                                       f"got {self.temperature}")
        require(self.samples >= 0, f"--samples must be 0 or more, got {self.samples}")


# Settings that only steer how long / how visibly a run goes; the others must
# match when a work directory is resumed.
RESUMABLE_CHANGES = frozenset({"workdir", "steps", "eval_every", "checkpoint_every", "keep",
                               "beam", "decode_batch_size", "samples", "temperature",
                               "distributed", "quiet", "tensorboard", "compile_cache",
                               "time_budget"})


def recorded(data: DataSettings, model: ModelSettings, train: TrainSettings) -> dict:
    """What run_args.json holds: every setting a resumed run must repeat."""
    values = {**dataclasses.asdict(data), **dataclasses.asdict(model),
              **dataclasses.asdict(train)}
    return {k: v for k, v in values.items() if k not in RESUMABLE_CHANGES}


def from_flags(values: dict) -> tuple[DataSettings, ModelSettings, TrainSettings]:
    """Split parsed flags (argparse's vars(args)) into the three settings."""
    def pick(cls):
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})
    return pick(DataSettings), pick(ModelSettings), pick(TrainSettings)
