"""What a row of the conversion cache is, without SQLAlchemy: the table and column names, the payload envelope
that binds a graph to its key (and signs it), and the decoding of a row back into a validated graph.

:mod:`~dippm_nas.cache._store` (the SQLAlchemy store) builds its table from these names and writes and reads
payloads with these functions; :mod:`~dippm_nas.cache._read` reads a row of the default SQLite file with the
standard library's ``sqlite3`` through the same ones. See :mod:`~dippm_nas.cache._store` for the layout.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import zlib

from dippm_nas._compress import InflateRefused, inflate
from dippm_nas.errors import CacheError, GraphValidationError
from dippm_nas.graph import GRAPH_FORMAT_VERSION, OperatorGraph

__all__ = ["TABLE_NAME", "CACHE_SECRET_ENV", "COLUMNS", "MAX_GRAPH_JSON_BYTES"]

#: Name of the SQL table (shared databases may hold other dippm-nas tables).
TABLE_NAME = "dippm_conversion_cache"
#: Environment variable holding the secret that signs rows (HMAC-SHA256) and rejects unsigned or foreign ones.
CACHE_SECRET_ENV = "DIPPM_NAS_CACHE_SECRET"
#: The table's columns, in order (the store's table is built from these names).
COLUMNS: tuple[str, ...] = ("key", "payload", "structural_hash", "size_bytes", "created_at", "last_used_at",
                            "format_version", "dippm_nas_version")

_MAX_KEY_CHARS = 255

#: The largest graph JSON a row may hold, bytes: a row is inflated at most this far, so a small stream that
#: inflates to gigabytes (4 MB of zlib -> 4 GiB) is a corrupt row, not an allocation; :meth:`ConversionCache.put`
#: keeps a larger graph in its process only. Graph JSON takes 230-320 bytes per operator node
#: (``tests/data/inference_graphs.json.xz``), so this is ~200,000 nodes, 150x the 1,388 of a 7-billion-parameter
#: decoder (docs/reliability.md, row 5g).
MAX_GRAPH_JSON_BYTES = 64 * 1024**2
#: Room for the binding line ahead of the graph JSON in the inflated stream, bytes (a 255-character key,
#: JSON-escaped, and a 64-character hash).
_BINDING_ROOM = 4096

#: Envelope of a payload: magic, envelope version, flags, key length; then the key, the signature when
#: signed, then the zlib stream. Version 2: the stream starts with the binding line (:func:`_body`).
_MAGIC = b"DPMC"
_ENVELOPE_VERSION = 2
_HEADER = struct.Struct(">4sBBH")
_SIGNED = 1
_MAC_BYTES = 32
_ZLIB_LEVEL = 6


class _CorruptRow(Exception):
    """A stored row that cannot be turned back into a valid graph; the message says why."""


def _mac(secret: bytes, key: str, structural_hash: str, format_version: int, body: bytes) -> bytes:
    msg = b"\x00".join((b"dippm-nas conversion cache", key.encode(), structural_hash.encode(),
                        str(format_version).encode(), body))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _envelope(key: str, structural_hash: str, format_version: int, body: bytes, secret: bytes | None) -> bytes:
    """The stored payload of zlib stream ``body``: the envelope binding it to ``key`` (signed with ``secret``)."""
    k = key.encode()
    head = _HEADER.pack(_MAGIC, _ENVELOPE_VERSION, _SIGNED if secret else 0, len(k)) + k
    if secret:
        head += _mac(secret, key, structural_hash, format_version, body)
    return head + body


def _open_envelope(payload: bytes, key: str, structural_hash: str, format_version: int,
                   secret: bytes | None) -> bytes:
    """The zlib stream of a stored payload, after checking its key and (with a secret) its signature.

    Raises:
        _CorruptRow: no envelope, another key, an unsigned row while a secret is set, a bad signature.
    """
    if len(payload) < _HEADER.size or payload[:4] != _MAGIC:
        raise _CorruptRow("its payload has no key envelope (written by another program or an older dippm-nas)")
    magic, version, flags, n = _HEADER.unpack_from(payload)
    if version != _ENVELOPE_VERSION:
        raise _CorruptRow(f"its payload envelope has version {version}, this dippm-nas reads {_ENVELOPE_VERSION}")
    at = _HEADER.size + n
    stored_key = payload[_HEADER.size:at].decode("utf-8", "replace")
    if stored_key != key:
        raise _CorruptRow(f"its payload was written under another key ({stored_key!r}): the row holds another "
                          "model's graph")
    mac = None
    if flags & _SIGNED:
        mac, at = payload[at:at + _MAC_BYTES], at + _MAC_BYTES
    body = payload[at:]
    if secret:
        if mac is None:
            raise _CorruptRow(f"it is not signed and {CACHE_SECRET_ENV} is set (only signed rows are trusted)")
        if not hmac.compare_digest(mac, _mac(secret, key, structural_hash, format_version, body)):
            raise _CorruptRow(f"its signature does not match this process's {CACHE_SECRET_ENV} (signed with "
                              "another secret, or changed after signing)")
    return body


def _body(key: str, structural_hash: str, text: bytes) -> bytes:
    """The zlib stream of a row: a binding line, the JSON of the graph's key and structural hash, then the graph
    JSON ``text``. The graph's own fingerprint travels inside the compressed stream: re-wrapping another row's
    stream under this key (a row edit) leaves that row's key and hash inside it, which :func:`_decode` rejects."""
    line = json.dumps({"key": key, "structural_hash": structural_hash}, sort_keys=True).encode() + b"\n"
    return zlib.compress(line + text, _ZLIB_LEVEL)


