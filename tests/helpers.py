"""What the tests share: the commands' tiny checkpoints and their in-process runs, and
parallel text files and a directory's digests. Imported by tests; tests/conftest.py registers the fixtures below
for tests/, and parity_tests/test_commands.py, which runs the same checkpoints in both
frameworks, imports the ones it uses. The frameworks are imported by the fixtures that
use them: conftest.py imports this module for every test of tests/."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from jax_transformer import TransformerConfig
from jax_transformer.commands import generate, translate
from transformer_core.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ the commands' checkpoints

# The checkpoints' tokenizer is learned on random sentences of these words.
TOKENIZER_WORDS = ("the cat dog sat on mat a house small big red blue green runs jumps over "
                   "under quick brown fox lazy river tree bird sings morning evening").split()
LINES = ["the quick brown fox", "a small red house", "the bird sings", "the quick brown fox",
         "", "green tree over the river"]
PROMPTS = ["the quick brown fox", "a", "", "the bird sings over the river"]


def word_tokenizer(directory: Path) -> Tokenizer:
    """A SentencePiece tokenizer of 60 pieces, learned on 300 random sentences of
    TOKENIZER_WORDS, saved as directory/spm.model."""
    rng = np.random.RandomState(0)
    corpus = [" ".join(rng.choice(TOKENIZER_WORDS, size=rng.randint(3, 10)))
              for _ in range(300)]
    return Tokenizer.train(corpus, directory / "spm.model", vocab_size=60)


def tiny_config(tokenizer, **changes):
    return TransformerConfig(src_vocab_size=tokenizer.vocab_size,
                             tgt_vocab_size=tokenizer.vocab_size, d_model=16, num_heads=2,
                             d_ff=32, num_encoder_layers=1, num_decoder_layers=1, max_len=32,
                             **changes)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def jax_checkpoint(tokenizer, tmp_path_factory):
    from flax import nnx
    from jax_transformer.model import Transformer
    directory = tmp_path_factory.mktemp("jax_ckpt")
    Transformer(tiny_config(tokenizer), rngs=nnx.Rngs(0)).save_pretrained(
        directory, tokenizer=tokenizer.path)
    return directory


@pytest.fixture(scope="module")
def torch_checkpoint(tokenizer, tmp_path_factory):
    import torch
    import torch_reference
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("torch_ckpt")
    torch_reference.Transformer(tiny_config(tokenizer)).save_pretrained(
        directory, tokenizer=tokenizer.path)
    return directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random decoder-only model (output bias: varied tokens) and its tokenizer."""
    import torch
    import torch_reference
    tokenizer = word_tokenizer(tmp_path_factory.mktemp("spm"))
    config = TransformerConfig(architecture="decoder_only", src_vocab_size=tokenizer.vocab_size,
                               tgt_vocab_size=tokenizer.vocab_size, d_model=16, num_heads=2,
                               d_ff=32, num_decoder_layers=2, max_len=32, tie_output=False,
                               output_bias=True)
    torch.manual_seed(0)
    model = torch_reference.DecoderOnlyTransformer(config)
    with torch.no_grad():
        model.output_projection.weight.mul_(8)
        model.output_projection.bias[config.eos_id] = -3.0  # long continuations
    directory = tmp_path_factory.mktemp("lm")
    model.save_pretrained(directory, tokenizer=tokenizer.path)
    return directory


def run_translate(args, capsys):
    """jaxformer-translate ARGS in this process: (exit code, stdout lines, stderr)."""
    return run_command(translate.main, args, capsys)


def run_generate(args, capsys):
    """jaxformer-generate ARGS in this process: (exit code, stdout lines, stderr)."""
    return run_command(generate.main, args, capsys)


def run_command(main, args, capsys):
    """A command's main(ARGS) in this process: (exit code, stdout lines, stderr); the
    parser's exit (bad flags) gives its code, as the process would."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit:
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


# ------------------------------------------------------------------ parallel text

# The data tests' corpora are random sentences of these words.
CORPUS_WORDS = "the a cat dog sat ran on under mat log big small red old new one two".split()


def write_parallel(tmp_path, count: int, seed: int = 0, long_every: int = 0):
    """Two aligned files of `count` random sentences (every `long_every`-th one long)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(count):
        n = 60 if long_every and i % long_every == 0 else int(rng.integers(2, 12))
        lines.append(" ".join(rng.choice(CORPUS_WORDS, n)))
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("".join(line + "\n" for line in lines))
    tgt.write_text("".join(line.upper() + " ." + "\n" for line in lines))
    return src, tgt


def tree_hashes(root) -> dict:
    """Every file and link under `root` (not followed): its contents' or target's digest."""
    hashes = {}
    for directory, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            path = os.path.join(directory, name)
            data = (os.readlink(path).encode() if os.path.islink(path)
                    else open(path, "rb").read())
            hashes[os.path.relpath(path, root)] = hashlib.sha256(data).hexdigest()
    return hashes
