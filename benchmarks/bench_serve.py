"""Serving throughput on the CPU: our JAX searches against CTranslate2 (float32, int8).

    python benchmarks/bench_serve.py --checkpoint runs/bible/export \\
        --src-path test.en --ref-path test.fr --sentences 300

One of our checkpoint directories (config.json, model.safetensors, tokenizer.model),
exported with `jaxformer-port --to ctranslate2` into a temporary directory, translates
the first --sentences lines of --src-path, text in and text out, greedy and with beam
--beam, in four systems:

    jax            jax_transformer.applications.translator.translate_lines: the jit-compiled
                   searches with the key/value cache, batches sorted by length
    ct2_float32    ctranslate2.Translator(compute_type="float32"), the same batches size
    ct2_int8       the same model directory loaded with compute_type="int8": weights
                   quantized at load time

Every search ranks beams by summed log-probabilities (our alpha 0, "hf" style;
CTranslate2's length_penalty 0), the setting in which the CTranslate2 export decodes
our tokens exactly (parity_tests/test_export_ctranslate2.py), up to the same
--max-len tokens. Each (system, search) runs once as a warm-up (JAX compiles there,
into an empty persistent cache; each JAX search then runs once more from that cache,
its programs dropped from memory: the warm-up of a later process), then --rounds
times, all of them in turn each round; the figure is the median.
BLEU (sacrebleu) is against --ref-path; "same as JAX" counts translations identical
to ours. Nothing here reads a corpus of its own: the paths are flags.

Results go to benchmarks/results/serve.json, with the markdown page beside it
(serve.md; --render-only RESULTS_JSON renders it again from the JSON).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402

SYSTEMS = {"jax": "ours, JAX (jit, KV cache)", "ct2_float32": "CTranslate2 float32",
           "ct2_int8": "CTranslate2 int8"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path,
                   help="our checkpoint directory, with its tokenizer.model")
    p.add_argument("--src-path", required=True, help="source sentences, one a line")
    p.add_argument("--ref-path", required=True, help="their reference translations")
    p.add_argument("--sentences", type=int, default=300, help="the first N lines")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-len", type=int, help="generated tokens at most, </s> included "
                                               "(default: the model's max_len)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="CTranslate2's intra_threads (JAX uses every core)")
    report.add_output_args(p, "JSON results (default %(default)s)",
                           default=str(Path(__file__).parent / "results" / "serve.json"))
    return p.parse_args(argv)


def read_lines(path, count: int) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()[:count]
    if len(lines) < count:
        raise SystemExit(f"error: {path} has {len(lines)} lines, --sentences asks for {count}")
    return lines


def systems(args, ct2_dir: Path, max_len: int) -> dict:
    """name -> translate(lines, beam) -> translations, for each system. Sources longer
    than the model's max_len are cut as translate_lines cuts them: to max_len - 1
    pieces, then </s> (which CTranslate2 appends)."""
    import ctranslate2

    from jax_transformer.applications import translator
    model, tokenizer = translator.load(args.checkpoint, "jax")
    sp, longest = tokenizer.sp, model.config.max_len - 1

    def ours(lines, beam):
        return translator.translate_lines(lines, model, tokenizer, beam=beam, alpha=0.0,
                                          length_penalty_style="hf", max_len=max_len,
                                          batch_size=args.batch_size)

    def ctranslate2_system(compute_type):
        ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute_type,
                                     intra_threads=args.threads)

        def translate(lines, beam):
            results = ct2.translate_batch(
                [sp.encode(line.strip(), out_type=str)[:longest] for line in lines],
                max_batch_size=args.batch_size, beam_size=beam, length_penalty=0.0,
                max_input_length=0, max_decoding_length=max_len, min_decoding_length=0)
            return [sp.decode(result.hypotheses[0]) for result in results]
        return translate

    return {"jax": ours, "ct2_float32": ctranslate2_system("float32"),
            "ct2_int8": ctranslate2_system("int8")}


def measure(args, translate: dict, lines: list[str], references: list[str]) -> list[dict]:
    """One row per (system, search): a warm-up run each, then the rounds, in turn. JAX's
    warm-ups compile into an empty persistent cache (`compiled`: its programs and
    seconds); each JAX search is then warmed up again with the in-memory programs
    dropped, from that cache (`warm_cache`: its seconds and what loading took)."""
    import jax
    import sacrebleu

    from jax_transformer.train.runtime.compiling import CompileCounter
    runs = {(name, beam): (lambda run=run, beam=beam: run(lines, beam))
            for beam in (1, args.beam) for name, run in translate.items()}
    CompileCounter.start()
    warmups, compiled = {}, {}
    for key, run in runs.items():
        before = CompileCounter.snapshot()
        warmups[key] = runner.timed(run)
        compiled[key] = CompileCounter.since(before)
    warm_cache = {}
    for key in [key for key in runs if key[0] == "jax"]:
        jax.clear_caches()
        before = CompileCounter.snapshot()
        warm_cache[key] = dict(seconds=runner.timed(runs[key])[0],
                               **CompileCounter.since(before))
    times = runner.alternate({key: lambda i, run=run: runner.timed(run)[0]
                              for key, run in runs.items()}, args.rounds)
    rows = []
    for (name, beam), (warmup_seconds, outputs) in warmups.items():
        seconds = statistics.median(times[name, beam])
        ours = warmups["jax", beam][1]
        rows.append(dict(
            system=name, beam=beam, seconds=seconds, sentences_per_s=len(lines) / seconds,
            warmup_seconds=warmup_seconds, runs=times[name, beam],
            compiled=compiled[name, beam] if name == "jax" else None,
            warm_cache=warm_cache.get((name, beam)),
            bleu=sacrebleu.corpus_bleu(outputs, [references]).score,
            same_as_jax=sum(a == b for a, b in zip(outputs, ours)) / len(lines)))
        print(f"{name:12s} beam {beam}  {rows[-1]['sentences_per_s']:8.1f} sentences/s  median "
              f"{seconds:7.2f}s  warm-up {warmup_seconds:7.2f}s  BLEU {rows[-1]['bleu']:5.2f}  "
              f"same as JAX {rows[-1]['same_as_jax']:.0%}", file=sys.stderr, flush=True)
    return rows


def search_name(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def find(rows, system: str, beam: int) -> dict:
    return next(r for r in rows if (r["system"], r["beam"]) == (system, beam))


def describe(result: dict) -> Report:
    """The page of a results dict: sentences/s and BLEU per system and search, then the
    BLEU change of int8 against float32."""
    rows, machine, config = result["results"], result["machine"], result["config"]
    jax_rate = {r["beam"]: r["sentences_per_s"] for r in rows if r["system"] == "jax"}
    throughput = [[SYSTEMS[r["system"]], search_name(r["beam"]), f"{r['sentences_per_s']:.1f}",
                   f"{r['sentences_per_s'] / jax_rate[r['beam']]:.2f}x",
                   f"{r['seconds']:.2f}", f"{r['warmup_seconds']:.2f}", len(r["runs"]),
                   f"{r['bleu']:.2f}", f"{r['same_as_jax']:.0%}"] for r in rows]
    compiles = [[search_name(r["beam"]), r["compiled"]["programs"],
                 f"{r['compiled']['compile_seconds']:.2f}",
                 f"{r['compiled']['trace_lower_seconds']:.2f}", f"{r['warmup_seconds']:.2f}",
                 r["warm_cache"]["cache_hits"], f"{r['warm_cache']['cache_load_seconds']:.2f}",
                 f"{r['warm_cache']['seconds']:.2f}", f"{r['seconds']:.2f}"]
                for r in rows if r.get("compiled")]
    int8 = []
    for beam in sorted(jax_rate):
        full = find(rows, "ct2_float32", beam)["bleu"]
        quantized = find(rows, "ct2_int8", beam)["bleu"]
        int8.append([search_name(beam), f"{full:.2f}", f"{quantized:.2f}",
                     f"{quantized - full:+.2f}"])
    load = result["load_average"]
    return Report(
        title="Serving throughput: JAX against CTranslate2 (CPU)",
        script="benchmarks/bench_serve.py",
        notes=[f"Model: {result['checkpoint']}, d_model {config['d_model']}, "
               f"{config['num_heads']} heads, d_ff {config['d_ff']}, "
               f"{config['num_encoder_layers']}+{config['num_decoder_layers']} layers, "
               f"vocabulary {config['tgt_vocab_size']}; {result['sentences']} sentences of "
               f"{result['src_path']}, text in, text out. Sentences/s: the median of "
               f"{result['rounds']} rounds after a warm-up run (JAX compiles there), all "
               "systems in turn each round. Beams ranked by summed log-probabilities "
               "(length penalty 0).",
               f"The machine was shared: other jobs ran throughout (load average "
               f"{load['start']:.1f} at the start, {load['end']:.1f} at the end, on "
               f"{machine['cpus']} CPUs), so the figures are noisy; the rounds alternate "
               "so that every system met the same load."],
        tables=[Table(("system", "search", "sentences/s", "vs JAX", "median (s)",
                       "warm-up (s)", "rounds", "BLEU", "same as JAX"), throughput,
                      align="llrrrrrrr"),
                Table(("search", "float32 BLEU", "int8 BLEU", "int8 change"), int8,
                      align="lrrr")]
               + ([Table(("JAX search", "programs compiled", "compiling (s)",
                          "tracing and lowering (s)", "warm-up, cold cache (s)",
                          "programs loaded", "loading (s)", "warm-up, warm cache (s)",
                          "median run (s)"), compiles, align="lrrrrrrrr")]
                  if compiles else []),
        settings={k: result[k] for k in ("checkpoint", "src_path", "ref_path", "sentences",
                                         "batch_size", "beam", "max_len", "rounds",
                                         "threads")},
        device=runner.machine_line(machine),
        versions=result["versions"])


def main(argv=None):
    if report.render_only(argv, describe) is not None:
        return
    args = parse_args(argv)
    import jax

    from jax_transformer.port.ctranslate2 import export_ctranslate2
    from jax_transformer.train.runtime.compiling import use_compilation_cache
    lines = read_lines(args.src_path, args.sentences)
    references = read_lines(args.ref_path, args.sentences)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        use_compilation_cache(Path(tmp) / "xla-cache")  # empty: the warm-ups compile
        config = export_ctranslate2(args.checkpoint, Path(tmp) / "ct2")
        max_len = args.max_len or config.max_len
        rows = measure(args, systems(args, Path(tmp) / "ct2", max_len), lines, references)
    result = dict(
        checkpoint=str(args.checkpoint), src_path=str(args.src_path),
        ref_path=str(args.ref_path), sentences=args.sentences, batch_size=args.batch_size,
        beam=args.beam, max_len=max_len, rounds=args.rounds, threads=args.threads,
        config=config.to_dict(),
        load_average=dict(start=load_start, end=os.getloadavg()[0]),
        versions=dict(**runner.versions("jax", "flax", "ctranslate2", "sacrebleu"),
                      python=platform.python_version()),
        machine=dict(**runner.host(), jax_devices=[str(d) for d in jax.devices()]),
        results=rows)
    print(report.write_results(result, args.out, describe))


if __name__ == "__main__":
    main()
