"""The translate command on tiny checkpoints saved by either framework."""

import errno
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import numpy as np
import pytest

import torch_reference
from jax_transformer.applications import translator
from jax_transformer.commands import translate
from tests.helpers import LINES, REPO, run_translate, tiny_config


def run_script(args, stdin: bytes, prelude: str = "", cwd=REPO):
    """`jaxformer-translate ARGS < stdin` after `prelude`, via runpy as -m does."""
    script = (f"import runpy, sys\n{prelude}"
              "sys.argv = ['translate'] + sys.argv[1:]\n"
              "runpy.run_module('jax_transformer.commands.translate', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], input=stdin,
                          capture_output=True, cwd=cwd, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_batching_does_not_change_translations(jax_checkpoint, tmp_path, capsys):
    source = tmp_path / "source.txt"
    source.write_text("\n".join(LINES) + "\n")
    results = []
    for batch_size in ("1", "4"):
        code, out, err = run_translate(["--checkpoint", jax_checkpoint, "--input", source,
                                        "--framework", "torch", "--beam", "2", "--max-len", "12",
                                        "--batch-size", batch_size], capsys)
        assert code == 0, err
        results.append(out)
    assert results[0] == results[1]


@pytest.mark.slow
def test_command_line_reads_stdin_and_torch_needs_no_jax(torch_checkpoint):
    """`jaxformer-translate` (run via runpy, as -m does) on stdin;
    with --framework torch, JAX is never imported."""
    script = ("import runpy, sys\n"
              "sys.argv = ['translate'] + sys.argv[1:]\n"
              "try:\n"
              "    runpy.run_module('jax_transformer.commands.translate', run_name='__main__')\n"
              "except SystemExit as e:\n"
              "    assert e.code in (0, None), e.code\n"
              "assert 'jax' not in sys.modules, 'JAX was imported'\n")
    result = subprocess.run(
        [sys.executable, "-c", script, "--checkpoint", str(torch_checkpoint),
         "--framework", "torch", "--beam", "2", "--max-len", "10"],
        input="the cat sat on the mat\na big dog\n", capture_output=True, text=True,
        cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2
    assert "translated 2 sentences" in result.stderr


@pytest.mark.slow
def test_a_closed_output_pipe_ends_quietly(torch_checkpoint, tmp_path):
    """`jaxformer-translate < text | head -1`, the reader gone before the first line.
    Before: `error: [Errno 32] Broken pipe`, exit 2 (the bad-input code)."""
    source = tmp_path / "source.txt"
    source.write_text("\n".join(LINES) + "\n")
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "jax_transformer.commands.translate", "--checkpoint",
             str(torch_checkpoint), "--framework", "torch", "--input", str(source)],
            stdout=write, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    finally:
        os.close(write)
    assert result.returncode == 128 + signal.SIGPIPE, result.stderr
    assert result.stderr == ""


class ReaderGoneAfterOneWrite(io.StringIO):
    """stdout whose reader (`| head -1`) has gone once it has read the first write."""

    def write(self, text: str) -> int:
        if text and self.getvalue():
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
        return super().write(text)


def test_a_file_stops_at_the_write_after_its_reader_has_gone(torch_checkpoint, tmp_path,
                                                             monkeypatch):
    """`jaxformer-translate --input FILE | head -1`: the first line written, the reader
    gone, the next write fails (exit_codes turns that into exit 141, quietly), 2 of 24
    lines translated. Before: all 24 were translated and written at once, so the command
    ran to the end, and exited 0 where the translations fit the pipe's buffer."""
    source = tmp_path / "source.txt"
    source.write_text("\n".join(LINES * 4) + "\n")
    rows = []
    search_batch = translator.search_batch
    monkeypatch.setattr(translator, "search_batch", lambda model, src, *args, **kwargs: (
        rows.append(len(src)), search_batch(model, src, *args, **kwargs))[1])
    monkeypatch.setattr(sys, "stdout", ReaderGoneAfterOneWrite())
    with pytest.raises(BrokenPipeError):
        translate.translate_command(["--checkpoint", str(torch_checkpoint), "--framework",
                                     "torch", "--input", str(source), "--beam", "1",
                                     "--max-len", "8", "--batch-size", "1"])
    assert sys.stdout.getvalue().count("\n") == 1
    assert len(rows) == 2


def test_errors_are_clear(tokenizer, jax_checkpoint, tmp_path, capsys):
    code, _, err = run_translate(["--checkpoint", tmp_path / "nope"], capsys)
    assert code == 2 and "does not exist" in err

    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((jax_checkpoint / name).read_bytes())
    code, _, err = run_translate(["--checkpoint", no_tokenizer], capsys)
    assert code == 2 and "tokenizer.model" in err

    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.model"):
        (no_weights / name).write_bytes((jax_checkpoint / name).read_bytes())
    code, _, err = run_translate(["--checkpoint", no_weights, "--framework", "torch"], capsys)
    assert code == 2 and "model.safetensors" in err

    # a tokenizer with more pieces than the model's vocabulary
    small = tmp_path / "small_vocab"
    torch_reference.Transformer(tiny_config(tokenizer).replace(
        src_vocab_size=20, tgt_vocab_size=20)).save_pretrained(small, tokenizer=tokenizer.path)
    code, _, err = run_translate(["--checkpoint", small, "--framework", "torch"], capsys)
    assert code == 2 and f"{tokenizer.vocab_size} pieces" in err

    code, _, err = run_translate(["--checkpoint", jax_checkpoint, "--framework", "torch",
                                  "--max-len", "999", "--input", tmp_path / "missing.txt"], capsys)
    assert code == 2 and "missing.txt" in err
    code, _, err = run_translate(["--checkpoint", jax_checkpoint, "--framework", "torch",
                                  "--normalize-punctuation"], capsys)
    assert code == 2 and "--normalize-punctuation needs a Marian tokenizer" in err
    source = tmp_path / "one.txt"
    source.write_text("a cat\n")
    code, _, err = run_translate(["--checkpoint", jax_checkpoint, "--framework", "torch",
                                  "--max-len", "999", "--input", source], capsys)
    assert code == 2 and "exceeds the model's max_len" in err


# Lines hold a U+2028, a form feed and a lone \r: text inside a line, not line breaks.
ODD_LINES = ["the cat\u2028sat on the mat", "a big\x0cdog", "the bird\rsings", "red house"]


@pytest.mark.parametrize("ending, last", [("\n", "\n"), ("\n", ""), ("\r\n", "\r\n")],
                         ids=["lf", "no-final-newline", "crlf"])
def test_one_output_line_per_input_line(torch_checkpoint, tmp_path, capsys, ending, last):
    model, tokenizer = translator.load(torch_checkpoint, "torch")
    expected = translator.translate_lines(ODD_LINES, model, tokenizer, framework="torch", beam=1,
                                         max_len=8)
    source, output = tmp_path / "source.txt", tmp_path / "out.txt"
    source.write_bytes((ending.join(ODD_LINES) + last).encode())
    code, _, err = run_translate(["--checkpoint", torch_checkpoint, "--framework", "torch",
                                  "--beam", "1", "--max-len", "8", "--input", source,
                                  "--output", output], capsys)
    assert code == 0, err
    assert "translated 4 sentences" in err
    assert output.read_text(encoding="utf-8").split("\n") == [*expected, ""]


def test_batches_searched_two_at_a_time_give_the_same_translations(jax_checkpoint,
                                                                   monkeypatch):
    model, tokenizer = translator.load(jax_checkpoint, "jax")
    lines = [" ".join(["the", "quick", "fox"][: 1 + n % 3] * (1 + n % 5)) for n in range(11)]
    results = {}
    for at_once in (1, 2):
        monkeypatch.setattr(translator, "BATCHES_AT_ONCE", at_once)
        results[at_once] = translator.search_lines(lines, model, tokenizer, beam=2,
                                                   batch_size=4)  # 3 batches
    assert results[2] == results[1]


def test_batches_searched_at_once_run_under_the_callers_jax_settings(jax_checkpoint,
                                                                    monkeypatch):
    """Each batch's search runs on a thread of its own, where a context the caller
    entered (x64, matmul precision, default device) would not hold by itself."""
    import jax
    model, tokenizer = translator.load(jax_checkpoint, "jax")
    seen = []

    def search_batch(model, src, out_len, **search):  # the settings each search sees
        seen.append((jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision,
                     jax.config.jax_default_device))
        return np.zeros((len(src), 1, 1), np.int32), np.zeros((len(src), 1))
    monkeypatch.setattr(translator, "search_batch", search_batch)
    device = jax.devices()[-1]
    with jax.enable_x64(True), jax.default_matmul_precision("highest"), \
            jax.default_device(device):
        translator.translate_lines(["a", "b c", "d e f"], model, tokenizer, beam=1,
                                   batch_size=1)
    assert seen == [(True, "highest", device)] * 3


def test_in_turn_keeps_the_order_and_runs_at_most_so_many_at_once():
    import threading
    import time
    running, most, lock = [0], [0], threading.Lock()

    def work(item):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02 * (item % 3))  # later items may finish first
        with lock:
            running[0] -= 1
        return item * 10

    assert list(translator.in_turn(work, range(9), 3)) == [i * 10 for i in range(9)]
    assert most[0] == 3
    assert list(translator.in_turn(work, range(4), 1)) == [0, 10, 20, 30]


