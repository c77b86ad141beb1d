"""Marian's tokenizer, read from the files a converted checkpoint directory holds."""

from __future__ import annotations

from pathlib import Path

from jax_transformer.port.reading import PortError, read_json_object
from transformer_core.config import TransformerConfig


class MarianTokenizer:
    """Marian's tokenizer, as copied into a converted checkpoint directory.

    Text is split into pieces by source.spm (target.spm for target text), and each
    piece is looked up in vocab.json (target_vocab.json for the target side when
    the model has separate vocabularies); unknown pieces become <unk>. Source ids
    end with </s>. This matches transformers' MarianTokenizer without its
    optional Moses punctuation normaliser and language-code handling.
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
            raise PortError(f"{directory} has no Marian tokenizer (source.spm + vocab.json)")
        self.spm.setdefault("target", self.spm["source"])
        self.vocab = {"source": read_json_object(directory / "vocab.json")}
        target_vocab = directory / "target_vocab.json"
        self.vocab["target"] = (read_json_object(target_vocab) if target_vocab.is_file()
                                else self.vocab["source"])
        for vocab in self.vocab.values():
            for piece in ("</s>", "<unk>", "<pad>"):
                if piece not in vocab:
                    raise PortError(f"{directory}: vocab has no {piece!r}")
        self.eos_id, self.unk_id = self.vocab["source"]["</s>"], self.vocab["source"]["<unk>"]
        self.pad_id = self.vocab["source"]["<pad>"]
        self.pieces = {side: {i: p for p, i in v.items()} for side, v in self.vocab.items()}

    @staticmethod
    def is_present(directory: str | Path) -> bool:
        return (Path(directory) / "source.spm").is_file() and (Path(directory) / "vocab.json").is_file()

    def encode(self, text: str, side: str = "source") -> list[int]:
        """Text -> model ids + [</s>]."""
        vocab = self.vocab[side]
        unk = vocab["<unk>"]
        return [vocab.get(p, unk) for p in self.spm[side].encode(text, out_type=str)] + [vocab["</s>"]]

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
                raise PortError(f"{side} vocab has id {largest}, model vocabulary is {size}")
        if (self.pad_id, self.eos_id) != (config.pad_id, config.eos_id):
            raise PortError(f"vocab.json has <pad>={self.pad_id}, </s>={self.eos_id}; the model "
                            f"config has pad_id={config.pad_id}, eos_id={config.eos_id}")
