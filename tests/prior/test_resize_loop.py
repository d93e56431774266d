"""Eager PyTorch's serial bilinear / bicubic NCHW resize kernel in the analytic prior (no GPU, no ../shared)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from _scripts import load_script
from dippm_nas import Deployment
from dippm_nas.capture import capture
from dippm_nas.devices import get_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.prior import PriorParams, default_params, estimate, estimate_many, graph_facts, node_costs, predict
from dippm_nas.spec import InputSpec

BATCH, CHANNELS = 16, 256


class _Up(nn.Module):
    """A 1x1 conv, then a 2x resize of its (contiguous NCHW) output, as EfficientFormerV2's strided attention."""

    def __init__(self, mode: str = "bilinear", through_view: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 1)
        self.up = nn.Upsample(scale_factor=2, mode=mode)
        self.through_view = through_view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.through_view:  # tokens back to an image, as CoaT does: a view whose strides PyTorch reads as NHWC
            b, c, h, w = y.shape
            y = y.flatten(2).transpose(1, 2).transpose(1, 2).reshape(b, c, h, w)
        return self.up(y)


def _graph(mode: str = "bilinear", through_view: bool = False):
    return capture(_Up(mode, through_view).eval(), InputSpec(shape=(CHANNELS, 7, 7), batch_size=BATCH), cache=False)


def _resize_us(graph, params: PriorParams, device: str = "rtx-3090", channels_last: bool = False) -> float:
    nc = node_costs(graph, get_device(device), params, channels_last=channels_last)
    idx = [n.index for n in graph.nodes if n.op == "image.resize2d"]
    assert len(idx) == 1
    return float(nc.gpu_us[idx[0]])


def test_bilinear_nchw_resize_costs_one_round_trip_per_image_and_channel() -> None:
    g = _graph()
    p = default_params()
    assert p.resize_loop_ns is not None
    iters, threads = graph_facts(g).serial_resizes()
    i = int(np.flatnonzero(iters)[0])
    assert iters[i] == BATCH * CHANNELS and threads[i] == 14 * 14
    serial = _resize_us(g, p)
    by_bytes = _resize_us(g, dataclasses.replace(p, resize_loop_ns=None))
    expected = BATCH * CHANNELS * p.resize_loop_ns * 1e-3  # one wave: 196 threads
    assert serial == pytest.approx(expected, rel=0.05)
    assert serial > 20 * by_bytes  # the bytes alone move in microseconds
    # the same on a GPU with twice the bandwidth: a latency chain, not a stream
    assert _resize_us(g, p, "rtx-5090") == pytest.approx(expected, rel=0.05)


def test_nearest_channels_last_and_view_inputs_keep_the_bandwidth_pricing() -> None:
    p = default_params()
    off = dataclasses.replace(p, resize_loop_ns=None)
    for g in (_graph("nearest"), _graph(through_view=True)):
        assert not graph_facts(g).serial_resizes()[0].any()
        assert _resize_us(g, p) == _resize_us(g, off)
    g = _graph()
    assert _resize_us(g, p, channels_last=True) == _resize_us(g, off, channels_last=True)


def test_stacked_estimates_price_the_serial_resize_as_single_ones() -> None:
    g = _graph()
    one = estimate(g, "rtx-4090")
    many = estimate_many([g, _graph("nearest")], "rtx-4090")
    assert many[0].latency_ms == pytest.approx(one.latency_ms, rel=1e-12)
    assert one.latency_ms > estimate(g, "rtx-4090", params=dataclasses.replace(default_params(),
                                                                               resize_loop_ns=None)).latency_ms


def test_resize_loop_ns_is_checked_and_a_file_without_it_reads_as_none() -> None:
    with pytest.raises(InvalidValueError, match="resize_loop_ns"):
        dataclasses.replace(default_params(), resize_loop_ns=-1.0)
    d = default_params().to_dict()
    assert PriorParams.from_dict(d).resize_loop_ns == default_params().resize_loop_ns
    del d["global"]["resize_loop_ns"]
    assert PriorParams.from_dict(d).resize_loop_ns is None


def test_the_fit_recovers_the_iteration_time_a_label_implies() -> None:
    fit = load_script("fit_resize_loop")
    g = _graph()
    dep = Deployment(runtime="eager", autocast=None, input_copy="none")
    p = dataclasses.replace(default_params(), resize_loop_ns=250.0)
    label = predict(g, "rtx-3090", params=p, deployment=dep, mig=False).latency_ms
    assert fit.implied_ns(g, "rtx-3090", label, dep, default_params()) == pytest.approx(250.0, rel=1e-3)
    assert fit.geomean([100.0, 400.0]) == pytest.approx(200.0)
