"""Reading a file a user named (regular files only, and at most a stated number of bytes) and writing one
(never over an input, never half-written).

A path can name a FIFO (a read waits for a writer forever), a device (``/dev/zero`` never ends), a directory,
or a sparse file of many GiB that costs nothing on disk and all of the memory when it is read. Each of these
is an error that names the path, what it is and the limit, raised before anything is read: the file is
opened without blocking (``O_NONBLOCK``: opening a FIFO does not wait for a writer) and its type and size are
taken from the open descriptor, so a path swapped after a check is caught too.

A file dippm-nas writes (:func:`output_path`, :func:`write_output`) is checked before anything is opened,
with ``stat`` only: a directory, a FIFO, a device (``/dev/full``), a socket, a dangling symbolic link, a
missing folder or a path that is one of the writer's inputs (the same file, through a symbolic or a hard link)
is an error naming the path and what it is. The bytes go to a temporary file in the destination's folder,
renamed over the destination when complete: a failed write (a full disk, an error in the writer) leaves the
old file as it was and no partial one. A symbolic link to a regular file is written through (the file it
names is replaced, the link stays).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dippm_nas.errors import DippmNasError

__all__ = ["file_size", "read_file", "read_limited", "RefusedFile", "check_output", "output_path", "write_output"]

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


# ---------------------------------------------------------------------------------------------- writing
def _kind(st: os.stat_result) -> str:
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")


def _same_file(dest: Path, st: os.stat_result, inp: str | os.PathLike[str]) -> bool:
    try:
        ist = os.stat(inp)
    except (OSError, ValueError):
        return False
    return (ist.st_dev, ist.st_ino) == (st.st_dev, st.st_ino)


def check_output(path: str | os.PathLike[str], what: str, *, error: type[DippmNasError],
                 inputs: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """The file a writer of ``path`` replaces, checked with ``stat`` only (nothing is opened, so a FIFO never
    blocks): ``path`` itself, or the regular file a symbolic link ``path`` names.

    Args:
        path: the output path a user gave.
        what: names the output in the message (``"--out"``, ``"deployment file"``).
        error: the error class raised.
        inputs: the files the writer reads; an output that is one of them (the same file, however named) is
            refused.

    Raises:
        error: ``path`` is empty, a directory, a FIFO, a device, a socket, a dangling symbolic link, in a
            folder that does not exist, or one of ``inputs``; the message names the path and what it is.
    """
    if not str(path).strip():
        raise error(f"{what}: an empty path; name the file to write")
    p = Path(path).expanduser()
    dest = p
    if p.is_symlink():
        target = os.path.realpath(p)
        if not os.path.exists(target):
            raise error(f"{what} {str(p)!r} is a dangling symbolic link (to {target!r}); name a regular file or a new "
                        "path")
        dest = Path(target)
    try:
        st: os.stat_result | None = os.stat(dest)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise error(f"{what} {str(p)!r} cannot be written: {e.strerror or e}") from e
    if st is not None:
        link = f" (a symbolic link to {str(dest)!r})" if dest != p else ""
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{what} {str(p)!r}{link} is a directory; name the file to write")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {str(p)!r}{link} is {_kind(st)}, not a regular file; only regular files (or new "
                        "paths) are written")
        for inp in inputs:
            if _same_file(dest, st, inp):
                raise error(f"{what} {str(p)!r}{link} is the input {str(inp)!r} (the same file); writing it would "
                            "replace what is read: name another output file")
    folder = dest.parent
    if not folder.is_dir():
        why = "is not a directory" if folder.exists() else "does not exist"
        raise error(f"{what} {str(p)!r}: the directory {str(folder)!r} {why}; create it or name a file in an existing "
                    "directory")
    return dest


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def output_path(path: str | os.PathLike[str], what: str, *, error: type[DippmNasError],
                inputs: Sequence[str | os.PathLike[str]] = ()) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to, renamed over ``path`` when the block ends without an
    error (removed otherwise): the old file stays whole until the new one is complete.

    The temporary file is in the destination's folder (a rename within one file system is atomic) and its
    name ends with the destination's name, so a writer that picks a format by the ending (``.jsonl.xz``,
    ``.npz``) picks the same one. The written file gets the destination's permissions when it exists,
    ``0o666`` less the umask otherwise.

    Raises:
        error: as :func:`check_output`, or an ``OSError`` while the file is created, written or renamed (a
            full disk, a read-only folder), naming the path and the cause.
    """
    dest = check_output(path, what, error=error, inputs=inputs)
    try:
        old = os.stat(dest)
        mode = stat.S_IMODE(old.st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-", suffix="-" + dest.name[-96:])
    except OSError as e:
        raise error(f"{what} {str(path)!r} cannot be written: creating a file in {str(dest.parent)!r} failed "
                    f"({e.strerror or e})") from e
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except OSError as e:
        raise error(f"{what} {str(path)!r} could not be written: {e.strerror or e}; the old file (if any) is "
                    "unchanged") from e
    finally:
        if tmp.exists():
            tmp.unlink()


def write_output(path: str | os.PathLike[str], data: str | bytes, what: str, *, error: type[DippmNasError],
                 inputs: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`output_path`; returns ``path``.

    Raises:
        error: as :func:`output_path`.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with output_path(path, what, error=error, inputs=inputs) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)
