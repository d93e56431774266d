"""scripts/fit/pin_prior_keys.py: copies named constants into a checkpoint's pinned prior and records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_script

from dippm_nas.errors import InvalidValueError
from dippm_nas.predictor import GnnPredictor, find_checkpoint


def test_pinning_copies_the_named_values_marks_the_dtype_and_notes_the_command(tmp_path: Path) -> None:
    ckpt = find_checkpoint("a100-sxm4-40gb")
    cal = tmp_path / "cal.json"
    before = GnnPredictor.load(ckpt, load_calibration=False, engine="torch").meta
    src = json.loads(json.dumps(before.prior_params))
    src["op_classes"]["conv"]["eta_compute_fp64"] = 0.25
    cal.write_text(json.dumps(src))
    out = tmp_path / "pinned.pt"
    s = load_script("pin_prior_keys")
    assert s.main(["--checkpoint", str(ckpt), "--calibration", str(cal), "--key", "op_classes.conv.eta_compute_fp64",
                   "--prior-only-dtype", "bfloat16", "--out", str(out)]) == 0
    after = GnnPredictor.load(out, load_calibration=False).meta
    assert after.prior_params["op_classes"]["conv"]["eta_compute_fp64"] == 0.25
    assert after.prior_only_dtypes == sorted(set(before.prior_only_dtypes) | {"bfloat16"})
    assert "op_classes.conv.eta_compute_fp64 = 0.25" in after.notes and "pin_prior_keys.py" in after.notes
    assert json.loads(out.with_suffix(".json").read_text())["prior_only_dtypes"] == after.prior_only_dtypes
    with pytest.raises(SystemExit, match="not in the calibration file"):
        s.main(["--checkpoint", str(ckpt), "--calibration", str(cal), "--key", "op_classes.conv.no_such",
                "--out", str(out)])
    src["op_classes"]["conv"]["eta_compute_fp64"] = -1.0  # a value the prior refuses is not pinned
    cal.write_text(json.dumps(src))
    with pytest.raises(InvalidValueError, match="eta_compute_fp64"):
        s.main(["--checkpoint", str(ckpt), "--calibration", str(cal), "--key", "op_classes.conv.eta_compute_fp64",
                "--out", str(tmp_path / "bad.pt")])
    assert not (tmp_path / "bad.pt").exists()
