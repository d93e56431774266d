"""ryujaehun/pytorch-gpu-benchmark: per-iteration eager PyTorch timings of torchvision CNNs at batch 12
(RTX 2080 Ti, TITAN RTX, TITAN Xp; half / float / double), one row per (GPU, precision, model)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dippm_nas.dataset.importers._csv import device_id, int_or_none, num, provenance, read_csv
from dippm_nas.dataset.importers._source import (
    GraphRequest,
    ImportReport,
    Source,
    rows_without_graphs_note,
    run_import,
    should_capture,
)
from dippm_nas.spec import InputSpec

__all__ = ["RyujaehunSource", "import_ryujaehun", "RYUJAEHUN_HOSTS"]

_REQUIRED = ("gpu", "precision", "mode", "model", "batch_size", "input_shape", "iteration", "latency_ms")
_PRECISION = {"half": "float16", "float": "float32", "double": "float64"}
#: The host of each GPU of the ryujaehun/pytorch-gpu-benchmark runs, from the upstream
#: ``results/*/system_info.txt`` files (as PROVENANCE.md of the shared data quotes them): logical CPUs,
#: maximum CPU clock, CUDA and cuDNN versions. The CPU models are not recorded upstream.
RYUJAEHUN_HOSTS: dict[str, dict[str, Any]] = {
    "GeForce RTX 2080 Ti": {"logical_cpus": 24, "clock_ghz": 3.7, "cuda": "10.0", "cudnn": "7.6.0", "date": "2020-01"},
    "TITAN Xp": {"logical_cpus": 20, "clock_ghz": 2.2, "cuda": "10.2", "cudnn": "7.6.5", "date": "2021-01"},
    "TITAN RTX": {"logical_cpus": 96, "clock_ghz": 2.2, "cuda": "10.2", "cudnn": "7.6.5", "date": "2021-01"},
}
#: One run: (GPU, precision, mode, model, batch size, input shape), as the CSV spells them.
_Group = tuple[str, str, str, str, str, str]


@dataclass
class RyujaehunSource(Source):
    """The ryujaehun per-iteration timings as a :class:`Source`: the iterations of one run become one row, the
    median iteration its ``latency_ms``. ``capture_graphs`` is the importer's argument, for the note."""

    path: str
    limit: int | None = None
    capture_graphs: bool | None = None
    name: str = "ryujaehun"
    table: ClassVar[str] = "measurements"

    def read(self) -> list[dict[str, str]]:
        return read_csv(self.path, _REQUIRED, "ryujaehun benchmark", self.limit)

    def rows(self, records: list[dict[str, str]], report: ImportReport) -> list[dict[str, Any]]:
        groups: dict[_Group, list[float]] = {}
        where: dict[_Group, dict[str, str]] = {}
        bad: dict[_Group, str] = {}
        for r in records:
            k = (r["gpu"].strip(), r["precision"].strip(), r["mode"].strip(), r["model"].strip(),
                 r["batch_size"].strip(), r["input_shape"].strip())
            where.setdefault(k, provenance(r))
            v = num(r["latency_ms"])
            if v is None or v <= 0:
                bad[k] = f"latency_ms={r['latency_ms']!r} is not a positive number"
                continue
            groups.setdefault(k, []).append(v)
        return [_row(k, groups.get(k, []), where[k], bad.get(k)) for k in sorted(set(groups) | set(bad))]

    def graph_request(self, row: dict[str, Any]) -> GraphRequest | None:
        if row["status"] != "ok":
            return None
        spec, shape = row["conditions"]["model_spec"], tuple(row["config"]["input_shape"])
        return GraphRequest((spec, shape, row["batch_size"], row["dtype"]), spec,
                            InputSpec(shape=shape, batch_size=row["batch_size"], dtype=row["dtype"]))

    def notes(self, report: ImportReport) -> list[str]:
        return rows_without_graphs_note(report, self.capture_graphs, "torchvision")


