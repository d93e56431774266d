"""An Optuna search over serving configurations of one decoder: GPU type, GPUs (tensor parallelism), MIG profile,
engine, batch limit and KV dtype, for cost per million generated tokens and energy per token under time-to-first-
token and time-per-output-token objectives (chance constraints, ``mean + k σ <= SLO``).

Each trial asks for a :class:`~dippm_nas.llm.ServingConfig` and scores it with
:func:`~dippm_nas.llm.evaluate_serving` (cached per configuration: the sampler revisits configurations). A
configuration that cannot serve or misses an SLO is an infeasible trial: its objectives are ``+inf``, its
constraints positive and its reason in the trial's ``reason`` attribute, never an exception. NSGA-II with the
constraints (``trial.set_constraint`` on Optuna >= 5, the sampler's ``constraints_func`` before) drives the search; the result's Pareto set is taken over every feasible
configuration evaluated.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dippm_nas.devices import resolve_device
from dippm_nas.errors import InvalidValueError, MissingDependencyError
from dippm_nas.llm import (ENGINES, ServingConfig, ServingEstimate, ServingSLO, ServingTraffic, decoder_config,
                           evaluate_serving)
from dippm_nas.optuna._compat import optuna_has_set_constraint

__all__ = ["serving_config_search", "ServingSearchResult", "SERVING_OBJECTIVES"]

logger = logging.getLogger(__name__)

#: The objectives of :func:`serving_config_search`, both minimised.
SERVING_OBJECTIVES: tuple[str, str] = ("cost_usd_per_million_tokens", "energy_j_per_token")
_NO_MIG = "none"
_AUTO_KV = "auto"


@dataclass(frozen=True)
class ServingSearchResult:
    """What a serving-configuration search found.

    Attributes:
        pareto: the feasible configurations no other feasible one beats on both objectives, cheapest first.
        evaluated: every distinct configuration scored, with its estimate.
        trials: trials run.
        infeasible: reasons a configuration could not serve or missed an SLO, counted.
        elapsed_s: wall time of the search.
    """

    pareto: list[ServingEstimate]
    evaluated: list[ServingEstimate]
    trials: int
    infeasible: Mapping[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"pareto": [e.to_dict() for e in self.pareto], "trials": self.trials,
                "evaluated": len(self.evaluated), "infeasible": dict(self.infeasible), "elapsed_s": self.elapsed_s}


def _prices(price_per_gpu_hour: float | Mapping[str, float], devices: Sequence[str]) -> dict[str, float]:
    if isinstance(price_per_gpu_hour, Mapping):
        missing = [d for d in devices if d not in price_per_gpu_hour]
        if missing:
            raise InvalidValueError(f"price_per_gpu_hour has no price for {missing}; give one per device searched")
        prices = {d: price_per_gpu_hour[d] for d in devices}
    else:
        prices = dict.fromkeys(devices, price_per_gpu_hour)
    for d, p in prices.items():
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
            raise InvalidValueError(f"price_per_gpu_hour[{d!r}] must be a finite number > 0 (USD per GPU-hour), "
                                    f"got {p!r}")
    return {d: float(p) for d, p in prices.items()}


def _pareto(feasible: list[ServingEstimate]) -> list[ServingEstimate]:
    def key(e: ServingEstimate) -> tuple[float, float]:
        return e.cost_usd_per_million_tokens, e.energy_j_per_token if e.energy_j_per_token is not None else math.inf

    out = [e for e in feasible if not any(key(o)[0] <= key(e)[0] and key(o)[1] <= key(e)[1] and key(o) != key(e)
                                          for o in feasible)]
    seen, unique = set(), []
    for e in sorted(out, key=key):
        if key(e) not in seen:
            seen.add(key(e))
            unique.append(e)
    return unique


def _choices(name: str, values: Sequence[Any], check: Any) -> list[Any]:
    vals = list(values)
    if not vals:
        raise InvalidValueError(f"{name} must list at least one choice, got {values!r}")
    for v in vals:
        check(v)
    return vals


def _check_tp(v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidValueError(f"tensor_parallel choices must be ints >= 1, got {v!r}")


def _check_seqs(v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidValueError(f"max_num_seqs choices must be ints >= 1, got {v!r}")


def _check_engine(v: Any) -> None:
    if v not in ENGINES:
        raise InvalidValueError(f"engines must be among {ENGINES}, got {v!r}")


def _space(devs: list[str], tensor_parallel: Sequence[int], engines: Sequence[str], max_num_seqs: Sequence[int],
           kv_dtypes: Sequence[str | None], mig: bool) -> dict[str, list[Any]]:
    """The categorical choices of each parameter (MIG profiles: every profile of the devices, or none)."""
    space: dict[str, list[Any]] = {
        "device": devs, "tensor_parallel": _choices("tensor_parallel", tensor_parallel, _check_tp),
        "engine": _choices("engines", engines, _check_engine),
        "max_num_seqs": _choices("max_num_seqs", max_num_seqs, _check_seqs),
        "kv_dtype": [_AUTO_KV if k is None else k for k in _choices("kv_dtypes", kv_dtypes, lambda k: None)]}
    profiles = sorted({p.name for d in devs for p in resolve_device(d).mig_profiles}) if mig else []
    space["mig_profile"] = [_NO_MIG, *profiles]
    return space


def serving_config_search(model: Any, traffic: ServingTraffic, *, devices: Sequence[str],
                          price_per_gpu_hour: float | Mapping[str, float], slo: ServingSLO | None = None,
                          tensor_parallel: Sequence[int] = (1, 2, 4, 8), engines: Sequence[str] = ENGINES,
                          max_num_seqs: Sequence[int] = (16, 32, 64, 128, 256),
                          kv_dtypes: Sequence[str | None] = (None, "float8_e4m3fn"), mig: bool = True,
                          n_trials: int = 500, seed: int = 0, population_size: int = 40) -> ServingSearchResult:
    """Search serving configurations of ``model`` for ``traffic`` with Optuna's NSGA-II (module docstring).

    Args:
        model: what :func:`~dippm_nas.llm.decoder_config` reads (a name, a config, a ``DecoderConfig``...).
        traffic: lengths and a batch or a request rate.
        devices: catalogue ids to choose among.
        price_per_gpu_hour: USD per GPU-hour, one for all or ``{device: price}``.
        slo: time-to-first-token and time-per-output-token objectives (``None``: none).
        tensor_parallel, engines, max_num_seqs, kv_dtypes: the choices (``None`` KV dtype: the weights').
        mig: also offer each device's MIG profiles (one instance per replica).
        n_trials, seed, population_size: the search's budget, seed and NSGA-II population.

    Raises:
        InvalidValueError: a price <= 0, an unknown device or engine, empty choices, ``n_trials < 1``.
        MissingDependencyError: Optuna is not installed.
    """
    try:
        import optuna
    except ImportError as e:  # pragma: no cover - optuna is an extra
        raise MissingDependencyError("serving_config_search needs Optuna: pip install 'dippm-nas[optuna]'") from e
    devs = [resolve_device(d).id for d in _choices("devices", devices, lambda d: None)]
    prices = _prices(price_per_gpu_hour, devs)
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise InvalidValueError(f"n_trials must be an int >= 1, got {n_trials!r}")
    cfg = decoder_config(model)
    slo = slo or ServingSLO()
    space = _space(devs, tensor_parallel, engines, max_num_seqs, kv_dtypes, mig)
    cache: dict[ServingConfig, ServingEstimate] = {}
    slo_names = [n for n in ("ttft_ms", "tpot_ms") if getattr(slo, n) is not None]

    def objective(trial: Any) -> tuple[float, float]:
        p = {k: trial.suggest_categorical(k, v) for k, v in space.items()}
        mig_p = None if p["mig_profile"] == _NO_MIG else p["mig_profile"]
        conf = ServingConfig(device=p["device"], tensor_parallel=p["tensor_parallel"], mig_profile=mig_p,
                             engine=p["engine"], max_num_seqs=p["max_num_seqs"],
                             kv_dtype=None if p["kv_dtype"] == _AUTO_KV else p["kv_dtype"])
        est = cache.get(conf)
        if est is None:
            est = cache[conf] = evaluate_serving(cfg, traffic, conf, price_per_gpu_hour=prices[conf.device], slo=slo)
        served = math.isfinite(est.cost_usd_per_million_tokens)
        cons = [0.0 if served else 1.0,
                *(max(est.violations.get(n, 1.0), 0.0) if served else 1.0 for n in slo_names)]
        trial.set_user_attr("constraints", cons)
        if native:
            for n, v in zip(("serves", *slo_names), cons):
                trial.set_constraint(n, v)
        trial.set_user_attr("reason", est.reason)
        if not est.feasible:
            return math.inf, math.inf
        energy = est.energy_j_per_token if est.energy_j_per_token is not None else math.inf
        return est.cost_usd_per_million_tokens, energy

    native = optuna_has_set_constraint()  # Optuna >= 5: trial.set_constraint; 4.x: the sampler's constraints_func
    extra = {} if native else {"constraints_func": lambda t: t.user_attrs.get("constraints", [1.0])}
    sampler = optuna.samplers.NSGAIISampler(population_size=population_size, seed=seed, **extra)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(SERVING_OBJECTIVES))
    t0 = time.perf_counter()
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study.optimize(objective, n_trials=n_trials)
    finally:
        optuna.logging.set_verbosity(verbosity)
    elapsed = time.perf_counter() - t0
    evaluated = list(cache.values())
    reasons = Counter(_reason_kind(e.reason) for e in evaluated if not e.feasible)
    return ServingSearchResult(pareto=_pareto([e for e in evaluated if e.feasible]), evaluated=evaluated,
                               trials=n_trials, infeasible=dict(reasons), elapsed_s=elapsed)


def _reason_kind(reason: str) -> str:
    """A reason's first clause, so reasons of one kind count together."""
    return reason.split(";")[0][:140]
