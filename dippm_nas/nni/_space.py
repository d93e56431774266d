"""NNI search spaces sampled with Optuna, and the model a trial's parameters describe.

The tuner receives NNI's search-space JSON (``{"key": {"_type": ..., "_value": [...]}}``) and samples it
with Optuna (define-by-run: ``trial.suggest_*``, so a nested choice's inner keys exist only when their
option is chosen). Every type of NNI 3.0's search-space specification is accepted, with NNI's meaning
(``nni.common.hpo_utils.formatting``, ``validation``):

- ``choice`` ``[v0, v1, ...]``: one of the values (any JSON, lists and dicts too); Optuna: categorical (of
  the index when a value is not None/bool/int/float/str).
- nested ``choice`` ``[{"_name": n, k: spec, ...}, ...]``: ``{"_name": n, k: value of k, ...}``, the option
  ``n`` with its own keys sampled; Optuna: categorical of the names, then the option's keys (``key/n/k``).
- ``randint`` ``[lower, upper]``: an int in ``[ceil(lower), ceil(upper))``; Optuna: int.
- ``uniform`` ``[low, high]``: ``uniform(low, high)``; ``loguniform``: ``exp(uniform(log low, log high))``;
  Optuna: float (log scale for ``loguniform``).
- ``quniform`` / ``qloguniform`` ``[low, high, q]``: ``clip(round(x / q) * q, low, high)`` of the uniform /
  log-uniform ``x``; Optuna: the float ``x``, rounded after sampling.
- ``normal`` ``[mu, sigma]``: ``normal(mu, sigma)``; ``lognormal``: ``exp(normal(mu, sigma))``; ``qnormal`` /
  ``qlognormal`` ``[mu, sigma, q]``: ``round(x / q) * q`` of those (not clipped); Optuna: a probability
  ``p``, mapped by the inverse normal CDF.

``round`` is Python's (half to even) and the ``q`` types give floats, as in NNI. A choice is nested when
every option is a dict with ``_name`` (NNI's rule); the option names must then be distinct. Optuna samples
the continuous value before rounding, so with the random sampler each value has NNI's probability; a
normal type is sampled as ``p`` in ``[1e-12, 1 - 1e-12]`` (``|z| <= 7.03``), so its tails beyond 7σ are
cut. :meth:`Dimension.encode` maps an NNI value back to Optuna's parameters (for ``import_data``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from dippm_nas._json import canonical_json
from dippm_nas._numbers import as_int, as_real, is_real
from dippm_nas.errors import InputSpecError, ModelSpecError, SearchSpaceError
from dippm_nas.capture import load_callable
from dippm_nas.spec import InputSpec
import search_spaces

__all__ = ["Dimension", "parse_search_space", "PARAMETERS_KEY", "model_from_parameters", "SUPPORTED_TYPES",
           "canonical_json", "quantize", "spec_from_parameters", "load_factory", "build_from_factory"]

#: NNI search-space types the tuner can sample (all of NNI 3.0's).
SUPPORTED_TYPES: tuple[str, ...] = ("choice", "randint", "uniform", "quniform", "loguniform", "qloguniform",
                                    "normal", "qnormal", "lognormal", "qlognormal")

#: The key of a trial's parameters under which the tuner says how to build the model and score it.
PARAMETERS_KEY = "dippm"

_PRIMITIVE = (type(None), bool, int, float, str)
_P_EDGE = 1e-12  # the normal types sample p in [_P_EDGE, 1 - _P_EDGE]
_STD_NORMAL = NormalDist()


def quantize(x: float, q: float, low: float | None = None, high: float | None = None) -> float:
    """NNI's ``q`` rounding: ``round(x / q) * q``, then clipped to ``[low, high]`` when they are given
    (``quniform``, ``qloguniform``; the normal types are not clipped).

    Raises:
        SearchSpaceError: ``x``, ``low`` or ``high`` not a finite number, or ``q`` not a finite number > 0.
    """
    x = as_real(x, "quantize(): x", error=SearchSpaceError)
    q = as_real(q, "quantize(): q", low=0, low_inclusive=False, error=SearchSpaceError)
    low = None if low is None else as_real(low, "quantize(): low", error=SearchSpaceError)
    high = None if high is None else as_real(high, "quantize(): high", error=SearchSpaceError)
    v = float(round(x / q) * q)
    if low is not None:
        v = max(v, float(low))
    if high is not None:
        v = min(v, float(high))
    return v


def _suggest(trial: Any, name: str, dist: Any) -> Any:
    """``trial.suggest_*`` for an Optuna distribution."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def _same(a: Any, b: Any) -> bool:
    """Equal as NNI values (floats within a relative 1e-9)."""
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
                and not isinstance(b, bool) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))
    return canonical_json(a) == canonical_json(b)


