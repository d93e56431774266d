"""Importers: public GPU measurements (``../shared/data``) into the dataset format.

Every imported row keeps its provenance (``source_repo``, ``commit``, ``source_file``) in
``environment`` and what its figure means in ``conditions``. Rows are keyed by their place in the
public data (``row_key``), so importing a file twice, or resuming a killed import, adds nothing twice.
A row whose figure is missing in the source is stored with ``status="error"`` and the reason, never
dropped; operator-level cells that were never profiled are counted in the report.

- :func:`import_accel_nasbench`: each CSV row -> an ``mbconv`` config at resolution 256
  (:func:`search_spaces.config_from_accel_nasbench_row`), its graph captured at batch 256, and one
  measurement row per GPU (A100 40GB, RTX 3090): ``latency_ms = batch / throughput * 1000``.
- :func:`import_timm`: timm ``benchmark-infer`` rows (model, GPU, batch, samples/s, step time, precision,
  layout, compile flag); graphs captured only when timm is importable.
- :func:`import_neusight`: NeuSight operator microbenchmarks, or its per-FX-node latencies, as
  ``op_measurements`` rows.
- :func:`import_vidur`: Vidur per-operator LLM-layer time stats as ``op_measurements`` rows.
- :func:`import_ryujaehun`: per-iteration eager PyTorch timings of torchvision CNNs at batch 12
  (RTX 2080 Ti, TITAN RTX, TITAN Xp; half / float / double) -> one row per (GPU, precision, model)
  with the median iteration as ``latency_ms`` and the execution conditions the host model needs.
- :func:`import_campaign`: the rows of a ``dippm-nas gpu-campaign`` directory (measured on a GPU machine
  without TVM), their graphs captured here from the SPEC string and input spec each row records.
"""

from __future__ import annotations

import ast
import csv
import functools
import importlib.util
import json
import logging
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dippm_nas._numbers import as_int
from dippm_nas._optional import require
from dippm_nas.capture import capture_many
from dippm_nas.errors import DatasetError, SearchSpaceError
from dippm_nas.dataset._store import DatasetStore
from dippm_nas.measure import CAMPAIGN_SOURCE, read_campaign_rows
from dippm_nas.spec import InputSpec
from dippm_nas.units import MS_PER_S
import search_spaces as ss

__all__ = [
    "ImportReport",
    "import_accel_nasbench",
    "import_timm",
    "import_neusight",
    "import_vidur",
    "import_ryujaehun",
    "RYUJAEHUN_HOSTS",
    "import_campaign",
    "device_id",
    "ACCEL_NASBENCH_BATCH_SIZE",
    "ACCEL_NASBENCH_DEVICES",
]

logger = logging.getLogger(__name__)

PROVENANCE_COLUMNS = ("source_repo", "commit", "source_file")

#: Batch size the Accel-NASBench throughput is taken to be measured at. The dataset's collection code
#: used 256 when GPU collection began (5 Jan 2023) and 128 from 25 Jan 2023; which rows used which is
#: not recorded (see /work/shared/docs/accel_nasbench_space.md, section 6).
ACCEL_NASBENCH_BATCH_SIZE = 256
#: CSV column prefix -> (device id, device description).
ACCEL_NASBENCH_DEVICES: dict[str, tuple[str, str]] = {
    "a100": ("a100-40gb", "NVIDIA A100 40GB (SXM4 or PCIe: not recorded)"),
    "3090": ("rtx-3090", "NVIDIA GeForce RTX 3090"),
}
_ACCEL_CONDITIONS: dict[str, Any] = {
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

_TIMM_REQUIRED = ("gpu", "precision", "memory_layout", "torch_version_tag", "cuda_tag", "torch_compile", "model",
                  "infer_img_size", "infer_batch_size", "infer_samples_per_sec", "infer_step_time")
#: timm ``precision`` -> (dtype, autocast?)
_TIMM_PRECISION: dict[str, tuple[str, bool]] = {
    "amp": ("float16", True), "amp_bf16": ("bfloat16", True), "bf16": ("bfloat16", False),
    "fp16": ("float16", False), "float16": ("float16", False), "fp32": ("float32", False),
    "float32": ("float32", False), "tf32": ("float32", False),
}
#: ``torch_version_tag`` values of the timm runs that timed the reparameterised (fused) form of each model,
#: i.e. ran ``benchmark.py --reparam``. Evidence: on the same RTX 4090 the pt291 run is faster than the
#: pt240 run by a family median of 1.4-2.3x for MobileOne, FastViT, RepVGG, RepGhost and RepViT, while the
#: median over all 1,442 models is 1.015 and most families lie within 0.95-1.07x; and the pt291 labels lie
#: near the analytic prior of the fused graph (``benchmarks/timm_reparam_labels.py``). Runs with other
#: tags timed the model as ``timm.create_model`` builds it.
_TIMM_REPARAM_TAGS = frozenset({"pt291"})
_NEUSIGHT_REQUIRED = ("OPName", "Latency", "Device")
#: NeuSight microbenchmark dimension columns -> our names (``Kernel_Szie`` is the source's spelling).
_NEUSIGHT_DIMS = {"B": "B", "H": "H", "M": "M", "N": "N", "K": "K", "Input_Channel": "in_channels",
                  "Output_Channel": "out_channels", "Kernel_Szie": "kernel_size", "Input_Size": "input_size",
                  "Stride": "stride", "Padding": "padding"}
_NEUSIGHT_EXTRA = {"Kernel Name": "kernel_name", "Kernels": "kernels", "Warps per SM": "warps_per_sm",
                   "Blocks per SM": "blocks_per_sm", "Grid x": "grid_x", "Grid y": "grid_y", "Grid z": "grid_z",
                   "Block x": "block_x", "Block y": "block_y", "Block z": "block_z",
                   "Torch Version": "torch_version", "CUDNN Version": "cudnn_version", "CUDA Version": "cuda_version"}
_NEUSIGHT_FX_REQUIRED = ("device", "trace", "node_index", "op", "target", "input_shapes", "output_shape", "latency")
_VIDUR_REQUIRED = ("gpu", "model", "num_tokens")
_VIDUR_DIMS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
               "num_tensor_parallel_workers")