def test_in_turn_runs_ahead_of_its_caller_by_at_most_so_many():
    import time
    started = []

    def work(item):
        started.append(item)
        return item

    results = translator.in_turn(work, range(100), 2)
    assert next(results) == 0
    time.sleep(0.2)  # the caller writes its result; the work queued behind must wait
    assert len(started) <= 2, started
    results.close()  # the caller's reader has gone
    assert len(started) <= 2, started


def test_in_turn_raises_what_the_work_raised():
    def work(item):
        if item == 2:
            raise translator.TranslateError("batch 2 failed")
        return item

    results = translator.in_turn(work, range(5), 2)
    assert [next(results), next(results)] == [0, 1]
    with pytest.raises(translator.TranslateError, match="batch 2 failed"):
        next(results)


def test_source_widths_are_few_and_hold_max_len():
    assert translator.source_widths(128) == [16, 32, 64, 128]
    assert translator.source_widths(100) == [12, 25, 50, 100]
    assert translator.source_widths(16) == [8, 16]
    assert translator.source_widths(5) == [5]


@pytest.mark.parametrize("beam", [1, 2])
def test_a_file_of_every_length_compiles_a_few_programs(jax_checkpoint, beam):
    """Sources of every length up to max_len (32: widths 8, 16, 32) in batches of 2:
    each search compiles once per width, not once per batch or length."""
    from jax_transformer import decoding
    model, tokenizer = translator.load(jax_checkpoint, "jax")
    lines = [" ".join(["the"] * n) for n in range(1, 31)]
    search = decoding._pick_jit if beam == 1 else decoding._beam_jit
    before = search._cache_size()
    translator.translate_lines(lines, model, tokenizer, beam=beam, batch_size=2)
    assert search._cache_size() - before == len(translator.source_widths(32)) == 3


