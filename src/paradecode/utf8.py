"""Text from outside (standard input, prompt and question files, command-line arguments) is UTF-8, or refused.

Bytes that are not UTF-8 are refused with the offset and value of the first bad byte, never replaced: a
replaced character would silently change the tokens the model sees, and the user can convert the file
(``iconv -f latin1 -t utf-8``) and know exactly what was read. A leading byte-order mark is dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

from paradecode.errors import ParadecodeError


def decode(data: bytes, source: str) -> str:
    """``data`` as text; ``source`` names where it came from in the error ("standard input", "FILE")."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ParadecodeError(
            f"{source} is not UTF-8 text: byte {error.start} (0x{data[error.start]:02x}) is not valid UTF-8. "
            "Convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) and try again.") from None
    return text[1:] if text.startswith("\ufeff") else text


def read(path: str | Path, source: str | None = None) -> str:
    """The text of the file ``path``; a missing, unreadable or non-UTF-8 file is a ParadecodeError."""
    source = source or str(path)
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise ParadecodeError(f"{source} is a folder, not a text file.") from None
    except OSError as error:
        raise ParadecodeError(f"cannot read {source}: {error.strerror or error}.") from None
    return decode(data, source)


def check(text: str, source: str, escaped_bytes: bool = False) -> str:
    """``text`` if it is valid Unicode, else a ParadecodeError. ``escaped_bytes``: ``text`` is a command-line
    argument, where bytes that were not UTF-8 arrive as lone surrogates (Python's surrogateescape); they are
    refused like bad bytes, naming the first one."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    if escaped_bytes:
        try:
            return decode(os.fsencode(text), source)  # the bytes as given
        except UnicodeEncodeError:
            pass
    raise ParadecodeError(f"{source} is not valid Unicode text: it holds a lone surrogate.")


def json_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text: split at "\n" only (and a "\r" before it dropped). ``str.splitlines``
    also splits at U+2028, U+0085 and other separators, which a JSON string may hold unescaped (json.dumps
    with ensure_ascii=False writes them as they are): that would cut a line in two."""
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    return lines[:-1] if lines and not lines[-1] else lines  # no line after the final newline
