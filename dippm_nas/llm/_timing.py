"""The generation on one device (a whole GPU or a MIG slice): prefill and decode phases, waves, capacity.

Times come from the analytic prior run on the graphs of :mod:`dippm_nas.llm._graphs`:

- prefill: the prior's latency of the prefill graph under the prefill runtime (a serving engine packs
  ``max_batched_tokens // prompt_len`` prompts per step, so a batch takes several steps);
- decode: the step graph is built at the shortest and the longest cache of the generation (``prompt + 1``
  and ``prompt + output - 1`` tokens); every node's device time is linear in the cache length between them
  (attention reads the cache, ``DynamicCache`` copies it, the rest does not depend on it), so the step at
  any length is the prior's timeline over the interpolated node times, and the mean over the steps is taken
  over samples of that curve (it is convex and piecewise linear: the critical path is a maximum of linear
  terms). A ``StaticCache`` step reads its whole buffer at every length: one graph.

A serving engine adds its host time per scheduler step and its fitted kernel-time multipliers
(:class:`~dippm_nas.llm._engines.ServingEngine`); a batch beyond the sequences its KV cache holds runs in
waves. Energy is the prior's energy of each pass (power over the timeline) plus the GPU's waiting power over
the engine's host time per step.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from dippm_nas.devices import Device, HostProfile
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.llm._config import DecoderConfig
from dippm_nas.llm._engines import ServingEngine
from dippm_nas.llm._graphs import decode_graph, prefill_graph
from dippm_nas.llm._memory import KVCapacity, contiguous_capacity, paged_capacity
from dippm_nas.llm._parallel import TensorParallel, allreduce_ms
from dippm_nas.prior import (DeploymentSettings, PriorEstimate, estimate, latency_sigma_log, latency_us, power_params_for,
                             wait_power_w)
from dippm_nas.units import BYTES_PER_MIB, MS_PER_S, US_PER_MS

__all__ = ["GenerationExecution", "DeviceRun", "run_on_device", "RUNTIME_STYLES", "LLM_RUNTIMES",
           "SAMPLES", "MAX_WAVES"]

#: runtime -> (graph style, prior runtime of prefill, prior runtime of a decode step)
RUNTIME_STYLES: dict[str, tuple[str, str, str]] = {
    "eager": ("eager", "eager", "eager"),
    "cuda-graphs": ("static", "eager", "cuda-graphs"),
    "compiled": ("static", "compiled", "compiled"),
    "serving": ("fused", "eager", "cuda-graphs"),
}
#: Runtimes :func:`~dippm_nas.llm.predict_generation` models.
LLM_RUNTIMES: tuple[str, ...] = tuple(RUNTIME_STYLES)
#: The most waves a batch larger than the KV cache holds may run in: ``details["waves"]`` lists each wave, so a
#: batch of 10**12 sequences in waves of 256 would be a list of 3.9e9 entries. A serving benchmark runs a
#: batch in a few waves; 100,000 is far beyond any of them.
MAX_WAVES = 100_000
#: Cache lengths at which the decode curve is sampled for its mean.
SAMPLES = 9


@dataclass(frozen=True)
class GenerationExecution:
    """How the generation runs, resolved once at the entry.

    Attributes:
        runtime: one of :data:`LLM_RUNTIMES`.
        engine: the serving engine (``runtime="serving"``), else ``None``.
        host: the host that drives the GPU.
        block_size: tokens per KV block of a paged cache (serving only).
        kv_dtype: the KV cache's dtype.
        tp: the tensor parallelism over the GPUs of one node (the config run is then one GPU's shard).
        identical_sequences: the batch's sequences are one prompt repeated (:class:`~dippm_nas.llm.LLMWorkload`).
    """

    runtime: str
    engine: ServingEngine | None
    host: HostProfile
    block_size: int | None
    kv_dtype: str
    tp: TensorParallel = field(default_factory=TensorParallel)
    identical_sequences: bool = False

    @property
    def style(self) -> str:
        return RUNTIME_STYLES[self.runtime][0]

    @property
    def prefill_runtime(self) -> str:
        return RUNTIME_STYLES[self.runtime][1]

    @property
    def decode_runtime(self) -> str:
        return RUNTIME_STYLES[self.runtime][2]


@lru_cache(maxsize=96)
def _prefill(cfg: DecoderConfig, style: str, seqs: int, prompt: int, kv_dtype: str,
             identical: bool = False) -> OperatorGraph:
    return prefill_graph(cfg, seqs, prompt, style=style, kv_dtype=kv_dtype,
                         identical_sequences=identical and cfg.is_moe)


@lru_cache(maxsize=96)
def _decode(cfg: DecoderConfig, style: str, batch: int, kv_len: int, kv_dtype: str,
            identical: bool = False, kv_partition: int | None = None) -> OperatorGraph:
    return decode_graph(cfg, batch, kv_len, style=style, kv_dtype=kv_dtype,
                        identical_sequences=identical and cfg.is_moe, kv_partition=kv_partition)


@dataclass
class _Phase:
    """One phase of one wave: its time, energy and log-space σ's."""

    ms: float
    energy_j: float | None
    sigma_log: float | None
    energy_rel: float | None


@dataclass(frozen=True)
class DeviceRun:
    """The generation on one device: per-phase figures of the first wave, totals over the waves, capacity.

    Attributes:
        prefill, decode_mean, decode_last: the first wave's prefill, mean and last decode step, ms.
        prefill_sigma_log, decode_sigma_log: their log-space σ (``None``: the prior gives none).
        e2e_ms, e2e_std_ms: every wave's prefill and decode steps; its σ (prefill and decode errors taken as
            fully correlated across steps and waves).
        energy_j, energy_rel: energy of the whole generation and its relative σ (``None`` without power).
        capacity: the KV capacity (max batch).
        waves: the batch sizes of the waves.
        peak_memory_mib, peak_memory_std_mib: what the generation needs.
        memory: named memory parts, MiB.
    """

    prefill: float
    prefill_sigma_log: float | None
    decode_mean: float
    decode_last: float
    decode_sigma_log: float | None
    e2e_ms: float
    e2e_std_ms: float | None
    energy_j: float | None
    energy_rel: float | None
    capacity: KVCapacity
    waves: tuple[int, ...]
    peak_memory_mib: float
    peak_memory_std_mib: float | None
    memory: dict[str, float]


_ESTIMATES: "OrderedDict[tuple[Any, ...], PriorEstimate]" = OrderedDict()
_ESTIMATES_MAX = 512
_ESTIMATES_LOCK = threading.Lock()


def _estimate(graph: OperatorGraph, dev: Device, runtime: str, host: HostProfile) -> PriorEstimate:
    """The prior's estimate of ``graph`` on ``dev``, kept in a bounded cache: a search or a fit predicts the same
    graphs on the same devices many times (keyed by the graph's structure and every device and host figure the
    prior reads)."""
    key = (graph.structural_hash(), graph.param_bytes, dev.id, dev.sms, dev.memory_mib, dev.bandwidth_gbps,
           dev.l2_mib, dev.fp32_tflops, dev.fp16_tensor_tflops, dev.bf16_tensor_tflops, dev.board_power_w,
           dev.idle_power_w, runtime, host.name, host.speed, host.framework)
    with _ESTIMATES_LOCK:
        hit = _ESTIMATES.get(key)
        if hit is not None:
            _ESTIMATES.move_to_end(key)
            return hit
    est = estimate(graph, dev, deployment=DeploymentSettings(runtime=runtime, host=host))
    with _ESTIMATES_LOCK:
        _ESTIMATES[key] = est
        while len(_ESTIMATES) > _ESTIMATES_MAX:
            _ESTIMATES.popitem(last=False)
    return est


def _engine_wait_w(dev: Device, engine: ServingEngine | None) -> float:
    """Board power while the GPU waits for the engine's host between steps, W: the engine's fitted share of the
    board's span above idle, else the power model's waiting power."""
    if engine is None or engine.wait_activity is None:
        return wait_power_w(power_params_for(dev), dev)
    idle, board = float(dev.idle_power_w), float(dev.board_power_w)  # type: ignore[arg-type]
    return idle + (board - idle) * engine.wait_activity


class _Runner:
    """Estimates on one device for one prediction."""

    def __init__(self, cfg: DecoderConfig, dev: Device, ex: GenerationExecution,
                 sigmas: tuple[float | None, float | None] | None) -> None:
        self.cfg, self.dev, self.ex, self.sigmas = cfg, dev, ex, sigmas
        self.wait_w = _engine_wait_w(dev, ex.engine) if dev.has_power else 0.0

    def est(self, graph: OperatorGraph, runtime: str) -> PriorEstimate:
        return _estimate(graph, self.dev, runtime, self.ex.host)

    def sigma(self, est: PriorEstimate, phase: int) -> float | None:
        if self.sigmas is not None:
            return self.sigmas[phase]
        eng = self.ex.engine
        if eng is not None and self.ex.tp.size > 1 and eng.tp_sigma_log is not None:
            return eng.tp_sigma_log
        if eng is not None and eng.sigma_log is not None:
            return eng.sigma_log
        # the device resolved at the entry, passed in (no second look-up): a Device outside the catalogue gets an
        # unseen GPU's measured σ, as a graph's prediction on it does
        return latency_sigma_log(est, device=self.dev)

    @staticmethod
    def energy_rel(est: PriorEstimate) -> float | None:
        if est.energy_j is None or est.energy_j_std is None or est.energy_j <= 0:
            return None
        return est.energy_j_std / est.energy_j

    def step_extra_ms(self, sequences: int, tokens: int) -> float:
        """What a serving engine's step adds to its graph, ms: host time (per worker too) and the all-reduces of
        tensor parallelism (the GPU waits for both at the engine's waiting power)."""
        eng = self.ex.engine
        if eng is None:
            return 0.0
        tp = self.ex.tp
        comm, _ = allreduce_ms(self.cfg, tokens, tp, eng)
        return eng.step_host_us(sequences, tp.size) / US_PER_MS + comm

    # ------------------------------------------------------------------ phases
    def _scaled(self, est: PriorEstimate, gpu_ms: np.ndarray, scale: float) -> float:
        """Latency of a pass with node device times ``gpu_ms`` times ``scale``, ms."""
        if scale == 1.0 and gpu_ms is est.node_time_ms:
            return est.latency_ms
        return latency_us(gpu_ms * (US_PER_MS * scale), est.node_host_ms * US_PER_MS,
                          est.pass_host_ms * US_PER_MS) / US_PER_MS

    def prefill(self, seqs: int, prompt: int) -> tuple[_Phase, PriorEstimate]:
        cfg, ex = self.cfg, self.ex
        eng = ex.engine
        per_step = seqs
        if eng is not None:
            per_step = max(1, min(seqs, eng.batched_tokens(cfg.max_positions or 2048) // prompt))
        full, rem = divmod(seqs, per_step)
        ms = energy = 0.0
        first: PriorEstimate | None = None
        has_energy = self.dev.has_power
        for n, count in ((per_step, full), (rem, 1 if rem else 0)):
            if not count:
                continue
            est = self.est(_prefill(cfg, ex.style, n, prompt, ex.kv_dtype, ex.identical_sequences), ex.prefill_runtime)
            first = first or est
            host = self.step_extra_ms(n, n * prompt)
            ms += count * (est.latency_ms + host)
            if has_energy and est.energy_j is not None:
                energy += count * (est.energy_j + self.wait_w * host / MS_PER_S)
        assert first is not None
        return _Phase(ms, energy if has_energy else None, self.sigma(first, 0), self.energy_rel(first)), first

    def decode(self, batch: int) -> tuple[_Phase, float, float, PriorEstimate]:
        """(total of the wave's decode steps, mean step ms, last step ms, the estimate at the longest cache)."""
        cfg, ex, wl_steps = self.cfg, self.ex, self._steps
        eng = ex.engine
        scale = eng.decode_gpu_scale if eng is not None else 1.0
        host = self.step_extra_ms(batch, batch)
        if ex.style == "static":
            lens = [self._total]
        else:
            lens = sorted({self._prompt + 1, self._prompt + max(wl_steps, 1)})
        part = eng.decode_kv_partition if eng is not None else None
        ests = [self.est(_decode(cfg, ex.style, batch, n, ex.kv_dtype, ex.identical_sequences, part),
                         ex.decode_runtime) for n in lens]
        ea, eb = ests[0], ests[-1]
        if len(lens) == 1:
            step = self._scaled(ea, ea.node_time_ms, scale) + host
            mean = last = step
            e_mean = (ea.energy_j * (step - host) / max(ea.latency_ms, 1e-12)) if ea.energy_j is not None else None
        else:
            la, lb = lens
            xs = np.linspace(la, lb, min(SAMPLES, lb - la + 1))
            ga, gb = ea.node_time_ms, eb.node_time_ms
            curve = np.array([self._scaled(ea, ga + (gb - ga) * (x - la) / (lb - la), scale) for x in xs])
            mean = float(np.trapezoid(curve, xs) / (lb - la)) + host
            last = float(curve[-1]) + host
            if ea.energy_j is not None and eb.energy_j is not None:
                raw = (ea.latency_ms + eb.latency_ms) / 2.0
                e_mean = (ea.energy_j + eb.energy_j) / 2.0 * (mean - host) / max(raw, 1e-12)
            else:
                e_mean = None
        energy = None
        if e_mean is not None:
            energy = wl_steps * (e_mean + self.wait_w * host / MS_PER_S)
        phase = _Phase(wl_steps * mean, energy, self.sigma(eb, 1), self.energy_rel(eb))
        return phase, mean, last, eb

    # ------------------------------------------------------------------ memory
    def capacity(self, pre: PriorEstimate, dec: PriorEstimate | None) -> tuple[KVCapacity, dict[str, float]]:
        cfg, ex, dev = self.cfg, self.ex, self.dev
        kv_tok = cfg.kv_bytes_per_token(ex.kv_dtype) / BYTES_PER_MIB
        fixed = pre.baseline_mib + cfg.weight_bytes / BYTES_PER_MIB + pre.workspace_mib
        parts = {"context_mib": pre.baseline_mib, "weights_mib": cfg.weight_bytes / BYTES_PER_MIB,
                 "workspace_mib": pre.workspace_mib}
        if ex.engine is not None:
            return self._paged(ex.engine, pre, fixed, parts)
        assert dec is not None
        kv_prefill = self._total if ex.style == "static" else self._prompt
        per_seq = max(pre.activations_peak_mib / pre.batch_size + kv_prefill * kv_tok,
                      dec.activations_peak_mib / dec.batch_size + self._total * kv_tok)
        fixed += pre.allocator_overhead_mib
        cap = contiguous_capacity(dev.memory_mib, fixed, per_seq)
        parts.update(allocator_overhead_mib=pre.allocator_overhead_mib, kv_budget_mib=cap.kv_budget_mib)
        return cap, parts

    def _paged(self, eng: ServingEngine, pre: PriorEstimate, fixed: float,
               parts: dict[str, float]) -> tuple[KVCapacity, dict[str, float]]:
        """A serving engine's KV capacity from its profile run (:mod:`dippm_nas.llm._memory`): vLLM spreads the
        ``max_num_batched_tokens`` over ``min(max_num_seqs, tokens)`` sequences and leaves the CUDA context out of
        its subtraction; TensorRT-LLM sizes its activations for ``max_num_tokens`` and reads the free memory after
        everything. ``engine_reserved_mib``: what the engine holds once its KV blocks are allocated (context,
        weights, workspaces, the profiled activations, every block) plus, for vLLM, the CUDA graphs' pool: the
        decode step's activations at the largest captured batch (``min(max_num_seqs, 256)``), captured after the
        KV cache (0.4-0.6), so out of the ``1 - gpu_memory_utilization`` left over, not out of the blocks."""
        cfg, ex, dev = self.cfg, self.ex, self.dev
        tokens = eng.batched_tokens(cfg.max_positions or 2048)
        seqs = max(1, min(eng.max_num_seqs, tokens)) if eng.memory_rule == "total" else 1
        profile = self.est(_prefill(cfg, ex.style, seqs, tokens // seqs, ex.kv_dtype), ex.prefill_runtime)
        act = profile.activations_peak_mib + profile.allocator_overhead_mib
        context = pre.baseline_mib if eng.memory_rule == "total" else 0.0
        cap = paged_capacity(eng, dev.memory_mib, fixed, act, cfg, self._total, ex.kv_dtype, ex.block_size,
                             context_mib=context)
        block_mib = (ex.block_size or eng.block_size) * cfg.kv_bytes_per_token(ex.kv_dtype) / BYTES_PER_MIB
        graphs = 0.0
        if eng.memory_rule == "total":
            g = self.est(_decode(cfg, ex.style, min(eng.max_num_seqs, 256), self._total, ex.kv_dtype),
                         ex.decode_runtime)
            graphs = g.activations_peak_mib + g.allocator_overhead_mib
        parts.update(activations_mib=act, kv_budget_mib=cap.kv_budget_mib, profile_tokens=float(tokens),
                     profile_sequences=float(seqs), cuda_graph_pool_mib=graphs,
                     engine_reserved_mib=fixed + act + (cap.blocks or 0) * block_mib + graphs)
        return cap, parts

    # ------------------------------------------------------------------ the whole generation
    def run(self, prompt: int, output: int, batch: int) -> DeviceRun:
        self._prompt, self._steps, self._total = prompt, output - 1, prompt + output
        eng = self.ex.engine
        at_batch: dict[int, tuple[tuple[_Phase, PriorEstimate], tuple[_Phase, float, float, PriorEstimate]]] = {}
        pre_b = self.prefill(batch, prompt)
        dec_est: PriorEstimate | None = None
        if eng is None:  # contiguous caches: the decode step's activations count towards the capacity
            dec_b = self.decode(batch)
            at_batch[batch] = (pre_b, dec_b)
            dec_est = dec_b[3]
        pre_est = pre_b[1]
        cap, parts = self.capacity(pre_est, dec_est)
        conc = batch
        if eng is not None and cap.max_batch > 0:
            conc = min(batch, cap.max_batch, eng.max_num_seqs)
        if batch // conc > MAX_WAVES:
            raise InvalidValueError(
                f"LLMWorkload.batch_size = {batch:,} sequences would run in {-(-batch // conc):,} waves of the {conc:,} "
                f"{'the KV cache holds' if eng is not None else 'that run together'} on {self.dev.id!r}; at most "
                f"{MAX_WAVES:,} waves are modelled (details['waves'] lists each), i.e. a batch of at most "
                f"{MAX_WAVES * conc:,} here")
        waves = (conc,) * (batch // conc) + ((batch % conc,) if batch % conc else ())
        e2e = e2e_std = energy = 0.0
        have_std, have_energy = True, self.dev.has_power
        first: tuple[_Phase, _Phase, float, float] | None = None
        energy_rel_num = 0.0
        for w in sorted(set(waves), reverse=True):
            count = waves.count(w)
            (pre, _), (dec, mean, last, _) = at_batch.get(w) or (self.prefill(w, prompt), self.decode(w))
            if first is None:
                first = (pre, dec, mean, last)
            e2e += count * (pre.ms + dec.ms)
            if pre.sigma_log is None or dec.sigma_log is None:
                have_std = False
            else:
                e2e_std += count * (pre.ms * pre.sigma_log + dec.ms * dec.sigma_log)
            if have_energy and pre.energy_j is not None and dec.energy_j is not None:
                energy += count * (pre.energy_j + dec.energy_j)
                energy_rel_num += count * (pre.energy_j * (pre.energy_rel or 0.0)
                                           + dec.energy_j * (dec.energy_rel or 0.0))
            else:
                have_energy = False
        assert first is not None
        pre, dec, mean, last = first
        held = min(batch, waves[0])
        fixed = sum(parts.get(k, 0.0) for k in ("context_mib", "weights_mib", "workspace_mib", "activations_mib",
                                                 "allocator_overhead_mib"))
        peak = fixed + held * cap.per_sequence_mib
        return DeviceRun(
            prefill=pre.ms, prefill_sigma_log=pre.sigma_log, decode_mean=mean, decode_last=last,
            decode_sigma_log=dec.sigma_log, e2e_ms=e2e, e2e_std_ms=e2e_std if have_std else None,
            energy_j=energy if have_energy else None,
            energy_rel=(energy_rel_num / energy) if have_energy and energy > 0 else None,
            capacity=cap, waves=waves, peak_memory_mib=peak, peak_memory_std_mib=pre_est.memory_mib_std,
            memory=parts,
        )


def run_on_device(cfg: DecoderConfig, dev: Device, ex: GenerationExecution, prompt: int, output: int,
                  batch: int, *, sigmas: tuple[float | None, float | None] | None = None) -> DeviceRun:
    """The generation of ``batch`` sequences (``prompt`` + ``output`` tokens each) on ``dev``.

    Args:
        sigmas: the log-space σ of prefill and decode to use instead of the prior's (a MIG slice takes its GPU's:
            the prior's σ is known for catalogue devices only).
    """
    return _Runner(cfg, dev, ex, sigmas).run(prompt, output, batch)

