"""Training maths and jit-compiled steps.

The label-smoothed loss, the paper's learning-rate schedule (and the fine-tuning
ones), Adam(0.9, 0.98, 1e-9) with optional global-norm clipping (optax), frozen
parameters, exact gradient accumulation,
and train/eval steps compiled once per batch shape with buffers donated.
Parallelism: a "data" x "fsdp" device mesh (train/runtime/sharding.py); the batch is split
over both axes, parameters and optimizer state along "fsdp" (--fsdp N; whole on every
device with --fsdp 1); a step gathers each layer's weights in that layer
(scanned.layers_gathered), and XLA inserts the gathers and gradient reductions.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer import scanned
from jax_transformer.data.batches.packed import BATCH_KEYS, TEXT_KEYS
from jax_transformer.masks import causal_mask, same_segment, segment_masks
from jax_transformer.model import TokenModel, build_model
from jax_transformer.pretrained import load_torch_state_dict
from jax_transformer.train.runtime import sharding


def label_smoothed_cross_entropy(logits, labels, pad_id: int, smoothing: float = 0.1):
    """Cross-entropy against (1 - smoothing) * one_hot + smoothing / V, summed over
    the non-pad labels. Returns (loss_sum, num_tokens); the loss is their ratio.

    logits (B, T, V), labels (B, T). Same definition as torch's
    F.cross_entropy(label_smoothing=..., ignore_index=pad_id).
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    # -sum_v target_v * log_softmax(logits)_v with target = (1 - s) one_hot + s / V,
    # written without materialising the (B, T, V) one-hot and target arrays.
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # (B, T)
    label_logits = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]  # (B, T)
    per_token = (log_normalizer - (1.0 - smoothing) * label_logits
                 - smoothing * jnp.mean(logits, axis=-1))  # (B, T)
    weights = labels != pad_id
    return jnp.sum(per_token * weights), jnp.sum(weights)


def model_inputs(batch, architecture: str = "encoder_decoder") -> dict:
    """The model's arguments for a batch. A translation batch holds {"src", "tgt_in"}
    ids; a single-stack model's batch the target side alone: "tgt_in" its input ids
    (and "tgt_out" one label per position: the next tokens for a decoder_only model).
    A packed batch (jax_transformer.data.batches.packed) adds segment ids and positions,
    which become masks that keep each sequence to itself, causal for decoders."""
    if architecture != "encoder_decoder":
        inputs = {"ids": batch["tgt_in"]}
        if "tgt_segments" in batch:
            segments = batch["tgt_segments"]
            mask = same_segment(segments, segments)  # (B, 1, L, L)
            if architecture == "decoder_only":
                mask = mask & causal_mask(segments.shape[1])
            inputs.update(mask=mask, positions=batch["tgt_positions"])
        return inputs
    inputs = {"src_ids": batch["src"], "tgt_ids": batch["tgt_in"]}
    if "src_segments" in batch:
        src_mask, tgt_mask, memory_mask = segment_masks(batch["src_segments"],
                                                        batch["tgt_segments"])
        inputs.update(src_mask=src_mask, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      src_positions=batch["src_positions"], tgt_positions=batch["tgt_positions"])
    return inputs


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0):
    """lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step from 1.

    optax counts updates from 0, so update n uses step n + 1.
    """
    def schedule(count):
        step = jnp.asarray(count, dtype=float) + 1.0  # float64 under jax_enable_x64
        return scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
    return schedule


def warmup_schedule(kind: str, peak: float, warmup_steps: int):
    """Fine-tuning schedules, step from 1: a linear warm-up to `peak` over `warmup_steps`,
    then "constant" `peak`, or "inverse_sqrt" peak * sqrt(warmup / step) (fairseq's
    inverse_sqrt; warm-up from 0)."""
    if kind not in ("constant", "inverse_sqrt"):
        raise ValueError(f"unknown schedule {kind!r}")

    def schedule(count):
        step = jnp.asarray(count, dtype=float) + 1.0
        warm = step / warmup_steps
        after = 1.0 if kind == "constant" else jnp.sqrt(warmup_steps / step)
        return peak * jnp.minimum(warm, after)
    return schedule


def make_schedule(settings, d_model: int):
    """--lr-schedule's schedule for a TrainSettings: the paper's, or a fine-tuning one."""
    if settings.lr_schedule == "paper":
        return paper_schedule(d_model, settings.warmup, settings.lr_scale)
    return warmup_schedule(settings.lr_schedule, settings.lr, settings.warmup)


