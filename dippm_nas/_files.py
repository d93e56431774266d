"""Reading a file a user named: regular files only, and at most a stated number of bytes.

A path can name a FIFO (a read waits for a writer forever), a device (``/dev/zero`` never ends), a directory,
or a sparse file of many GiB that costs nothing on disk and all of the memory when it is read. Each of these
is an error that names the path, what it is and the limit, raised before anything is read: the file is
opened without blocking (``O_NONBLOCK``: opening a FIFO does not wait for a writer) and its type and size are
taken from the open descriptor, so a path swapped after a check is caught too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dippm_nas.errors import DippmNasError

__all__ = ["file_size", "read_file", "read_limited", "RefusedFile"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _mib(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


class RefusedFile(Exception):
    """Why a file is not read: :attr:`reason` is a predicate of the file (``"is a FIFO (named pipe), not a
    regular file; ..."``), to follow its name in the caller's message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _refusal(st: os.stat_result, path: Path, max_bytes: int) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        link = f" (a symlink to {os.path.realpath(path)})" if path.is_symlink() else ""
        return f"is {kind}{link}, not a regular file; only regular files are read"
    if st.st_size > max_bytes:
        return f"has {st.st_size:,} bytes, more than the {max_bytes:,} ({_mib(max_bytes)}) read at most"
    return None


def _os_reason(e: OSError) -> str:
    return "does not exist" if isinstance(e, FileNotFoundError) else f"cannot be read: {e.strerror or e}"


def read_limited(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file (symlinks followed) of at most ``max_bytes``.

    The file is opened with ``O_NONBLOCK`` (opening a FIFO does not wait for a writer) and checked on the open
    descriptor; at most ``max_bytes`` are read even when the file grows meanwhile.

    Raises:
        RefusedFile: a missing or unreadable path, one that is not a regular file, or one over ``max_bytes``.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise RefusedFile(_os_reason(e)) from e
    try:
        reason = _refusal(os.fstat(fd), p, max_bytes)
        if reason:
            raise RefusedFile(reason)
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise RefusedFile(f"grew past {max_bytes:,} bytes ({_mib(max_bytes)}) while it was read")
        return b"".join(chunks)
    except OSError as e:
        raise RefusedFile(_os_reason(e)) from e
    finally:
        os.close(fd)


def file_size(path: str | os.PathLike[str], what: str, *, max_bytes: int,
              error: type[DippmNasError], hint: str = "") -> int:
    """The size of ``path`` in bytes, when it is a regular file (symlinks followed) of at most ``max_bytes``;
    nothing is opened.

    Args:
        path: the file.
        what: what the file is, for the message (``"ONNX file"``).
        max_bytes: the most bytes allowed.
        error: the error class raised.
        hint: appended to the message of a file over the limit (what to do instead).

    Raises:
        error: a missing path, one that is not a regular file (a FIFO, a device, a directory...) or that is
            larger than ``max_bytes``; the message names the path, what it is and the limit.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise error(f"{what} {str(p)!r} {_os_reason(e)}") from e
    reason = _refusal(st, p, max_bytes)
    if reason:
        raise error(f"{what} {str(p)!r} {reason}{hint if reason.startswith('has ') else ''}")
    return st.st_size


def read_file(path: str | os.PathLike[str], what: str, *, max_bytes: int,
              error: type[DippmNasError], hint: str = "") -> bytes:
    """The bytes of ``path``, a regular file (symlinks followed) of at most ``max_bytes``
    (:func:`read_limited`).

    Raises:
        error: as :func:`file_size`, or an error while reading.
    """
    try:
        return read_limited(path, max_bytes)
    except RefusedFile as e:
        size_rule = e.reason.startswith(("has ", "grew "))
        raise error(f"{what} {str(path)!r} {e.reason}{hint if size_rule else ''}") from e.__cause__
