"""Unit conversion factors, named so that no bare ``1000`` or ``2**20`` stands in a formula.

``x_ms = x_s * MS_PER_S``; ``x_mib = x_bytes / BYTES_PER_MIB``; ``x_mib = x_gib * MIB_PER_GIB``.
Memory units are binary (KiB, MiB, GiB: powers of 1024), as PyTorch and ``nvidia-smi`` report them.
"""

from __future__ import annotations

__all__ = ["MS_PER_S", "US_PER_MS", "US_PER_S", "BYTES_PER_KIB", "BYTES_PER_MIB", "MIB_PER_GIB"]

#: Milliseconds per second.
MS_PER_S: float = 1000.0
#: Microseconds per millisecond.
US_PER_MS: float = 1000.0
#: Microseconds per second.
US_PER_S: float = 1e6
#: Bytes per KiB.
BYTES_PER_KIB: int = 1024
#: Bytes per MiB.
BYTES_PER_MIB: int = 1024 * 1024
#: MiB per GiB.
MIB_PER_GIB: float = 1024.0
