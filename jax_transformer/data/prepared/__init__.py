"""A corpus prepared once: read, split, tokenized and encoded into a directory of
memory-mappable stores, which train.py (--data DIR, or WORKDIR/data) reads back.

    pipeline.py       prepare(): the stages in order, the directory written whole or not
                      at all (jaxformer-prepare, and train.py's first start on a corpus)
    raw_text.py       stage 1-2: the corpus read once into raw UTF-8 stores, dev and
                      test held out
    encode_worker.py  stage 4: one part of a split encoded in a process of its own; the
                      parts joined in order
    store.py          sentences as flat arrays (ids, offsets, lengths), in memory or
                      memory-mapped: what a split's side is on disk, and what batches
                      gather from
    directory.py      the prepared directory read back: its manifest checked, its stores
"""
