"""Where engine adaptations live: one JSON file per ``(device, engine, version)`` under
``<cache dir>/engine_adaptations`` (or a directory of your own), read back by :func:`adapted_engine`.

:func:`~dippm_nas.llm.adapt_engine` writes them; :func:`~dippm_nas.llm.predict_generation` reads the one of its
device and of the engine version its deployment names (``Deployment(versions={"vllm": "0.6.3"})``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dippm_nas._files import write_output
from dippm_nas._json import read_json_file
from dippm_nas._paths import cache_dir
from dippm_nas.errors import AdaptationError, InvalidValueError
from dippm_nas.llm._engines import ENGINES, ServingEngine, serving_engine

__all__ = ["EngineAdaptation", "adapted_engine", "save_adaptation", "check_adaptation_key", "ADAPTED_CONSTANTS",
           "ADAPTATIONS_DIR"]

#: The constants a few runs refit: (name, probe step, lower bound, upper bound).
ADAPTED_CONSTANTS: tuple[tuple[str, float, float, float], ...] = (
    ("decode_gpu_scale", 1.0, 0.3, 5.0), ("step_us", 1000.0, 0.0, 50000.0), ("seq_us", 100.0, 0.0, 5000.0))
#: The directory of the adaptations under the cache directory.
ADAPTATIONS_DIR = "engine_adaptations"
_FORMAT = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class EngineAdaptation:
    """An engine's constants refitted on measured runs of one (device, engine, version).

    Attributes:
        device, engine, version: what the runs measured.
        constants: the refitted constants (:data:`ADAPTED_CONSTANTS`).
        sigma_log: RMS held-out log error of the measured figures at ``shrink`` (the worse of leave-one-run-out
            and leave-one-prompt-length-out).
        runs: how many runs; ``heldout_mape_pct``: their held-out MAPE at ``shrink``.
        shrink: the fraction of the fitted change of the constants kept (0: the starting engine's constants; the
            held-out runs did not confirm a correction).
        path: the JSON file it is stored in (``None``: not persisted).
    """

    device: str
    engine: str
    version: str
    constants: dict[str, float]
    sigma_log: float
    runs: int
    heldout_mape_pct: float
    shrink: float = 1.0
    path: str | None = None

    def serving_engine(self, base: ServingEngine | None = None) -> ServingEngine:
        """``base`` (default the shipped engine) with these constants and σ."""
        return dataclasses.replace(base or serving_engine(self.engine), **self.constants, sigma_log=self.sigma_log,
                                   fitted=True, source=f"adapted on {self.runs} measured runs of {self.device}, "
                                                       f"{self.engine} {self.version}")


def check_adaptation_key(device: str, engine: str, version: str) -> None:
    """Raise :class:`InvalidValueError` for an unknown engine or an empty device or version."""
    if engine not in ENGINES:
        raise InvalidValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    for name, v in (("device", device), ("version", version)):
        if not isinstance(v, str) or not v.strip():
            raise InvalidValueError(f"{name} must be a non-empty string, got {v!r}")


def _file(device: str, engine: str, version: str, storage: str | Path | None) -> Path:
    root = Path(storage) if storage is not None else cache_dir() / ADAPTATIONS_DIR
    return root / f"{_SAFE.sub('_', device)}__{engine}__{_SAFE.sub('_', version)}.json"


def save_adaptation(ad: EngineAdaptation, runs: Sequence[Any], storage: str | Path | None) -> Path:
    """Write ``ad`` and the runs it was fitted on (their ``to_dict()``) as JSON; returns the file."""
    path = _file(ad.device, ad.engine, ad.version, storage)
    doc = {"format": _FORMAT, **{k: v for k, v in dataclasses.asdict(ad).items() if k != "path"},
           "heldout_mape_pct": None if math.isnan(ad.heldout_mape_pct) else ad.heldout_mape_pct,
           "measured_runs": [r.to_dict() for r in runs]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AdaptationError(f"cannot write the engine adaptation {path}: {e}") from e
    return write_output(path, json.dumps(doc, indent=1) + "\n", "the engine adaptation", error=AdaptationError)


def adapted_engine(device: str, engine: str, version: str, *,
                   storage: str | Path | None = None) -> ServingEngine | None:
    """The engine adapted for ``(device, engine, version)`` by :func:`adapt_engine`, or ``None`` when none is stored.

    Raises:
        AdaptationError: a stored file that is not an adaptation of this format.
    """
    check_adaptation_key(device, engine, version)
    path = _file(device, engine, version, storage)
    if not path.is_file():
        return None
    d = read_json_file(path, f"{path}: not an engine adaptation", AdaptationError)
    try:
        if d.get("format") != _FORMAT:
            raise ValueError(f"format {d.get('format')!r}, expected {_FORMAT}")
        consts = {n: float(d["constants"][n]) for n, _, _, _ in ADAPTED_CONSTANTS}
        ad = EngineAdaptation(device=d["device"], engine=d["engine"], version=d["version"], constants=consts,
                              sigma_log=float(d["sigma_log"]), runs=int(d["runs"]),
                              heldout_mape_pct=math.nan if d.get("heldout_mape_pct") is None
                              else float(d["heldout_mape_pct"]), shrink=float(d.get("shrink", 1.0)),
                              path=str(path))
        return ad.serving_engine()
    except (ValueError, KeyError, TypeError, AttributeError, InvalidValueError) as e:
        raise AdaptationError(f"{path}: not an engine adaptation: {e}") from e