def test_short_lines_one_at_a_time_share_one_program(jax_checkpoint):
    """Sources of 2 to 7 ids, each translated alone as a line typed at a terminal is: one
    search program for all of them. Before: widths 2, 4 and 8, a compile each."""
    from jax_transformer import decoding
    model, tokenizer = translator.load(jax_checkpoint, "jax")
    before = decoding._beam_jit._cache_size()
    for words in range(1, 7):
        translator.translate_lines([" ".join(["the"] * words)], model, tokenizer, beam=2)
    assert decoding._beam_jit._cache_size() - before <= 1


@pytest.mark.parametrize("flags, cache", [([], "default"), (["--compile-cache", "x"], "x"),
                                          (["--no-compile-cache"], None)],
                         ids=["default", "compile-cache", "no-compile-cache"])
def test_jax_translates_with_train_pys_compile_cache(jax_checkpoint, tmp_path, capsys,
                                                     monkeypatch, flags, cache):
    """--framework jax turns on the persistent compilation cache train.py uses, its
    default directory or --compile-cache's, or none."""
    from jax_transformer.train.runtime import compiling
    from jax_transformer.train.settings.training import default_compile_cache
    used = []
    monkeypatch.setattr(compiling, "use_compilation_cache",
                        lambda directory, **_: used.append(directory))
    source = tmp_path / "blank.txt"
    source.write_text("\n")  # no search runs
    code, out, err = run_translate(["--checkpoint", jax_checkpoint, "--input", source, *flags],
                                   capsys)
    assert (code, out) == (0, [""]), err
    assert used == [default_compile_cache() if cache == "default" else cache]


