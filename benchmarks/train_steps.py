"""bench_train's contenders: one training step of the Flax model or of torch_reference
behind one interface (`prepare` a host batch, `step` it, report the numerics and the
peak device memory), built from the same weights and batches."""

from __future__ import annotations

import numpy as np

from benchmarks.runner import cpu_name, jax_peak_device_mib, timed

# Rows of JAX with some kernels switched (jax_transformer.kernels.override): what
# each kernel choice is worth, measured in the same run as the default "jax" row.
JAX_VARIANTS = {
    "jax": {},
    "jax_autodiff_grads": {"linear": "plain"},  # autodiff's Linear backward (kernels/linear.py)
    "jax_threefry_dropout": {"dropout_mask": "plain"},  # nnx's threefry masks
    "jax_hash_dropout": {"dropout_mask": "tuned"},  # masks from a counter hash
}
FRAMEWORKS = [*JAX_VARIANTS, "torch_eager", "torch_compile"]

# What a float32 matmul computes in, per backend and jax_default_matmul_precision
# (jax.lax.Precision's documentation); unlisted settings: the backend's default.
JAX_FLOAT32_MATMUL = {
    "cpu": {None: "float32"},
    "gpu": {None: "TF32 (NVIDIA Ampere and later; else float32)", "highest": "float32",
            "float32": "float32", "bfloat16": "bfloat16"},
    "tpu": {None: "1 bfloat16 pass", "high": "3 bfloat16 passes",
            "bfloat16_3x": "3 bfloat16 passes", "highest": "float32",
            "float32": "float32"},
}


def make_config(args):
    from transformer_core.config import TransformerConfig
    return TransformerConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab,
                             d_model=args.d_model, num_heads=args.heads, d_ff=args.d_ff,
                             num_encoder_layers=args.layers, num_decoder_layers=args.layers,
                             dropout=args.dropout, max_len=max(512, args.src_len, args.tgt_len))


def make_batches(args, config, count: int) -> list[dict]:
    """`count` host batches of random ids, every sentence full length."""
    rng = np.random.RandomState(0)
    batches = []
    for _ in range(count):
        src = rng.randint(4, config.src_vocab_size, (args.batch_size, args.src_len))
        tgt = rng.randint(4, config.tgt_vocab_size, (args.batch_size, args.tgt_len + 1))
        batches.append({"src": src.astype(np.int32), "tgt_in": tgt[:, :-1].astype(np.int32),
                        "tgt_out": tgt[:, 1:].astype(np.int32)})
    return batches


