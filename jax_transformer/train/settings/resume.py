"""What a resumed run must repeat: WORKDIR/run_args.json, the settings a new run
records (`recorded_settings`: every one a resume may not change, the `resumable`
fields left out) and the --init-from checkpoint it started from (FINGERPRINT), checked
against the saved ones when the run resumes. Older files are read in today's names
(history.upgrade).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from jax_transformer.train.records.workdir import write_text_atomically
from jax_transformer.train.settings import history, RunSettings
from jax_transformer.train.settings.data import DataSettings
from jax_transformer.train.settings.model import ModelSettings
from jax_transformer.train.settings.training import TrainSettings
from transformer_core.errors import TrainError

RUN_ARGS_FILE = "run_args.json"
FINGERPRINT = "init_from_fingerprint"  # run_args.json: the --init-from checkpoint's digest
# The settings a resumed run may change (`resumable` fields); --init-from's directory
# may move: its fingerprint, recorded as FINGERPRINT, must match. So may --data's: the
# data's fingerprint, saved with each checkpoint's data position, must.
RESUMABLE_CHANGES = frozenset(field.name for cls in (DataSettings, ModelSettings, TrainSettings)
                              for field in dataclasses.fields(cls)
                              if field.metadata["resumable"])


def recorded_settings(settings: RunSettings) -> dict:
    """What run_args.json holds: every setting a resumed run must repeat, flat."""
    values = {**dataclasses.asdict(settings.data), **dataclasses.asdict(settings.model),
              **dataclasses.asdict(settings.train)}
    return {k: v for k, v in values.items() if k not in RESUMABLE_CHANGES}


def check_run_settings(workdir: Path, settings: dict, resuming: bool,
                       primary: bool = True) -> None:
    """Record the settings of a new run (`recorded_settings`; the `primary` process
    writes them); refuse to resume one with other settings."""
    path = workdir / RUN_ARGS_FILE
    if resuming:
        saved = history.upgrade(read_run_settings(path))
        check_init_from(workdir, saved.get(FINGERPRINT), settings.get(FINGERPRINT))
        changed = sorted(k for k in settings if saved.get(k) != settings[k])
        if changed:
            detail = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)!r} -> {settings[k]!r}"
                               for k in changed)
            raise TrainError(f"{workdir} holds a run with other settings ({detail}); "
                             "resume with the same flags or use a new --workdir")
    elif primary:
        write_text_atomically(path, json.dumps(settings, indent=2, sort_keys=True) + "\n")


def read_run_settings(path: Path) -> dict:
    """A resumed run's run_args.json, which must be there and hold a JSON object: without
    it the checkpoints' settings are unknown, and a resume with other model flags would
    record them as the run's."""
    if not path.exists():
        raise TrainError(f"{path.parent} holds checkpoints but no {path.name} (the settings "
                         "they were trained with); restore it or use a new --workdir")
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TrainError(f"{path} is not valid JSON ({e}); restore it or use a new "
                         "--workdir") from None
    if not isinstance(saved, dict):
        raise TrainError(f"{path} holds {json.dumps(saved)[:40]}, not a JSON object of "
                         "settings; restore it or use a new --workdir")
    return saved


def check_init_from(workdir: Path, saved: str | None, given: str | None) -> None:
    """A resumed run starts from the checkpoint directory it started from (its
    fingerprint, train.finetune.fingerprint), or from none if it trained from scratch."""
    if saved == given:
        return
    if given is None:
        raise TrainError(f"{workdir} holds a fine-tuning run (--init-from a checkpoint with "
                         f"fingerprint {saved}): resume it with the same --init-from DIR")
    if saved is None:
        raise TrainError(f"{workdir} holds a run trained from scratch; fine-tune in a new "
                         "--workdir")
    raise TrainError(f"--init-from holds another checkpoint (fingerprint {given}) than the "
                     f"one the run in {workdir} started from ({saved}): resume with that "
                     "one, or fine-tune in a new --workdir")
