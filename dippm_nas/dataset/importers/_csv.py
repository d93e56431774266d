"""Reading public CSV files: required columns, stable row keys, provenance, numbers and device ids."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dippm_nas._files import open_regular
from dippm_nas._numbers import as_int
from dippm_nas.errors import DatasetError

__all__ = ["PROVENANCE_COLUMNS", "read_csv", "csv_header", "keyed", "provenance", "num", "int_or_none", "dim_value",
           "device_id", "chunks"]

#: Columns of the shared data that say where a row comes from, kept in each row's ``environment``.
PROVENANCE_COLUMNS = ("source_repo", "commit", "source_file")
#: Device names that a simple slug does not turn into the registry's id.
_DEVICE_ALIASES = {"a100-80gb-pcie": "a100-pcie-80gb", "a100-40gb-pcie": "a100-pcie-40gb"}


def csv_header(path: str | Path, what: str) -> list[str]:
    """The header of the CSV file ``path``.

    Raises:
        DatasetError: the file does not exist.
    """
    p = Path(path)
    raw = open_regular(p, f"{what} CSV", error=DatasetError)  # a FIFO, a device or a directory is refused
    try:
        with io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
            return next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error) as e:
        raise DatasetError(f"{what} CSV {p.name!r} cannot be read as UTF-8 CSV: {e}") from e


def read_csv(path: str | Path, required: Sequence[str], what: str, limit: int | None) -> list[dict[str, str]]:
    """The first ``limit`` rows (all for ``None``) of the CSV file ``path``, as dicts.

    Raises:
        DatasetError: the file does not exist or is not a regular file, is not UTF-8 CSV (a field over the
            csv module's limit included), lacks a ``required`` column (the columns it has are listed), or
            ``limit`` is not an int >= 1.
    """
    p = Path(path)
    if limit is not None:
        limit = as_int(limit, "limit", low=1, error=DatasetError, or_none=True)
    raw = open_regular(p, f"{what} CSV", error=DatasetError)  # a FIFO, a device or a directory is refused
    try:
        with io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
            return _rows(csv.DictReader(f), p, required, what, limit)
    except (UnicodeDecodeError, csv.Error) as e:
        raise DatasetError(f"{what} CSV {p.name!r} cannot be read as UTF-8 CSV: {e}") from e


def _rows(reader: csv.DictReader[str], p: Path, required: Sequence[str], what: str,
          limit: int | None) -> list[dict[str, str]]:
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


def provenance(row: dict[str, str]) -> dict[str, str]:
    """The row's :data:`PROVENANCE_COLUMNS` that are filled."""
    return {c: row[c] for c in PROVENANCE_COLUMNS if row.get(c)}


def keyed(rows: list[dict[str, str]]) -> list[tuple[str, dict[str, str]]]:
    """``(key, row)``: the source file and the row's index among that file's rows (stable)."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        sf = r.get("source_file") or "?"
        i = seen.get(sf, 0)
        seen[sf] = i + 1
        out.append((f"{sf}#{i}", r))
    return out


def num(text: str | None) -> float | None:
    """A finite float from a CSV cell, ``None`` for an empty or non-numeric cell."""
    if text is None or not str(text).strip():
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def int_or_none(text: str | None) -> int | None:
    """A whole number from a CSV cell, else ``None``."""
    v = num(text)
    if v is None or v != int(v):
        return None
    return int(v)


def dim_value(text: str) -> Any:
    """A dimension cell: an int, a float, or the text when it is not a number."""
    v = num(text)
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


def chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    """``seq`` in consecutive slices of ``n``."""
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
