"""LLM serving engines (``runtime="serving"``): how they hold memory and what a scheduler step costs the host.

An engine of the vLLM / TensorRT-LLM class runs the ``"fused"`` graphs of :mod:`dippm_nas.llm._graphs`
(prefill eagerly, each decode step replayed from a CUDA graph) and adds, per scheduler step, host time the
graphs do not hold: scheduling, preparing the step's inputs and block tables, the sampler's launch and the
output processing. Its memory rules are its documented defaults:

vLLM (``LLM(...)``, engine arguments of the 0.4-0.6 releases)
    ``gpu_memory_utilization = 0.9`` of the GPU's total memory is the engine's; the KV cache gets what the
    weights and the activation peak of a profiling prefill of ``max_num_batched_tokens`` tokens
    (``max(max_model_len, 2048)`` without chunked prefill, ``max_model_len`` the config's positions) leave
    of it, in blocks of ``block_size = 16`` tokens; ``max_num_seqs = 256`` sequences run at once.
TensorRT-LLM (``trtllm-build`` and the executor's ``KvCacheConfig``)
    the KV cache gets ``free_gpu_memory_fraction = 0.9`` of the memory left free after the engine (weights,
    activations of ``max_num_tokens = 8192`` tokens) is loaded, in blocks of ``tokens_per_block = 64``
    tokens; the batch is at most ``max_batch_size = 256``.

A batch larger than the sequences the KV cache holds runs in waves (all sequences of the workload have the
same lengths, so continuous batching admits a new wave as one finishes).

The host time per step, ``step_us + seq_us * sequences``, and a multiplier of the prior's kernel time of a
decode step are the only constants fitted, per engine, on measured serving runs (``benchmarks/accuracy/accuracy_llm.py
--write``: LLM-Inference-Bench H100 / GH200 rows, leave-one-model-out; the file records the data, the
command and the held-out error that sets ``sigma_log``). Without the file every engine has no host time per
step, a multiplier of 1 and the prior's own σ, labelled ``"analytic"``.

Across the GPUs of one node (``tensor_parallel``, :mod:`dippm_nas.llm._parallel`) four more constants per engine
are fitted on LLM-Inference-Bench's 2- and 4-GPU H100 runs (``benchmarks/accuracy/accuracy_llm_multi_gpu.py
--write``): host time per step per extra worker (``tp_step_us``), the fixed time of one custom and of one NCCL
all-reduce (``allreduce_us``, ``nccl_us``) and a multiplier of the ideal transfer time (``allreduce_bw_scale``);
``tp_sigma_log`` is their held-out error.

Driven through its OpenAI-compatible server (``frontend="api-server"``), vLLM's process also detokenizes every
sequence's new token and checks its stop strings each step (the vLLM 0.6.0 release post, 2024-09, measured the
0.5 server's GPU busy 38 % of the time for Llama-3-8B on an H100): ``server_seq_us`` more host time per running
sequence per step. It and ``wait_activity`` (the GPU's power while it waits for the host between steps, as a
share of the board's span above idle) are fitted on ML.ENERGY's H100 vLLM-server runs (``benchmarks/accuracy/accuracy_llm.py
--parts energy --write``, leave-one-model-out).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from dippm_nas._files import write_output
from dippm_nas._json import check_keys
from dippm_nas.errors import InvalidValueError

__all__ = ["ServingEngine", "ENGINES", "FRONTENDS", "serving_engine", "engine_table", "EngineTable", "ENGINES_FILE"]

#: Engines ``runtime="serving"`` models.
ENGINES: tuple[str, ...] = ("vllm", "tensorrt-llm")
#: How requests reach the engine: in-process (``LLM.generate``, serving benchmarks) or its OpenAI-compatible server.
FRONTENDS: tuple[str, ...] = ("offline", "api-server")
#: The calibration file of the fitted constants, under ``dippm_nas/llm/calibration``.
ENGINES_FILE = "engines.json"
_FORMAT = 1


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class ServingEngine:
    """One serving engine: its memory rules (documented defaults) and its fitted step costs.

    Attributes:
        name: one of :data:`ENGINES`.
        block_size: tokens per KV-cache block.
        memory_fraction: share of memory for the engine: of the GPU's total (``memory_rule="total"``, vLLM's
            ``gpu_memory_utilization``) or of what is free after the weights and activations
            (``"free"``, TensorRT-LLM's ``free_gpu_memory_fraction``).
        memory_rule: ``"total"`` or ``"free"``.
        max_num_seqs: most sequences in one step.
        max_batched_tokens: prompt tokens one prefill step takes; ``None``: ``max(max_model_len, 2048)``
            (vLLM without chunked prefill).
        step_us: host time per scheduler step, µs (fitted).
        seq_us: host time per sequence per step, µs (fitted).
        frontend: ``"offline"`` (the engine driven in-process, as ``LLM.generate`` and the serving benchmarks run
            it) or ``"api-server"`` (the engine behind its OpenAI-compatible HTTP server: every step also turns
            each sequence's new token into text, checks its stop strings and hands it to the server's request
            loop, in the same process before vLLM 0.6).
        server_seq_us: host time per sequence per step the ``"api-server"`` frontend adds, µs (fitted on
            ML.ENERGY's online runs; 0 without a fit).
        wait_activity: share of the board's span above idle (``board_power_w - idle_power_w``) the GPU draws
            while it waits for the engine's host between steps (clocks held up; fitted with
            ``server_seq_us``); ``None``: the power model's own waiting power.
        decode_gpu_scale: multiplier of the prior's kernel time of a decode step (fitted; 1 without a fit). A
            prefill step keeps the prior's time: end-to-end latencies do not tell it apart from the decode steps
            (the prior's prefill GEMMs are checked against Vidur's operator timings, docs/llm.md).
        tp_step_us: host time per scheduler step per tensor-parallel worker beyond the first, µs (fitted on
            multi-GPU runs; 0 without a fit): the driver hands every step's inputs to each worker.
        allreduce_us: fixed time of one custom all-reduce (vLLM's and TensorRT-LLM's NVLink peer-to-peer kernels),
            µs (fitted; 0 without a fit).
        nccl_us: fixed time of one NCCL all-reduce (messages above ``custom_allreduce_max_mib``, or no NVLink), µs
            (fitted; 0 without a fit).
        allreduce_bw_scale: multiplier of an all-reduce's ideal transfer time ``2 (N - 1) / N * bytes / link``
            (fitted; 1 without a fit).
        custom_allreduce_max_mib: largest message the custom all-reduce takes, MiB (vLLM's ``CustomAllreduce``
            buffer, 8 MiB; larger messages go to NCCL).
        tp_sigma_log: σ of a tensor-parallel prediction in log space (the multi-GPU fit's held-out error);
            ``None``: ``sigma_log``.
        sigma_log: σ of a predicted latency in log space (the fit's held-out error); ``None`` without a fit.
        decode_kv_partition: cache tokens one thread block of the engine's decode attention reads: its kernel
            runs a block per sequence, query head and partition (vLLM's paged attention: 512, ``csrc/attention``),
            which keeps a long cache's attention bandwidth-bound at batch 1; ``None``: the prior's tiling of the
            attention output (TensorRT-LLM: the per-block split of its masked-attention kernel is not modelled).
        fitted: the step costs were fitted on measurements (latencies labelled ``"predicted"``).
        source: where the constants come from.
    """

    name: str
    block_size: int
    memory_fraction: float
    memory_rule: str
    max_num_seqs: int
    max_batched_tokens: int | None
    step_us: float = 0.0
    seq_us: float = 0.0
    decode_gpu_scale: float = 1.0
    frontend: str = "offline"
    server_seq_us: float = 0.0
    wait_activity: float | None = None
    tp_step_us: float = 0.0
    allreduce_us: float = 0.0
    nccl_us: float = 0.0
    allreduce_bw_scale: float = 1.0
    custom_allreduce_max_mib: float = 8.0
    tp_sigma_log: float | None = None
    sigma_log: float | None = None
    decode_kv_partition: int | None = None
    fitted: bool = False
    source: str = "documented defaults; step costs not fitted"

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise InvalidValueError(f"ServingEngine.name must be one of {ENGINES}, got {self.name!r}")
        if self.frontend not in FRONTENDS:
            raise InvalidValueError(f"ServingEngine.frontend must be one of {FRONTENDS}, got {self.frontend!r}")
        if self.wait_activity is not None and (not _finite(self.wait_activity) or not 0 <= self.wait_activity <= 1):
            raise InvalidValueError(f"ServingEngine.wait_activity must be in [0, 1] or None, got {self.wait_activity!r}")
        if self.memory_rule not in ("total", "free"):
            raise InvalidValueError(f"ServingEngine.memory_rule must be 'total' or 'free', got {self.memory_rule!r}")
        for name in ("block_size", "max_num_seqs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"ServingEngine.{name} must be an int >= 1, got {v!r}")
        v = self.decode_kv_partition
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidValueError(f"ServingEngine.decode_kv_partition must be an int >= 1 or None, got {v!r}")
        if not _finite(self.memory_fraction) or not 0 < self.memory_fraction <= 1:
            raise InvalidValueError(f"ServingEngine.memory_fraction must be in (0, 1], got {self.memory_fraction!r}")
        for name in ("step_us", "seq_us", "server_seq_us", "tp_step_us", "allreduce_us", "nccl_us"):
            v = getattr(self, name)
            if not _finite(v) or not 0 <= v <= 1e6:
                raise InvalidValueError(f"ServingEngine.{name} must be in [0, 1e6] µs, got {v!r}")
        if not _finite(self.decode_gpu_scale) or not 0.1 <= self.decode_gpu_scale <= 10:
            raise InvalidValueError(f"ServingEngine.decode_gpu_scale must be in [0.1, 10], got {self.decode_gpu_scale!r}")
        if not _finite(self.allreduce_bw_scale) or not 0.1 <= self.allreduce_bw_scale <= 20:
            raise InvalidValueError(f"ServingEngine.allreduce_bw_scale must be in [0.1, 20], got "
                                    f"{self.allreduce_bw_scale!r}")
        if not _finite(self.custom_allreduce_max_mib) or self.custom_allreduce_max_mib < 0:
            raise InvalidValueError(f"ServingEngine.custom_allreduce_max_mib must be a finite number >= 0, got "
                                    f"{self.custom_allreduce_max_mib!r}")
        for name in ("sigma_log", "tp_sigma_log"):
            v = getattr(self, name)
            if v is not None and (not _finite(v) or not 0 <= v <= 5):
                raise InvalidValueError(f"ServingEngine.{name} must be in [0, 5] or None, got {v!r}")

    def batched_tokens(self, max_model_len: int) -> int:
        """Prompt tokens one prefill step takes for a model of ``max_model_len`` positions."""
        return self.max_batched_tokens if self.max_batched_tokens is not None else max(max_model_len, 2048)

    def step_host_us(self, sequences: int, workers: int = 1) -> float:
        """Host time of one scheduler step over ``sequences`` sequences with ``workers`` tensor-parallel workers,
        µs (the API server's share included)."""
        per_seq = self.seq_us + (self.server_seq_us if self.frontend == "api-server" else 0.0)
        return self.step_us + per_seq * sequences + self.tp_step_us * (workers - 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The documented defaults of each engine (see the module docstring); the fitted file overrides the step costs.
_DEFAULTS: dict[str, ServingEngine] = {
    "vllm": ServingEngine("vllm", block_size=16, memory_fraction=0.9, memory_rule="total", max_num_seqs=256,
                          max_batched_tokens=None, decode_kv_partition=512),
    "tensorrt-llm": ServingEngine("tensorrt-llm", block_size=64, memory_fraction=0.9, memory_rule="free",
                                  max_num_seqs=256, max_batched_tokens=8192),
}
_FITTED_KEYS = ("step_us", "seq_us", "decode_gpu_scale", "sigma_log", "server_seq_us", "wait_activity",
                "tp_step_us", "allreduce_us", "nccl_us", "allreduce_bw_scale", "tp_sigma_log")


@dataclass(frozen=True)
class EngineTable:
    """The fitted step costs of each engine and where they come from.

    Attributes:
        engines: ``{name: {constant: value}}`` of :data:`_FITTED_KEYS`.
        source, command: the data the fit used and the command that wrote the file.
        metrics: the fit's reported figures (held-out MAPE per engine...).
    """

    engines: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    source: str = ""
    command: str = ""
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": _FORMAT, "source": self.source, "command": self.command,
                "engines": {k: dict(v) for k, v in self.engines.items()}, "metrics": dict(self.metrics)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "<dict>") -> "EngineTable":
        """Inverse of :meth:`to_dict`.

        Raises:
            InvalidValueError: another format, an unknown engine or constant.
        """
        if not isinstance(d, Mapping) or d.get("format") != _FORMAT:
            raise InvalidValueError(f"{origin}: an engines file must be an object with format {_FORMAT}")
        check_keys(d, ("format", "source", "command", "engines", "metrics"), origin)
        engines = {}
        for name, v in (d.get("engines") or {}).items():
            if name not in ENGINES:
                raise InvalidValueError(f"{origin}: unknown engine {name!r}; choices: {list(ENGINES)}")
            check_keys(v, _FITTED_KEYS, f"{origin}: engines[{name!r}]")
            engines[name] = dict(v)
        return cls(engines=engines, source=str(d.get("source", "")), command=str(d.get("command", "")),
                   metrics=dict(d.get("metrics") or {}))

    def save(self, path: str | Path) -> None:
        """Write as JSON (a temporary file renamed into place: :func:`dippm_nas._files.write_output`).

        Raises:
            InvalidValueError: ``path`` is a directory, a FIFO, a device or in a missing directory, or the write
                fails.
        """
        write_output(path, json.dumps(self.to_dict(), indent=1) + "\n", "engine table", error=InvalidValueError)


@lru_cache(maxsize=1)
def engine_table() -> EngineTable:
    """The shipped fitted step costs (``dippm_nas/llm/calibration/engines.json``, read once); an empty table
    when the file is absent."""
    try:
        text = resources.files("dippm_nas.llm").joinpath("calibration", ENGINES_FILE).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return EngineTable()
    return EngineTable.from_dict(json.loads(text), origin=f"dippm_nas/llm/calibration/{ENGINES_FILE}")


def serving_engine(name: str, table: EngineTable | None = None, *, frontend: str = "offline") -> ServingEngine:
    """The engine ``name`` with its fitted step costs (``table``: default the shipped one), driven through
    ``frontend`` (:data:`FRONTENDS`: ``"offline"``, the default, or ``"api-server"``).

    Raises:
        InvalidValueError: an unknown engine (the choices are listed).
    """
    base = _DEFAULTS.get(name)
    if base is None:
        raise InvalidValueError(f"engine must be one of {ENGINES}, got {name!r}")
    base = dataclasses.replace(base, frontend=frontend)
    t = table if table is not None else engine_table()
    fit = t.engines.get(name)
    if not fit:
        return base
    return dataclasses.replace(base, **{k: None if v is None else float(v) for k, v in fit.items()}, fitted=True,
                               source=t.source or "fitted")