@dataclass(frozen=True)
class Dimension:
    """One key of an NNI search space and how Optuna samples it.

    Attributes:
        name: the search-space key.
        type: NNI's ``_type``.
        param: Optuna's parameter name (the key; ``outer/option/key`` inside a nested choice).
        distribution: the ``optuna.distributions`` object of ``param``.
        choices: for a ``choice`` over values that are not all None/bool/int/float/str, the values; the
            distribution then samples their index. ``None`` otherwise.
        options: for a nested choice, ``((name, {key: Dimension}), ...)``; the distribution samples the name.
        low, high: bounds of ``uniform``/``quniform``/``loguniform``/``qloguniform`` (the clip of the q types).
        q: the step of the ``q`` types.
        mu, sigma: of the normal types (of the logarithm for ``lognormal``/``qlognormal``).
    """

    name: str
    type: str
    param: str
    distribution: Any
    choices: tuple[Any, ...] | None = None
    options: tuple[tuple[str, dict[str, "Dimension"]], ...] | None = None
    low: float | None = None
    high: float | None = None
    q: float | None = None
    mu: float | None = None
    sigma: float | None = None

    @property
    def _normal(self) -> bool:
        return "normal" in self.type

    @property
    def _log(self) -> bool:
        return "log" in self.type

    def decode(self, sampled: Any) -> Any:
        """The NNI value of what Optuna sampled for :attr:`param` (a nested choice: the option's name only;
        :meth:`sample` fills in its keys). Index-coded choices give a deep copy."""
        if self.options is not None:
            return sampled
        if self.choices is not None:
            return copy.deepcopy(self.choices[sampled])
        if self.type in ("choice", "randint"):
            return sampled
        x = float(sampled)
        if self._normal:
            x = self.mu + self.sigma * _STD_NORMAL.inv_cdf(x)  # type: ignore[operator]
            if self._log:
                x = math.exp(x)
        if self.q is not None:
            clip = (None, None) if self._normal else (self.low, self.high)
            x = quantize(x, self.q, *clip)
        return x

    def sample(self, trial: Any) -> Any:
        """Sample this key on an Optuna trial (``trial.suggest_*``) and return the NNI value."""
        v = self.decode(_suggest(trial, self.param, self.distribution))
        if self.options is None:
            return v
        sub = dict(self.options)[v]
        return {"_name": v, **{k: d.sample(trial) for k, d in sub.items()}}

    def encode(self, value: Any) -> dict[str, tuple[Any, Any]]:
        """Optuna's parameters for an NNI value of this key: ``{param: (distribution, internal value)}``.

        Raises:
            SearchSpaceError: a value this key cannot take (the message names the key and the rule).
        """
        bad = SearchSpaceError
        if self.options is not None:
            names = [n for n, _ in self.options]
            if not isinstance(value, Mapping) or value.get("_name") not in names:
                raise bad(f"search-space key {self.name!r}: {value!r} is not one of the nested options "
                          f"{{'_name': one of {names}, ...}}")
            sub = dict(self.options)[value["_name"]]
            extra = sorted(set(value) - set(sub) - {"_name"})
            if extra:
                raise bad(f"search-space key {self.name!r}: option {value['_name']!r} has no keys {extra}")
            out = {self.param: (self.distribution, value["_name"])}
            for k, d in sub.items():
                if k not in value:
                    raise bad(f"search-space key {self.name!r}: option {value['_name']!r} lacks key {k!r}")
                out.update(d.encode(value[k]))
            return out
        if self.choices is not None:
            for i, c in enumerate(self.choices):
                if _same(c, value):
                    return {self.param: (self.distribution, i)}
            raise bad(f"search-space key {self.name!r}: {value!r} is not one of the choices {list(self.choices)}")
        if self.type == "choice":
            for c in self.distribution.choices:
                if _same(c, value):
                    return {self.param: (self.distribution, c)}
            raise bad(f"search-space key {self.name!r}: {value!r} is not one of the choices "
                      f"{list(self.distribution.choices)}")
        if not is_real(value) or not math.isfinite(value):
            raise bad(f"search-space key {self.name!r} ({self.type}): expected a finite number, got {value!r}")
        if self.type == "randint":
            d = self.distribution
            if int(value) != value or not d.low <= value <= d.high:
                raise bad(f"search-space key {self.name!r} (randint): {value!r} is not an int in "
                          f"[{d.low}, {d.high + 1})")
            return {self.param: (d, int(value))}
        internal: float
        if self._normal:
            target = float(value)
            if self._log and self.q is not None and target == 0:
                target = self.q / 4  # any exp(x) below q / 2 rounds to 0
            if self._log and target <= 0:
                raise bad(f"search-space key {self.name!r} ({self.type}): {value!r} is not > 0")
            z = ((math.log(target) if self._log else target) - self.mu) / self.sigma  # type: ignore[operator]
            internal = min(max(_STD_NORMAL.cdf(z), _P_EDGE), 1.0 - _P_EDGE)
        else:
            internal = float(value)
            if not self.low <= internal <= self.high:  # type: ignore[operator]
                raise bad(f"search-space key {self.name!r} ({self.type}): {value!r} is outside "
                          f"[{self.low}, {self.high}]")
        if not _same(self.decode(internal), float(value)):
            rule = f"round(x / {self.q}) * {self.q}" if self.q is not None else "its range"
            raise bad(f"search-space key {self.name!r} ({self.type}): {value!r} is not a value it takes "
                      f"({rule}{', clipped to [low, high]' if self.q is not None and not self._normal else ''})")
        return {self.param: (self.distribution, internal)}


