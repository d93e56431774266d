"""Few-shot calibration: a per-device, per-target linear correction in log space.

Given a few real measurements of one device, ``GnnPredictor.calibrate(pairs)`` fits, for every target
with labels,

    log y_calibrated = a + b * log y_predicted

with ``b`` shrunk towards 1 (ridge weight :data:`SLOPE_PRIOR`), so five measurements mostly fix the
offset and twenty can also fix the slope. The residual spread of the fit widens the prediction's
standard deviation. The correction is written as JSON to ``<cache_dir>/calibration/<device>.json``
together with the checkpoint's identity (device, date, schema, and the CPU model of a host
checkpoint) and re-applied whenever that same checkpoint is loaded again; a file for another
checkpoint is ignored with a warning. Calibrated figures have source ``"calibrated"``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dippm_nas.errors import DippmNasError

if TYPE_CHECKING:  # pragma: no cover
    from dippm_nas.predictor._gnn import CheckpointMeta

__all__ = ["Calibration", "fit_calibration", "save_calibration", "load_calibration", "delete_calibration",
           "calibration_path", "SLOPE_PRIOR"]

logger = logging.getLogger(__name__)

#: Ridge weight pulling the slope towards 1 (in squared log units, like the spread of the predictions).
SLOPE_PRIOR = 0.5
_TARGETS = ("latency_ms", "energy_j", "memory_mib")


@dataclass(frozen=True)
class Calibration:
    """A fitted correction for one device.

    Attributes:
        device: catalogue id.
        checkpoint: identity of the checkpoint it was fitted for (``device@date/schema``).
        coef: ``{target: [a, b, residual_std_log]}``.
        n: ``{target: measurements used}``.
        date: ISO time of the fit.
    """

    device: str
    checkpoint: str
    coef: dict[str, list[float]]
    n: dict[str, int]
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def has(self, target: str) -> bool:
        return target in self.coef

    def apply(self, target: str, mean_log: float, std_log: float) -> tuple[float, float]:
        """Corrected ``(mean_log, std_log)`` of one target."""
        a, b, s = self.coef[target]
        return a + b * mean_log, math.hypot(b * std_log, s)


def checkpoint_identity(meta: "CheckpointMeta") -> str:
    ident = f"{meta.device}@{meta.date}/schema{meta.feature_schema_version}/{meta.feature_style}"
    if meta.host is not None:  # host-cpu checkpoints of two CPU models can share a date
        ident += f"/cpu={meta.host['cpu_model']}"
    return ident


def fit_calibration(device: str, meta: "CheckpointMeta", pred_log: np.ndarray,
                    labels: Sequence[Mapping[str, float]], *, targets: Sequence[str] | None = None) -> Calibration:
    """Fit the correction from predictions (log, ``[n, 3]``) and measured labels (units of the targets).

    Raises:
        DippmNasError: no target has a label.
    """
    coef: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for t_i, t in enumerate(_TARGETS):
        if targets is not None and t not in targets:
            continue
        rows = [(float(pred_log[i, t_i]), math.log(y[t])) for i, y in enumerate(labels) if t in y and y[t] > 0]
        if not rows:
            continue
        m = np.array([r[0] for r in rows])
        y = np.array([r[1] for r in rows])
        mc, yc = m - m.mean(), y - y.mean()
        b = float((mc @ yc + SLOPE_PRIOR) / (mc @ mc + SLOPE_PRIOR))
        a = float(y.mean() - b * m.mean())
        res = y - (a + b * m)
        s = float(np.sqrt((res ** 2).sum() / max(len(rows) - 1, 1))) if len(rows) > 1 else 0.0
        coef[t] = [a, b, s]
        counts[t] = len(rows)
    if not coef:
        raise DippmNasError(f"no measurement holds a label for the targets {list(targets or _TARGETS)}")
    return Calibration(device=device, checkpoint=checkpoint_identity(meta), coef=coef, n=counts)


def calibration_path(device: str) -> Path:
    from dippm_nas._paths import cache_dir

    return cache_dir() / "calibration" / f"{device}.json"


def save_calibration(cal: Calibration) -> Path:
    """Write the calibration JSON; returns its path."""
    p = calibration_path(cal.device)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(asdict(cal), indent=1, sort_keys=True) + "\n")
    logger.info("calibration of %s written to %s", cal.device, p)
    return p


def delete_calibration(device: str) -> None:
    p = calibration_path(device)
    if p.is_file():
        p.unlink()


def load_calibration(device: str, meta: "CheckpointMeta") -> Calibration | None:
    """The persisted calibration of ``device`` if it was fitted for this checkpoint, else ``None``."""
    p = calibration_path(device)
    if not p.is_file():
        return None
    try:
        d: dict[str, Any] = json.loads(p.read_text())
        cal = Calibration(**d)
    except (ValueError, TypeError) as e:
        logger.warning("ignoring unreadable calibration file %s: %s", p, e)
        return None
    if cal.checkpoint != checkpoint_identity(meta):
        logger.warning("ignoring calibration %s: fitted for checkpoint %s, loaded checkpoint is %s", p,
                       cal.checkpoint, checkpoint_identity(meta))
        return None
    return cal
