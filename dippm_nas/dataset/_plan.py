"""Planning a build: which ``(space, config, batch_size)`` candidates to measure, deterministically.

The plan is a pure function of the build arguments (spaces, count, seed, batch sizes, MAC budget,
dtype, device), so a killed build that reruns with the same arguments finds the same plan (and the
stored one is reused anyway).

Sampling rule (recorded with every plan):

- the ``n`` candidates are split evenly over the spaces (the first ``n % len(spaces)`` get one more);
- attempt ``j`` of space ``s`` draws a config from ``random.Random(f"{seed}:{s}:{j}")`` with the space's
  sampler, and counts its multiply-accumulates per sample (``macs_per_sample``: conv, linear,
  matmul and attention MACs of a batch-1 forward, ``torch.utils.flop_counter`` FLOPs / 2, on the meta
  device, so no weights are made and nothing is computed);
- the batch size is drawn (same generator) from the requested batch sizes ``b`` with
  ``macs_per_sample * b <= mac_budget``; when none fits the attempt is rejected (counted, not
  stored) and the next attempt is drawn;
- a candidate equal to an earlier one (same space, config, batch size) is skipped;
- a space stops after ``max_attempts_per_candidate`` attempts per wanted candidate; a shortfall is
  logged and recorded in the plan (``shortfall``).

Attempts are independent of each other, so they are evaluated in parallel processes
(``workers``) without changing the result.
"""

from __future__ import annotations

import hashlib
import logging
import math
import multiprocessing as mp
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dippm_nas._numbers import as_int
from dippm_nas.errors import DatasetError
from dippm_nas._json import canonical_json
import search_spaces as ss

