"""A serving configuration under traffic: :class:`ServingTraffic`, :class:`ServingConfig`, :class:`ServingSLO`
and :func:`evaluate_serving`, which turns :func:`~dippm_nas.llm.predict_generation` into what an operator chooses
by: time to first token, time per output token, cost per million generated tokens and energy per token, each with
its σ, and whether the service-level objectives hold as chance constraints (``mean + k σ <= SLO``).

One replica is one node of ``tensor_parallel`` GPUs, or one MIG instance. Traffic is either a closed batch
(``batch_size`` sequences start together: the time to first token is the batch's prefill) or an open rate
(``request_rate_per_s``): the replica runs the concurrency ``b`` at which it keeps up, ``b / e2e(b) = rate``
(Little's law), with the decode step affine in the batch between a step of one sequence and a step at the batch
limit (two predictions); a rate above what one replica sustains at its batch limit takes more replicas, each
with an equal share. Time to first token under a rate is one prompt's prefill plus the step it waits for.

Lengths: the mean prompt and output lengths set the throughput, the step time and the cost; the ``quantile``
(default 0.95) of the prompt lengths sets the time to first token, and the longest sequence the memory check.

Cost: ``price_per_gpu_hour * GPUs of the replicas / generated tokens per hour * 1e6``; a MIG instance pays
``1 / instances_per_gpu`` of its GPU's price. A configuration that does not fit (weights alone beyond the memory,
not one sequence fitting, an engine rule) is ``feasible=False`` with its ``reason``, never an exception.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.llm._architectures import decoder_config
from dippm_nas.llm._config import DecoderConfig
from dippm_nas.llm._engines import ENGINES, serving_engine
from dippm_nas.llm._parallel import shard_config
from dippm_nas.llm._predict import predict_generation
from dippm_nas.llm._workload import LLMWorkload
from dippm_nas.units import BYTES_PER_MIB

__all__ = ["ServingTraffic", "ServingConfig", "ServingSLO", "ServingEstimate", "evaluate_serving",
           "SERVING_FIGURES"]

#: The figures of a :class:`ServingEstimate` (each with a ``_std``): name -> unit and meaning.
SERVING_FIGURES: dict[str, str] = {
    "ttft_ms": "ms to the first token of a request",
    "tpot_ms": "ms per output token of a request (one decode step at the replica's concurrency)",
    "cost_usd_per_million_tokens": "USD per million generated tokens",
    "energy_j_per_token": "J per generated token (the whole node; a MIG instance's share of its GPU)",
    "output_tokens_per_s": "generated tokens per second of all replicas",
}


def _positive_number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InvalidValueError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def _lengths(name: str, v: Any) -> tuple[int, ...]:
    vals = (v,) if isinstance(v, int) and not isinstance(v, bool) else tuple(v) if isinstance(v, Sequence) else None
    if not vals or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in vals):
        raise InvalidValueError(f"ServingTraffic.{name} must be an int >= 1 or a non-empty sequence of them "
                                f"(a length distribution's samples), got {v!r}")
    return vals


@dataclass(frozen=True)
class ServingTraffic:
    """What the service receives.

    Attributes:
        prompt_lens: prompt tokens per request: one int, or samples of the distribution.
        output_lens: generated tokens per request: one int, or samples.
        batch_size: a closed batch of this many requests (give this or ``request_rate_per_s``).
        request_rate_per_s: an open arrival rate, requests per second.
        quantile: the quantile of the prompt lengths the time to first token is taken at (0.5-1).
    """

    prompt_lens: int | Sequence[int]
    output_lens: int | Sequence[int]
    batch_size: int | None = None
    request_rate_per_s: float | None = None
    quantile: float = 0.95

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_lens", _lengths("prompt_lens", self.prompt_lens))
        object.__setattr__(self, "output_lens", _lengths("output_lens", self.output_lens))
        if (self.batch_size is None) == (self.request_rate_per_s is None):
            raise InvalidValueError("ServingTraffic needs exactly one of batch_size (a closed batch) and "
                                    f"request_rate_per_s (an open rate), got {self.batch_size!r} and "
                                    f"{self.request_rate_per_s!r}")
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise InvalidValueError(f"ServingTraffic.batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.request_rate_per_s is not None:
            _positive_number("ServingTraffic.request_rate_per_s", self.request_rate_per_s)
        if isinstance(self.quantile, bool) or not isinstance(self.quantile, (int, float)) or \
                not 0.5 <= self.quantile <= 1:
            raise InvalidValueError(f"ServingTraffic.quantile must be in [0.5, 1], got {self.quantile!r}")

    @property
    def mean_prompt(self) -> int:
        return max(1, round(float(np.mean(self.prompt_lens))))

    @property
    def mean_output(self) -> int:
        return max(1, round(float(np.mean(self.output_lens))))

    @property
    def prompt_at_quantile(self) -> int:
        return max(1, math.ceil(float(np.quantile(self.prompt_lens, self.quantile))))

    @property
    def longest(self) -> int:
        return max(self.prompt_lens) + max(self.output_lens)


@dataclass(frozen=True)
class ServingSLO:
    """Service-level objectives, met when ``mean + k_sigma * σ <= objective``.

    Attributes:
        ttft_ms: most ms to the first token (``None``: no objective).
        tpot_ms: most ms per output token (``None``: no objective).
        k_sigma: standard deviations of margin (1.645: 95 % one-sided under a normal error).
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    k_sigma: float = 1.0

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            v = getattr(self, name)
            if v is not None:
                _positive_number(f"ServingSLO.{name}", v)
        if isinstance(self.k_sigma, bool) or not isinstance(self.k_sigma, (int, float)) or \
                not math.isfinite(self.k_sigma) or self.k_sigma < 0:
            raise InvalidValueError(f"ServingSLO.k_sigma must be a finite number >= 0, got {self.k_sigma!r}")


