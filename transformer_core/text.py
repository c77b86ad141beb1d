"""Reading user files: lines of text (translate's input, generate's prompts, parity's
sentences), telling UTF-8 text from UTF-16 and UTF-32, which the corpus readers use
too, and JSON objects (tokenizer vocabularies, converted models' configs).

A UTF-16 file of ASCII text is valid UTF-8: its NUL bytes are characters like any
other, and b"\\n" is half of a UTF-16 line break. Read as UTF-8 it gives lines of
letters and NULs, one line more than the file has where the NUL after the last
"\\n" starts a line of its own. So a text is refused when it starts with a UTF-16
or UTF-32 byte order mark, when its first bytes have NULs in every other place
(UTF-16 without a byte order mark), and when any line holds a NUL byte: UTF-8
text has none.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from transformer_core.errors import InputError

# UTF-32 LE's byte order mark starts with UTF-16 LE's: it is looked for first.
WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32 LE"), (codecs.BOM_UTF32_BE, "UTF-32 BE"),
             (codecs.BOM_UTF16_LE, "UTF-16 LE"), (codecs.BOM_UTF16_BE, "UTF-16 BE"))
SNIFF_BYTES = 4096  # how much of a text's start `encoding_problem` reads


class TextError(InputError):
    """A text file or stream cannot be read as lines of UTF-8."""


def encoding_problem(head: bytes, source: str) -> str | None:
    """Why a text whose first bytes are `head` (SNIFF_BYTES of them, or all) is not UTF-8
    but UTF-16 or UTF-32, or None when nothing says so. `source` names it."""
    for bom, name in WIDE_BOMS:
        if head.startswith(bom):
            return (f"{source} is {name} text, not UTF-8: it starts with a {name} byte order "
                    f"mark; convert it first, e.g. iconv -f {name.split()[0]} -t UTF-8")
    units = len(head) // 2
    odd, even = head[1:2 * units:2].count(0), head[0:2 * units:2].count(0)  # NULs
    for nuls, others, order in ((odd, even, "LE"), (even, odd, "BE")):
        # ASCII (and Latin) text in UTF-16: every other byte is NUL, the bytes between not
        if units and 4 * nuls >= units and 4 * others < nuls:
            return (f"{source} looks like UTF-16 {order} text without a byte order mark, not "
                    f"UTF-8: every other byte is NUL; convert it first, e.g. iconv -f "
                    f"UTF-16{order} -t UTF-8")
    return None


def nul_problem(line: bytes | str, number: int, source: str) -> str | None:
    """Why line `number` of `source` is no text (it holds a NUL byte), or None. For a
    line as bytes the message names the byte."""
    at = line.find(b"\0" if isinstance(line, bytes) else "\0")
    if at < 0:
        return None
    where = f" (byte {at + 1})" if isinstance(line, bytes) else ""
    return (f"{source} is not UTF-8 text: line {number} holds a NUL byte{where}, which text "
            "never does (UTF-16? UTF-32? a binary file?)")


def split_lines(data: bytes, source: str) -> list[str]:
    """UTF-8 `data` -> its lines, split on b"\\n" only, as the corpus readers do: U+2028,
    a form feed or a lone "\\r" is text inside a sentence. One "\\r" of a "\\r\\n" ending
    and a leading BOM are dropped; a final "\\n" ends the last line, it starts no other.
    UTF-16 or UTF-32 text, and NUL bytes, are refused. `source` names the data in errors."""
    problem = encoding_problem(data[:SNIFF_BYTES], source)
    if problem:
        raise TextError(problem)
    lines = data.removeprefix(codecs.BOM_UTF8).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [decode_line(line, number, source) for number, line in enumerate(lines, start=1)]


def decode_line(line: bytes, number: int, source: str) -> str:
    """Line `number` of `source` (its bytes, without the "\n"; one "\r" of a "\r\n"
    ending dropped) as text, or a TextError naming the line."""
    try:
        text = line.removesuffix(b"\r").decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextError(f"{source} is not UTF-8 text (line {number}, byte "
                        f"{e.start + 1}: {e.reason})") from e
    problem = nul_problem(line, number, source)
    if problem:
        raise TextError(problem)
    return text


def read_json_object(path: Path, error: type[InputError] = TextError) -> dict[str, Any]:
    """A JSON file holding an object, or `error` naming the file."""
    try:
        values = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} is not valid JSON: {e}") from e
    if not isinstance(values, dict):
        raise error(f"{path} must hold a JSON object, got {type(values).__name__}")
    return values
