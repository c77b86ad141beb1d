"""What the commands do with a checkpoint directory, over the model, the searches and
the tokenizers (the parts that mirror torch_reference/):

    translator.py          translate lines (the library of jaxformer-translate)
    compiled_searches.py   its JAX searches, compiled once and kept on disk
    batch_search.py        one batch's search in either framework, which both run
    generator.py           continue prompts with a decoder-only model (of jaxformer-generate)
    parity.py              the layer-by-layer parity report of both frameworks (of
                           jaxformer-parity)
"""