def _numbers(key: str, typ: str, value: Any, n: int) -> list[float]:
    if not isinstance(value, (list, tuple)) or len(value) != n or any(
            not is_real(v) or not math.isfinite(v) for v in value):
        names = {2: "[low, high]", 3: "[low, high, q]"}[n] if "normal" not in typ else \
            {2: "[mu, sigma]", 3: "[mu, sigma, q]"}[n]
        raise SearchSpaceError(f"search-space key {key!r}: {typ} needs _value = {names}, {n} finite numbers, "
                               f"got {value!r}")
    return [float(v) for v in value]


def _is_nested(values: list[Any]) -> bool:
    """NNI's rule: a choice is nested when every option is a dict with ``_name``."""
    return all(isinstance(v, Mapping) and "_name" in v for v in values)


def _dimension(key: str, spec: Any, param: str) -> Dimension:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not isinstance(spec, Mapping) or "_type" not in spec or "_value" not in spec:
        raise SearchSpaceError(f"search-space key {key!r} must be {{'_type': ..., '_value': [...]}}, got {spec!r}")
    typ, value = spec["_type"], spec["_value"]
    if typ not in SUPPORTED_TYPES:
        raise SearchSpaceError(f"search-space key {key!r}: _type {typ!r} is not one of NNI's types "
                               f"{SUPPORTED_TYPES}")
    if typ == "choice":
        if not isinstance(value, (list, tuple)) or not value:
            raise SearchSpaceError(f"search-space key {key!r}: choice needs a non-empty _value list, got {value!r}")
        if _is_nested(value):
            names = [v["_name"] for v in value]
            if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
                raise SearchSpaceError(f"search-space key {key!r}: the options of a nested choice need distinct, "
                                       f"non-empty string _name values, got {names}")
            options = tuple((n, _parse(v, prefix=f"{param}/{n}/", where=f"{key}[{n}]", nested=True))
                            for n, v in zip(names, value))
            return Dimension(key, typ, param, CategoricalDistribution(names), options=options)
        texts = [canonical_json(v) for v in value]
        if len(set(texts)) != len(texts):
            raise SearchSpaceError(f"search-space key {key!r}: choice values must be distinct, got {value!r}")
        if all(isinstance(v, _PRIMITIVE) for v in value):
            return Dimension(key, typ, param, CategoricalDistribution(list(value)))
        return Dimension(key, typ, param, CategoricalDistribution(list(range(len(value)))),
                         choices=tuple(copy.deepcopy(list(value))))
    q_type = typ.startswith("q")
    nums = _numbers(key, typ, value, 3 if q_type else 2)
    if typ == "randint":
        lower, upper = math.ceil(nums[0]), math.ceil(nums[1])
        if upper - lower < 1:
            raise SearchSpaceError(f"search-space key {key!r}: randint [lower, upper) needs ceil(upper) > "
                                   f"ceil(lower), got {value!r}")
        return Dimension(key, typ, param, IntDistribution(lower, upper - 1))
    q = nums[2] if q_type else None
    if q is not None and q <= 0:
        raise SearchSpaceError(f"search-space key {key!r}: {typ} needs q > 0, got {value!r}")
    if "normal" in typ:
        mu, sigma = nums[0], nums[1]
        if sigma <= 0:
            raise SearchSpaceError(f"search-space key {key!r}: {typ} needs sigma > 0, got {value!r}")
        return Dimension(key, typ, param, FloatDistribution(_P_EDGE, 1.0 - _P_EDGE), q=q, mu=mu, sigma=sigma)
    low, high = nums[0], nums[1]
    log = "log" in typ
    if not low < high or (log and low <= 0):
        raise SearchSpaceError(f"search-space key {key!r}: {typ} needs {'0 < ' if log else ''}low < high, "
                               f"got {value!r}")
    return Dimension(key, typ, param, FloatDistribution(low, high, log=log), low=low, high=high, q=q)


