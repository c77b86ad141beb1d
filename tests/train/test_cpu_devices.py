"""train.py splits a CPU into devices (train/runtime/cpu_devices.py): 2 by default where the
cores and the batch allow, the user's choice otherwise, and the same training either way."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_transformer.commands import train as train_command
from jax_transformer.train.runtime.cpu_devices import chosen_count, split_cpu
from jax_transformer.train import run as training_run
from jax_transformer.train.settings.training import MAX_CPU_DEVICES
from transformer_core.errors import TrainError
from tests.train.runs import REPO_ROOT, TINY, losses, tiny_settings

# The test session runs on one CPU device (conftest.py sets JAX_NUM_CPU_DEVICES=1);
# train.py's own default shows only without it.
DEFAULT_ENV = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}


@pytest.mark.parametrize("flags, environ, cores, expected", [
    ([], {}, 2, 2),                                       # the default
    ([], {}, 16, 2),                                      # 2 on more cores too
    ([], {}, 1, None),                                    # one core: one device
    (["--max-tokens", "256", "--max-len", "256"], {}, 2, None),  # one row per batch
    (["--cpu-devices", "3"], {}, 2, 3),                   # the flag wins
    (["--cpu-devices", "1"], {"JAX_NUM_CPU_DEVICES": "4"}, 2, 1),
    ([], {"JAX_NUM_CPU_DEVICES": "4"}, 2, None),          # JAX's own setting stands
    ([], {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, 2, None),
])
def test_the_device_count_follows_the_flag_then_the_environment_then_the_machine(
        tmp_path, flags, environ, cores, expected):
    settings = tiny_settings(tmp_path, *flags)
    assert chosen_count(settings.train.cpu_devices, settings.data.fewest_rows, environ,
                        cores) == expected


def test_another_count_in_a_process_whose_jax_runs_is_refused(tmp_path):
    """This test process started JAX with one CPU device (conftest.py): asking for that
    count again is no error, another one cannot be had without a new process."""
    jax.devices()
    split_cpu(1, tiny_settings(tmp_path).data.fewest_rows)
    with pytest.raises(TrainError, match=r"--cpu-devices 3: JAX already started this "
                                         r"process's backends with 1 CPU device\(s\)"):
        split_cpu(3, tiny_settings(tmp_path).data.fewest_rows)


@pytest.mark.parametrize("count", ["0", "100000"])
def test_a_count_out_of_range_is_one_line_naming_the_bound(tmp_path, capsys, monkeypatch,
                                                           count):
    """Before: --cpu-devices 100000 printed nothing and ran on (still starting JAX's
    devices after 120 s)."""
    monkeypatch.setattr(training_run, "run", lambda *_: pytest.fail("the run started"))
    code = train_command.main(["--workdir", str(tmp_path / "run"), "--cpu-devices", count])
    assert code == 2 and capsys.readouterr().err.splitlines() == [
        f"error: --cpu-devices must be from 1 to {MAX_CPU_DEVICES} (no CPU has more cores to "
        f"give them, and JAX takes minutes to start tens of thousands of devices), got {count}"]
    assert not (tmp_path / "run").exists()


def train(workdir, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *TINY,
                           "--steps", "6", *flags], cwd=REPO_ROOT, env=DEFAULT_ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_cpu_devices_by_default_train_as_one_and_resume_on_one(tmp_path):
    split, whole = train(tmp_path / "split"), train(tmp_path / "whole", "--cpu-devices", "1")
    for result in split, whole:
        assert result.returncode == 0, result.stderr[-3000:]
    assert "2 cpu device(s)" in split.stderr and "1 cpu device(s)" in whole.stderr
    (steps, split_losses), (_, whole_losses) = (zip(*losses(tmp_path / name))
                                                for name in ("split", "whole"))
    assert steps == tuple(range(1, 7))
    np.testing.assert_allclose(split_losses, whole_losses, rtol=1e-5)

    # Saved at step 4 on two devices, resumed on one: the same batches follow.
    resumed = tmp_path / "resumed"
    assert train(resumed, "--steps", "4").returncode == 0
    result = train(resumed, "--cpu-devices", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_allclose([loss for _, loss in losses(resumed)], split_losses, rtol=1e-5)
