"""The inference path's shortcuts give the figures of the straightforward computation.

- Node features: :func:`dippm_nas.features.featurize` against a per-node reference loop (below, written
  node by node with Python sums), bit for bit.
- The MIG advisor's slice latency (:func:`dippm_nas.prior.estimate_latency_ms`) against
  ``estimate(...).latency_ms``, and the estimate's memory parts (cached per graph and device) against
  :func:`~dippm_nas.prior.gpu_memory_parts` on a fresh liveness pass, exactly.
- Whole predictions of a fixed sample (``tests/data/inference_graphs.json.xz``: six assembled ``mbconv``
  graphs at batch 256 and 1 in float16, four float32 graphs of the host-CPU data) on the A100 checkpoint
  (eager, CUDA graphs, compiled, without MIG advice), the analytic H100 and the analytic RTX 4090 (compiled)
  against the values in ``tests/data/inference_expected.json.xz`` (``Prediction.to_dict()`` of each), written
  by this code with the shipped checkpoint and prior (:func:`write_expected` rewrites a device's values after a
  deliberate change such as a retrained checkpoint or a change of the prior's model). On the machine that wrote
  them they are equal bit for bit; another CPU picks other BLAS and ATen
  kernels, so floats are compared to :data:`~_compare.KERNEL_PATH_REL` relative, the measured agreement of the
  kernel paths with a margin (``python tests/kernel_paths.py``); every non-numeric field, MIG choice and flag
  must be equal. ``.ci/run`` runs these tests a second time on an older kernel path
  (:data:`kernel_paths.OLDER_KERNELS`), and :func:`test_the_kernel_path_asked_for_is_in_effect` checks that path
  was taken.
- ``predict`` on a model from a registered search space assembles its graph instead of exporting it
  (the assembled graph is the whole capture's: ``tests/capture/test_assembly.py``).
"""

from __future__ import annotations

import json
import lzma
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _compare import KERNEL_PATH_REL, assert_close
import dippm_nas
import search_spaces as ss
from dippm_nas.cache import ConversionCache
from dippm_nas.capture import assemble, clear_block_memo
from dippm_nas.devices import resolve_device
from dippm_nas.features import ATTR_WIDTH, TOKENS, coarsen, encode_op, featurize, node_dim
from dippm_nas.graph import OP_CLASSES, OperatorGraph
from dippm_nas.predictor import set_predictor
from dippm_nas.prior import (
    DeploymentSettings,
    activation_liveness,
    default_params,
    estimate,
    estimate_latency_ms,
    gpu_memory_parts,
    utilisation_energy_j,
)

DATA = Path(__file__).resolve().parents[1] / "data"
_DTYPES = ("float32", "float16", "bfloat16")
SETTINGS = [("a100-sxm4-40gb", {}), ("a100-sxm4-40gb", {"runtime": "cuda-graphs"}),
            ("a100-sxm4-40gb", {"runtime": "compiled"}), ("a100-sxm4-40gb", {"mig": False}),
            ("h100-sxm5-80gb", {}), ("rtx-4090", {"runtime": "compiled"})]


def _graphs() -> list[OperatorGraph]:
    with lzma.open(DATA / "inference_graphs.json.xz", "rt") as f:
        d = json.load(f)
    return [OperatorGraph.from_dict(x) for x in d["gpu"] + d["host"]]


def _lg(x: Any) -> float:
    return math.log1p(max(float(x or 0.0), 0.0))


