"""Training examples and splits from the dataset format (:func:`dippm_nas.dataset.load_measurements`).

Data: every ``ok`` measurement row with a graph becomes an :class:`Example` (graph, catalogue device,
labels, family). Rows of several devices train one model (device features tell them apart); the
checkpoint answers for one target device and its held-out metrics are computed on that device's rows.

Splits are decided per *architecture* (graph structure), never per row, so one network measured on
two GPUs is never in train and test at once:

- ``"random"``: a hash of the structure and the seed puts it in train/val/test (70/15/15 by default),
  independent of row order (DIPPM's protocol);
- ``"family"``: whole families (``space``) are held out as the test set; the validation set is a random
  15% of the remaining architectures;
- ``"timm-family"``: timm rows are split by model *family* (:func:`timm_family` of the model name, e.g.
  ``resnet``, ``vit``, ``convnext``): a hash of the family and the seed holds out ``holdout_frac`` of the
  families (default 25%) as test, the other families' architectures go to train/val (85/15); every other
  row is split as in ``"random"`` (so Accel-NASBench keeps exactly its random split). An architecture
  shared by a held-out and a training family (e.g. ``deit_*`` and ``vit_*`` with equal graphs) is test.

The validation split selects the epoch of each member and fits the std floor; the test split is only
ever used to report.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from dippm_nas.dataset import load_measurements
from dippm_nas.devices import get_device, list_devices
from dippm_nas.errors import DatasetError, InvalidValueError
from dippm_nas.features import GraphFeatures, featurize
from dippm_nas.graph import OperatorGraph
from dippm_nas.predictor import HOST_DEVICE, TARGETS
from dippm_nas.prior import DeploymentSettings, execution_settings, row_settings

__all__ = ["Example", "DEVICE_ALIASES", "SPLIT_MODES", "load_examples", "split_fraction", "timm_family", "is_timm",
           "heldout_timm_families", "split_examples", "featurize_examples", "labels_log"]


logger = logging.getLogger(__name__)

#: Device names used by the dataset rows -> catalogue ids. Accel-NASBench says "A100 40GB" without the
#: form factor; both 40 GB forms have the same SMs, clocks and bandwidth, so rows go to the SXM4 entry.
DEVICE_ALIASES: dict[str, str] = {"a100-40gb": "a100-sxm4-40gb", "cpu": "host-cpu", "rtx-3090": "rtx-3090",
                                  "rtx-4090": "rtx-4090", "rtx-5090": "rtx-5090"}

#: Split modes of :func:`split_examples`.
SPLIT_MODES = ("random", "family", "timm-family")
#: Name prefixes that say where timm ported the weights from, not which architecture it is.
_TIMM_WEIGHT_PREFIXES = re.compile(r"^(?:tf|gluon|legacy)_")


@dataclass
class Example:
    """One training example.

    Attributes:
        graph: the captured graph.
        device: catalogue id of the device measured.
        y: labels, ``{target: value}`` in the targets' units (only the measured ones).
        family: model family (search space name).
        key: the architecture key splits are decided on (structural hash).
        source: dataset source of the row.
        name: the row's model name where the source names one (timm: ``config["model"]``), else ``""``.
        cpu_model: the CPU model of the row's environment (``environment.cpu_model``), ``""`` when the row
            does not record one.
        threads: the torch thread count of the row's environment (``environment.threads``), ``None`` when
            the row does not record one.
        cpu_signature: the processor of the row's environment (``environment.cpu_signature``: vendor,
            family, model, stepping, ...; :func:`dippm_nas._platform.cpu_signature`), ``None`` when the row
            does not record one (rows measured before it was recorded).
        execution: how the row's pass was executed and timed (runtime, host, input copy), from its
            conditions (:func:`dippm_nas.prior.row_settings`); the prior features use it.
    """

    graph: OperatorGraph
    device: str
    y: dict[str, float]
    family: str
    key: str
    source: str = ""
    name: str = ""
    cpu_model: str = ""
    threads: int | None = None
    cpu_signature: dict[str, str] | None = None
    execution: DeploymentSettings = field(default_factory=lambda: DeploymentSettings(input_copy="none"))

    def __post_init__(self) -> None:
        if not isinstance(self.execution, DeploymentSettings):  # a deprecated prior.Execution
            self.execution = execution_settings(self.execution)  # type: ignore[assignment]


def load_examples(paths: Sequence[str | Path], *, devices: Sequence[str] | None = None,
                  source: str | None = None, dtypes: Sequence[str] | None = None) -> list[Example]:
    """Examples from one or more dataset files (SQLite or JSONL export).

    Args:
        paths: dataset files.
        devices: keep only rows of these catalogue ids (``None``: all).
        source: keep only rows of this source.
        dtypes: keep only graphs of these compute dtypes (``None``: all).

    Raises:
        DippmNasError: a row's device is neither a catalogue id nor a known alias.
    """
    catalogue = {d if isinstance(d, str) else d.id for d in list_devices()}
    out: list[Example] = []
    for p in paths:
        for mg in load_measurements(p, source=source):
            m = mg.measurement
            dev = DEVICE_ALIASES.get(m.get("device"), m.get("device"))
            if dev not in catalogue:
                raise DatasetError(f"dataset {p}: device {m.get('device')!r} is neither a catalogue id "
                                   f"({sorted(catalogue)}) nor an alias ({sorted(DEVICE_ALIASES)})")
            if devices is not None and dev not in devices:
                continue
            if dtypes is not None and mg.spec.dtype not in dtypes:
                continue
            y = {}
            for t in TARGETS:
                v = m.get(t)
                if v is not None and math.isfinite(float(v)) and float(v) > 0:
                    y[t] = float(v)
            if not y:
                continue
            cfg = m.get("config")
            name = str(cfg.get("model") or "") if isinstance(cfg, dict) else ""
            env = m.get("environment")
            cpu = str(env.get("cpu_model") or "") if isinstance(env, dict) else ""
            thr = env.get("threads") if isinstance(env, dict) else None
            sig = env.get("cpu_signature") if isinstance(env, dict) else None
            out.append(Example(mg.graph, dev, y, str(m.get("space") or "unknown"), mg.graph.structural_hash(),
                               str(m.get("source") or ""), name, cpu,
                               thr if isinstance(thr, int) and not isinstance(thr, bool) else None,
                               {str(k): str(v) for k, v in sig.items()} if isinstance(sig, dict) and sig else None,
                               row_settings(m.get("conditions"), env if isinstance(env, dict) else None)))
    logger.info("loaded %d examples from %s", len(out), [str(p) for p in paths])
    return out


def split_fraction(key: str, seed: int) -> float:
    """A number in [0, 1) from a hash of ``seed`` and ``key``: where a split puts an architecture or family."""
    h = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def timm_family(model: str) -> str:
    """The family of a timm model name: the name without a weight-origin prefix (``tf_``, ``gluon_``,
    ``legacy_``), up to its first ``_`` or digit (``resnet50d`` -> ``resnet``, ``vit_base_patch16_224`` ->
    ``vit``, ``tf_efficientnet_b0`` -> ``efficientnet``, ``convnextv2_tiny`` -> ``convnextv``)."""
    name = _TIMM_WEIGHT_PREFIXES.sub("", model.strip().lower())
    m = re.match(r"[a-z]+", name)
    return m.group(0) if m else name


def is_timm(e: Example) -> bool:
    """Whether ``e`` is a timm row with a model name (the rows ``"timm-family"`` splits by family)."""
    return e.source == "timm" and bool(e.name)


def heldout_timm_families(examples: Sequence[Example], *, holdout_frac: float = 0.25, seed: int = 0) -> list[str]:
    """The timm families ``"timm-family"`` holds out (sorted)."""
    fams = {timm_family(e.name) for e in examples if is_timm(e)}
    return sorted(f for f in fams if split_fraction(f"timm-family:{f}", seed) < holdout_frac)


def split_examples(examples: Sequence[Example], *, mode: str = "random", fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
                   heldout_families: Sequence[str] = (), seed: int = 0,
                   holdout_frac: float = 0.25) -> tuple[list[Example], list[Example], list[Example]]:
    """``(train, val, test)`` by architecture (see the module docstring).

    Args:
        holdout_frac: ``"timm-family"`` only: the share of timm families held out (by a hash of the name).

    Raises:
        DippmNasError: unknown mode, bad fractions, held-out families absent from the data, or a
            ``"timm-family"`` split without timm rows or with ``holdout_frac`` outside (0, 1).
    """
    if mode not in SPLIT_MODES:
        raise InvalidValueError(f"split mode must be one of {list(SPLIT_MODES)}, got {mode!r}")
    if abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0:
        raise InvalidValueError(f"split fractions must be >= 0 and sum to 1, got {fractions}")
    tr, va, te = [], [], []
    if mode == "timm-family":
        if not 0.0 < holdout_frac < 1.0:
            raise InvalidValueError(f"holdout_frac must lie in (0, 1), got {holdout_frac!r}")
        if not any(is_timm(e) for e in examples):
            raise InvalidValueError("the timm-family split needs timm rows (source 'timm' with a model name) in the data")
        held = set(heldout_timm_families(examples, holdout_frac=holdout_frac, seed=seed))
        test_keys = {e.key for e in examples if is_timm(e) and timm_family(e.name) in held}
        val_share = fractions[1] / (fractions[0] + fractions[1])
        for e in examples:
            if not is_timm(e):
                u = split_fraction(e.key, seed)
                (tr if u < fractions[0] else va if u < fractions[0] + fractions[1] else te).append(e)
            elif e.key in test_keys:
                te.append(e)
            elif split_fraction(e.key, seed) < val_share:
                va.append(e)
            else:
                tr.append(e)
        return tr, va, te
    if mode == "family":
        fams = {e.family for e in examples}
        missing = [f for f in heldout_families if f not in fams]
        if not heldout_families or missing:
            raise InvalidValueError(f"family split needs held-out families present in the data ({sorted(fams)}), "
                                    f"got {list(heldout_families)}")
        for e in examples:
            if e.family in heldout_families:
                te.append(e)
            elif split_fraction(e.key, seed) < fractions[1] / (fractions[0] + fractions[1]):
                va.append(e)
            else:
                tr.append(e)
        return tr, va, te
    for e in examples:
        u = split_fraction(e.key, seed)
        (tr if u < fractions[0] else va if u < fractions[0] + fractions[1] else te).append(e)
    return tr, va, te


def featurize_examples(examples: Sequence[Example], *, style: str = "ours", fuse: bool = True,
                       prior_params: Any = None, host_threads: int | None = None,
                       progress: bool = True) -> list[GraphFeatures]:
    """Feature tensors of every example on its own device (cached per structure and device).

    ``host_threads``: the torch thread count host-cpu features are measured at (a checkpoint's
    ``GnnPredictor.host_threads``); default: this process's.
    """
    cache: dict[tuple[str, str, DeploymentSettings], GraphFeatures] = {}
    out = []
    for e in tqdm(examples, desc="features", unit="graph", disable=not progress, leave=False):
        k = (e.key, e.device, e.execution)
        if k not in cache:
            dev = get_device(e.device, threads=host_threads) if host_threads and e.device == HOST_DEVICE else e.device
            cache[k] = featurize(e.graph, dev, style=style, fuse=fuse, prior_params=prior_params,
                                 execution=e.execution)
        out.append(cache[k])
    return out


def labels_log(examples: Sequence[Example]) -> torch.Tensor:
    """``[N, 3]`` log labels in :data:`~dippm_nas.predictor.TARGETS` order, ``nan`` where a row has none."""
    y = torch.full((len(examples), len(TARGETS)), float("nan"))
    for i, e in enumerate(examples):
        for j, t in enumerate(TARGETS):
            if t in e.y:
                y[i, j] = math.log(e.y[t])
    return y

