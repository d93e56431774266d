"""``gc_paused``: the collector is off inside, restored after, shared by nested and concurrent uses."""

from __future__ import annotations

import gc
import threading

import pytest

from dippm_nas._gc import gc_paused


def test_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_restored_after_an_error_and_a_disabled_collector_stays_disabled() -> None:
    with pytest.raises(RuntimeError):
        with gc_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: the pause does not turn it on
    finally:
        gc.enable()


def test_concurrent_pauses_end_with_the_last() -> None:
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with gc_paused():
            inside.set()
            leave.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause holds
    leave.set()
    t.join(5)
    assert gc.isenabled()
