"""The bounded reader of TOML that dippm-nas did not write itself (deployment files, user device files).

TOML is read as JSON is (:mod:`dippm_nas._json`): only a regular file of at most a stated number of bytes
(:func:`dippm_nas._files.read_limited`: a FIFO or ``/dev/zero`` is refused, never waited on or read
forever), and a document whose arrays and inline tables nest deeper than
:data:`~dippm_nas._json.MAX_JSON_DEPTH` is refused before it is parsed (``tomllib`` recurses once per level
and meets a ``RecursionError`` near 1,000).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from dippm_nas._files import RefusedFile, read_limited
from dippm_nas._json import MAX_JSON_DEPTH, json_depth
from dippm_nas.errors import DippmNasError, InvalidValueError

__all__ = ["loads_toml", "read_toml_file"]

#: What may hold a bracket that does not nest: multi-line and single-line strings (basic and literal), and
#: comments. One alternation scanned left to right, so a quote inside a comment or a ``#`` inside a string
#: is read as what it is; an unclosed string runs to the end of its line (of the text, multi-line), so an
#: alternative that starts always matches and the scan stays linear.
_NOT_NESTING = re.compile(r"'''.*?(?:'''|\Z)|\"\"\"(?:[^\\]|\\.)*?(?:\"\"\"|\Z)|\"[^\"\\\n]*(?:\\.[^\"\\\n]*)*\"?"
                          r"|'[^'\n]*'?|#[^\n]*", re.DOTALL)


def toml_depth(text: str) -> int:
    """The deepest nesting of arrays and inline tables in a TOML text (strings and comments left out; a table
    header ``[a]`` or ``[[a]]`` counts 1 or 2). Malformed text gives a figure too (the parser rejects it after)."""
    return json_depth(_NOT_NESTING.sub("", text).replace('"', "").encode("utf-8", "surrogatepass"))


def loads_toml(text: str, what: str, error: type[DippmNasError] = InvalidValueError, *,
               max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The TOML document ``text``, nested at most ``max_depth`` levels.

    Raises:
        DippmNasError: (``error``) ``<what>: <cause>``: not TOML, or nested deeper than ``max_depth``.
    """
    depth = toml_depth(text)
    if depth > max_depth:
        raise error(f"{what}: it nests arrays/inline tables {depth} levels deep; at most {max_depth} are read (no "
                    "file dippm-nas writes comes close: the document is damaged or hostile)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what}: not valid TOML ({e})") from e
    except RecursionError as e:  # a nesting the count above missed: refused all the same
        raise error(f"{what}: it nests too deeply to be read") from e


def read_toml_file(path: str | Path, what: str, error: type[DippmNasError] = InvalidValueError, *,
                   max_bytes: int) -> dict[str, Any]:
    """The TOML document in the regular file ``path`` (UTF-8, at most ``max_bytes``), read as
    :func:`loads_toml` reads text.

    Raises:
        DippmNasError: (``error``) ``<what>: <cause>``: the file cannot be read, is not a regular file, is
            larger than ``max_bytes``, is not UTF-8 or not TOML, or nests deeper than
            :data:`~dippm_nas._json.MAX_JSON_DEPTH`.
    """
    try:
        raw = read_limited(path, max_bytes)
    except RefusedFile as e:
        raise error(f"{what}: it {e.reason}") from e.__cause__
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what}: not UTF-8 text ({e})") from e
    return loads_toml(text, what, error)
