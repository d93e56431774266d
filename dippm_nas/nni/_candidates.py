"""The candidates of :class:`~dippm_nas.nni.HardwareAwareTuner`: a sampled config of the model keys becomes a
model (a registered search space's, assembled from cached blocks, or a factory's), its predicted cost and its
chance checks, once per distinct config (:class:`CandidateEvaluator`, :class:`Evaluation`), and the trial record
written for it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dippm_nas._json import canonical_json
from dippm_nas.budgets import Budgets, ChanceCheck
from dippm_nas.capture import assemble
from dippm_nas.deployment import Deployment
from dippm_nas.devices import Device, resolve_device
from dippm_nas.errors import DippmNasError, InvalidTypeError, InvalidValueError, SearchSpaceError
from dippm_nas.nni._report import mig_label
from dippm_nas.nni._space import build_from_factory, load_factory
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import predict, resolve_deployment
from dippm_nas.spec import InputSpec
from dippm_nas.trial import TrialRecord
import search_spaces

__all__ = ["CandidateEvaluator", "Evaluation", "DEFAULT_GPU_DTYPE"]

logger = logging.getLogger("dippm_nas.nni._tuner")  # the tuner's log: one logger for all it says

#: The compute dtype the cost is predicted in on a GPU when ``dtype`` is not given.
DEFAULT_GPU_DTYPE = "float16"


@dataclass
class Evaluation:
    """The cost model's verdict on one config (cached per config)."""

    config: dict[str, Any]
    spec: InputSpec | None = None
    prediction: Prediction | None = None
    checks: dict[str, ChanceCheck] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def violations(self) -> dict[str, float]:
        """``{figure: mean + k_sigma * std - budget}`` (``<= 0`` feasible)."""
        return {n: c.value for n, c in self.checks.items()}

    @property
    def feasible(self) -> bool:
        return self.error is None and all(v <= 0 for v in self.violations.values())

    def predicted(self) -> dict[str, Any]:
        """The predicted figures sent to the trial and stored on the Optuna trial."""
        p = self.prediction
        assert p is not None
        return {"latency_ms": p.latency_ms, "energy_j": p.energy_j, "memory_mib": p.memory_mib,
                "latency_ms_std": p.latency_ms_std, "energy_j_std": p.energy_j_std,
                "memory_mib_std": p.memory_mib_std, "mig": mig_label(p), "source": p.latency_source}


