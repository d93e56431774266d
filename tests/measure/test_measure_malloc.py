"""The steady CPU allocator of timing runs (dippm_nas.measure._malloc)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from dippm_nas.errors import MeasurementError
from dippm_nas.measure import MeasureSettings, measure
from dippm_nas.measure import _malloc
from dippm_nas.spec import InputSpec

_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# page faults of touching a 48 MiB tensor after an equal one was freed (fewest of 5 tries: the VM's
# kernel now and then reclaims idle pages of its own accord, which no allocator setting prevents)
_FAULTS = textwrap.dedent("""
    import resource, sys, torch
    if sys.argv[1] == "steady":
        from dippm_nas.measure._malloc import steady_allocator
        print(steady_allocator(), file=sys.stderr)
    n = 12 * 2**20                      # 48 MiB of float32
    torch.empty(n).fill_(1.0)           # allocated, touched, freed
    faults = []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(n).fill_(1.0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(min(faults))
""")


def _second_touch_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not _GLIBC, reason="mallopt thresholds are a Linux glibc feature")
def test_steady_allocator_stops_fresh_pages_on_reuse() -> None:
    pages = 48 * 2**20 // 4096
    as_is = _second_touch_faults("as-is")
    steady = _second_touch_faults("steady")
    # glibc's default hands a freed 48 MiB block back to the OS: every page faults in again
    assert as_is > pages // 2, as_is
    # fixed thresholds: the freed block is reused, (almost) nothing faults
    assert steady < pages // 20, steady


@pytest.mark.skipif(not _GLIBC, reason="mallopt thresholds are a Linux glibc feature")
def test_steady_allocator_says_what_it_set_and_is_idempotent() -> None:
    first = _malloc.steady_allocator()
    assert first.startswith("glibc steady (mmap_threshold=") and "trim_threshold=" in first
    assert _malloc.steady_allocator() == first
    assert _malloc.release_free_memory() is True


def test_non_glibc_is_flagged_not_faked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_malloc.platform, "libc_ver", lambda: ("", ""))
    _malloc._glibc.cache_clear()
    try:
        assert _malloc._apply().startswith("as-is: mallopt thresholds need Linux glibc")
        assert _malloc.release_free_memory() is False
    finally:
        monkeypatch.undo()
        _malloc._glibc.cache_clear()


def test_setting_is_validated_and_recorded() -> None:
    with pytest.raises(MeasurementError, match=r"cpu_allocator must be one of \('steady', 'as-is'\), got 'fast'"):
        MeasureSettings(cpu_allocator="fast")
    spec = InputSpec(shape=(4,), batch_size=2)
    fast = dict(warmup=1, min_repeats=2, max_repeats=3, time_cap_s=5.0, threads=1)
    model = nn.Linear(4, 3)
    steady = measure(model, spec, torch_device="cpu", settings=MeasureSettings(**fast))
    as_is = measure(model, spec, torch_device="cpu", settings=MeasureSettings(cpu_allocator="as-is", **fast))
    assert as_is.environment["allocator"] == "as-is: requested" and as_is.environment["heap_trimmed"] is False
    assert steady.environment["settings"]["cpu_allocator"] == "steady"
    assert steady.environment["allocator"] == _malloc.steady_allocator()
    assert steady.environment["heap_trimmed"] is _GLIBC
    assert MeasureSettings.from_dict(steady.environment["settings"]) == MeasureSettings(**fast)
    assert torch.get_num_threads() >= 1
