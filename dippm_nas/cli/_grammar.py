"""The grammar every ``dippm-nas`` verb shares: list flags, name checks with suggestions, deprecated flags,
usage errors and their exit status, JSON errors, and the capture spinner.

Rules (``docs/cli.md``):

- ``--device`` is a catalogue id (``dippm-nas devices``); a torch device (``cpu``, ``cuda:1``) is ``--torch-device``.
- List flags (``--device``, ``--batch``, ``--dtype``) take several values, space- or comma-separated:
  ``--batch 1 8 64`` and ``--batch 1,8,64`` are the same list, and repeating the flag extends it.
- ``--json`` is a flag: the verb prints JSON on stdout, errors included; a file path has its own flag name.
- Exit status 0 on success, 1 when the work itself fails, 2 for a usage error (a malformed flag, an unknown
  name, flags that do not go together); an unknown name lists the closest choices.
- A numeric flag is checked when it is parsed (:func:`int_flag`, :func:`float_flag`): a negative, zero, NaN or
  infinite value where the flag's rule excludes it is a usage error, before any work starts.
- An output path (``--out``, ``--report``...) is checked writable before the work that produces it
  (:func:`writable_output`): an unwritable path, a directory, a FIFO, a device, a dangling symbolic link or one
  of the verb's inputs is a usage error (exit 2) in a second, not after a benchmark or a campaign, and never
  a wait on a FIFO.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from dippm_nas._files import check_output
from dippm_nas.errors import DippmNasError

__all__ = [
    "UsageError",
    "Parser",
    "ListAction",
    "DeprecatedFlag",
    "closest",
    "unknown_name",
    "check_name",
    "positive_int",
    "int_flag",
    "float_flag",
    "writable_output",
    "device_ids",
    "torch_device",
    "legacy_torch_device",
    "argtype",
    "add_torch_device",
    "add_json_flag",
    "json_text",
    "add_progress_flag",
    "progress_enabled",
    "Spinner",
]

#: exit status of a usage error (argparse's own)
USAGE_EXIT = 2
#: exit status of an error raised while the verb works
RUNTIME_EXIT = 1


class UsageError(DippmNasError, ValueError):
    """A command-line argument is malformed, names nothing known, or does not go with another one (exit 2).

    Attributes:
        choices: the valid values, when the error is an unknown name.
        suggestions: the closest valid values, best first.
    """

    def __init__(self, message: str, *, choices: Sequence[str] | None = None,
                 suggestions: Sequence[str] | None = None, usage: str | None = None,
                 prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog
        self.choices = list(choices) if choices is not None else None
        self.suggestions = list(suggestions or [])
        self.usage = usage


def closest(value: str, choices: Iterable[str], n: int = 5) -> list[str]:
    """The choices closest to ``value``, best first: those containing it (``a100`` -> every A100 id), then
    :func:`difflib.get_close_matches`."""
    pool = list(dict.fromkeys(str(c) for c in choices))
    v = value.strip().lower()
    starts = [c for c in pool if v and c.lower().startswith(v)]
    contains = [c for c in pool if v and v in c.lower() and c not in starts]
    close = difflib.get_close_matches(v, pool, n=n, cutoff=0.5)
    return list(dict.fromkeys([*starts, *contains, *close]))[:n]


def unknown_name(kind: str, value: str, choices: Sequence[str]) -> UsageError:
    """``unknown device 'a100'; did you mean: a100-pcie-40gb, a100-sxm4-40gb? choices: ...``"""
    near = closest(value, choices)
    text = f"unknown {kind} {value!r}"
    if near:
        text += f"; did you mean: {', '.join(near)}?"
    text += f" choices: {', '.join(choices)}"
    return UsageError(text, choices=choices, suggestions=near)


def check_name(kind: str, value: str, choices: Sequence[str]) -> str:
    """``value`` when it is one of ``choices``; otherwise a :class:`UsageError` with suggestions."""
    if value not in choices:
        raise unknown_name(kind, value, choices)
    return value


def positive_int(flag: str) -> Callable[[str], int]:
    """A converter of one value of a list flag (``--batch``): an integer >= 1, else a :class:`UsageError`."""
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise UsageError(f"{flag} takes integers >= 1, got {text!r}") from None
        if v < 1:
            raise UsageError(f"{flag} takes integers >= 1, got {v}")
        return v
    return conv


def int_flag(flag: str, *, low: int | None = None, note: str = "") -> Callable[[str], int]:
    """An argparse ``type=`` of an integer flag: ``int(text)`` when it is ``>= low``, else a usage error (exit 2)
    that states the rule and the value (``argument --workers: expects an integer >= 1, got 0``); ``note`` says
    what a bound means (``"0: off"``)."""
    rule = "an integer" + (f" >= {low}" if low is not None else "") + (f" ({note})" if note else "")

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise UsageError(f"expects {rule}, got {text!r}") from None
        if low is not None and v < low:
            raise UsageError(f"expects {rule}, got {v}")
        return v
    conv.__name__ = flag
    return argtype(conv)


def float_flag(flag: str, *, low: float | None = None, low_inclusive: bool = True, high: float | None = None,
               high_inclusive: bool = True, note: str = "") -> Callable[[str], float]:
    """An argparse ``type=`` of a number flag: a finite ``float(text)`` within the bounds (inclusive unless
    told), else a usage error (exit 2) that states the rule and the value; NaN and infinities are refused."""
    bounds = [f"{'>=' if low_inclusive else '>'} {low:g}"] if low is not None else []
    bounds += [f"{'<=' if high_inclusive else '<'} {high:g}"] if high is not None else []
    rule = "a finite number" + (f" {' and '.join(bounds)}" if bounds else "") + (f" ({note})" if note else "")

    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise UsageError(f"expects {rule}, got {text!r}") from None
        if not math.isfinite(v) or (low is not None and not (v >= low if low_inclusive else v > low)) \
                or (high is not None and not (v <= high if high_inclusive else v < high)):
            raise UsageError(f"expects {rule}, got {text}")
        return v
    conv.__name__ = flag
    return argtype(conv)


def writable_output(path: str | os.PathLike[str], flag: str, *, directory: bool = False,
                    inputs: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """``path`` after checking that the verb can write there, before it starts its work (a benchmark or a
    campaign that runs for minutes must not end on an unwritable ``--out``).

    A file (:func:`dippm_nas._files.check_output`, ``stat`` only: nothing is opened, so a FIFO never blocks):
    a new path in an existing directory, or a regular file (a symbolic link to one); not a directory, a FIFO, a
    device, a socket, a dangling symbolic link or one of ``inputs`` (the files the verb reads). A directory
    (``directory=True``, created by the verb): it is a directory a file can be created in, or its nearest
    existing parent is. The check creates and removes a temporary file there.

    Raises:
        UsageError: the path cannot be written (exit 2), naming the flag, the path and why.
    """
    p = Path(path).expanduser()
    if directory:
        if p.exists() and not p.is_dir():
            raise UsageError(f"argument {flag} {str(p)!r} is a file, not a directory; name a directory (created if "
                             "missing)")
        probe = p
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise UsageError(f"argument {flag} {str(p)!r} cannot be created: {str(probe)!r} is a file, not a "
                             "directory")
    else:
        try:
            probe = check_output(p, flag, error=UsageError, inputs=inputs).parent
        except UsageError as e:
            raise UsageError(f"argument {e}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".dippm-nas-write-check-"):
            pass
    except OSError as e:
        raise UsageError(f"argument {flag} {str(p)!r} cannot be written: creating a file in {str(probe)!r} failed "
                         f"({e.strerror or e}); name a path in a writable directory") from None
    return p


def device_ids(values: Sequence[str]) -> list[str]:
    """Catalogue ids, lower-cased and checked (``dippm-nas devices`` lists them)."""
    from dippm_nas.devices import list_devices

    known = list_devices()
    out = []
    for v in values:
        key = v.strip().lower()
        out.append(check_name("device", key, known))
    return out


_TORCH_DEVICE = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")


def torch_device(text: str) -> str:
    """A torch device string: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``."""
    t = text.strip().lower()
    if not _TORCH_DEVICE.match(t):
        raise UsageError(f"--torch-device takes a torch device (cpu, cuda, cuda:N, mps), got {text!r}"
                         + (" (a catalogue id goes to --device)" if t and not t.startswith(("cpu", "cuda")) else ""))
    return t


def argtype(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """``fn`` as an argparse ``type=``: its :class:`UsageError` message reaches the user (argparse would replace
    a ``ValueError``'s message with 'invalid ... value')."""
    def conv(text: str) -> Any:
        try:
            return fn(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    conv.__name__ = getattr(fn, "__name__", "value")
    return conv


def legacy_torch_device(text: str) -> str:
    """The value of an old ``--device`` flag that named a torch device: ``cpu``/``cuda[:N]`` as is, and the
    catalogue id ``host-cpu`` as ``cpu``."""
    t = text.strip().lower()
    if t == "host-cpu":
        return "cpu"
    if not _TORCH_DEVICE.match(t):
        raise UsageError(f"--device of a measuring verb names the torch device to measure on (cpu, cuda, cuda:N; "
                         f"host-cpu for cpu), got {text!r}; the flag is --torch-device")
    return t


def add_torch_device(p: argparse.ArgumentParser, default: str | None, help: str) -> None:
    """``--torch-device`` (a torch device string), and the old ``--device`` of a measuring verb, kept one release
    with a deprecation message on stderr."""
    p.add_argument("--torch-device", dest="torch_device", type=argtype(torch_device), default=default, metavar="DEV",
                   help=help)
    p.add_argument("--device", dest="torch_device", action=DeprecatedFlag, new="--torch-device",
                   convert=legacy_torch_device)


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors raise :class:`UsageError` (so ``main`` decides how to
    print them: text, or JSON under ``--json``), with the closest choices for an invalid choice."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        choices: list[str] | None = None
        near: list[str] = []
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2)) or [c.strip() for c in m.group(2).split(",")]
            near = closest(m.group(1), choices)
            if near:
                message = f"{message}; did you mean: {', '.join(near)}?"
        raise UsageError(message, choices=choices, suggestions=near, usage=self.format_usage(), prog=self.prog)


