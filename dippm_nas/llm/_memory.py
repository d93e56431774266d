"""The memory arithmetic of generation: KV cache bytes, the KV budget of a serving engine, the largest batch.

Exact counts (no estimate): the weights are ``param_count * bytes`` (:class:`DecoderConfig`), one token's KV
cache is ``2 * layers * kv_heads * head_dim * bytes(kv_dtype)``, a sequence holds ``prompt + output`` tokens at
its last step. A paged cache hands out whole blocks: ``ceil(tokens / block_size)`` blocks per sequence.

The largest batch:

- contiguous (PyTorch with ``transformers``' caches): ``floor((memory - fixed) / per sequence)`` with
  ``fixed`` the CUDA context, weights, workspaces and the allocator's rounding, and per sequence the larger of
  its prefill need (activations, the prompt's KV cache; a static cache's whole buffer) and its last decode
  step's (activations, the KV cache of ``prompt + output`` tokens);
- paged (a serving engine): ``floor(blocks / blocks per sequence)``, where ``blocks = floor(KV budget /
  (block_size * KV bytes per token))`` and the KV budget is the engine's rule
  (:class:`~dippm_nas.llm._engines.ServingEngine`): ``fraction * memory - (fixed - context) - activations``
  (vLLM) or ``fraction * (memory - fixed - activations)`` (TensorRT-LLM).

vLLM's profile-run arithmetic (``Worker.determine_num_available_blocks`` of vLLM 0.4-0.6,
``vllm/worker/worker.py``; ``determine_available_memory`` of the V1 worker, ``vllm/v1/worker/gpu_worker.py``):
the worker notes the free memory once its CUDA context exists, loads the weights, runs one dummy forward pass of
``max_num_batched_tokens`` tokens spread over ``min(max_num_seqs, tokens)`` sequences (``profile_run``), and
takes ``num_gpu_blocks = (total * gpu_memory_utilization - peak) // cache_block_size`` where ``peak`` is what
the pass added to the used memory: weights, the activations as the caching allocator reserved them (0.4-0.6 read
the free memory after the pass; V1 adds the allocated peak, ``torch_peak_increase``, and the memory outside
PyTorch's allocator, ``non_torch_increase``) and the workspaces; the CUDA context came before the first
reading, so it is not in ``peak`` and comes out of the ``1 - gpu_memory_utilization`` left over, as do the CUDA
graphs captured after the KV cache (0.4-0.6; V1 subtracts its estimate of them only with
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``). ``cache_block_size = block_size * layers * 2 * kv_heads / TP *
head_dim * bytes`` (``CacheEngine.get_cache_block_size``): one GPU's shard under tensor parallel.
:func:`vllm_gpu_blocks` is that formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dippm_nas._numbers import as_real
from dippm_nas.llm._config import DecoderConfig, ceil_div
from dippm_nas.errors import InvalidValueError
from dippm_nas.llm._engines import ServingEngine
from dippm_nas.units import BYTES_PER_MIB

__all__ = ["kv_cache_bytes", "paged_kv_bytes", "KVCapacity", "contiguous_capacity", "paged_capacity", "vllm_gpu_blocks"]


def kv_cache_bytes(config: DecoderConfig, tokens: int, kv_dtype: str | None = None) -> int:
    """Bytes of the keys and values of ``tokens`` tokens (one sequence or a whole batch)."""
    return tokens * config.kv_bytes_per_token(kv_dtype)


def paged_kv_bytes(config: DecoderConfig, tokens: int, block_size: int, kv_dtype: str | None = None) -> int:
    """Bytes of the blocks a paged cache hands one sequence of ``tokens`` tokens."""
    return ceil_div(tokens, block_size) * block_size * config.kv_bytes_per_token(kv_dtype)


@dataclass(frozen=True)
class KVCapacity:
    """How many sequences fit on a device (or a MIG slice).

    Attributes:
        max_batch: sequences that fit at once (0: not even one).
        kv_budget_mib: memory the KV cache may take, MiB (negative: the fixed parts alone do not fit).
        per_sequence_mib: memory one more sequence takes, MiB (its KV cache, block-rounded when paged, plus its
            activations when contiguous).
        blocks: KV blocks of the budget (paged); ``None`` for a contiguous cache.
        reason: why ``max_batch`` is 0 ("" otherwise).
    """

    max_batch: int
    kv_budget_mib: float
    per_sequence_mib: float
    blocks: int | None
    reason: str = ""


def contiguous_capacity(memory_mib: float, fixed_mib: float, per_sequence_mib: float) -> KVCapacity:
    """Largest batch of a contiguous cache: ``floor((memory - fixed) / per sequence)``, where a sequence takes
    its KV cache and its activations at the phase where they peak.

    Raises:
        InvalidValueError: a figure that is not a finite number, or a negative one.
    """
    memory_mib = as_real(memory_mib, "memory_mib", low=0)
    fixed_mib = as_real(fixed_mib, "fixed_mib", low=0)
    per_sequence_mib = as_real(per_sequence_mib, "per_sequence_mib", low=0)
    budget = memory_mib - fixed_mib
    per = per_sequence_mib
    n = max(0, math.floor(budget / per)) if per > 0 else 0
    reason = "" if n else (f"{fixed_mib:.0f} MiB of context, weights and workspaces leave {budget:.0f} MiB of the "
                           f"{memory_mib:.0f} MiB, less than one sequence's {per:.0f} MiB of KV cache and activations")
    return KVCapacity(max_batch=n, kv_budget_mib=budget, per_sequence_mib=per, blocks=None, reason=reason)


def vllm_gpu_blocks(total_memory_mib: float, gpu_memory_utilization: float, profiled_peak_mib: float,
                    cache_block_bytes: int) -> int:
    """vLLM's ``num_gpu_blocks = int((total * gpu_memory_utilization - peak) // cache_block_size)``, at least 0
    (module docstring): ``profiled_peak_mib`` is what its profile run added to the used memory (weights,
    activations, workspaces; not the CUDA context).

    Raises:
        InvalidValueError: a figure that is not a finite number, a utilization outside (0, 1], a block size < 1.
    """
    total = as_real(total_memory_mib, "total_memory_mib", low=0)
    util = as_real(gpu_memory_utilization, "gpu_memory_utilization", low=0)
    peak = as_real(profiled_peak_mib, "profiled_peak_mib", low=0)
    if not 0 < util <= 1:
        raise InvalidValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    if isinstance(cache_block_bytes, bool) or not isinstance(cache_block_bytes, int) or cache_block_bytes < 1:
        raise InvalidValueError(f"cache_block_bytes must be an int >= 1, got {cache_block_bytes!r}")
    return max(0, int((total * util - peak) * BYTES_PER_MIB // cache_block_bytes))


def paged_capacity(engine: ServingEngine, memory_mib: float, fixed_mib: float, activations_mib: float,
                   config: DecoderConfig, total_len: int, kv_dtype: str | None = None,
                   block_size: int | None = None, *, context_mib: float = 0.0) -> KVCapacity:
    """Largest batch of a serving engine's paged cache (the rule in the module docstring).

    Args:
        engine: the engine (its memory rule and fraction, its block size unless ``block_size`` is given).
        memory_mib: the device's (or slice's) usable memory, MiB.
        fixed_mib: CUDA context, weights and workspaces, MiB.
        activations_mib: the activation peak the engine reserves (its profiling prefill), MiB.
        config, total_len, kv_dtype: the decoder, the tokens of one sequence at its end, the cache's dtype.
        block_size: tokens per block (default the engine's).
        context_mib: the part of ``fixed_mib`` made before a ``"total"``-rule engine's first memory reading (the
            CUDA context), which its subtraction leaves out (vLLM); the ``"free"`` rule reads the free memory
            after everything and counts it.
    """
    block = block_size or engine.block_size
    taken = fixed_mib + activations_mib
    if engine.memory_rule == "total":
        budget = engine.memory_fraction * memory_mib - (taken - as_real(context_mib, "context_mib", low=0))
    else:
        budget = engine.memory_fraction * (memory_mib - taken)
    block_bytes = block * config.kv_bytes_per_token(kv_dtype)
    blocks = max(0, math.floor(budget * BYTES_PER_MIB / block_bytes))
    per_seq_blocks = ceil_div(total_len, block)
    n = blocks // per_seq_blocks
    per = per_seq_blocks * block_bytes / BYTES_PER_MIB
    reason = "" if n else (
        f"{engine.name} keeps {budget:.0f} MiB for the KV cache ({blocks} blocks of {block} tokens) after "
        f"{taken:.0f} MiB of context, weights, workspaces and activations; one sequence of {total_len} tokens needs "
        f"{per_seq_blocks} blocks ({per:.0f} MiB)")
    return KVCapacity(max_batch=n, kv_budget_mib=budget, per_sequence_mib=per, blocks=blocks, reason=reason)
