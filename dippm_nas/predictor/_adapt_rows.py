"""The stored form of adaptations, without SQLAlchemy: table names, checksums, and a stored row read back checked.

Two tables hold an adaptation store (:mod:`~dippm_nas.predictor._adapt_store`): ``dippm_adaptation_rows`` (the
measured rows) and ``dippm_adaptation_versions`` (the fitted versions), beside ``dippm_adaptation_meta`` (the
store's ``schema_version``).

**Checksums.** Every measured row and every version carries a keyed SHA-256 (HMAC-SHA256) whose key is the
adaptation key's digest (and the store's schema version), over length-prefixed fields:

- a row: its graph digest, its compressed graph JSON and its labels JSON (:func:`row_checksum`);
- a version: the checkpoint hash it was fitted on, its row count, its meta JSON and its arrays
  (:func:`version_checksum`).

A loader recomputes the checksum with the digest of the key *it asks for*, so a row or a version copied from
another key, a field edited by hand or by a tool that recomputes a plain SHA-256, and damage on disk are all
detected: the version is set aside (flagged) and a row is left out of the fit (flagged). The checksum is not a
signature: it has no secret, and anyone who can run this code (or read it) can compute a valid one for edited
contents. It protects against accidents, mix-ups and careless edits, not against someone who writes to the
database on purpose with this code at hand.

**Bounded reads.** A version's meta JSON is read nested at most :data:`~dippm_nas._json.MAX_JSON_DEPTH` levels and
at most :data:`MAX_META_CHARS` long; its ``.npz`` arrays are read member by member from their headers, each a
float64 array of at most :data:`MAX_ARRAY_ELEMENTS` elements whose declared size is the size stored (a header
declaring 10**13 elements is refused before anything is allocated), never with pickle.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import math
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dippm_nas._paths import cache_dir
from dippm_nas.errors import AdaptationError

__all__ = ["ROWS_TABLE", "VERSIONS_TABLE", "META_TABLE", "ADAPT_FILE_NAME", "SCHEMA_VERSION", "MAX_ARRAY_ELEMENTS",
           "MAX_ARRAYS_BYTES", "MAX_META_CHARS", "StoredAdaptation", "default_adapt_url", "row_checksum",
           "version_checksum", "stored_adaptation", "read_arrays"]

#: Table of the measured rows.
ROWS_TABLE = "dippm_adaptation_rows"
#: Table of the fitted versions.
VERSIONS_TABLE = "dippm_adaptation_versions"
#: Key/value table of the store (``schema_version``, ``created_by``).
META_TABLE = "dippm_adaptation_meta"
#: The SQLite file of the default store, in :func:`dippm_nas._paths.cache_dir`.
ADAPT_FILE_NAME = "adaptations.sqlite"
#: The layout of the tables and their checksums; a store of another version is refused.
SCHEMA_VERSION = 2
#: The most elements one stored array may hold: a head's arrays are ``[members, hidden + static]`` (under 10**4).
MAX_ARRAY_ELEMENTS = 10**6
#: The largest arrays blob read, bytes: 64 MiB.
MAX_ARRAYS_BYTES = 64 * 2**20
#: The longest meta JSON read, characters: 16 MiB (a version's is a few kB).
MAX_META_CHARS = 16 * 2**20
#: The most arrays one blob may hold (6 per target).
_MAX_MEMBERS = 64


def default_adapt_url() -> str:
    """``sqlite:///<cache_dir()>/adaptations.sqlite``."""
    return f"sqlite:///{cache_dir() / ADAPT_FILE_NAME}"


def _keyed(kind: str, key_digest: str, parts: Sequence[bytes]) -> str:
    """HMAC-SHA256 keyed by ``kind``, the schema version and ``key_digest``, over length-prefixed ``parts``."""
    h = hmac.new(f"dippm-nas adaptation {kind} {SCHEMA_VERSION}\0{key_digest}".encode(), digestmod=hashlib.sha256)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def row_checksum(key_digest: str, graph_digest: str, graph_json_z: bytes, labels_json: str) -> str:
    """The checksum of a measured row of the key ``key_digest`` (module docstring)."""
    return _keyed("row", key_digest, [graph_digest.encode(), bytes(graph_json_z), labels_json.encode()])


def version_checksum(key_digest: str, checkpoint_sha256: str, rows: int, meta_json: str, arrays: bytes) -> str:
    """The checksum of a stored version of the key ``key_digest`` (module docstring)."""
    return _keyed("version", key_digest, [checkpoint_sha256.encode(), str(int(rows)).encode(), meta_json.encode(),
                                          bytes(arrays)])