def _parse(space: Mapping[str, Any], *, prefix: str = "", where: str = "the NNI search space",
           nested: bool = False) -> dict[str, Dimension]:
    keys = [k for k in space if not (nested and k == "_name")]
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if bad:
        raise SearchSpaceError(f"{where}: keys must be non-empty strings, got {bad}")
    return {k: _dimension(k, space[k], prefix + k) for k in keys}


def parse_search_space(search_space: Mapping[str, Any]) -> dict[str, Dimension]:
    """NNI's search-space JSON as :class:`Dimension` objects, in key order.

    Raises:
        SearchSpaceError: not a mapping, empty, the reserved key ``"dippm"``, or a key of an unknown type or
            a malformed ``_value`` (the message names the key, the rule and the supported types).
    """
    if not isinstance(search_space, Mapping) or not search_space:
        raise SearchSpaceError(f"the NNI search space must be a non-empty mapping, got {search_space!r}")
    if PARAMETERS_KEY in search_space:
        raise SearchSpaceError(f"search-space key {PARAMETERS_KEY!r} is reserved for the tuner's model description")
    dims = _parse(search_space)
    params: list[str] = []

    def walk(ds: Mapping[str, Dimension]) -> None:
        for d in ds.values():
            params.append(d.param)
            for _, sub in d.options or ():
                walk(sub)

    walk(dims)
    dup = sorted({p for p in params if params.count(p) > 1})
    if dup:
        raise SearchSpaceError(f"the search space's keys give the same Optuna parameter names {dup} (a nested "
                               "option's key is named 'outer/option/key'); rename a key or an option")
    return dims


