"""Accel-NASBench: each CSV row an ``mbconv`` config at resolution 256, one row per GPU (A100 40GB, RTX 3090).

``latency_ms = batch / throughput * 1000``: the published throughput (images/s) as the time of one batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import search_spaces as ss
from dippm_nas.dataset.importers._csv import keyed, num, provenance, read_csv
from dippm_nas.dataset.importers._source import GraphRequest, ImportReport, Source, run_import
from dippm_nas.errors import DatasetError, SearchSpaceError
from dippm_nas.spec import InputSpec
from dippm_nas.units import MS_PER_S

__all__ = ["AccelNasBenchSource", "import_accel_nasbench", "ACCEL_NASBENCH_BATCH_SIZE", "ACCEL_NASBENCH_DEVICES"]

#: Batch size the Accel-NASBench throughput is taken to be measured at. The dataset's collection code
#: used 256 when GPU collection began (5 Jan 2023) and 128 from 25 Jan 2023; which rows used which is
#: not recorded (see /work/shared/docs/accel_nasbench_space.md, section 6).
ACCEL_NASBENCH_BATCH_SIZE = 256
#: CSV column prefix -> (device id, device description).
ACCEL_NASBENCH_DEVICES: dict[str, tuple[str, str]] = {
    "a100": ("a100-40gb", "NVIDIA A100 40GB (SXM4 or PCIe: not recorded)"),
    "3090": ("rtx-3090", "NVIDIA GeForce RTX 3090"),
}
_CONDITIONS: dict[str, Any] = {
    "input": "ImageNet-1k val (50,000 images) via FFCV, resized to 256x256, normalised on the GPU to float16, NCHW "
             "in channels_last memory",
    "resolution": 256,
    "autocast": "float16",
    "weights_dtype": "float32",
    "channels_last": True,
    "cudnn_benchmark": True,
    "framework": "PyTorch 1.12.0, torchvision 0.13.0; no TensorRT, torch.compile, CUDA graphs or BN folding",
    "timing": "CUDA events around each batch's forward only; 1 warm-up pass, then 2 measured passes (3 for some "
              "rows); throughput = ceil(50000/bs)*bs / pass time, mean over passes",
    "latency_formula": "latency_ms = batch_size / throughput_images_per_s * 1000 (one batch's forward, ms)",
    "latency_ms_std_formula": "batch_size * 1000 * throughput_std / throughput_mean**2 (first order; the "
                              "published std is np.std over the passes)",
    "batch_size_note": "the published rows were measured at batch 256 or 128, not recorded per row; "
                       "256 is assumed here (the size when GPU collection began)",
    "reference": "/work/shared/docs/accel_nasbench_space.md section 6",
}


@dataclass
class AccelNasBenchSource(Source):
    """Accel-NASBench throughput rows (``accel_nasbench_mnasnet_space_throughput.csv``) as a :class:`Source`."""

    path: str
    batch_size: int = ACCEL_NASBENCH_BATCH_SIZE
    graph_dtype: str = "float16"
    limit: int | None = None
    name: str = "accel-nasbench"
    table: ClassVar[str] = "measurements"

    def read(self) -> list[dict[str, str]]:
        cols = [*ss.ACCEL_NASBENCH_COLUMNS]
        for prefix in ACCEL_NASBENCH_DEVICES:
            cols += [f"throughput_{prefix}__throughput_mean", f"throughput_{prefix}__throughput_std"]
        return read_csv(self.path, cols, "Accel-NASBench", self.limit)

    def rows(self, records: list[dict[str, str]], report: ImportReport) -> list[dict[str, Any]]:
        out = []
        for key, r in keyed(records):
            try:
                config, error = ss.config_from_accel_nasbench_row(r, resolution=256), None
            except SearchSpaceError as e:
                config, error = None, f"row outside the mbconv space: {e}"
            for prefix, (dev, dev_name) in ACCEL_NASBENCH_DEVICES.items():
                row = self._row(r, prefix, dev, dev_name, config, error)
                row["row_key"] = f"{key}#{dev}#bs{self.batch_size}"
                out.append(row)
        return out

    def graph_request(self, row: dict[str, Any]) -> GraphRequest | None:
        if row["config"] is None:
            return None
        csv_key = row["row_key"].rsplit("#", 2)[0]  # both GPUs' rows of a CSV row share its graph
        return GraphRequest(csv_key, functools.partial(ss.build_model, "mbconv", row["config"]),
                            InputSpec(shape=(3, 256, 256), batch_size=self.batch_size, dtype=self.graph_dtype))

    def notes(self, report: ImportReport) -> list[str]:
        return [f"batch size assumed {self.batch_size}: the published rows used 256 or 128, not recorded per row"]

    def _row(self, r: dict[str, str], prefix: str, dev: str, dev_name: str, config: dict[str, Any] | None,
             config_error: str | None) -> dict[str, Any]:
        thr = num(r.get(f"throughput_{prefix}__throughput_mean"))
        thr_std = num(r.get(f"throughput_{prefix}__throughput_std"))
        published = {k: r.get(k) for k in ("mmacs", "mparams", "val_top1", "val_top5") if r.get(k)}
        row: dict[str, Any] = {
            "source": self.name, "space": "mbconv", "config": config, "batch_size": self.batch_size,
            "dtype": self.graph_dtype, "device": dev,
            "environment": {"device_name": dev_name, "provenance": provenance(r)},
            "conditions": {**_CONDITIONS, "batch_size_assumed": self.batch_size,
                           "throughput_images_per_s": thr, "throughput_images_per_s_std": thr_std},
            "extra": {"published": published},
        }
        if config is None:
            row.update(status="error", reason=config_error,
                       extra={"published": published, "columns": {c: r.get(c) for c in r if c.startswith("arch_")}})
            return row
        if thr is None or thr <= 0:
            column = f"throughput_{prefix}__throughput_mean"
            row.update(status="error", reason=f"no {dev_name} throughput published for this row "
                                              f"({column} = {r.get(column)!r})")
            return row
        row["latency_ms"] = self.batch_size / thr * MS_PER_S
        if thr_std is not None and thr_std >= 0:
            row["latency_ms_std"] = self.batch_size * MS_PER_S * thr_std / thr**2
        row["status"] = "ok"
        return row


def import_accel_nasbench(
    csv_path: str | Path,
    out: str | Path,
    *,
    batch_size: int = ACCEL_NASBENCH_BATCH_SIZE,
    graph_dtype: str = "float16",
    capture_graphs: bool = True,
    workers: int = 2,
    cache: Any = True,
    limit: int | None = None,
    chunk_size: int = 200,
    progress: bool = True,
) -> ImportReport:
    """Import Accel-NASBench rows: graph through the MBConv space + A100 and RTX 3090 latency per batch.

    Each row's architecture columns become an ``mbconv`` config at resolution 256 (the throughput
    runs' input side); its graph is captured at ``batch_size`` with ``graph_dtype`` (float16, as the
    autocast forward computed). For each GPU the published throughput (images/s) becomes the latency
    of one batch, ``latency_ms = batch_size / throughput * 1000``, labelled with its conditions (FP16
    autocast, channels_last, cudnn.benchmark, PyTorch 1.12, A100 40GB or RTX 3090). The published
    batch size is 256 or 128 and not recorded per row; ``batch_size`` (default 256) is the assumption,
    stored in ``conditions``.

    Args:
        csv_path: ``accel_nasbench_mnasnet_space_throughput.csv`` (or a file with its columns).
        out: dataset SQLite file (created or extended).
        batch_size: the assumed batch size of the throughput runs (256 or 128).
        graph_dtype: dtype of the captured graph's input spec.
        capture_graphs: capture graphs (``False``: rows only, without graphs).
        workers: conversion processes.
        cache: conversion cache for capture (``True``: the default cache).
        limit: import only the first ``limit`` rows.
        chunk_size: rows per transaction (a killed import resumes at the first unfinished chunk).
        progress: progress bars.

    Returns:
        An :class:`ImportReport`.

    Raises:
        DatasetError: missing file or columns, a bad ``batch_size``.
    """
    if batch_size not in (128, 256):
        raise DatasetError(f"batch_size must be 128 or 256 (the sizes Accel-NASBench used), got {batch_size!r}")
    source = AccelNasBenchSource(str(csv_path), batch_size=batch_size, graph_dtype=graph_dtype, limit=limit)
    # two dataset rows (one per GPU) per CSV row: a chunk of CSV rows is twice as many dataset rows
    return run_import(source, out, capture=capture_graphs, workers=workers, cache=cache,
                      chunk_size=chunk_size * len(ACCEL_NASBENCH_DEVICES), progress=progress)