def set_torch_options(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    if args.torch_tf32:
        torch.set_float32_matmul_precision("high")  # TF32 for float32 matmuls on CUDA


def jax_numerics(dtype: str) -> dict:
    """The device, compute dtype and matmul precision JAX runs the step with."""
    import jax
    backend, device = jax.default_backend(), jax.devices()[0]
    setting = jax.config.jax_default_matmul_precision
    table = JAX_FLOAT32_MATMUL.get(backend, {})
    float32_matmul = table.get(setting, table.get(None, "unknown"))
    matmuls = "bfloat16 operands, float32 accumulation" if dtype == "bfloat16" \
        else float32_matmul
    return {"device": f"{backend}: {cpu_name() if backend == 'cpu' else device.device_kind}",
            "compute_dtype": dtype,
            "matmul_precision": f"{matmuls} (jax_default_matmul_precision="
                                f"{setting or 'default'})"}


class JaxRunner:
    """The Flax model's training step, with the kernel overrides of JAX_VARIANTS[name]
    (e.g. "jax_autodiff_grads": the plain Linear kernel, whose backward is JAX
    autodiff's in XLA's default layout; measures what the tuned Linear buys)."""

    def __init__(self, args, config, state_dict, name: str = "jax"):
        import jax.numpy as jnp
        from flax import nnx

        import jax

        from jax_transformer import kernels, scanned
        from jax_transformer.model import Transformer
        from jax_transformer.pretrained import load_torch_state_dict
        from jax_transformer.train import step as training

        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        model = Transformer(config, rngs=nnx.Rngs(0), dtype=dtype)
        if state_dict is not None:
            load_torch_state_dict(model, state_dict)
        # the layer stacks as train.py runs them (--scan-layers auto): scanned on GPUs, where
        # the looped base model's step took 49 s to compile on an H200, against 12 s
        scan = scanned.scan_wanted("auto", jax.default_backend())
        if scan:
            scanned.scan_layers(model)
        optimizer = training.make_optimizer(
            training.paper_schedule(config.d_model, args.warmup_steps), args.clip_norm)
        self.trainer = training.Trainer(model, optimizer, args.label_smoothing)
        self.state = self.trainer.initial_state
        self.name = name
        # jit traces on the first step, so overriding during steps is overriding the trace.
        self.trace_context = lambda: kernels.override(**JAX_VARIANTS[name])
        self.numerics = {**jax_numerics(args.dtype),
                         "layer_stacks": "scanned" if scan else "looped"}

    def prepare(self, batch):
        return self.trainer.shard_batch(batch)

    def peak_memory_mib(self) -> float | None:
        return jax_peak_device_mib()

    def step(self, batch) -> tuple[float, float]:
        """(wall seconds, loss) of one training step."""
        with self.trace_context():
            return timed(self._train_step, batch)

    def _train_step(self, batch) -> float:
        self.state, metrics = self.trainer.train_step(self.state, batch)
        return float(metrics["loss"])  # waits for the step


class TorchRunner:
    """torch_reference's training step, eager or under torch.compile; on CUDA when torch
    sees a GPU, under bf16 autocast with --dtype bfloat16."""

    def __init__(self, args, config, state_dict, compiled: bool):
        import torch

        import torch_reference
        from torch_reference import training

        self.torch, self.training = torch, training
        self.name = "torch_compile" if compiled else "torch_eager"
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = torch_reference.Transformer(config).train()
        if state_dict is not None:
            self.model.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()})
        self.model.to(self.device)
        self.optimizer, self.scheduler = training.make_optimizer(
            self.model, training.paper_schedule(config.d_model, args.warmup_steps))
        self.forward_model = torch.compile(self.model) if compiled else self.model
        self.autocast = args.dtype == "bfloat16"
        self.args = args
        self.numerics = self.describe_numerics()

    def describe_numerics(self) -> dict:
        """The device, compute dtype and matmul precision the step runs with."""
        torch = self.torch
        device = torch.cuda.get_device_name() if self.device == "cuda" else cpu_name()
        float32_matmuls = ("TF32" if torch.backends.cuda.matmul.allow_tf32 else "float32") \
            if self.device == "cuda" else "float32"
        settings = (f"allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                    f"float32_matmul_precision={torch.get_float32_matmul_precision()}")
        if self.autocast:
            return {"device": f"{self.device}: {device}",
                    "compute_dtype": "bfloat16 (torch.autocast; float32 parameters)",
                    "matmul_precision": f"bfloat16 under autocast; float32 matmuls: "
                                        f"{float32_matmuls} ({settings})"}
        return {"device": f"{self.device}: {device}", "compute_dtype": "float32",
                "matmul_precision": f"{float32_matmuls} ({settings})"}

    def prepare(self, batch):
        return {k: self.torch.from_numpy(v.astype(np.int64)).to(self.device)
                for k, v in batch.items()}

    def step(self, batch) -> tuple[float, float]:
        """(wall seconds, loss) of one training step."""
        return timed(self._train_step, batch)

    def _train_step(self, batch) -> float:
        torch = self.torch
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.autocast):
            # torch.compile's module forwards .config and .parameters() to the original.
            metrics = self.training.train_step(self.forward_model, self.optimizer,
                                               self.scheduler, [batch],
                                               self.args.label_smoothing, self.args.clip_norm)
        return float(metrics["loss"])  # waits for the step (GPU too)

    def peak_memory_mib(self) -> float | None:
        if self.device == "cuda":
            return self.torch.cuda.max_memory_allocated() / 2 ** 20
        return None


def make_runner(name: str, args, config, state_dict):
    """The contender `name` (one of FRAMEWORKS); `state_dict` None: fresh weights."""
    if name in JAX_VARIANTS:
        return JaxRunner(args, config, state_dict, name)
    return TorchRunner(args, config, state_dict, compiled=(name == "torch_compile"))
