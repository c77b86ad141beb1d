r"""jaxformer-train (= python train.py): train a translator, or with --task lm a
decoder-only language model.

With no flags: the built-in corpus (English number words -> German, generated
locally with num2words) and a small model, end to end on a CPU in minutes.
With flags: your corpus, the paper's model sizes, GPUs/TPUs, several hosts.

    jaxformer-train --workdir runs/numbers
    jaxformer-prepare --output data/wmt --src-path train.en --tgt-path train.de \
        --vocab-size 32000 --tokenizer-type bpe      # once, on every core; then:
    jaxformer-train --workdir runs/wmt --data data/wmt --preset base --max-tokens 25000
    jaxformer-train --workdir runs/wmt --src-path train.en --tgt-path train.de \
        --preset base --max-tokens 25000 --steps 100000 --warmup 4000 --dtype bfloat16
    jaxformer-train --task lm --workdir runs/counting       # built-in text: counting in words
    jaxformer-train --task lm --workdir runs/lm --text-path book.txt   # one example per line
    jaxformer-train --workdir runs/ft --init-from ckpt/opus-en-de \
        --src-path train.en --tgt-path train.de --lr 3e-5 --steps 2000  # fine-tune a checkpoint
    jaxformer-train --workdir runs/m2m --init-from ckpt/m2m100 --src-path train.en \
        --tgt-path train.fr --src-lang-code en --tgt-lang-code fr  # M2M100/NLLB: its codes

Running it again on the same --workdir resumes from the latest checkpoint.
SIGTERM or Ctrl-C finishes the current step, saves it and exits (docs/faults.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from simple_parsing import ArgumentParser, DashVariant
from simple_parsing.help_formatter import SimpleHelpFormatter
from simple_parsing.wrappers import DataclassWrapper, FieldWrapper

from jax_transformer.commands import exit_codes, parsing
from jax_transformer.data.prepared.directory import MANIFEST, Prepared
from jax_transformer.train import finetune
from jax_transformer.train.runtime import jax_variables
from jax_transformer.train.settings import RunSettings
from jax_transformer.train.settings.data import DataSettings, from_prepared, prepared_settings
from jax_transformer.train.settings.model import DEFAULT_PRESET, PRESETS, ModelSettings
from jax_transformer.train.settings.training import (FINETUNE_DEFAULTS, PRESET_TRAIN_DEFAULTS,
                                                     TASK_DEFAULTS, TrainSettings)
from transformer_core.errors import TrainError


def add_default_choosers(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags that choose other flags' defaults (--preset, --layers), and
    --no-compile-cache."""
    p.add_argument("--preset", choices=PRESETS, default=DEFAULT_PRESET,
                   help="named model sizes, whose fields the model flags default to: "
                        + "; ".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sizes.items())
                                    for name, sizes in PRESETS.items())
                        + " (default: %(default)s)")
    p.add_argument("--layers", type=int, metavar="N",
                   help="encoder and decoder layers each (sets --num-encoder-layers and "
                        "--num-decoder-layers, which override it)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="compile everything afresh and keep nothing")
    return p


@dataclasses.dataclass(frozen=True)
class DefaultChoosers:
    """What the command line says before its flags are parsed, because other flags'
    defaults come from it: --preset and --layers, the task, and the --init-from
    checkpoint (read and checked once) or the corpus settings --data DIR was prepared
    with (DIR checked once)."""
    preset: str
    layers: int | None
    task: str
    init: finetune.InitDir | None
    prepared: dict | None


def pre_parse(argv=None) -> DefaultChoosers:
    """The one pre-parse of the command line (bad values wait for the full parser)."""
    p = add_default_choosers(parsing.ArgumentParser(prog="jaxformer-train", add_help=False))
    for flag in ("--task", "--init-from", "--data"):
        p.add_argument(flag)
    known = p.parse_known_args(argv)[0]
    init = finetune.read_init_dir(known.init_from) if known.init_from else None
    prepared = (prepared_settings(Prepared(known.data).key["corpus"],
                                  os.path.join(known.data, MANIFEST)) if known.data else None)
    default_task = (init.task if init and init.task else
                    prepared["task"] if prepared else "translate")
    return DefaultChoosers(known.preset, known.layers, known.task or default_task, init, prepared)


class SettingsParser(parsing.OneLineErrors, ArgumentParser):
    """simple_parsing's parser, which makes the flags from the settings dataclasses, with
    parsing.OneLineErrors."""


class SettingsFlag(FieldWrapper):
    """simple_parsing's flag of a settings field, in argparse's own forms: a boolean is a
    switch with a --no- form (`--quiet`, `--no-quiet`), where simple_parsing's takes an
    optional value (`--quiet [bool]`); a flag whose default is None takes its value, where
    simple_parsing's takes it optionally (`--init-from` alone meaning no DIR)."""

    def get_arg_options(self) -> dict:
        options = super().get_arg_options()
        if self.type is bool:
            return {"action": argparse.BooleanOptionalAction, "dest": options["dest"],
                    "default": options["default"], "help": options["help"]}
        if options.get("nargs") == "?":
            del options["nargs"]
        return options


# The help's title of each settings group, by its destination.
GROUP_TITLES = {"data": "data", "model": "model", "train": "training"}


class SettingsGroup(DataclassWrapper):
    """A settings dataclass's flags (SettingsFlag) as a group of the help, under its title
    in GROUP_TITLES and described by the dataclass's docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, field_wrapper_class=SettingsFlag, **kwargs)

    @property
    def title(self) -> str:
        return GROUP_TITLES[self.dest]


class HelpFormatter(SimpleHelpFormatter):
    """simple_parsing's help, which shows each flag's default and keeps the description as
    written, less the defaults that say nothing: None (the help says what no value
    means) and a store_true switch's False."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action, argparse._StoreTrueAction):
            return action.help
        return super()._get_help_string(action)


def build_parser(argv=None, chosen: DefaultChoosers | None = None) -> ArgumentParser:
    """train.py's command line, generated from the settings dataclasses; the defaults of
    the model flags come from --preset (and --layers), --steps' from --task; with
    --init-from DIR, the model flags', --task's and --max-len's from DIR's config and
    the schedule's from FINETUNE_DEFAULTS."""
    chosen = chosen or pre_parse(argv)
    init = chosen.init
    model_defaults = dict(PRESETS[chosen.preset])
    data_defaults = {"task": chosen.task}
    train_defaults = {**TASK_DEFAULTS.get(chosen.task, {}),
                      **PRESET_TRAIN_DEFAULTS.get(chosen.preset, {})}
    if init is not None:  # DIR's model; a flag given beside it may only repeat it
        if any(arg == "--preset" or arg.startswith("--preset=") for arg in arguments(argv)):
            raise TrainError(f"--preset picks a new model's sizes; --init-from {init.directory} "
                             "brings its own: drop --preset")
        model_defaults = finetune.model_defaults(init.config)
        data_defaults.update(max_len=init.config.max_len,
                             max_tokens=max(DataSettings.max_tokens, init.config.max_len))
        train_defaults = {**TASK_DEFAULTS.get(chosen.task, {}), **FINETUNE_DEFAULTS}
    if chosen.layers is not None:
        model_defaults.update(num_encoder_layers=chosen.layers, num_decoder_layers=chosen.layers)
    p = SettingsParser(prog="jaxformer-train", description=__doc__,
                       formatter_class=HelpFormatter,
                       add_option_string_dash_variants=DashVariant.DASH,
                       add_config_path_arg=False)
    add_default_choosers(p)
    p.add_arguments(DataSettings, dest="data", default=DataSettings(**data_defaults),
                    dataclass_wrapper_class=SettingsGroup)
    p.add_arguments(ModelSettings, dest="model", default=ModelSettings(**model_defaults),
                    dataclass_wrapper_class=SettingsGroup)
    p.add_arguments(TrainSettings, dest="train", default=TrainSettings(**train_defaults),
                    dataclass_wrapper_class=SettingsGroup)
    return p


def arguments(argv=None) -> list[str]:
    return list(sys.argv[1:] if argv is None else argv)


def command_line(argv=None) -> tuple[RunSettings, finetune.InitDir | None]:
    """The flags as the run's settings, and the --init-from checkpoint, read once; bad
    values raise a TrainError naming the flag. With --data DIR, the corpus settings are
    the ones DIR was prepared with."""
    chosen = pre_parse(argv)
    args = build_parser(argv, chosen).parse_args(argv)
    train, data = args.train, args.data
    if args.no_compile_cache:
        train = dataclasses.replace(train, compile_cache=None)
    if data.data:
        if train.init_from:
            raise TrainError(f"--data {data.data} holds a corpus encoded with its own "
                             f"tokenizer; --init-from {train.init_from} brings the "
                             "checkpoint's: drop --data, and give the corpus files")
        data = from_prepared(data, chosen.prepared, data.data)
    if data.task == "lm" and train.keep_best in ("dev_bleu", "dev_chrf"):
        raise TrainError(f"--keep-best {train.keep_best} scores translations; a --task lm run "
                         "keeps the best by dev_loss")
    settings = RunSettings(data, args.model, train)
    if chosen.init is not None:
        finetune.check_settings(settings, chosen.init)
    return settings, chosen.init


def parse_args(argv=None) -> RunSettings:
    """The flags as the run's settings (command_line's)."""
    return command_line(argv)[0]


def main(argv=None) -> int:
    """The command line; returns the exit code (exit_codes: 2 for bad input, 1 for a
    failed run, 130 / 143 after SIGINT / SIGTERM, the step saved). A failed run whose
    exit would wait leaves at once (exit_would_wait)."""
    code = exit_codes.run(train, argv)
    if code in (1, 2) and exit_would_wait():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def exit_would_wait() -> bool:
    """Whether the interpreter's exit would wait minutes: in a --distributed run, JAX's
    shutdown barrier for peers that stop too (docs/distributed.md); after a run its disk
    stopped, the threads of the checkpoint save that failed (train/disk_full.py). Asked
    of the modules a run loaded, if it loaded them (bad flags load neither)."""
    jax = sys.modules.get("jax")
    disk = sys.modules.get("jax_transformer.train.disk_full")
    return ((jax is not None and jax.distributed.is_initialized())
            or (disk is not None and disk.save_threads_waiting()))


def train(argv=None) -> int:
    settings, init = command_line(argv)  # bad flags fail here, before JAX loads
    jax_variables.import_jax()
    from jax_transformer.train import run
    summary = run.run(settings, init)
    print(json.dumps(final_results(settings, summary), indent=2), file=sys.stdout)
    return 0


def final_results(settings: RunSettings, summary: dict) -> dict:
    """What train.py prints at the end, from the run's summary: the losses and test
    scores, the search that translated the test set ("test_decoding": jaxformer-translate
    searches with beam 4 unless told, where the tiny preset's run is greedy), where a
    fine-tuning run started, and the work directory."""
    test = summary["test"]
    results = {"step": summary["step"], "train_seconds": summary["train_seconds"],
               "dev_loss": round(summary["dev"]["loss"], 4), "test_loss": round(test["loss"], 4),
               "test_perplexity": round(test["perplexity"], 3)}
    if settings.data.task == "lm":
        results.update(dev_nll=round(summary["dev"]["nll"], 4), test_nll=round(test["nll"], 4),
                       test_unigram_entropy=round(test["unigram_entropy"], 4),
                       test_second_half_match=test["second_half_match"])
    else:
        results.update(test_decoding=summary["decoding"], test_exact_match=test["exact_match"],
                       test_bleu=round(test["bleu"], 2),
                       test_bleu_order=test["bleu_order"], test_chrf=round(test["chrf"], 2),
                       test_bleu_signature=test["bleu_signature"])
        if "bleu_note" in test:  # BLEU-4 means nothing on this test set: say why not
            results.update(test_bleu4=round(test["bleu4"], 2), test_bleu_note=test["bleu_note"])
    start = summary.get("start")
    if start:  # a fine-tuning run: where it started
        results["start_dev_loss"] = round(start["dev"]["loss"], 4)
        if "bleu" in start["test"]:
            results["start_test_bleu"] = round(start["test"]["bleu"], 2)
    return {**results, "workdir": settings.train.workdir}


if __name__ == "__main__":
    sys.exit(main())
