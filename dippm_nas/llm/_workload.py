"""What a generation does: :class:`LLMWorkload` (prompt, output, batch, KV-cache dtype)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dippm_nas.errors import InvalidValueError
from dippm_nas.llm._config import KV_DTYPES

__all__ = ["LLMWorkload"]


def _count(name: str, v: Any, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise InvalidValueError(f"LLMWorkload.{name} must be an int >= {low}, got {v!r}")
    return v


@dataclass(frozen=True)
class LLMWorkload:
    """One batch of generations: ``batch_size`` sequences, each a prompt of ``prompt_len`` tokens followed by
    ``output_len`` generated tokens (the first of them from the prefill pass, the others from decode steps).

    Args:
        prompt_len: tokens of each prompt, ``>= 1``.
        output_len: tokens generated per sequence, ``>= 1``.
        batch_size: sequences generated together, ``>= 1``.
        kv_dtype: dtype the KV cache is stored in (one of :data:`~dippm_nas.llm.KV_DTYPES`); ``None``: the
            weights' dtype.

    Raises:
        InvalidValueError: a field breaking its rule, naming the field and value.
    """

    prompt_len: int
    output_len: int
    batch_size: int
    kv_dtype: str | None = None

    def __post_init__(self) -> None:
        _count("prompt_len", self.prompt_len, 1)
        _count("output_len", self.output_len, 1)
        _count("batch_size", self.batch_size, 1)
        if self.kv_dtype is not None and (not isinstance(self.kv_dtype, str) or self.kv_dtype not in KV_DTYPES):
            raise InvalidValueError(f"LLMWorkload.kv_dtype must be None (the weights' dtype) or one of "
                                    f"{sorted(KV_DTYPES)}, got {self.kv_dtype!r}")

    @property
    def total_len(self) -> int:
        """Tokens of one sequence at the end: prompt plus output."""
        return self.prompt_len + self.output_len

    @property
    def decode_steps(self) -> int:
        """Decode steps of the generation (the first output token comes from the prefill pass)."""
        return self.output_len - 1

    @property
    def tokens(self) -> int:
        """Input and output tokens of the whole batch (what serving benchmarks divide by the time)."""
        return self.batch_size * self.total_len

    def with_batch_size(self, batch_size: int) -> "LLMWorkload":
        """A copy with another batch size."""
        return LLMWorkload(self.prompt_len, self.output_len, batch_size, self.kv_dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields."""
        return {"prompt_len": self.prompt_len, "output_len": self.output_len, "batch_size": self.batch_size,
                "kv_dtype": self.kv_dtype}