class ListAction(argparse.Action):
    """A flag that takes one or more values, space- or comma-separated (``--batch 1 8 64`` = ``--batch 1,8,64``);
    repeating it extends the list. ``item`` converts (and checks) each value; a :class:`UsageError` it raises
    reaches the user as is."""

    def __init__(self, option_strings: Sequence[str], dest: str, item: Callable[[str], Any] = str,
                 **kwargs: Any) -> None:
        kwargs.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kwargs)
        self.item = item

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parts = [p.strip() for v in (values if isinstance(values, list) else [values]) for p in str(v).split(",")]
        try:
            items = [self.item(p) for p in parts if p]
        except UsageError as e:
            e.prog = e.prog or parser.prog
            raise
        if not items:
            raise UsageError(f"{option_string} takes at least one value, got {values!r}", prog=parser.prog)
        current = getattr(namespace, self.dest, None)
        if current is None or current is self.default:
            current = []
        setattr(namespace, self.dest, [*current, *items])


class DeprecatedFlag(argparse.Action):
    """An old flag kept for one release: says so on stderr, then stores (converted) into the new flag's dest."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "",
                 convert: Callable[[str], Any] = str, **kwargs: Any) -> None:
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new
        self.convert = convert

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            value = self.convert(values)
        except UsageError as e:
            e.prog = e.prog or parser.prog
            raise
        print(f"{parser.prog}: warning: {option_string} is deprecated here and goes in the next release; "
              f"use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, value)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def json_text(obj: Any, **kwargs: Any) -> str:
    """Strict JSON of what a verb prints under ``--json``: NaN and infinities (an undefined Kendall tau, say)
    become ``null``; other values that JSON lacks are written with ``str``."""
    kwargs.setdefault("default", str)
    return json.dumps(_finite(obj), allow_nan=False, **kwargs)


def add_json_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON on stdout (errors too)")


def add_progress_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar or spinner on stderr (shown only on a terminal)")


def progress_enabled(args: argparse.Namespace, stream: TextIO | None = None) -> bool:
    """A spinner or bar is shown when stderr is a terminal and ``--no-progress`` was not given."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return not getattr(args, "no_progress", False) and bool(isatty and isatty())


class Spinner:
    """A spinner on stderr while a slow step runs; it appears only after ``delay_s`` (a cached capture answers
    before that and prints nothing) and erases itself at the end.

    >>> with Spinner("capturing torchvision:resnet18", enabled=True):
    ...     graph = capture(...)
    """

    _FRAMES = "|/-\\"

    def __init__(self, text: str, *, enabled: bool, delay_s: float = 1.0, stream: TextIO | None = None,
                 interval_s: float = 0.1) -> None:
        self.text = text
        self.enabled = enabled
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.stream = sys.stderr if stream is None else stream
        self.shown = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        if self._stop.wait(self.delay_s):
            return
        t0 = time.perf_counter() - self.delay_s
        i = 0
        while not self._stop.is_set():
            self.shown = True
            self.stream.write(f"\r{self._FRAMES[i % 4]} {self.text} ({time.perf_counter() - t0:.0f} s)")
            self.stream.flush()
            i += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "Spinner":
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="dippm-nas-spinner", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self.shown:
                self.stream.write("\r" + " " * (len(self.text) + 12) + "\r")
                self.stream.flush()
