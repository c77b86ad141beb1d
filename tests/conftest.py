"""Fixtures of tests/: the commands' tiny checkpoints, each module-scoped (a module that
uses one makes its own). They are defined in helpers.py, where
parity_tests/test_commands.py imports them too; shared code lives there."""

from tests.helpers import checkpoint, jax_checkpoint, tokenizer, torch_checkpoint  # noqa: F401
