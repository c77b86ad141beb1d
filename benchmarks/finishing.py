"""The paper's finishing recipe on a real corpus: test BLEU of the last checkpoint, the
best by dev BLEU (--keep-best) and the average of the newest 5, each decoded greedily
and with beam 4 / length penalty 0.6.

    python benchmarks/finishing.py --corpus CORPUS_DIR --workdir runs/finishing \\
        --out benchmarks/results/finishing_cpu.json

CORPUS_DIR holds train/dev/test .en/.fr files (the EN->FR corpus of ../shared/corpora,
unpacked). train.py trains d_model 256, 3+3 layers for --steps or --minutes (its
--time-budget), saving and evaluating every --every steps; then each of the three
models translates the first --test-sentences test sentences with each search.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEARCHES = {"greedy": (1, 0.0), "beam 4, alpha 0.6": (4, 0.6)}
AVERAGED = 5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, required=True,
                   help="a directory of train/dev/test .SRC/.TGT files")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="fr")
    p.add_argument("--workdir", type=lambda text: Path(text).resolve(), required=True,
                   help="train.py's work directory")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--minutes", type=float, default=20.0, help="train.py's --time-budget")
    p.add_argument("--every", type=int, default=250, help="steps between evaluations and "
                                                          "checkpoints")
    p.add_argument("--dev-bleu-sentences", type=int, default=300)
    p.add_argument("--test-sentences", type=int, default=500)
    p.add_argument("--model-flags", default="--d-model 256 --heads 4 --d-ff 1024 --layers 3 "
                   "--vocab-size 8000 --max-len 128 --max-tokens 4096 --warmup 400",
                   help="train.py's model and batch flags")
    report.add_output_args(p, "where to write the results JSON",
                           default=str(ROOT / "benchmarks" / "results" / "finishing_cpu.json"))
    return p.parse_args(argv)


def train(args) -> dict:
    """Run train.py (keep-best by dev BLEU, the newest AVERAGED checkpoints kept);
    returns its eval.json and wall seconds."""
    corpus = [f"--{prefix}{side}-path={(args.corpus / f'{split}.{lang}').resolve()}"
              for split, prefix in (("train", ""), ("dev", "dev-"), ("test", "test-"))
              for side, lang in (("src", args.src), ("tgt", args.tgt))]
    command = [sys.executable, "train.py", "--workdir", str(args.workdir), *corpus,
               *args.model_flags.split(), "--steps", str(args.steps),
               "--time-budget", str(args.minutes * 60), "--eval-every", str(args.every),
               "--checkpoint-every", str(args.every), "--keep", str(AVERAGED),
               "--keep-best", "dev_bleu", "--dev-bleu-sentences", str(args.dev_bleu_sentences),
               "--quiet", "--samples", "0"]
    print(" ".join(command), file=sys.stderr)
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    return {"eval": json.loads((args.workdir / "eval.json").read_text()),
            "wall_seconds": round(seconds, 1), "command": command[1:]}


def finished_models(workdir: Path) -> dict[str, dict]:
    """The three models as checkpoint directories under WORKDIR/finishing/: the last
    (the export), the best kept checkpoint by dev BLEU, and the mean of the newest
    AVERAGED checkpoints."""
    from jax_transformer.train.checkpoints import Checkpointer, restore_model
    from transformer_core.averaging import average_dirs
    out = workdir / "finishing"
    checkpointer = Checkpointer(workdir, best="dev_bleu")
    best, steps = checkpointer.best_step(), sorted(checkpointer.manager.all_steps())
    checkpointer.close()
    for step in {best, *steps[-AVERAGED:]}:
        restore_model(workdir, step).save_pretrained(out / f"step_{step}",
                                                     tokenizer=workdir / "tokenizer.model")
    newest = steps[-AVERAGED:]
    average_dirs([out / f"step_{step}" for step in newest], out / "average")
    return {"last": {"dir": workdir / "export", "steps": [steps[-1]]},
            "best by dev BLEU": {"dir": out / f"step_{best}", "steps": [best]},
            f"average of the newest {len(newest)}": {"dir": out / "average", "steps": newest}}


def judge(models: dict[str, dict], sources: list[str], references: list[str]) -> list[dict]:
    """Each model's test BLEU and chrF (sacreBLEU, with signatures) for each search."""
    from jax_transformer.applications import translator
    from jax_transformer.train.tasks.metrics import translation_metrics
    rows = []
    for name, model_info in models.items():
        model, tokenizer = translator.load(model_info["dir"], "jax")
        for search, (beam, alpha) in SEARCHES.items():
            seconds, hypotheses = runner.timed(lambda: translator.translate_lines(
                sources, model, tokenizer, beam=beam, alpha=alpha, batch_size=50))
            scores = translation_metrics(hypotheses, references)
            rows.append({"model": name, "steps": model_info["steps"], "search": search,
                         "bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                         "bleu_signature": scores["bleu_signature"],
                         "chrf_signature": scores["chrf_signature"],
                         "decode_seconds": round(seconds, 1)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def describe(result: dict) -> Report:
    trained, rows = result["training"], result["results"]
    dev = [f"{r['step']}: {r['dev_bleu']:.2f}" for r in result["dev_bleu_curve"]]
    return Report(
        title="Finishing a run: last, best by dev BLEU, average (CPU)",
        script="benchmarks/finishing.py",
        notes=[f"train.py on {result['corpus']} ({trained['steps']} steps, stopped by "
               f"{trained['stopped_by']}, {result['wall_seconds']:.0f} s in all), then the "
               f"first {result['test_sentences']} test sentences translated by each model "
               "and search. BLEU and chrF by sacreBLEU: "
               f"`{rows[0]['bleu_signature']}`, `{rows[0]['chrf_signature']}`.",
               f"Dev BLEU at each evaluation (the first {result['dev_bleu_sentences']} dev "
               f"sentences, greedy): {', '.join(dev)}. Dev BLEU decoding took "
               f"{result['dev_decode_seconds']:.0f} s of the run's "
               f"{result['wall_seconds']:.0f} s."],
        tables=[Table(("model", "checkpoints", "search", "test BLEU", "chrF", "decode (s)"),
                      [[r["model"], " ".join(map(str, r["steps"])), r["search"],
                        f"{r['bleu']:.2f}", f"{r['chrf']:.2f}", f"{r['decode_seconds']:.1f}"]
                       for r in rows], align="lllrrr")],
        settings={"command": result["command"], "test_sentences": result["test_sentences"]},
        device=runner.machine_line(result["machine"]),
        versions=result["versions"])


def main(argv=None):
    if report.render_only(argv, describe) is not None:
        return
    args = parse_args(argv)
    started = time.perf_counter()
    trained = train(args)
    import jax
    test = [(args.corpus / f"test.{lang}").read_text(encoding="utf-8").splitlines()
            [:args.test_sentences] for lang in (args.src, args.tgt)]
    rows = judge(finished_models(args.workdir), *test)
    records = [json.loads(line) for line in (args.workdir / "metrics.jsonl").open()]
    curve = [{"step": r["step"], "dev_bleu": r["dev_bleu"]} for r in records if "dev_bleu" in r]
    result = dict(
        corpus=str(args.corpus), command=" ".join(trained["command"]),
        training=trained["eval"]["training"], wall_seconds=trained["wall_seconds"],
        dev_bleu_sentences=args.dev_bleu_sentences, test_sentences=args.test_sentences,
        dev_bleu_curve=curve,
        dev_decode_seconds=sum(r.get("dev_decode_seconds", 0) for r in records),
        results=rows, seconds=round(time.perf_counter() - started, 1),
        machine={**runner.host(), "jax_devices": [str(d) for d in jax.devices()],
                 "load_average_end": os.getloadavg()[0]},
        versions=runner.versions("jax", "flax", "orbax-checkpoint", "sacrebleu"))
    print(report.write_results(result, args.out, describe), end="")


if __name__ == "__main__":
    main()
