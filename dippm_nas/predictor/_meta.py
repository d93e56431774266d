"""Checkpoint metadata: what a checkpoint is, its targets and units, and the checks made on load.

Checkpoint: a ``.pt`` file holding ``{"meta": JSON text, "state": {name: tensor}}`` read with
``torch.load(weights_only=True)`` (no pickle), plus a human-readable ``.json`` sidecar with the
same metadata. The metadata (:class:`CheckpointMeta`) is checked on load: a different feature schema
or feature widths raise :class:`~dippm_nas.errors.CheckpointError`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from dippm_nas._json import loads_json
from dippm_nas._schema import from_file_data
from dippm_nas.errors import CheckpointError, DippmNasError
from dippm_nas.features import FEATURE_SCHEMA_VERSION, device_dim, node_dim, static_dim
from dippm_nas.predictor._novelty import NoveltyFloor
from dippm_nas.prior import PriorParams
from dippm_nas.spec import COMPUTE_DTYPES

__all__ = ["TARGETS", "TARGET_UNITS", "CHECKPOINT_FORMAT", "CheckpointMeta"]

#: The three targets, in output order.
TARGETS: tuple[str, ...] = ("latency_ms", "energy_j", "memory_mib")
#: Units of the targets.
TARGET_UNITS: dict[str, str] = {"latency_ms": "ms", "energy_j": "J", "memory_mib": "MiB"}
#: Version of the checkpoint layout.
CHECKPOINT_FORMAT = 1


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint is, where it came from and how good it was on held-out data.

    Attributes:
        device: catalogue id the checkpoint answers for.
        targets: ``{target: unit}`` of the targets trained on real labels; other targets come from the
            analytic prior (source ``"analytic"``).
        feature_schema_version: :data:`~dippm_nas.features.FEATURE_SCHEMA_VERSION` at training.
        feature_style: ``"ours"`` or ``"dippm"``.
        data_sources: the datasets (with conditions) the labels came from.
        heldout_metrics: ``{split: {target: {metric: value}}}`` on test data never used for selection.
        date: ISO date of training.
        trained_on: device ids whose measurements were in the training set.
        hidden: hidden width; ``layers``: SAGE blocks; ``members``: ensemble size.
        residual_on_prior: outputs are log-corrections of the prior's figures.
        std_floor_log: per-target floor of the log-space standard deviation (validation fit).
        prior_params: the analytic prior's constants the features were computed with (pinned).
        node_dim, static_dim, device_dim: feature widths (checked against this code on load).
        command: the command that trained it.
        format: :data:`CHECKPOINT_FORMAT`.
        notes: free text.
        novelty: the novel-graph std floor (:class:`~dippm_nas.predictor._novelty.NoveltyFloor` as a dict:
            ``d0``, ``floor_log``, ``calibrated_on`` and optionally ``shrink``, the per-target width of
            the correction shrink of novel graphs, ``validated_max`` and ``graded_floor_log``, the σ floor
            as a function of novelty), or ``None``; its reference set is stored beside the
            weights (``novelty_ref``).
        host: for a ``host-cpu`` checkpoint, the machine its labels were measured on: ``{"cpu_model": the
            CPU model string of the rows' environment, "threads": the torch thread count of the labels and
            of the device features (the predictor measures the host at this count, so its answer does not
            depend on the caller's thread setting; when absent, the caller's count),
            "features_from": the host microbenchmark the device features were computed with,
            "features_processor" / "label_processors": the processor of the machine that computed them and
            those the rows record (family, model, ...; see ``_train._host_of``; optional)}``; ``None`` for other
            devices and for checkpoints whose metadata records no host. A host-cpu checkpoint
            answers on another CPU model only flagged (``details["other_host"] = 1``, see
            :mod:`dippm_nas.predictor._checkpoint`).
        prior_only_dtypes: compute dtypes the checkpoint answers with its pinned prior, the network's correction
            withheld (source ``"analytic"``, ``details["prior_only_dtype"] = 1``): their prior constants were
            pinned after training (``scripts/fit/pin_prior_keys.py``), so a correction learnt against the constants
            the checkpoint trained with does not apply. Empty for a checkpoint whose pinned constants are the ones it trained with.
    """

    device: str
    targets: dict[str, str]
    feature_schema_version: int
    feature_style: str
    data_sources: list[str]
    heldout_metrics: dict[str, Any]
    date: str
    trained_on: list[str]
    hidden: int
    layers: int
    members: int
    residual_on_prior: bool
    std_floor_log: dict[str, float]
    prior_params: dict[str, Any] | None
    node_dim: int
    static_dim: int
    device_dim: int
    command: str = ""
    format: int = CHECKPOINT_FORMAT
    notes: str = ""
    novelty: dict[str, Any] | None = None
    host: dict[str, Any] | None = None
    prior_only_dtypes: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, *, origin: str = "checkpoint metadata",
                  trusted: bool = False) -> "CheckpointMeta":
        """The metadata in ``text`` (JSON, read as :func:`~dippm_nas._json.loads_json` does: nested at most
        :data:`~dippm_nas._json.MAX_JSON_DEPTH` levels).

        Args:
            text: the JSON text (``.pt`` ``"meta"``, the derived weights, or the ``.json`` sidecar).
            origin: names the checkpoint in errors.
            trusted: the metadata of a checkpoint shipped with dippm-nas (its tests check each against the
                schema): built by the dataclass alone. Otherwise every field is checked against the
                dataclass's (:mod:`dippm_nas._schema`), the pinned ``prior_params`` as a calibration file.

        Raises:
            CheckpointError: not JSON (or nested too deep), or fields of the wrong type, unknown or missing
                (the field path, the value and the expected type named).
        """
        d = loads_json(text, origin, CheckpointError)
        if trusted:
            return cls(**d)
        meta = from_file_data(cls, d, origin, CheckpointError)
        if meta.prior_params is not None:
            try:
                PriorParams.from_dict(meta.prior_params, origin=f"{origin}: prior_params")
            except DippmNasError as e:
                raise CheckpointError(str(e)) from e
        return meta

    def check(self) -> None:
        """Raise :class:`CheckpointError` when this code cannot read the checkpoint's features."""
        if self.format != CHECKPOINT_FORMAT:
            raise CheckpointError(f"checkpoint format must be {CHECKPOINT_FORMAT}, got {self.format}")
        if self.feature_schema_version != FEATURE_SCHEMA_VERSION:
            raise CheckpointError(
                f"checkpoint feature_schema_version is {self.feature_schema_version}, this dippm-nas computes "
                f"version {FEATURE_SCHEMA_VERSION}: retrain it (dippm-nas train) or install the matching version"
            )
        want = (node_dim(self.feature_style), static_dim(self.feature_style), device_dim())
        got = (self.node_dim, self.static_dim, self.device_dim)
        if want != got:
            raise CheckpointError(f"checkpoint feature widths (node, static, device) are {got}, this code gives {want}")
        bad = [t for t in self.targets if t not in TARGETS]
        if bad:
            raise CheckpointError(f"checkpoint targets {bad} unknown; valid: {list(TARGETS)}")
        if self.novelty is not None:
            try:
                nf = NoveltyFloor.from_dict(self.novelty)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise CheckpointError(f"checkpoint novelty must hold d0, floor_log and calibrated_on, got "
                                      f"{self.novelty!r} ({type(e).__name__}: {e})") from e
            bad = [t for t in (*nf.floor_log, *nf.shrink, *nf.graded_floor_log) if t not in self.targets]
            if bad or not math.isfinite(nf.d0) or (nf.shrink and nf.d0 <= 0.0):
                raise CheckpointError(f"checkpoint novelty floors and shrinks must be for trained targets "
                                      f"{list(self.targets)} with a finite d0 (> 0 with a shrink); got floors for "
                                      f"{list(nf.floor_log)}, shrinks for {list(nf.shrink)}, d0 {nf.d0}")
        bad = [d for d in self.prior_only_dtypes if d not in COMPUTE_DTYPES]
        if not isinstance(self.prior_only_dtypes, list) or bad:
            raise CheckpointError(f"checkpoint prior_only_dtypes must be a list of {list(COMPUTE_DTYPES)}, got "
                                  f"{self.prior_only_dtypes!r}")
        if self.host is not None and not (isinstance(self.host, dict) and isinstance(self.host.get("cpu_model"), str)
                                          and self.host["cpu_model"]):
            raise CheckpointError(f"checkpoint host must be a dict with a non-empty 'cpu_model' string, "
                                  f"got {self.host!r}")
        if self.host is not None and "threads" in self.host:
            n = self.host["threads"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise CheckpointError(f"checkpoint host threads must be a positive integer (torch threads of the "
                                      f"labels), got {n!r}")


