"""Data: sentence pairs in, fixed-shape batches out. Needs neither JAX nor torch.

    corpora.py   the built-in number-words corpus and counting text; parallel text, TSV/CSV, text files
    encoding.py  the shared SentencePiece vocabulary; pairs and lines encoded into piece ids
    packing.py   length buckets, rows of one shape packed with sentences, resumable batches
    natural.py   a synthetic parallel corpus with WMT-like sentence lengths (tests, benchmarks)
"""
