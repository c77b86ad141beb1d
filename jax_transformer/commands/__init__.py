"""The commands: argument parsing and I/O over the library below, one module each.

    train.py           jaxformer-train            (= python train.py)
    translate.py       jaxformer-translate        encoder-decoder checkpoints
    generate.py        jaxformer-generate         decoder-only checkpoints
    port.py            jaxformer-port             convert checkpoints, both directions
    parity.py          jaxformer-parity           the layer-by-layer parity report
    natural_corpus.py  jaxformer-natural-corpus   a synthetic corpus with natural lengths
    exit_codes.py      the wrapper every command goes through: one `error:` line, an exit code
    parsing.py         every command's parser: a bad command line is one `error:` line and a
                       hint, flags are spelled in full, a path flag is never empty

`jaxformer-X` runs `python -m jax_transformer.commands.X` (pyproject.toml's
[project.scripts]). A command may import anything below it; nothing below imports
a command (tests/test_layout.py).
"""
