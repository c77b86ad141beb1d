"""Data: sentence pairs in, fixed-shape batches out. Needs neither JAX nor torch.

    corpora.py        the built-in number-words corpus and counting text; parallel text,
                      TSV/CSV, text files, read as streams with the bad-data policy
    encoding.py       the shared SentencePiece vocabulary; pairs and lines encoded into ids
    prepare.py        a corpus read, split, tokenized and encoded once, on every core
    raw.py            what a preparation reads: sources, raw UTF-8 stores, held-out splits
    encode_worker.py  one part of a split encoded in a process of its own
    prepared.py       the prepared directory read back: its manifest and stores
    store.py          sentences as flat arrays, in memory or memory-mapped
    rows.py           length buckets, row shapes, best-fit packing of sentences into rows
    packing.py        rows of one shape packed with sentences, resumable batches
    natural.py        a synthetic parallel corpus with WMT-like sentence lengths
"""
