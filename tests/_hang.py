"""``within``: a call run in a thread that fails the test when it blocks (an unbounded read, a FIFO opened for
reading), instead of hanging the suite."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest


def release_fifos(fifos: Sequence[Path]) -> None:
    """Open each FIFO read-write without blocking, which lets a call stuck opening it go on (Linux)."""
    for f in fifos:
        try:
            os.close(os.open(f, os.O_RDWR | os.O_NONBLOCK))
        except OSError:
            pass


def within(fn: Callable[[], Any], *, seconds: float, fifos: Sequence[Path] = ()) -> Any:
    """``fn()`` run in a thread; the test fails if it has not returned after ``seconds`` (it hung, or a size was
    not bounded). Its exception, if any, is raised here; ``fifos`` are released first so a blocked reader ends."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        release_fifos(fifos)
        t.join(5)
        pytest.fail(f"the call did not return within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
