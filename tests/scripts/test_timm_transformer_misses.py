"""benchmarks/accuracy/timm_transformer_misses.py: the field deployments, the summary and the cross-board ratios
(the scoring needs a captured timm dataset and runs as a script)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from _scripts import load_script
from dippm_nas import Deployment


def _load():
    return load_script("timm_transformer_misses")


def test_field_deployments_change_one_field() -> None:
    m = _load()
    d = Deployment(runtime="eager", autocast="float16", input_copy="none", versions={"torch": "2.9.1"})
    deps = m.field_deployments(d)
    assert tuple(deps) == m.FIELDS
    assert deps["autocast off"].autocast == "none" and deps["autocast off"].input_copy == "none"
    assert deps["copy undescribed"].input_copy is None and deps["copy undescribed"].autocast == "float16"
    assert deps["torch undescribed"].versions is None and deps["torch undescribed"].autocast == "float16"
    assert deps["undescribed"] == Deployment() and deps["undescribed + autocast"].autocast == "float16"


def test_summary_mape_per_gpu() -> None:
    m = _load()
    keys = [f"field {f}" for f in m.FIELDS] + [f"{c} {mode}" for c in m.CONSTANTS
                                               for mode in ("described", "undescribed")]
    recs = [{"device": "rtx-4090", "family": "vit", "model": "a", "label_ms": 1.0, "classes": {},
             **dict.fromkeys(keys, 1.2)},
            {"device": "rtx-4090", "family": "swin", "model": "b", "label_ms": 1.0, "classes": {},
             **dict.fromkeys(keys, 0.9)}]
    s = m.summarise_rows(recs)
    assert s["gpus"]["rtx-4090"]["n"] == 2
    assert s["gpus"]["rtx-4090"]["field described"] == pytest.approx(15.0)
    assert s["gpus"]["rtx-4090"]["shipped undescribed"] == pytest.approx(15.0)
    assert [r["family"] for r in s["rows"]] == ["swin", "vit"]


def test_board_pairs_per_datasheet_byte(tmp_path: Path) -> None:
    m = _load()
    cols = ["gpu", "precision", "memory_layout", "torch_version_tag", "torch_compile", "model", "infer_img_size",
            "infer_samples_per_sec", "infer_gmacs", "infer_macts"]
    rows = []
    for i in range(20):  # the 4090 twice the 3090's throughput on every model
        for gpu, sps in (("NVIDIA GeForce RTX 3090", 100.0), ("NVIDIA GeForce RTX 4090", 200.0)):
            rows.append([gpu, "amp", "nchw", "pt240", "eager", f"m{i}", "224", sps, 0.1 * (i + 1), 10.0])
    rows.append(["NVIDIA GeForce RTX 3090", "amp", "nchw", "pt210", "eager", "m0", "224", 1.0, 1.0, 1.0])
    path = tmp_path / "timm.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerows(rows)
    out = m.board_pairs(path)
    assert len(out) == 1 and out[0]["models"] == 20
    assert all(b["median"] == pytest.approx(2.0) for b in out[0]["bins"])
    assert out[0]["per_byte"] == pytest.approx(2.0 / (1008.0 / 936.0))


def test_version_deltas_need_a_pt240_twin_on_the_same_batch(tmp_path: Path) -> None:
    m = _load()
    path = tmp_path / "timm.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["gpu", "torch_version_tag", "torch_compile", "precision", "memory_layout", "model",
                    "infer_img_size", "infer_step_time", "infer_batch_size"])
        w.writerow(["NVIDIA GeForce RTX 4090", "pt240", "eager", "amp", "nchw", "hiera_tiny_224", "224", "231.8",
                    "1024"])
    assert m.version_deltas([], path) == []