def is_embedding(path) -> bool:
    """Whether a parameter path (jax.tree_util key path) is a token or position table."""
    return any(str(getattr(key, "key", getattr(key, "name", key))).endswith("_embed")
               for key in path)


def freeze(optimizer: optax.GradientTransformation, frozen=is_embedding
           ) -> optax.GradientTransformation:
    """`optimizer` for every parameter but those whose key path `frozen` picks, which
    get zero updates (and no optimizer state), so they stay bit for bit."""
    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "frozen" if frozen(path) else "trained", params)
    return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)


def make_optimizer(schedule, clip_norm: float | None = None) -> optax.GradientTransformation:
    """Adam(0.9, 0.98, eps 1e-9) as in the paper, after optional global-norm clipping."""
    adam = optax.adam(schedule, b1=0.9, b2=0.98, eps=1e-9)
    if clip_norm:
        return optax.chain(optax.clip_by_global_norm(clip_norm), adam)
    return adam


def build_trainer(config, settings, weights: dict | None = None) -> Trainer:
    """train.py's Trainer for `config` and its TrainSettings: the model in --dtype
    compute over float32 parameters (`weights`, torch-named arrays, loaded when
    given), its layer stacks scanned as --scan-layers says, and the optimizer of
    --lr-schedule, --clip-norm and --freeze."""
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[settings.dtype]
    model = build_model(config, rngs=nnx.Rngs(settings.seed), dtype=dtype,
                        param_dtype=jnp.float32)
    if weights is not None:
        load_torch_state_dict(model, weights)
    if layers_scanned(settings):
        scanned.scan_layers(model, settings.scan_unroll)
    schedule = make_schedule(settings, config.d_model)
    optimizer = make_optimizer(schedule, settings.clip_norm)
    if settings.freeze == "embeddings":
        optimizer = freeze(optimizer)
    return Trainer(model, optimizer, settings.label_smoothing,
                   mesh=sharding.make_mesh(settings.fsdp), schedule=schedule)


def layers_scanned(settings) -> bool:
    """Whether the layer stacks run as a scan: --scan-layers, whose "auto" follows the
    backend and scans whenever --fsdp splits the weights. With --fsdp, each layer's
    gradients are reduced inside the scan's loop; looped layers leave XLA's CPU
    compiler free to merge every layer's reduction into one at the step's end, with
    all the whole gradients alive (docs/training.md, --fsdp)."""
    if settings.scan_layers == "auto" and settings.fsdp > 1:
        return True
    return scanned.scan_wanted(settings.scan_layers, jax.default_backend())


@dataclasses.dataclass
class TrainState:
    """Everything a step reads and writes, as pytrees (what orbax saves)."""
    step: jax.Array
    params: nnx.State  # nnx.Param variables
    rngs: nnx.State  # dropout RNG counters: resuming continues the same random stream
    opt_state: Any


jax.tree_util.register_dataclass(TrainState, data_fields=["step", "params", "rngs", "opt_state"],
                                 meta_fields=[])


