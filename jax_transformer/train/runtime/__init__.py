"""The process a run lives in: signals, the other processes, compiling, memory, JAX's
variables. Nothing here knows train.py's settings; each function takes plain values.
See jax_transformer/train/__init__.py for the module map."""
