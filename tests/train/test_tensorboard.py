"""TensorBoard event files next to metrics.jsonl: a resume shows each step once, and
only the process that writes metrics.jsonl writes them. (A whole train.py run's files:
tests/train/test_train.py; after SIGTERM: tests/train/test_faults.py.)"""

from __future__ import annotations

from jax_transformer.train.records.workdir import MetricsLog
from jax_transformer.train.settings.resume import check_run_settings, recorded_settings
from tests.train.runs import metrics_scalars, tensorboard_scalars, tiny_settings


def write_steps(log: MetricsLog, steps, offset: float) -> None:
    """Train records for `steps`, a dev record every third step; values vary with `offset`."""
    for step in steps:
        log.write(step=step, loss=offset + step, lr=1e-4 * step, grad_norm=offset / step,
                  tokens=100, tokens_per_s=1000.5 + step, elapsed=0.1 * step)
        if step % 3 == 0:
            log.write(step=step, dev_loss=offset - step, dev_perplexity=offset * step)


def test_tensorboard_after_a_resume_shows_each_step_once(tmp_path):
    """A run that wrote steps 1-7, resumed from its step-4 checkpoint to step 8: the
    steps it repeats (5-7) come from the resumed run only, as in metrics.jsonl."""
    first = MetricsLog(tmp_path / "metrics.jsonl", 0, tensorboard=tmp_path / "tensorboard")
    first.write(step=1, compile_seconds=12.25)
    write_steps(first, range(1, 8), offset=10.0)
    first.close()
    resumed = MetricsLog(tmp_path / "metrics.jsonl", 4, tensorboard=tmp_path / "tensorboard")
    resumed.write(step=5, compile_seconds=0.75)
    write_steps(resumed, range(5, 9), offset=20.0)
    resumed.close()

    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars == metrics_scalars(tmp_path)
    assert scalars["train/loss"] == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 14.0),
                                     (5, 25.0), (6, 26.0), (7, 27.0), (8, 28.0)]
    assert scalars["dev/loss"] == [(3, 7.0), (6, 14.0)]
    assert scalars["compile/seconds"] == [(1, 12.25), (5, 0.75)]


def test_only_the_metrics_process_writes_tensorboard_files(tmp_path):
    """On several hosts, processes other than 0 get enabled=False: no files at all."""
    log = MetricsLog(tmp_path / "metrics.jsonl", 0, enabled=False,
                     tensorboard=tmp_path / "tensorboard")
    log.write(step=1, loss=1.0)
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_no_tensorboard_is_a_setting_a_resume_may_change(tmp_path):
    _, _, train = tiny_settings(tmp_path, "--no-tensorboard")
    assert train.tensorboard is False and tiny_settings(tmp_path)[2].tensorboard is True
    check_run_settings(tmp_path, recorded_settings(tiny_settings(tmp_path)), resuming=False)
    check_run_settings(tmp_path, recorded_settings(tiny_settings(tmp_path, "--no-tensorboard")),
                       resuming=True)
