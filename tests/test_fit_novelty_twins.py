"""scripts/fit/fit_novelty_twins.py: the width, leave-one-twin-out figures and floor from twins' rows."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _scripts import load_script


def _script() -> Any:
    return load_script("fit_novelty_twins")


def _rows(rng: np.random.Generator, n: int, family: str, novelty: float, net_err: float, prior_err: float,
          noise: float = 0.02, sigma: float = 0.01) -> list[dict[str, Any]]:
    """Rows whose network figure is off by ``net_err`` (log) and prior by ``prior_err``, plus noise."""
    out = []
    for _ in range(n):
        y = float(rng.uniform(1.0, 50.0))
        out.append({"family": family, "novelty": novelty, "latency_ms": y,
                    "latency_ms_pred": y * math.exp(net_err + rng.normal(0, noise)),
                    "latency_ms_prior": y * math.exp(prior_err + rng.normal(0, noise)),
                    "latency_ms_std": sigma * y})
    return out


def test_network_far_off_on_novel_graphs_is_shrunk_to_the_prior() -> None:
    rng = np.random.default_rng(0)
    # d0 0.2: the "novel" families sit at novelty 0.4 (u = 1), where the network is 40 % off and the prior right
    twins = {f"t{i}": (_rows(rng, 40, f"near{i}", 0.1, 0.0, 0.3, sigma=0.04) + _rows(rng, 40, f"far{i}", 0.4, 0.4, 0.0),
                       0.2) for i in range(3)}
    fit = _script().fit_from_rows(twins, ["latency_ms"])["latency_ms"]
    assert fit["width"] <= 1.0  # at u = 1 the correction is gone (ties go to the widest such width)
    assert fit["mape_shrunk_pct"] < 0.6 * fit["mape_network_pct"]
    for i in range(3):
        near, far = fit["families"][f"near{i}"], fit["families"][f"far{i}"]
        assert near["mape_shrunk_pct"] == pytest.approx(near["mape_network_pct"])  # below d0: untouched
        assert far["mape_shrunk_pct"] < 5.0 < 40.0 < far["mape_network_pct"]
        assert far["novel_share"] == 1.0 and near["novel_share"] == 0.0
    # after the shrink the novel rows are within a few % of the label: a small floor covers them
    assert 0.0 < fit["floor_log"] < 0.1 and fit["floor_on"] == "novel rows" and fit["floor_rows"] == 120
    assert fit["coverage_2sigma"] >= 0.95 - 1e-9  # the floor is fitted for it on the novel rows


def test_network_right_on_novel_graphs_keeps_its_correction() -> None:
    rng = np.random.default_rng(1)
    twins = {f"t{i}": (_rows(rng, 40, f"far{i}", 0.4, 0.0, 0.3), 0.2) for i in range(2)}
    fit = _script().fit_from_rows(twins, ["latency_ms"])["latency_ms"]
    assert math.isinf(fit["width"]) and fit["mape_shrunk_pct"] == pytest.approx(fit["mape_network_pct"])
    assert all(math.isinf(t["width_without"]) for t in fit["twins"].values())


def test_leave_one_twin_out_uses_the_other_twins_width() -> None:
    rng = np.random.default_rng(2)
    # only twin a has novel rows where shrinking pays; b and c have none past d0
    twins = {"a": (_rows(rng, 40, "fa", 0.4, 0.4, 0.0), 0.2), "b": (_rows(rng, 40, "fb", 0.1, 0.0, 0.3), 0.2),
             "c": (_rows(rng, 40, "fc", 0.1, 0.0, 0.3), 0.2)}
    fit = _script().fit_from_rows(twins, ["latency_ms"])["latency_ms"]
    # without a, nothing says how to shrink (ties keep the whole correction): a is scored unshrunk
    assert math.isinf(fit["twins"]["a"]["width_without"])
    assert fit["twins"]["a"]["mape_shrunk_pct"] == pytest.approx(fit["twins"]["a"]["mape_network_pct"])
    assert fit["width"] < math.inf


def test_twin_argument_names_checkpoint_and_families(tmp_path: Path) -> None:
    s = _script()
    assert s.parse_twin("x/fam.pt:resnet,vit") == ("x/fam.pt", ["resnet", "vit"])
    for bad in ("fam.pt", "fam.pt:", ":resnet"):
        with pytest.raises(argparse.ArgumentTypeError, match="CHECKPOINT:FAMILY"):
            s.parse_twin(bad)
    with pytest.raises(SystemExit, match="metadata sidecar"):
        s.main(["--data", "d.jsonl", "--device", "host-cpu", "--twin", "a.pt:x", "--checkpoint", "c.pt",
                "--out", str(tmp_path / "n.pt"), "--json", str(tmp_path / "n.json")])