@pytest.mark.slow  # 1,000 sentences, each search compiled afresh
@pytest.mark.parametrize("beam", [1, 4])
def test_a_file_of_1000_sentences_of_mixed_lengths_compiles_at_most_8_programs(
        jax_checkpoint, beam):
    """Every program the translation needs, counted from JAX's compile events (compiled
    or loaded from the persistent cache): one search per source width and one for the
    last, smaller batch, nothing else. Before: each width also compiled the padding
    mask's two eager ops (9 for greedy search over the serve benchmark's 300 sentences)."""
    import jax

    from jax_transformer.train.runtime.compiling import CompileCounter
    model, tokenizer = translator.load(jax_checkpoint, "jax")
    rng = np.random.default_rng(0)
    words = "the quick brown fox a small red house bird sings".split()
    lines = [" ".join(rng.choice(words, rng.integers(1, 31))) for _ in range(1000)]
    CompileCounter.start()
    jax.clear_caches()  # whatever this worker compiled before counts again
    before = CompileCounter.snapshot()
    translator.translate_lines(lines, model, tokenizer, beam=beam, batch_size=32)
    compiled = CompileCounter.since(before)
    assert 0 < compiled["programs"] + compiled["cache_hits"] <= 8


def test_blank_lines_stay_blank_and_are_not_translated(torch_checkpoint):
    model, tokenizer = translator.load(torch_checkpoint, "torch")
    batches = []
    translations = translator.translate_lines(
        ["the cat", "", " \t ", "a dog"], model, tokenizer, framework="torch", beam=1,
        max_len=8, batch_size=1, progress=lambda b: batches.extend(b) or b)
    assert translations[1:3] == ["", ""]
    assert sorted(i for batch in batches for i in batch) == [0, 3]


@pytest.mark.slow
def test_command_line_keeps_lines_aligned(torch_checkpoint):
    """Through the real command line: odd characters, blank lines, CRLF, no final newline."""
    lines = [*ODD_LINES, "", "   ", "the cat sat"]
    result = run_script(["--checkpoint", torch_checkpoint, "--framework", "torch", "--beam",
                         "1", "--max-len", "8"], "\r\n".join(lines).encode())
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode().split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == ""
    assert out[4:6] == ["", ""]
    assert b"translated 7 sentences" in result.stderr


def test_input_that_is_not_utf8_is_one_clear_error(torch_checkpoint, tmp_path, capsys,
                                                    monkeypatch):
    data = "the cat\n".encode() + b"a \xff\xfe dog\n"
    source = tmp_path / "binary.txt"
    source.write_bytes(data)
    code, out, err = run_translate(["--checkpoint", torch_checkpoint, "--framework", "torch",
                                    "--input", source], capsys)
    assert (code, out) == (2, [])
    assert err.startswith(f"error: --input {source} is not UTF-8 text (line 2")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    code, out, err = run_translate(["--checkpoint", torch_checkpoint, "--framework", "torch"],
                                   capsys)
    assert (code, out) == (2, [])
    assert err.startswith("error: stdin is not UTF-8 text (line 2")


