"""M2M100's and NLLB's tokenizer (fairseq's multilingual models), read from the files a
converted checkpoint directory holds: SentencePiece plus a vocabulary with language codes.

    sentencepiece.bpe.model     the SentencePiece model (splits text into pieces)
    fairseq_tokenizer.json      {"family": "m2m100" | "nllb", "pieces": {piece: id},
                                 "languages": {code: id}, "source_code": "prefix" | "suffix",
                                 "specials": {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}}

    tokenizer.json              NLLB only: transformers 5's tokenizer (a `tokenizers` BPE)

`jaxformer-port --from hf-m2m100` writes them (jax_transformer/port/fairseq_tokens.py).
NLLB's text is split by tokenizer.json with the `tokenizers` library, as transformers 5
does (its normaliser keeps a trailing space as a piece, where SentencePiece drops it);
M2M100's by SentencePiece, as transformers' M2M100Tokenizer.
Source ids are [source code] + pieces + [</s>] (NLLB's legacy_behaviour: pieces + [</s>,
source code]); translation starts from </s> and forces the target code as the first
generated token (decoding's `forced_first`), as transformers' `forced_bos_token_id`.
Codes are named as transformers names them: "fr" for M2M100, "fra_Latn" for NLLB.
Needs sentencepiece only, neither JAX nor torch.
"""

from __future__ import annotations

from pathlib import Path

from transformer_core.config import TransformerConfig
from transformer_core.text import read_json_object
from transformer_core.tokenizer import TokenizerError, pieces_before_eos

SPM_FILE, VOCAB_FILE = "sentencepiece.bpe.model", "fairseq_tokenizer.json"
FAST_FILE = "tokenizer.json"
FAIRSEQ_TOKENIZER_FILES = (SPM_FILE, VOCAB_FILE, FAST_FILE)  # what a converted directory holds


class FairseqTokenizer:
    """The ids of transformers' M2M100Tokenizer / NllbTokenizer (CheckpointTokenizer).

    `src_lang` and `tgt_lang` (codes) must be set before encoding a source
    (set_languages); `forced_first_id` is the target code's id, for the searches."""

    def __init__(self, directory: str | Path, src_lang: str | None = None,
                 tgt_lang: str | None = None):
        import sentencepiece as spm
        directory = Path(directory)
        self.directory = directory
        if not self.is_present(directory):
            raise TokenizerError(f"{directory} has no M2M100/NLLB tokenizer ({SPM_FILE} + "
                                 f"{VOCAB_FILE})")
        self.sp = spm.SentencePieceProcessor(model_file=str(directory / SPM_FILE))
        values = read_json_object(directory / VOCAB_FILE, TokenizerError)
        try:
            self.family = values["family"]
            self.vocab = dict(values["pieces"])
            self.languages = dict(values["languages"])
            self.source_code = values.get("source_code", "prefix")
            specials = values["specials"]
            self.bos_id, self.pad_id = specials["<s>"], specials["<pad>"]
            self.eos_id, self.unk_id = specials["</s>"], specials["<unk>"]
        except (KeyError, TypeError) as e:
            raise TokenizerError(f"{directory / VOCAB_FILE} lacks {e}") from None
        self.pieces = {i: p for p, i in self.vocab.items()}
        self.special_ids = {self.bos_id, self.pad_id, self.eos_id, self.unk_id,
                            *self.languages.values(), *values.get("other_special_ids", [])}
        self.fast = None  # NLLB: transformers 5's tokenizers model
        if (directory / FAST_FILE).is_file():
            from tokenizers import Tokenizer as FastTokenizer
            self.fast = FastTokenizer.from_file(str(directory / FAST_FILE))
        self.src_lang = self.tgt_lang = None
        self.set_languages(src_lang, tgt_lang)

    @staticmethod
    def is_present(directory: str | Path) -> bool:
        return (Path(directory) / SPM_FILE).is_file() and (Path(directory) / VOCAB_FILE).is_file()

    @property
    def supported_language_codes(self) -> list[str]:
        return list(self.languages)

    def language_id(self, code: str, flag: str = "language") -> int:
        """The id of a language code, or a TokenizerError listing the known ones."""
        if code not in self.languages:
            raise TokenizerError(f"unknown {flag} code {code!r} for this {self.family} model; "
                                 f"known codes: {' '.join(self.languages)}")
        return self.languages[code]

    def set_languages(self, src_lang: str | None, tgt_lang: str | None) -> None:
        """Check and set the source and target language codes (None leaves one unset)."""
        if src_lang is not None:
            self.language_id(src_lang, "--src-lang")
        if tgt_lang is not None:
            self.language_id(tgt_lang, "--tgt-lang")
        self.src_lang, self.tgt_lang = src_lang, tgt_lang

    @property
    def forced_first_id(self) -> int | None:
        """The target code's id: the first generated token (forced_bos_token_id)."""
        return None if self.tgt_lang is None else self.languages[self.tgt_lang]

    def encode(self, text: str) -> list[int]:
        """Text -> piece ids, without special tokens (unknown pieces: <unk>)."""
        if self.fast is not None:
            return self.fast.encode(text, add_special_tokens=False).ids
        return [self.vocab.get(p, self.unk_id) for p in self.sp.encode(text, out_type=str)]

    def _with_code(self, ids: list[int], code: str | None, side: str) -> list[int]:
        if code is None:
            raise TokenizerError(f"this {self.family} model needs a {side} language code "
                                 f"(--{side[:3]}-lang); known codes: {' '.join(self.languages)}")
        lang = self.languages[code]
        if self.source_code == "suffix":  # NLLB's legacy_behaviour
            return ids + [self.eos_id, lang]
        return [lang] + ids + [self.eos_id]

    def encode_source(self, text: str) -> list[int]:
        return self._with_code(self.encode(text), self.src_lang, "source")

    def encode_target(self, text: str) -> list[int]:
        """Target-side ids without </s>: the target code, then the pieces (as transformers'
        `text_target` labels; teacher forcing adds the start token and </s>)."""
        return self._with_code(self.encode(text), self.tgt_lang, "target")[:-1]

    normalizes = False  # transformers' M2M100/NLLB tokenizers normalise nothing beyond spm

    def normalize(self, text: str) -> str:
        return text

    def decode(self, ids) -> str:
        """Ids -> text up to the first </s>, special tokens and codes dropped, as
        transformers' decode(skip_special_tokens=True)."""
        pieces = pieces_before_eos(ids, self.eos_id, self.special_ids, self.pieces)
        if self.fast is not None:
            return self.fast.decode([self.vocab[p] for p in pieces], skip_special_tokens=True)
        return self.sp.decode_pieces(pieces).strip()

    def check_fits(self, config: TransformerConfig) -> None:
        largest = max(max(self.vocab.values()), max(self.languages.values(), default=0))
        if largest >= min(config.src_vocab_size, config.tgt_vocab_size):
            raise TokenizerError(f"{VOCAB_FILE} has id {largest}, the model's vocabulary is "
                                 f"{config.src_vocab_size}/{config.tgt_vocab_size}")
        if (self.pad_id, self.eos_id) != (config.pad_id, config.eos_id):
            raise TokenizerError(f"{VOCAB_FILE} has <pad>={self.pad_id}, </s>={self.eos_id}; the "
                                 f"model config has pad_id={config.pad_id}, "
                                 f"eos_id={config.eos_id}")
