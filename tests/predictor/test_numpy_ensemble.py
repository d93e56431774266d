"""The numpy engine of the GraphSAGE ensemble gives the torch engine's predictions, and its weights file is
derived from the checkpoint's bytes (a changed checkpoint is never answered by stale weights).

The sample is :mod:`test_inference_equality`'s (ten graphs): on the shipped A100 checkpoint in its four
settings (eager, CUDA graphs, compiled, no MIG advice) and on each shipped host-CPU checkpoint; every field of
``Prediction.to_dict()`` (figures, σ, details) must agree to :data:`~_compare.KERNEL_PATH_REL` relative (the measured
agreement of the engines across CPU kernel paths, with a margin), every flag and source exactly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _compare import KERNEL_PATH_REL, assert_close
from dippm_nas.errors import CheckpointError, InvalidValueError
from dippm_nas.predictor import (
    NUMPY_MAX_GRAPHS,
    GnnPredictor,
    NumpyEnsemble,
    SageEnsemble,
    checkpoint_digest,
    derived_weights_path,
    find_checkpoint,
    global_arrays,
    host_checkpoints,
)
from dippm_nas.predictor._numpy_ensemble import state_shapes
from test_inference_equality import SETTINGS, _graphs

REL = KERNEL_PATH_REL


def _close(a: Any, b: Any, path: str = "") -> None:
    assert_close(a, b, rel=REL, abs_tol=1e-9, path=path)


def _dicts(pred: GnnPredictor, graphs: list, **kw: Any) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(p.to_dict())) for p in pred.predict_graphs(graphs, **kw)]


@pytest.fixture(scope="module")
def graphs() -> list:
    return _graphs()


@pytest.mark.parametrize("kw", [kw for dev, kw in SETTINGS if dev == "a100-sxm4-40gb"],
                         ids=[json.dumps(kw) for dev, kw in SETTINGS if dev == "a100-sxm4-40gb"])
def test_numpy_engine_predicts_as_the_torch_engine_a100(graphs: list, kw: dict[str, Any]) -> None:
    path = find_checkpoint("a100-sxm4-40gb")
    assert path is not None
    fast = GnnPredictor.load(path, engine="numpy", load_calibration=False)
    ref = GnnPredictor.load(path, engine="torch", load_calibration=False)
    assert (fast.engine, ref.engine) == ("numpy", "torch")
    assert len(graphs) <= NUMPY_MAX_GRAPHS
    got, want = _dicts(fast, graphs, **kw), _dicts(ref, graphs, **kw)
    assert fast.engine == "numpy"  # answered by numpy, not moved to torch
    for i, (a, b) in enumerate(zip(got, want)):
        _close(a, b, f"[{i}]")
    # and the raw network outputs, member by member
    feats = [fast.features(g) for g in graphs]
    b = global_arrays(feats)
    np.testing.assert_allclose(fast.inference.engine.infer(feats, b), ref.model.infer(feats).numpy(), rtol=REL, atol=1e-5)


@pytest.mark.parametrize("ckpt", [p for p, _ in host_checkpoints()], ids=lambda p: p.stem)
def test_numpy_engine_predicts_as_the_torch_engine_host(graphs: list, ckpt: Path) -> None:
    fast = GnnPredictor.load(ckpt, engine="numpy", load_calibration=False)
    ref = GnnPredictor.load(ckpt, engine="torch", load_calibration=False)
    host_graphs = graphs[6:]  # the four host-CPU graphs of the sample
    for i, (a, b) in enumerate(zip(_dicts(fast, host_graphs), _dicts(ref, host_graphs))):
        _close(a, b, f"[{i}]")


def test_state_shapes_are_the_torch_modules() -> None:
    path = find_checkpoint("a100-sxm4-40gb")
    meta = GnnPredictor.load(path, engine="torch", load_calibration=False).meta
    model = SageEnsemble(meta.node_dim, meta.static_dim, meta.device_dim, meta.hidden, meta.layers, meta.members,
                         meta.residual_on_prior)
    assert state_shapes(meta) == {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_derived_weights_follow_the_checkpoint_bytes(tmp_path: Path, graphs: list) -> None:
    src = find_checkpoint("a100-sxm4-40gb")
    ckpt = tmp_path / "a100-sxm4-40gb.pt"
    ckpt.write_bytes(src.read_bytes())
    digest = checkpoint_digest(ckpt)
    derived = derived_weights_path(digest)
    derived.unlink(missing_ok=True)
    ref = GnnPredictor.load(ckpt, engine="torch", load_calibration=False)
    assert derived.is_file()  # written by the torch load
    with np.load(derived, allow_pickle=False) as z:
        assert str(z["sha256"]) == digest and json.loads(str(z["meta"]))["device"] == "a100-sxm4-40gb"

    # another checkpoint at the same path (other weights): another digest, so the old weights never answer it
    changed = GnnPredictor.load(ckpt, engine="torch", load_calibration=False)
    with __import__("torch").no_grad():
        changed.model.fc3.bias.add_(0.25)
    changed.save(ckpt)
    assert checkpoint_digest(ckpt) != digest
    fast = GnnPredictor.load(ckpt, engine="numpy", load_calibration=False)
    np.testing.assert_allclose(fast.inference.engine.state["fc3.bias"], changed.model.fc3.bias.detach().numpy())
    a = fast.predict_graphs(graphs[:2], mig=False)
    b = ref.predict_graphs(graphs[:2], mig=False)
    assert a[0].latency_ms != pytest.approx(b[0].latency_ms, rel=1e-3)

    # a damaged derived file is not read: the checkpoint itself answers and the file is written again
    new = derived_weights_path(checkpoint_digest(ckpt))
    new.write_bytes(b"not an npz")
    again = GnnPredictor.load(ckpt, engine="numpy", load_calibration=False)
    assert again.engine == "numpy"
    assert again.predict_graphs(graphs[:2], mig=False) == a
    with np.load(new, allow_pickle=False) as z:
        assert str(z["sha256"]) == checkpoint_digest(ckpt)


def test_numpy_engine_moves_to_torch_for_a_large_batch_or_the_model(graphs: list) -> None:
    path = find_checkpoint("a100-sxm4-40gb")
    fast = GnnPredictor.load(path, engine="numpy", load_calibration=False)
    ref = GnnPredictor.load(path, engine="torch", load_calibration=False)
    many = (graphs * (NUMPY_MAX_GRAPHS // len(graphs) + 1))[:NUMPY_MAX_GRAPHS + 1]
    got = fast.predict_log([fast.features(g) for g in many])[0]
    want = ref.predict_log([ref.features(g) for g in many])[0]
    assert fast.engine == "torch"
    np.testing.assert_array_equal(got, want)  # the same torch pass
    other = GnnPredictor.load(path, engine="numpy", load_calibration=False)
    assert isinstance(other.inference.engine, NumpyEnsemble)
    assert isinstance(other.model, SageEnsemble) and other.engine == "torch"


def test_load_rejects_an_unknown_engine_and_a_derived_file_of_other_shapes(tmp_path: Path) -> None:
    path = find_checkpoint("a100-sxm4-40gb")
    with pytest.raises(InvalidValueError, match="engine must be one of"):
        GnnPredictor.load(path, engine="jax")
    meta = GnnPredictor.load(path, engine="torch", load_calibration=False).meta
    state = {k: np.zeros(s, dtype=np.float32) for k, s in state_shapes(meta).items()}
    state["fc1.weight"] = np.zeros((1, 2, 3), dtype=np.float32)
    with pytest.raises(CheckpointError, match="fc1.weight"):
        NumpyEnsemble(state, meta)


def test_old_derived_files_are_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.predictor import _numpy_ensemble as ne

    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ne, "DERIVED_KEEP", 2)
    state = {"w": np.zeros(3, dtype=np.float32)}
    paths = []
    for i, digest in enumerate(("a" * 64, "b" * 64, "c" * 64)):
        paths.append(ne.write_derived_weights(digest, state, "{}", None))
        os.utime(paths[-1], (1000.0 + i, 1000.0 + i))
    assert [p.exists() for p in paths] == [False, True, True]
    assert ne.read_derived_weights("c" * 64)[1] == "{}"
