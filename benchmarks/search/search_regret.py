"""Search regret on a table of real measurements: how close does a search that uses the cost model come to the
true Pareto front of accuracy and latency, against FLOPs, an unadapted model, the prior alone and the real device?

Usage (from the repository root; data paths are arguments, nothing is downloaded)::

    python scripts/build_accel_graphs.py --data ../shared/data --out /tmp/regret47/accel_stitched.jsonl
    python benchmarks/search/search_regret.py --data ../shared/data --graphs /tmp/regret47/accel_stitched.jsonl \\
        --checkpoint /tmp/regret47/no_accel.pt --devices a100,rtx-3090 --seeds 10 --trials 200 \\
        [--every 20] [--validate-max 10] [--validate-uncertain 5] [--budget-quantile 0.5] [--out report.json]

Ground truth: Accel-NASBench (``accel_nasbench_mnasnet_space_throughput.csv``: 5,138 MnasNet-space architectures
with ImageNet top-1 accuracy and measured A100 / RTX 3090 throughput); a row's latency is ``256 / throughput *
1000`` ms (batch 256, as ``scripts/build_accel_graphs.py`` labels it). Each trial suggests the 7 blocks'
(expansion, kernel, layers, squeeze-excite) as categoricals and snaps to the table row nearest in Hamming
distance over those 28 choices (ties: the lowest row), so every candidate has its measured truth; its accuracy
is the table's (every method sees the true accuracy: only latency differs). Optuna's ``TPESampler`` (seeded)
minimises (-accuracy, latency); in the budget variant the latency budget (``--budget-quantile`` of the table's
measured latencies) is a constraint (``Trial.set_constraint``), checked by ``Budgets(latency_ms=...)`` on the
prediction as ``Budgets(latency_ms=...)`` checks one (mean + k_sigma σ, ``--k-sigma``, default 1.0, Budgets'
default; σ missing: the mean) where a method predicts.

Methods, by where a trial's latency comes from:

- ``oracle``: the measured table (every candidate measured);
- ``flops``: the architecture's MACs (a latency of ``c * MACs``, ``c`` the geometric-mean ms per MAC of the
  validated rows, for the budget; σ none);
- ``zero_shot``: the cost model as loaded, never told a measurement;
- ``adapted``: the cost model, ``adapt(rows, persist=False)`` on every row validated so far, after each
  validation round;
- ``prior``: the analytic prior alone (:class:`~dippm_nas.predictor.AnalyticPredictor`), ``calibrate(rows,
  persist=False)`` on the same rounds: what the GraphSAGE network must beat;
- ``random``: Optuna's ``RandomSampler``, every candidate measured (what the sampler's guidance is worth).

A validation round (``flops``, ``adapted``, ``prior``) runs every ``--every`` trials and after the last: the
candidates on the method's current believed front (in the budget variant: among the believed-feasible; where it
believes none feasible, the front of all its candidates) that are not yet validated, at most ``--validate-max``
of them (evenly along the front), have their measured latency revealed from the table; a validated candidate's
latency is its measured one from then on. With a budget, up to ``--validate-uncertain`` (default 5) of a round's
``--validate-max`` rows go to candidates whose feasibility is uncertain (the check rejects them, but the budget lies
within the margin's band around the mean: ``dippm_nas.budgets.band_distance`` below 1), in the order
``dippm_nas.validation.uncertain_order`` gives, the round shared by ``dippm_nas.validation.round_split`` (as
``ParetoValidator(uncertain_per_round=...)`` shares its rounds); a round still validates at most ``--validate-max``
rows. What a method returns: the Pareto front of its beliefs over every
trial (measured where validated or measured, else its final estimate); in the budget variant, of the candidates
it believes feasible.

Scores per study: the hypervolume of the returned models scored with their **measured** latency and accuracy
(in the budget variant, only those that really meet the budget) as a share of the hypervolume of the table's
true front (of the rows within budget), reference point (the table's lowest accuracy, its highest measured
latency) of the device; the share of returned feasible models that really meet the budget; the rows measured;
wall time. Predictions are cached per fitted state, made on demand (a trial's row, a round's front) rather than
of the whole table per state: a state sees 20-200 of the 5,125 graphs.

- ``selected``: the network adapted or the prior calibrated, whichever got right, before the rows were revealed,
  what the search uses of each round's validated rows (:class:`Selected`): their order without a budget (pairwise
  order accuracy), their feasibility at the budget with one (the check's classification): the predictor skipping
  the network where the network does not beat the prior alone on this path; the share of rounds the network
  answered is reported.

Seeds run in chunks (``--first-seed``, ``--seeds``), each (device, seed) written to ``--seed-dir`` as it completes;
``--merge DIR [DIR ...] --out report.json`` makes one report of the chunks (settings must agree, no study twice).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dippm_nas.validation import PathChoice

logger = logging.getLogger("search_regret")

CSV_NAME = "accel_nasbench_mnasnet_space_throughput.csv"
BLOCKS = 7
CHOICES = ("e", "k", "l", "se")
#: batch the throughput was measured at (images per pass), as scripts/build_accel_graphs.py labels it
BATCH = 256
#: --devices name -> (the CSV's throughput column, the dataset's device id, the catalogue id predicted for)
DEVICES = {"a100": ("throughput_a100__throughput_mean", "a100-40gb", "a100-sxm4-40gb"),
           "rtx-3090": ("throughput_3090__throughput_mean", "rtx-3090", "rtx-3090")}
METHODS = ("oracle", "flops", "zero_shot", "adapted", "prior", "selected", "random")
#: methods that run validation rounds
ROUND_METHODS = ("flops", "adapted", "prior", "selected")


# ------------------------------------------------------------------ the table
@dataclass
class Table:
    """A table of architectures with measured truth. ``configs``: ``[N, 28]`` choice codes (block-major: e, k, l,
    se); ``choices``: the values of each of the 28 columns; ``accuracy_pct``, ``latency_ms``, ``macs``: ``[N]``."""

    configs: np.ndarray
    choices: list[list[Any]]
    accuracy_pct: np.ndarray
    latency_ms: np.ndarray
    macs: np.ndarray
    csv_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        n = len(self.accuracy_pct)
        if n < 2 or self.configs.shape != (n, len(self.choices)) or len(self.latency_ms) != n or len(self.macs) != n:
            raise ValueError(f"a table needs >= 2 rows and [N, {len(self.choices)}] configs with N labels, got "
                             f"configs {self.configs.shape}, {n} accuracies, {len(self.latency_ms)} latencies")
        if not (np.all(np.isfinite(self.latency_ms)) and np.all(self.latency_ms > 0)):
            raise ValueError("every measured latency must be a finite number > 0")
        if self.csv_rows.size == 0:
            self.csv_rows = np.arange(n)

    def snap(self, codes: Sequence[int]) -> int:
        """The row nearest ``codes`` in Hamming distance (ties: the lowest row)."""
        return int(np.argmin(np.sum(self.configs != np.asarray(codes)[None, :], axis=1)))


def column_names() -> list[str]:
    return [f"b{b}_{c}" for b in range(BLOCKS) for c in CHOICES]


def load_table(data: Path, device: str) -> Table:
    """The Accel-NASBench rows with a measured throughput on ``device`` (a key of :data:`DEVICES`)."""
    col = DEVICES[device][0]
    raw: list[list[Any]] = []
    acc, lat, macs, idx = [], [], [], []
    with (data / CSV_NAME).open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            thr = float(r[col]) if r.get(col) else math.nan
            if not (math.isfinite(thr) and thr > 0 and r.get("val_top1")):
                continue
            raw.append([r[f"arch_block{b}_{c}"] for b in range(BLOCKS) for c in CHOICES])
            acc.append(float(r["val_top1"]))
            lat.append(BATCH / thr * 1000.0)
            macs.append(float(r["mmacs"]) * 1e6)
            idx.append(i)
    choices = [sorted({row[j] for row in raw}, key=_choice_key) for j in range(len(CHOICES) * BLOCKS)]
    codes = np.array([[choices[j].index(v) for j, v in enumerate(row)] for row in raw], dtype=np.int64)
    return Table(codes, choices, np.array(acc), np.array(lat), np.array(macs), np.array(idx))


def _choice_key(v: str) -> tuple[int, float | str]:
    try:
        return (0, float(v))
    except ValueError:
        return (1, v)


# ------------------------------------------------------------------ fronts and hypervolume
def pareto_mask(acc: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Non-dominated points of (accuracy max, latency min); duplicates of a front point are all kept."""
    order = np.lexsort((-acc, lat))  # by latency, then accuracy descending
    keep = np.zeros(len(acc), dtype=bool)
    best = -math.inf
    for i in order:
        if acc[i] > best:
            keep[i] = True
            best = acc[i]
    # equal points of a kept one are on the front too
    pts = {(acc[i], lat[i]) for i in np.flatnonzero(keep)}
    return np.array([(a, t) in pts for a, t in zip(acc, lat)], dtype=bool)


