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
  (:class:`~dippm_nas.llm._engines.ServingEngine`): ``fraction * memory - fixed - activations`` (vLLM) or
  ``fraction * (memory - fixed - activations)`` (TensorRT-LLM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dippm_nas._numbers import as_real
from dippm_nas.llm._config import DecoderConfig, ceil_div
from dippm_nas.llm._engines import ServingEngine
from dippm_nas.units import BYTES_PER_MIB

__all__ = ["kv_cache_bytes", "paged_kv_bytes", "KVCapacity", "contiguous_capacity", "paged_capacity"]


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


def paged_capacity(engine: ServingEngine, memory_mib: float, fixed_mib: float, activations_mib: float,
                   config: DecoderConfig, total_len: int, kv_dtype: str | None = None,
                   block_size: int | None = None) -> KVCapacity:
    """Largest batch of a serving engine's paged cache (the rule in the module docstring).

    Args:
        engine: the engine (its memory rule and fraction, its block size unless ``block_size`` is given).
        memory_mib: the device's (or slice's) usable memory, MiB.
        fixed_mib: CUDA context, weights and workspaces, MiB.
        activations_mib: the activation peak the engine reserves (its profiling prefill), MiB.
        config, total_len, kv_dtype: the decoder, the tokens of one sequence at its end, the cache's dtype.
        block_size: tokens per block (default the engine's).
    """
    block = block_size or engine.block_size
    taken = fixed_mib + activations_mib
    if engine.memory_rule == "total":
        budget = engine.memory_fraction * memory_mib - taken
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
