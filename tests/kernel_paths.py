"""How closely the inference figures agree across CPU kernel paths and the two engines: the measurement behind
the tolerances of ``tests/predictor/test_inference_equality.py`` and ``tests/predictor/test_numpy_ensemble.py``.

``python tests/kernel_paths.py`` runs the sample of :mod:`test_inference_equality` (ten graphs, the six
settings) in one subprocess per kernel path of :data:`PATHS` (the default path; ATen's generic and AVX2 kernels;
OpenBLAS forced to older cores; MKL's compatible code branch; numpy's universal intrinsics without AVX-512 or
AVX2; one thread) and, in each, on the torch engine and on the numpy engine (the A100 settings and every
shipped host-CPU checkpoint), and prints per path and engine the largest relative difference of any float field
of ``Prediction.to_dict()`` from ``tests/data/inference_expected.json.xz`` and from the torch engine on the
default path, with the field. :data:`OLDER_KERNELS` is the environment ``.ci/run`` runs the numeric-equality
tests under a second time; :func:`older_kernel_env` adapts it to the installed numpy, and
``python tests/kernel_paths.py --env`` prints it as shell ``export`` lines.
"""

from __future__ import annotations

import json
import lzma
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: The older kernel path of CI's second run: ATen's generic (non-vectorised) kernels, OpenBLAS's Haswell kernels
#: (numpy), MKL's compatible code branch (torch's BLAS; ``MKL_ENABLE_INSTRUCTIONS`` caps the ISA on Intel CPUs,
#: ``MKL_CBWR=COMPATIBLE`` is honoured on AMD ones too) and numpy's baseline (SSE4.2) universal intrinsics.
OLDER_KERNELS: dict[str, str] = {"ATEN_CPU_CAPABILITY": "default", "OPENBLAS_CORETYPE": "Haswell",
                                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "MKL_CBWR": "COMPATIBLE"}

#: Kernel paths measured: name -> environment on top of the caller's.
PATHS: dict[str, dict[str, str]] = {
    "default": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "openblas-haswell": {"OPENBLAS_CORETYPE": "Haswell"},
    "openblas-sandybridge": {"OPENBLAS_CORETYPE": "Sandybridge"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "numpy-baseline": {"NPY_DISABLE_CPU_FEATURES": "<dispatch>"},
    "one-thread": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "older (CI)": {**OLDER_KERNELS, "NPY_DISABLE_CPU_FEATURES": "<dispatch>"},
}


def numpy_dispatch_targets() -> str:
    """The installed numpy's dispatched CPU features (space separated): disabling them all leaves its baseline."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__
    return " ".join(__cpu_dispatch__)


def older_kernel_env() -> dict[str, str]:
    """:data:`OLDER_KERNELS` plus ``NPY_DISABLE_CPU_FEATURES`` for the installed numpy."""
    return {**OLDER_KERNELS, "NPY_DISABLE_CPU_FEATURES": numpy_dispatch_targets()}


def kernel_path_report() -> dict[str, str]:
    """What this process runs: torch's ATen capability, OpenBLAS's core (numpy), numpy's ``tanh`` float32 target."""
    import numpy as np
    import torch

    out = {"aten": torch.backends.cpu.get_cpu_capability(), "openblas": "?", "numpy_tanh_f32": "?"}
    try:
        import threadpoolctl

        for lib in threadpoolctl.threadpool_info():
            if lib.get("internal_api") == "openblas":
                out["openblas"] = str(lib.get("architecture"))
    except ImportError:  # pragma: no cover
        pass
    try:
        from numpy.lib.introspect import opt_func_info

        out["numpy_tanh_f32"] = opt_func_info(func_name="^tanh$")["tanh"]["ff"]["current"]
    except (ImportError, KeyError):  # pragma: no cover - numpy < 2
        pass
    del np
    return out


def _child(engine: str) -> dict[str, Any]:
    """Predictions of the sample in this process, on ``engine`` (``"torch"`` or ``"numpy"``)."""
    sys.path.insert(0, str(HERE))
    import dippm_nas
    from dippm_nas.predictor import GnnPredictor, find_checkpoint, host_checkpoints, set_predictor
    from test_inference_equality import SETTINGS, _graphs

    graphs = _graphs()
    out: dict[str, Any] = {"path": kernel_path_report()}
    a100 = find_checkpoint("a100-sxm4-40gb")
    for device, kw in SETTINGS:
        if device == "a100-sxm4-40gb":
            set_predictor(device, GnnPredictor.load(a100, engine=engine, load_calibration=False))
        elif engine == "numpy":
            continue  # the analytic devices have no network
        else:
            set_predictor(device, None)
        key = f"{device}|{json.dumps(kw, sort_keys=True)}"
        out[key] = [json.loads(json.dumps(p.to_dict())) for p in dippm_nas.predict_many(graphs, device, **kw)]
    for ckpt, _ in host_checkpoints():
        pred = GnnPredictor.load(ckpt, engine=engine, load_calibration=False)
        out[f"host|{ckpt.stem}"] = [json.loads(json.dumps(p.to_dict())) for p in pred.predict_graphs(graphs[6:])]
    return out


def _rel_diffs(a: Any, b: Any, path: str, out: dict[str, float]) -> None:
    if isinstance(a, float) and isinstance(b, float):
        if math.isfinite(a) and math.isfinite(b) and a != b:
            out[path] = abs(a - b) / max(abs(a), abs(b))
    elif isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() & b.keys():
            _rel_diffs(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            _rel_diffs(x, y, f"{path}[{i}]", out)


def largest_difference(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, str]:
    """The largest relative difference of any float both results hold, and its path (``(0.0, "")``: equal)."""
    diffs: dict[str, float] = {}
    for key in a.keys() & b.keys() - {"path"}:
        _rel_diffs(a[key], b[key], key, diffs)
    if not diffs:
        return 0.0, ""
    worst = max(diffs, key=diffs.__getitem__)
    return diffs[worst], worst


def main() -> None:
    with lzma.open(HERE / "data" / "inference_expected.json.xz", "rt") as f:
        expected = json.load(f)
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for name, extra in PATHS.items():
        env = {**os.environ, **{k: numpy_dispatch_targets() if v == "<dispatch>" else v for k, v in extra.items()}}
        for engine in ("torch", "numpy"):
            res = subprocess.run([sys.executable, __file__, "--child", engine], env=env, capture_output=True,
                                 text=True, check=True)
            runs[name, engine] = json.loads(res.stdout.strip().splitlines()[-1])
    base = runs["default", "torch"]
    print(f"{'path':22} {'engine':6} {'aten':8} {'openblas':11} {'np tanh':8} {'vs expected':>12}  "
          f"{'vs default torch':>16}  largest at")
    overall = 0.0
    for (name, engine), r in runs.items():
        d_exp, at_exp = largest_difference(r, expected)
        d_ref, at_ref = largest_difference(r, base)
        overall = max(overall, d_exp, d_ref)
        p = r["path"]
        print(f"{name:22} {engine:6} {p['aten']:8} {p['openblas']:11} {p['numpy_tanh_f32']:8} {d_exp:12.2e}  "
              f"{d_ref:16.2e}  {at_exp or at_ref}")
    print(f"largest relative difference over every path and engine: {overall:.2e}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2])))
    elif sys.argv[1:] == ["--env"]:  # for the shell: eval "$(python tests/kernel_paths.py --env)"
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in older_kernel_env().items()))
    else:
        main()