def hypervolume(acc: np.ndarray, lat: np.ndarray, ref_acc: float, ref_lat: float) -> float:
    """Area (accuracy points x ms) dominated by the points and bounded by the reference (``ref_acc`` the worst
    accuracy, ``ref_lat`` the worst latency); points beyond the reference add nothing."""
    ok = (acc > ref_acc) & (lat < ref_lat)
    if not ok.any():
        return 0.0
    a, t = acc[ok], lat[ok]
    order = np.argsort(t)
    area, best = 0.0, ref_acc
    ts = t[order]
    for j, i in enumerate(order):
        best = max(best, a[i])
        nxt = ts[j + 1] if j + 1 < len(order) else ref_lat
        area += (best - ref_acc) * (nxt - ts[j])
    return float(area)


# ------------------------------------------------------------------ latency sources
class LatencySource(Protocol):
    """Where a method's latency comes from: ``estimate(rows)`` -> (mean ms, std ms or NaN) per table row;
    ``reveal(rows, measured_ms)``: every row validated so far and its measured latency (refit on them)."""

    def estimate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def reveal(self, rows: np.ndarray, measured_ms: np.ndarray) -> None: ...

    def reset(self) -> None: ...


class Measured:
    """The table itself (the oracle and random search)."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def estimate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.table.latency_ms[rows], np.zeros(len(rows))

    def reveal(self, rows: np.ndarray, measured_ms: np.ndarray) -> None:
        return None

    def reset(self) -> None:
        return None


class Flops:
    """``c * MACs``, ``c`` the geometric mean of measured / MACs over the validated rows (1 ms per GMAC before)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.scale = 1e-9

    def estimate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.table.macs[rows] * self.scale, np.full(len(rows), math.nan)

    def reveal(self, rows: np.ndarray, measured_ms: np.ndarray) -> None:
        if len(rows):
            self.scale = float(np.exp(np.mean(np.log(measured_ms / self.table.macs[rows]))))

    def reset(self) -> None:
        self.scale = 1e-9


class PredictorSource:
    """A dippm-nas predictor over the table's graphs: ``mode`` ``"fixed"`` (never told), ``"adapt"``
    (``adapt(rows, persist=False)``) or ``"calibrate"`` (``calibrate(rows, persist=False)``); predictions are cached
    per fitted state, the fixed ones for the process (``fixed_cache``). ``conformal``: the conformal calibration
    its ``Budgets(..., confidence=c)`` checks read (:meth:`bounds`; ``None``: the Gaussian quantile, as ``Budgets``
    falls back to without one)."""

    def __init__(self, predictor: Any, graphs: Sequence[Any], row_graph: np.ndarray, mode: str,
                 fixed_cache: dict[int, Any] | None = None, conformal: Any = None) -> None:
        if mode not in ("fixed", "adapt", "calibrate"):
            raise ValueError(f"mode must be fixed, adapt or calibrate, got {mode!r}")
        self.p, self.graphs, self.row_graph, self.mode = predictor, graphs, row_graph, mode
        self.fixed = fixed_cache if fixed_cache is not None else {}
        self.cache: dict[int, Any] = {}
        self.fitted = False
        self.conformal = conformal
        self._budgets: dict[tuple[float, float], Any] = {}

    def _predict(self, gids: list[int]) -> list[Any]:
        return list(self.p.predict_graphs([self.graphs[g] for g in gids], mig=False))

    def predictions(self, rows: np.ndarray) -> list[Any]:
        """The current state's prediction of each row (cached per state)."""
        cache = self.cache if self.fitted else self.fixed
        gids = [int(self.row_graph[r]) for r in rows]
        todo = sorted({g for g in gids if g not in cache})
        if todo:
            cache.update(zip(todo, self._predict(todo)))
        return [cache[g] for g in gids]

    def estimate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        preds = self.predictions(rows)
        return (np.array([float(x.latency_ms) for x in preds]),
                np.array([math.nan if x.latency_ms_std is None else float(x.latency_ms_std) for x in preds]))

    def checks(self, rows: np.ndarray, budget: float, confidence: float) -> list[Any]:
        """``Budgets(latency_ms=budget, confidence=confidence, conformal=self.conformal, in_space=self.p)``'s latency
        check (:class:`~dippm_nas.budgets.ChanceCheck`) of each row's current prediction: an adapted one is bounded
        with its adaptation's in-space scores when there are enough for the confidence, else with ``conformal``."""
        b = self._budgets.get((budget, confidence))
        if b is None:
            from dippm_nas.budgets import Budgets

            # an adapted prediction reads its adaptation's in-space scores (Budgets.in_space) where they suffice
            b = self._budgets[(budget, confidence)] = Budgets(
                latency_ms=budget, confidence=confidence, conformal=self.conformal,
                in_space=self.p if hasattr(self.p, "adaptation") else None)
        return [b.check(x)["latency_ms"] for x in self.predictions(rows)]

    def reveal(self, rows: np.ndarray, measured_ms: np.ndarray) -> None:
        if self.mode == "fixed" or len(rows) < 2:
            return
        pairs = [(self.graphs[int(self.row_graph[r])], {"latency_ms": float(v)}) for r, v in zip(rows, measured_ms)]
        if self.mode == "adapt":
            self.p.adapt(pairs, persist=False)
        else:
            self.p.calibrate(pairs, persist=False)
        self.cache = {}
        self.fitted = True

    def reset(self) -> None:
        if self.mode == "adapt":
            self.p.reset_adaptation()
        self.p.calibration = None
        if hasattr(self.p, "clear_prediction_cache"):  # the analytic predictor keeps no prediction cache
            self.p.clear_prediction_cache()
        self.cache, self.fitted = {}, False


