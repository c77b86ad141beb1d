"""What train.py (and jaxformer-prepare) prepare: the corpus its data flags name.

    corpus(data, seed)   a data.prepared.raw_text.Corpus: the sources to read, the splits to hold
                         out, the settings its preparation's key records

--task translate: sentence pairs (the built-in number corpus, parallel text files, or
a TSV/CSV file); --task lm: lines of text (the built-in counting text, or a text
file). Needs neither JAX nor torch.
"""

from __future__ import annotations

import functools

from jax_transformer.data import corpora
from jax_transformer.data.corpora import CorpusReport
from jax_transformer.data.prepared.directory import SPLITS
from jax_transformer.data.prepared.raw_text import Corpus, Source, given
from jax_transformer.train.settings.data import DataSettings


def corpus(data: DataSettings, seed: int) -> Corpus:
    """The corpus `data` names; `seed` holds out its dev and test splits."""
    return text_corpus(data, seed) if data.task == "lm" else translation_corpus(data, seed)


def translation_corpus(data: DataSettings, seed: int) -> Corpus:
    """The sentence pairs to prepare: the built-in number corpus, or the user's files
    with dev/test held out unless given."""
    settings = data.preparation()
    if data.builtin:
        splits = functools.cache(lambda: corpora.number_corpus(
            data.src_lang, data.tgt_lang, num_train=data.num_train, num_dev=data.num_dev,
            num_test=data.num_test, max_number=data.max_number, seed=seed))
        name = f"{data.src_lang}->{data.tgt_lang} number words"
        return Corpus("pairs", settings=settings, **{
            split: Source(lambda report, split=split: given(splits()[split], report),
                          CorpusReport(name)) for split in SPLITS})
    if data.columns_path:
        train = Source(lambda report: corpora.column_pairs(
            data.columns_path, data.src_column, data.tgt_column, report),
            CorpusReport(f"{data.columns_path} [{data.src_column} -> {data.tgt_column}]"),
            files=(data.columns_path,))
    else:
        train = Source(lambda report: corpora.parallel_text(data.src_path, data.tgt_path,
                                                            report),
                       CorpusReport(f"{data.src_path} | {data.tgt_path}"),
                       files=(data.src_path, data.tgt_path))
    given_splits = {}
    for split in ("dev", "test"):
        src, tgt = getattr(data, f"{split}_src_path"), getattr(data, f"{split}_tgt_path")
        if src:
            given_splits[split] = Source(
                lambda report, src=src, tgt=tgt: corpora.parallel_text(src, tgt, report),
                CorpusReport(f"{src} | {tgt}"), files=(src, tgt))
    return Corpus("pairs", train=train, settings=settings, **given_splits,
                  held_out=lambda available, files_given: data.held_out(
                      available, train.report.source, "pairs", files_given))


def text_corpus(data: DataSettings, seed: int) -> Corpus:
    """The lines to prepare: the built-in counting text (in --src-lang), or --text-path
    with --num-dev and --num-test lines held out."""
    settings = data.preparation()
    if data.builtin:
        splits = functools.cache(lambda: corpora.counting_text(
            data.src_lang, num_train=data.num_train, num_dev=data.num_dev,
            num_test=data.num_test, max_number=data.max_number, seed=seed))
        return Corpus("lines", settings=settings, **{
            split: Source(lambda report, split=split: given(splits()[split], report),
                          CorpusReport(f"counting in {data.src_lang} number words",
                                       unit="lines")) for split in SPLITS})
    train = Source(lambda report: corpora.text_lines(data.text_path, report),
                   CorpusReport(data.text_path, unit="lines"), files=(data.text_path,))
    return Corpus("lines", train=train, settings=settings,
                  held_out=lambda available, files_given: data.held_out(
                      available, data.text_path, "lines", files_given))