def model_from_parameters(parameters: Mapping[str, Any], *, seed: int | None = 0) -> tuple[Any, InputSpec]:
    """Build the model a :class:`HardwareAwareTuner` trial's parameters describe.

    The tuner puts the model description under ``parameters["dippm"]``: for a registered search space
    ``{"search_space": name, "config": {...}, "batch_size": n, "dtype": ...}`` (this builds
    ``search_spaces.build_model(name, config)``), for a model factory ``{"model_factory":
    "package.module:callable", "model_params": {...}, "input": InputSpec.to_dict()}`` (this calls the
    factory with ``model_params``). Either way it is the model and spec the tuner predicted.

    Args:
        parameters: what ``nni.get_next_parameter()`` returned in the trial.
        seed: torch seed of the weight initialisation (``None``: leave the RNG alone); for a search
            space see :meth:`search_spaces.SearchSpace.build`, for a factory ``torch.manual_seed(seed)`` is
            called before it.

    Returns:
        ``(model, spec)``: the ``nn.Module`` (eval mode) and its :class:`InputSpec`.

    Raises:
        SearchSpaceError: no ``"dippm"`` entry (the parameters did not come from the tuner), an unknown
            search space (the registered ones are listed) or a config outside it.
        ModelSpecError: a model factory that cannot be loaded, raises, or returns no ``nn.Module``.
    """
    if not isinstance(parameters, Mapping) or not isinstance(parameters.get(PARAMETERS_KEY), Mapping):
        keys = sorted(parameters) if isinstance(parameters, Mapping) else type(parameters).__name__
        raise SearchSpaceError(
            f"trial parameters must hold a {PARAMETERS_KEY!r} entry written by dippm_nas.nni.HardwareAwareTuner "
            f"(search_space and config, or model_factory and model_params); got keys {keys}"
        )
    d = parameters[PARAMETERS_KEY]
    if "model_factory" in d:
        missing = [k for k in ("model_params", "input") if k not in d]
        if missing:
            raise SearchSpaceError(f"parameters[{PARAMETERS_KEY!r}] lacks {missing}; it has {sorted(d)}")
        model = build_from_factory(load_factory(d["model_factory"]), d["model_factory"], d["model_params"],
                                   seed=seed)
    else:
        missing = [k for k in ("search_space", "config", "batch_size") if k not in d]
        if missing:
            raise SearchSpaceError(f"parameters[{PARAMETERS_KEY!r}] lacks {missing}; it has {sorted(d)}")
        model = search_spaces.get_space(d["search_space"]).build(d["config"], seed=seed)
    spec = spec_from_parameters(parameters)
    assert spec is not None
    return model, spec


def spec_from_parameters(parameters: Mapping[str, Any]) -> InputSpec | None:
    """The :class:`InputSpec` the tuner predicted a trial's model with (``None`` when the parameters do not
    describe one): ``InputSpec.from_dict(params["dippm"]["input"])`` for a model factory, the search space's
    ``input_spec(config, batch_size, dtype)`` for a builder (dtype ``float32`` when absent).

    Raises:
        SearchSpaceError: an unknown search space or a config outside it.
        InputSpecError: a malformed input description.
    """
    if not isinstance(parameters, Mapping) or not isinstance(parameters.get(PARAMETERS_KEY), Mapping):
        return None
    d = parameters[PARAMETERS_KEY]
    if isinstance(d.get("input"), Mapping):
        try:
            return InputSpec.from_dict(d["input"])
        except (KeyError, TypeError, ValueError) as e:
            raise InputSpecError(f"parameters[{PARAMETERS_KEY!r}]['input'] is not an InputSpec.to_dict(): "
                                 f"{d['input']!r} ({type(e).__name__}: {e})") from e
    if "search_space" in d and "config" in d and "batch_size" in d:
        space = search_spaces.get_space(d["search_space"])
        batch_size = as_int(d["batch_size"], f"parameters[{PARAMETERS_KEY!r}]['batch_size']", low=1,
                            error=InputSpecError)
        return space.input_spec(d["config"], batch_size=batch_size, dtype=d.get("dtype", "float32"))
    return None


def load_factory(factory: str) -> Any:
    """The callable a ``model_factory`` string names (see :func:`dippm_nas.capture.load_callable`).

    Raises:
        ModelSpecError: not ``package.module:callable``, a module that cannot be imported, a missing name
            (the module's callables are listed), or a standard-library callable.
    """
    return load_callable(factory, what="model_factory", returns="an nn.Module from the NNI parameter dict")


def build_from_factory(fn: Any, factory: str, params: Mapping[str, Any], *, seed: int | None = 0) -> Any:
    """``fn(params)`` checked: an ``nn.Module`` in eval mode.

    Raises:
        ModelSpecError: the factory raised, or returned something other than an ``nn.Module``.
    """
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    try:
        model = fn(copy.deepcopy(dict(params)))
    except Exception as e:  # noqa: BLE001 - whatever user code raises is the factory's error
        raise ModelSpecError(f"model_factory {factory!r} raised {type(e).__name__}: {e} "
                             f"(parameters {canonical_json(params)})") from e
    if not isinstance(model, torch.nn.Module):
        raise ModelSpecError(f"model_factory {factory!r} returned {type(model).__name__}, expected a "
                             "torch.nn.Module")
    return model.eval()
