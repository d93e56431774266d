"""scikit-learn's 8x8 digits for the ``demo_cnn`` space: the data, a seconds-bounded training loop, and an
Optuna suggestion of a ``demo_cnn`` config.

``dippm-nas demo``, ``examples/optuna/`` and ``benchmarks/speed/bench_optuna_overhead.py`` train their candidates
with these. The digits ship inside scikit-learn (no download; ``pip install 'dippm-nas[demo]'``).

Usage::

    import search_spaces as ss

    data = ss.load_digits(seed=0)
    cfg = ss.suggest_demo_cnn(trial)                 # an optuna.Trial (or anything with suggest_*)
    model = ss.build_model("demo_cnn", cfg)
    result = ss.train_digits(model, data, cfg["resolution"], seconds=3.0, epochs=10, seed=0)
    result.accuracy                                  # held-out accuracy after at most 3 s of training
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from dippm_nas.errors import MissingDependencyError

__all__ = ["Digits", "DigitsTraining", "load_digits", "train_digits", "suggest_demo_cnn",
           "LEARNING_RATE", "TRAIN_BATCH", "HOLDOUT_FRACTION"]

#: Optimiser settings of :func:`train_digits` (Adam, mini-batches); chosen to learn digits in a few epochs.
LEARNING_RATE = 3e-3
#: Images per optimiser step of :func:`train_digits`.
TRAIN_BATCH = 64
#: Share of the digits held out for the accuracy (stratified split).
HOLDOUT_FRACTION = 0.2


@dataclass
class Digits:
    """The digits as float tensors in [0, 1], split into a training and a held-out part.

    Shapes:
        ``x_train``: ``(n_train, 1, 8, 8)``; ``y_train``: ``(n_train,)`` (int64 labels 0..9);
        ``x_test`` / ``y_test`` likewise for the held-out part.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    _resized: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def at_resolution(self, resolution: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_train, x_test)`` up-sampled (bilinear) to ``resolution`` x ``resolution``; cached."""
        if resolution < 1:
            raise ValueError(f"resolution must be >= 1, got {resolution}")
        if resolution not in self._resized:
            if resolution == self.x_train.shape[-1]:
                self._resized[resolution] = (self.x_train, self.x_test)
            else:
                self._resized[resolution] = tuple(  # type: ignore[assignment]
                    F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False)
                    for x in (self.x_train, self.x_test))
        return self._resized[resolution]


@dataclass(frozen=True)
class DigitsTraining:
    """What :func:`train_digits` did.

    Attributes:
        accuracy: held-out accuracy, 0..1.
        train_s: wall time of training and scoring, seconds.
        train_steps: optimiser steps.
        train_epochs: epochs done (fractional when the time budget ended one).
    """

    accuracy: float
    train_s: float
    train_steps: int
    train_epochs: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields."""
        return asdict(self)


def load_digits(seed: int = 0) -> Digits:
    """scikit-learn's digits, split stratified and seeded (:data:`HOLDOUT_FRACTION` held out).

    Raises:
        MissingDependencyError: scikit-learn is not installed (the message says ``pip install 'dippm-nas[demo]'``).
    """
    try:
        from sklearn import datasets, model_selection
    except ImportError as e:
        raise MissingDependencyError(f"the digits dataset needs scikit-learn, which is not installed ({e}). "
                                     "Install it with: pip install 'dippm-nas[demo]'") from e
    x, y = datasets.load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = model_selection.train_test_split(
        x, y, test_size=HOLDOUT_FRACTION, random_state=seed, stratify=y)

    def images(a: Any) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0  # pixel values are 0..16

    return Digits(x_train=images(x_tr), y_train=torch.tensor(y_tr), x_test=images(x_te), y_test=torch.tensor(y_te))


def train_digits(model: torch.nn.Module, data: Digits, resolution: int, *, seconds: float, epochs: int,
                 seed: int = 0) -> DigitsTraining:
    """Train ``model`` with Adam for at most ``epochs`` epochs and ``seconds`` seconds, then score it.

    Args:
        model: a ``(N, 1, resolution, resolution) -> (N, 10)`` classifier (a ``demo_cnn`` model); trained in
            place and left in eval mode.
        data: from :func:`load_digits`.
        resolution: image side the model takes (digits are up-sampled to it).
        seconds: training time budget, seconds (checked after each step).
        epochs: most epochs.
        seed: shuffling seed.
    """
    if seconds <= 0 or epochs < 1:
        raise ValueError(f"seconds must be > 0 and epochs >= 1, got seconds={seconds}, epochs={epochs}")
    x_tr, x_te = data.at_resolution(resolution)
    y_tr, y_te = data.y_train, data.y_test
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    model.train()
    t0 = time.perf_counter()
    steps, done_epochs, out_of_time = 0, 0.0, False
    n = len(y_tr)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, TRAIN_BATCH):
            idx = perm[i:i + TRAIN_BATCH]
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if time.perf_counter() - t0 >= seconds:
                out_of_time = True
                done_epochs += min(i + TRAIN_BATCH, n) / n
                break
        if out_of_time:
            break
        done_epochs += 1
    model.eval()
    with torch.inference_mode():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item()
    return DigitsTraining(accuracy=acc, train_s=time.perf_counter() - t0, train_steps=steps,
                          train_epochs=done_epochs)


def suggest_demo_cnn(trial: Any) -> dict[str, Any]:
    """A ``demo_cnn`` config for the digits from an Optuna trial's ``suggest_*`` calls.

    Parameters: ``stages`` (1..3), ``resolution`` (8, 16, 32), ``width_<i>`` (4..256, log),
    ``blocks_<i>`` (1..3), ``kernel_size`` (3, 5), ``batchnorm``, ``activation`` (relu, gelu, silu).
    """
    stages = trial.suggest_int("stages", 1, 3)
    return {
        "resolution": trial.suggest_categorical("resolution", [8, 16, 32]),
        "widths": [trial.suggest_int(f"width_{i}", 4, 256, log=True) for i in range(stages)],
        "blocks": [trial.suggest_int(f"blocks_{i}", 1, 3) for i in range(stages)],
        "kernel_size": trial.suggest_categorical("kernel_size", [3, 5]),
        "batchnorm": trial.suggest_categorical("batchnorm", [True, False]),
        "activation": trial.suggest_categorical("activation", ["relu", "gelu", "silu"]),
        "in_channels": 1,
        "num_classes": 10,
    }
