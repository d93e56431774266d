"""One record of a predicted trial: what Optuna's cost model, the NNI tuner and the validator write and read.

A :class:`TrialRecord` holds a candidate's predicted figures with their standard deviations and sources, the
deployment they are for, the chance constraints of the budgets, the input spec and (for a model of a registered
search space) the space's name and config, which is what a validator rebuilds the model from. Its
:meth:`~TrialRecord.to_attrs` gives the trial's user attributes (units in the keys) and
:meth:`~TrialRecord.from_attrs` reads them back, so ``HardwareCostModel``, ``HardwareAwareTuner`` and
``ParetoValidator`` share one schema::

    from dippm_nas.trial import TrialRecord
    record = TrialRecord.from_attrs(study.best_trials[0].user_attrs)
    record.latency_ms, record.latency_ms_std, record.margins, record.search_space_config

A trial of an LLM generation (``HardwareCostModel.evaluate`` with an ``LLMWorkload``) has the same record with a
:class:`GenerationRecord` in :attr:`TrialRecord.generation` (the decoder, the workload, the engine, the tensor
parallelism, every generation figure with its σ and source) and no forward-pass figures: its user attributes are
``predicted_<figure>``, ``predicted_<figure>_std`` for each figure of ``dippm_nas.llm.GENERATION_FIGURES`` and one
``generation`` dict with the rest.

Names read for one release (:data:`ATTR_ALIASES`; reading one warns ``DeprecationWarning``): ``config`` for
``search_space_config`` (the key of the NNI tuner's parameter block ``params["dippm"]``), the NNI tuner's
``dippm_predicted`` dict (``latency_ms``, ``energy_j``, ``memory_mib``, their ``*_std``, ``mig`` and
``source``) for trials that lack the ``predicted_*`` attributes, and the attributes generation trials had before
their ``generation`` dict (:data:`GENERATION_ALIASES`: ``source_<figure>``, ``llm_model``, ``workload``,
``engine``, ``mig_profile``, ``fits``, ``fit_reason``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dippm_nas._deprecation import warn_renamed
from dippm_nas.budgets import MINIMUM_FIGURES, ChanceCheck, band_distance
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.prediction import Prediction
from dippm_nas.spec import InputSpec

__all__ = ["TrialRecord", "GenerationRecord", "FIGURES", "REBUILD_ATTRS", "ATTR_ALIASES", "GENERATION_ALIASES"]

#: The predicted figures of a forward pass a record holds, with their units.
FIGURES: dict[str, str] = {"latency_ms": "ms per batch", "energy_j": "J per batch", "memory_mib": "MiB"}
#: The user attributes a validator rebuilds a candidate from.
REBUILD_ATTRS: tuple[str, ...] = ("search_space", "search_space_config", "input_spec")
#: Attribute names read for one release (removed in 0.2), and what replaces each.
ATTR_ALIASES: dict[str, str] = {
    "config": "search_space_config",
    "dippm_predicted": "predicted_<figure>, predicted_<figure>_std, latency_source, mig_smallest_fit",
}
#: The attributes of a generation trial read for one release (removed in 0.2), and the key of the ``generation``
#: user attribute that replaces each (``source_<figure>``: its ``sources``).
GENERATION_ALIASES: dict[str, str] = {
    "source_<figure>": "sources", "llm_model": "model", "workload": "workload", "engine": "engine",
    "mig_profile": "mig_profile", "fits": "fits", "fit_reason": "fit_reason",
}
ATTR_ALIASES.update({old: f"generation[{new!r}]" for old, new in GENERATION_ALIASES.items()})
_REMOVED_IN = "0.2"


def _source_key(figure: str) -> str:
    """``latency_ms`` -> ``latency_source`` (the attribute naming of the forward-pass sources)."""
    return figure.split("_")[0] + "_source"


def _warn_alias(old: str) -> None:
    warn_renamed("trial attribute", old, ATTR_ALIASES[old], removed_in=_REMOVED_IN, stacklevel=4)


@dataclass(frozen=True)
class GenerationRecord:
    """The generation section of a :class:`TrialRecord`: what an LLM-generation trial was predicted for and its
    figures (those of one instance of ``mig_profile`` when set; units in the figure names).

    Attributes:
        model: the decoder's name.
        workload: the :class:`~dippm_nas.llm.LLMWorkload` as a dict (``prompt_len``, ``output_len``,
            ``batch_size``, ``kv_dtype``).
        engine: the serving engine (``None`` outside ``runtime="serving"``).
        tensor_parallel: GPUs the decoder is split over (1: the prediction is of one GPU).
        mig_profile: the MIG profile the figures are for (``None``: the whole GPU).
        figures, stds, sources: ``{figure: value}``, ``{figure: σ}`` (``None``: the source gives none) and
            ``{figure: source}`` for the figures of ``dippm_nas.llm.GENERATION_FIGURES``.
        fits: the batch fits at once; fit_reason: why not (``""`` when it fits).
    """

    model: str | None
    workload: dict[str, Any]
    engine: str | None = None
    tensor_parallel: int = 1
    mig_profile: str | None = None
    figures: dict[str, float | None] = field(default_factory=dict)
    stds: dict[str, float | None] = field(default_factory=dict)
    sources: dict[str, str | None] = field(default_factory=dict)
    fits: bool | None = None
    fit_reason: str | None = None

    def figure(self, name: str) -> tuple[float | None, float | None, str | None]:
        """``(value, std, source)`` of one generation figure."""
        if name not in self.figures:
            raise InvalidValueError(f"figure must be one of {sorted(self.figures)}, got {name!r}")
        return self.figures[name], self.stds.get(name), self.sources.get(name)

    def to_dict(self) -> dict[str, Any]:
        """The ``generation`` user attribute (the figures themselves are ``predicted_<figure>`` attributes)."""
        return {"model": self.model, "workload": dict(self.workload), "engine": self.engine,
                "tensor_parallel": self.tensor_parallel, "mig_profile": self.mig_profile, "fits": self.fits,
                "fit_reason": self.fit_reason, "sources": dict(self.sources)}


@dataclass(frozen=True)
class TrialRecord:
    """The cost model's record of one trial (units in the field names).

    Attributes:
        device: catalogue id the figures are for (``None`` in records that did not say).
        latency_ms, energy_j, memory_mib: predicted figures of one forward pass of a batch (ms, J, MiB);
            ``energy_j`` is ``None`` for a device without power figures.
        latency_ms_std, energy_j_std, memory_mib_std: their standard deviations, same units (``None``: the
            source gives none).
        latency_source, energy_source, memory_source: ``"predicted"``, ``"analytic"``, ``"calibrated"``,
            ``"unavailable"`` (``None`` in records that did not say).
        host_ms, gpu_ms: the host and GPU timelines of one pass, ms (``None`` off a GPU).
        mig_smallest_fit: the smallest MIG profile that fits (``None``: none fits, no MIG, or not asked).
        deployment: how the candidate runs, :meth:`dippm_nas.Deployment.to_dict`.
        constraints: ``{figure: mean + k * std - budget}`` per budget set, in the budget's unit (Optuna's sign:
            ``<= 0`` feasible).
        limits: ``{figure: the budget's limit}``, in the figure's unit (for memory the smaller of the budget
            and the MIG profile's usable memory).
        k_sigmas: ``{figure: k}``, the standard deviations added.
        std_missing: ``{figure: True}`` when the figure had no std and was checked with std 0.
        input_spec: the input the figures are for (its batch size is the batch of "per batch").
        search_space, search_space_config: the registered search space and JSON config the model was built
            from (``None`` for other models).
        cost_model_s: seconds of conversion and prediction for this trial.
        unknown_ops: ``{op: count}`` of operators without a formula.
        adaptation_version, adaptation_rows: the stored adaptation that made the prediction, and the measured
            rows it was fitted on (``None`` without one).
        prediction_path: which path answered the figures where a validator chooses it
            (``ParetoValidator(choose_path=...)``: ``"network"`` or ``"prior"``, the prediction's
            ``labels["prediction_path"]``); ``None`` where no choice is made.
        generation: the generation section of an LLM-generation trial (``None`` for a forward pass); such a
            record has ``None`` forward-pass figures (``latency_ms``, ``energy_j``, ``memory_mib``).
    """

    device: str | None
    latency_ms: float | None
    energy_j: float | None
    memory_mib: float | None
    latency_ms_std: float | None = None
    energy_j_std: float | None = None
    memory_mib_std: float | None = None
    latency_source: str | None = None
    energy_source: str | None = None
    memory_source: str | None = None
    host_ms: float | None = None
    gpu_ms: float | None = None
    mig_smallest_fit: str | None = None
    deployment: dict[str, Any] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)
    k_sigmas: dict[str, float] = field(default_factory=dict)
    std_missing: dict[str, bool] = field(default_factory=dict)
    input_spec: InputSpec | None = None
    search_space: str | None = None
    search_space_config: dict[str, Any] | None = None
    cost_model_s: float | None = None
    unknown_ops: dict[str, int] = field(default_factory=dict)
    adaptation_version: int | None = None
    adaptation_rows: int | None = None
    generation: GenerationRecord | None = None
    prediction_path: str | None = None

    # ------------------------------------------------------------------ derived
    @property
    def runtime(self) -> str | None:
        """The deployment's runtime (``"eager"``, ``"cuda-graphs"``, ``"compiled"``)."""
        return self.deployment.get("runtime")

    @property
    def margins(self) -> dict[str, float]:
        """``{figure: budget - mean - k * std}`` (``>= 0`` feasible), the room left within each budget."""
        return {n: -v for n, v in self.constraints.items()}

    @property
    def feasible(self) -> bool:
        """Every budget is met (``True`` without budgets)."""
        return all(v <= 0 for v in self.constraints.values())

    @property
    def band_distance(self) -> float | None:
        """How unsure the trial's rejection is: the largest :func:`~dippm_nas.budgets.band_distance` (``|mean -
        budget| / |bound - mean|``) over the budgets its checks reject; ``None`` when it meets every budget (or has
        none). Below 1, every rejected budget lies within its margin's band around the mean (the mean may fit):
        the trials :class:`~dippm_nas.validation.ParetoValidator`'s ``uncertain_per_round`` measures."""
        out: float | None = None
        for name, value in self.constraints.items():
            if value <= 0 or name not in self.limits:
                continue
            mean = self.generation.figures.get(name) if self.generation is not None else getattr(self, name, None)
            if mean is None or not math.isfinite(mean):
                return math.inf  # a rejected figure without a mean: nothing says how close it came
            budget = self.limits[name]
            bound = budget - value if name in MINIMUM_FIGURES else budget + value
            d = band_distance(mean, bound, budget)
            out = d if out is None else max(out, d)
        return out

    @property
    def rebuildable(self) -> bool:
        """A validator can rebuild the model: it is of a registered search space and has its input spec."""
        return (self.generation is None and self.search_space is not None and self.search_space_config is not None
                and self.input_spec is not None)

    @property
    def not_rebuildable_reason(self) -> str | None:
        """Why a validator cannot rebuild and measure the candidate (``None`` when it can)."""
        if self.generation is not None:
            g = self.generation
            return (f"it is an LLM generation (model {g.model!r}, workload {g.workload}, engine {g.engine!r}, "
                    f"tensor parallel {g.tensor_parallel}), not a forward pass of a model of search_spaces: "
                    "ParetoValidator measures it as a generation job (dippm_nas.validation.measure_generation)")
        if not self.rebuildable:
            missing = [k for k in REBUILD_ATTRS if getattr(self, k) is None]
            return (f"it lacks the user attributes {missing} (evaluate models built with search_spaces.build_model, "
                    "or pass space= and config= to HardwareCostModel.evaluate; HardwareAwareTuner records them "
                    "with builder=)")
        return None

    def figure(self, name: str) -> tuple[float | None, float | None, str | None]:
        """``(value, std, source)`` of one of :data:`FIGURES`."""
        if name not in FIGURES:
            raise InvalidValueError(f"figure must be one of {list(FIGURES)}, got {name!r}")
        return getattr(self, name), getattr(self, name + "_std"), getattr(self, _source_key(name))

    # ------------------------------------------------------------------ making one
    @classmethod
    def of(cls, prediction: Prediction, checks: Mapping[str, ChanceCheck], *, deployment: Mapping[str, Any],
           input_spec: InputSpec | None = None, search_space: str | None = None,
           search_space_config: Mapping[str, Any] | None = None, cost_model_s: float | None = None) -> "TrialRecord":
        """The record of a forward-pass prediction and its chance checks (:meth:`dippm_nas.budgets.Budgets.check`).

        Raises:
            InvalidValueError: ``search_space`` without ``search_space_config`` or the reverse.
        """
        if (search_space is None) != (search_space_config is None):
            raise InvalidValueError(f"give both search_space and search_space_config or neither, got "
                                    f"search_space={search_space!r}, search_space_config={search_space_config!r}")
        d = prediction.details
        return cls(
            device=prediction.device, latency_ms=float(prediction.latency_ms), energy_j=prediction.energy_j,
            memory_mib=float(prediction.memory_mib), latency_ms_std=prediction.latency_ms_std,
            energy_j_std=prediction.energy_j_std, memory_mib_std=prediction.memory_mib_std,
            latency_source=prediction.latency_source, energy_source=prediction.energy_source,
            memory_source=prediction.memory_source, host_ms=prediction.host_ms, gpu_ms=prediction.gpu_ms,
            mig_smallest_fit=getattr(prediction.mig, "smallest_fit", None), deployment=dict(deployment),
            constraints={n: c.value for n, c in checks.items()},
            limits={n: c.budget for n, c in checks.items()},
            k_sigmas={n: c.k_sigma for n, c in checks.items()},
            std_missing={n: c.std_missing for n, c in checks.items()},
            input_spec=input_spec, search_space=search_space,
            search_space_config=None if search_space_config is None else dict(search_space_config),
            cost_model_s=cost_model_s, unknown_ops=dict(prediction.unknown_ops),
            adaptation_version=int(d["adaptation_version"]) if "adaptation_version" in d else None,
            adaptation_rows=int(d["adaptation_rows"]) if "adaptation_rows" in d else None,
            prediction_path=prediction.labels.get("prediction_path"),
        )

    @classmethod
    def of_generation(cls, prediction: Any, checks: Mapping[str, ChanceCheck], *, deployment: Mapping[str, Any],
                      mig_profile: str | None = None, cost_model_s: float | None = None) -> "TrialRecord":
        """The record of an LLM generation (a ``dippm_nas.llm.GenerationPrediction``) and its chance checks, with
        the figures of one instance of ``mig_profile`` when given (the weights and KV cache are the same on a
        slice).

        Raises:
            InvalidValueError: ``mig_profile`` is not one the prediction has (the profiles are listed).
        """
        from_slice = ("weights_mib", "kv_cache_mib", "kv_cache_mib_per_sequence")
        figures, stds, sources = {}, {}, {}
        for name in prediction.sources:
            f = prediction.figure(name) if mig_profile is None or name in from_slice else \
                prediction.figure(name, mig_profile)
            figures[name], stds[name], sources[name] = f.value, f.std, f.source
        on = prediction.mig[mig_profile] if mig_profile is not None and prediction.mig else None
        d = prediction.details
        generation = GenerationRecord(
            model=prediction.model, workload=prediction.workload.to_dict(), engine=d.get("engine"),
            tensor_parallel=int(d.get("tensor_parallel", 1)), mig_profile=mig_profile, figures=figures, stds=stds,
            sources=sources, fits=on.fits if on is not None else prediction.fits,
            fit_reason=on.reason if on is not None else prediction.reason)
        return cls(
            device=prediction.device, latency_ms=None, energy_j=None, memory_mib=None, deployment=dict(deployment),
            constraints={n: c.value for n, c in checks.items()}, limits={n: c.budget for n, c in checks.items()},
            k_sigmas={n: c.k_sigma for n, c in checks.items()},
            std_missing={n: c.std_missing for n, c in checks.items()}, cost_model_s=cost_model_s,
            generation=generation)

    # ------------------------------------------------------------------ user attributes
    def to_attrs(self) -> dict[str, Any]:
        """The trial's user attributes (JSON values, units in the keys; docs/optuna.md lists them)."""
        a: dict[str, Any] = {}
        if self.generation is None:
            for name in FIGURES:
                value, std, source = self.figure(name)
                a[f"predicted_{name}"] = value
                a[f"predicted_{name}_std"] = std
                a[_source_key(name)] = source
            a.update({"predicted_host_ms": self.host_ms, "predicted_gpu_ms": self.gpu_ms,
                      "mig_smallest_fit": self.mig_smallest_fit})
        else:
            for name, value in self.generation.figures.items():
                a[f"predicted_{name}"] = value
                a[f"predicted_{name}_std"] = self.generation.stds.get(name)
            a["generation"] = self.generation.to_dict()
        a.update({
            "predicted_device": self.device, "runtime": self.runtime, "deployment": dict(self.deployment),
            "feasible": self.feasible,
        })
        if self.cost_model_s is not None:
            a["cost_model_s"] = self.cost_model_s
        if self.input_spec is not None:
            a["input_spec"] = self.input_spec.to_dict()
        if self.unknown_ops:
            a["unknown_ops"] = dict(self.unknown_ops)
        if self.adaptation_version is not None:
            a["adaptation_version"] = self.adaptation_version
            a["adaptation_rows"] = self.adaptation_rows
        if self.prediction_path is not None:
            a["prediction_path"] = self.prediction_path
        if self.search_space is not None:
            a["search_space"] = self.search_space
            a["search_space_config"] = self.search_space_config
        for n, v in self.constraints.items():
            a[f"constraint_{n}"] = v
        for n, v in self.constraints.items():
            a[f"budget_{n}"] = self.limits.get(n)
            a[f"k_sigma_{n}"] = self.k_sigmas.get(n)
            a[f"margin_{n}"] = -v
            a[f"std_missing_{n}"] = self.std_missing.get(n, False)
        return a

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> "TrialRecord":
        """Read a record back from a trial's user attributes (those of :meth:`to_attrs`, of
        ``HardwareCostModel`` or of ``HardwareAwareTuner``; the names of :data:`ATTR_ALIASES` with a
        ``DeprecationWarning``).

        Every attribute is checked for its type (:class:`_Attrs`): a figure that is a string or a list, a
        source that is a number, ``unknown_ops`` that is not a mapping of counts, or ``attrs`` that is not a
        mapping is an error naming the attribute, the value and what is expected.

        Raises:
            InvalidValueError: ``attrs`` is not a mapping, an attribute has the wrong type, or the attributes
                hold no predicted latency and memory (the trial was never predicted, or its prediction failed:
                its ``cost_model_error`` / ``dippm_error`` says why).
        """
        if not isinstance(attrs, Mapping):
            raise InvalidValueError(f"trial attributes must be a mapping (a trial's user_attrs), got "
                                    f"{type(attrs).__name__} {_shown(attrs)}")
        a = _Attrs(attrs)
        generation = _generation_of(attrs)
        if generation is not None:
            return cls._from_generation_attrs(a, generation)
        legacy = attrs.get("dippm_predicted") if "predicted_latency_ms" not in attrs else None
        if isinstance(legacy, Mapping):
            _warn_alias("dippm_predicted")
        else:
            legacy = {}

        def figure(name: str, suffix: str = "") -> float | None:
            key = f"predicted_{name}{suffix}"
            return a.number(key) if key in attrs else a.number(f"dippm_predicted.{name}{suffix}",
                                                                legacy.get(name + suffix))

        latency, memory = figure("latency_ms"), figure("memory_mib")
        if latency is None or memory is None:
            raise InvalidValueError(
                f"these trial attributes hold no prediction (no predicted_latency_ms and predicted_memory_mib); "
                f"attributes: {sorted(map(str, attrs))[:40]}; the trial's cost_model_error or dippm_error says why")
        config = attrs.get("search_space_config")
        if config is None and "config" in attrs and attrs.get("search_space") is not None:
            _warn_alias("config")
            config = attrs["config"]
        if config is not None and not isinstance(config, Mapping):
            raise InvalidValueError(f"trial attribute search_space_config must be a JSON object, got "
                                    f"{type(config).__name__} {_shown(config)}")
        constraints = _constraints_of(a)
        mig = attrs["mig_smallest_fit"] if "mig_smallest_fit" in attrs else legacy.get("mig")
        mig = a.text("mig_smallest_fit", mig)
        deployment = attrs.get("deployment")
        return cls(
            device=a.text("predicted_device"), latency_ms=latency, energy_j=figure("energy_j"), memory_mib=memory,
            latency_ms_std=figure("latency_ms", "_std"), energy_j_std=figure("energy_j", "_std"),
            memory_mib_std=figure("memory_mib", "_std"),
            latency_source=a.text("latency_source", attrs.get("latency_source", legacy.get("source"))),
            energy_source=a.text("energy_source"), memory_source=a.text("memory_source"),
            host_ms=a.number("predicted_host_ms"), gpu_ms=a.number("predicted_gpu_ms"),
            mig_smallest_fit=mig if mig not in ("none", "unsupported", "not-asked") else None,
            deployment=dict(deployment) if isinstance(deployment, Mapping) else {},
            constraints=constraints, **_checks_of(a, constraints),
            input_spec=a.input_spec(), search_space=a.text("search_space"),
            search_space_config=dict(config) if isinstance(config, Mapping) else None,
            cost_model_s=a.number("cost_model_s"), unknown_ops=a.counts("unknown_ops"),
            adaptation_version=a.count("adaptation_version"), adaptation_rows=a.count("adaptation_rows"),
            prediction_path=a.text("prediction_path"),
        )

    @classmethod
    def _from_generation_attrs(cls, a: "_Attrs", generation: GenerationRecord) -> "TrialRecord":
        attrs = a.attrs
        deployment = attrs.get("deployment")
        if not isinstance(deployment, Mapping):
            deployment = {"runtime": attrs["runtime"]} if isinstance(attrs.get("runtime"), str) else {}
        constraints = _constraints_of(a)
        return cls(device=a.text("predicted_device"), latency_ms=None, energy_j=None, memory_mib=None,
                   deployment=dict(deployment), constraints=constraints, **_checks_of(a, constraints),
                   cost_model_s=a.number("cost_model_s"), generation=generation)

    def relative_std(self) -> float | None:
        """The largest ``std / value`` of the figures that have both (``None`` when none has): how uncertain the
        prediction is (of the generation figures for a generation record)."""
        figures = (map(self.generation.figure, self.generation.figures) if self.generation is not None
                   else map(self.figure, FIGURES))
        rels = [float(s) / float(v) for v, s, _ in figures
                if _real(v) and _real(s) and v > 0 and math.isfinite(s) and math.isfinite(v)]
        return max(rels) if rels else None


def _constraints_of(a: "_Attrs") -> dict[str, float]:
    """``{figure: constraint}`` from ``constraint_<figure>`` (or ``-margin_<figure>``) attributes."""
    attrs = a.attrs
    checks = {str(k)[len("constraint_"):] for k in attrs if str(k).startswith("constraint_")}
    checks |= {str(k)[len("margin_"):] for k in attrs if str(k).startswith("margin_")}
    return {n: a.number(f"constraint_{n}") if f"constraint_{n}" in attrs  # type: ignore[misc]
            else -a.number(f"margin_{n}", required=True) for n in sorted(checks)}  # type: ignore[operator]


def _checks_of(a: "_Attrs", constraints: Mapping[str, float]) -> dict[str, Any]:
    """The ``limits``, ``k_sigmas`` and ``std_missing`` fields of the budgets in ``constraints``."""
    return {
        "limits": {n: v for n in constraints if (v := a.number(f"budget_{n}")) is not None},
        "k_sigmas": {n: v for n in constraints if (v := a.number(f"k_sigma_{n}")) is not None},
        "std_missing": {n: bool(a.attrs.get(f"std_missing_{n}", False)) for n in constraints},
    }


def _generation_of(attrs: Mapping[str, Any]) -> GenerationRecord | None:
    """The generation section of a trial's attributes: the ``generation`` dict, or the attributes of
    :data:`GENERATION_ALIASES` (with a ``DeprecationWarning``); ``None`` for a forward-pass trial."""
    section = attrs.get("generation")
    if isinstance(section, Mapping):
        g = dict(section)
    elif "llm_model" in attrs and "predicted_latency_ms" not in attrs:
        sources = {k[len("source_"):]: v for k, v in attrs.items() if k.startswith("source_")}
        _warn_alias("llm_model" if not sources else "source_<figure>")
        g = {new: attrs.get(old) for old, new in GENERATION_ALIASES.items() if old != "source_<figure>"}
        g["sources"] = sources
    else:
        return None
    sources = g.get("sources") if isinstance(g.get("sources"), Mapping) else {}
    names = list(sources) or [k[len("predicted_"):-len("_std")] for k in attrs
                              if k.startswith("predicted_") and k.endswith("_std")]
    workload = g.get("workload")
    tp = g.get("tensor_parallel", 1)
    return GenerationRecord(
        model=g.get("model") if isinstance(g.get("model"), str) else None,
        workload=dict(workload) if isinstance(workload, Mapping) else {},
        engine=g.get("engine") if isinstance(g.get("engine"), str) else None,
        tensor_parallel=tp if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1 else 1,
        mig_profile=g.get("mig_profile") if isinstance(g.get("mig_profile"), str) else None,
        figures={n: attrs.get(f"predicted_{n}") for n in names},
        stds={n: attrs.get(f"predicted_{n}_std") for n in names},
        sources={n: sources.get(n) for n in names},
        fits=g.get("fits") if isinstance(g.get("fits"), bool) else None,
        fit_reason=g.get("fit_reason") if isinstance(g.get("fit_reason"), str) else None,
    )


def _real(v: Any) -> bool:
    """``v`` is an int or a float (not a bool, a string or a list)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shown(v: Any) -> str:
    """``repr(v)``, cut to 80 characters."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


class _Attrs:
    """Typed reads of a trial's user attributes: each names the attribute, the value and the type expected
    when the value has another type (attributes come from a storage anyone can write to)."""

    _MISSING = object()

    def __init__(self, attrs: Mapping[str, Any]) -> None:
        self.attrs = attrs

    def _get(self, key: str, value: Any) -> Any:
        return self.attrs.get(key) if value is self._MISSING else value

    def number(self, key: str, value: Any = _MISSING, *, required: bool = False) -> float | None:
        v = self._get(key, value)
        if v is None and not required:
            return None
        if not _real(v):
            raise InvalidValueError(f"trial attribute {key} must be a number, got {type(v).__name__} {_shown(v)}")
        try:
            return float(v)
        except OverflowError:
            raise InvalidValueError(f"trial attribute {key} must be a number of float range, got an int of "
                                    f"{v.bit_length()} bits") from None

    def text(self, key: str, value: Any = _MISSING) -> str | None:
        v = self._get(key, value)
        if v is not None and not isinstance(v, str):
            raise InvalidValueError(f"trial attribute {key} must be a string or null, got {type(v).__name__} "
                                    f"{_shown(v)}")
        return v

    def count(self, key: str) -> int | None:
        v = self.attrs.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise InvalidValueError(f"trial attribute {key} must be an int or null, got {type(v).__name__} {_shown(v)}")
        return v

    def counts(self, key: str) -> dict[str, int]:
        v = self.attrs.get(key) or {}
        if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool)
                                                 for k, n in v.items()):
            raise InvalidValueError(f"trial attribute {key} must map operator names to counts, got "
                                    f"{type(v).__name__} {_shown(v)}")
        return dict(v)

    def input_spec(self) -> InputSpec | None:
        spec = self.attrs.get("input_spec")
        if spec is None:
            return None
        if not isinstance(spec, Mapping):
            raise InvalidValueError(f"trial attribute input_spec must be an InputSpec dict, got {type(spec).__name__} "
                                    f"{_shown(spec)}")
        try:
            return InputSpec.from_dict(spec)
        except DippmNasError as e:
            raise InvalidValueError(f"trial attribute input_spec: {e}") from e
        except (TypeError, ValueError, KeyError, OverflowError) as e:
            raise InvalidValueError(f"trial attribute input_spec is malformed ({type(e).__name__}: {e})") from e
