"""The dataset's exception: a bad dataset file, schema, CSV header or build argument."""

from __future__ import annotations

from dippm_nas.errors import DippmNasError

__all__ = ["DatasetError"]


class DatasetError(DippmNasError, ValueError):
    """A dataset file cannot be opened or read (schema version, format), an importer's CSV lacks
    columns, or a build was asked for with invalid arguments."""
