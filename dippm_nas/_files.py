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

__all__ = ["file_size", "read_file"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _mib(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def _checked(st: os.stat_result, path: Path, what: str, max_bytes: int, error: type[DippmNasError],
             hint: str) -> int:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        link = f" (a symlink to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise error(f"{what} {str(path)!r} is {kind}{link}, not a regular file; only regular files are read")
    if st.st_size > max_bytes:
        raise error(f"{what} {str(path)!r} has {st.st_size:,} bytes, more than the {max_bytes:,} ({_mib(max_bytes)}) "
                    f"read at most{hint}")
    return st.st_size


def _os_error(e: OSError, path: Path, what: str, error: type[DippmNasError]) -> DippmNasError:
    if isinstance(e, FileNotFoundError):
        return error(f"{what} {str(path)!r} does not exist")
    return error(f"{what} {str(path)!r} cannot be read: {e.strerror or e}")


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
        raise _os_error(e, p, what, error) from e
    return _checked(st, p, what, max_bytes, error, hint)


def read_file(path: str | os.PathLike[str], what: str, *, max_bytes: int,
              error: type[DippmNasError], hint: str = "") -> bytes:
    """The bytes of ``path``, a regular file (symlinks followed) of at most ``max_bytes``.

    The file is opened with ``O_NONBLOCK`` and checked on the open descriptor; at most ``max_bytes`` are read
    even when the file grows meanwhile.

    Raises:
        error: as :func:`file_size`, or an error while reading.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _os_error(e, p, what, error) from e
    try:
        _checked(os.fstat(fd), p, what, max_bytes, error, hint)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise _os_error(e, p, what, error) from e
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{what} {str(p)!r} grew past {max_bytes:,} bytes ({_mib(max_bytes)}) while it was read{hint}")
    return data
