"""NNI trial of the HPO example: train the MLP the tuner chose, report accuracy and predicted cost.

NNI runs this file once per trial (``trialCommand``). The tuner (dippm_nas.nni.HardwareAwareTuner) put the
model description, its budgets, device and input spec under ``params["dippm"]``: ``model_from_parameters``
rebuilds that exact model and ``report`` scores it with the tuner's budgets, so nothing is repeated here.

The data is synthetic and seeded (4 Gaussian classes in 32 dimensions), so the example needs no download;
the accuracy is measured on a held-out split of it. The cost figures are predictions for an A100, not
measurements.
"""

from __future__ import annotations

import nni
import torch
from torch import nn

from dippm_nas.nni import model_from_parameters, report

N_FEATURES, N_CLASSES = 32, 4


def synthetic_data(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A seeded 4-class problem: overlapping class means, unit-variance noise; 1024 train, 512 test samples.

    Shapes:
        x_train ``(1024, 32)``, y_train ``(1024,)``, x_test ``(512, 32)``, y_test ``(512,)``
    """
    g = torch.Generator().manual_seed(seed)
    means = 0.35 * torch.randn(N_CLASSES, N_FEATURES, generator=g)
    y = torch.randint(0, N_CLASSES, (1536,), generator=g)
    x = means[y] + torch.randn(1536, N_FEATURES, generator=g)
    return x[:1024], y[:1024], x[1024:], y[1024:]


def train_and_evaluate(model: nn.Module, lr: float, steps: int = 30) -> float:
    """Full-batch gradient descent (``steps`` steps of size ``lr``); returns test accuracy in [0, 1].

    Plain gradient descent keeps the trial's start-up short (``torch.optim`` imports ``torch._dynamo``).
    """
    x_tr, y_tr, x_te, y_te = synthetic_data()
    model.train()
    for _ in range(steps):
        model.zero_grad()
        nn.functional.cross_entropy(model(x_tr), y_tr).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    model.eval()
    with torch.no_grad():
        return float((model(x_te).argmax(1) == y_te).float().mean())


def main() -> None:
    torch.set_num_threads(1)  # trials may run side by side on a small machine
    params = nni.get_next_parameter()
    model, spec = model_from_parameters(params)
    accuracy = train_and_evaluate(model, lr=float(params.get("lr", 0.1)))
    report(accuracy, model.eval(), spec)  # budgets, device and runtime: the tuner's, from params["dippm"]


if __name__ == "__main__":
    main()
