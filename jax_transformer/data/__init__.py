"""Data: sentence pairs in, fixed-shape batches out. Needs neither JAX nor torch.

    corpora.py   the built-in number-words corpus; parallel text and TSV/CSV files
    batching.py  the shared SentencePiece vocabulary, length buckets, resumable batches
    natural.py   a synthetic parallel corpus with WMT-like sentence lengths (tests, benchmarks)
"""