class Selected:
    """The network or the prior alone, whichever got right, **before** the rows were revealed, what the search uses:
    the library's rule, :class:`dippm_nas.validation.PathChoice` (prequential: each round's new rows scored against
    the states fitted on the earlier rounds; ties: the prior), as ``ParetoValidator(choose_path=True)`` applies it:

    - without a budget the search uses only the order of the latencies (yardstick ``"order"``: the pairwise order
      accuracy over each round's new rows, summed over the rounds);
    - with a budget what decides is the check (yardstick ``"feasibility"``: the share of the new rows whose check,
      :class:`BudgetRule`, the source's ``Budgets`` bound, classed them as the measurement does).

    Both are refitted on every round (``adapt`` / ``calibrate``); before any scored round, the network answers (the
    predictor's default path). ``choice``: the library's state (``choice.path`` the source answering now,
    ``choice.rounds_network`` the rounds after which the network answered, ``choice.score`` each source's
    (right, counted)). :meth:`use_budget` sets the yardstick."""

    def __init__(self, network: PredictorSource, prior: PredictorSource) -> None:
        if network.mode != "adapt" or prior.mode != "calibrate":
            raise ValueError(f"selected needs an adapting network and a calibrating prior, got {network.mode!r} and "
                             f"{prior.mode!r}")
        self.network, self.prior = network, prior
        self.budget: float | None = None
        self.rule = BudgetRule()
        self.reset()

    def use_budget(self, budget: float | None, rule: "BudgetRule") -> None:
        """Score by the feasibility classification at ``budget`` under ``rule`` (``None``: by the order)."""
        self.budget, self.rule = budget, rule
        self.choice = PathChoice(yardstick="order" if budget is None else "feasibility")

    def reset(self) -> None:
        self.network.reset()
        self.prior.reset()
        self.choice = PathChoice(yardstick="order" if self.budget is None else "feasibility")

    @property
    def rounds(self) -> int:
        return self.choice.rounds

    @property
    def rounds_network(self) -> int:
        return self.choice.rounds_network

    def _source(self) -> PredictorSource:
        return self.network if self.choice.path == "network" else self.prior

    def estimate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._source().estimate(rows)

    def checks(self, rows: np.ndarray, budget: float, confidence: float) -> list[Any]:
        return self._source().checks(rows, budget, confidence)

    def predictions(self, rows: np.ndarray) -> list[Any]:
        return self._source().predictions(rows)

    def _said(self, src: PredictorSource, rows: np.ndarray) -> list[Any]:
        """What ``src`` (its state before the rows' reveal) said of ``rows`` by the yardstick: the predicted latency,
        or with a budget whether its check admitted the row."""
        mean, std = src.estimate(rows)
        if self.budget is None:
            return mean.tolist()
        return (_bounds(src, rows, mean, std, {}, self.budget, self.rule) <= self.budget).tolist()

    def reveal(self, rows: np.ndarray, measured_ms: np.ndarray) -> None:
        new = np.array([str(int(r)) not in self.choice.seen for r in rows], dtype=bool)
        truth = measured_ms[new] if self.budget is None else measured_ms[new] <= self.budget
        said = {name: self._said(src, rows[new]) if new.any() else []
                for name, src in (("network", self.network), ("prior", self.prior))}
        self.choice.score_round([int(r) for r in rows[new]], truth.tolist(), said)
        self.network.reveal(rows, measured_ms)
        self.prior.reveal(rows, measured_ms)


# ------------------------------------------------------------------ one study
@dataclass
class StudyResult:
    """One study's scores (shares in [0, 1]; ``feasible_precision`` NaN without a budget or a returned model)."""

    method: str
    seed: int
    budget_ms: float | None
    hv_share: float
    feasible_precision: float
    returned: int
    measured_rows: int
    wall_s: float
    #: ``selected`` only: the share of its validation rounds after which the network (not the prior) answered
    network_rounds_share: float = math.nan
    #: methods with rounds: mean |ln(predicted / measured)| of each round's newly validated rows, predicted before
    #: their reveal (what the source knew of the rows it was about to be told)
    prequential_log_err: float = math.nan
    #: with a budget, methods that predict: of the candidates never measured that really meet the budget, the share
    #: the check rejects (mean + k_sigma σ; and on the mean alone), and of those the mean alone admits, the share
    #: really over the budget
    fit_rejected_share: float = math.nan
    fit_rejected_share_mean_only: float = math.nan
    over_admitted_share_mean_only: float = math.nan
    #: with a budget, methods that predict: of the never-measured candidates the check admits, the share really
    #: over the budget (what a confidence c promises to keep at or below 1 - c)
    over_admitted_share: float = math.nan
    #: with a budget checked at a confidence, methods that predict: over the never-measured candidates' final
    #: checks, the mean margin k (in σ_log for a conformal bound; the Gaussian quantile without a calibration) and
    #: the share whose prediction is in an adapted regime
    margin_k_mean: float = math.nan
    adapted_regime_share: float = math.nan
    #: of those final checks, the share bounded with the adaptation's in-space scores (``Budgets.in_space``: enough
    #: validated rows for the confidence) rather than the checkpoint's calibration
    in_space_share: float = math.nan


@dataclass
class _State:
    rows: list[int] = field(default_factory=list)
    validated: dict[int, float] = field(default_factory=dict)
    log_err: list[float] = field(default_factory=list)


