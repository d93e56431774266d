"""Hostile inputs for the fuzz registry (``fuzz_registry.py``), and the runner that calls one entry on one of them.

The values: wrong types, non-finite numbers, huge sizes, deep nesting, and special files (a FIFO, a device, a
directory, a dangling symlink, a symlink to one of the call's inputs, a missing folder, garbage and deeply
nested documents). A file kind is drawn as a name and made in the example's own folder by :class:`Scene`, so
every example starts from fresh files.

The runner (:func:`run_case`) calls the entry in a worker thread with a deadline (a call still running at the
deadline is a hang; FIFOs it may be blocked on are opened for writing and closed, so the thread ends), records
the warnings and log records it produced, and hashes the input files before and after. Its outcome is one of
``OUTCOMES``; :data:`BAD` are the ones the property refuses.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import math
import os
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from dippm_nas.errors import DippmNasError

#: What a case gave, in the order of docs/reliability.md's table.
OUTCOMES = ("clear error", "fallback", "handled", "crash", "hang", "silent wrong", "lost", "leaked")
#: The outcomes the property refuses.
BAD = frozenset({"crash", "hang", "silent wrong", "lost", "leaked"})
#: Seconds one example may run before it counts as a hang.
DEADLINE_S = float(os.environ.get("DIPPM_NAS_FUZZ_DEADLINE_S", "20"))

DEEP = 100_000  # nesting levels of a deep document: far over every reader's bound (64)
HUGE_INT = 10**30
PASSWORD = "Pw-d1ppm-F0zz-s3cret"


def deep_list(n: int = DEEP) -> Any:
    out: Any = []
    for _ in range(min(n, 2000)):  # a real object nested 2000 deep (Python's own limit is ~1000 frames)
        out = [out]
    return out


def deep_dict(n: int = 2000) -> Any:
    out: Any = {}
    for _ in range(n):
        out = {"a": out}
    return out


class Opaque:
    """An object of no type any entry point expects."""

    def __repr__(self) -> str:
        return "Opaque()"


# --------------------------------------------------------------------------------------------- value pools
WRONG_TYPES: tuple[Any, ...] = (None, Opaque(), b"\x00\xff", 1j, {"a": 1}, [1, "a"], "x")
NONFINITE: tuple[float, ...] = (math.nan, math.inf, -math.inf)
NUMBERS: tuple[Any, ...] = (*NONFINITE, -1, 0, -1.5, 1e308, HUGE_INT, -HUGE_INT, True, "8", "1.5")
TEXTS: tuple[Any, ...] = ("", "\x00", "x" * 100_000, "\u202e\u00e9\U0001F600", "../../etc/passwd", " ", 5, None)


def scalars() -> st.SearchStrategy[Any]:
    return st.sampled_from((*NUMBERS, *WRONG_TYPES, *TEXTS[:4]))


def int_values() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from((-1, 0, 2**63, HUGE_INT, -HUGE_INT, True, 1.5, math.nan, "8", None, Opaque())),
                     st.integers(min_value=-2**70, max_value=2**70))


def float_values() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from((*NONFINITE, -1.0, 0.0, 1e308, -1e308, 5e-324, "1.0", None, True, Opaque())),
                     st.floats(allow_nan=True, allow_infinity=True))


def text_values() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(TEXTS + (Opaque(), b"x")), st.text(max_size=20))


def nested_values() -> st.SearchStrategy[Any]:
    """Containers: empty, of wrong items, deeply nested, huge keys."""
    return st.sampled_from((None, [], {}, (), deep_list(), deep_dict(), [None], [math.nan], {"": math.inf},
                            {1: Opaque()}, ["x"] * 3, "not a container", {"a" * 10_000: 1}))


def arrays() -> st.SearchStrategy[Any]:
    """Float arrays: non-finite, zero, extreme, of the baseline's length (3) (an array parameter is internal plumbing:
    values of another type are a programming error, not a user's input)."""
    import numpy as np
    return st.sampled_from((np.array([math.nan, 1.0, 2.0]), np.full(3, math.inf), np.array([-1.0, 0.0, 1e308]),
                            np.zeros(3)))


def any_values() -> st.SearchStrategy[Any]:
    return st.one_of(scalars(), nested_values(), st.sampled_from(TEXTS))


# --------------------------------------------------------------------------------------------- special files
#: Kinds of path a hostile caller gives where dippm-nas reads a file.
READ_KINDS = ("fifo", "dev_null", "directory", "dangling_symlink", "symlink_to_input", "missing", "empty",
              "garbage", "deep_json", "deep_toml", "sparse_huge", "nul_name")
#: Kinds of path a hostile caller gives where dippm-nas writes a file (``symlink_to_input``: one of the call's
#: inputs, which a writer must refuse, never overwrite).
WRITE_KINDS = ("fifo", "dev_full", "directory", "dangling_symlink", "symlink_to_input", "missing_folder",
               "nul_name")


def read_kinds() -> st.SearchStrategy[str]:
    return st.sampled_from(READ_KINDS)


def write_kinds() -> st.SearchStrategy[str]:
    return st.sampled_from(WRITE_KINDS)