def _pack(key: str, structural_hash: str, format_version: int, text: bytes, secret: bytes | None) -> bytes:
    """The stored payload of graph JSON ``text``: envelope and binding line (see :func:`_body`)."""
    return _envelope(key, structural_hash, format_version, _body(key, structural_hash, text), secret)


def _inflate(body: bytes) -> bytes:
    """The inflated zlib stream ``body``, at most :data:`MAX_GRAPH_JSON_BYTES` (+ the binding line).

    Raises:
        _CorruptRow: not a whole zlib stream, or one that inflates beyond the cap.
    """
    cap = MAX_GRAPH_JSON_BYTES + _BINDING_ROOM
    try:
        out = inflate(body, cap)
    except InflateRefused as e:
        if e.too_big:
            raise _CorruptRow(f"its payload inflates beyond {cap:,} bytes (a graph JSON may hold at most "
                              f"MAX_GRAPH_JSON_BYTES = {MAX_GRAPH_JSON_BYTES:,} bytes; a row is never inflated "
                              "further)") from e
        raise _CorruptRow(f"its payload is not a zlib stream ({e.reason})") from e
    return out


def _unbind(key: str, structural_hash: str, inflated: bytes) -> bytes:
    """The graph JSON of an inflated stream, after checking its binding line names ``key`` and ``structural_hash``.

    Raises:
        _CorruptRow: no binding line, or one of another key or graph.
    """
    line, sep, text = inflated.partition(b"\n")
    try:
        bound = json.loads(line) if sep else None
    except ValueError:
        bound = None
    if not isinstance(bound, dict) or not isinstance(bound.get("key"), str):
        raise _CorruptRow("its zlib stream does not start with the key and hash binding line")
    if bound["key"] != key:
        raise _CorruptRow(f"its graph was written under another key ({bound['key']!r}; the envelope was "
                          "rewritten): the row holds another model's graph")
    if bound.get("structural_hash") != structural_hash:
        raise _CorruptRow(f"its graph is bound to structural hash {str(bound.get('structural_hash'))[:12]}..., "
                          f"the row says {str(structural_hash)[:12]}...")
    return text


def _decode(key: str, payload: object, structural_hash: str, format_version: int,
            secret: bytes | None) -> tuple[OperatorGraph, int]:
    """A stored row -> validated graph and the length of its JSON text.

    Raises:
        _CorruptRow: for any reason the row cannot be trusted (a payload that is not a BLOB among them).
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        kind = "TEXT" if isinstance(payload, str) else type(payload).__name__
        raise _CorruptRow(f"its payload is {kind}, not a BLOB (written by another program)")
    if format_version != GRAPH_FORMAT_VERSION:
        raise _CorruptRow(
            f"it was written with graph format version {format_version!r}, this dippm-nas reads "
            f"version {GRAPH_FORMAT_VERSION}"
        )
    body = _open_envelope(bytes(payload), key, structural_hash, format_version, secret)
    text = _unbind(key, structural_hash, _inflate(body))
    try:
        graph = OperatorGraph.from_json(text)
    except GraphValidationError as e:
        raise _CorruptRow(f"its graph JSON is invalid ({e})") from e
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise _CorruptRow(f"its payload is not a graph JSON document ({type(e).__name__}: {e})") from e
    try:
        graph.validate()
    except GraphValidationError as e:
        raise _CorruptRow(f"its graph fails validation ({e})") from e
    if graph.structural_hash() != structural_hash:
        raise _CorruptRow(f"its graph's structural hash {graph.structural_hash()[:12]}... is not the row's "
                          f"{str(structural_hash)[:12]}...")
    return graph, len(text)


def _secret_bytes(secret: str | bytes | None) -> bytes | None:
    """The signing secret: ``secret``, else ``$DIPPM_NAS_CACHE_SECRET``; ``None`` when empty."""
    if secret is None:
        secret = os.environ.get(CACHE_SECRET_ENV, "")
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, bytes):
        raise CacheError(f"secret must be a str, bytes or None, got {type(secret).__name__}")
    return secret or None
