"""The host's measured peaks pinned for a test: ``host-cpu``'s device features read a live measurement of this
machine, which a busy machine measures again at the next use with other figures, so the same graph's prediction
would differ between runs."""

from __future__ import annotations

import pytest
import torch

from dippm_nas.devices import _registry


def pin_host_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pin the peaks of ``n`` torch threads to fixed figures of a 2-core host (the features of 1 and 2 threads still
    differ, so a featurisation at the wrong thread count shows)."""
    real_facts = _registry.host_facts

    def pinned_facts(threads: int | None = None) -> dict:
        n = threads if threads is not None else torch.get_num_threads()
        return {**real_facts(threads=threads), "fp32_tflops": 0.05 * n, "bandwidth_gbps": 30.0 + n,
                "host_dispatch_us": 1.5, "contended": False}

    monkeypatch.setattr(_registry, "host_facts", pinned_facts)