@dataclass(frozen=True)
class StoredAdaptation:
    """One stored version as read back, each column of its type (decoded by ``Adaptation.from_stored``).

    Attributes:
        version: its number.
        meta_json: the JSON part of the adaptation.
        arrays: the heads' arrays (``.npz``).
        checksum: :func:`version_checksum` as stored.
        key_json: the key it was stored under (canonical JSON).
        checkpoint_sha256: the checkpoint it was fitted on.
        rows: the distinct graphs it was fitted on.
    """

    version: int
    meta_json: str
    arrays: bytes
    checksum: str
    key_json: str
    checkpoint_sha256: str
    rows: int


#: The columns of a versions row, in the order :func:`stored_adaptation` takes them.
VERSION_COLUMNS = ("version", "meta_json", "arrays", "checksum", "key_json", "checkpoint_sha256", "rows")


def _column(name: str, value: Any, kind: type, limit: int | None = None) -> Any:
    """``value`` of a versions row's column ``name`` when it is a ``kind`` (bytes: also a buffer; int: not a bool),
    no longer than ``limit``; else :class:`AdaptationError` naming the column."""
    if kind is bytes and isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise AdaptationError(f"the stored version's column {name!r} holds {type(value).__name__}, not "
                              f"{kind.__name__}: the row is damaged")
    if limit is not None and len(value) > limit:
        raise AdaptationError(f"the stored version's column {name!r} is {len(value)} long, more than the {limit} "
                              "read: the row is damaged")
    return value


def stored_adaptation(row: Sequence[Any]) -> StoredAdaptation:
    """A versions row (the columns :data:`VERSION_COLUMNS`, in order) as a :class:`StoredAdaptation`.

    Raises:
        AdaptationError: a column of another type (text in ``arrays`` or ``version``...) or too long.
    """
    if len(row) != len(VERSION_COLUMNS):
        raise AdaptationError(f"a stored version has {len(row)} columns, expected {list(VERSION_COLUMNS)}")
    version, meta_json, arrays, checksum, key_json, checkpoint, rows = row
    return StoredAdaptation(
        version=_column("version", version, int), meta_json=_column("meta_json", meta_json, str, MAX_META_CHARS),
        arrays=_column("arrays", arrays, bytes, MAX_ARRAYS_BYTES), checksum=_column("checksum", checksum, str, 64),
        key_json=_column("key_json", key_json, str, MAX_META_CHARS),
        checkpoint_sha256=_column("checkpoint_sha256", checkpoint, str, 64), rows=_column("rows", rows, int))


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, max_elements: int) -> np.ndarray:
    """One ``.npy`` member of an ``.npz``: its header checked (float64, at most ``max_elements``, the declared size
    the stored size) before its data is read."""
    with zf.open(info) as f:
        major, _minor = np.lib.format.read_magic(f)
        if major == 1:
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif major == 2:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"array {info.filename!r} has .npy format {major}, not 1 or 2")
        if dtype != np.dtype("<f8"):
            raise ValueError(f"array {info.filename!r} is {dtype}, not float64")
        n = math.prod(int(d) for d in shape)
        if n > max_elements:
            raise ValueError(f"array {info.filename!r} declares {n} elements, at most {max_elements} are read")
        size = n * dtype.itemsize
        if info.file_size - f.tell() != size:
            raise ValueError(f"array {info.filename!r} declares {size} bytes of data, "
                             f"{info.file_size - f.tell()} are stored")
        data = f.read(size)
    if len(data) != size:
        raise ValueError(f"array {info.filename!r} holds {len(data)} bytes, its header declares {size}")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()


def read_arrays(blob: bytes, *, max_elements: int = MAX_ARRAY_ELEMENTS) -> dict[str, np.ndarray]:
    """The arrays of a stored ``.npz`` (module docstring: bounded, float64 only, no pickle).

    Raises:
        ValueError: a blob that is not such an ``.npz``, or an array beyond the bounds.
    """
    if not isinstance(blob, bytes):
        raise ValueError(f"the arrays are {type(blob).__name__}, not bytes")
    if len(blob) > MAX_ARRAYS_BYTES:
        raise ValueError(f"the arrays are {len(blob)} bytes, at most {MAX_ARRAYS_BYTES} are read")
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            infos = zf.infolist()
            if len(infos) > _MAX_MEMBERS:
                raise ValueError(f"the arrays hold {len(infos)} members, at most {_MAX_MEMBERS} are read")
            out = {}
            for info in infos:
                if not info.filename.endswith(".npy") or info.file_size > MAX_ARRAYS_BYTES:
                    raise ValueError(f"member {info.filename!r} of {info.file_size} bytes is not an array read")
                out[info.filename[:-4]] = _read_member(zf, info, max_elements)
            return out
    except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError, RuntimeError) as e:
        raise ValueError(f"the arrays are not an .npz ({type(e).__name__}: {e})") from e
