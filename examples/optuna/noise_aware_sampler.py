"""The cost model's per-trial σ handed to a sampler that models noise: a heteroscedastic Gaussian process.

A predicted latency is a mean and a standard deviation. A sampler that fits a surrogate to the trials' values can
weigh each trial by how sure its value is: a candidate predicted at 4 ms ± 40 % should pull the surrogate less than
one at 4 ms ± 2 %. Optuna's own :class:`optuna.samplers.GPSampler` (Optuna 5) fits one noise variance for every trial
(or none, ``deterministic_objective=True``) and takes no per-trial noise; OptunaHub's samplers load their code from
GitHub at run time, not from PyPI. So this example carries its own small sampler, :class:`HeteroscedasticGPSampler`:
a Gaussian process on the trials' log values (Matérn 5/2 kernel on the parameters scaled to [0, 1], log-scaled where
the distribution is) whose noise variance on trial ``i`` is ``(std_i / value_i) ** 2``, the σ in log space that
:class:`~dippm_nas.optuna.HardwareCostModel` records on the trial (``predicted_latency_ms_std``); the next candidate
minimises the lower confidence bound ``mu - beta * sd`` over random points.

The study: the ``demo_cnn`` space's candidates on an A100 at batch 256, float16, minimising the predicted latency
per million parameters (ms / Mparam: what the GPU makes of a parameter budget; the parameter count is exact, so the
objective's σ in log space is the latency's).

    python examples/optuna/noise_aware_sampler.py --trials 40
    python examples/optuna/noise_aware_sampler.py --trials 8 --startup 4     # a smoke run
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

import search_spaces as ss
from dippm_nas.optuna import HardwareCostModel


def _matern52(a: np.ndarray, b: np.ndarray, lengthscale: float) -> np.ndarray:
    d = np.sqrt(np.maximum(((a[:, None, :] - b[None]) ** 2).sum(2), 0.0)) / lengthscale
    return (1 + math.sqrt(5) * d + 5 / 3 * d ** 2) * np.exp(-math.sqrt(5) * d)


class HeteroscedasticGPSampler(optuna.samplers.BaseSampler):
    """A GP sampler whose noise variance on each trial is that trial's own (module docstring).

    Args:
        noise_attr: the user attribute holding a trial's standard deviation (same unit as its value).
        value_attr: the user attribute the standard deviation is relative to (default: the trial's value).
        n_startup_trials: random trials before the GP is used.
        n_candidates: random points the acquisition is minimised over.
        lengthscale: the kernel's lengthscale on the [0, 1] parameters.
        beta: the lower confidence bound's width.
        seed: the random generator's seed.
    """

    def __init__(self, *, noise_attr: str = "predicted_latency_ms_std", value_attr: str | None = None,
                 n_startup_trials: int = 8, n_candidates: int = 512, lengthscale: float = 0.3, beta: float = 2.0,
                 seed: int | None = None) -> None:
        self.noise_attr, self.value_attr = noise_attr, value_attr
        self.n_startup_trials, self.n_candidates = n_startup_trials, n_candidates
        self.lengthscale, self.beta = lengthscale, beta
        self._rng = np.random.default_rng(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._space = optuna.search_space.IntersectionSearchSpace()
        #: per GP fit, the noise variances (log space) the trials were given: what the example prints and tests read
        self.noise_log_var: list[np.ndarray] = []

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {n: d for n, d in self._space.calculate(study).items()
                if isinstance(d, (FloatDistribution, IntDistribution)) and d.low < d.high}

    def _unit(self, d: BaseDistribution, v: float) -> float:
        lo, hi, x = (math.log(d.low), math.log(d.high), math.log(v)) if d.log else (d.low, d.high, v)
        return (x - lo) / (hi - lo)

    def _from_unit(self, d: BaseDistribution, u: float) -> float:
        lo, hi = (math.log(d.low), math.log(d.high)) if d.log else (d.low, d.high)
        x = lo + u * (hi - lo)
        x = math.exp(x) if d.log else x
        return int(min(max(round(x), d.low), d.high)) if isinstance(d, IntDistribution) else x

    def _noise(self, t: FrozenTrial) -> float:
        """The trial's σ in log space, squared (0 when it records none)."""
        std = t.user_attrs.get(self.noise_attr)
        ref = t.user_attrs.get(self.value_attr) if self.value_attr else None
        ref = ref if ref is not None else (t.value if t.value is not None else None)
        if std is None or ref is None or not ref > 0:
            return 0.0
        return (float(std) / float(ref)) ** 2

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and t.value > 0 and all(n in t.params for n in search_space)]
        if not search_space or len(done) < self.n_startup_trials:
            return {}
        names = sorted(search_space)
        x = np.array([[self._unit(search_space[n], t.params[n]) for n in names] for t in done])
        y = np.log([t.value for t in done])
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MINIMIZE else -1.0
        mu_y, sd_y = y.mean(), max(y.std(), 1e-9)
        z = sign * (y - mu_y) / sd_y
        noise = np.array([self._noise(t) for t in done]) / sd_y ** 2
        self.noise_log_var.append(noise * sd_y ** 2)
        k = _matern52(x, x, self.lengthscale) + np.diag(noise + 1e-6)
        chol = np.linalg.cholesky(k)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
        cand = self._rng.uniform(0, 1, (self.n_candidates, len(names)))
        ks = _matern52(cand, x, self.lengthscale)
        mean = ks @ alpha
        v = np.linalg.solve(chol, ks.T)
        sd = np.sqrt(np.maximum(1.0 - (v ** 2).sum(0), 1e-12))
        best = cand[int(np.argmin(mean - self.beta * sd))]
        return {n: self._from_unit(search_space[n], float(u)) for n, u in zip(names, best)}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)


def main(argv: Sequence[str] | None = None) -> optuna.Study:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--startup", type=int, default=8, help="random trials before the GP")
    ap.add_argument("--device", default="a100-sxm4-40gb")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    cost = HardwareCostModel(args.device, objectives=("latency_ms",))
    # the objective's σ in log space is the latency's (the parameter count is exact): std / mean of the latency
    sampler = HeteroscedasticGPSampler(noise_attr="predicted_latency_ms_std", value_attr="predicted_latency_ms",
                                       n_startup_trials=args.startup, seed=args.seed)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    space = ss.get_space("demo_cnn")

    def objective(trial: optuna.Trial) -> float:
        cfg = space.validate(ss.suggest_demo_cnn(trial))
        model = ss.build_model("demo_cnn", cfg, seed=trial.number)
        mparams = sum(p.numel() for p in model.parameters()) / 1e6
        latency_ms = cost.evaluate(trial, model, space.input_spec(cfg, batch_size=args.batch, dtype="float16"))
        return latency_ms / mparams

    study.optimize(objective, n_trials=args.trials)
    best = study.best_trial
    print(f"{len(study.trials)} trials; best {best.value:.4g} ms/Mparam (trial {best.number}, σ "
          f"{best.user_attrs['predicted_latency_ms_std']:.3g} ms on {best.user_attrs['predicted_latency_ms']:.3g} ms)")
    if sampler.noise_log_var:
        last = np.sqrt(sampler.noise_log_var[-1])
        print(f"the GP's last fit weighed {last.size} trials by their own σ (log space): "
              f"min {last.min():.3f}, median {np.median(last):.3f}, max {last.max():.3f}")
    return study


if __name__ == "__main__":
    main()