def _beliefs(table: Table, source: LatencySource, rows: np.ndarray, validated: dict[int, float],
             measured_all: bool) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) a method believes for ``rows``: measured where validated (or every row: ``measured_all``)."""
    if measured_all:
        return table.latency_ms[rows], np.zeros(len(rows))
    mean, std = source.estimate(rows)
    mean, std = mean.copy(), std.copy()
    for j, r in enumerate(rows):
        if int(r) in validated:
            mean[j], std[j] = validated[int(r)], 0.0
    return mean, std


@dataclass(frozen=True)
class BudgetRule:
    """How a predicted latency is checked against the budget, as ``Budgets`` checks one: ``confidence`` ``None``,
    ``Budgets(latency_ms=budget, k_sigma=k_sigma)`` (mean + k_sigma σ); else ``Budgets(latency_ms=budget,
    confidence=confidence)`` with the source's conformal calibration (:meth:`PredictorSource.checks`). σ missing
    (FLOPs) or the latency measured: the mean."""

    k_sigma: float = 1.0
    confidence: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k_sigma) and self.k_sigma >= 0):
            raise ValueError(f"k_sigma must be a finite number >= 0, got {self.k_sigma!r}")
        if self.confidence is not None and not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {self.confidence!r}")


def _bound(mean: np.ndarray, std: np.ndarray, k_sigma: float) -> np.ndarray:
    """What a budget is checked against: ``Budgets``' mean + k_sigma σ (σ missing: the mean)."""
    return mean + k_sigma * np.where(np.isfinite(std), std, 0.0)


def _bounds(source: LatencySource, rows: np.ndarray, mean: np.ndarray, std: np.ndarray, validated: dict[int, float],
            budget: float, rule: BudgetRule) -> np.ndarray:
    """What the budget is checked against for each row (``mean``, ``std``: :func:`_beliefs`): the measured latency
    where validated; else by ``rule`` (with a confidence, the bound of the source's ``Budgets`` check where the
    source has one: :meth:`PredictorSource.checks`)."""
    checks = getattr(source, "checks", None)
    if rule.confidence is None or checks is None:
        return _bound(mean, std, rule.k_sigma)
    out = mean.copy()
    todo = np.array([j for j, r in enumerate(rows) if int(r) not in validated], dtype=np.int64)
    if todo.size:
        out[todo] = [c.bound for c in checks(rows[todo], budget, rule.confidence)]
    return out


def _returned(table: Table, source: LatencySource, st: _State, budget: float | None, rule: BudgetRule,
              measured_all: bool) -> np.ndarray:
    """The distinct rows a method returns: its believed front (over its believed-feasible rows with a budget)."""
    rows = np.array(sorted(set(st.rows)), dtype=np.int64)
    mean, std = _beliefs(table, source, rows, st.validated, measured_all)
    if budget is not None:
        validated = {int(r): 0.0 for r in rows} if measured_all else st.validated
        ok = _bounds(source, rows, mean, std, validated, budget, rule) <= budget
        rows, mean = rows[ok], mean[ok]
    if rows.size == 0:
        return rows
    return rows[pareto_mask(table.accuracy_pct[rows], mean)]


def _uncertain_rows(table: Table, source: LatencySource, st: _State, budget: float, rule: BudgetRule,
                    exclude: set[int]) -> list[int]:
    """The unvalidated rows whose feasibility the check is unsure of (it rejects them, but the budget lies within
    the margin's band around the mean: :attr:`dippm_nas.budgets.ChanceCheck.uncertain`), in the order
    :func:`dippm_nas.validation.uncertain_order` gives (those no other dominates by (accuracy, believed latency)
    first; the nearest the budget first)."""
    from dippm_nas.budgets import band_distance
    from dippm_nas.validation import uncertain_order

    rows = np.array(sorted(set(st.rows) - set(st.validated) - exclude), dtype=np.int64)
    if rows.size == 0:
        return []
    mean, std = _beliefs(table, source, rows, st.validated, False)
    bound = _bounds(source, rows, mean, std, st.validated, budget, rule)
    dist = [band_distance(m, b, budget) if b > budget else math.inf for m, b in zip(mean, bound)]
    order = uncertain_order(list(zip(table.accuracy_pct[rows], mean)), ("maximize", "minimize"), dist)
    return [int(rows[i]) for i in order]


def _validation_round(table: Table, source: LatencySource, st: _State, budget: float | None, rule: BudgetRule,
                      validate_max: int, validate_uncertain: int = 0) -> None:
    """Reveal the measured latency of the unvalidated rows on the believed front; refit the source on all. With a
    budget, the front of the believed-feasible rows; where none is believed feasible, the front of all rows (its
    fast end the nearest to the budget): a search that believes nothing fits measures what comes closest. With a
    budget and ``validate_uncertain``, up to that many of the round's ``validate_max`` rows go to rows whose
    feasibility is uncertain (:func:`_uncertain_rows`; :func:`dippm_nas.validation.round_split` shares the round)."""
    from dippm_nas.validation import round_split

    ret = _returned(table, source, st, budget, rule, False)
    if budget is not None and ret.size == 0:
        ret = _returned(table, source, st, None, rule, False)
    front = [int(r) for r in ret if int(r) not in st.validated]
    unsure = (_uncertain_rows(table, source, st, budget, rule, set(front))
              if budget is not None and validate_uncertain > 0 else [])
    n_front, n_unsure = round_split(len(front), len(unsure), validate_max, min(validate_uncertain, validate_max))
    if len(front) > n_front:
        mean, _ = source.estimate(np.array(front))
        by_lat = [front[i] for i in np.argsort(mean)]
        front = [by_lat[i] for i in np.unique(np.linspace(0, len(by_lat) - 1, n_front).round().astype(int))] \
            if n_front > 0 else []
    new = front + unsure[:n_unsure]
    if new:
        mean, _ = source.estimate(np.array(new))
        st.log_err.extend(np.abs(np.log(mean / table.latency_ms[new])).tolist())
    for r in new:
        st.validated[r] = float(table.latency_ms[r])
    if st.validated:
        rows = np.array(sorted(st.validated), dtype=np.int64)
        source.reveal(rows, table.latency_ms[rows])


@contextlib.contextmanager
def tpe_split_memo() -> Iterator[None]:
    """Within the block, Optuna's TPE splits the finished trials into good and bad once per trial rather than once
    per parameter (28 times a trial here, half a study's time). Equivalent in a sequential study: between one
    trial's ask and tell no trial changes, and the split reads only the trials and the number below; the memo keys
    on both (each trial's number and state) and lives for the block. Reaches Optuna's module-level
    ``_split_trials`` (the sampler calls it by that name); ``test_tpe_split_memo_changes_no_study`` checks a
    study's every trial is the same with it and without."""
    tpe = importlib.import_module("optuna.samplers._tpe.sampler")
    original = tpe._split_trials
    last: list[Any] = [None, None]

    def split(study: Any, trials: list[Any], n_below: int) -> tuple[list[Any], list[Any]]:
        key = (id(study), n_below, tuple((t.number, t.state) for t in trials))
        if last[0] != key:
            last[0], last[1] = key, original(study, trials, n_below)
        return list(last[1][0]), list(last[1][1])

    tpe._split_trials = split
    try:
        yield
    finally:
        tpe._split_trials = original


