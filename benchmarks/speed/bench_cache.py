"""Latency of the conversion cache: put, get (database hit, in-process hit, miss) on a ~300-node graph.

Usage::

    python benchmarks/speed/bench_cache.py [--url SQLALCHEMY_URL] [--blocks 75] [--repeats 200]

Without ``--url`` a SQLite file in a fresh temporary directory is used. Every figure is a median of
``--repeats`` timed calls after ``--warmup`` untimed ones, measured with ``time.perf_counter``. The
"decode breakdown" times the steps of a database hit one by one, to show where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from dippm_nas.cache import CACHE_TABLE, ConversionCache, fresh_copy
from dippm_nas.graph import OperatorGraph, synthetic_resnet_graph


def synthetic_graph(num_blocks: int, channels: int = 64, batch: int = 8) -> OperatorGraph:
    """A ResNet-like chain of ``num_blocks`` x (conv2d, batch_norm, relu, residual add) = 4 nodes per block."""
    return synthetic_resnet_graph(num_blocks, channels=channels, batch=batch, size=56, source="bench",
                                  model_key="bench", convert_seconds=1.0)


def median_ms(fn: Callable[[int], object], warmup: int, repeats: int) -> float:
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(warmup + i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, SQLAlchemy {sa.__version__}, SQLite {sqlite3.sqlite_version}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="SQLAlchemy URL (default: SQLite file in a temp dir)")
    ap.add_argument("--blocks", type=int, default=75, help="4 nodes per block; 75 -> 300 nodes")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="dippm-bench-cache-")
    url = args.url or f"sqlite:///{Path(tmp.name) / 'bench.sqlite'}"
    g = synthetic_graph(args.blocks)
    text = g.to_json().encode()
    payload = zlib.compress(text, 6)
    run = os.urandom(4).hex()
    w, r = args.warmup, args.repeats

    print(f"machine: {machine()}")
    print(f"backend: {url.split('://')[0]}; graph: {g.num_nodes} nodes, {g.num_edges} edges, "
          f"JSON {len(text) / 1024:.1f} KiB, stored {len(payload) / 1024:.1f} KiB (zlib)")
    print(f"each figure: median of {r} calls after {w} warm-up calls")

    with ConversionCache(url, memory_bytes=0) as db_only, ConversionCache(url) as cache:
        put_new = median_ms(lambda i: db_only.put(f"bench-{run}-new-{i}", g), w, r // 4 or 1)
        put_same = median_ms(lambda i: db_only.put(f"bench-{run}-same", g), w, r // 4 or 1)
        key = f"bench-{run}-same"
        get_db = median_ms(lambda i: db_only.get(key), w, r)
        cache.get(key)
        get_mem = median_ms(lambda i: cache.get(key), w, r)
        miss = median_ms(lambda i: db_only.get(f"bench-{run}-absent-{i}"), w, r)
        rows = db_only.stats()["rows"]

        tbl = CACHE_TABLE
        sel = sa.select(tbl.c.payload, tbl.c.format_version, tbl.c.created_at).where(tbl.c.key == key)
        with db_only.engine.connect() as conn:
            t_select = median_ms(lambda i: conn.execute(sel).first(), w, r)
        d = json.loads(text)
        parts = {
            "SELECT row": t_select,
            "zlib.decompress": median_ms(lambda i: zlib.decompress(payload), w, r),
            "json.loads": median_ms(lambda i: json.loads(text), w, r),
            "OperatorGraph.from_dict": median_ms(lambda i: OperatorGraph.from_dict(d), w, r),
            "OperatorGraph.validate": median_ms(lambda i: g.validate(), w, r),
            "fresh copy (memory hit)": median_ms(lambda i: fresh_copy(g), w, r),
        }
        # leave a shared database as we found it
        with db_only.engine.begin() as conn:
            conn.execute(sa.delete(tbl).where(tbl.c.key.like(f"bench-{run}-%")))

    print(f"rows in the table during the gets: {rows}")
    print(f"put (new key)                 {put_new:8.3f} ms")
    print(f"put (same key, upsert)        {put_same:8.3f} ms")
    print(f"get, database hit             {get_db:8.3f} ms")
    print(f"get, in-process hit           {get_mem:8.3f} ms  (database hit / in-process hit: {get_db / get_mem:.0f}x)")
    print(f"get, miss                     {miss:8.3f} ms")
    print("decode breakdown of a database hit:")
    for name, ms in parts.items():
        print(f"  {name:28s}{ms:8.3f} ms")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