#: Device names that a simple slug does not turn into the registry's id.
_RYUJAEHUN_REQUIRED = ("gpu", "precision", "mode", "model", "batch_size", "input_shape", "iteration", "latency_ms")
_RYUJAEHUN_PRECISION = {"half": "float16", "float": "float32", "double": "float64"}
#: The host of each GPU of the ryujaehun/pytorch-gpu-benchmark runs, from the upstream
#: ``results/*/system_info.txt`` files (as PROVENANCE.md of the shared data quotes them): logical CPUs,
#: maximum CPU clock, CUDA and cuDNN versions. The CPU models are not recorded upstream.
RYUJAEHUN_HOSTS: dict[str, dict[str, Any]] = {
    "GeForce RTX 2080 Ti": {"logical_cpus": 24, "clock_ghz": 3.7, "cuda": "10.0", "cudnn": "7.6.0", "date": "2020-01"},
    "TITAN Xp": {"logical_cpus": 20, "clock_ghz": 2.2, "cuda": "10.2", "cudnn": "7.6.5", "date": "2021-01"},
    "TITAN RTX": {"logical_cpus": 96, "clock_ghz": 2.2, "cuda": "10.2", "cudnn": "7.6.5", "date": "2021-01"},
}
_DEVICE_ALIASES = {"a100-80gb-pcie": "a100-pcie-80gb", "a100-40gb-pcie": "a100-pcie-40gb"}


@dataclass
class ImportReport:
    """What an importer did.

    Attributes:
        source: the ``source`` column value of the rows (``accel-nasbench``, ``timm``...).
        csv: the file read.
        out: the dataset file written.
        rows_read: CSV rows read (after ``limit``).
        inserted: measurement (or operator) rows written by this run.
        already_present: rows skipped because an earlier import stored them.
        failed_rows: rows stored with ``status != "ok"`` (the source has no figure; reason stored).
        graphs_captured / graphs_failed: graph captures of this run that succeeded / failed (the
            row is stored without a graph, the error in ``extra["graph_error"]``).
        graphs_skipped: rows stored without a graph because capture was off or timm is missing.
        cells_missing: operator cells the source never profiled (not rows; counted only).
        seconds: wall time.
        notes: what the caller should know (assumptions, skips).
    """

    source: str
    csv: str
    out: str
    rows_read: int = 0
    inserted: int = 0
    already_present: int = 0
    failed_rows: int = 0
    graphs_captured: int = 0
    graphs_failed: int = 0
    graphs_skipped: int = 0
    cells_missing: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- helpers
