"""The stopping rule of the timed loop, independent of what is timed and of the clock.

The loop runs ``warmup`` untimed forwards, then timed forwards until one of:

1. ``converged``: at least ``min_repeats`` samples and the half-width of the 95% Student-t confidence
   interval of the mean, ``t(0.975, n-1) * s / sqrt(n)``, is at most ``rel_ci_target`` times the mean;
2. ``max_repeats`` samples;
3. ``time_cap``: the clock says ``time_cap_s`` have passed since the loop started (warm-up included).

The clock is a zero-argument callable returning seconds (``time.perf_counter`` by default) so tests
drive the rule with a fake clock. Samples are whatever the caller times (CUDA events on a GPU,
``perf_counter`` differences on the CPU), in milliseconds.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dippm_nas._numbers import as_int, as_real, as_reals
from dippm_nas.errors import MeasurementError

__all__ = [
    "Clock",
    "t_quantile_975",
    "LatencyStats",
    "summarize",
    "StoppingRule",
    "LoopResult",
    "run_until_stopped",
]

Clock = Callable[[], float]

# Two-sided 95% critical values t(0.975, df) of Student's t for df = 1..30 (standard tables).
_T975: tuple[float, ...] = (
    12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836,
    2.446911851, 2.364624252, 2.306004135, 2.262157163, 2.228138852,
    2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546,
    2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447,
    2.079613845, 2.073873068, 2.068657610, 2.063898562, 2.059538553,
    2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456,
)
_Z975 = 1.959963984540054  # standard-normal quantile at 0.975


def t_quantile_975(df: int) -> float:
    """Student-t quantile at 0.975 (the two-sided 95% critical value) for ``df`` degrees of freedom.

    Exact table values for ``df <= 30``; above, the Cornish-Fisher expansion in ``1/df``
    (Abramowitz & Stegun 26.7.5, four terms), within 1e-7 of the exact value for ``df > 30``.

    Raises:
        MeasurementError: for ``df < 1``.
    """
    df = as_int(df, "degrees of freedom", low=1, error=MeasurementError)
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True)
class LatencyStats:
    """Summary of timed samples, milliseconds.

    Attributes:
        n: number of samples.
        mean_ms, median_ms: mean and median.
        std_ms: sample standard deviation (ddof=1); ``None`` for ``n < 2``.
        ci95_ms: half-width of the 95% Student-t CI of the mean; ``None`` for ``n < 2``.
        rel_ci95: ``ci95_ms / mean_ms`` (``inf`` for a zero mean with spread); ``None`` for ``n < 2``.
    """

    n: int
    mean_ms: float
    median_ms: float
    std_ms: float | None
    ci95_ms: float | None
    rel_ci95: float | None


def summarize(samples_ms: Sequence[float]) -> LatencyStats:
    """Mean, median, standard deviation and 95% CI of ``samples_ms``.

    Raises:
        MeasurementError: an empty sequence, or one that is not a sequence of finite numbers.
    """
    samples_ms = as_reals(samples_ms, "latency samples (ms)", error=MeasurementError)
    n = len(samples_ms)
    if n == 0:
        raise MeasurementError("cannot summarise zero latency samples")
    mean = statistics.fmean(samples_ms)
    median = statistics.median(samples_ms)
    if n < 2:
        return LatencyStats(n, mean, median, None, None, None)
    std = statistics.stdev(samples_ms)
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    if mean > 0:
        rel = half / mean
    else:
        rel = 0.0 if half == 0 else math.inf
    return LatencyStats(n, mean, median, std, half, rel)


class StoppingRule:
    """Decides when the timed loop ends (see the module docstring).

    Args:
        rel_ci_target: target ``ci95 / mean``; 0.02 is "within 2%".
        min_repeats: samples needed before convergence or a normal time-cap stop (>= 2).
        max_repeats: samples at most.
        time_cap_s: budget from :meth:`start`, seconds.
        clock: zero-argument callable returning seconds.

    Use: :meth:`start`, then per sample :meth:`add` and :meth:`should_stop`; after a stop
    :attr:`stop_reason` is one of ``"converged" | "max_repeats" | "time_cap"``.
    """

    def __init__(
        self,
        *,
        rel_ci_target: float = 0.02,
        min_repeats: int = 10,
        max_repeats: int = 1000,
        time_cap_s: float = 30.0,
        clock: Clock = time.perf_counter,
    ) -> None:
        rel_ci_target = as_real(rel_ci_target, "rel_ci_target", low=0, low_inclusive=False, error=MeasurementError)
        min_repeats = as_int(min_repeats, "min_repeats", low=2, error=MeasurementError)
        max_repeats = as_int(max_repeats, "max_repeats", low=1, error=MeasurementError)
        if max_repeats < min_repeats:
            raise MeasurementError(f"max_repeats must be an int >= min_repeats ({min_repeats}), got {max_repeats!r}")
        self.rel_ci_target = rel_ci_target
        self.min_repeats = min_repeats
        self.max_repeats = max_repeats
        self.time_cap_s = as_real(time_cap_s, "time_cap_s", low=0, low_inclusive=False, error=MeasurementError)
        self._clock = clock
        self._t0: float | None = None
        self._samples: list[float] = []
        self.stop_reason: str | None = None

    @classmethod
    def from_settings(cls, settings: "object", clock: Clock = time.perf_counter) -> "StoppingRule":
        """Build from a :class:`~dippm_nas.measure.MeasureSettings`."""
        return cls(
            rel_ci_target=settings.rel_ci_target,  # type: ignore[attr-defined]
            min_repeats=settings.min_repeats,  # type: ignore[attr-defined]
            max_repeats=settings.max_repeats,  # type: ignore[attr-defined]
            time_cap_s=settings.time_cap_s,  # type: ignore[attr-defined]
            clock=clock,
        )

    def start(self) -> None:
        """Start the time budget and forget earlier samples."""
        self._t0 = self._clock()
        self._samples = []
        self.stop_reason = None

    @property
    def samples(self) -> tuple[float, ...]:
        """The samples added since :meth:`start`, ms."""
        return tuple(self._samples)

    @property
    def n(self) -> int:
        return len(self._samples)

    def elapsed_s(self) -> float:
        """Seconds since :meth:`start`."""
        if self._t0 is None:
            raise MeasurementError("StoppingRule.start() must be called before elapsed_s()")
        return self._clock() - self._t0

    def time_exceeded(self) -> bool:
        """True once the time cap has passed."""
        return self.elapsed_s() >= self.time_cap_s

    def add(self, sample_ms: float) -> None:
        """Record one timed forward, ms (finite, >= 0)."""
        if self._t0 is None:
            raise MeasurementError("StoppingRule.start() must be called before add()")
        sample_ms = as_real(sample_ms, "a latency sample", low=0, error=MeasurementError,
                            rule="a latency sample must be a finite number >= 0 ms")
        self._samples.append(float(sample_ms))

    def converged(self) -> bool:
        """True when there are ``min_repeats`` samples and ``ci95 / mean <= rel_ci_target``."""
        if self.n < self.min_repeats:
            return False
        rel = summarize(self._samples).rel_ci95
        return rel is not None and rel <= self.rel_ci_target

    def should_stop(self) -> bool:
        """Whether to stop now; sets :attr:`stop_reason` when it returns True."""
        if self.converged():
            self.stop_reason = "converged"
        elif self.n >= self.max_repeats:
            self.stop_reason = "max_repeats"
        elif self.time_exceeded():
            self.stop_reason = "time_cap"
        else:
            return False
        return True

    @property
    def enough(self) -> bool:
        """True when at least ``min_repeats`` samples were collected."""
        return self.n >= self.min_repeats


@dataclass(frozen=True)
class LoopResult:
    """What :func:`run_until_stopped` collected.

    Attributes:
        samples_ms: the timed forwards, ms.
        stop_reason: ``"converged" | "max_repeats" | "time_cap"``.
        warmup_done: warm-up forwards completed.
        complete: True when ``min_repeats`` samples were collected (else the run timed out).
        elapsed_s: seconds from the start of warm-up to the stop, by the rule's clock.
    """

    samples_ms: tuple[float, ...]
    stop_reason: str
    warmup_done: int
    complete: bool
    elapsed_s: float


def run_until_stopped(step_ms: Callable[[], float], rule: StoppingRule, warmup: int) -> LoopResult:
    """Run ``warmup`` untimed steps, then timed steps until ``rule`` says stop.

    The time cap covers the warm-up: if it passes during warm-up the loop ends with no samples.

    Args:
        step_ms: runs one forward and returns its time in ms (warm-up results are discarded).
        rule: the stopping rule; it is (re)started here.
        warmup: number of untimed steps.
    """
    rule.start()
    done = 0
    for _ in range(warmup):
        step_ms()
        done += 1
        if rule.time_exceeded():
            return LoopResult((), "time_cap", done, False, rule.elapsed_s())
    while True:
        rule.add(step_ms())
        if rule.should_stop():
            break
    assert rule.stop_reason is not None
    return LoopResult(rule.samples, rule.stop_reason, done, rule.enough, rule.elapsed_s())
