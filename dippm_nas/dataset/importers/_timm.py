"""timm ``benchmark-infer`` rows: model, GPU, batch, samples/s, step time, precision, layout, compile flag."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dippm_nas.capture import has_results_form
from dippm_nas.dataset.importers._csv import device_id, int_or_none, keyed, num, provenance, read_csv
from dippm_nas.dataset.importers._source import (
    GraphRequest,
    ImportReport,
    Source,
    rows_without_graphs_note,
    run_import,
    should_capture,
)
from dippm_nas.spec import InputSpec

__all__ = ["TimmSource", "import_timm"]

_REQUIRED = ("gpu", "precision", "memory_layout", "torch_version_tag", "cuda_tag", "torch_compile", "model",
             "infer_img_size", "infer_batch_size", "infer_samples_per_sec", "infer_step_time")
#: timm ``precision`` -> (dtype, autocast?)
_PRECISION: dict[str, tuple[str, bool]] = {
    "amp": ("float16", True), "amp_bf16": ("bfloat16", True), "bf16": ("bfloat16", False),
    "fp16": ("float16", False), "float16": ("float16", False), "fp32": ("float32", False),
    "float32": ("float32", False), "tf32": ("float32", False),
}
#: ``torch_version_tag`` values of the timm runs that timed the reparameterised (fused) form of each model,
#: i.e. ran ``benchmark.py --reparam``. Evidence: on the same RTX 4090 the pt291 run is faster than the
#: pt240 run by a family median of 1.4-2.3x for MobileOne, FastViT, RepVGG, RepGhost and RepViT, while the
#: median over all 1,442 models is 1.015 and most families lie within 0.95-1.07x; and the pt291 labels lie
#: near the analytic prior of the fused graph (``benchmarks/measurement/timm_reparam_labels.py``). Runs with other
#: tags timed the model as ``timm.create_model`` builds it.
_REPARAM_TAGS = frozenset({"pt291"})


@dataclass
class TimmSource(Source):
    """timm ``benchmark-infer`` rows (``timm_benchmark_infer_gpu.csv``) as a :class:`Source`.

    ``capture_graphs`` is the importer's argument, for the note on rows stored without graphs.
    """

    path: str
    limit: int | None = None
    capture_graphs: bool | None = None
    name: str = "timm"
    table: ClassVar[str] = "measurements"

    def read(self) -> list[dict[str, str]]:
        return read_csv(self.path, _REQUIRED, "timm benchmark", self.limit)

    def rows(self, records: list[dict[str, str]], report: ImportReport) -> list[dict[str, Any]]:
        out = []
        for _k, r in keyed(records):
            key = "#".join([r.get("source_file") or "?", r["gpu"], r["precision"], r["memory_layout"],
                            r["torch_compile"], r["model"], r["infer_img_size"]])
            out.append(_row(key, r))
        return out

    def graph_request(self, row: dict[str, Any]) -> GraphRequest | None:
        if row["status"] != "ok":
            return None
        spec, img, batch, dtype = (row["conditions"]["model_spec"], row["config"]["img_size"], row["batch_size"],
                                   row["dtype"])
        return GraphRequest((spec, img, batch, dtype), spec, InputSpec(shape=(3, img, img), batch_size=batch,
                                                                       dtype=dtype))

    def notes(self, report: ImportReport) -> list[str]:
        return rows_without_graphs_note(report, self.capture_graphs, "timm")


def _row(key: str, r: dict[str, str]) -> dict[str, Any]:
    reparam = r["torch_version_tag"].strip() in _REPARAM_TAGS
    as_results = has_results_form(r["model"])  # timm changed its kernels since the results (no reparam modules)
    precision = r["precision"].strip()
    dtype, autocast = _PRECISION.get(precision, (None, None))
    img = int_or_none(r["infer_img_size"])
    batch = int_or_none(r["infer_batch_size"])
    step_ms = num(r["infer_step_time"])
    conditions = {
        "precision": precision, "autocast": autocast, "memory_layout": r["memory_layout"],
        "torch_compile": r["torch_compile"], "torch_version_tag": r["torch_version_tag"],
        "cuda_tag": r["cuda_tag"], "infer_samples_per_sec": num(r["infer_samples_per_sec"]),
        "infer_gmacs": num(r.get("infer_gmacs")), "infer_macts_m": num(r.get("infer_macts")),
        "param_count_m": num(r.get("param_count")),
        "latency_formula": "latency_ms = infer_step_time (ms per batch, as published)",
        "batch_size_note": "timm benchmarks each model at the largest batch that fits (mostly 1024)",
        "model_form": "as the results ran it" if as_results else "reparameterized" if reparam else "as built",
        "model_spec": (f"timm-results:{r['model']}" if as_results else f"timm-reparam:{r['model']}" if reparam
                       else f"timm:{r['model']}"),
        "model_form_note": ("the published results ran kernels the installed timm no longer builds for this model "
                            "(dippm_nas.capture.RESULTS_CHANGES); the graph is captured from timm-results:NAME"
                            if as_results else
                            "this run timed the model after timm's reparameterize_model (benchmark.py --reparam; "
                            "judged from the run's speed-ups on fusable models); the graph is captured the same way"
                            if reparam else "this run timed the model as timm.create_model builds it"),
    }
    row: dict[str, Any] = {
        "source": "timm", "row_key": key, "space": "timm", "config": {"model": r["model"], "img_size": img},
        "batch_size": batch, "dtype": dtype, "device": device_id(r["gpu"]),
        "environment": {"device_name": r["gpu"], "provenance": provenance(r)}, "conditions": conditions,
        "extra": {},
    }
    if step_ms is None or step_ms <= 0 or batch is None or img is None:
        row.update(status="error", reason="the published benchmark has no result for this model at this setting "
                   f"(infer_step_time={r['infer_step_time']!r}, infer_batch_size={r['infer_batch_size']!r})")
        return row
    if dtype is None:
        row.update(status="error", reason=f"unknown timm precision {precision!r}; known: {sorted(_PRECISION)}")
        return row
    row.update(status="ok", latency_ms=step_ms)
    return row


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
    ``timm-reparam:NAME``; the other runs timed ``timm:NAME`` as built. A model whose kernels timm changed
    after the published results (``dippm_nas.capture.RESULTS_CHANGES``: Hiera) is captured from
    ``timm-results:NAME``, the model the results timed (none of them has modules to reparameterise). A row
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
    capture = should_capture(capture_graphs, "timm", "capturing the graphs of timm benchmark rows")
    source = TimmSource(str(csv_path), limit=limit, capture_graphs=capture_graphs)
    return run_import(source, out, capture=capture, workers=workers, cache=cache, chunk_size=chunk_size,
                      progress=progress)
