"""Multi-trial NAS with NNI 3.0 where dippm-nas's predicted A100 latency filters candidates before training.

    python examples/nni/nas_example.py --max-trials 4 --max-latency-ms 0.15

Strategy ``Chain(Random(), Filter(profiler.as_filter(...)))``: NNI's random strategy proposes samples of
``TinyConvSpace``; the Filter middleware drops those whose predicted latency (DippmProfiler) is over the
bound, so they are never trained. The survivors are trained a few steps on a seeded synthetic image task
and report accuracy plus predicted cost (``dippm_nas.nni.report``).

The experiment uses NNI's sequential execution engine: everything runs in this process and no NNI manager
(and so no REST server) is started.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nni.nas.evaluator import FunctionalEvaluator
from nni.nas.experiment import NasExperiment, NasExperimentConfig
from nni.nas.strategy import Random
from nni.nas.strategy.middleware import Chain, Filter

from dippm_nas import InputSpec
from dippm_nas.nni import DippmProfiler, TinyConvSpace, report

SPEC = InputSpec(shape=(3, 32, 32), batch_size=8)
N_CLASSES = 4


def synthetic_images(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded 4-class 32x32 images: a class colour (one mean per channel) under heavy pixel noise;
    256 train, 128 test.

    Shapes:
        x_train ``(256, 3, 32, 32)``, y_train ``(256,)``, x_test ``(128, 3, 32, 32)``, y_test ``(128,)``
    """
    g = torch.Generator().manual_seed(seed)
    colours = 0.3 * torch.randn(N_CLASSES, 3, 1, 1, generator=g)
    y = torch.randint(0, N_CLASSES, (384,), generator=g)
    x = colours[y] + torch.randn(384, 3, 32, 32, generator=g)
    return x[:256], y[:256], x[256:], y[256:]


def evaluate_model(model: nn.Module) -> None:
    """NNI evaluator: 10 full-batch gradient steps of size 0.3, then report test accuracy and predicted cost."""
    torch.set_num_threads(1)
    x_tr, y_tr, x_te, y_te = synthetic_images()
    model.train()
    for _ in range(10):
        model.zero_grad()
        nn.functional.cross_entropy(model(x_tr), y_tr).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.3 * p.grad
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x_te).argmax(1) == y_te).float().mean())
    report(accuracy, model, SPEC)


def run(max_trials: int = 4, max_latency_ms: float = 0.15, workdir: str | Path | None = None) -> dict[str, Any]:
    """Run the NAS experiment; returns the trained samples' metrics and what the filter dropped."""
    space = TinyConvSpace(num_classes=N_CLASSES)
    profiler = DippmProfiler(space, SPEC, metric="latency_ms")
    keep = profiler.as_filter(max_latency_ms)
    dropped: list[dict[str, Any]] = []

    def filter_fn(model: Any) -> bool:
        ok = keep(model)
        if not ok:
            dropped.append({"sample": dict(model.sample), "latency_ms": profiler.profile(model.sample)})
        return ok

    strategy = Chain(Random(seed=0, dedup=True), Filter(filter_fn, patience=50))
    config = NasExperimentConfig("sequential", "raw")
    config.max_trial_number = max_trials
    if workdir is not None:
        config.experiment_working_directory = str(workdir)
    exp = NasExperiment(space, FunctionalEvaluator(evaluate_model), strategy, config)
    try:
        exp.run()
        trained = [{"sample": dict(m.sample), "metrics": m.metrics.final,
                    "predicted_latency_ms": profiler.profile(m.sample)}
                   for m in strategy.list_models() if m.metrics.final is not None]
    finally:
        exp.stop()
    return {"trained": trained, "filtered_out": dropped, "max_latency_ms": max_latency_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-trials", type=int, default=4)
    ap.add_argument("--max-latency-ms", type=float, default=0.15)
    ap.add_argument("--workdir", default=None, help="NNI experiment directory (default ~/nni-experiments)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run(args.max_trials, args.max_latency_ms, args.workdir)
    if args.json:
        print(json.dumps(out))
    else:
        for t in out["trained"]:
            print(f"trained {t['sample']}: {t['metrics']}")
        for d in out["filtered_out"]:
            print(f"filtered out {d['sample']}: predicted {d['latency_ms']:.3f} ms > {out['max_latency_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
