"""NeuSight operator latencies: the A100 microbenchmarks (``neusight``) or the per-FX-node latencies
(``neusight-fx``), as ``op_measurements`` rows; the layout is recognised by the header."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dippm_nas.dataset.importers._csv import (
    csv_header,
    device_id,
    dim_value,
    int_or_none,
    keyed,
    num,
    provenance,
    read_csv,
)
from dippm_nas.dataset.importers._source import ImportReport, Source, run_import
from dippm_nas.errors import DatasetError

__all__ = ["NeuSightMicroSource", "NeuSightFxSource", "import_neusight"]

_MICRO_REQUIRED = ("OPName", "Latency", "Device")
#: NeuSight microbenchmark dimension columns -> our names (``Kernel_Szie`` is the source's spelling).
_MICRO_DIMS = {"B": "B", "H": "H", "M": "M", "N": "N", "K": "K", "Input_Channel": "in_channels",
               "Output_Channel": "out_channels", "Kernel_Szie": "kernel_size", "Input_Size": "input_size",
               "Stride": "stride", "Padding": "padding"}
_MICRO_EXTRA = {"Kernel Name": "kernel_name", "Kernels": "kernels", "Warps per SM": "warps_per_sm",
                "Blocks per SM": "blocks_per_sm", "Grid x": "grid_x", "Grid y": "grid_y", "Grid z": "grid_z",
                "Block x": "block_x", "Block y": "block_y", "Block z": "block_z",
                "Torch Version": "torch_version", "CUDNN Version": "cudnn_version", "CUDA Version": "cuda_version"}
_FX_REQUIRED = ("device", "trace", "node_index", "op", "target", "input_shapes", "output_shape", "latency")


@dataclass
class NeuSightMicroSource(Source):
    """NeuSight's A100 operator microbenchmarks (``OPName``, ``Latency`` in ms, ``Device``, dims) as a
    :class:`Source`; a row without a latency is counted in ``cells_missing``, not stored."""

    path: str
    limit: int | None = None
    name: str = "neusight"
    table: ClassVar[str] = "op_measurements"

    def read(self) -> list[dict[str, str]]:
        return read_csv(self.path, _MICRO_REQUIRED, "NeuSight microbenchmark", self.limit)

    def rows(self, records: list[dict[str, str]], report: ImportReport) -> list[dict[str, Any]]:
        ops = []
        for key, r in keyed(records):
            lat = num(r["Latency"])
            if lat is None:
                report.cells_missing += 1
                continue
            dims = {ours: dim_value(r[c]) for c, ours in _MICRO_DIMS.items() if r.get(c, "").strip()}
            extra = {ours: dim_value(r[c]) for c, ours in _MICRO_EXTRA.items() if r.get(c, "").strip()}
            extra.update(device_name=r["Device"], provenance=provenance(r))
            ops.append({"source": self.name, "row_key": key, "device": device_id(r["Device"]), "op": r["OPName"],
                        "dims": dims, "dtype": "float32", "latency_ms": lat, "latency_ms_std": None, "extra": extra})
        return ops

    def notes(self, report: ImportReport) -> list[str]:
        return [f"{report.cells_missing} rows without a Latency value were not stored"] if report.cells_missing \
            else []


def _parse_shapes(text: str) -> Any:
    try:
        return ast.literal_eval(text) if text.strip() else None
    except (ValueError, SyntaxError):
        return text


@dataclass
class NeuSightFxSource(Source):
    """NeuSight's per-FX-node latencies as a :class:`Source`: ``latency``, else ``fw_latency`` (some traces leave
    ``latency`` empty; ``extra["latency_column"]`` says which); a node with neither is counted, not stored."""

    path: str
    limit: int | None = None
    name: str = "neusight-fx"
    table: ClassVar[str] = "op_measurements"
    from_fw: int = 0

    def read(self) -> list[dict[str, str]]:
        return read_csv(self.path, _FX_REQUIRED, "NeuSight FX-node", self.limit)

    def rows(self, records: list[dict[str, str]], report: ImportReport) -> list[dict[str, Any]]:
        ops = []
        for _k, r in keyed(records):
            lat, column = num(r["latency"]), "latency"
            if lat is None and num(r.get("fw_latency")) is not None:
                # some traces (all of NVIDIA_L4) leave ``latency`` empty; their forward time is ``fw_latency``
                lat, column = num(r.get("fw_latency")), "fw_latency"
                self.from_fw += 1
            if lat is None:
                report.cells_missing += 1
                continue
            ops.append(_fx_row(r, lat, column))
        return ops

    def notes(self, report: ImportReport) -> list[str]:
        notes = []
        if self.from_fw:
            notes.append(f"{self.from_fw} rows had no 'latency' and took 'fw_latency' (extra.latency_column says "
                         "which)")
        if report.cells_missing:
            notes.append(f"{report.cells_missing} rows had neither 'latency' nor 'fw_latency' and were not stored")
        return notes


def _fx_row(r: dict[str, str], lat: float, column: str) -> dict[str, Any]:
    out_shape = _parse_shapes(r["output_shape"])
    return {
        "source": "neusight-fx", "row_key": f"{r.get('source_file') or r['trace']}#{r['node_index']}",
        "device": device_id(r["device"]), "op": f"{r['op']}:{r['target']}",
        "dims": {"input_shapes": _parse_shapes(r["input_shapes"]),
                 "output_shape": list(out_shape) if isinstance(out_shape, tuple) else out_shape,
                 "trace": r["trace"], "node_index": int_or_none(r["node_index"])},
        "dtype": (r.get("dtype") or "").replace("torch.", "") or None, "latency_ms": lat, "latency_ms_std": None,
        "extra": {"name": r.get("Name"), "fw_latency_ms": num(r.get("fw_latency")),
                  "bw_latency_ms": num(r.get("bw_latency")), "acc_latency_ms": num(r.get("acc_latency")),
                  "latency_column": column, "device_name": r["device"], "provenance": provenance(r)},
    }


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
    header = csv_header(csv_path, "NeuSight")
    source: Source
    if all(c in header for c in _MICRO_REQUIRED):
        source = NeuSightMicroSource(str(Path(csv_path)), limit=limit)
    elif all(c in header for c in _FX_REQUIRED):
        source = NeuSightFxSource(str(Path(csv_path)), limit=limit)
    else:
        raise DatasetError(
            f"NeuSight CSV {Path(csv_path).name!r} has neither the microbenchmark columns {list(_MICRO_REQUIRED)} nor "
            f"the FX-node columns {list(_FX_REQUIRED)}; it has {header}"
        )
    return run_import(source, out, capture=False, chunk_size=5000, progress=progress)
