"""Data parallelism: the sharded step gives the same losses and parameters as one device.

JAX fixes its device count when it starts, so the 8-device run is a subprocess
with XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses; see pyproject.toml

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from transformer_core.config import TransformerConfig
    from tests.train.runs import random_batches
    from jax_transformer.model import Transformer
    from jax_transformer.train.runtime.sharding import make_mesh
    from jax_transformer.train.step import Trainer, make_optimizer, paper_schedule
    from jax_transformer.pretrained import to_torch_state_dict

    assert jax.device_count() == 8, jax.devices()
    config = TransformerConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16, num_heads=2,
                               d_ff=32, num_encoder_layers=1, num_decoder_layers=1, dropout=0.1)
    batches = random_batches(3, 40, 7, 6)

    def fresh_model():
        return Transformer(config, rngs=nnx.Rngs(0), dtype=jnp.float64, param_dtype=jnp.float64)

    initial = to_torch_state_dict(fresh_model())
    results = {}
    for name, devices in (("one", jax.devices()[:1]), ("eight", jax.devices())):
        trainer = Trainer(fresh_model(), make_optimizer(paper_schedule(16, 2), clip_norm=1.0),
                          mesh=make_mesh(1, devices))
        state, losses = trainer.initial_state, []
        for batch in batches:
            batch = trainer.shard_batch(batch)
            assert len(batch["src"].sharding.device_set) == len(devices)
            state, metrics = trainer.train_step(state, batch)
            losses.append(float(metrics["loss"]))
        params = to_torch_state_dict(trainer.model(state))
        results[name] = (losses, params)
    (losses_1, params_1), (losses_8, params_8) = results["one"], results["eight"]
    def change(params):
        return {k: float(np.max(np.abs(params[k] - initial[k]))) for k in params}

    print(json.dumps({
        "losses_one": losses_1, "losses_eight": losses_8,
        "param_diffs": {k: float(np.max(np.abs(params_1[k] - params_8[k]))) for k in params_1},
        "change_one": change(params_1), "change_eight": change(params_8),
    }))
""")


# "tuned": every kernel's tuned version, dropout masks from XLA's RngBitGenerator
# included, which must not repeat one shard's bits on every device.
@pytest.mark.parametrize("kernel_set", ["default", "tuned"])
def test_eight_devices_match_one_device(kernel_set):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_TRANSFORMER_KERNELS", None)
    env.pop("JAX_NUM_CPU_DEVICES", None)  # conftest.py's, which would override XLA_FLAGS
    if kernel_set == "tuned":
        env["JAX_TRANSFORMER_KERNELS"] = "tuned"
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(out["losses_one"]) == 3
    for a, b in zip(out["losses_one"], out["losses_eight"]):
        assert abs(a - b) <= 1e-12, (out["losses_one"], out["losses_eight"])
    for key, diff in out["param_diffs"].items():
        if key.endswith("W_k.bias"):
            # Its gradient is exactly zero (softmax ignores the per-row shift q.b_k):
            # the all-reduce's different summation order changes only rounding noise,
            # which Adam amplifies by 1/eps. It must stay put in both runs.
            assert out["change_one"][key] <= 1e-7 and out["change_eight"][key] <= 1e-7, key
        else:
            assert diff <= 1e-12, (key, diff)
            assert out["change_one"][key] > 1e-4, f"{key} did not train"