def _reference_rows(graph: OperatorGraph, device: str, params: Any) -> np.ndarray:
    """Node rows of the ``"ours"`` style, one kernel and one member at a time."""
    est = estimate(graph, device, params=params)
    kg = coarsen(graph)
    nodes = graph.nodes
    rows = np.zeros((kg.num_kernels, node_dim("ours")), dtype=np.float32)
    for k, members in enumerate(kg.groups):
        head = nodes[members[0]]
        token, attrs, known = encode_op(head)
        r = [0.0] * len(TOKENS)
        r[TOKENS.index(token)] = 1.0
        flops = macs = br = bw = pb = 0
        tt = ht = ut = 0.0
        cls_counts = [0.0] * len(OP_CLASSES)
        any_unknown = not known
        for m in members:
            nd = nodes[m]
            flops, macs, br, bw, pb = flops + nd.flops, macs + nd.macs, br + nd.bytes_read, \
                bw + nd.bytes_written, pb + nd.param_bytes
            tt += est.node_time_ms[m]
            ht += est.node_host_ms[m]
            ut = max(ut, est.node_utilisation[m])
            if nd.op_class in OP_CLASSES:
                cls_counts[OP_CLASSES.index(nd.op_class)] += 1.0
            if m != members[0] and not nd.known:
                any_unknown = True
        out = head.output_shape
        first_in = head.input_shapes[0] if head.input_shapes else ()
        shape = [_lg(head.output_elements), _lg(out[0] if len(out) > 0 else 1), _lg(out[1] if len(out) > 1 else 1),
                 _lg(math.prod(out[2:]) if len(out) > 2 else 1), float(len(out)),
                 _lg(math.prod(first_in) if first_in else 1)]
        rows[k] = (r + list(attrs) + shape
                   + [_lg(flops), _lg(macs), _lg(br), _lg(bw), _lg(pb), _lg(flops / (br + bw + 1.0))]
                   + [_lg(tt * 1e3), _lg(ht * 1e3), float(ut)]
                   + [float(any_unknown), _lg(len(members))] + [_lg(c) for c in cls_counts]
                   + [float(head.output_dtype == d) for d in _DTYPES] + [1.0])
    assert len(attrs) == ATTR_WIDTH
    return rows


def test_node_features_equal_the_per_node_reference() -> None:
    params = dippm_nas.get_predictor("a100-sxm4-40gb").prior_params
    for g in _graphs():
        for device in ("a100-sxm4-40gb", "rtx-4090"):
            f = featurize(g, device, prior_params=params)
            ref = _reference_rows(g, device, params)
            assert f.x.dtype == ref.dtype and f.x.shape == ref.shape
            assert np.array_equal(f.x.view(np.uint32), ref.view(np.uint32))  # bit for bit, signed zeros too
            est = f.estimate
            e = utilisation_energy_j(est.node_time_ms, est.node_utilisation, est.latency_ms, resolve_device(device))
            assert f.static[17] == np.float32(_lg(e * 1e3 if e is not None else 0.0))


def test_slice_latency_and_memory_parts_equal_the_full_estimate() -> None:
    dev = resolve_device("a100-sxm4-40gb")
    for g in _graphs()[:6]:
        for p in dev.mig_profiles:
            sl = dev.mig_slice(p)
            for runtime in ("eager", "compiled"):
                rt = DeploymentSettings(runtime=runtime)
                assert estimate_latency_ms(g, sl, deployment=rt) == estimate(g, sl, deployment=rt).latency_ms
        fresh = OperatorGraph.from_dict(g.to_dict())
        parts = gpu_memory_parts(fresh, activation_liveness(fresh, retention=True, include_inputs=False),
                                 context_mib=dev.runtime_baseline_mib, cublas_workspace_mib=dev.cublas_workspace_mib,
                                 uses_cublas=any(n.op_class in ("matmul", "attention") and not n.is_constant
                                                 for n in fresh.nodes),
                                 uses_cudnn=any(n.op_class == "conv" and not n.is_constant for n in fresh.nodes))
        for params in (default_params(), dippm_nas.get_predictor("a100-sxm4-40gb").prior_params):
            est = estimate(g, dev, params=params)
            assert (est.memory_mib, est.memory_mib_std, est.peak_node) == (parts.total_mib, parts.std_mib,
                                                                            parts.peak_node)
            assert est.memory_details == parts.details()


