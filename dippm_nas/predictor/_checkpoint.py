"""Where trained predictor checkpoints are found: the package's ``checkpoints/`` folder and
``$DIPPM_NAS_CHECKPOINT_DIR``. (The GNN loader lands with the GNN predictor.)"""

from __future__ import annotations

import os
from pathlib import Path

from dippm_nas.predictor._base import BasePredictor

__all__ = ["CHECKPOINT_DIR_ENV", "checkpoint_dirs", "find_checkpoint", "load_for_device"]

CHECKPOINT_DIR_ENV = "DIPPM_NAS_CHECKPOINT_DIR"


def checkpoint_dirs() -> list[Path]:
    """Folders searched for ``<device>.pt`` checkpoints, user folder first."""
    dirs = []
    user = os.environ.get(CHECKPOINT_DIR_ENV)
    if user:
        dirs.append(Path(user))
    dirs.append(Path(__file__).parent / "checkpoints")
    return dirs


def find_checkpoint(device: str) -> Path | None:
    """Path of the checkpoint for ``device``, or ``None``."""
    for d in checkpoint_dirs():
        p = d / f"{device}.pt"
        if p.is_file():
            return p
    return None


def load_for_device(device: str) -> BasePredictor | None:
    """The trained predictor for ``device`` or ``None`` when no checkpoint exists."""
    if find_checkpoint(device) is None:
        return None
    from dippm_nas.predictor._gnn import GnnPredictor  # the GNN predictor's own loader

    return GnnPredictor.load(find_checkpoint(device), device=device)
