"""zlib streams of the stores: written at one level, read back to at most a stated number of bytes.

The conversion cache, the dataset file and the adaptation store keep graphs as zlib-compressed JSON. A stored
stream is data someone else may have written: 4 MB of zlib can inflate to 4 GiB, so a stream is inflated to at
most a cap the caller states, and one that inflates further is refused before it is held in memory.
"""

from __future__ import annotations

import zlib

__all__ = ["ZLIB_LEVEL", "deflate", "inflate", "InflateRefused"]

#: zlib level of every stored stream: zlib's own default (``Z_DEFAULT_COMPRESSION`` is level 6).
ZLIB_LEVEL = 6


class InflateRefused(Exception):
    """Why a stream is not inflated: :attr:`reason` (the zlib error, ``"truncated"``, or the cap it passes)
    follows the caller's name of the stream; :attr:`too_big` tells a stream over the cap from a broken one."""

    def __init__(self, reason: str, *, too_big: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_big = too_big


def deflate(data: bytes) -> bytes:
    """``data`` as one zlib stream at :data:`ZLIB_LEVEL`."""
    return zlib.compress(data, ZLIB_LEVEL)


def inflate(data: bytes | bytearray | memoryview, cap_bytes: int) -> bytes:
    """The whole zlib stream ``data`` inflated, at most ``cap_bytes`` of it.

    Raises:
        InflateRefused: ``data`` is not a zlib stream (not bytes, a bad header or checksum), the stream is
            truncated, or it inflates beyond ``cap_bytes`` (``too_big``; nothing past ``cap_bytes + 1`` bytes is
            inflated).
    """
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, cap_bytes + 1)
    except (zlib.error, TypeError) as e:
        raise InflateRefused(f"{type(e).__name__}: {e}" if isinstance(e, TypeError) else str(e)) from e
    if len(out) > cap_bytes or d.unconsumed_tail:
        raise InflateRefused(f"it inflates beyond {cap_bytes:,} bytes", too_big=True)
    if not d.eof:
        raise InflateRefused("truncated")
    return out