def run_study(table: Table, method: str, source: LatencySource, seed: int, trials: int, *, budget: float | None = None,
              every: int = 20, validate_max: int = 10, k_sigma: float = 1.0,
              confidence: float | None = None, validate_uncertain: int = 0) -> StudyResult:
    """One seeded study of ``method`` (:data:`METHODS`) with its latency ``source``; scored on the truth. The budget
    is checked by :class:`BudgetRule` ``(k_sigma, confidence)``."""
    import optuna

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    rule = BudgetRule(k_sigma, confidence)
    t0 = time.perf_counter()
    if isinstance(source, Selected):
        source.use_budget(budget, rule)
    source.reset()
    measured_all = method in ("oracle", "random")
    sampler = (optuna.samplers.RandomSampler(seed=seed) if method == "random"
               else optuna.samplers.TPESampler(seed=seed))
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    with tpe_split_memo():
        st = _run_trials(table, method, source, study, trials, budget, every, (validate_max, validate_uncertain),
                         rule)
    ret = _returned(table, source, st, budget, rule, measured_all)
    res = _score(table, method, seed, budget, ret, st, measured_all, time.perf_counter() - t0)
    res.network_rounds_share = _network_share(source)
    res.prequential_log_err = float(np.mean(st.log_err)) if st.log_err else math.nan
    if budget is not None and not measured_all:
        _budget_diagnostics(table, source, st, budget, rule, res)
    return res


def _budget_diagnostics(table: Table, source: LatencySource, st: _State, budget: float, rule: BudgetRule,
                        res: StudyResult) -> None:
    """Where a budget check loses candidates: over the method's never-measured candidates, its final estimates."""
    rows = np.array(sorted(set(st.rows) - set(st.validated)), dtype=np.int64)
    if rows.size == 0:
        return
    mean, std = source.estimate(rows)
    fits = table.latency_ms[rows] <= budget
    if rule.confidence is not None and hasattr(source, "checks"):
        from dippm_nas.conformal import regime_of

        checks = source.checks(rows, budget, rule.confidence)
        res.margin_k_mean = float(np.mean([c.k_sigma for c in checks]))
        res.adapted_regime_share = float(np.mean([regime_of(x).endswith("|adapted")
                                                  for x in source.predictions(rows)]))
        res.in_space_share = float(np.mean([c.labels.get("conformal_regime_latency_ms") == "in-space"
                                            for c in checks]))
    admitted_rule = _bounds(source, rows, mean, std, {}, budget, rule) <= budget
    if admitted_rule.any():
        res.over_admitted_share = float(np.mean(~fits[admitted_rule]))
    if fits.any():
        res.fit_rejected_share = float(np.mean(~admitted_rule[fits]))
        res.fit_rejected_share_mean_only = float(np.mean(mean[fits] > budget))
    admitted = mean <= budget
    if admitted.any():
        res.over_admitted_share_mean_only = float(np.mean(~fits[admitted]))


def _run_trials(table: Table, method: str, source: LatencySource, study: Any, trials: int, budget: float | None,
                every: int, validate: tuple[int, int], rule: BudgetRule) -> _State:
    """Ask, snap, believe, tell ``trials`` times, with a validation round every ``every`` trials and after the last."""
    measured_all = method in ("oracle", "random")
    names, st = column_names(), _State()
    for t in range(trials):
        trial = study.ask()
        codes = [table.choices[j].index(trial.suggest_categorical(n, table.choices[j])) for j, n in enumerate(names)]
        row = table.snap(codes)
        st.rows.append(row)
        mean, std = _beliefs(table, source, np.array([row]), st.validated, measured_all)
        trial.set_user_attr("row", int(table.csv_rows[row]))
        if budget is not None:
            validated = {row: 0.0} if measured_all else st.validated
            bound = _bounds(source, np.array([row]), mean, std, validated, budget, rule)[0]
            trial.set_constraint("latency_ms", float(bound - budget))
        study.tell(trial, [float(table.accuracy_pct[row]), float(mean[0])])
        if method in ROUND_METHODS and ((t + 1) % every == 0 or t + 1 == trials):
            _validation_round(table, source, st, budget, rule, *validate)
    return st


def reference(table: Table) -> tuple[float, float]:
    """The fixed reference point: (the table's lowest accuracy, its highest measured latency)."""
    return float(table.accuracy_pct.min()), float(table.latency_ms.max())


def true_hypervolume(table: Table, budget: float | None) -> float:
    """Hypervolume of the table's true front (of the rows within ``budget``)."""
    ok = np.ones(len(table.latency_ms), dtype=bool) if budget is None else table.latency_ms <= budget
    return hypervolume(table.accuracy_pct[ok], table.latency_ms[ok], *reference(table))


def _score(table: Table, method: str, seed: int, budget: float | None, ret: np.ndarray, st: _State,
           measured_all: bool, wall_s: float) -> StudyResult:
    acc, lat = table.accuracy_pct[ret], table.latency_ms[ret]
    meets = np.ones(len(ret), dtype=bool) if budget is None else lat <= budget
    hv = hypervolume(acc[meets], lat[meets], *reference(table)) / true_hypervolume(table, budget)
    precision = float(np.mean(meets)) if budget is not None and len(ret) else math.nan
    measured = len(set(st.rows)) if measured_all else len(st.validated)
    return StudyResult(method, seed, budget, float(hv), precision, len(ret), measured, wall_s)


def _network_share(source: LatencySource) -> float:
    if isinstance(source, Selected) and source.rounds:
        return source.rounds_network / source.rounds
    return math.nan


# ------------------------------------------------------------------ the benchmark
def summarise(results: Sequence[StudyResult]) -> dict[str, dict[str, float]]:
    """Per method: mean and min of the hypervolume share, mean feasible precision, mean rows measured and wall s."""
    out: dict[str, dict[str, float]] = {}
    for m in METHODS:
        rs = [r for r in results if r.method == m]
        if not rs:
            continue
        prec = [r.feasible_precision for r in rs if math.isfinite(r.feasible_precision)]
        out[m] = {"studies": len(rs), "hv_share_mean": float(np.mean([r.hv_share for r in rs])),
                  "hv_share_min": float(np.min([r.hv_share for r in rs])),
                  "hv_share_std": float(np.std([r.hv_share for r in rs], ddof=1)) if len(rs) > 1 else math.nan,
                  "feasible_precision_mean": float(np.mean(prec)) if prec else math.nan,
                  "measured_rows_mean": float(np.mean([r.measured_rows for r in rs])),
                  "returned_mean": float(np.mean([r.returned for r in rs])),
                  "wall_s_mean": float(np.mean([r.wall_s for r in rs]))}
        for name in ("network_rounds_share", "prequential_log_err", "fit_rejected_share",
                     "fit_rejected_share_mean_only", "over_admitted_share_mean_only", "over_admitted_share",
                     "margin_k_mean",
                     "adapted_regime_share", "in_space_share"):
            vals = [getattr(r, name) for r in rs if math.isfinite(getattr(r, name))]
            if vals:
                out[m][f"{name}_mean"] = float(np.mean(vals))
    if "oracle" in out:  # the yardstick: each method's mean hypervolume as a share of the oracle's
        for v in out.values():
            v["hv_vs_oracle"] = v["hv_share_mean"] / out["oracle"]["hv_share_mean"]
    return out


