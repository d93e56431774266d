"""Helpers shared by the benchmark scripts: machine description and load, medians, sampled search-space candidates."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any


def machine() -> str:
    """One line saying where the figures were measured."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"Python {platform.python_version()}")


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for the lines that report a timing (``"load 1.23 0.98 0.75"``)."""
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


#: The resolution, batch size and dtype the speed benchmarks capture search-space candidates at.
CANDIDATE_RESOLUTION = 256
CANDIDATE_BATCH_SIZE = 256
CANDIDATE_DTYPE = "float16"


def sampled_configs(space: Any, seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` configs of a ``search_spaces`` space, sampled with seeds ``seed``, ``seed + 1``... at
    :data:`CANDIDATE_RESOLUTION`."""
    return [space.validate({**space.sample(seed + i), "resolution": CANDIDATE_RESOLUTION}) for i in range(count)]


def space_items(space_name: str, seed: int, count: int) -> list[tuple[str, dict[str, Any], Any]]:
    """``(space, config, InputSpec)`` items of :func:`sampled_configs` for ``dippm_nas.capture.assemble_many``,
    at :data:`CANDIDATE_BATCH_SIZE` and :data:`CANDIDATE_DTYPE`."""
    import search_spaces as ss

    space = ss.get_space(space_name)
    return [(space_name, c, space.input_spec(c, batch_size=CANDIDATE_BATCH_SIZE, dtype=CANDIDATE_DTYPE))
            for c in sampled_configs(space, seed, count)]


def write_text(path: str | os.PathLike[str], text: str, flag: str = "--json") -> None:
    """Write a benchmark's output file through :func:`dippm_nas.files.write_output` (never a FIFO, a device or
    a half-written file); dippm-nas is imported here, when the file is written, so the timed imports of a
    benchmark stay its own."""
    from dippm_nas.errors import InvalidValueError
    from dippm_nas.files import write_output

    write_output(path, text, flag, error=InvalidValueError)
