"""The tokenizers of Hugging Face FSMT, M2M100 and NLLB directories, converted with the
weights.

M2M100 (transformers' M2M100Tokenizer): `sentencepiece.bpe.model` splits text,
`vocab.json` maps each piece to its id, and the language codes of the family
named by tokenizer_config.json's `language_codes` ("m2m100": 100 codes,
"wmt21": 8) follow the vocabulary: code i is `len(vocab) + i`, its token `__fr__`.
NLLB (NllbTokenizer, a `tokenizers` BPE in transformers 5): `tokenizer.json`
holds the piece ids and the codes ("fra_Latn") as added tokens; the same
`sentencepiece.bpe.model` is kept, tokenizer.json copied and used (transformer_core.fairseq_tokenizer). Both put the source code first
(NLLB's `legacy_behaviour`: after </s>). The result is read by
transformer_core.fairseq_tokenizer.FairseqTokenizer: the SentencePiece model
copied, and fairseq_tokenizer.json (pieces, codes, specials) written.

FSMT (transformers' FSMTTokenizer: Moses and BPE): vocab-src.json, vocab-tgt.json and
merges.txt are copied as they are, and tokenizer_config.json's `langs` and
`do_lower_case` written to fsmt_tokenizer.json; read by
transformer_core.fsmt_tokenizer.FSMTTokenizer.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from jax_transformer.port.reading import PortError, read_json_object
from transformer_core import checkpoint_dir
from transformer_core.fairseq_tokenizer import FAST_FILE, SPM_FILE, VOCAB_FILE
from transformer_core.fsmt_tokenizer import (MERGES_FILE, SETTINGS_FILE, SRC_VOCAB_FILE,
                                             TGT_VOCAB_FILE)

# transformers' M2M100Tokenizer FAIRSEQ_LANGUAGE_CODES, in their order (their ids' order).
M2M100_CODES = {
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr "
               "fy ga gd gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg "
               "ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk "
               "sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # eng_Latn, fra_Latn, zho_Hans
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def m2m100_tokenizer(src_dir: Path) -> dict | None:
    """The fairseq_tokenizer.json contents for an M2M100 or NLLB directory, None when it
    has no tokenizer files, a PortError when they cannot be read as transformers does."""
    if not (src_dir / SPM_FILE).is_file():
        return None
    settings = (read_json_object(src_dir / "tokenizer_config.json")
                if (src_dir / "tokenizer_config.json").is_file() else {})
    if (src_dir / "tokenizer.json").is_file() and not (src_dir / "vocab.json").is_file():
        return _nllb(src_dir, settings)
    if not (src_dir / "vocab.json").is_file():
        raise PortError(f"{src_dir} has {SPM_FILE} but neither vocab.json (M2M100) nor "
                        "tokenizer.json (NLLB)")
    pieces = read_json_object(src_dir / "vocab.json")
    family = settings.get("language_codes", "m2m100")
    if family not in M2M100_CODES:
        raise PortError(f"{src_dir}/tokenizer_config.json: unknown language_codes {family!r} "
                        f"(known: {', '.join(M2M100_CODES)})")
    languages = {code: len(pieces) + i for i, code in enumerate(M2M100_CODES[family])}
    return _description("m2m100", pieces, languages, "prefix", src_dir)


def _nllb(src_dir: Path, settings: dict) -> dict:
    try:
        spec = json.loads((src_dir / "tokenizer.json").read_text())
        pieces = dict(spec["model"]["vocab"])
        added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
        special = [t["id"] for t in spec.get("added_tokens", []) if t.get("special")]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise PortError(f"{src_dir}/tokenizer.json is not a tokenizers BPE model: {e}") from None
    pieces.update({p: i for p, i in added.items() if p in SPECIALS})
    languages = {p: i for p, i in added.items() if NLLB_CODE.match(p)}
    source_code = "suffix" if settings.get("legacy_behaviour") else "prefix"
    description = _description("nllb", pieces, languages, source_code, src_dir)
    description["other_special_ids"] = sorted(set(special) - set(languages.values()))
    return description


def _description(family, pieces, languages, source_code, src_dir) -> dict:
    missing = [p for p in SPECIALS if p not in pieces]
    if missing:
        raise PortError(f"{src_dir}: the tokenizer's vocabulary has no {' '.join(missing)}")
    if not languages:
        raise PortError(f"{src_dir}: the tokenizer has no language codes")
    return dict(family=family, source_code=source_code, languages=languages,
                specials={p: pieces[p] for p in SPECIALS}, pieces=pieces)


def write_tokenizer(src_dir: Path, out_dir: Path, copied, json_name: str,
                    contents: dict) -> None:
    """Copy the `copied` files of `src_dir` into `out_dir` and write `contents` as
    `json_name` beside them, each file whole or not at all."""
    for name in copied:
        checkpoint_dir.write_atomically(out_dir / name, lambda p, name=name: shutil.copyfile(
            checkpoint_dir.file_to_copy(src_dir, name), p))
    text = json.dumps(contents, ensure_ascii=False)
    checkpoint_dir.write_atomically(out_dir / json_name,
                                    lambda p: p.write_text(text, encoding="utf-8"))


def write_m2m100_tokenizer(src_dir: Path, out_dir: Path, description: dict) -> None:
    copied = [SPM_FILE] + ([FAST_FILE] if description["family"] == "nllb" else [])
    write_tokenizer(src_dir, out_dir, copied, VOCAB_FILE, description)


FSMT_COPIED_FILES = (SRC_VOCAB_FILE, TGT_VOCAB_FILE, MERGES_FILE)


def fsmt_tokenizer(src_dir: Path) -> dict | None:
    """The fsmt_tokenizer.json contents for an FSMT directory, None when it has none of
    the tokenizer files, a PortError when it has only some or no language pair."""
    present = [name for name in FSMT_COPIED_FILES if (src_dir / name).is_file()]
    if not present:
        return None
    missing = [name for name in FSMT_COPIED_FILES if name not in present]
    if missing:
        raise PortError(f"{src_dir} has {' and '.join(present)} but no {' or '.join(missing)}: "
                        f"an FSMT tokenizer needs {', '.join(FSMT_COPIED_FILES)}")
    path = src_dir / "tokenizer_config.json"
    settings = read_json_object(path) if path.is_file() else {}
    langs, lower = settings.get("langs"), settings.get("do_lower_case", False)
    if not (isinstance(langs, list) and len(langs) == 2 and all(isinstance(x, str) for x in langs)):
        raise PortError(f"{path}: langs must be the [source, target] language codes "
                        f"FSMTTokenizer takes, got {langs!r}")
    if not isinstance(lower, bool):
        raise PortError(f"{path}: do_lower_case must be true or false, got {lower!r}")
    return {"langs": langs, "do_lower_case": lower}


def write_fsmt_tokenizer(src_dir: Path, out_dir: Path, settings: dict) -> None:
    write_tokenizer(src_dir, out_dir, FSMT_COPIED_FILES, SETTINGS_FILE, settings)