def run_all(table: Table, sources: dict[str, LatencySource], seeds: Sequence[int], trials: int,
            budgets: Sequence[float | None], **kw: Any) -> list[StudyResult]:
    """Every (budget, method, seed) study; ``sources``: a latency source per method to run."""
    out = []
    for budget in budgets:
        for m, src in sources.items():
            for s in seeds:
                r = run_study(table, m, src, s, trials, budget=budget, **kw)
                logger.info("%s seed %d budget %s: hv %.3f precision %.2f (%d returned, %d measured) %.1f s",
                            m, s, budget, r.hv_share, r.feasible_precision, r.returned, r.measured_rows, r.wall_s)
                out.append(r)
    return out


def load_graphs(graphs_path: Path) -> dict[int, Any]:
    """Each CSV row's graph (from ``build_accel_graphs``' JSONL; one graph per architecture, any GPU's rows)."""
    from dippm_nas.dataset import load_measurements

    by_csv: dict[int, Any] = {}
    for mg in load_measurements(graphs_path):
        m = mg.measurement
        if isinstance(m.get("extra"), dict) and "csv_row" in m["extra"]:
            by_csv.setdefault(int(m["extra"]["csv_row"]), mg.graph)
    return by_csv


def table_graphs(by_csv: dict[int, Any], table: Table) -> tuple[list[Any], np.ndarray]:
    """The distinct graphs of the table's rows and each row's index into them."""
    missing = [int(i) for i in table.csv_rows if int(i) not in by_csv]
    if missing:
        raise SystemExit(f"{len(missing)} table rows have no graph (e.g. CSV row {missing[0]}): rebuild the file "
                         "with scripts/build_accel_graphs.py")
    graphs: list[Any] = []
    index: dict[str, int] = {}
    row_graph = np.zeros(len(table.csv_rows), dtype=np.int64)
    for j, i in enumerate(table.csv_rows):
        g = by_csv[int(i)]
        key = g.structural_hash()
        if key not in index:
            index[key] = len(graphs)
            graphs.append(g)
        row_graph[j] = index[key]
    return graphs, row_graph


def load_conformal(checkpoint: Path) -> Any:
    """The conformal calibration beside ``checkpoint`` (``<checkpoint>.conformal.json``), checked against its
    SHA-256 (:func:`dippm_nas.conformal.conformal_for`); ``SystemExit`` naming the file where there is none."""
    from dippm_nas.conformal import conformal_for, conformal_path
    from dippm_nas.predictor import GnnPredictor

    if not conformal_path(checkpoint).is_file():
        raise SystemExit(f"--confidence needs the checkpoint's conformal calibration {conformal_path(checkpoint)}: "
                         "fit it with benchmarks/accuracy/conformal_budgets.py --write (docs/search_regret.md)")
    return conformal_for(GnnPredictor.load(checkpoint, load_calibration=False))


def make_sources(table: Table, graphs: list[Any], row_graph: np.ndarray, checkpoint: Path, device: str,
                 methods: Sequence[str], conformal: Any = None) -> tuple[dict[str, LatencySource], Any]:
    """The latency source of each method (the table, MACs, the checkpoint fixed / adapted, the prior) and a context
    within which the network runs no more: the zero-shot predictions of every graph are made here, in one batched
    call, and the members' outputs of every graph kept (``one_network_pass``) for every adaptation and prediction.
    ``conformal``: the checkpoint's conformal calibration, read by the network's ``Budgets(..., confidence=c)``
    checks (the prior has none: its checks take the Gaussian quantile, flagged, as ``Budgets`` does)."""
    from dippm_nas.predictor import AnalyticPredictor, GnnPredictor

    base = GnnPredictor.load(checkpoint, load_calibration=False)
    gnn = GnnPredictor(base.model, base.meta, device, load_calibration=False, feature_cache_size=2 * len(graphs) + 16)
    fixed: dict[int, Any] = {}
    ctx: Any = contextlib.nullcontext()
    if {"zero_shot", "adapted", "selected"} & set(methods):
        t0 = time.perf_counter()
        gids = list(range(len(graphs)))
        fixed.update(zip(gids, PredictorSource(gnn, graphs, row_graph, "fixed")._predict(gids)))
        ctx = gnn.one_network_pass(graphs)
        logger.info("zero-shot predictions of %d graphs in %.0f s", len(graphs), time.perf_counter() - t0)
    made: dict[str, Callable[[], LatencySource]] = {
        "oracle": lambda: Measured(table), "random": lambda: Measured(table), "flops": lambda: Flops(table),
        # one network for both (each study resets it): its feature cache and kept outputs serve both
        "zero_shot": lambda: PredictorSource(gnn, graphs, row_graph, "fixed", fixed, conformal),
        "adapted": lambda: PredictorSource(gnn, graphs, row_graph, "adapt", fixed, conformal),
        "prior": lambda: PredictorSource(AnalyticPredictor(device, load_calibration=False), graphs, row_graph,
                                         "calibrate"),
        "selected": lambda: Selected(PredictorSource(gnn, graphs, row_graph, "adapt", fixed, conformal),
                                     PredictorSource(AnalyticPredictor(device, load_calibration=False), graphs,
                                                     row_graph, "calibrate")),
    }
    return {m: made[m]() for m in methods}, ctx


