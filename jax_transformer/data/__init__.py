"""Data: text in, fixed-shape batches out, in the order the data flow. Needs neither JAX
nor torch.

    1. text        corpora.py     the built-in number-words corpus and counting text;
                                  parallel text, TSV/CSV and text files read as streams
                                  with the bad-data policy (CorpusError, CorpusReport)
                   natural.py     a synthetic parallel corpus with WMT-like sentence lengths
    2. tokenizer   tokenizing.py  the SentencePiece vocabulary trained on the text; pairs
                                  and lines encoded into piece ids
    3. prepared    prepared/      the corpus read, split, tokenized and encoded once, on
                                  every core, into a directory of memory-mapped stores
                                  (train.py --data DIR); its __init__ lists its modules
    4. batches     batches/       where batches are formed: sentences packed into rows of
                                  one shape, the rows laid out as batches of a token budget,
                                  resumable; its __init__ lists its modules
"""
