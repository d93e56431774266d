"""The exception hierarchy of dippm-nas.

Every error the library raises on purpose derives from :class:`DippmNasError`, so a search loop can
catch one class; errors of bad values are also :class:`ValueError` (:class:`InvalidValueError` and the
specific ones) and errors of wrong types are also :class:`TypeError` (:class:`InvalidTypeError`), as Python
users expect. Messages state the rule that was broken, the offending value and
the valid choices or a hint. Third-party errors are wrapped ``from e`` so their traceback is kept.
"""

from __future__ import annotations

__all__ = [
    "DippmNasError",
    "InvalidValueError",
    "InvalidTypeError",
    "InputSpecError",
    "InputShapeError",
    "ModelSpecError",
    "GraphCaptureError",
    "GraphValidationError",
    "UnsupportedOpError",
    "CacheError",
    "ValidationError",
    "DeviceError",
    "ExecutionRuntimeError",
    "DeploymentError",
    "UnsupportedDtypeError",
    "MeasurementError",
    "OutOfMemoryError",
    "CheckpointError",
    "SearchSpaceError",
    "MissingDependencyError",
    "BudgetError",
    "DatasetError",
    "AdaptationError",
]


class DippmNasError(Exception):
    """Root of every error raised by dippm-nas."""


class InvalidValueError(DippmNasError, ValueError):
    """A value given to dippm-nas breaks a rule; the message states the rule, the value and the choices.

    The more specific errors of bad values (:class:`InputSpecError`, :class:`DeviceError`,
    :class:`BudgetError`...) are also :class:`ValueError`; this one covers the other arguments and fields.
    """


class InvalidTypeError(DippmNasError, TypeError):
    """An argument or field given to dippm-nas has the wrong type; the message states the expected type and
    the value given."""


class InputSpecError(DippmNasError, ValueError):
    """An :class:`~dippm_nas.InputSpec` is malformed (shape, batch size, dtype, names)."""


class UnsupportedDtypeError(InputSpecError):
    """A dtype that dippm-nas (or the chosen device) cannot handle."""


class ModelSpecError(DippmNasError, ValueError):
    """A model SPEC string (``torchvision:NAME``, ``timm:NAME``, ``path.onnx``, ``pkg.mod:callable``) is invalid."""


class GraphCaptureError(DippmNasError):
    """The model could not be exported or converted to a Relax operator graph."""


class GraphValidationError(DippmNasError, ValueError):
    """An :class:`~dippm_nas.graph.OperatorGraph` breaks one of its invariants."""


class UnsupportedOpError(DippmNasError):
    """An operator has no encoder or formula where one is strictly required."""


class CacheError(DippmNasError):
    """The conversion cache could not be opened or used."""


class ValidationError(DippmNasError):
    """Measuring predictions against the hardware (:mod:`dippm_nas.validation`) was given an invalid
    argument, or its job queue could not be opened or used. (Not :class:`GraphValidationError`.)"""


class DeviceError(DippmNasError, ValueError):
    """An unknown device id or an invalid device description."""


class ExecutionRuntimeError(DippmNasError, ValueError):
    """An unknown execution runtime (``"eager"``, ``"cuda-graphs"``, ``"compiled"``)."""


class DeploymentError(DippmNasError, ValueError):
    """A :class:`~dippm_nas.Deployment` (how inference runs) names an unknown choice, has a wrong type, or its
    file cannot be read."""


class MeasurementError(DippmNasError):
    """A measurement could not be taken."""


class OutOfMemoryError(MeasurementError):
    """The model did not fit on the device during a measurement."""


class CheckpointError(DippmNasError):
    """A predictor checkpoint is missing, malformed or has an incompatible feature schema."""


class SearchSpaceError(DippmNasError, ValueError):
    """A search-space builder name is unknown or a config lies outside its space."""


class MissingDependencyError(DippmNasError, ImportError):
    """An optional dependency is needed for this feature; the message names the extra to install."""


class InputShapeError(InputSpecError):
    """The input shape of an :class:`~dippm_nas.InputSpec` does not fit the model."""


class BudgetError(DippmNasError, ValueError):
    """A hardware budget or its ``k_sigma`` is invalid (:class:`~dippm_nas.budgets.Budgets`)."""


class DatasetError(DippmNasError, ValueError):
    """A dataset file cannot be opened or read (schema version, format), an importer's CSV lacks
    columns, or a build was asked for with invalid arguments."""


class AdaptationError(DippmNasError):
    """An adaptation store cannot be opened, read or written (:mod:`dippm_nas.predictor`'s ``adapt``)."""
