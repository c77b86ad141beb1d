"""Marian's tokenizer, read from the files a converted checkpoint directory holds.

Needs sentencepiece (and sacremoses for `normalize`), neither JAX nor torch.
"""

from __future__ import annotations

import functools
from pathlib import Path

from transformer_core.config import TransformerConfig
from transformer_core import text
from transformer_core.tokenizer import TokenizerError

# The files of a Marian (opus-mt) tokenizer in a Hugging Face directory.
MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json",
                          "tokenizer_config.json", "special_tokens_map.json")


def split_language_code(text: str) -> tuple[str | None, str]:
    """(">>fra<<", " rest") for a text that starts with a target-language code, else
    (None, text); as transformers' MarianTokenizer.remove_language_code: a text
    starting with ">>" has a code up to its first "<<"."""
    end = text.find("<<")
    if text.startswith(">>") and end != -1:
        return text[: end + 2], text[end + 2:]
    return None, text


class MarianTokenizer:
    """Marian's tokenizer, as copied into a converted checkpoint directory; the ids of
    transformers' MarianTokenizer.

    Text is split into pieces by source.spm (target.spm for target text), and each
    piece is looked up in vocab.json (target_vocab.json for the target side when
    the model has separate vocabularies); unknown pieces become <unk>. A leading
    target-language code of a multilingual model (">>fra<< text") is one piece,
    looked up in the vocab without SentencePiece; a code the vocab lacks becomes
    <unk>, as in transformers. Ids end with </s>. `normalize` is the Moses
    punctuation normaliser of OPUS-MT's pre-processing; like transformers, `encode`
    does not apply it.
    """

    def __init__(self, directory: str | Path):
        import sentencepiece as spm
        directory = Path(directory)
        self.directory = directory
        self.spm = {}
        for side, name in (("source", "source.spm"), ("target", "target.spm")):
            if (directory / name).is_file():
                self.spm[side] = spm.SentencePieceProcessor(model_file=str(directory / name))
        if "source" not in self.spm or not (directory / "vocab.json").is_file():
            raise TokenizerError(f"{directory} has no Marian tokenizer (source.spm + vocab.json)")
        self.spm.setdefault("target", self.spm["source"])
        self.vocab = {"source": text.read_json_object(directory / "vocab.json", TokenizerError)}
        target_vocab = directory / "target_vocab.json"
        self.vocab["target"] = (text.read_json_object(target_vocab, TokenizerError)
                                if target_vocab.is_file()
                                else self.vocab["source"])
        for vocab in self.vocab.values():
            for piece in ("</s>", "<unk>", "<pad>"):
                if piece not in vocab:
                    raise TokenizerError(f"{directory}: vocab has no {piece!r}")
        self.eos_id, self.unk_id = self.vocab["source"]["</s>"], self.vocab["source"]["<unk>"]
        self.pad_id = self.vocab["source"]["<pad>"]
        self.pieces = {side: {i: p for p, i in v.items()} for side, v in self.vocab.items()}
        # The target languages a source text may start with (transformers lists none
        # when the vocabularies are separate, yet looks codes up all the same).
        self.supported_language_codes = [piece for piece in self.vocab["source"]
                                          if piece.startswith(">>") and piece.endswith("<<")]
        config = directory / "tokenizer_config.json"
        self.source_lang = (text.read_json_object(config, TokenizerError).get("source_lang")
                            if config.is_file()
                            else None)  # as transformers' from_pretrained reads it
        if not isinstance(self.source_lang, (str, type(None))):
            raise TokenizerError(f"{config}: source_lang must be a language code or null, got "
                            f"{self.source_lang!r}")

    @staticmethod
    def is_present(directory: str | Path) -> bool:
        return (Path(directory) / "source.spm").is_file() and (Path(directory) / "vocab.json").is_file()

    def encode_source(self, text: str) -> list[int]:
        """Source ids, ending in </s>; refuses a leading language code the vocabulary lacks
        (transformers would make it <unk>, and the model translate into no language
        asked for)."""
        code, _ = split_language_code(text)
        if code is not None and code not in self.vocab["source"]:
            codes = self.supported_language_codes
            known = (f"its codes are {' '.join(codes[:20])}{' ...' if len(codes) > 20 else ''}"
                     if codes else "it takes no language codes")
            raise TokenizerError(f"starts with the language code {code}, which "
                                 f"{self.directory / 'vocab.json'} does not have; {known}")
        return self.encode(text)

    def encode_target(self, text: str) -> list[int]:
        """Target-side ids without </s>."""
        return self.encode(text, "target")[:-1]

    def encode(self, text: str, side: str = "source") -> list[int]:
        """Text -> model ids + [</s>]; a leading language code is one id."""
        vocab = self.vocab[side]
        code, text = split_language_code(text)
        pieces = ([code] if code else []) + self.spm[side].encode(text, out_type=str)
        return [vocab.get(p, vocab["<unk>"]) for p in pieces] + [vocab["</s>"]]

    normalizes = True

    def normalize(self, text: str) -> str:
        """Moses punctuation normalisation (sacremoses) for tokenizer_config.json's
        source_lang, as transformers' MarianTokenizer.normalize: quotes, dashes,
        spacing. OPUS-MT models were trained on text normalised so."""
        return self._punct_normalizer.normalize(text) if text else ""  # sacremoses: "" -> []

    @functools.cached_property
    def _punct_normalizer(self):
        from sacremoses import MosesPunctNormalizer
        return MosesPunctNormalizer(self.source_lang)

    def decode(self, ids, side: str = "target") -> str:
        pieces = []
        for i in ids:
            piece = self.pieces[side].get(int(i), "<unk>")
            if piece == "</s>":
                break
            if piece != "<pad>":
                pieces.append(piece)
        return self.spm[side].decode_pieces(pieces)

    def check_fits(self, config: TransformerConfig) -> None:
        for side, size in (("source", config.src_vocab_size), ("target", config.tgt_vocab_size)):
            largest = max(self.vocab[side].values())
            if largest >= size:
                raise TokenizerError(f"{side} vocab has id {largest}, model vocabulary is {size}")
        if (self.pad_id, self.eos_id) != (config.pad_id, config.eos_id):
            raise TokenizerError(f"vocab.json has <pad>={self.pad_id}, </s>={self.eos_id}; the model "
                            f"config has pad_id={config.pad_id}, eos_id={config.eos_id}")