@dataclass
class Scene:
    """One example's folder: the files it made, the inputs whose bytes must not change, the FIFOs to unblock."""

    root: Path
    inputs: list[Path] = field(default_factory=list)
    fifos: list[Path] = field(default_factory=list)
    _n: int = 0

    def name(self, suffix: str) -> Path:
        self._n += 1
        return self.root / f"f{self._n}{suffix}"

    def input_file(self, data: bytes | str = b"{}", suffix: str = ".json") -> Path:
        """A regular file the call reads: its bytes are hashed before and after."""
        p = self.name(suffix)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        self.inputs.append(p)
        return p

    def special(self, kind: str, suffix: str = ".json", target: Path | None = None, *, output: bool = False) -> str:
        """A path of ``kind`` (``READ_KINDS`` / ``WRITE_KINDS``); ``target``: the input ``symlink_to_input`` names
        (without one, a file of its own: hashed when the path is read, not when it is an ``output``, as a writer
        may write through a symbolic link to a file that is not one of its inputs)."""
        p = self.name(suffix)
        if kind == "fifo":
            os.mkfifo(p)
            self.fifos.append(p)
        elif kind == "dev_null":
            return "/dev/null"
        elif kind == "dev_full":
            return "/dev/full"
        elif kind == "directory":
            p.mkdir()
        elif kind == "dangling_symlink":
            p.symlink_to(self.root / "nowhere" / "gone.json")
        elif kind == "symlink_to_input":
            if target is None:
                target = self.input_file(b'{"kept": true}\n', suffix)
                if output:
                    self.inputs.remove(target)
            p.symlink_to(target)
        elif kind == "missing":
            pass
        elif kind == "missing_folder":
            return str(self.root / "no" / "such" / f"folder{suffix}")
        elif kind == "empty":
            p.write_bytes(b"")
        elif kind == "garbage":
            p.write_bytes(bytes(range(256)) * 8)
        elif kind == "deep_json":
            p.write_text("[" * DEEP + "]" * DEEP)
        elif kind == "deep_toml":
            p.write_text("a = " + "[" * DEEP + "]" * DEEP + "\n")
        elif kind == "sparse_huge":
            with open(p, "wb") as f:
                f.truncate(300 * 2**20)  # 300 MiB of holes: over every reader's cap, no disk used
        elif kind == "nul_name":
            return str(p) + "\x00x"
        else:  # pragma: no cover - a kind the strategies do not draw
            raise ValueError(kind)
        return str(p)

    def digests(self) -> dict[Path, str]:
        out = {}
        for p in self.inputs:
            try:
                out[p] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<not a file>"
            except OSError as e:
                out[p] = f"<unreadable: {e}>"
        return out

    def unblock(self) -> None:
        """Open every FIFO for writing without blocking and close it: a reader blocked in open() or read() ends."""
        for p in self.fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.contextmanager
def scene() -> Iterator[Scene]:
    d = Path(tempfile.mkdtemp(prefix="dippm-fuzz-"))
    try:
        yield Scene(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------------------------- the runner
@dataclass
class Result:
    outcome: str
    detail: str = ""
    messages: list[str] = field(default_factory=list)  # exception text, warnings and log records

    def __str__(self) -> str:
        return f"{self.outcome}: {self.detail}"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose arguments do not format: its raw parts
        return f"{record.msg} {record.args}"


@dataclass
class Checked:
    """What an entry's call returns when it checks its own result: ``wrong`` names a silent wrong value."""

    value: Any
    wrong: str | None = None


class Flagged(Warning):
    """What an entry's call returns (as ``Flagged(...)``) or warns when it took an explicitly flagged fallback."""


def run_case(call: Callable[[], Any], sc: Scene, *, deadline_s: float = DEADLINE_S,
             oracle: Callable[[Any], str | None] | None = None) -> Result:
    """Call ``call()`` in a worker thread; classify what it gave (``OUTCOMES``).

    ``oracle(returned)`` may name a silent wrong value (a text) or return None.
    """
    before = sc.digests()
    box: dict[str, Any] = {}
    handler = _Records()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    caught: list[warnings.WarningMessage] = []

    def work() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - every exception is classified below
            box["error"] = e

    out, err = io.StringIO(), io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            t = threading.Thread(target=work, daemon=True, name="dippm-fuzz-case")
            t.start()
            t.join(deadline_s)
            if t.is_alive():
                sc.unblock()
                t.join(5.0)
                return Result("hang", f"still running after {deadline_s:.0f} s")
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    messages = [str(w.message) for w in caught] + [_message(r) for r in handler.records]
    messages += [out.getvalue(), err.getvalue()]
    after = sc.digests()
    changed = [str(p) for p in before if after.get(p) != before[p]]
    if changed:
        return Result("lost", f"input changed: {changed}", messages)
    if "error" in box:
        e = box["error"]
        messages.append(str(e))
        messages.append(repr(e))
        if isinstance(e, DippmNasError):
            return Result("clear error", f"{type(e).__name__}: {str(e)[:200]}", messages)
        return Result("crash", f"{type(e).__name__}: {str(e)[:300]}", messages)
    value = box.get("value")
    if isinstance(value, Checked):
        if value.wrong:
            return Result("silent wrong", value.wrong, messages)
        value = value.value
    if oracle is not None:
        wrong = oracle(value)
        if wrong:
            return Result("silent wrong", wrong, messages)
    if isinstance(value, Flagged) or any(issubclass(w.category, UserWarning) or w.category is Flagged
                                         for w in caught) \
            or any(r.levelno >= logging.WARNING for r in handler.records):
        return Result("fallback", "returned with a warning", messages)
    return Result("handled", "returned", messages)


def is_regular(path: str | Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
