"""Train the Transformer: a translator, or with --task lm a decoder-only language model.

With no flags: the built-in corpus (English number words -> German, generated
locally with num2words) and a small model, end to end on a CPU in minutes.
With flags: your corpus, the paper's model sizes, GPUs/TPUs, several hosts.

    python train.py --workdir runs/numbers
    python train.py --workdir runs/wmt --src-path train.en --tgt-path train.de \\
        --d-model 512 --heads 8 --d-ff 2048 --layers 6 --max-tokens 25000 \\
        --steps 100000 --warmup 4000 --dtype bfloat16
    python train.py --task lm --workdir runs/counting       # built-in text: counting in words
    python train.py --task lm --workdir runs/lm --text-path book.txt   # one example per line

Running it again on the same --workdir resumes from the latest checkpoint.
SIGTERM or Ctrl-C finishes the current step, saves it and exits (README:
"Faults and bad input").
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    from jax_transformer.train.settings import (ACTIVATIONS, POSITION_LAYOUTS, TASK_ARCHITECTURES,
                                                TASK_DEFAULTS, DataSettings, ModelSettings,
                                                TrainSettings)
    DATA, MODEL, TRAIN = DataSettings(), ModelSettings(), TrainSettings()  # the defaults
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=TRAIN.workdir,
                   help="where checkpoints, metrics.jsonl, eval.json, figures and the exported "
                        "model go; an existing run there is resumed (default: %(default)s)")

    p.add_argument("--task", choices=TASK_ARCHITECTURES, default=DATA.task,
                   help="translate: an encoder-decoder on sentence pairs; lm: a decoder-only "
                        "language model on lines of text, which also prints sampled "
                        "continuations (default: %(default)s)")

    g = p.add_argument_group("data (default: the built-in number-words corpus; with --task lm, "
                             "the built-in counting text)")
    g.add_argument("--src-lang", default=DATA.src_lang, help="number corpus source language, a num2words "
                   "code; with --task lm, the counting text's language (default: %(default)s)")
    g.add_argument("--tgt-lang", default=DATA.tgt_lang, help="number corpus target language (default: "
                   "%(default)s)")
    g.add_argument("--num-train", type=int, default=DATA.num_train,
                   help="number corpus training pairs, or counting text lines (default: "
                        "%(default)s)")
    g.add_argument("--max-number", type=int, default=DATA.max_number,
                   help="number corpus draws numbers below this; counting lines start below "
                        "it (default: %(default)s)")
    g.add_argument("--text-path", help="--task lm: a UTF-8 text file, one example (sentence, "
                   "paragraph) per line; --num-dev and --num-test lines are held out")
    g.add_argument("--src-path", help="parallel text: source file, one sentence per line")
    g.add_argument("--tgt-path", help="parallel text: target file, line-aligned with --src-path")
    g.add_argument("--columns-path", help="a TSV (.tsv) or CSV file with a header row")
    g.add_argument("--src-column", default=DATA.src_column,
                   help="source column of --columns-path (default: %(default)s)")
    g.add_argument("--tgt-column", default=DATA.tgt_column,
                   help="target column of --columns-path (default: %(default)s)")
    g.add_argument("--dev-src-path", help="parallel text: dev set source (default: hold out "
                   "--num-dev training pairs)")
    g.add_argument("--dev-tgt-path", help="parallel text: dev set target")
    g.add_argument("--test-src-path", help="parallel text: test set source (default: hold out "
                   "--num-test training pairs)")
    g.add_argument("--test-tgt-path", help="parallel text: test set target")
    g.add_argument("--num-dev", type=int, default=DATA.num_dev,
                   help="held-out pairs (or lines) for the dev set (default: %(default)s)")
    g.add_argument("--num-test", type=int, default=DATA.num_test,
                   help="held-out pairs (or lines) for the test set (default: %(default)s)")
    g.add_argument("--tokenizer-type", choices=("unigram", "bpe"), default=DATA.tokenizer_type,
                   help="SentencePiece model type; the paper used byte-pair encoding "
                        "(default: %(default)s)")
    g.add_argument("--vocab-size", type=int, default=DATA.vocab_size, help="shared SentencePiece "
                   "vocabulary size; smaller if the text has fewer pieces (default: %(default)s)")
    g.add_argument("--max-len", type=int, default=DATA.max_len, help="longest sentence in tokens; longer "
                   "pairs (or lines) are skipped and counted (default: %(default)s)")
    g.add_argument("--max-tokens", type=int, default=DATA.max_tokens, help="token budget per micro-batch "
                   "(--accumulate of them make one update), padding included, like fairseq's "
                   "--max-tokens (default: %(default)s)")

    g = p.add_argument_group("model (the paper's base: --d-model 512 --heads 8 --d-ff 2048 "
                             "--layers 6)")
    g.add_argument("--d-model", type=int, default=MODEL.d_model,
                   help="model width: embeddings and every sublayer output (default: %(default)s)")
    g.add_argument("--heads", type=int, default=MODEL.heads,
                   help="attention heads; must divide --d-model (default: %(default)s)")
    g.add_argument("--d-ff", type=int, default=MODEL.d_ff,
                   help="inner width of the position-wise feed-forward layers (default: %(default)s)")
    g.add_argument("--layers", type=int, default=MODEL.layers,
                   help="encoder and decoder layers each; a language model's decoder layers "
                        "(default: %(default)s)")
    g.add_argument("--dropout", type=float, default=MODEL.dropout, help="dropout on embeddings, attention "
                   "probabilities, the FFN and each sublayer output (default: %(default)s)")
    g.add_argument("--pre-norm", action="store_true",
                   help="pre-LayerNorm with final norms instead of the paper's post-LN")
    g.add_argument("--activation", choices=ACTIVATIONS, default=MODEL.activation,
                   help="the feed-forward layers' activation; opus-mt uses silu "
                        "(default: %(default)s)")
    g.add_argument("--position-layout", choices=POSITION_LAYOUTS, default=MODEL.position_layout,
                   help="sinusoid columns: interleaved sin/cos (the paper) or half_split, all "
                        "sines then all cosines (Marian); half_split (without --pre-norm) makes "
                        "a model `python -m jax_transformer.port --to hf-marian` exports "
                        "(default: %(default)s)")

    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=TRAIN.steps,
                   help=f"optimizer updates in total (default: %(default)s; "
                        f"{TASK_DEFAULTS['lm']['steps']} with --task lm)")
    g.add_argument("--time-budget", type=float, default=TRAIN.time_budget, metavar="SECONDS",
                   help="stop training after the step in which this many seconds since the "
                        "start have passed (corpus, tokenizer and compiling count), save that "
                        "step, then export and evaluate as usual; a resumed run gets a fresh "
                        "budget (default: no limit)")
    g.add_argument("--warmup", type=int, default=TRAIN.warmup,
                   help="warm-up steps of the paper's schedule (default: %(default)s)")
    g.add_argument("--lr-scale", type=float, default=TRAIN.lr_scale, help="multiplies the schedule "
                   "d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (default: %(default)s)")
    g.add_argument("--label-smoothing", type=float, default=TRAIN.label_smoothing,
                   help="mass spread over the vocabulary; padding is ignored (default: %(default)s)")
    g.add_argument("--clip-norm", type=float, default=TRAIN.clip_norm,
                   help="clip gradients to this global norm; 0 = off (default: %(default)s)")
    g.add_argument("--accumulate", type=int, default=TRAIN.accumulate, help="micro-batches per update, "
                   "gradients summed exactly (default: %(default)s)")
    g.add_argument("--dtype", choices=("float32", "bfloat16"), default=TRAIN.dtype,
                   help="compute dtype; parameters and optimizer state stay float32 "
                        "(default: %(default)s)")
    g.add_argument("--seed", type=int, default=TRAIN.seed, help="seeds the corpus split, data order, "
                   "initialisation and dropout (default: %(default)s)")

    g = p.add_argument_group("checkpoints, evaluation, output")
    g.add_argument("--checkpoint-every", type=int, default=TRAIN.checkpoint_every,
                   help="steps between orbax checkpoints (default: %(default)s)")
    g.add_argument("--keep", type=int, default=TRAIN.keep,
                   help="checkpoints kept (default: %(default)s)")
    g.add_argument("--eval-every", type=int, default=TRAIN.eval_every,
                   help="steps between held-out loss evaluations (default: %(default)s)")
    g.add_argument("--beam", type=int, default=TRAIN.beam,
                   help="beam size for the final test translation; 1 = greedy (default: %(default)s)")
    g.add_argument("--decode-batch-size", type=int, default=TRAIN.decode_batch_size,
                   help="sentences per batch when translating the test set (default: %(default)s)")
    g.add_argument("--samples", type=int, default=TRAIN.samples,
                   help="sample translations (or continuations) printed at the end "
                        "(default: %(default)s)")
    g.add_argument("--temperature", type=float, default=TRAIN.temperature,
                   help="--task lm: sampling temperature of the printed continuations; 0 = "
                        "greedy (default: %(default)s)")
    g.add_argument("--distributed", action="store_true", help="several hosts: call "
                   "jax.distributed.initialize() (coordinator from the environment)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                   help="write no TensorBoard event files (by default WORKDIR/tensorboard/, "
                        "for `tensorboard --logdir WORKDIR`)")
    g.add_argument("--compile-cache", default=TRAIN.compile_cache, metavar="DIR",
                   help="JAX's persistent compilation cache: a repeated or resumed run loads "
                        "its compiled programs from here (default: %(default)s)")
    g.add_argument("--no-compile-cache", dest="compile_cache", action="store_const", const=None,
                   help="compile everything afresh and keep nothing")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    from jax_transformer.train.settings import TASK_DEFAULTS
    p = build_parser()
    task = p.parse_known_args(argv)[0].task
    p.set_defaults(**TASK_DEFAULTS.get(task, {}))
    args = p.parse_args(argv)
    for name in ("steps", "max_tokens", "checkpoint_every", "eval_every", "keep", "accumulate",
                 "beam", "decode_batch_size", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv=None) -> int:
    """The command line; returns the exit code (jax_transformer.cli: 2 for bad input,
    1 for a failed run, 130 / 143 after SIGINT / SIGTERM, the step saved)."""
    args = parse_args(argv)
    from jax_transformer import cli  # after --help, which needs no JAX
    return cli.run(lambda _: train(args))


def train(args: argparse.Namespace) -> int:
    from jax_transformer.train.settings import from_flags
    data, model, settings = from_flags(vars(args))  # bad flags fail here, before JAX loads
    from jax_transformer.train.loop import run
    summary = run(data, model, settings)
    test = summary["test"]
    results = {"step": summary["step"], "train_seconds": summary["train_seconds"],
               "dev_loss": round(summary["dev"]["loss"], 4), "test_loss": round(test["loss"], 4),
               "test_perplexity": round(test["perplexity"], 3)}
    if data.task == "lm":
        results.update(dev_nll=round(summary["dev"]["nll"], 4), test_nll=round(test["nll"], 4),
                       test_unigram_entropy=round(test["unigram_entropy"], 4),
                       test_second_half_match=test["second_half_match"])
    else:
        results.update(test_exact_match=test["exact_match"], test_bleu=round(test["bleu"], 2),
                       test_chrf=round(test["chrf"], 2))
    print(json.dumps({**results, "workdir": settings.workdir}, indent=2), file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
