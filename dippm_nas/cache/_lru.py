"""The in-process side of the conversion cache: decoded graphs kept in memory, least recently used first out.

:class:`~dippm_nas.cache.ConversionCache` keeps the rows in SQL and one :class:`GraphLru` of the graphs it decoded
or stored in this process, bounded by an estimate of their Python objects' memory, so a repeated hit neither reads
the database nor decodes JSON. Not thread-safe: the cache's lock guards every call.
"""

from __future__ import annotations

from collections import OrderedDict

from dippm_nas.graph import OperatorGraph

__all__ = ["GraphLru", "MEMORY_PER_JSON_BYTE"]

#: In-process memory of a decoded graph per byte of its JSON text. Measured with tracemalloc on a
#: 300-node conv/batch_norm/relu chain: ~400 KB of Python objects for 81 KB of JSON.
MEMORY_PER_JSON_BYTE = 5


class GraphLru:
    """Decoded graphs by key, at most ``memory_bytes`` (estimated) in all; ``0`` keeps none.

    Args:
        memory_bytes: the bound, bytes of Python objects (:data:`MEMORY_PER_JSON_BYTE` per byte of graph JSON).
    """

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self._graphs: OrderedDict[str, tuple[OperatorGraph, int]] = OrderedDict()
        #: estimated bytes held now
        self.used_bytes = 0

    def get(self, key: str) -> OperatorGraph | None:
        """The graph kept under ``key`` (now the most recently used), or ``None``."""
        entry = self._graphs.get(key)
        if entry is None:
            return None
        self._graphs.move_to_end(key)
        return entry[0]

    def remember(self, key: str, graph: OperatorGraph, json_chars: int) -> None:
        """Keep a decoded graph (of ``json_chars`` characters of JSON); the least recently used go when over the
        bound, and a graph larger than the bound is not kept."""
        cost = json_chars * MEMORY_PER_JSON_BYTE
        if cost > self.memory_bytes:
            return
        old = self._graphs.pop(key, None)
        if old is not None:
            self.used_bytes -= old[1]
        self._graphs[key] = (graph, cost)
        self.used_bytes += cost
        while self.used_bytes > self.memory_bytes:
            _, (_, c) = self._graphs.popitem(last=False)
            self.used_bytes -= c

    def forget(self, key: str) -> None:
        """Drop the graph of ``key``, if kept."""
        old = self._graphs.pop(key, None)
        if old is not None:
            self.used_bytes -= old[1]

    def clear(self) -> None:
        """Drop every graph."""
        self._graphs.clear()
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._graphs)