@pytest.mark.slow
def test_command_line_refuses_binary_stdin(torch_checkpoint):
    result = run_script(["--checkpoint", torch_checkpoint, "--framework", "torch"],
                        b"the cat\n\x00\x9f\x92\x96 binary\n")
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        "error: stdin is not UTF-8 text (line 2, byte 2: invalid start byte)"]


def test_a_closed_stdin_is_one_clear_error_before_any_work(torch_checkpoint, tmp_path, capsys,
                                                            monkeypatch):
    """Python's sys.stdin is None when file descriptor 0 is closed (`<&-`). Before: an
    AttributeError traceback ('NoneType' object has no attribute 'fileno')."""
    monkeypatch.setattr(sys, "stdin", None)
    monkeypatch.setattr(translate, "load",
                        lambda *args: pytest.fail("loaded the model before reading stdin"))
    for flags in ([], ["--input", "-"]):
        code, out, err = run_translate(["--checkpoint", torch_checkpoint, "--output",
                                        tmp_path / "out.txt", *flags], capsys)
        assert (code, out) == (2, []) and err.splitlines() == [
            "error: stdin is closed (<&-), so there is nothing to translate: give the "
            "sentences on stdin (< FILE, a pipe) or with --input FILE"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_command_line_with_stdin_closed_is_one_line(torch_checkpoint):
    result = subprocess.run(["bash", "-c", 'exec "$0" -m jax_transformer.commands.translate '
                             '--checkpoint "$1" --framework torch <&-', sys.executable,
                             str(torch_checkpoint)], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.splitlines() == [
        "error: stdin is closed (<&-), so there is nothing to translate: give the sentences "
        "on stdin (< FILE, a pipe) or with --input FILE"]


@pytest.mark.parametrize("output", ["missing/out.txt", "."])
def test_output_is_checked_before_any_work(torch_checkpoint, tmp_path, capsys, monkeypatch,
                                           output):
    monkeypatch.setattr(translate, "load",
                        lambda *args: pytest.fail("loaded the model before checking --output"))
    code, _, err = run_translate(["--checkpoint", torch_checkpoint, "--output", tmp_path / output],
                                 capsys)
    assert code == 2
    assert err.startswith(f"error: --output {tmp_path / output}")


@pytest.mark.slow
def test_command_line_checks_output_first(torch_checkpoint, tmp_path):
    output = tmp_path / "missing" / "out.txt"
    result = run_script(["--checkpoint", torch_checkpoint, "--framework", "torch", "--output",
                         output], b"the cat\n")
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        f"error: --output {output}: directory {output.parent} does not exist"]


@pytest.mark.slow
def test_a_failed_write_keeps_the_previous_output(torch_checkpoint, tmp_path):
    """The disk fills at the final write (RLIMIT_FSIZE, with SIGXFSZ ignored, makes writes
    past 16 bytes fail): the previous file at --output stays whole, no partial file is left."""
    output = tmp_path / "out.txt"
    output.write_text("previous run\n")
    prelude = ("import resource, signal\n"
               "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
               "resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))\n")
    result = run_script(["--checkpoint", torch_checkpoint, "--framework", "torch", "--output",
                         output, "--beam", "1", "--max-len", "8"],
                        "\n".join(["the quick brown fox"] * 8).encode(), prelude)
    assert result.returncode == 2
    last = result.stderr.decode().splitlines()[-1]
    assert last.startswith(f"error: cannot write --output {output}: [Errno 27] File too large")
    assert output.read_text() == "previous run\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


FAST = ["--framework", "torch", "--beam", "1", "--max-len", "8"]
SOURCE = b"the quick brown fox\na small red house\n"


@pytest.mark.slow
def test_output_to_a_fifo_is_written_in_place(torch_checkpoint, tmp_path):
    """Before: the FIFO was replaced by a regular file, and its reader waited for ever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        result = run_script(["--checkpoint", torch_checkpoint, *FAST, "--output", fifo], SOURCE)
        read, _ = reader.communicate(timeout=60)
    finally:
        reader.kill()
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert stat.S_ISFIFO(fifo.stat().st_mode) and len(read.decode().splitlines()) == 2


@pytest.mark.slow
@pytest.mark.parametrize("output", ["/dev/fd/1", "/dev/stdout", "-", "/dev/null"])
def test_output_to_stdout_or_a_device_is_written_in_place(torch_checkpoint, tmp_path, output):
    """Before: --output /dev/fd/1 (as a process substitution gives) failed after all the
    work, unable to make a temporary file in /dev/fd; as root, /dev/stdout and /dev/null
    were replaced by regular files; `--output -` wrote a file named "-"."""
    result = run_script(["--checkpoint", torch_checkpoint, *FAST, "--output", output], SOURCE,
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert len(result.stdout.splitlines()) == (0 if output == "/dev/null" else 2)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.path.islink("/dev/stdout")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_input_dash_is_stdin(torch_checkpoint, tmp_path):
    """Before: `error: cannot read --input -: [Errno 2] No such file or directory: '-'`."""
    result = run_script(["--checkpoint", torch_checkpoint, *FAST, "--input", "-"], SOURCE,
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert len(result.stdout.splitlines()) == 2


@pytest.mark.slow
def test_an_output_no_file_can_be_made_beside_is_refused_before_any_work(torch_checkpoint):
    """Before (as root, whom os.access lets write anywhere): the model was loaded and every
    line translated, then the temporary file beside /proc/self/out.txt failed."""
    prelude = ("import jax_transformer.applications.translator as translator\n"
               "translator.load = lambda *args: sys.exit('loaded the model first')\n")
    result = run_script(["--checkpoint", torch_checkpoint, *FAST, "--output",
                         "/proc/self/out.txt"], SOURCE, prelude)
    assert result.returncode == 2, result.stderr.decode()[-2000:]
    [line] = result.stderr.decode().splitlines()
    assert line.startswith("error: ") and "--output /proc/self/out.txt" in line


@pytest.mark.parametrize("same", ["source.txt", "./source.txt", "link.txt"])
def test_output_naming_the_input_file_is_refused(torch_checkpoint, tmp_path, capsys,
                                                 monkeypatch, same):
    """Before: the input file was silently replaced by its translations."""
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "source.txt"
    source.write_bytes(SOURCE)
    (tmp_path / "link.txt").symlink_to(source)
    code, out, err = run_translate(["--checkpoint", torch_checkpoint, *FAST, "--input",
                                    "source.txt", "--output", same], capsys)
    assert (code, out) == (2, [])
    assert err.splitlines() == [f"error: --output {same} is the --input file source.txt: its "
                                "sentences would be replaced by their translations; write "
                                "them elsewhere"]
    assert source.read_bytes() == SOURCE


@pytest.mark.slow
def test_buffers_are_sized_by_the_input_not_by_max_len(jax_checkpoint, tmp_path):
    """max_len 65536 in config.json, the same weights (sinusoidal positions), and 4 GiB
    of address space. Before: one word was padded to 8192 positions, and its batch of 32
    asked XLA for 17 GB of attention scores: an out-of-memory traceback."""
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(jax_checkpoint, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "max_len": 65536}))
    # The limit is on host memory, XLA:CPU's: a GPU runtime alone maps more than 4 GiB.
    prelude = ("import os, resource\nos.environ['JAX_PLATFORMS'] = 'cpu'\n"
               "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n")
    result = run_script(["--checkpoint", checkpoint, "--beam", "1"], b"cat\n", prelude)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert len(result.stdout.splitlines()) == 1


@pytest.mark.parametrize("alpha", ["nan", "inf", "-0.5"])
def test_a_length_penalty_that_is_not_a_finite_number_of_at_least_0_is_refused(
        torch_checkpoint, tmp_path, capsys, alpha):
    """--alpha nan used to search with NaN scores and print garbage, with exit code 0."""
    source = tmp_path / "source.txt"
    source.write_text("the quick brown fox\na small red house\n")
    code, out, err = run_translate(["--checkpoint", torch_checkpoint, "--framework", "torch",
                                    "--beam", "3", "--alpha", alpha, "--input", source], capsys)
    assert (code, out) == (2, [])
    assert err.splitlines() == [f"error: --alpha must be a number >= 0 (0: no length "
                                f"penalty), got {float(alpha)}"]


# Two lines as iconv writes them: -t utf-16le and -t utf-16be (no byte order mark), -t utf-16
# and -t utf-32 (a byte order mark first). ASCII text in UTF-16 is valid UTF-8 (NULs between
# the letters); an ü makes a byte that is not.
ASCII, UMLAUT = "the quick brown fox\na small red house\n", "the quick fox\nfünf houses\n"
LE, BE = "looks like UTF-16 LE text", "looks like UTF-16 BE text"
WIDE = {"utf-16-le": ("utf-16-le", ASCII, LE), "utf-16-be": ("utf-16-be", ASCII, BE),
        "utf-16-le-umlaut": ("utf-16-le", UMLAUT, LE),
        "utf-16-bom": ("utf-16", ASCII, "is UTF-16 LE text, not UTF-8: it starts with a "
                                        "UTF-16 LE byte order mark"),
        "utf-32-bom": ("utf-32", ASCII, "is UTF-32 LE text, not UTF-8: it starts with a "
                                        "UTF-32 LE byte order mark")}


@pytest.mark.parametrize("kind", WIDE)
def test_utf16_and_utf32_input_is_refused_naming_the_encoding(torch_checkpoint, tmp_path,
                                                               capsys, monkeypatch, kind):
    """NUL bytes are valid UTF-8: a UTF-16 file without a byte order mark used to become
    3 lines of garbage for 2 lines of input, with exit code 0."""
    encoding, text, says = WIDE[kind]
    data = text.encode(encoding)
    source = tmp_path / "source.txt"
    source.write_bytes(data)
    code, out, err = run_translate(["--checkpoint", torch_checkpoint, "--framework", "torch",
                                    "--beam", "1", "--max-len", "8", "--input", source], capsys)
    assert (code, out) == (2, [])
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --input {source} {says}")
    assert "not UTF-8" in err and "iconv -f UTF-" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    code, out, err = run_translate(["--checkpoint", torch_checkpoint, "--framework", "torch",
                                    "--beam", "1", "--max-len", "8"], capsys)
    assert (code, out) == (2, []) and err.startswith(f"error: stdin {says}")


def test_a_nul_byte_in_utf8_text_is_refused(torch_checkpoint, tmp_path, capsys):
    source = tmp_path / "source.txt"
    source.write_bytes(b"the cat\na \x00dog\n")
    code, out, err = run_translate(["--checkpoint", torch_checkpoint, "--framework", "torch",
                                    "--input", source], capsys)
    assert (code, out) == (2, [])
    assert err.splitlines() == [f"error: --input {source} is not UTF-8 text: line 2 holds a "
                                "NUL byte (byte 3), which text never does (UTF-16? UTF-32? "
                                "a binary file?)"]


def test_a_train_workdir_is_named_with_its_export(jax_checkpoint, tmp_path, capsys):
    """A train.py work directory holds config.json and tokenizer.model but its model is in
    export/: the error says so (it used to say only `has no model.safetensors`)."""
    workdir = tmp_path / "run"
    (workdir / "export").mkdir(parents=True)
    (workdir / "checkpoints").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        (workdir / "export" / name).write_bytes((jax_checkpoint / name).read_bytes())
    for name in ("config.json", "tokenizer.model"):
        (workdir / name).write_bytes((jax_checkpoint / name).read_bytes())
    source = tmp_path / "source.txt"
    source.write_text("the cat\n")
    for framework in ("jax", "torch"):
        code, out, err = run_translate(["--checkpoint", workdir, "--framework", framework,
                                        "--input", source], capsys)
        assert (code, out) == (2, [])
        assert err.splitlines() == [f"error: {workdir} has no model.safetensors (a train.py "
                                    f"work directory? its model is in {workdir / 'export'})"]
