"""train.py --init-from an M2M100-sized converted model with its state split over 8
CPU devices (--fsdp 8), against the same run on one device with nothing split: the
first loss, each device's share of the state, the step's compile, the host's peak.

    python benchmarks/bench_init_from.py    # about 6 minutes; 17 GB of host memory at its peak

The model is transformers' M2M100 with random weights (12+12 layers, d_model 1024,
FFN 4096, 16 heads: 353M parameters, the small vocabulary of a SentencePiece model
learned on number words; no download), built as the parity tests build theirs
(parity_tests/helpers.py) and converted with jaxformer-port. Each run is `train.py
--init-from ... --steps 2` in a process of its own, its peak resident memory read by a
parent made for it (getrusage of its children). The 8 devices share this machine's
memory, so the host's peak holds all of their step temporaries; each device's share of
the state is eval.json's `device_state_bytes`.

Results go to benchmarks/results/init_from_fsdp.json with the markdown page beside it
(--render-only RESULTS_JSON renders it again).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = {"one device, whole": ["--cpu-devices", "1"],
        "8 devices, --fsdp 8": ["--cpu-devices", "8", "--fsdp", "8"],
        # data parallelism: 8 whole copies of the state, past this machine's 24 GB at
        # the default size; at a small one it shows that the first loss depends on the
        # device count (the loss summed in 8 parts), not on --fsdp
        "8 devices, whole": ["--cpu-devices", "8"]}
# The corpus the tokenizer is learned on and the runs train on: number words, en -> fr.
CORPUS = dict(num_train=48, num_dev=8, num_test=8, max_number=300, seed=0)
# Runs `sys.argv[1:]` and prints its peak resident memory (bytes) on its last line.
PEAK_OF_CHILD = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode;"
                 " print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024);"
                 " sys.exit(code)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the model, corpus and runs go (default: a temporary one)")
    parser.add_argument("--layers", type=int, default=12, help="encoder and decoder layers each")
    parser.add_argument("--d-model", type=int, default=1024,
                        help="FFN 4x as wide, a head every 64 dimensions")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS)[:2])
    report.add_output_args(parser, "results JSON (default: "
                                   "benchmarks/results/init_from_fsdp.json)")
    return parser.parse_args(argv)


def sizes(args) -> dict:
    """transformers' M2M100Config fields for the model."""
    return dict(d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
                encoder_attention_heads=args.d_model // 64,
                decoder_attention_heads=args.d_model // 64, encoder_ffn_dim=4 * args.d_model,
                decoder_ffn_dim=4 * args.d_model, max_position_embeddings=1024)


def build(work: Path, model_sizes: dict) -> tuple[Path, int]:
    """The converted random M2M100 and its corpus files in `work`; -> its directory
    and parameter count."""
    from jax_transformer.data import corpora
    from parity_tests.helpers import convert_fairseq, hf_fairseq_tokenizer, make_fairseq

    pairs = corpora.number_corpus("en", "fr", **CORPUS)
    tokenizer, tokenizer_work = hf_fairseq_tokenizer(
        work, "m2m100", [s for pair in pairs["train"] for s in pair])
    vocab = max([len(tokenizer), *tokenizer.id_to_lang_token]) + 8
    model, src_dir = make_fairseq(work, "m2m100", vocab_size=vocab, tie_word_embeddings=False,
                                  **model_sizes)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    tokenizer.save_pretrained(src_dir)
    (src_dir / "sentencepiece.bpe.model").write_bytes(
        (tokenizer_work / "sentencepiece.bpe.model").read_bytes())
    convert_fairseq("m2m100", src_dir, work / "converted")
    for split, rows in pairs.items():
        (work / f"{split}.src").write_text("".join(s + "\n" for s, _ in rows))
        (work / f"{split}.tgt").write_text("".join(t + "\n" for _, t in rows))
    return work / "converted", parameters


def train(work: Path, converted: Path, name: str, flags: list[str]) -> dict:
    """One train.py run; its first loss, state bytes, compile and peak memory."""
    workdir = work / name.replace(" ", "_").replace(",", "")
    corpus = [f"--{prefix}{side}-path={work / f'{split}.{side}'}"
              for prefix, split in (("", "train"), ("dev-", "dev"), ("test-", "test"))
              for side in ("src", "tgt")]
    command = [sys.executable, "-c", PEAK_OF_CHILD, sys.executable, "train.py",
               "--workdir", str(workdir), "--init-from", str(converted),
               "--src-lang-code", "en", "--tgt-lang-code", "fr", *corpus, "--steps", "2",
               "--max-tokens", "1024", "--max-len", "64", "--dev-bleu-sentences", "0",
               "--samples", "0", "--quiet", "--no-compile-cache", *flags]
    print(f"{name}: train.py {' '.join(flags)}", flush=True)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name}: train.py failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    training = json.loads((workdir / "eval.json").read_text())["training"]
    log = done.stderr.splitlines()
    return {"flags": flags, "first_loss": next(r["loss"] for r in records if "loss" in r),
            "state_bytes": training["state_bytes"],
            "device_state_bytes": training["device_state_bytes"],
            "compile_seconds": training["compiled"]["compile_seconds"],
            "peak_host_bytes": int(done.stdout.strip().splitlines()[-1]),
            "scanned": any("(scanned)" in line for line in log)}


def measure(args) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        converted, parameters = build(work, sizes(args))
        runs = {name: train(work, converted, name, RUNS[name]) for name in args.runs}
    return {"parameters": parameters, "runs": runs,
            "settings": sizes(args),
            "machine": {**runner.host(), "jax_devices": ["cpu, split as each run says"]},
            "versions": runner.versions("jax", "flax", "torch", "transformers")}


def describe(result: dict) -> Report:
    runs = result["runs"]
    first = next(iter(runs.values()))
    rows = [[name, f"{run['device_state_bytes'] / 2**20:,.1f}",
             f"{run['device_state_bytes'] / first['device_state_bytes']:.4f}",
             repr(run["first_loss"]), "yes" if run["scanned"] else "no",
             f"{run['compile_seconds']:.1f}", f"{run['peak_host_bytes'] / 2**30:.1f}"]
            for name, run in runs.items()]
    return Report(
        title="--init-from an M2M100-sized model with its state split over 8 devices (--fsdp 8)",
        script="benchmarks/bench_init_from.py",
        notes=[f"{result['parameters'] / 1e6:.1f}M parameters; the state (float32 "
               f"parameters and Adam's two moments) is {first['state_bytes'] / 2**20:,.1f} MiB. "
               "State a device: the most any device holds (eval.json's device_state_bytes), "
               "and its share of the first row's. First loss: metrics.jsonl's step 1, "
               "before any update. Host peak: the train.py process's peak resident memory, "
               "which holds every device's step temporaries on a CPU."],
        tables=[Table(["run", "state MiB a device", "of the first row's", "first loss",
                       "layers scanned", "compile s", "host peak GiB"], rows, "lrrrlrr")],
        settings={k: report.setting(v) for k, v in result["settings"].items()},
        device=runner.machine_line(result["machine"]),
        versions=result["versions"])


def main(argv=None) -> dict:
    return report.run_benchmark(argv, parse_args, measure, describe,
                                RESULTS / "init_from_fsdp.json")


if __name__ == "__main__":
    main()
