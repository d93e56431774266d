"""The figures :class:`~dippm_nas.optuna.HardwareCostModel` returns as objectives, and what it does with a
candidate it cannot evaluate."""

from __future__ import annotations

__all__ = ["LLM_OBJECTIVES", "MAXIMIZED", "OBJECTIVES", "ON_ERROR"]

#: Figures of an LLM generation :class:`HardwareCostModel` can return as objectives (with an ``LLMWorkload``).
LLM_OBJECTIVES: dict[str, str] = {
    "tokens_per_s": "input + output tokens per second", "output_tokens_per_s": "generated tokens per second",
    "decode_ms_per_token": "ms per decode step", "prefill_ms": "ms to the first token", "e2e_ms": "ms per batch",
    "energy_j_per_token": "J per generated token", "max_batch": "sequences held at once",
    "peak_memory_mib": "MiB",
}
#: Objectives maximised (the others are minimised).
MAXIMIZED: frozenset[str] = frozenset({"tokens_per_s", "output_tokens_per_s", "max_batch"})
#: Figures :class:`HardwareCostModel` can return as objectives, with their units: those of a forward pass
#: (``latency_ms``, ``energy_j``, ``memory_mib``) and those of an LLM generation (:data:`LLM_OBJECTIVES`).
OBJECTIVES: dict[str, str] = {"latency_ms": "ms per batch", "energy_j": "J per batch", "memory_mib": "MiB",
                              **LLM_OBJECTIVES}
#: What :meth:`HardwareCostModel.evaluate` does when a candidate cannot be evaluated: ``"fail"`` the trial
#: (NaN objectives; the study goes on), ``"raise"`` the error, or complete it ``"infeasible"`` (+inf
#: objectives and constraints).
ON_ERROR: tuple[str, ...] = ("fail", "raise", "infeasible")
