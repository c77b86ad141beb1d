"""What a training run writes as it goes: its work directory's lock and metrics log,
TensorBoard events, figures, eval.json's training report. Checkpoints, which hold
step.py's TrainState, live beside it in train/checkpoints.py. See
jax_transformer/train/__init__.py for the module map."""