def _row(k: _Group, times: list[float], where: dict[str, str], bad: str | None) -> dict[str, Any]:
    """The row of run ``k`` from its timed iterations (``bad``: why an iteration was not a time)."""
    gpu, precision, mode, model, batch, shape = k
    host = RYUJAEHUN_HOSTS.get(gpu, {})
    dtype = _PRECISION.get(precision)
    b = int_or_none(batch)
    dims = tuple(int(x) for x in shape.split("x")) if re.fullmatch(r"\d+(x\d+)*", shape) else None
    conditions: dict[str, Any] = {
        "precision": precision, "mode": mode, "runtime": "eager", "input_copy": True,
        "framework": "torch-1", "cudnn_benchmark": True, "host": dict(host),
        "latency_formula": "latency_ms = median over the timed iterations of one forward pass "
                           "(synchronize; model(img.to('cuda')); synchronize), warm-up dropped upstream",
        "model_spec": f"torchvision:{model}",
    }
    row: dict[str, Any] = {
        "source": "ryujaehun", "row_key": "#".join(k), "space": "torchvision",
        "config": {"model": model, "input_shape": list(dims) if dims else shape},
        "batch_size": b, "dtype": dtype, "device": device_id(gpu),
        "environment": {"device_name": gpu, "provenance": where,
                        "host_clock_ghz": host.get("clock_ghz"), "host_logical_cpus": host.get("logical_cpus"),
                        "cuda": host.get("cuda"), "cudnn": host.get("cudnn")},
        "conditions": conditions, "extra": {},
    }
    if mode != "inference":
        row.update(status="error", reason=f"mode {mode!r} is not inference")
    elif dtype is None:
        row.update(status="error", reason=f"unknown precision {precision!r}; known: {sorted(_PRECISION)}")
    elif not times or b is None or dims is None:
        row.update(status="error", reason=bad or f"no timed iteration, batch {batch!r} or shape {shape!r}")
    else:
        qs = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
        mean = statistics.fmean(times)
        conditions.update(iterations=len(times), latency_ms_p10=qs[0], latency_ms_p90=qs[-1],
                          latency_cv=(statistics.pstdev(times) / mean) if mean > 0 else None)
        row.update(status="ok", latency_ms=statistics.median(times))
    return row


def import_ryujaehun(
    csv_path: str | Path,
    out: str | Path,
    *,
    capture_graphs: bool | None = None,
    workers: int = 2,
    cache: Any = True,
    limit: int | None = None,
    progress: bool = True,
) -> ImportReport:
    """Import per-iteration eager PyTorch timings of torchvision CNNs (ryujaehun/pytorch-gpu-benchmark).

    One measurement row per (GPU, precision, model): ``latency_ms`` is the median of the timed
    iterations (each ``synchronize; model(img.to('cuda')); synchronize``, so it includes the input's
    host-to-device copy); the conditions keep the iteration count, the 10th/90th percentiles and
    coefficient of variation, the execution runtime (``"eager"``), ``input_copy`` (True), the
    framework generation (``"torch-1"``: PyTorch 1.x with CUDA 10) and the host facts of
    :data:`RYUJAEHUN_HOSTS`. Graphs are captured as ``torchvision:NAME`` at the row's batch and dtype
    (``half`` -> float16, ``float`` -> float32, ``double`` -> float64) when torchvision is importable.

    Args:
        csv_path: ``ryujaehun_torchvision_eager_bs12_turing_pascal.csv`` (or a file with its columns).
        out: dataset SQLite file.
        capture_graphs: ``None``: capture when torchvision is importable; ``True``: capture (raises
            without torchvision); ``False``: never.
        workers, cache, limit, progress: as in :func:`import_accel_nasbench` (``limit`` counts CSV rows).

    Raises:
        DatasetError: missing file or columns. MissingDependencyError: ``capture_graphs=True`` without torchvision.
    """
    capture = should_capture(capture_graphs, "torchvision", "capturing the graphs of the ryujaehun benchmark rows")
    source = RyujaehunSource(str(csv_path), limit=limit, capture_graphs=capture_graphs)
    return run_import(source, out, capture=capture, workers=workers, cache=cache, progress=progress)
