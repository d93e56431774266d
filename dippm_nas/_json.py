"""Canonical JSON (the one text of a JSON value that hashes, keys and identities are computed from) and
the one bounded reader of JSON that dippm-nas did not just write itself (files, database columns, cache rows).

Every JSON document read from outside the process goes through :func:`loads_json` (text) or
:func:`read_json_file` (a file): a document nested deeper than :data:`MAX_JSON_DEPTH` is refused with a
clear error before it is parsed, so no reader (``json``, ``copy``, pydantic, the code that walks the value)
meets a ``RecursionError``; a file larger than its cap is refused without being read whole, and only
regular files are read (a FIFO or a device would block or never end).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from dippm_nas._files import RefusedFile, read_limited
from dippm_nas.errors import DippmNasError, InvalidValueError

__all__ = ["canonical_json", "loads_json", "read_json_file", "read_regular_file", "json_depth", "check_keys",
           "MAX_JSON_DEPTH", "MAX_JSON_FILE_BYTES"]

#: The deepest nesting of arrays and objects a JSON document read by dippm-nas may have. The deepest
#: documents dippm-nas writes nest 6 levels (a checkpoint's metadata: ``heldout_metrics`` -> report ->
#: split -> rows -> target -> metric; ``tests/test_reliability_files.py`` measures every shipped file); 64 leaves
#: room for hand-written files and stays far below Python's recursion limit (1000), against which ``json``,
#: ``copy``, pydantic and the code walking the value recurse.
MAX_JSON_DEPTH = 64
#: The largest JSON file :func:`read_json_file` reads, bytes: 64 MiB. The largest JSON file dippm-nas ships
#: is a checkpoint sidecar of 1.4 MB (``predictor/checkpoints/host-cpu.amd-epyc.json``).
MAX_JSON_FILE_BYTES = 64 * 2**20

#: A JSON string token (the unrolled form of ``"(?:[^"\\]|\\.)*"``, linear time).
_STRING_STR = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Every byte but the four brackets (deleted before the depth is counted).
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces, so equal values give equal text (hash input, identity of a config).

    Raises:
        ValueError: ``obj`` holds a NaN or an infinity (not JSON).
        TypeError: ``obj`` holds a value JSON cannot represent.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings do not count),
    computed without parsing or recursion; 0 for a scalar. Malformed text gives a figure too (the parser
    rejects it after). About 3 ms for a 1.4 MB document."""
    raw = (_STRING_STR.sub("", text).encode("utf-8", "surrogatepass") if isinstance(text, str)
           else _STRING_BYTES.sub(b"", bytes(text)))
    brackets = raw.translate(None, _NOT_BRACKETS)
    if len(brackets) <= 2:
        return len(brackets) // 2 if brackets[:1] in (b"[", b"{") else 0
    import numpy as np

    b = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((b == 0x5B) | (b == 0x7B), 1, -1).astype(np.int64)  # only brackets are left
    return int(np.cumsum(steps).max(initial=0))


class _Unreadable(Exception):
    """Why a document or a file cannot be read (the text after ``<what>: ``)."""


def _parse(text: str | bytes, max_depth: int) -> Any:
    if not isinstance(text, (str, bytes, bytearray)):
        raise _Unreadable(f"expected JSON text (str or bytes), got {type(text).__name__}")
    depth = json_depth(text)
    if depth > max_depth:
        raise _Unreadable(f"it nests arrays/objects {depth} levels deep; at most {max_depth} are read (no file "
                          "dippm-nas writes comes close: the document is damaged or hostile)")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _Unreadable(f"not JSON ({e})") from e


def loads_json(text: str | bytes, what: str, error: type[DippmNasError] = InvalidValueError, *,
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value of ``text``, nested at most ``max_depth`` levels.

    Args:
        text: the document (``str``, or UTF-8 ``bytes``).
        what: names the document in the error (``"the job row's config_json"``).
        error: the :class:`~dippm_nas.errors.DippmNasError` subclass raised.
        max_depth: the deepest nesting allowed (:data:`MAX_JSON_DEPTH`).

    Raises:
        DippmNasError: (``error``) the text is not JSON (``<what>: not JSON (<cause>)``) or nests deeper than
            ``max_depth`` (``<what>: it nests arrays/objects N levels deep; at most M are read ...``).
    """
    try:
        return _parse(text, max_depth)
    except _Unreadable as e:
        raise error(f"{what}: {e}") from e.__cause__


def _read(path: Path, max_bytes: int) -> bytes:
    try:
        return read_limited(path, max_bytes)
    except RefusedFile as e:
        raise _Unreadable(f"it {e.reason}") from e.__cause__


def read_regular_file(path: str | Path, what: str, error: type[DippmNasError] = InvalidValueError, *,
                      max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them.

    The file is opened without blocking and checked with ``fstat`` before it is read, so a FIFO, a socket,
    a directory or a device (``/dev/zero``) is refused instead of blocking or never ending; symbolic links
    are followed to the file they name.

    Raises:
        DippmNasError: (``error``) ``cannot read <what> '<path>': <cause>``: the file cannot be opened, is
            not a regular file, or is larger than ``max_bytes``.
    """
    try:
        return _read(Path(path), max_bytes)
    except _Unreadable as e:
        raise error(f"cannot read {what} {str(path)!r}: {e}") from e.__cause__


def read_json_file(path: str | Path, message: str, error: type[DippmNasError] = DippmNasError, *,
                   max_bytes: int = MAX_JSON_FILE_BYTES) -> Any:
    """The JSON value in the regular file at ``path`` (UTF-8), read as :func:`read_regular_file` and
    :func:`loads_json` do.

    Raises:
        DippmNasError: (``error``) ``<message>: <cause>``: the file cannot be read, is not a regular file, is
            larger than ``max_bytes``, is not JSON or nests deeper than :data:`MAX_JSON_DEPTH`.
    """
    try:
        return _parse(_read(Path(path), max_bytes), MAX_JSON_DEPTH)
    except _Unreadable as e:
        raise error(f"{message}: {e}") from e.__cause__


def check_keys(d: Mapping[str, Any], allowed: Collection[str], where: str, *, what: str = "",
               required: Collection[str] = (), error: type[DippmNasError] = InvalidValueError) -> None:
    """Check the keys of a mapping read from a file against the fields it may set.

    Raises:
        DippmNasError: (``error``) ``d`` has a key outside ``allowed`` (the message is ``<where>: unknown
            [<what> ]keys [...]; choices: [...]``) or lacks one of ``required``.
    """
    bad = sorted(set(d) - set(allowed))
    if bad:
        raise error(f"{where}: unknown {what + ' ' if what else ''}keys {bad}; choices: {sorted(allowed)}")
    missing = [k for k in required if k not in d]
    if missing:
        raise error(f"{where}: {what or 'the object'} needs {missing}")
