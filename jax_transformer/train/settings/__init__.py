"""The settings of a training run: typed, frozen dataclasses, and the one vocabulary of
train.py's flags.

    data.py      DataSettings: the task, its corpus, the tokenizer, the batches
    model.py     ModelSettings: TransformerConfig's fields; --preset's sizes
    training.py  TrainSettings: optimisation, checkpoints, evaluation, output, processes
    fields.py    setting(): a field, its flag, and whether a resume may change it
    history.py   older run_args.json files and flag spellings, in today's names
    resume.py    run_args.json: the settings a resumed run must repeat, checked

A flag is the field it sets (`--d-model` -> `d_model`) and its help text is the
field's metadata: jax_transformer.commands.train generates the command line from
these dataclasses. ModelSettings holds TransformerConfig's own fields, with their
help, less those the data decide (vocabulary, special ids, max_len, architecture)
and final_norm, which follows pre_norm. Each field says where it is defined whether
a resumed run may change it (`resumable`); run_args.json records the others flat
under these names, so a resumed run can be checked flag by flag. Files written
before a setting existed or was renamed still resume: history.py keeps that history.
"""

from __future__ import annotations

from typing import NamedTuple

from jax_transformer.train.settings.data import DataSettings
from jax_transformer.train.settings.model import ModelSettings
from jax_transformer.train.settings.training import TrainSettings


class RunSettings(NamedTuple):
    """Everything a training run is told: data, model, training."""
    data: DataSettings
    model: ModelSettings
    train: TrainSettings