class Trainer:
    """Owns the model's graph definition, the optimizer and the compiled steps.

    `train_step(state, batch)` and `eval_step(state, batch)` take batches of
    {"src", "tgt_in", "tgt_out"} int32 arrays (B, L), packed ones with segment ids
    and positions too; for a single-stack model (a language model) the target
    side alone (`model_inputs`). jit compiles once per batch shape; the data
    pipeline uses a small fixed set of shapes.
    """

    def __init__(self, model: TokenModel, optimizer: optax.GradientTransformation,
                 label_smoothing: float = 0.1, mesh: jax.sharding.Mesh | None = None,
                 schedule: Callable | None = None):
        self.graphdef, params, rngs = nnx.split(model, nnx.Param, nnx.RngState)
        self.pad_id, self.architecture = model.config.pad_id, model.config.architecture
        self.optimizer = optimizer
        self.schedule = schedule  # the optimizer's: each step's metrics then hold its "lr"
        self.label_smoothing = label_smoothing
        self.mesh = mesh or sharding.make_mesh()
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(sharding.AXES))
        self.state_shardings = TrainState(
            step=self.replicated, params=sharding.shardings(params, self.mesh),
            rngs=jax.tree.map(lambda _: self.replicated, rngs),
            opt_state=sharding.shardings(jax.eval_shape(optimizer.init, params), self.mesh))
        # gathered for a step: the layers' weights one layer at a time, in run_layers
        self.whole_outside_layers = nnx.from_flat_state([
            (path, leaf if scanned.in_layer_stack(path)
             else jax.tree.map(lambda _: self.replicated, leaf))
            for path, leaf in nnx.to_flat_state(self.state_shardings.params)])
        params = sharding.place(params, self.state_shardings.params)
        # The moments are made where they live: no whole copy of them on one device.
        opt_state = jax.jit(optimizer.init, out_shardings=self.state_shardings.opt_state)(
            params)
        self.initial_state = TrainState(
            step=sharding.place(jnp.zeros((), jnp.int32), self.replicated), params=params,
            rngs=sharding.place(rngs, self.state_shardings.rngs), opt_state=opt_state)
        self.train_step = jax.jit(self._train_step, donate_argnums=0)
        self.grad_step = jax.jit(self._grad_step, donate_argnums=1)
        self.apply_step = jax.jit(self._apply_step, donate_argnums=(0, 1))
        self.eval_step = jax.jit(self._eval_step)

    def model(self, state: TrainState, deterministic: bool = True) -> TokenModel:
        model = nnx.merge(self.graphdef, state.params, state.rngs)
        return nnx.view(model, deterministic=deterministic)

    def local_model(self, state: TrainState) -> TokenModel:
        """The model (deterministic), whole, on this process's first device: decoding,
        figures and the export then need no other process. With --fsdp, gathering it is
        a collective: every process calls this."""
        params, rngs = jax.tree.map(sharding.local_copy, (state.params, state.rngs))
        return nnx.view(nnx.merge(self.graphdef, params, rngs), deterministic=True)

    def local_rows(self, rows: int) -> slice:
        """The rows of a global batch of `rows` rows that this process's devices hold
        (all of them in a one-process run)."""
        parts = self.batch_sharding.addressable_devices_indices_map((rows,)).values()
        return slice(min(part[0].indices(rows)[0] for part in parts),
                     max(part[0].indices(rows)[1] for part in parts))

    def shard_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Put this process's rows of a batch (`local_rows`; all rows in a one-process
        run) on its devices, as parts of global arrays split along the batch axis."""
        if jax.process_count() == 1:
            return jax.device_put(batch, self.batch_sharding)
        return {k: jax.make_array_from_process_local_data(self.batch_sharding, v)
                for k, v in batch.items()}

    # ------------------------------------------------------------------ steps

    def _logits(self, model: TokenModel, batch, deterministic: bool):  # (B, T, V)
        model = nnx.view(model, deterministic=deterministic)
        return model(**model_inputs(batch, self.architecture))

    def _gradients(self, state: TrainState, batch):
        """Gradient of the summed loss (not yet divided by the token count), split as
        the parameters are. With --fsdp each weight is gathered whole where it is used,
        a layer's weights in that layer (in the forward pass and again in the
        backward), so each device computes what data parallelism would, and the
        gradients are reduced back into their shards."""
        model = nnx.merge(self.graphdef, self.split_as(state.params, self.whole_outside_layers),
                          state.rngs)
        with self.layers_gathered():
            (loss_sum, num_tokens), grad_sum = nnx.value_and_grad(
                lambda m: label_smoothed_cross_entropy(self._logits(m, batch, False),
                                                       batch["tgt_out"], self.pad_id,
                                                       self.label_smoothing),
                has_aux=True)(model)
        grad_sum = self.split_as(grad_sum, self.state_shardings.params)
        return loss_sum, num_tokens, grad_sum, nnx.state(model, nnx.RngState)

    def layers_gathered(self):
        """With --fsdp, the context in which each layer gathers its weights (split
        as the rule splits them, then whole): jax_transformer.scanned.layers_gathered."""
        if self.mesh.shape["fsdp"] == 1:
            return contextlib.nullcontext()
        n = self.mesh.shape["fsdp"]

        def gather(layer_state):
            return jax.tree.map(lambda value: jax.lax.with_sharding_constraint(
                jax.lax.with_sharding_constraint(
                    value, NamedSharding(self.mesh, sharding.fsdp_spec(value.shape, n))),
                self.replicated), layer_state)
        return scanned.layers_gathered(gather)

    def _update(self, state: TrainState, grad_sum, loss_sum, num_tokens, rngs):
        """Normalise by the tokens seen and apply one optimizer update."""
        num_tokens = jnp.maximum(num_tokens, 1)
        grads = jax.tree.map(lambda g: g / num_tokens.astype(g.dtype), grad_sum)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        params, opt_state = self.split_as(
            (params, opt_state), (self.state_shardings.params, self.state_shardings.opt_state))
        metrics = {"loss": loss_sum / num_tokens, "tokens": num_tokens,
                   "grad_norm": optax.tree.norm(grads)}
        if self.schedule is not None:  # computed here, read with the loss: on the host, a
            # JAX op would wait behind the step dispatched after this one (late_metrics.py)
            metrics["lr"] = self.schedule(state.step)
        return TrainState(state.step + 1, params, rngs, opt_state), metrics

    def split_as(self, tree, shardings):
        """`tree` constrained to `shardings` inside a step; with --fsdp 1, where every
        array is whole on every device already, left to XLA (the step's program is then
        the data-parallel one, unchanged)."""
        if self.mesh.shape["fsdp"] == 1:
            return tree
        return jax.lax.with_sharding_constraint(tree, shardings)

    def _train_step(self, state: TrainState, batch):
        loss_sum, num_tokens, grad_sum, rngs = self._gradients(state, batch)
        return self._update(state, grad_sum, loss_sum, num_tokens, rngs)

    # Gradient accumulation: grad_step over k micro-batches sums gradients, losses
    # and token counts; apply_step then normalises once by the total token count,
    # so k micro-batches give exactly the gradient of one batch holding them all.
    def _grad_step(self, state: TrainState, accumulated, batch):
        loss_sum, num_tokens, grad_sum, rngs = self._gradients(state, batch)
        grads, losses, tokens = accumulated
        state = dataclasses.replace(state, rngs=rngs)
        return state, (jax.tree.map(jnp.add, grads, grad_sum), losses + loss_sum,
                       tokens + num_tokens)

    def _apply_step(self, state: TrainState, accumulated):
        grad_sum, loss_sum, num_tokens = accumulated
        return self._update(state, grad_sum, loss_sum, num_tokens, state.rngs)

    def _eval_step(self, state: TrainState, batch):
        """The label-smoothed loss (what training minimises) and the plain negative
        log-likelihood (what perplexity is made of), summed over the batch's tokens.
        With --fsdp the weights are gathered as the train step gathers them."""
        params = self.split_as(state.params, self.whole_outside_layers)
        with self.layers_gathered():
            logits = self._logits(nnx.merge(self.graphdef, params, state.rngs), batch, True)
        loss_sum, num_tokens = label_smoothed_cross_entropy(logits, batch["tgt_out"],
                                                            self.pad_id, self.label_smoothing)
        nll_sum, _ = label_smoothed_cross_entropy(logits, batch["tgt_out"], self.pad_id, 0.0)
        return {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": num_tokens}

    def accumulate(self, state: TrainState, batches) -> tuple[TrainState, dict]:
        """One optimizer update from several micro-batches (each may have its own shape)."""
        accumulated = self.empty_accumulator(state)
        for batch in batches:
            state, accumulated = self.grad_step(state, accumulated, batch)
        return self.apply_step(state, accumulated)

    @staticmethod
    def empty_accumulator(state: TrainState):
        """(gradient sums, loss sum, token count), all zero."""
        return (jax.tree.map(jnp.zeros_like, state.params), jnp.zeros((), jnp.float32),
                jnp.zeros((), jnp.int32))

    def batch_spec(self, shape: tuple[int, int, int]) -> dict[str, jax.ShapeDtypeStruct]:
        """The abstract sharded batch of a (rows, source length, target length) shape
        (source length 0 for a single-stack model's batches)."""
        rows, src_length, tgt_length = shape
        keys = BATCH_KEYS if self.architecture == "encoder_decoder" else TEXT_KEYS
        return {key: jax.ShapeDtypeStruct((rows, src_length if key.startswith("src")
                                           else tgt_length), jnp.int32,
                                          sharding=self.batch_sharding)
                for key in keys}

    def programs(self, state: TrainState, shapes, accumulate: int = 1):
        """[(name, jitted step, args)]: every step a run on batches of `shapes` calls,
        for compiling ahead (jax_transformer.train.runtime.compiling)."""
        jobs = []
        for shape in shapes:
            batch, name = self.batch_spec(shape), "x".join(map(str, shape))
            if accumulate == 1:
                jobs.append((f"train step {name}", self.train_step, (state, batch)))
            else:
                jobs.append((f"gradient step {name}", self.grad_step,
                             (state, self.empty_accumulator(state), batch)))
            jobs.append((f"eval step {name}", self.eval_step, (state, batch)))
        if accumulate > 1:
            jobs.append(("update step", self.apply_step, (state, self.empty_accumulator(state))))
        return jobs