def print_table(name: str, summary: dict[str, dict[str, float]], budget: float | None) -> None:
    """One variant's table; with a budget also the never-measured candidates' check: the share of those that fit
    it rejects (``fit rej``), of those it admits really over (``over adm``), and its mean margin ``k``."""
    print(f"\n== {name}, {'no budget' if budget is None else f'latency budget {budget:.2f} ms'}")
    extra = "" if budget is None else f" {'fit rej':>8} {'over adm':>8} {'k':>6}"
    print(f"{'method':>10} {'HV share mean':>14} {'min':>6} {'std':>6} {'vs oracle':>10} {'feasible ok':>12} "
          f"{'measured':>9} {'returned':>9} {'wall s':>7} {'net rounds':>10}{extra}")
    for m, v in summary.items():
        tail = "" if budget is None else (f" {v.get('fit_rejected_share_mean', math.nan):8.2f} "
                                          f"{v.get('over_admitted_share_mean', math.nan):8.2f} "
                                          f"{v.get('margin_k_mean_mean', math.nan):6.2f}")
        print(f"{m:>10} {v['hv_share_mean']:14.3f} {v['hv_share_min']:6.3f} {v['hv_share_std']:6.3f} "
              f"{v.get('hv_vs_oracle', math.nan):10.3f} {v['feasible_precision_mean']:12.3f} "
              f"{v['measured_rows_mean']:9.1f} {v['returned_mean']:9.1f} {v['wall_s_mean']:7.2f} "
              f"{v.get('network_rounds_share_mean', math.nan):10.2f}{tail}")
    sys.stdout.flush()


#: the settings a per-seed file records; files merge only where these are equal
CONFIG_KEYS = ("checkpoint", "trials", "every", "validate_max", "k_sigma", "confidence", "conformal",
               "budget_quantile", "validate_uncertain")
#: the settings of the budget check only: a file of studies without a budget merges whatever they are
MARGIN_KEYS = ("k_sigma", "confidence", "conformal", "validate_uncertain")


def from_report(path: Path) -> int:
    """Print the tables of a report this script wrote (``--out``), from its per-study scores."""
    report = json.loads(path.read_text())
    seeds = report["seeds"]
    print(f"checkpoint {report['checkpoint']}; {len(seeds) if isinstance(seeds, list) else seeds} seeds x "
          f"{report['trials']} trials, a round every {report['every']} (at most {report['validate_max']} rows), "
          f"{_rule_text(report)}")
    for dev, d in report["devices"].items():
        print(f"{dev}: {d['rows']} rows; reference point: accuracy {d['reference'][0]:.2f} %, latency "
              f"{d['reference'][1]:.2f} ms")
        results = [StudyResult(**r) for r in d["studies"]]
        for v in d["variants"].values():
            print_table(dev, summarise([r for r in results if r.budget_ms == v["budget_ms"]]), v["budget_ms"])
            print_paired([r for r in results if r.budget_ms == v["budget_ms"]])
    return 0


@dataclass
class DeviceRun:
    """One device's table, latency sources, budgets and the context within which its network runs no more."""

    name: str
    table: Table
    sources: dict[str, LatencySource]
    network_once: Any
    budgets: list[float | None]


def prepare_device(args: argparse.Namespace, dev: str, by_csv: dict[int, Any], methods: list[str],
                   conformal: Any = None) -> DeviceRun:
    t0 = time.perf_counter()
    table = load_table(args.data, dev)
    graphs, row_graph = table_graphs(by_csv, table)
    sources, network_once = make_sources(table, graphs, row_graph, args.checkpoint, DEVICES[dev][2], methods,
                                         conformal)
    budget = float(np.quantile(table.latency_ms, args.budget_quantile))
    budgets = [None if v == "free" else budget for v in args.variants.split(",")]
    print(f"{dev}: {len(table.latency_ms)} rows, {len(graphs)} graphs (sources ready in {time.perf_counter() - t0:.0f}"
          f" s); reference point: accuracy {reference(table)[0]:.2f} %, latency {reference(table)[1]:.2f} ms")
    return DeviceRun(dev, table, sources, network_once, budgets)


def _rule_text(config: dict[str, Any]) -> str:
    if config.get("confidence") is None:
        return f"budget checked as mean + {config.get('k_sigma')} σ"
    return f"budget checked at confidence {config['confidence']} (conformal: {config.get('conformal')})"


def seed_record(args: argparse.Namespace, run: DeviceRun, seed: int, results: list[StudyResult]) -> dict[str, Any]:
    """One device's studies of one seed, with the settings they ran under (a ``--seed-dir`` file)."""
    return {"config": {k: str(args.checkpoint) if k == "checkpoint" else getattr(args, k) for k in CONFIG_KEYS},
            "device": run.name, "seed": seed, "rows": len(run.table.latency_ms), "reference": reference(run.table),
            "budgets_ms": run.budgets, "studies": [r.__dict__ for r in results]}


def _settings(rec: dict[str, Any]) -> dict[str, Any]:
    """A record's settings as merging compares them: every :data:`CONFIG_KEYS` (absent: ``None``); a record of
    studies without a budget leaves the budget check's (:data:`MARGIN_KEYS`) out."""
    free = all(b is None for b in rec["budgets_ms"])
    return {k: rec["config"].get(k) for k in CONFIG_KEYS if not (free and k in MARGIN_KEYS)}


def merge_records(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report (``--out``'s layout) of per-seed records: every record's settings must be equal (those of the
    budget check only among records with a budget), and no (device, method, seed, budget) study may appear twice."""
    if not records:
        raise SystemExit("--merge: no per-seed file found")
    first = next((r for r in records if any(b is not None for b in r["budgets_ms"])), records[0])
    config = {k: first["config"].get(k) for k in CONFIG_KEYS}
    report: dict[str, Any] = {**config, "seeds": sorted({r["seed"] for r in records}), "devices": {}}
    seen: set[tuple[str, str, int, float | None]] = set()
    for rec in records:
        want = {k: v for k, v in config.items() if k in _settings(rec)}
        if _settings(rec) != want:
            raise SystemExit(f"--merge: files of different settings: {_settings(rec)} vs {want}")
        d = report["devices"].setdefault(rec["device"], {"rows": rec["rows"], "reference": rec["reference"],
                                                         "budgets_ms": [], "studies": []})
        d["budgets_ms"] += [b for b in rec["budgets_ms"] if b not in d["budgets_ms"]]
        for st in rec["studies"]:
            key = (rec["device"], st["method"], st["seed"], st["budget_ms"])
            if key in seen:
                raise SystemExit(f"--merge: {key} appears in two files")
            seen.add(key)
            d["studies"].append(st)
    for d in report["devices"].values():
        results = [StudyResult(**r) for r in d["studies"]]
        d["variants"] = {"free" if b is None else "budget": {
            "budget_ms": b, "seeds": sorted({r.seed for r in results if r.budget_ms == b}),
            "summary": summarise([r for r in results if r.budget_ms == b])} for b in d.pop("budgets_ms")}
    return report


def read_records(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The per-seed files under ``paths`` (files, or directories of ``*_seed*.json``)."""
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.glob("*_seed*.json")) if p.is_dir() else [p])
    return [json.loads(f.read_text()) for f in files]