__all__ = ["Candidate", "Plan", "plan_candidates", "macs_per_sample", "plan_key"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class Candidate:
    """One planned measurement: a config of ``space`` at ``batch_size``.

    Attributes:
        space: search-space name.
        config: the complete, validated config (JSON-able).
        batch_size: batch size to capture and measure at.
        macs_per_sample: MACs of one sample's forward (see the module docstring), or ``None``
            for a candidate given explicitly without a count.
        attempt: the sampler attempt that drew it (``-1`` for an explicit candidate).
        status: ``"pending"``, or ``"failed"`` for an explicit candidate rejected at planning
            (``reason`` says why: e.g. a config outside its space).
    """

    space: str
    config: dict[str, Any]
    batch_size: int
    macs_per_sample: int | None = None
    attempt: int = -1
    status: str = "pending"
    reason: str | None = None


@dataclass
class Plan:
    """The result of :func:`plan_candidates`."""

    candidates: list[Candidate]
    params: dict[str, Any]
    rejected_over_budget: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    shortfall: dict[str, int] = field(default_factory=dict)


def plan_key(params: dict[str, Any]) -> str:
    """SHA-256 (hex) of the planning arguments: the identity of a plan."""
    return hashlib.sha256(canonical_json(params).encode()).hexdigest()


def macs_per_sample(space: str, config: dict[str, Any]) -> int:
    """Multiply-accumulates of a batch-1 forward of ``space``'s model ``config``.

    Counted by ``torch.utils.flop_counter.FlopCounterMode`` (conv, linear, matmul, attention;
    FLOPs / 2) on the ``meta`` device: no weights are allocated and nothing is computed. Equals
    :attr:`~dippm_nas.graph.OperatorGraph.total_macs` of the captured graph for the built-in spaces.

    Raises:
        SearchSpaceError: the config is outside the space or the builder fails.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    sp = ss.get_space(space)
    with torch.device("meta"):
        model = sp.build(config)
    args, kwargs = sp.input_spec(config, batch_size=1).example_inputs("meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args, **kwargs)
    return int(counter.get_total_flops()) // 2


def _attempt(seed: int, space: str, j: int, batch_sizes: Sequence[int], mac_budget: int | None
             ) -> tuple[dict[str, Any], int | None, int | None]:
    """Evaluate attempt ``j`` of ``space``: ``(config, macs_per_sample, batch_size or None if rejected)``."""
    import torch

    torch.set_num_threads(1)
    rng = random.Random(f"{seed}:{space}:{j}")
    cfg = ss.get_space(space).sample(rng)
    macs = macs_per_sample(space, cfg)
    allowed = [b for b in batch_sizes if mac_budget is None or macs * b <= mac_budget]
    if not allowed:
        return cfg, macs, None
    return cfg, macs, rng.choice(allowed)


def _attempt_star(args: tuple) -> tuple[dict[str, Any], int | None, int | None]:
    return _attempt(*args)


def plan_candidates(
    spaces: Sequence[str],
    n: int,
    *,
    batch_sizes: Sequence[int],
    seed: int = 0,
    mac_budget: int | None = None,
    max_attempts_per_candidate: int = 20,
    workers: int = 1,
    extra: dict[str, Any] | None = None,
    progress: bool = False,
) -> Plan:
    """Draw ``n`` candidates over ``spaces`` (see the module docstring for the rule).

    Args:
        spaces: search-space names (see :func:`search_spaces.list_spaces`).
        n: candidates wanted, ``>= 1``.
        batch_sizes: batch sizes to draw from (ints >= 1).
        seed: the plan's seed.
        mac_budget: largest ``macs_per_sample * batch_size`` accepted, MACs; ``None``: no limit.
        max_attempts_per_candidate: give up on a space after this many attempts per wanted candidate.
        workers: processes evaluating attempts (the result does not depend on it).
        extra: other JSON-able parameters recorded in :attr:`Plan.params` (they enter the plan key).
        progress: show a progress bar of accepted candidates.

    Returns:
        A :class:`Plan`; its ``params`` hold every argument that shaped it.

    Raises:
        DatasetError: invalid arguments; SearchSpaceError: an unknown space name.
    """
    from tqdm.auto import tqdm

    n, batch_sizes, workers = _checked_args(spaces, n, batch_sizes, mac_budget, workers)
    params = {
        "kind": "sampled", "spaces": list(spaces), "n": n, "batch_sizes": list(batch_sizes), "seed": seed,
        "mac_budget": mac_budget, "max_attempts_per_candidate": max_attempts_per_candidate,
        "rule": "config ~ space.sample(Random(f'{seed}:{space}:{attempt}')); batch ~ uniform over batch_sizes "
                "with macs_per_sample*batch <= mac_budget (meta-device FlopCounterMode MACs); duplicates skipped",
        **(extra or {}),
    }
    draw = _Draw(spaces, n, seed=seed, batch_sizes=tuple(batch_sizes), mac_budget=mac_budget,
                 max_attempts_per_candidate=max_attempts_per_candidate)
    bar = tqdm(total=n, desc="planning", unit="candidate", disable=not progress, mininterval=2.0)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) if workers > 1 else None
    try:
        while tasks := draw.next_tasks(workers):
            results = list(pool.map(_attempt_star, tasks, chunksize=4)) if pool else [_attempt_star(t) for t in tasks]
            bar.update(draw.take(tasks, results))
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown()
    return draw.plan(params)


def _checked_args(spaces: Sequence[str], n: Any, batch_sizes: Sequence[Any], mac_budget: Any,
                  workers: Any) -> tuple[int, list[int], int]:
    """``n``, the batch sizes and ``workers`` of :func:`plan_candidates`, checked with the spaces and budget.

    Raises:
        DatasetError: an argument outside its rule (named with the value); SearchSpaceError: an unknown space.
    """
    n = as_int(n, "n", low=1, error=DatasetError)
    if not spaces:
        raise DatasetError(f"spaces must name at least one search space; choices: {ss.list_spaces()}")
    for s in spaces:
        ss.get_space(s)  # raises with the valid names
    if len(set(spaces)) != len(spaces):
        raise DatasetError(f"spaces must not repeat, got {list(spaces)}")
    try:
        sizes = [as_int(b, "batch size", low=1, error=DatasetError) for b in batch_sizes]
    except DatasetError:
        sizes = []
    if not sizes:
        raise DatasetError(f"batch_sizes must be a non-empty list of ints >= 1, got {list(batch_sizes)}")
    if mac_budget is not None and (isinstance(mac_budget, bool) or not isinstance(mac_budget, int) or mac_budget < 1):
        raise DatasetError(f"mac_budget must be None or an int >= 1 (MACs), got {mac_budget!r}")
    return n, sizes, as_int(workers, "workers", low=1, error=DatasetError)


class _Draw:
    """The state of a plan's draw: the candidates chosen per space, the attempts made, what was rejected."""

    def __init__(self, spaces: Sequence[str], n: int, *, seed: int, batch_sizes: tuple[int, ...],
                 mac_budget: int | None, max_attempts_per_candidate: int) -> None:
        k = len(spaces)
        self.spaces, self.seed, self.batch_sizes, self.mac_budget = list(spaces), seed, batch_sizes, mac_budget
        self.max_attempts = max_attempts_per_candidate
        self.want = {s: n // k + (1 if i < n % k else 0) for i, s in enumerate(spaces)}
        self.chosen: dict[str, list[Candidate]] = {s: [] for s in spaces}
        self.seen: set[str] = set()
        self.rejected = dict.fromkeys(spaces, 0)
        self.dups = dict.fromkeys(spaces, 0)
        self.next_j = dict.fromkeys(spaces, 0)

    def next_tasks(self, workers: int) -> list[tuple[Any, ...]]:
        """The next block of attempts of every space still short of candidates and attempts; ``[]`` when done."""
        tasks: list[tuple[Any, ...]] = []
        for s in self.spaces:
            got, want, j0 = len(self.chosen[s]), self.want[s], self.next_j[s]
            limit = self.max_attempts * want
            if got >= want or j0 >= limit:
                continue
            # size the block by the acceptance seen so far (80 % assumed before any attempt)
            acc = got / j0 if j0 else 0.8
            block = max(2 * workers, math.ceil((want - got) / max(acc, 0.05) * 1.05))
            tasks += [(self.seed, s, j, self.batch_sizes, self.mac_budget) for j in range(j0, min(j0 + block, limit))]
        return tasks

    def take(self, tasks: list[tuple[Any, ...]], results: list[tuple[dict[str, Any], int | None, int | None]]) -> int:
        """Keep the accepted attempts in order (over budget and duplicates counted); returns how many were kept."""
        kept = 0
        for (_seed, s, j, _b, _m), (cfg, macs, batch) in zip(tasks, results):
            self.next_j[s] = max(self.next_j[s], j + 1)
            if len(self.chosen[s]) >= self.want[s]:
                continue
            if batch is None:
                self.rejected[s] += 1
                continue
            key = canonical_json([s, cfg, batch])
            if key in self.seen:
                self.dups[s] += 1
                continue
            self.seen.add(key)
            self.chosen[s].append(Candidate(space=s, config=cfg, batch_size=batch, macs_per_sample=macs, attempt=j))
            kept += 1
        return kept

    def plan(self, params: dict[str, Any]) -> Plan:
        """The :class:`Plan`: the spaces interleaved so that any prefix covers every family; a shortfall logged."""
        chosen, want = self.chosen, self.want
        shortfall = {s: want[s] - len(chosen[s]) for s in self.spaces if len(chosen[s]) < want[s]}
        for s, short in shortfall.items():
            logger.warning(
                "plan: space %s gave %d of %d candidates within %d attempts (%d over the MAC budget of %s); "
                "raise mac_budget or add smaller batch sizes", s, want[s] - short, want[s], self.next_j[s],
                self.rejected[s], self.mac_budget,
            )
        ordered = [chosen[s][i] for i in range(max(len(v) for v in chosen.values())) for s in self.spaces
                   if i < len(chosen[s])]
        return Plan(candidates=ordered, params=params, rejected_over_budget=self.rejected, duplicates=self.dups,
                    shortfall=shortfall)
