"""FSMT's tokenizer (fairseq's WMT19 models), read from the files a converted checkpoint
directory holds; the ids and text of transformers' FSMTTokenizer.

    vocab-src.json       source token -> id (fairseq's dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3)
    vocab-tgt.json       target token -> id
    merges.txt           the BPE merges, "a b" a line, best first, shared by both sides
    fsmt_tokenizer.json  {"langs": [source, target], "do_lower_case": bool}

`jaxformer-port --from hf-fsmt` copies the first three and writes the last from
tokenizer_config.json (jax_transformer/port/fairseq_tokens.py).

Encoding, as FSMTTokenizer does it: the special tokens' texts ("</s>", "<unk>" ...) are
cut out as themselves; the rest is lower-cased (do_lower_case), Moses-preprocessed
(replace-unicode-punctuation, sacremoses' MosesPunctNormalizer, every C* character
removed), Moses-tokenised (aggressive dash splits, XML-escaped) and each word split by
BPE, whose last symbol carries "</w>". Source ids are pieces + [</s>]; decoding starts
from the model's decoder_start_token_id (</s>, the config's bos_id). Decoding joins the
target pieces ("</w>" ends a word) and Moses-detokenises them in the target language.

The Moses normaliser is part of encoding here, as in transformers (FSMT was trained
on text so normalised), so `normalizes` is False: callers have no step left to apply.

Target text is encoded with vocab-tgt.json and the target language's Moses rules,
as fairseq's target dictionary holds it. transformers' FSMTTokenizer has no target mode:
its `text_target` ids come from vocab-src.json, which are not the decoder's ids when
the vocabularies differ.

BPE is a small exact implementation of the algorithm transformers' FSMTTokenizer.bpe
runs (merge the best-ranked pair everywhere, left to right, until none is ranked), not
the `tokenizers` library: its BPE model refuses a merge whose parts or result are not
in its vocabulary, and FSMT's merges are one list beside two vocabularies that need
hold neither. Needs sacremoses, neither JAX nor torch.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from transformer_core.config import TransformerConfig
from transformer_core.text import read_json_object
from transformer_core.tokenizer import TokenizerError, pieces_before_eos

SRC_VOCAB_FILE, TGT_VOCAB_FILE, MERGES_FILE = "vocab-src.json", "vocab-tgt.json", "merges.txt"
SETTINGS_FILE = "fsmt_tokenizer.json"
FSMT_TOKENIZER_FILES = (SRC_VOCAB_FILE, TGT_VOCAB_FILE, MERGES_FILE, SETTINGS_FILE)
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
SPECIAL_TEXTS = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")  # split, kept
END_OF_WORD = "</w>"

# Moses' replace-unicode-punctuation.perl, as transformers' replace_unicode_punct (each
# output is ASCII, no other's input, so the order does not matter).
UNICODE_PUNCTUATION = (("，", ","), ("、", ","), ("”", '"'), ("“", '"'), ("∶", ":"), ("：", ":"),
                       ("？", "?"), ("《", '"'), ("》", '"'), ("）", ")"), ("！", "!"), ("（", "("),
                       ("；", ";"), ("」", '"'), ("「", '"'), ("～", "~"), ("’", "'"),
                       ("…", "..."), ("━", "-"), ("〈", "<"), ("〉", ">"), ("【", "["),
                       ("】", "]"), ("％", "%"), *((chr(0xFF10 + d), str(d)) for d in range(10)))
FULL_STOPS = re.compile(r"[。．]\s*")


def replace_unicode_punctuation(text: str) -> str:
    """CJK and full-width punctuation and digits -> ASCII, curly quotes -> straight."""
    text = FULL_STOPS.sub(". ", text)
    for unicode, ascii_ in UNICODE_PUNCTUATION:
        text = text.replace(unicode, ascii_)
    return text


def remove_non_printing(text: str) -> str:
    """Drop every character of Unicode category C* (controls, tabs, format characters)."""
    return "".join(c for c in text if not unicodedata.category(c).startswith("C"))


class FSMTTokenizer:
    """The ids of transformers' FSMTTokenizer (CheckpointTokenizer): Moses, BPE, two
    vocabularies."""

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        self.directory = directory
        missing = [name for name in FSMT_TOKENIZER_FILES if not (directory / name).is_file()]
        if missing:
            raise TokenizerError(f"{directory} has no FSMT tokenizer ({' + '.join(missing)} "
                                 "missing)")
        settings = read_json_object(directory / SETTINGS_FILE, TokenizerError)
        langs, self.do_lower_case = settings.get("langs"), settings.get("do_lower_case", False)
        if not (isinstance(langs, list) and len(langs) == 2
                and all(isinstance(lang, str) for lang in langs)):
            raise TokenizerError(f"{directory / SETTINGS_FILE}: langs must be two language "
                                 f"codes, [source, target], got {langs!r}")
        if not isinstance(self.do_lower_case, bool):
            raise TokenizerError(f"{directory / SETTINGS_FILE}: do_lower_case must be true or "
                                 f"false, got {self.do_lower_case!r}")
        self.langs = {"source": langs[0], "target": langs[1]}
        self.vocab = {side: self._read_vocab(directory / name)
                      for side, name in (("source", SRC_VOCAB_FILE), ("target", TGT_VOCAB_FILE))}
        self.pieces = {i: p for p, i in self.vocab["target"].items()}
        self.special_ids = {self.vocab["source"][p] for p in SPECIALS}  # as transformers'
        self.pad_id, self.eos_id = self.vocab["source"]["<pad>"], self.vocab["source"]["</s>"]
        try:  # read as transformers does: a last line without "\n" is not a merge
            lines = (directory / MERGES_FILE).read_text(encoding="utf-8").split("\n")[:-1]
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerError(f"cannot read {directory / MERGES_FILE}: {e}") from None
        merges = [tuple(line.split()[:2]) for line in lines]
        self.merge_ranks = dict(zip(merges, range(len(merges))))
        self.bpe_cache: dict[str, tuple[str, ...]] = {}
        import sacremoses
        self.punct_normalizers = {side: sacremoses.MosesPunctNormalizer(lang=lang)
                                  for side, lang in self.langs.items()}
        self.moses_tokenizers = {side: sacremoses.MosesTokenizer(lang=lang)
                                 for side, lang in self.langs.items()}
        self.moses_detokenizer = sacremoses.MosesDetokenizer(lang=self.langs["target"])

    @staticmethod
    def _read_vocab(path: Path) -> dict[str, int]:
        vocab = read_json_object(path, TokenizerError)
        if not all(isinstance(i, int) for i in vocab.values()):
            raise TokenizerError(f"{path}: every token's id must be an integer")
        missing = [p for p in SPECIALS if p not in vocab]
        if missing:
            raise TokenizerError(f"{path} has no {' '.join(missing)}")
        return vocab

    @staticmethod
    def is_present(directory: str | Path) -> bool:
        return (Path(directory) / SRC_VOCAB_FILE).is_file() and \
            (Path(directory) / SETTINGS_FILE).is_file()

    def bpe(self, word: str) -> tuple[str, ...]:
        """A Moses token -> its BPE symbols, the last ending in "</w>"."""
        if word not in self.bpe_cache:
            self.bpe_cache[word] = self._merge(word)
        return self.bpe_cache[word]

    def _merge(self, word: str) -> tuple[str, ...]:
        symbols = (*word[:-1], word[-1] + END_OF_WORD)
        while len(symbols) > 1:
            pairs = set(zip(symbols, symbols[1:]))
            best = min(pairs, key=lambda pair: self.merge_ranks.get(pair, float("inf")))
            if best not in self.merge_ranks:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i < len(symbols) - 1 and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = tuple(merged)
        return symbols

    def encode(self, text: str, side: str = "source") -> list[int]:
        """Text -> ids of `side`'s vocabulary, without </s> (unknown pieces: <unk>)."""
        vocab = self.vocab[side]
        ids = []
        for chunk in SPECIAL_TEXTS.split(text):
            if chunk in SPECIALS:
                ids.append(vocab[chunk])
                continue
            if self.do_lower_case:
                chunk = chunk.lower()
            chunk = remove_non_printing(self.punct_normalizers[side].normalize(
                replace_unicode_punctuation(chunk)))
            for word in self.moses_tokenizers[side].tokenize(
                    chunk, aggressive_dash_splits=True, return_str=False, escape=True):
                ids.extend(vocab.get(piece, vocab["<unk>"]) for piece in self.bpe(word))
        return ids

    def encode_source(self, text: str) -> list[int]:
        return self.encode(text) + [self.eos_id]

    def encode_target(self, text: str) -> list[int]:
        """Target-side ids without </s>: vocab-tgt.json's, with the target language's
        Moses rules (see the module doc)."""
        return self.encode(text, "target")

    normalizes = False  # encoding applies the Moses normaliser itself (module doc)

    def normalize(self, text: str) -> str:
        return text

    def decode(self, ids) -> str:
        """Target ids -> text up to the first </s>, special tokens dropped, as transformers'
        decode(skip_special_tokens=True)."""
        pieces = pieces_before_eos(ids, self.eos_id, self.special_ids, self.pieces)
        words = "".join(p.replace(" ", "").replace(END_OF_WORD, " ") for p in pieces).split()
        return self.moses_detokenizer.detokenize(words)

    def check_fits(self, config: TransformerConfig) -> None:
        for side, size in (("source", config.src_vocab_size), ("target", config.tgt_vocab_size)):
            largest = max(self.vocab[side].values())
            if largest >= size:
                raise TokenizerError(f"the {side} vocabulary has id {largest}, the model's is "
                                     f"{size} tokens")
        for side in ("source", "target"):
            pad, eos = self.vocab[side]["<pad>"], self.vocab[side]["</s>"]
            if (pad, eos) != (config.pad_id, config.eos_id):
                raise TokenizerError(f"the {side} vocabulary has <pad>={pad}, </s>={eos}; the "
                                     f"model config has pad_id={config.pad_id}, "
                                     f"eos_id={config.eos_id}")
