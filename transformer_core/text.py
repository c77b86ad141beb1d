"""Reading user files: lines of text (translate's input, generate's prompts, parity's
sentences) and JSON objects (tokenizer vocabularies, converted models' configs)."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from transformer_core.errors import InputError


class TextError(InputError):
    """A text file or stream cannot be read as lines of UTF-8."""


def split_lines(data: bytes, source: str) -> list[str]:
    """UTF-8 `data` -> its lines, split on b"\\n" only, as the corpus readers do: U+2028,
    a form feed or a lone "\\r" is text inside a sentence. One "\\r" of a "\\r\\n" ending
    and a leading BOM are dropped; a final "\\n" ends the last line, it starts no other.
    `source` names the data in errors."""
    lines = data.removeprefix(codecs.BOM_UTF8).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    texts = []
    for number, line in enumerate(lines, start=1):
        try:
            texts.append(line.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as e:
            raise TextError(f"{source} is not UTF-8 text (line {number}, byte "
                            f"{e.start + 1}: {e.reason})") from e
    return texts


def read_json_object(path: Path, error: type[InputError] = TextError) -> dict[str, Any]:
    """A JSON file holding an object, or `error` naming the file."""
    try:
        values = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} is not valid JSON: {e}") from e
    if not isinstance(values, dict):
        raise error(f"{path} must hold a JSON object, got {type(values).__name__}")
    return values