def run_seeds(args: argparse.Namespace, runs: list[DeviceRun]) -> list[dict[str, Any]]:
    """Seed by seed, every device's studies; each (device, seed) written to ``--seed-dir`` as it completes."""
    records = []
    with contextlib.ExitStack() as stack:
        for run in runs:
            stack.enter_context(run.network_once)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for run in runs:
                res = run_all(run.table, run.sources, [seed], args.trials, run.budgets, every=args.every,
                              validate_max=args.validate_max, k_sigma=args.k_sigma, confidence=args.confidence,
                              validate_uncertain=args.validate_uncertain)
                records.append(seed_record(args, run, seed, res))
                if args.seed_dir is not None:
                    args.seed_dir.mkdir(parents=True, exist_ok=True)
                    _write(args.seed_dir / f"{run.name}_seed{seed}.json", json.dumps(records[-1]) + "\n", "--seed-dir")
    return records


#: the paired comparisons printed per variant: (method, against)
PAIRS = (("adapted", "flops"), ("adapted", "zero_shot"), ("adapted", "prior"), ("selected", "flops"),
         ("selected", "prior"), ("selected", "adapted"))


def paired(results: Sequence[StudyResult], a: str, b: str) -> dict[str, float] | None:
    """Hypervolume share of ``a`` minus ``b`` over the seeds both ran (same seed, same sampler start): mean, sd
    (ddof 1), the seeds ``a`` is strictly ahead in, and how many; ``None`` where no seed has both."""
    hv: dict[str, dict[int, float]] = {a: {}, b: {}}
    for r in results:
        if r.method in hv:
            hv[r.method][r.seed] = r.hv_share
    seeds = sorted(set(hv[a]) & set(hv[b]))
    if not seeds:
        return None
    d = np.array([hv[a][s] - hv[b][s] for s in seeds])
    return {"mean": float(d.mean()), "sd": float(d.std(ddof=1)) if len(d) > 1 else math.nan,
            "wins": int(np.sum(d > 0)), "n": len(d)}


def print_paired(results: Sequence[StudyResult]) -> None:
    cells = []
    for a, b in PAIRS:
        p = paired(results, a, b)
        if p is not None:
            cells.append(f"{a} - {b}: {p['mean']:+.3f} ± {p['sd']:.3f} ({p['wins']}/{p['n']})")
    if cells:
        print("   paired HV share difference, mean ± sd (seeds ahead / seeds):\n   " + "\n   ".join(cells))


def write_and_print(report: dict[str, Any], out: Path | None) -> None:
    for dev, d in report["devices"].items():
        results = [StudyResult(**r) for r in d["studies"]]
        for v in d["variants"].values():
            print_table(f"{dev} ({len(v['seeds'])} seeds)", v["summary"], v["budget_ms"])
            print_paired([r for r in results if r.budget_ms == v["budget_ms"]])
    if out is not None:
        _write(out, json.dumps(report, indent=1) + "\n", "--out")
        print(f"wrote {out}")


def _write(path: Path, text: str, flag: str) -> None:
    """Write a report file through :func:`dippm_nas.files.write_output` (never a FIFO, a directory or a
    half-written file)."""
    from dippm_nas.errors import InvalidValueError
    from dippm_nas.files import write_output

    write_output(path, text, flag, error=InvalidValueError)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help=f"directory holding {CSV_NAME}")
    ap.add_argument("--graphs", type=Path, help="scripts/build_accel_graphs.py's JSONL")
    ap.add_argument("--checkpoint", type=Path, help="a checkpoint that never saw the space's rows")
    ap.add_argument("--devices", default="a100,rtx-3090", help=f"comma-separated, of {list(DEVICES)}")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=10, help="how many seeds (default 10)")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0): a run in chunks")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--every", type=int, default=20, help="trials between validation rounds (default 20)")
    ap.add_argument("--validate-max", type=int, default=10, help="most rows validated per round (default 10)")
    ap.add_argument("--validate-uncertain", type=int, default=5,
                    help="with a budget, of a round's --validate-max rows, up to this many go to candidates whose "
                         "feasibility is uncertain (the check rejects them, the budget lies within the margin's "
                         "band around the mean; dippm_nas.validation.uncertain_order), the front the rest; a share "
                         "one kind cannot fill goes to the other (default 5; 0: the front only)")
    ap.add_argument("--budget-quantile", type=float, default=0.5,
                    help="the latency budget: this quantile of the table's measured latencies (default 0.5)")
    ap.add_argument("--k-sigma", type=float, default=1.0,
                    help="σ added to a predicted latency before it is compared with the budget (default 1.0; "
                         "unused with --confidence)")
    ap.add_argument("--confidence", type=float, default=None,
                    help="check the budget as Budgets(latency_ms=..., confidence=C) does: the network's predictions "
                         "bounded by the checkpoint's conformal calibration (<checkpoint>.conformal.json, needed), "
                         "the prior's by the Gaussian quantile (it has none); default: --k-sigma")
    ap.add_argument("--variants", default="free,budget", help="free (no budget), budget, or both")
    ap.add_argument("--seed-dir", type=Path, default=None,
                    help="write each (device, seed)'s studies to DIR/<device>_seed<N>.json as it completes")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="merge per-seed files (or directories of them) into one report; with --out, save it")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--from-report", type=Path, default=None, help="print the tables of a saved --out report")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.from_report is not None:
        return from_report(args.from_report)
    if args.merge is not None:
        write_and_print(merge_records(read_records(args.merge)), args.out)
        return 0
    if args.data is None or args.graphs is None or args.checkpoint is None:
        ap.error("--data, --graphs and --checkpoint are needed (or --merge / --from-report)")
    if not 0 <= args.validate_uncertain <= args.validate_max:
        ap.error(f"--validate-uncertain must lie in [0, --validate-max = {args.validate_max}], got "
                 f"{args.validate_uncertain}")
    if args.seeds < 1 or args.first_seed < 0:
        ap.error(f"--seeds must be >= 1 and --first-seed >= 0, got {args.seeds} and {args.first_seed}")
    methods = [m.strip() for m in args.methods.split(",")]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"--methods: {bad} are none of {list(METHODS)}")
    if not (math.isfinite(args.k_sigma) and args.k_sigma >= 0):
        ap.error(f"--k-sigma must be a finite number >= 0, got {args.k_sigma}")
    if args.confidence is not None and not 0 < args.confidence < 1:
        ap.error(f"--confidence must be a probability strictly between 0 and 1 (e.g. 0.9), got {args.confidence}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    conformal = None
    args.conformal = None
    if args.confidence is not None:
        from dippm_nas.conformal import conformal_path

        conformal = load_conformal(args.checkpoint)
        args.conformal = str(conformal_path(args.checkpoint))
    by_csv = load_graphs(args.graphs)
    runs = [prepare_device(args, dev, by_csv, methods, conformal) for dev in args.devices.split(",")]
    write_and_print(merge_records(run_seeds(args, runs)), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
