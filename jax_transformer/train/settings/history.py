"""The history of train.py's settings, in one place: what older run_args.json files
hold and older command lines say, in today's names.

    upgrade(saved)      a run_args.json's settings, renamed and completed as today's
    OLD_FLAGS           flag spellings kept working after a setting was renamed

A setting added to the settings dataclasses gets an entry in ADDED_SETTINGS (the
value runs used before it existed), so that their work directories still resume;
a renamed one gets an entry in upgrade() and, for its flag, in OLD_FLAGS.
"""

from __future__ import annotations

# Settings added after run_args.json files were first written: a file without one was
# written by a run that used this value.
ADDED_SETTINGS = {"activation": "relu", "position_layout": "interleaved", "task": "translate",
                  "text_path": None, "layer_norm_eps": 1e-5, "scale_embeddings": True,
                  "position_encoding": "sinusoidal", "position_offset": 0,
                  "share_embeddings": True, "tie_output": True, "output_bias": False,
                  "lr_schedule": "paper", "lr": 5e-5, "freeze": "none",
                  "init_from_fingerprint": None, "src_lang_code": None, "tgt_lang_code": None}
# The model flags' spellings before they became TransformerConfig's field names
# (--layers, which set both stacks, is still a flag of its own: commands.train).
OLD_FLAGS = {"num_heads": ("--heads",)}


def upgrade(saved: dict) -> dict:
    """A run_args.json in today's names: `heads` and `layers` were the model settings
    before they became TransformerConfig's fields, and settings added since take the
    values those runs used."""
    saved = dict(saved)
    if "heads" in saved:
        saved["num_heads"] = saved.pop("heads")
    if "layers" in saved:
        saved["num_encoder_layers"] = saved["num_decoder_layers"] = saved.pop("layers")
    return {**ADDED_SETTINGS, **saved}
