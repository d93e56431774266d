"""scripts/fit/fit_novelty_floor.py: argument parsing and guards (the fitting itself is tested in test_predictor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _scripts import load_script


def _script() -> Any:
    return load_script("fit_novelty_floor")


def test_floor_arguments_name_their_target_or_mean_latency() -> None:
    s = _script()
    assert s.parse_floors(["0.11", "memory_mib=0.05"]) == {"latency_ms": 0.11, "memory_mib": 0.05}
    assert s.parse_floors([]) == {}
    with pytest.raises(ValueError):
        s.parse_floors(["latency_ms=wide"])


def test_json_report_may_not_overwrite_the_checkpoint_sidecar(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="metadata sidecar"):
        _script().main(["--checkpoint", "x.pt", "--data", "d.jsonl", "--out", str(tmp_path / "n.pt"),
                        "--json", str(tmp_path / "n.json")])


def test_the_other_calibration_fold_needs_a_fraction(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="give --calibrate-frac"):
        _script().main(["--checkpoint", "x.pt", "--data", "d.jsonl", "--out", str(tmp_path / "n.pt"),
                        "--calibrate-other"])


def test_timm_rows_are_held_out_by_timm_family() -> None:
    s = _script()
    from dippm_nas.training import Example

    timm_row = Example(graph=None, device="rtx-3090", y={}, family="timm", key="k", source="timm",  # type: ignore[arg-type]
                       name="resnet50.a1_in1k")
    ours = Example(graph=None, device="cpu", y={}, family="resnet", key="k", source="measured-here")  # type: ignore[arg-type]
    assert s.row_family(timm_row) == "resnet" and s.row_family(ours) == "resnet"