class CandidateEvaluator:
    """Builds and predicts the tuner's candidates (the arguments are :class:`~dippm_nas.nni.HardwareAwareTuner`'s).

    Attributes:
        builder, model_factory, space, factory, input_spec, model_source, model_keys_arg: the model source.
        evaluations: ``{canonical config: Evaluation}`` (each config predicted once).
        warned: the warnings said once (shared with the tuner).
    """

    def __init__(self, builder: str | None, model_factory: str | None, model_keys: Sequence[str] | None,
                 input_shape: Sequence[int] | None, inputs: Mapping[str, Any] | None, *,
                 base_config: dict[str, Any], batch_size: int, dtype: str, device: "str | Device", cache: bool,
                 budgets: Budgets, k_sigma: float, deployment: Deployment, objectives: Sequence[str], stats: Any,
                 warned: set[str]) -> None:
        dev = resolve_device(device)
        self.base_config, self.batch_size, self.dtype, self.device, self.cache = (base_config, batch_size, dtype,
                                                                                 dev.id, cache)
        self.budgets, self.k_sigma, self.deployment, self.objectives = budgets, k_sigma, deployment, objectives
        #: the device and the deployment resolved once (a deployment the device refuses stays as given: each
        #: prediction then raises, skipping its candidate); every prediction passes them inward as they are
        self.resolved_device = dev
        try:
            self.resolved_deployment: Any = resolve_deployment(dev, deployment)
        except DippmNasError:
            self.resolved_deployment = deployment
        self.stats, self.warned = stats, warned
        self.evaluations: dict[str, Evaluation] = {}
        self._init_source(builder, model_factory, model_keys, input_shape, inputs)

    @property
    def deployment_label(self) -> str:
        """The label of the deployment every prediction is for (read off its resolution where the device took it)."""
        return self.resolved_deployment.label

    def _init_source(self, builder: str | None, model_factory: str | None, model_keys: Sequence[str] | None,
                     input_shape: Sequence[int] | None, inputs: Mapping[str, Any] | None) -> None:
        """The model source: a registered search space, or a factory with its input."""
        if (builder is None) == (model_factory is None):
            raise InvalidValueError(
                "give exactly one of builder= (a registered search space, one of "
                f"{sorted(search_spaces.list_spaces())}) and model_factory= ('package.module:callable', a "
                f"function returning an nn.Module from the NNI parameter dict); got builder={builder!r}, "
                f"model_factory={model_factory!r}")
        self.builder, self.model_factory = builder, model_factory
        self.space: Any = None
        self.factory: Any = None
        self.input_spec: InputSpec | None = None
        if builder is not None:
            for name, v in (("model_keys", model_keys), ("input_shape", input_shape), ("inputs", inputs)):
                if v is not None:
                    raise InvalidValueError(f"{name} applies to model_factory only; with builder={builder!r} the "
                                            "search space's config keys build the model and its builder gives "
                                            "the input")
            self.space = search_spaces.get_space(builder)
            self.model_source = f"builder:{builder}"
            config = self.space.validate(self.base_config)  # a bad fixed key fails now, not at the first trial
            self.space.input_spec(config, batch_size=self.batch_size, dtype=self.dtype)  # a bad dtype too
            self.model_keys_arg: list[str] | None = None
            return
        self.factory = load_factory(model_factory)  # type: ignore[arg-type]
        self.model_source = f"model_factory:{model_factory}"
        try:
            json.dumps(self.base_config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidValueError(f"base_config must be plain JSON data (it goes to the trial), got "
                                    f"{self.base_config!r}: {e}") from e
        if (input_shape is None) == (inputs is None):
            raise InvalidValueError("model_factory needs exactly one of input_shape= (per-sample shape, e.g. "
                                    "[3, 32, 32]) and inputs= ({name: [shape, dtype]}); got "
                                    f"input_shape={input_shape!r}, inputs={inputs!r}")
        if inputs is not None:
            if not isinstance(inputs, Mapping):
                raise InvalidTypeError(f"inputs must be a mapping {{name: [shape, dtype]}}, got {inputs!r}")
            named = {k: (tuple(v[0]), v[1]) if isinstance(v, (list, tuple)) and len(v) == 2 else v
                     for k, v in inputs.items()}
            self.input_spec = InputSpec(inputs=named, batch_size=self.batch_size, dtype=self.dtype)
        else:
            shape: Any = tuple(input_shape) if isinstance(input_shape, (list, tuple)) else input_shape
            self.input_spec = InputSpec(shape=shape, batch_size=self.batch_size, dtype=self.dtype)
        if model_keys is not None and (isinstance(model_keys, str) or not all(
                isinstance(k, str) and k for k in model_keys)):
            raise InvalidTypeError(f"model_keys must be a list of search-space keys, got {model_keys!r}")
        self.model_keys_arg = None if model_keys is None else list(model_keys)

    def describe(self, ev: Evaluation) -> dict[str, Any]:
        """How the trial builds the model (see :func:`dippm_nas.nni.model_from_parameters`)."""
        if self.space is not None:
            return {"search_space": self.builder, "config": ev.config}
        assert self.input_spec is not None
        return {"model_factory": self.model_factory, "model_params": ev.config, "input": self.input_spec.to_dict()}

    def record_of(self, ev: Evaluation) -> TrialRecord:
        """The trial record of a predicted config: the one ``HardwareCostModel`` writes (with the search space and
        config of a ``builder`` model, so ``ParetoValidator`` rebuilds it)."""
        assert ev.prediction is not None
        space = self.builder if self.space is not None else None
        return TrialRecord.of(ev.prediction, ev.checks, deployment=self.deployment.to_dict(), input_spec=ev.spec,
                              search_space=space, search_space_config=ev.config if space is not None else None,
                              cost_model_s=ev.seconds)

    def cost_attrs(self, ev: Evaluation) -> dict[str, Any]:
        """User attributes of the prediction: :meth:`TrialRecord.to_attrs` (units in the keys)."""
        return self.record_of(ev).to_attrs()

    def evaluate(self, model_part: dict[str, Any]) -> Evaluation:
        """Build and predict a config once; later calls return the cached verdict."""
        try:
            if self.space is not None:
                config = self.space.validate({**self.base_config, **model_part})
            else:
                config = json.loads(json.dumps({**self.base_config, **model_part}))
        except SearchSpaceError as e:
            return Evaluation(config={**self.base_config, **model_part}, error=str(e))
        ckey = canonical_json(config)
        ev = self.evaluations.get(ckey)
        if ev is not None:
            return ev
        ev = Evaluation(config=config)
        t0 = time.perf_counter()
        try:
            if self.space is not None:
                ev.spec = self.space.input_spec(config, batch_size=self.batch_size, dtype=self.dtype)
                target: Any = assemble(self.space, config, ev.spec, cache=self.cache)  # from cached blocks
                spec = None
            else:
                target = build_from_factory(self.factory, self.model_factory, config)  # type: ignore[arg-type]
                ev.spec = spec = self.input_spec
            ev.prediction = predict(target, spec, self.resolved_device, cache=self.cache, k_sigma=self.k_sigma,
                                    mig=self.budgets.mig_profile is not None, deployment=self.resolved_deployment)
            self.stats.predictions += 1
        except DippmNasError as e:  # a builder, factory or capture failure is this config's problem
            ev.error = f"{type(e).__name__}: {e}"
            if self.model_factory is not None and "factory" not in self.warned:
                self.warned.add("factory")
                logger.warning("config %s could not be built or predicted (%s); such configs are skipped", ckey,
                               ev.error)
        if ev.prediction is not None:
            if ev.prediction.details.get("dtype_unseen") and "dtype" not in self.warned:
                self.warned.add("dtype")
                logger.warning("the %s checkpoint has not seen dtype %s: its figures come from the analytic "
                               "prior (source %r); dtype=%s is the one it was trained on", self.device,
                               self.dtype, ev.prediction.latency_source, DEFAULT_GPU_DTYPE)
            needs_energy = "energy_j" in self.objectives or self.budgets.energy_j is not None
            if needs_energy and ev.prediction.energy_j is None:
                raise InvalidValueError(f"device {self.device!r} gives no energy figure (energy_source "
                                        f"'unavailable'); remove 'energy_j' from objectives and budgets")
            ev.checks = self.budgets.check(ev.prediction)
        ev.seconds = time.perf_counter() - t0
        self.evaluations[ckey] = ev
        return ev