def _close(a: Any, b: Any, path: str = "") -> None:
    assert_close(a, b, rel=KERNEL_PATH_REL, abs_tol=1e-12, path=path)


@pytest.mark.parametrize("device,kw", SETTINGS, ids=[f"{d}-{json.dumps(k)}" for d, k in SETTINGS])
def test_predictions_equal_the_fixed_expected_values(device: str, kw: dict[str, Any]) -> None:
    with lzma.open(DATA / "inference_expected.json.xz", "rt") as f:
        expected = json.load(f)[f"{device}|{json.dumps(kw, sort_keys=True)}"]
    set_predictor(device, None)  # a fresh predictor: nothing answered from its caches
    got = [json.loads(json.dumps(p.to_dict())) for p in dippm_nas.predict_many(_graphs(), device, **kw)]
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        _close(a, b, f"[{i}]")


#: Set by ``.ci/run`` for its second run of the numeric-equality tests: the kernel path that run must take.
KERNEL_PATH_ENV = "DIPPM_NAS_TEST_KERNEL_PATH"


def test_the_kernel_path_asked_for_is_in_effect() -> None:
    """Under ``DIPPM_NAS_TEST_KERNEL_PATH=older`` (with :func:`kernel_paths.older_kernel_env`), torch runs ATen's
    generic kernels, numpy's OpenBLAS its Haswell ones and numpy's ufuncs their baseline: the second run is on
    another kernel path, not the default one again."""
    from kernel_paths import OLDER_KERNELS, kernel_path_report

    if os.environ.get(KERNEL_PATH_ENV) != "older":
        pytest.skip(f"{KERNEL_PATH_ENV}=older is set by .ci/run for its run on the older kernel path")
    missing = {k: v for k, v in OLDER_KERNELS.items() if os.environ.get(k) != v}
    assert not missing, f"the older kernel path needs {missing}"
    report = kernel_path_report()
    assert report["aten"] == "DEFAULT", report
    assert report["openblas"] in ("Haswell", "?"), report  # "?": numpy not built on OpenBLAS
    assert report["numpy_tanh_f32"].startswith(("baseline", "?")), report


def test_predict_assembles_a_space_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dippm_nas.predictor._api as api

    clear_block_memo()
    cache = ConversionCache(f"sqlite:///{tmp_path / 'blocks.sqlite'}")
    cfg = ss.get_space("mlp").validate({"in_features": 12, "hidden": [16, 8], "activation": "gelu",
                                        "norm": "batchnorm", "out_features": 3})
    spec = ss.get_space("mlp").input_spec(cfg, batch_size=4)
    expected = dippm_nas.predict(assemble("mlp", cfg, spec, cache=cache), device="h100-sxm5-80gb")
    monkeypatch.setattr(api, "capture", lambda *a, **k: pytest.fail("a space model was exported whole"))
    got = dippm_nas.predict(ss.build_model("mlp", cfg), spec, device="h100-sxm5-80gb", cache=cache)
    assert got == expected
    cache.close()
    clear_block_memo()


def write_expected(devices: tuple[str, ...]) -> None:
    """Rewrite the expected values of ``devices``' settings with this code's predictions (after a deliberate
    change of what those devices answer, e.g. a retrained checkpoint): ``python tests/predictor/test_inference_equality.py
    a100-sxm4-40gb``. The other settings keep their values."""
    path = DATA / "inference_expected.json.xz"
    with lzma.open(path, "rt") as f:
        expected = json.load(f)
    for device, kw in SETTINGS:
        if device in devices:
            set_predictor(device, None)
            expected[f"{device}|{json.dumps(kw, sort_keys=True)}"] = [
                json.loads(json.dumps(p.to_dict())) for p in dippm_nas.predict_many(_graphs(), device, **kw)]
    with lzma.open(path, "wt") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    import sys

    write_expected(tuple(sys.argv[1:]))
