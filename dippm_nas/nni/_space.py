"""NNI search spaces as Optuna distributions, and the model a trial's parameters describe.

The tuner receives NNI's search-space JSON (``{"key": {"_type": ..., "_value": [...]}}``) and samples it
with Optuna; this module converts between the two and splits a sample into the config of a registered
search-space builder (:mod:`search_spaces`) and the other hyper-parameters.

Supported NNI types and their Optuna distribution:

==============  ==========================================  ============================================
NNI ``_type``   ``_value``                                  Optuna
==============  ==========================================  ============================================
choice          ``[v0, v1, ...]`` (any JSON values)         ``CategoricalDistribution`` (of the values
                                                            when all are None/bool/int/float/str, of
                                                            their indices otherwise, e.g. lists)
randint         ``[lower, upper)``                          ``IntDistribution(lower, upper - 1)``
uniform         ``[low, high]``                             ``FloatDistribution(low, high)``
quniform        ``[low, high, q]``                          ``FloatDistribution(low, high, step=q)``
loguniform      ``[low, high]``                             ``FloatDistribution(low, high, log=True)``
==============  ==========================================  ============================================

``qloguniform``, ``normal``, ``qnormal``, ``lognormal``, ``qlognormal`` and nested choices have no Optuna
distribution and are rejected with the list above.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dippm_nas._json import canonical_json
from dippm_nas.errors import SearchSpaceError
from dippm_nas.spec import InputSpec
import search_spaces

__all__ = ["Dimension", "parse_search_space", "PARAMETERS_KEY", "model_from_parameters", "SUPPORTED_TYPES",
           "canonical_json"]

#: NNI search-space types the tuner can sample.
SUPPORTED_TYPES: tuple[str, ...] = ("choice", "randint", "uniform", "quniform", "loguniform")

#: The key of a trial's parameters under which the tuner says how to build the model.
PARAMETERS_KEY = "dippm"

_PRIMITIVE = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Dimension:
    """One key of an NNI search space as an Optuna distribution.

    Attributes:
        name: the search-space key.
        distribution: the ``optuna.distributions`` object sampled.
        choices: for a ``choice`` over non-primitive values (lists, dicts), the values; the distribution
            then samples their index. ``None`` otherwise.
    """

    name: str
    distribution: Any
    choices: tuple[Any, ...] | None = None

    def decode(self, sampled: Any) -> Any:
        """The NNI value of what Optuna sampled (a deep copy for index-coded choices)."""
        if self.choices is not None:
            return copy.deepcopy(self.choices[sampled])
        return sampled


def _numbers(key: str, typ: str, value: Any, n: int) -> list[float]:
    if not isinstance(value, (list, tuple)) or len(value) != n or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value):
        raise SearchSpaceError(f"search-space key {key!r}: {typ} needs _value = {n} finite numbers, got {value!r}")
    return list(value)


def _dimension(key: str, spec: Any) -> Dimension:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not isinstance(spec, Mapping) or "_type" not in spec or "_value" not in spec:
        raise SearchSpaceError(f"search-space key {key!r} must be {{'_type': ..., '_value': [...]}}, got {spec!r}")
    typ, value = spec["_type"], spec["_value"]
    if typ == "choice":
        if not isinstance(value, (list, tuple)) or not value:
            raise SearchSpaceError(f"search-space key {key!r}: choice needs a non-empty _value list, got {value!r}")
        if any(isinstance(v, Mapping) and "_name" in v for v in value):
            raise SearchSpaceError(f"search-space key {key!r}: nested choices ('_name') are not supported; "
                                   f"supported types: {SUPPORTED_TYPES}")
        texts = [canonical_json(v) for v in value]
        if len(set(texts)) != len(texts):
            raise SearchSpaceError(f"search-space key {key!r}: choice values must be distinct, got {value!r}")
        if all(isinstance(v, _PRIMITIVE) for v in value):
            return Dimension(key, CategoricalDistribution(list(value)))
        return Dimension(key, CategoricalDistribution(list(range(len(value)))), tuple(copy.deepcopy(list(value))))
    if typ == "randint":
        lo, hi = _numbers(key, typ, value, 2)
        if int(lo) != lo or int(hi) != hi or hi - lo < 1:
            raise SearchSpaceError(f"search-space key {key!r}: randint needs integers lower < upper, got {value!r}")
        return Dimension(key, IntDistribution(int(lo), int(hi) - 1))
    if typ in ("uniform", "loguniform"):
        lo, hi = _numbers(key, typ, value, 2)
        if not lo < hi or (typ == "loguniform" and lo <= 0):
            raise SearchSpaceError(f"search-space key {key!r}: {typ} needs {'0 < ' if typ == 'loguniform' else ''}"
                                   f"low < high, got {value!r}")
        return Dimension(key, FloatDistribution(float(lo), float(hi), log=typ == "loguniform"))
    if typ == "quniform":
        lo, hi, q = _numbers(key, typ, value, 3)
        if not lo < hi or q <= 0:
            raise SearchSpaceError(f"search-space key {key!r}: quniform needs low < high and q > 0, got {value!r}")
        steps = (hi - lo) / q
        if abs(steps - round(steps)) > 1e-9 * max(1.0, steps):
            raise SearchSpaceError(f"search-space key {key!r}: quniform needs high - low to be a multiple of q, "
                                   f"got {value!r}")
        return Dimension(key, FloatDistribution(float(lo), float(hi), step=float(q)))
    raise SearchSpaceError(f"search-space key {key!r}: _type {typ!r} is not supported; supported types: "
                           f"{SUPPORTED_TYPES}")


def parse_search_space(search_space: Mapping[str, Any]) -> dict[str, Dimension]:
    """NNI's search-space JSON as :class:`Dimension` objects, in key order.

    Raises:
        SearchSpaceError: not a mapping, empty, the reserved key ``"dippm"``, or a key of an unsupported
            type or malformed ``_value`` (the message names the key and the supported types).
    """
    if not isinstance(search_space, Mapping) or not search_space:
        raise SearchSpaceError(f"the NNI search space must be a non-empty mapping, got {search_space!r}")
    if PARAMETERS_KEY in search_space:
        raise SearchSpaceError(f"search-space key {PARAMETERS_KEY!r} is reserved for the tuner's model description")
    return {str(k): _dimension(str(k), v) for k, v in search_space.items()}


def model_from_parameters(parameters: Mapping[str, Any], *, seed: int | None = 0) -> tuple[Any, InputSpec]:
    """Build the model a :class:`HardwareAwareTuner` trial's parameters describe.

    The tuner puts ``{"search_space": name, "config": {...}, "batch_size": n, "dtype": ...}`` under
    ``parameters["dippm"]``; this builds ``search_spaces.build_model(name, config)`` and its input spec,
    the same model and spec the tuner predicted.

    Args:
        parameters: what ``nni.get_next_parameter()`` returned in the trial.
        seed: torch seed of the weight initialisation (see :meth:`search_spaces.SearchSpace.build`).

    Returns:
        ``(model, spec)``: the ``nn.Module`` (eval mode) and its :class:`InputSpec`.

    Raises:
        SearchSpaceError: no ``"dippm"`` entry (the parameters did not come from the tuner), an unknown
            search space (the registered ones are listed) or a config outside it.
    """
    if not isinstance(parameters, Mapping) or not isinstance(parameters.get(PARAMETERS_KEY), Mapping):
        keys = sorted(parameters) if isinstance(parameters, Mapping) else type(parameters).__name__
        raise SearchSpaceError(
            f"trial parameters must hold a {PARAMETERS_KEY!r} entry written by dippm_nas.nni.HardwareAwareTuner "
            f"(search_space, config, batch_size); got keys {keys}"
        )
    d = parameters[PARAMETERS_KEY]
    missing = [k for k in ("search_space", "config", "batch_size") if k not in d]
    if missing:
        raise SearchSpaceError(f"parameters[{PARAMETERS_KEY!r}] lacks {missing}; it has {sorted(d)}")
    space = search_spaces.get_space(d["search_space"])
    model = space.build(d["config"], seed=seed)
    spec = space.input_spec(d["config"], batch_size=int(d["batch_size"]), dtype=d.get("dtype", "float32"))
    return model, spec
