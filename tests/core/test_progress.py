"""Progress bars off a terminal: plain lines, at most one every LINE_SECONDS."""

import pytest
import tqdm.std

from transformer_core import progress


@pytest.fixture
def clock(monkeypatch):
    """tqdm's clock, moved by hand (seconds), and no monitor thread reading the real one."""
    now = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    monkeypatch.setattr(tqdm.std.tqdm, "monitor_interval", 0)
    return now


def test_off_a_terminal_a_bar_is_a_line_every_30_seconds(clock, capsys):
    """100 steps a second apart, the postfix set at each, stderr a file (not a terminal):
    a line at 30, 60 and 90 s and the last, no carriage returns. Before: train.py's
    run.log of the default run held 265 KB of "\\r" updates."""
    with progress.progress_bar(total=100, desc="train", unit="step") as bar:
        for step in range(1, 101):
            clock[0] = float(step)
            bar.set_postfix(loss=f"{1 / step:.3f}", refresh=False)
            bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert [line.split("| ")[1].split(" ")[0] for line in lines] == [
        "30/100", "60/100", "90/100", "100/100"], err
    assert all(line.startswith("train: ") and "loss=" in line for line in lines), err


def test_off_a_terminal_a_short_bar_writes_nothing(clock, capsys):
    with progress.progress_bar(total=10, desc="encode") as bar:
        for step in range(10):
            clock[0] = step
            bar.update(1)
    assert capsys.readouterr().err == ""
