"""The chunked inference pass (``SageEnsemble.infer``) against a straightforward reference of the model's math.

The reference is written independently of the fast path: one graph and one member at a time, dense
row-normalised adjacency (dataflow edges both ways), explicit LayerNorm, float64. The shipped checkpoints'
predictions must not move by more than 1e-5 (relative in ms, absolute in log units for the members and
their std), and must match the training path ``forward(collate(...))`` to float rounding.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dippm_nas.features import GraphFeatures
from dippm_nas.graph import OperatorGraph
from dippm_nas.predictor import TARGETS, GnnPredictor, SageEnsemble, collate, collate_globals
from test_features import tiny_graph

ROOT = Path(__file__).resolve().parents[1]
CKPTS = ROOT / "dippm_nas" / "predictor" / "checkpoints"
DATA = ROOT / "data" / "host_cpu" / "host_cpu.jsonl.xz"
_Z = 5.0


def _data_graphs(sizes: tuple[tuple[int, int], ...] = ((0, 60), (60, 150), (150, 250), (250, 10_000)),
                 ) -> list[OperatorGraph]:
    """Two graphs per operator-node range from the shipped host-CPU data (read lazily, first matches)."""
    if not DATA.is_file():
        pytest.skip(f"needs {DATA}")
    want = {r: 2 for r in sizes}
    out: list[OperatorGraph] = []
    with lzma.open(DATA, "rt") as f:
        for line in f:
            d = json.loads(line)
            if d.get("type") != "graph":
                continue
            g = OperatorGraph.from_dict(d["graph"])
            for r in sizes:
                if want[r] and r[0] <= g.num_nodes < r[1]:
                    want[r] -= 1
                    out.append(g)
                    break
            if not any(want.values()):
                break
    return out


def _reference(model: SageEnsemble, f: GraphFeatures, *, both_directions: bool = True) -> np.ndarray:
    """Log outputs ``[members, 3]`` of one graph, member by member, in float64 with dense matrices."""
    P = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    x = np.clip((f.x.astype(np.float64) - P["x_mean"]) / P["x_std"], -_Z, _Z)
    n = x.shape[0]
    adj = np.zeros((n, n))
    for s, t in f.edge_index.T:  # row t averages over its neighbours (a repeated edge counts twice)
        adj[t, s] += 1.0
        if both_directions:
            adj[s, t] += 1.0
    adj /= np.maximum(adj.sum(1, keepdims=True), 1.0)
    gl = np.clip(np.concatenate([(f.static - P["static_mean"]) / P["static_std"],
                                 (f.device - P["dev_mean"]) / P["dev_std"]]), -_Z, _Z)
    prior = np.log([max(f.prior_latency_ms, 1e-9), max(f.prior_energy_j or 1.0, 1e-9), max(f.prior_memory_mib, 1e-9)])
    outs = []
    for m in range(model.k):
        h = np.maximum(x @ P["embed.weight"][m] + P["embed.bias"][m], 0.0)
        for b in range(len(model.blocks)):
            q = f"blocks.{b}."
            z = h @ P[q + "self_lin.weight"][m] + P[q + "self_lin.bias"][m] + (adj @ h) @ P[q + "nbr_lin.weight"][m]
            mu = z.mean(1, keepdims=True)
            var = ((z - mu) ** 2).mean(1, keepdims=True)
            z = (z - mu) / np.sqrt(var + 1e-5) * P[q + "gamma"][m] + P[q + "beta"][m]
            h = h + np.maximum(z, 0.0)
        read = np.concatenate([h.mean(0), h.max(0)]) if n else np.concatenate([np.zeros(h.shape[1]),
                                                                                np.full(h.shape[1], -1e4)])
        z = np.concatenate([read, gl])
        z = np.maximum(z @ P["fc1.weight"][m] + P["fc1.bias"][m, 0], 0.0)
        z = np.maximum(z @ P["fc2.weight"][m] + P["fc2.bias"][m, 0], 0.0)
        o = z @ P["fc3.weight"][m] + P["fc3.bias"][m, 0]
        if model.residual_on_prior:
            o = P["delta_max"] * np.tanh(o / P["delta_max"]) + prior
        else:
            o = P["y_mean"] + o
        outs.append(o)
    return np.stack(outs)


def _feats(pred: GnnPredictor) -> list[GraphFeatures]:
    feats = [pred.features(g) for g in _data_graphs()] + [pred.features(tiny_graph())]
    f = feats[0]
    # graphs of one and of zero kernels without edges, and one with a repeated edge (counted twice in the mean)
    feats.append(dataclasses.replace(f, x=f.x[:1].copy(), edge_index=np.zeros((2, 0), dtype=np.int64)))
    feats.append(dataclasses.replace(f, x=f.x[:0].copy(), edge_index=np.zeros((2, 0), dtype=np.int64)))
    ei = np.concatenate([f.edge_index, f.edge_index[:, :1]], 1)
    feats.append(dataclasses.replace(f, edge_index=ei))
    return feats


@pytest.mark.parametrize("ckpt", ["host-cpu.intel-xeon", "host-cpu.amd-epyc", "a100-sxm4-40gb.accel-timm-tv"])
def test_fast_inference_matches_reference_on_shipped_checkpoints(ckpt: str) -> None:
    path = CKPTS / f"{ckpt}.pt"
    assert path.is_file(), f"the shipped checkpoint {path} is missing"
    pred = GnnPredictor.load(path, load_calibration=False)
    feats = _feats(pred)
    sizes = [len(f.x) for f in feats]
    assert max(sizes) >= 50 and min(sizes) == 0  # the graphs span the sizes the chunking cuts at
    ref = np.stack([_reference(pred.model, f) for f in feats], 1)  # [K, G, 3]
    glob = collate_globals(feats)
    unseen = pred.dtype_unseen(glob)
    # the host graphs are fp32: every shipped checkpoint trained on fp32 rows (the A100 one through the
    # ryujaehun GPUs' fp32 timings)
    assert not unseen.any()
    for chunk in (1, 64, 100_000):  # a graph per chunk, several graphs per chunk, one chunk
        fast = pred.model.infer(feats, chunk_nodes=chunk).double().numpy()
        np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-5, err_msg=f"members, chunk {chunk}")
        mean, std = pred.predict_log(feats, chunk_nodes=chunk)
        lp = glob["log_prior"].double().numpy()
        members_mean = ref.mean(0)
        # a checkpoint that shrinks novel graphs' corrections towards the prior (the AMD one) does it here too
        nov = pred.predict_log_full(feats, chunk_nodes=chunk)[3]
        for t, w in pred.correction_weights(nov).items():
            j = TARGETS.index(t)
            members_mean[:, j] = lp[:, j] + w * (members_mean[:, j] - lp[:, j])
        # a dtype the checkpoint never trained on (the A100 one on these fp32 graphs) answers with the prior
        want = np.where(unseen[:, None], lp, members_mean)
        np.testing.assert_allclose(np.exp(mean), np.exp(want), rtol=1e-5, err_msg="latency in units")
        np.testing.assert_allclose(std, ref.std(0), rtol=0, atol=1e-5, err_msg="ensemble std (log)")
    # the training path computes the same function
    with torch.no_grad():
        fwd = pred.model(collate(feats)).double().numpy()
    np.testing.assert_allclose(pred.model.infer(feats).double().numpy(), fwd, rtol=1e-6, atol=1e-6)
    # and the comparison has teeth: dropping the reverse edges moves the reference far beyond the tolerance
    one_way = np.stack([_reference(pred.model, f, both_directions=False) for f in feats[:4]], 1)
    assert np.abs(one_way - ref[:, :4]).max() > 1e-3


def test_fast_inference_matches_forward_with_random_weights() -> None:
    """Without residual_on_prior, with wider random weights (larger activations) and several members."""
    from dippm_nas.features import device_dim, featurize, node_dim, static_dim

    torch.manual_seed(1)
    model = SageEnsemble(node_dim(), static_dim(), device_dim(), hidden=24, layers=2, members=4,
                         residual_on_prior=False).eval()
    feats = [featurize(g, "a100-sxm4-40gb") for g in _data_graphs(((0, 100), (100, 10_000)))]
    with torch.no_grad():
        model.y_mean.copy_(torch.tensor([1.0, -2.0, 3.0]))
        fwd = model(collate(feats))
    ref = np.stack([_reference(model, f) for f in feats], 1)
    for chunk in (1, 50, 10_000):
        out = model.infer(feats, chunk_nodes=chunk)
        assert out.shape == (4, len(feats), 3)
        np.testing.assert_allclose(out.numpy(), fwd.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=0, atol=1e-5)
    assert model.infer([]).shape == (4, 0, 3)


def test_infer_keeps_no_autograd_state_and_training_forward_still_differentiates() -> None:
    from dippm_nas.features import device_dim, featurize, node_dim, static_dim

    model = SageEnsemble(node_dim(), static_dim(), device_dim(), hidden=8, layers=1, members=2)
    feats = [featurize(tiny_graph(), "a100-sxm4-40gb")]
    out = model.infer(feats)
    assert not out.requires_grad
    loss = model(collate(feats)).square().mean()
    loss.backward()
    assert all(p.grad is not None and math.isfinite(float(p.grad.abs().sum())) for p in model.parameters())