def _read_csv(path: str | Path, required: Sequence[str], what: str, limit: int | None) -> list[dict[str, str]]:
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{what} CSV {str(p)!r} does not exist")
    if limit is not None:
        limit = as_int(limit, "limit", low=1, error=DatasetError, or_none=True)
    with open(p, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise DatasetError(f"{what} CSV {p.name!r} lacks the columns {missing}; it has {header}")
        rows = []
        for i, r in enumerate(reader):
            if limit is not None and i >= limit:
                break
            rows.append(r)
    return rows


def _provenance(row: dict[str, str]) -> dict[str, str]:
    return {c: row[c] for c in PROVENANCE_COLUMNS if row.get(c)}


def _keyed(rows: list[dict[str, str]]) -> list[tuple[str, dict[str, str]]]:
    """``(key, row)``: the source file and the row's index among that file's rows (stable)."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        sf = r.get("source_file") or "?"
        i = seen.get(sf, 0)
        seen[sf] = i + 1
        out.append((f"{sf}#{i}", r))
    return out


def _num(text: str | None) -> float | None:
    """A finite float from a CSV cell, ``None`` for an empty or non-numeric cell."""
    if text is None or not str(text).strip():
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _int_or_none(text: str | None) -> int | None:
    v = _num(text)
    if v is None or v != int(v):
        return None
    return int(v)


def _dim_value(text: str) -> Any:
    v = _num(text)
    if v is None:
        return text
    return int(v) if v == int(v) else v


def device_id(name: str) -> str:
    """A device id from a published GPU name: ``"NVIDIA GeForce RTX 3090"`` -> ``"rtx-3090"``,
    ``"NVIDIA A100-PCIE-40GB"`` -> ``"a100-pcie-40gb"`` (the registry's ids where they exist)."""
    s = name.strip().lower().replace("_", " ")
    s = re.sub(r"^nvidia\s+", "", s)
    s = re.sub(r"^geforce\s+", "", s)
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return _DEVICE_ALIASES.get(s, s)


def _chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def _should_capture(capture_graphs: bool | None, module: str, what: str) -> bool:
    """Whether an importer captures graphs: ``None`` when ``module`` is importable, ``True`` always (raising
    without it), ``False`` never."""
    if capture_graphs is True:
        require(module, "vision", what)
        return True
    return _module_available(module) if capture_graphs is None else False


def _module_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _note_rows_without_graphs(report: ImportReport, capture_graphs: bool | None, module: str) -> None:
    """Warn about, and record in the report, rows stored without graphs."""
    if not report.graphs_skipped:
        return
    msg = (f"{report.graphs_skipped} {report.source} rows stored without graphs: "
           + (f"{module} is not installed (pip install 'dippm-nas[vision]')" if capture_graphs is None
              else "graph capture was turned off"))
    logger.warning(msg)
    report.notes.append(msg)


def _finished(report: ImportReport, t0: float, what: str) -> ImportReport:
    """``report`` with the seconds since ``t0`` (``time.perf_counter``), logged as ``what``'s import."""
    report.seconds = time.perf_counter() - t0
    logger.info("%s import: %s", what, report.as_dict())
    return report


def _attach_graphs(report: ImportReport, built: list[dict[str, Any]], captured: Mapping[Any, Any] | None,
                   graph_key: Callable[[dict[str, Any]], Any], space: str) -> list[tuple[Any, str, Any]]:
    """Give each ``ok`` row of ``built`` its captured graph (``captured[graph_key(row)]``, a capture result):
    its ``graph_hash``, or ``extra["graph_error"]`` when the capture failed. Counts failed rows, and rows
    left without a graph when ``captured`` is ``None`` (capture off), in ``report``. The ``(graph, space,
    config)`` triples to store with the rows."""
    graphs: list[tuple[Any, str, Any]] = []
    for row in built:
        if row["status"] != "ok":
            report.failed_rows += 1
            continue
        if captured is None:
            report.graphs_skipped += 1
            continue
        res = captured[graph_key(row)]
        if res.graph is not None:
            row["graph_hash"] = res.graph.structural_hash()
            graphs.append((res.graph, space, row["config"]))
        else:
            row["extra"]["graph_error"] = res.error
    return graphs


def _capture(items: list[tuple[Any, InputSpec]], workers: int, cache: Any, progress: bool) -> list[Any]:
    return capture_many(items, workers=workers, cache=cache, progress=progress) if items else []


# ---------------------------------------------------------------------------- Accel-NASBench
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
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    if batch_size not in (128, 256):
        raise DatasetError(f"batch_size must be 128 or 256 (the sizes Accel-NASBench used), got {batch_size!r}")
    cols = [*ss.ACCEL_NASBENCH_COLUMNS]
    for prefix in ACCEL_NASBENCH_DEVICES:
        cols += [f"throughput_{prefix}__throughput_mean", f"throughput_{prefix}__throughput_std"]
    rows = _read_csv(csv_path, cols, "Accel-NASBench", limit)
    source = "accel-nasbench"
    report = ImportReport(source=source, csv=str(csv_path), out=str(out), rows_read=len(rows))
    report.notes.append(f"batch size assumed {batch_size}: the published rows used 256 or 128, not recorded per row")
    store = DatasetStore(out)
    try:
        present = store.row_keys(source)
        todo = []
        for key, r in _keyed(rows):
            keys = {p: f"{key}#{dev}#bs{batch_size}" for p, (dev, _) in ACCEL_NASBENCH_DEVICES.items()}
            if all(k in present for k in keys.values()):
                report.already_present += len(keys)
                continue
            todo.append((keys, r))
        bar = tqdm(total=len(todo), desc="accel-nasbench", unit="row", disable=not progress)
        for part in _chunks(todo, chunk_size):
            configs: list[dict[str, Any] | None] = []
            errors: list[str | None] = []
            for _keys, r in part:
                try:
                    configs.append(ss.config_from_accel_nasbench_row(r, resolution=256))
                    errors.append(None)
                except SearchSpaceError as e:
                    configs.append(None)
                    errors.append(f"row outside the mbconv space: {e}")
            graphs: list[Any] = [None] * len(part)
            graph_errors: list[str | None] = [None] * len(part)
            if capture_graphs:
                idx = [i for i, c in enumerate(configs) if c is not None]
                items = [(functools.partial(ss.build_model, "mbconv", configs[i]),
                          InputSpec(shape=(3, 256, 256), batch_size=batch_size, dtype=graph_dtype)) for i in idx]
                for i, res in zip(idx, _capture(items, workers, cache, progress=False)):
                    graphs[i] = res.graph
                    graph_errors[i] = res.error
                    if res.graph is not None:
                        report.graphs_captured += 1
                    else:
                        report.graphs_failed += 1
            out_rows, out_graphs = [], []
            for i, (keys, r) in enumerate(part):
                g = graphs[i]
                if g is not None:
                    out_graphs.append((g, "mbconv", configs[i]))
                elif errors[i] is None and not capture_graphs:
                    report.graphs_skipped += len(keys)
                for prefix, (dev, dev_name) in ACCEL_NASBENCH_DEVICES.items():
                    if keys[prefix] in present:
                        report.already_present += 1
                        continue
                    row = _accel_row(r, prefix, dev, dev_name, batch_size, graph_dtype, configs[i], errors[i])
                    row["row_key"] = keys[prefix]
                    row["graph_hash"] = g.structural_hash() if g is not None else None
                    if graph_errors[i]:
                        row["extra"]["graph_error"] = graph_errors[i]
                    if row["status"] != "ok":
                        report.failed_rows += 1
                    out_rows.append(row)
            report.inserted += store.add_measurements(out_rows, graphs=out_graphs)
            bar.update(len(part))
        bar.close()
    finally:
        store.close()
    return _finished(report, t0, "accel-nasbench")


def _accel_row(r: dict[str, str], prefix: str, dev: str, dev_name: str, batch_size: int, graph_dtype: str,
               config: dict[str, Any] | None, config_error: str | None) -> dict[str, Any]:
    thr = _num(r.get(f"throughput_{prefix}__throughput_mean"))
    thr_std = _num(r.get(f"throughput_{prefix}__throughput_std"))
    published = {k: r.get(k) for k in ("mmacs", "mparams", "val_top1", "val_top5") if r.get(k)}
    row: dict[str, Any] = {
        "source": "accel-nasbench", "space": "mbconv", "config": config, "batch_size": batch_size,
        "dtype": graph_dtype, "device": dev,
        "environment": {"device_name": dev_name, "provenance": _provenance(r)},
        "conditions": {**_ACCEL_CONDITIONS, "batch_size_assumed": batch_size,
                       "throughput_images_per_s": thr, "throughput_images_per_s_std": thr_std},
        "extra": {"published": published},
    }
    if config is None:
        row.update(status="error", reason=config_error,
                   extra={"published": published, "columns": {c: r.get(c) for c in r if c.startswith("arch_")}})
        return row
    if thr is None or thr <= 0:
        row.update(status="error", reason=f"no {dev_name} throughput published for this row "
                                          f"(throughput_{prefix}__throughput_mean = {r.get(f'throughput_{prefix}__throughput_mean')!r})")
        return row
    row["latency_ms"] = batch_size / thr * MS_PER_S
    if thr_std is not None and thr_std >= 0:
        row["latency_ms_std"] = batch_size * MS_PER_S * thr_std / thr**2
    row["status"] = "ok"
    return row


# ---------------------------------------------------------------------------- timm


def import_timm(
    csv_path: str | Path,
    out: str | Path,
    *,
    capture_graphs: bool | None = None,
    workers: int = 2,
    cache: Any = True,
    limit: int | None = None,
    chunk_size: int = 200,
    progress: bool = True,
) -> ImportReport:
    """Import timm ``benchmark-infer`` rows (model, GPU, batch, samples/s, step time, precision,
    layout, compile flag) as measurement rows; capture their graphs when timm can build the model.

    ``latency_ms`` is the published ``infer_step_time`` (ms per batch); ``conditions`` keep the
    samples/s, precision (``amp`` = float16 autocast, ``amp_bf16`` = bfloat16 autocast, ``bf16`` =
    bfloat16 weights), memory layout, ``torch.compile`` flag, torch/CUDA tags, GMACs and params, and
    the form of the model that was timed (``model_form``, ``model_spec``): runs tagged ``pt291`` timed
    timm's reparameterised model (``benchmark.py --reparam``), so their graphs are captured from
    ``timm-reparam:NAME``; the other runs timed ``timm:NAME`` as built. A row
    without a published result (the model did not run at that setting) is stored with
    ``status="error"`` and the reason.

    Args:
        csv_path: ``timm_benchmark_infer_gpu.csv`` (or a file with its columns).
        out: dataset SQLite file.
        capture_graphs: ``None`` (default): capture when timm is importable, else store rows without
            graphs and log how many; ``True``: capture (raises without timm); ``False``: never.
        workers, cache, limit, chunk_size, progress: as in :func:`import_accel_nasbench`.

    Raises:
        DatasetError: missing file or columns. MissingDependencyError: ``capture_graphs=True`` without timm.
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    rows = _read_csv(csv_path, _TIMM_REQUIRED, "timm benchmark", limit)
    source = "timm"
    report = ImportReport(source=source, csv=str(csv_path), out=str(out), rows_read=len(rows))
    do_capture = _should_capture(capture_graphs, "timm", "capturing the graphs of timm benchmark rows")
    store = DatasetStore(out)
    try:
        present = store.row_keys(source)
        todo = []
        for _k, r in _keyed(rows):
            key = "#".join([r.get("source_file") or "?", r["gpu"], r["precision"], r["memory_layout"],
                            r["torch_compile"], r["model"], r["infer_img_size"]])
            if key in present:
                report.already_present += 1
            else:
                todo.append((key, r))
        captured: dict[tuple[str, int, int, str], Any] = {}
        bar = tqdm(total=len(todo), desc="timm", unit="row", disable=not progress)
        for part in _chunks(todo, chunk_size):
            built = [_timm_row(key, r) for key, r in part]
            if do_capture:
                want = []
                for row in built:
                    if row["status"] == "ok":
                        gk = _timm_graph_key(row)
                        if gk not in captured and gk not in want:
                            want.append(gk)
                items = [(spec, InputSpec(shape=(3, img, img), batch_size=b, dtype=dt)) for spec, img, b, dt in want]
                for gk, res in zip(want, _capture(items, workers, cache, progress=False)):
                    captured[gk] = res
                    if res.graph is not None:
                        report.graphs_captured += 1
                    else:
                        report.graphs_failed += 1
            graphs = _attach_graphs(report, built, captured if do_capture else None, _timm_graph_key, "timm")
            report.inserted += store.add_measurements(built, graphs=graphs)
            bar.update(len(part))
        bar.close()
    finally:
        store.close()
    _note_rows_without_graphs(report, capture_graphs, "timm")
    return _finished(report, t0, "timm")


def _timm_graph_key(row: dict[str, Any]) -> tuple[str, int, int, str]:
    """(model SPEC, image size, batch, dtype) of the graph a timm row's label belongs to."""
    return (row["conditions"]["model_spec"], row["config"]["img_size"], row["batch_size"], row["dtype"])


def _timm_row(key: str, r: dict[str, str]) -> dict[str, Any]:
    reparam = r["torch_version_tag"].strip() in _TIMM_REPARAM_TAGS
    precision = r["precision"].strip()
    dtype, autocast = _TIMM_PRECISION.get(precision, (None, None))
    img = _int_or_none(r["infer_img_size"])
    batch = _int_or_none(r["infer_batch_size"])
    step_ms = _num(r["infer_step_time"])
    sps = _num(r["infer_samples_per_sec"])
    conditions = {
        "precision": precision, "autocast": autocast, "memory_layout": r["memory_layout"],
        "torch_compile": r["torch_compile"], "torch_version_tag": r["torch_version_tag"],
        "cuda_tag": r["cuda_tag"], "infer_samples_per_sec": sps,
        "infer_gmacs": _num(r.get("infer_gmacs")), "infer_macts_m": _num(r.get("infer_macts")),
        "param_count_m": _num(r.get("param_count")),
        "latency_formula": "latency_ms = infer_step_time (ms per batch, as published)",
        "batch_size_note": "timm benchmarks each model at the largest batch that fits (mostly 1024)",
        "model_form": "reparameterized" if reparam else "as built",
        "model_spec": f"timm-reparam:{r['model']}" if reparam else f"timm:{r['model']}",
        "model_form_note": ("this run timed the model after timm's reparameterize_model (benchmark.py --reparam; "
                            "judged from the run's speed-ups on fusable models); the graph is captured the same way"
                            if reparam else "this run timed the model as timm.create_model builds it"),
    }
    row: dict[str, Any] = {
        "source": "timm", "row_key": key, "space": "timm", "config": {"model": r["model"], "img_size": img},
        "batch_size": batch, "dtype": dtype, "device": device_id(r["gpu"]),
        "environment": {"device_name": r["gpu"], "provenance": _provenance(r)}, "conditions": conditions,
        "extra": {},
    }
    if step_ms is None or step_ms <= 0 or batch is None or img is None:
        row.update(status="error", reason="the published benchmark has no result for this model at this setting "
                   f"(infer_step_time={r['infer_step_time']!r}, infer_batch_size={r['infer_batch_size']!r})")
        return row
    if dtype is None:
        row.update(status="error", reason=f"unknown timm precision {precision!r}; known: {sorted(_TIMM_PRECISION)}")
        return row
    row.update(status="ok", latency_ms=step_ms)
    return row


# ---------------------------------------------------------------------------- NeuSight
def import_neusight(csv_path: str | Path, out: str | Path, *, limit: int | None = None,
                    progress: bool = True) -> ImportReport:
    """Import NeuSight operator rows into ``op_measurements``.

    Two layouts are recognised by their header: the A100 operator microbenchmarks (``OPName``,
    ``Latency`` (ms), ``Device``, dims ``B, H, M, N, K, Input_Channel, Output_Channel, Kernel_Szie,
    Input_Size, Stride, Padding``, kernel and launch figures) -> source ``neusight``; and the per-FX-node
    latencies (``device``, ``trace``, ``node_index``, ``op``, ``target``, ``input_shapes``,
    ``output_shape``, ``latency``; ``fw_latency`` where ``latency`` is empty) -> source ``neusight-fx``.
    Both fp32 (PyTorch 2.1) unless the row says.

    Raises:
        DatasetError: missing file, or a header of neither layout.
    """
    p = Path(csv_path)
    if not p.is_file():
        raise DatasetError(f"NeuSight CSV {str(p)!r} does not exist")
    with open(p, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    if all(c in header for c in _NEUSIGHT_REQUIRED):
        return _import_neusight_micro(p, out, limit, progress)
    if all(c in header for c in _NEUSIGHT_FX_REQUIRED):
        return _import_neusight_fx(p, out, limit, progress)
    raise DatasetError(
        f"NeuSight CSV {p.name!r} has neither the microbenchmark columns {list(_NEUSIGHT_REQUIRED)} nor the FX-node "
        f"columns {list(_NEUSIGHT_FX_REQUIRED)}; it has {header}"
    )


def _write_ops(store: DatasetStore, report: ImportReport, rows: list[dict[str, Any]], present: set[str]) -> None:
    fresh = [r for r in rows if r["row_key"] not in present]
    report.already_present += len(rows) - len(fresh)
    for part in _chunks(fresh, 5000):
        report.inserted += store.add_op_rows(part)


def _import_neusight_micro(p: Path, out: str | Path, limit: int | None, progress: bool) -> ImportReport:
    t0 = time.perf_counter()
    rows = _read_csv(p, _NEUSIGHT_REQUIRED, "NeuSight microbenchmark", limit)
    report = ImportReport(source="neusight", csv=str(p), out=str(out), rows_read=len(rows))
    ops = []
    for key, r in _keyed(rows):
        lat = _num(r["Latency"])
        if lat is None:
            report.cells_missing += 1
            continue
        dims = {ours: _dim_value(r[c]) for c, ours in _NEUSIGHT_DIMS.items() if r.get(c, "").strip()}
        extra = {ours: _dim_value(r[c]) for c, ours in _NEUSIGHT_EXTRA.items() if r.get(c, "").strip()}
        extra.update(device_name=r["Device"], provenance=_provenance(r))
        ops.append({"source": "neusight", "row_key": key, "device": device_id(r["Device"]), "op": r["OPName"],
                    "dims": dims, "dtype": "float32", "latency_ms": lat, "latency_ms_std": None, "extra": extra})
    with DatasetStore(out) as store:
        _write_ops(store, report, ops, store.row_keys("neusight", "op_measurements"))
    if report.cells_missing:
        report.notes.append(f"{report.cells_missing} rows without a Latency value were not stored")
    return _finished(report, t0, "neusight")


def _parse_shapes(text: str) -> Any:
    try:
        return ast.literal_eval(text) if text.strip() else None
    except (ValueError, SyntaxError):
        return text


def _import_neusight_fx(p: Path, out: str | Path, limit: int | None, progress: bool) -> ImportReport:
    t0 = time.perf_counter()
    rows = _read_csv(p, _NEUSIGHT_FX_REQUIRED, "NeuSight FX-node", limit)
    report = ImportReport(source="neusight-fx", csv=str(p), out=str(out), rows_read=len(rows))
    ops = []
    from_fw = 0
    for _k, r in _keyed(rows):
        lat, column = _num(r["latency"]), "latency"
        if lat is None and _num(r.get("fw_latency")) is not None:
            # some traces (all of NVIDIA_L4) leave ``latency`` empty; their forward time is ``fw_latency``
            lat, column = _num(r.get("fw_latency")), "fw_latency"
            from_fw += 1
        if lat is None:
            report.cells_missing += 1
            continue
        out_shape = _parse_shapes(r["output_shape"])
        ops.append({
            "source": "neusight-fx", "row_key": f"{r.get('source_file') or r['trace']}#{r['node_index']}",
            "device": device_id(r["device"]), "op": f"{r['op']}:{r['target']}",
            "dims": {"input_shapes": _parse_shapes(r["input_shapes"]),
                     "output_shape": list(out_shape) if isinstance(out_shape, tuple) else out_shape,
                     "trace": r["trace"], "node_index": _int_or_none(r["node_index"])},
            "dtype": (r.get("dtype") or "").replace("torch.", "") or None, "latency_ms": lat, "latency_ms_std": None,
            "extra": {"name": r.get("Name"), "fw_latency_ms": _num(r.get("fw_latency")),
                      "bw_latency_ms": _num(r.get("bw_latency")), "acc_latency_ms": _num(r.get("acc_latency")),
                      "latency_column": column, "device_name": r["device"], "provenance": _provenance(r)},
        })
    with DatasetStore(out) as store:
        _write_ops(store, report, ops, store.row_keys("neusight-fx", "op_measurements"))
    if from_fw:
        report.notes.append(f"{from_fw} rows had no 'latency' and took 'fw_latency' (extra.latency_column says which)")
    if report.cells_missing:
        report.notes.append(f"{report.cells_missing} rows had neither 'latency' nor 'fw_latency' and were not stored")
    return _finished(report, t0, "neusight-fx")


# ---------------------------------------------------------------------------- Vidur
def import_vidur(csv_path: str | Path, out: str | Path, *, limit: int | None = None,
                 progress: bool = True) -> ImportReport:
    """Import Vidur per-operator LLM-layer profiling into ``op_measurements`` (source ``vidur``).

    Each CSV row (one model, GPU and token count) has ``time_stats.<op>.{min,max,mean,median,std}`` for
    the ops it profiled (embedding, layer norms, attention projections, rope, MLP up/down projections,
    activation, add): one operator row per op with ``latency_ms`` = mean, ``latency_ms_std`` = std (ms),
    min/max/median in ``extra``, and the model dims (heads, embedding sizes, vocab, gated MLP, tokens,
    tensor-parallel workers) in ``dims``. The device is Vidur's ``gpu`` label (``a100``/``h100``; the
    variant is not recorded). Ops a row did not profile are counted in ``cells_missing``.

    Raises:
        DatasetError: missing file or columns, or no ``time_stats.*.mean`` column.
    """
    t0 = time.perf_counter()
    rows = _read_csv(csv_path, _VIDUR_REQUIRED, "Vidur profiling", limit)
    header = list(rows[0]) if rows else []
    op_names = sorted({c.split(".")[1] for c in header if c.startswith("time_stats.") and c.endswith(".mean")})
    if rows and not op_names:
        raise DatasetError(f"Vidur CSV {Path(csv_path).name!r} has no time_stats.<op>.mean columns; it has {header}")
    report = ImportReport(source="vidur", csv=str(csv_path), out=str(out), rows_read=len(rows))
    ops = []
    for key, r in _keyed(rows):
        dims: dict[str, Any] = {"model": r["model"]}
        for d in _VIDUR_DIMS:
            if r.get(d, "").strip():
                v = r[d].strip()
                dims[d] = v == "True" if v in ("True", "False") else _dim_value(v)
        for op in op_names:
            mean = _num(r.get(f"time_stats.{op}.mean"))
            if mean is None:
                report.cells_missing += 1
                continue
            ops.append({
                "source": "vidur", "row_key": f"{key}#{op}", "device": device_id(r["gpu"]), "op": op, "dims": dims,
                "dtype": None, "latency_ms": mean, "latency_ms_std": _num(r.get(f"time_stats.{op}.std")),
                "extra": {"min_ms": _num(r.get(f"time_stats.{op}.min")), "max_ms": _num(r.get(f"time_stats.{op}.max")),
                          "median_ms": _num(r.get(f"time_stats.{op}.median")), "device_name": r["gpu"],
                          "provenance": _provenance(r)},
            })
    with DatasetStore(out) as store:
        _write_ops(store, report, ops, store.row_keys("vidur", "op_measurements"))
    if report.cells_missing:
        report.notes.append(f"{report.cells_missing} (row, op) cells were not profiled by Vidur and not stored")
    return _finished(report, t0, "vidur")


# ---------------------------------------------------------------------------- ryujaehun eager timings
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
    t0 = time.perf_counter()
    rows = _read_csv(csv_path, _RYUJAEHUN_REQUIRED, "ryujaehun benchmark", limit)
    source = "ryujaehun"
    report = ImportReport(source=source, csv=str(csv_path), out=str(out), rows_read=len(rows))
    do_capture = _should_capture(capture_graphs, "torchvision", "capturing the graphs of the ryujaehun benchmark rows")
    groups: dict[tuple[str, str, str, str, str, str], list[float]] = {}
    provenance: dict[tuple[str, ...], dict[str, str]] = {}
    bad: dict[tuple[str, ...], str] = {}
    for r in rows:
        k = (r["gpu"].strip(), r["precision"].strip(), r["mode"].strip(), r["model"].strip(),
             r["batch_size"].strip(), r["input_shape"].strip())
        provenance.setdefault(k, _provenance(r))
        v = _num(r["latency_ms"])
        if v is None or v <= 0:
            bad[k] = f"latency_ms={r['latency_ms']!r} is not a positive number"
            continue
        groups.setdefault(k, []).append(v)
    built: list[dict[str, Any]] = []
    store = DatasetStore(out)
    try:
        present = store.row_keys(source)
        for k in sorted(set(groups) | set(bad)):
            gpu, precision, mode, model, batch, shape = k
            key = "#".join(k)
            if key in present:
                report.already_present += 1
                continue
            host = RYUJAEHUN_HOSTS.get(gpu, {})
            dtype = _RYUJAEHUN_PRECISION.get(precision)
            b = _int_or_none(batch)
            dims = tuple(int(x) for x in shape.split("x")) if re.fullmatch(r"\d+(x\d+)*", shape) else None
            conditions: dict[str, Any] = {
                "precision": precision, "mode": mode, "runtime": "eager", "input_copy": True,
                "framework": "torch-1", "cudnn_benchmark": True, "host": dict(host),
                "latency_formula": "latency_ms = median over the timed iterations of one forward pass "
                                   "(synchronize; model(img.to('cuda')); synchronize), warm-up dropped upstream",
                "model_spec": f"torchvision:{model}",
            }
            row: dict[str, Any] = {
                "source": source, "row_key": key, "space": "torchvision",
                "config": {"model": model, "input_shape": list(dims) if dims else shape},
                "batch_size": b, "dtype": dtype, "device": device_id(gpu),
                "environment": {"device_name": gpu, "provenance": provenance[k],
                                "host_clock_ghz": host.get("clock_ghz"), "host_logical_cpus": host.get("logical_cpus"),
                                "cuda": host.get("cuda"), "cudnn": host.get("cudnn")},
                "conditions": conditions, "extra": {},
            }
            times = groups.get(k, [])
            if mode != "inference":
                row.update(status="error", reason=f"mode {mode!r} is not inference")
            elif dtype is None:
                row.update(status="error", reason=f"unknown precision {precision!r}; known: {sorted(_RYUJAEHUN_PRECISION)}")
            elif not times or b is None or dims is None:
                row.update(status="error", reason=bad.get(k) or f"no timed iteration, batch {batch!r} or shape {shape!r}")
            else:
                qs = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
                mean = statistics.fmean(times)
                conditions.update(iterations=len(times), latency_ms_p10=qs[0], latency_ms_p90=qs[-1],
                                  latency_cv=(statistics.pstdev(times) / mean) if mean > 0 else None)
                row.update(status="ok", latency_ms=statistics.median(times))
            built.append(row)
        want = sorted({(r["conditions"]["model_spec"], tuple(r["config"]["input_shape"]), r["batch_size"], r["dtype"])
                       for r in built if r["status"] == "ok"}) if do_capture else []
        results = _capture([(spec, InputSpec(shape=shp, batch_size=b, dtype=dt)) for spec, shp, b, dt in want],
                           workers, cache, progress)
        graphs = _attach_graphs(report, built, dict(zip(want, results)) if do_capture else None,
                                lambda row: (row["conditions"]["model_spec"], tuple(row["config"]["input_shape"]),
                                             row["batch_size"], row["dtype"]), "torchvision")
        report.graphs_captured = sum(1 for r in results if r.graph is not None)
        report.graphs_failed = sum(1 for r in results if r.graph is None)
        report.inserted += store.add_measurements(built, graphs=graphs)
    finally:
        store.close()
    _note_rows_without_graphs(report, capture_graphs, "torchvision")
    return _finished(report, t0, "ryujaehun")


# ---------------------------------------------------------------------------- GPU campaign
def import_campaign(path: str | Path, out: str | Path, *, capture_graphs: bool = True, workers: int = 2,
                    cache: Any = True, limit: int | None = None, progress: bool = True) -> ImportReport:
    """Import the rows of a ``dippm-nas gpu-campaign`` directory (or one of its ``measurements-*.jsonl``
    files) and capture their graphs here (source ``gpu-campaign``).

    Each row's ``config`` names the model SPEC string (``spec``) and the input spec (``input_spec``); one
    graph is captured per distinct pair (every runtime of a model shares it). A graph that cannot be captured
    leaves its rows without a graph and the error in ``extra["graph_error"]``. Rows already in ``out`` (by
    ``row_key``) are skipped, so importing a resumed campaign again adds only its new rows.

    Args:
        path: the campaign directory or a measurement file of it.
        out: dataset SQLite file.
        capture_graphs: capture the graphs (``False``: store the rows without).
        workers, cache, limit, progress: as in :func:`import_accel_nasbench`.

    Raises:
        DatasetError: ``path`` does not exist. MeasurementError: a file not in the campaign's format.
    """
    t0 = time.perf_counter()
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"campaign path {str(p)!r} does not exist")
    rows = [{k: v for k, v in r.items() if k not in ("type", "created_at")} for r in read_campaign_rows(p)]
    if limit is not None:
        rows = rows[:limit]
    report = ImportReport(source=CAMPAIGN_SOURCE, csv=str(p), out=str(out), rows_read=len(rows))
    store = DatasetStore(out)
    try:
        present = store.row_keys(CAMPAIGN_SOURCE)
        todo = [r for r in rows if r["row_key"] not in present]
        report.already_present = len(rows) - len(todo)
        graphs = []
        if capture_graphs and todo:
            keys: list[tuple[str, str]] = []
            for r in todo:
                k = (r["config"]["spec"], json.dumps(r["config"]["input_spec"], sort_keys=True))
                if k not in keys:
                    keys.append(k)
            items = [(spec, InputSpec.from_dict(json.loads(s))) for spec, s in keys]
            results = dict(zip(keys, _capture(items, workers, cache, progress)))
            for res in results.values():
                if res.graph is not None:
                    report.graphs_captured += 1
                else:
                    report.graphs_failed += 1
            for r in todo:
                res = results[(r["config"]["spec"], json.dumps(r["config"]["input_spec"], sort_keys=True))]
                if res.graph is not None:
                    r["graph_hash"] = res.graph.structural_hash()
                    graphs.append((res.graph, r["space"], r["config"]))
                else:
                    r["extra"] = {**(r.get("extra") or {}), "graph_error": res.error}
        elif todo:
            report.graphs_skipped = len(todo)
        report.failed_rows = sum(r["status"] != "ok" for r in todo)
        report.inserted = store.add_measurements(todo, graphs=graphs)
    finally:
        store.close()
    return _finished(report, t0, "campaign")
