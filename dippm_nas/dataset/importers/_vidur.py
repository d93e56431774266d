"""Vidur per-operator LLM-layer time stats as ``op_measurements`` rows (source ``vidur``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dippm_nas.dataset.importers._csv import device_id, dim_value, keyed, num, provenance, read_csv
from dippm_nas.dataset.importers._source import ImportReport, Source, run_import
from dippm_nas.errors import DatasetError

__all__ = ["VidurSource", "import_vidur"]

_REQUIRED = ("gpu", "model", "num_tokens")
_DIMS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
         "num_tensor_parallel_workers")


@dataclass
class VidurSource(Source):
    """Vidur's per-operator profiling (one CSV row per model, GPU and token count) as a :class:`Source`: one
    operator row per ``time_stats.<op>.mean`` column; an op a row did not profile is counted in ``cells_missing``."""

    path: str
    limit: int | None = None
    name: str = "vidur"
    table: ClassVar[str] = "op_measurements"
    op_names: list[str] = field(default_factory=list)

    def read(self) -> list[dict[str, str]]:
        rows = read_csv(self.path, _REQUIRED, "Vidur profiling", self.limit)
        header = list(rows[0]) if rows else []
        self.op_names = sorted({c.split(".")[1] for c in header if c.startswith("time_stats.") and c.endswith(".mean")})
        if rows and not self.op_names:
            raise DatasetError(f"Vidur CSV {Path(self.path).name!r} has no time_stats.<op>.mean columns; it has "
                               f"{header}")
        return rows

    def rows(self, records: list[dict[str, str]], report: ImportReport) -> list[dict[str, Any]]:
        ops = []
        for key, r in keyed(records):
            dims: dict[str, Any] = {"model": r["model"]}
            for d in _DIMS:
                if r.get(d, "").strip():
                    v = r[d].strip()
                    dims[d] = v == "True" if v in ("True", "False") else dim_value(v)
            for op in self.op_names:
                mean = num(r.get(f"time_stats.{op}.mean"))
                if mean is None:
                    report.cells_missing += 1
                    continue
                ops.append({
                    "source": self.name, "row_key": f"{key}#{op}", "device": device_id(r["gpu"]), "op": op,
                    "dims": dims, "dtype": None, "latency_ms": mean,
                    "latency_ms_std": num(r.get(f"time_stats.{op}.std")),
                    "extra": {"min_ms": num(r.get(f"time_stats.{op}.min")),
                              "max_ms": num(r.get(f"time_stats.{op}.max")),
                              "median_ms": num(r.get(f"time_stats.{op}.median")), "device_name": r["gpu"],
                              "provenance": provenance(r)},
                })
        return ops

    def notes(self, report: ImportReport) -> list[str]:
        return [f"{report.cells_missing} (row, op) cells were not profiled by Vidur and not stored"] \
            if report.cells_missing else []


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
    return run_import(VidurSource(str(csv_path), limit=limit), out, capture=False, chunk_size=5000,
                      progress=progress)
