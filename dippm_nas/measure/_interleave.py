"""CPU latency of many models timed in interleaved rounds, so that a slow spell of the machine is shared.

On a small shared VM the time of one model measured in one contiguous block depends on what the machine
was doing during that second or two: a neighbour's burst, another process on the sibling core. Measured
that way, two passes over the same 3,300 models on the AMD EPYC development VM agreed only to a MAPE of
14-18 %. Timing every model of a group in ``rounds`` rounds instead (round *r* gives each model one
untimed forward, to bring its weights back into the caches, then ``per_round`` timed forwards) spreads
each model's samples over the whole run. On an AMD EPYC VM, three fresh processes timing the same 128
models (``python benchmarks/measurement/cpu_interleaved.py --per-family 16 --processes 3``, 2026-11-24) agreed to
6.1-8.1 % MAPE on the mean of the samples in rounds against 10.3-13.0 % in one block per model; on the
median 4.0-5.5 % against 10.7-13.2 %, on the minimum 2.3-2.9 % against 6.5-8.6 % (one run; the VM's noise
changes from day to day). Two whole passes of ``dippm-nas dataset build --rounds 5`` over the 3,300 models
agreed to 6.4 % on the rounds' mean and to 15.8 % on each model's own one-by-one block of the same runs
(``scripts/compare_passes.py``; data/host_cpu/README.md).

:func:`time_interleaved` only times; memory and energy stay with :class:`~dippm_nas.measure.CpuMeasurer`
(one model at a time), which is how :func:`dippm_nas.dataset.build_dataset` uses the two together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dippm_nas._numbers import as_int
from dippm_nas._platform import fixed_threads
from dippm_nas.errors import MeasurementError
from dippm_nas.measure._common import (
    ModelFault,
    check_call,
    classify_fault,
    latency_fields,
    forward_context,
    guarded,
    prepare_inputs,
    prepare_model,
)
from dippm_nas.measure._measurement import MeasureSettings
from dippm_nas.measure._stopping import Clock
from dippm_nas.spec import InputSpec
from dippm_nas.units import MS_PER_S

__all__ = ["RoundTiming", "time_interleaved"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundTiming:
    """One model's timed forwards from :func:`time_interleaved`.

    Attributes:
        samples_ms: every timed forward in the order taken (``rounds * per_round`` of them when ``ok``;
            those taken before a fault otherwise).
        status: ``"ok"``, or ``"oom"`` / ``"error"`` when the model failed (it then leaves the rounds).
        reason: the fault, ``None`` when ``ok``.
        rounds: rounds this model completed.
    """

    samples_ms: tuple[float, ...]
    status: str = "ok"
    reason: str | None = None
    rounds: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def latency_fields(self) -> dict[str, Any]:
        """``latency_ms`` (mean), ``latency_ms_std``, ``latency_ms_median``, ``latency_ms_ci95``, ``n_repeats``
        of the samples, as a :class:`~dippm_nas.measure.Measurement` has them (``None`` unless ``ok``)."""
        return latency_fields(self.samples_ms if self.ok else ())


def time_interleaved(
    items: Sequence[tuple[Any, InputSpec]],
    settings: MeasureSettings,
    *,
    rounds: int,
    per_round: int,
    clock: Clock = time.perf_counter,
) -> list[RoundTiming]:
    """Time each ``(model, spec)`` of ``items`` on the CPU in ``rounds`` interleaved rounds.

    Models are prepared as :func:`dippm_nas.measure.measure` prepares them (a copy in eval mode, the spec's
    dtype, ``settings.channels_last`` / ``autocast``) and run on ``settings.threads`` threads under
    ``torch.inference_mode``. No warm-up besides the one untimed forward per round: call this on models
    that were just measured (and so warmed) one by one.

    Returns:
        One :class:`RoundTiming` per item, in order. A model that raises (while being prepared or in a
        forward) gets its fault as the status and takes no further part; the others go on.

    Raises:
        MeasurementError: ``rounds`` or ``per_round`` below 1, or a usage error of an item (not an
            ``nn.Module``, an autocast/dtype conflict).
    """
    import torch

    rounds = as_int(rounds, "rounds", low=1, error=MeasurementError)
    per_round = as_int(per_round, "per_round", low=1, error=MeasurementError)
    for model, spec in items:
        check_call(model, spec, settings)
    cpu = torch.device("cpu")
    samples: list[list[float]] = [[] for _ in items]
    faults: list[tuple[str, str] | None] = [None] * len(items)
    done = [0] * len(items)
    with fixed_threads(settings.threads):
        calls: list[Any] = []
        for i, (model, spec) in enumerate(items):
            try:
                m = guarded("model preparation", prepare_model, model, spec, cpu, settings)
                args, kwargs = guarded("input creation", prepare_inputs, spec, cpu, settings)
                calls.append((m, args, kwargs))
            except ModelFault as fault:
                faults[i] = classify_fault(fault)
                calls.append(None)
        with forward_context("cpu", settings):
            for _ in range(rounds):
                for i, call in enumerate(calls):
                    if call is None or faults[i] is not None:
                        continue
                    m, args, kwargs = call
                    try:
                        guarded("forward", m, *args, **kwargs)  # back into the caches after the others
                        for _ in range(per_round):
                            t0 = clock()
                            guarded("forward", m, *args, **kwargs)
                            samples[i].append((clock() - t0) * MS_PER_S)
                        done[i] += 1
                    except ModelFault as fault:
                        faults[i] = classify_fault(fault)
                        logger.debug("interleaved timing fault: %s", faults[i][1], exc_info=fault.original)
    return [
        RoundTiming(samples_ms=tuple(s), rounds=d) if f is None
        else RoundTiming(samples_ms=tuple(s), status=f[0], reason=f[1], rounds=d)
        for s, f, d in zip(samples, faults, done)
    ]
