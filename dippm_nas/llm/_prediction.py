"""What :func:`~dippm_nas.llm.predict_generation` returns: :class:`GenerationPrediction` and, per MIG profile,
:class:`GenerationSlice` (units in the field names, a σ and a source for every figure)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dippm_nas.errors import InvalidValueError
from dippm_nas.llm._workload import LLMWorkload
from dippm_nas.prediction import SOURCES, Figure

__all__ = ["GenerationPrediction", "GenerationSlice", "Figure", "GENERATION_FIGURES"]

#: The figures of a :class:`GenerationPrediction`, with their units; each has a ``<name>_std`` field and an
#: entry in :attr:`GenerationPrediction.sources`.
GENERATION_FIGURES: dict[str, str] = {
    "prefill_ms": "ms to the first token of every sequence of the batch",
    "decode_ms_per_token": "ms per decode step of the batch, mean over the generated tokens",
    "decode_ms_last": "ms of the last decode step",
    "e2e_ms": "ms to generate the whole batch",
    "tokens_per_s": "input + output tokens of the batch per second of e2e_ms",
    "output_tokens_per_s": "generated tokens of the batch per second of e2e_ms",
    "energy_j_per_token": "J of the whole generation per generated token",
    "weights_mib": "MiB of weights",
    "kv_cache_mib": "MiB of KV cache of the batch at the last token",
    "kv_cache_mib_per_sequence": "MiB of KV cache of one sequence at its last token",
    "peak_memory_mib": "MiB of device memory the generation needs at its peak",
    "max_batch": "sequences of this workload that fit at once",
}


@dataclass(frozen=True)
class GenerationSlice:
    """The generation on one instance of a MIG profile.

    Attributes:
        profile: the profile's name, e.g. ``"1g.10gb"``.
        instances_per_gpu: instances of the profile one GPU holds.
        max_batch, max_batch_std: sequences that fit on one instance (0 with ``reason`` when none does).
        fits: the workload's batch fits on one instance.
        prefill_ms, decode_ms_per_token, decode_ms_last, e2e_ms, tokens_per_s, output_tokens_per_s: as
            :class:`GenerationPrediction`, on one instance (each with its ``_std``).
        energy_j_per_token, energy_j_per_token_std: the energy the whole GPU draws per generated token while
            every instance of the profile serves this workload, each taking its share of the GPU's compute slices
            (``compute_slices / 7``) of the board's idle and active power (NVML measures only the whole GPU);
            ``None`` without power figures.
        peak_memory_mib, peak_memory_mib_std: what the generation needs on one instance, MiB.
        reason: why nothing fits ("" otherwise).
    """

    profile: str
    instances_per_gpu: int
    max_batch: int
    max_batch_std: float | None
    fits: bool
    prefill_ms: float
    prefill_ms_std: float | None
    decode_ms_per_token: float
    decode_ms_per_token_std: float | None
    decode_ms_last: float
    e2e_ms: float
    e2e_ms_std: float | None
    tokens_per_s: float
    tokens_per_s_std: float | None
    output_tokens_per_s: float
    output_tokens_per_s_std: float | None
    energy_j_per_token: float | None
    energy_j_per_token_std: float | None
    peak_memory_mib: float
    peak_memory_mib_std: float | None
    reason: str = ""

    def figure(self, name: str, sources: Mapping[str, str]) -> Figure:
        """A figure of this slice by name, with the source its figure has on the whole GPU."""
        if name not in _SLICE_FIGURES:
            raise InvalidValueError(f"a MIG slice has no figure {name!r}; figures: {_SLICE_FIGURES}")
        src = sources.get(name, "analytic")
        if name == "energy_j_per_token" and self.energy_j_per_token is not None and src != "unavailable":
            src = "analytic"  # an attribution of the whole GPU's energy, never measured per instance
        return Figure(getattr(self, name), getattr(self, name + "_std", None), src)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


_SLICE_FIGURES = ["prefill_ms", "decode_ms_per_token", "decode_ms_last", "e2e_ms", "tokens_per_s",
                  "output_tokens_per_s", "energy_j_per_token", "peak_memory_mib", "max_batch"]


@dataclass(frozen=True)
class GenerationPrediction:
    """Predicted cost of generating one batch (:class:`~dippm_nas.llm.LLMWorkload`) with a decoder on a device.

    Every figure of :data:`GENERATION_FIGURES` has a value, one σ (``<name>_std``; ``None`` where the source
    gives none) and a source in :attr:`sources` (``"analytic"``: the prior and exact counts; ``"predicted"``:
    constants fitted on measurements; ``"unavailable"``: energy of a device without power figures, value
    ``None``).

    Attributes:
        model: the decoder's name.
        device: catalogue id.
        workload: the workload predicted.
        prefill_ms: time to first token: the prefill of every sequence of the batch (of its first wave when the
            batch runs in waves), ms.
        decode_ms_per_token: time of one decode step of the batch (each sequence gains one token), mean over the
            ``output_len - 1`` steps (the step at the prompt's length + 1 when ``output_len == 1``), ms.
        decode_ms_last: the last decode step, at the longest KV cache, ms.
        e2e_ms: the whole generation of the batch, ms (every wave).
        tokens_per_s: ``batch * (prompt_len + output_len) / e2e``, as serving benchmarks report it.
        output_tokens_per_s: ``batch * output_len / e2e``.
        energy_j_per_token: energy of the whole generation over its generated tokens, J.
        weights_mib: the weights, MiB (exact).
        kv_cache_mib: the batch's KV cache at its last token, MiB (exact; a paged cache rounds each sequence up
            to whole blocks: ``details["kv_cache_mib_allocated"]``).
        kv_cache_mib_per_sequence: one sequence's, MiB.
        peak_memory_mib: what the generation needs at its peak: CUDA context, weights, workspaces, activations
            (a serving engine: its profiling reservation) and the KV cache of the sequences held at once, MiB
            (one GPU's with tensor parallelism: ``details["tensor_parallel"] > 1``).
        max_batch: sequences of this workload the device (the node, with tensor parallelism) holds at once (0 with
            :attr:`reason` when not one).
        fits: the batch fits at once (``batch_size <= max_batch``); a serving engine runs a larger batch in waves.
        reason: why it does not fit ("" when it does).
        sources: the source of each figure.
        mig: per MIG profile, a :class:`GenerationSlice` (``None`` without MIG or when not asked).
        details: named extras (``runtime``, ``engine``, ``waves``, memory parts, ...).
    """

    model: str
    device: str
    workload: LLMWorkload
    prefill_ms: float
    prefill_ms_std: float | None
    decode_ms_per_token: float
    decode_ms_per_token_std: float | None
    decode_ms_last: float
    decode_ms_last_std: float | None
    e2e_ms: float
    e2e_ms_std: float | None
    tokens_per_s: float
    tokens_per_s_std: float | None
    output_tokens_per_s: float
    output_tokens_per_s_std: float | None
    energy_j_per_token: float | None
    energy_j_per_token_std: float | None
    weights_mib: float
    weights_mib_std: float
    kv_cache_mib: float
    kv_cache_mib_std: float
    kv_cache_mib_per_sequence: float
    kv_cache_mib_per_sequence_std: float
    peak_memory_mib: float
    peak_memory_mib_std: float | None
    max_batch: int
    max_batch_std: float | None
    fits: bool
    reason: str
    sources: Mapping[str, str]
    mig: Mapping[str, GenerationSlice] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in GENERATION_FIGURES:
            v = getattr(self, name)
            src = self.sources.get(name)
            if src not in SOURCES:
                raise InvalidValueError(f"GenerationPrediction.sources[{name!r}] must be one of {SOURCES}, got {src!r}")
            if v is None:
                if src != "unavailable":
                    raise InvalidValueError(f"GenerationPrediction.{name} is None only when its source is "
                                            f"'unavailable', got source {src!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidValueError(f"GenerationPrediction.{name} must be a finite number >= 0, got {v!r}")
            std = getattr(self, name + "_std")
            if std is not None and (not math.isfinite(std) or std < 0):
                raise InvalidValueError(f"GenerationPrediction.{name}_std must be finite and >= 0 or None, got {std!r}")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool):
            raise InvalidValueError(f"GenerationPrediction.max_batch must be an int, got {self.max_batch!r}")

    @property
    def batch_size(self) -> int:
        """The workload's batch size."""
        return self.workload.batch_size

    def figure(self, name: str, mig_profile: str | None = None) -> Figure:
        """The figure ``name`` (one of :data:`GENERATION_FIGURES`, or ``"memory_mib"`` for
        :attr:`peak_memory_mib`) with its σ and source, on the whole GPU or on one instance of ``mig_profile``.

        Raises:
            InvalidValueError: an unknown figure or profile (the choices are listed), or a profile of a
                prediction made without MIG.
        """
        if name == "memory_mib":
            name = "peak_memory_mib"
        if name not in GENERATION_FIGURES:
            raise InvalidValueError(f"unknown figure {name!r}; figures: {list(GENERATION_FIGURES)}")
        if mig_profile is not None:
            if not self.mig:
                raise InvalidValueError(f"the prediction for {self.device!r} has no MIG figures (device without MIG, "
                                        "or predicted with mig=False)")
            sl = self.mig.get(mig_profile)
            if sl is None:
                raise InvalidValueError(f"no MIG profile {mig_profile!r} in this prediction; choices: {list(self.mig)}")
            return sl.figure(name, self.sources)
        return Figure(getattr(self, name), getattr(self, name + "_std"), self.sources[name])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: every field, the workload and MIG slices as dicts."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["workload"] = self.workload.to_dict()
        d["sources"] = dict(self.sources)
        d["mig"] = {k: v.to_dict() for k, v in self.mig.items()} if self.mig else None
        d["details"] = dict(self.details)
        return d