@dataclass(frozen=True)
class ServingConfig:
    """One way to serve: GPU type, GPUs (tensor parallelism), MIG profile, engine, batch limit, KV dtype.

    Attributes:
        device: catalogue id.
        tensor_parallel: GPUs of one node (1 with a MIG profile).
        mig_profile: a MIG profile of ``device`` (one instance is the replica), or ``None``.
        engine: ``"vllm"`` or ``"tensorrt-llm"``.
        max_num_seqs: the engine's batch limit.
        kv_dtype: the KV cache's dtype (``None``: the weights').
        interconnect: the link of tensor parallelism (``None``: the board's default).
    """

    device: str
    tensor_parallel: int = 1
    mig_profile: str | None = None
    engine: str = "vllm"
    max_num_seqs: int = 256
    kv_dtype: str | None = None
    interconnect: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            raise InvalidValueError(f"ServingConfig.device must be a catalogue id, got {self.device!r}")
        if self.engine not in ENGINES:
            raise InvalidValueError(f"ServingConfig.engine must be one of {ENGINES}, got {self.engine!r}")
        for name in ("tensor_parallel", "max_num_seqs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"ServingConfig.{name} must be an int >= 1, got {v!r}")
        if self.mig_profile is not None and not isinstance(self.mig_profile, str):
            raise InvalidValueError(f"ServingConfig.mig_profile must be a profile name or None, got {self.mig_profile!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ServingEstimate:
    """The figures of one configuration under the traffic (each with its σ), feasibility and the SLO margins.

    ``feasible`` is False with a ``reason`` when the configuration cannot serve (nothing fits, an engine or
    device rule) or misses an SLO; ``violations`` holds ``mean + k σ - objective`` per SLO (<= 0 met).
    """

    config: ServingConfig
    feasible: bool
    reason: str = ""
    ttft_ms: float = math.inf
    ttft_ms_std: float | None = None
    tpot_ms: float = math.inf
    tpot_ms_std: float | None = None
    cost_usd_per_million_tokens: float = math.inf
    cost_usd_per_million_tokens_std: float | None = None
    energy_j_per_token: float | None = None
    energy_j_per_token_std: float | None = None
    output_tokens_per_s: float = 0.0
    output_tokens_per_s_std: float | None = None
    concurrency: int = 0
    replicas: int = 0
    gpus: float = 0.0
    violations: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["config"] = self.config.to_dict()
        return d


def _infeasible(config: ServingConfig, reason: str) -> ServingEstimate:
    return ServingEstimate(config=config, feasible=False, reason=reason)


def _prefilter(cfg: DecoderConfig, config: ServingConfig) -> str:
    """Why the configuration cannot hold the weights at all ("" when it might), before any graph is built."""
    dev = resolve_device(config.device)
    memory = dev.memory_mib
    where = config.device
    if config.mig_profile is not None:
        p = dev.mig_profile(config.mig_profile)
        memory = (p.usable_memory_gib or p.memory_gib) * 1024
        where = f"one {config.mig_profile} instance of {config.device}"
        if config.tensor_parallel != 1:
            return (f"mig_profile={config.mig_profile!r} with tensor_parallel={config.tensor_parallel}: a MIG instance "
                    "serves alone here (tensor parallelism spans whole GPUs)")
    tp = config.tensor_parallel
    weights = shard_config(cfg, tp).weight_bytes / BYTES_PER_MIB  # a tensor_parallel the heads refuse: its reason
    limit = serving_engine(config.engine).memory_fraction * memory
    if weights > limit:
        return (f"the weights alone ({weights:,.0f} MiB per GPU at tensor_parallel={tp}) exceed the "
                f"{limit:,.0f} MiB {config.engine} may use on {where}")
    return ""


def _predict(model: Any, config: ServingConfig, prompt: int, output: int, batch: int) -> Any:
    eng = dataclasses.replace(serving_engine(config.engine), max_num_seqs=config.max_num_seqs)
    wl = LLMWorkload(prompt, output, batch, config.kv_dtype)
    mig = config.mig_profile is not None
    return predict_generation(model, wl, config.device, runtime="serving", engine=eng, mig=mig,
                              tensor_parallel=config.tensor_parallel, interconnect=config.interconnect)


def _view(pred: Any, profile: str | None) -> dict[str, Any]:
    """The figures of the whole node or of one MIG instance."""
    names = ("prefill_ms", "decode_ms_per_token", "e2e_ms", "output_tokens_per_s", "energy_j_per_token", "max_batch")
    if profile is None:
        return {n: (getattr(pred, n), getattr(pred, n + "_std")) for n in names} | {"reason": pred.reason}
    sl = pred.mig[profile]
    return {n: (getattr(sl, n), getattr(sl, n + "_std")) for n in names} | {"reason": sl.reason}


def evaluate_serving(model: Any, traffic: ServingTraffic, config: ServingConfig, *, price_per_gpu_hour: float,
                     slo: ServingSLO | None = None) -> ServingEstimate:
    """Time to first token, time per output token, cost per million generated tokens and energy per token of
    serving ``traffic`` with ``model`` as ``config`` (the rules in the module docstring), each with its σ.

    Raises:
        InvalidValueError: ``price_per_gpu_hour`` not a finite number > 0, an unknown engine, traffic or SLO of the
            wrong type. A configuration that cannot serve is ``feasible=False`` with its reason, not an error.
    """
    price = _positive_number("price_per_gpu_hour", price_per_gpu_hour)
    if not isinstance(traffic, ServingTraffic):
        raise InvalidValueError(f"traffic must be a ServingTraffic, got {type(traffic).__name__}")
    slo = slo or ServingSLO()
    if not isinstance(slo, ServingSLO):
        raise InvalidValueError(f"slo must be a ServingSLO or None, got {type(slo).__name__}")
    if not isinstance(config, ServingConfig):
        raise InvalidValueError(f"config must be a ServingConfig, got {type(config).__name__}")
    cfg = decoder_config(model)
    try:
        why = _prefilter(cfg, config)
        if why:
            return _infeasible(config, why)
        est = _estimate(cfg, traffic, config, price)
    except DippmNasError as e:  # a rule of the engine, the node or the device: this configuration cannot serve
        return _infeasible(config, f"{type(e).__name__}: {e}")
    return _with_slo(est, slo)


def _gpus(config: ServingConfig) -> float:
    if config.mig_profile is None:
        return float(config.tensor_parallel)
    return 1.0 / resolve_device(config.device).mig_profile(config.mig_profile).max_instances


def _estimate(cfg: DecoderConfig, traffic: ServingTraffic, config: ServingConfig, price: float) -> ServingEstimate:
    prompt, output, q_prompt = traffic.mean_prompt, traffic.mean_output, traffic.prompt_at_quantile
    gpus = _gpus(config)
    if traffic.batch_size is not None:  # one prediction: the engine runs min(batch, KV capacity, batch limit) at once
        v = _view(_predict(cfg, config, prompt, output, traffic.batch_size), config.mig_profile)
        if v["max_batch"][0] < 1:
            return _infeasible(config, v["reason"])
        ttft, tpot, tps = v["prefill_ms"], v["decode_ms_per_token"], v["output_tokens_per_s"]
        replicas, conc = 1, min(traffic.batch_size, v["max_batch"][0], config.max_num_seqs)
    else:
        top = _view(_predict(cfg, config, prompt, output, config.max_num_seqs), config.mig_profile)
        if top["max_batch"][0] < 1:
            return _infeasible(config, top["reason"])
        top_b = min(config.max_num_seqs, top["max_batch"][0])
        ttft, tpot, tps, replicas, conc, v = _open_rate(cfg, traffic, config, top_b, q_prompt,
                                                        top if top_b == config.max_num_seqs else None)
    rel = (tps[1] / tps[0]) if tps[1] is not None and tps[0] > 0 else None
    tokens_per_hour = tps[0] * 3600.0
    cost = price * gpus * replicas / tokens_per_hour * 1e6 if tokens_per_hour > 0 else math.inf
    e, e_std = v["energy_j_per_token"]
    return ServingEstimate(
        config=config, feasible=True, ttft_ms=ttft[0], ttft_ms_std=ttft[1], tpot_ms=tpot[0], tpot_ms_std=tpot[1],
        cost_usd_per_million_tokens=cost, cost_usd_per_million_tokens_std=None if rel is None else cost * rel,
        energy_j_per_token=e, energy_j_per_token_std=e_std, output_tokens_per_s=tps[0],
        output_tokens_per_s_std=tps[1], concurrency=conc, replicas=replicas, gpus=gpus * replicas)


def _open_rate(cfg: DecoderConfig, traffic: ServingTraffic, config: ServingConfig, top_b: int,
               q_prompt: int, hi: dict[str, Any] | None) -> tuple[Any, ...]:
    """(ttft, tpot, output tokens/s, replicas, concurrency, figures) of an open rate, each figure (value, σ);
    ``hi``: the figures at ``top_b`` sequences when already predicted."""
    prompt, output = traffic.mean_prompt, traffic.mean_output
    rate = float(traffic.request_rate_per_s)  # type: ignore[arg-type]
    if hi is None:
        hi = _view(_predict(cfg, config, prompt, output, top_b), config.mig_profile)
    one = _view(_predict(cfg, config, q_prompt, output, 1), config.mig_profile)
    lo = one if q_prompt == prompt else _view(_predict(cfg, config, prompt, output, 1), config.mig_profile)
    e2e_lo, e2e_hi = lo["e2e_ms"][0], hi["e2e_ms"][0]
    per_replica_max = top_b / (e2e_hi / 1e3)
    replicas = max(1, math.ceil(rate / per_replica_max))
    r = rate / replicas
    # b = r * e2e(b), e2e affine in b between 1 and top_b: b = r (e_lo + (b - 1) s)  ->  b = r (e_lo - s) / (1 - r s)
    s = (e2e_hi - e2e_lo) / 1e3 / max(top_b - 1, 1)
    denom = 1.0 - r * s
    b = top_b if denom <= 0 else min(float(top_b), max(1.0, r * (e2e_lo / 1e3 - s) / denom))
    w = (b - 1) / max(top_b - 1, 1)

    def mix(name: str) -> tuple[float, float | None]:
        (a, sa), (c, sc) = lo[name], hi[name]
        std = None if sa is None or sc is None else sa + (sc - sa) * w
        return a + (c - a) * w, std

    tpot = mix("decode_ms_per_token")
    pre, pre_std = one["prefill_ms"]
    ttft = (pre + tpot[0], None if pre_std is None or tpot[1] is None else pre_std + tpot[1])
    tps = (rate * output, None)
    e2e = mix("e2e_ms")
    if e2e[1] is not None and e2e[0] > 0:
        tps = (rate * output, rate * output * e2e[1] / e2e[0])
    energy: tuple[float | None, float | None] = (None, None)
    (e1, s1), (eb, sb) = lo["energy_j_per_token"], hi["energy_j_per_token"]
    if e1 is not None and eb is not None:  # a step's energy (J/token x batch) is affine in the batch, not J/token
        step = e1 + (eb * top_b - e1) * w
        std = None if s1 is None or sb is None else (s1 + (sb * top_b - s1) * w) / b
        energy = (step / b, std)
    return ttft, tpot, tps, replicas, max(1, round(b)), {"energy_j_per_token": energy}


def _with_slo(est: ServingEstimate, slo: ServingSLO) -> ServingEstimate:
    viol: dict[str, float] = {}
    for name in ("ttft_ms", "tpot_ms"):
        target = getattr(slo, name)
        if target is None:
            continue
        mean, std = getattr(est, name), getattr(est, name + "_std")
        viol[name] = mean + slo.k_sigma * (std or 0.0) - target
    missed = [f"{n} {getattr(est, n):.4g} + {slo.k_sigma:g} σ exceeds {getattr(slo, n):g} ms" for n, v in viol.items()
              if v > 0]
    return dataclasses.replace(est, violations=viol, feasible=not missed,
                               reason="; ".join(missed) if missed else "")
