"""The operations model.py calls by name, each with a plain and a tuned version.

    Linear, linear          x @ W + b                                  linear.py
    LayerNorm, layer_norm   normalise over the last axis, scale, shift  layer_norm.py
    attention               softmax(q k^T / sqrt(Dh)) v per head        attention.py
    project_qkv, project_kv W_q(query), W_k(key_value), W_v(key_value)  attention.py
    Dropout, activation_dropout   dropout(activation(h))               dropout.py
    draw_keep_mask          dropout's keep mask from a key              dropout.py
    feed_forward            W_2(dropout(activation(W_1(x))))           feed_forward.py

model.py imports them from their modules. The plain version is the maths as
written, differentiated by autodiff; the tuned one computes the same values and
gradients faster (each module's docstring says how; docs/performance.md, "What made
the JAX step fast", what each saves). One exception: draw_keep_mask's tuned generator
(a counter hash) draws other masks from the same distribution, so it is on only where
it is known to help, XLA:CPU and GPUs (switch.KERNEL_EXCEPTIONS). Every speed trick in
the Flax model lives here. Which one runs is decided at one switch, switch.py: per backend
(`KERNELS_BY_BACKEND`, `KERNEL_EXCEPTIONS`), or for all kernels with the
environment variable JAX_TRANSFORMER_KERNELS=plain|tuned. The classes keep
nnx's parameter names and shapes, so the choice never changes a checkpoint.
"""

from jax_transformer.kernels.switch import KERNELS_BY_BACKEND, chosen, override


__all__ = ["KERNELS_BY_BACKEND", "chosen", "override"]
