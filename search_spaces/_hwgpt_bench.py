"""HW-GPT-Bench rows and Optuna trials as ``hwgpt`` configs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dippm_nas.errors import SearchSpaceError
from search_spaces._hwgpt import HWGPT_CHOICES
from search_spaces._registry import get_space

__all__ = ["HWGPT_BENCH_COLUMNS", "config_from_hwgpt_row", "suggest_hwgpt"]

#: The columns of ``hwgpt_bench_gpu_latency_energy.csv`` a config is read from.
HWGPT_BENCH_COLUMNS = ("n_embd", "n_layer", "n_head_per_layer", "mlp_ratio_per_layer", "bias", "head_size",
                       "padded_vocab_size", "seq_len")


def _int(row: Mapping[str, Any], key: str) -> int:
    value = row[key]
    try:
        out = int(str(value).strip())
    except ValueError:
        raise SearchSpaceError(f"HW-GPT-Bench row column {key!r} must be an integer, got {value!r}") from None
    return out


def _int_list(row: Mapping[str, Any], key: str) -> list[int]:
    value = str(row[key]).strip()
    try:
        return [int(v) for v in value.split(";")]
    except ValueError:
        raise SearchSpaceError(f"HW-GPT-Bench row column {key!r} must be integers joined by ';', "
                               f"got {value[:80]!r}") from None


def config_from_hwgpt_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The ``hwgpt`` config of one HW-GPT-Bench CSV row (a ``csv.DictReader`` row; columns
    :data:`HWGPT_BENCH_COLUMNS`).

    Raises:
        SearchSpaceError: a missing column, a value that is not an integer (list) or ``True``/``False``, or a
            config outside the space (per-layer lists not ``n_layer`` long...).
    """
    if not isinstance(row, Mapping):
        raise SearchSpaceError(f"an HW-GPT-Bench row must be a mapping of column -> value, got {type(row).__name__}")
    missing = [c for c in HWGPT_BENCH_COLUMNS if c not in row]
    if missing:
        raise SearchSpaceError(f"HW-GPT-Bench row lacks columns {missing}; needed: {list(HWGPT_BENCH_COLUMNS)}")
    bias = str(row["bias"]).strip()
    if bias not in ("True", "False"):
        raise SearchSpaceError(f"HW-GPT-Bench row column 'bias' must be 'True' or 'False', got {row['bias']!r}")
    cfg = {"embed_dim": _int(row, "n_embd"), "depth": _int(row, "n_layer"),
           "num_heads": _int_list(row, "n_head_per_layer"), "mlp_ratio": _int_list(row, "mlp_ratio_per_layer"),
           "bias": bias == "True", "seq_len": _int(row, "seq_len"), "vocab_size": _int(row, "padded_vocab_size"),
           "head_size": _int(row, "head_size"), "rotary_dims": 16}
    return get_space("hwgpt").validate(cfg)


def suggest_hwgpt(trial: Any, space: str = "s") -> dict[str, Any]:
    """An ``hwgpt`` config of HW-GPT-Bench space ``space`` (``"s"``, ``"m"``, ``"l"``) from an Optuna trial.

    Parameters: ``embed_dim``, ``depth``, ``heads_<i>`` and ``mlp_ratio_<i>`` per layer (categorical over the
    space's choices), ``bias``; sequence length 1024, vocabulary 50254, head size 64.

    Raises:
        SearchSpaceError: an unknown ``space``.
    """
    if space not in HWGPT_CHOICES:
        raise SearchSpaceError(f"suggest_hwgpt space must be one of {sorted(HWGPT_CHOICES)}, got {space!r}")
    c = HWGPT_CHOICES[space]
    depth = trial.suggest_categorical("depth", list(c["depth"]))
    return get_space("hwgpt").validate({
        "embed_dim": trial.suggest_categorical("embed_dim", list(c["embed_dim"])), "depth": depth,
        "num_heads": [trial.suggest_categorical(f"heads_{i}", list(c["num_heads"])) for i in range(depth)],
        "mlp_ratio": [trial.suggest_categorical(f"mlp_ratio_{i}", list(c["mlp_ratio"])) for i in range(depth)],
        "bias": trial.suggest_categorical("bias", [False, True]),
        "seq_len": 1024, "vocab_size": 50254, "head_size": 64, "rotary_dims": 16,
    })
