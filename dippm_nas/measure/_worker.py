"""The subprocess side of ``measure(..., isolate=True)``: ``python -m dippm_nas.measure._worker REQ RES``.

Reads the JSON request written by :func:`dippm_nas.measure._isolate.measure_isolated`, builds the model,
measures it in this fresh process and writes ``{"measurement": ...}`` (or ``{"usage_error": ...}`` for
a :class:`~dippm_nas.errors.DippmNasError` the caller should see raised) as JSON. Exceptions of the
user's builder are left to crash the worker: the parent turns the exit status and stderr into an
``"error"`` row. Not imported by the package (so ``-m`` runs it once, as ``__main__``).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from dippm_nas import errors
from dippm_nas.errors import ModelSpecError
from dippm_nas.measure._api import measure
from dippm_nas.measure._measurement import MeasureSettings
from dippm_nas.capture import load_model
from dippm_nas.spec import InputSpec

__all__ = ["main"]


def _build(model: str, model_kwargs: dict[str, Any] | None) -> Any:
    if model_kwargs is None:
        return load_model(model)
    module_name, sep, attr = model.partition(":")
    if not sep or not attr:
        raise ModelSpecError(f"model_kwargs need a 'package.module:callable' SPEC, got {model!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ModelSpecError(f"cannot import module {module_name!r} of model SPEC {model!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelSpecError(f"module {module_name!r} has no attribute {attr!r} (model SPEC {model!r})")
        obj = getattr(obj, part)
    built = obj(**model_kwargs)
    return built.eval() if hasattr(built, "eval") else built


def main(request_path: str, result_path: str) -> int:
    """Build, measure, write JSON; returns the exit status."""
    req = json.loads(Path(request_path).read_text())
    try:
        model = _build(req["model"], req.get("model_kwargs"))
        row = measure(model, InputSpec.from_dict(req["spec"]), torch_device=req["device"],
                      settings=MeasureSettings.from_dict(req["settings"]))
        out: dict[str, Any] = {"measurement": row.to_dict()}
    except errors.DippmNasError as e:
        out = {"usage_error": {"type": type(e).__name__, "message": str(e)}}
    Path(result_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":  # pragma: no cover - runs in the worker process
    sys.exit(main(sys.argv[1], sys.argv[2]))
