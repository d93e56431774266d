"""The GraphSAGE ensemble: K members evaluated at once, and the batching of graph features.

Model (DIPPM's shape, our features): node features -> linear embedding -> 3 GraphSAGE blocks (mean
aggregation over dataflow neighbours in both directions, residual) -> graph readout (mean and max) ->
concat with the static and device features -> 3 fully connected layers -> one value per target
(latency, energy, memory) in log space. With ``residual_on_prior`` (our default) each output is a
correction added to the log of the analytic prior's figure, so an unfamiliar graph falls back towards
the physics instead of towards the training mean. Trained with a Huber loss on log values
(:mod:`dippm_nas.training`).

Inference: :meth:`SageEnsemble.infer` evaluates the same function as :meth:`SageEnsemble.forward` (the
training path, one disjoint graph of the whole batch) chunk by chunk, several times faster on a CPU.
:class:`TorchEngine` is the predictor's view of it (numpy arrays in and out); its numpy twin, which needs no
torch, is :class:`~dippm_nas.predictor.NumpyEnsemble`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dippm_nas.features import GraphFeatures
from dippm_nas.predictor._meta import TARGETS
from dippm_nas.predictor._numpy_ensemble import INFER_CHUNK_NODES, Z_CLIP as _Z_CLIP, chunks as _chunks, global_arrays, neighbours

__all__ = ["SageEnsemble", "TorchEngine", "collate", "collate_globals", "DELTA_MARGIN", "INFER_CHUNK_NODES"]

# the inference pass aggregates with a CSR tensor; torch warns once per process that CSR is "beta"
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state", category=UserWarning)

#: A training feature with a smaller std is constant; it is divided by _NEUTRAL_STD (neutralised).
_CONSTANT_STD = 1e-4
_NEUTRAL_STD = 1e6
#: Margin on the largest |log(label / prior)| of the training data that bounds the correction.
DELTA_MARGIN = 1.5


class _KLinear(nn.Module):
    """K independent linear layers applied at once: ``[K, N, d_in] -> [K, N, d_out]``."""

    def __init__(self, k: int, d_in: int, d_out: int, bias: bool = True) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)
        self.weight = nn.Parameter(torch.empty(k, d_in, d_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(k, 1, d_out).uniform_(-bound, bound)) if bias else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.bmm(h, self.weight)
        return torch.baddbmm(self.bias, h, self.weight)


class _KSage(nn.Module):
    """One GraphSAGE block for K members: ``h' = h + relu(LN(W_self h + W_nbr mean_{j in N(i)} h_j))``."""

    def __init__(self, k: int, hidden: int) -> None:
        super().__init__()
        self.self_lin = _KLinear(k, hidden, hidden)
        self.nbr_lin = _KLinear(k, hidden, hidden, bias=False)
        self.gamma = nn.Parameter(torch.ones(k, 1, hidden))
        self.beta = nn.Parameter(torch.zeros(k, 1, hidden))

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        k, n, d = h.shape
        agg = torch.sparse.mm(adj, h.transpose(0, 1).reshape(n, k * d)).reshape(n, k, d).transpose(0, 1)
        z = self.self_lin(h) + self.nbr_lin(agg)
        z = nn.functional.layer_norm(z, (d,)) * self.gamma + self.beta
        return h + torch.relu(z)


class SageEnsemble(nn.Module):
    """K GraphSAGE members evaluated together (batched weights), plus the feature standardisation.

    Each member: linear embedding, ``layers`` SAGE blocks, mean+max readout, concat static and device
    features, 3 fully connected layers -> 3 log targets. The members share nothing but the input.

    Shapes:
        ``forward(batch)`` -> ``[members, num_graphs, 3]`` log-space predictions (the log prior added
        when ``residual_on_prior``, else the training mean).
    """

    def __init__(self, node_in: int, static_in: int, device_in: int, hidden: int = 64, layers: int = 3,
                 members: int = 5, residual_on_prior: bool = True) -> None:
        super().__init__()
        k = members
        self.k = k
        self.residual_on_prior = residual_on_prior
        self.embed = _KLinear(k, node_in, hidden)
        self.blocks = nn.ModuleList([_KSage(k, hidden) for _ in range(layers)])
        self.fc1 = _KLinear(k, 2 * hidden + static_in + device_in, hidden)
        self.fc2 = _KLinear(k, hidden, hidden)
        self.fc3 = _KLinear(k, hidden, len(TARGETS))
        with torch.no_grad():
            self.fc3.weight.mul_(0.1)
            self.fc3.bias.zero_()
        for name, dim in (("x", node_in), ("static", static_in), ("dev", device_in)):
            self.register_buffer(f"{name}_mean", torch.zeros(dim))
            self.register_buffer(f"{name}_std", torch.ones(dim))
        self.register_buffer("y_mean", torch.zeros(len(TARGETS)))
        self.register_buffer("delta_max", torch.full((len(TARGETS),), 10.0))
        # range of the raw graph-level (static + device) features seen in training
        self.register_buffer("global_lo", torch.full((static_in + device_in,), -math.inf))
        self.register_buffer("global_hi", torch.full((static_in + device_in,), math.inf))

    def set_stats(self, x: torch.Tensor, static: torch.Tensor, dev: torch.Tensor, y_mean: torch.Tensor,
                  delta_max: torch.Tensor | None = None) -> None:
        """Standardisation statistics from training tensors (``[N, dim]`` each), mean log target ``[3]`` and
        the bound of the log-correction ``[3]``.

        A feature that is constant in the training data (e.g. the batch size when every row has batch 256)
        carries no information the model could have learnt from; it is neutralised (its std set to
        :data:`_NEUTRAL_STD`) so an unseen value cannot drive the network outside its training range.
        """
        for name, t in (("x", x), ("static", static), ("dev", dev)):
            std = t.std(0) if t.shape[0] > 1 else torch.zeros(t.shape[1])
            std = torch.where(std < _CONSTANT_STD, torch.full_like(std, _NEUTRAL_STD), std)
            getattr(self, f"{name}_mean").copy_(t.mean(0))
            getattr(self, f"{name}_std").copy_(std)
        self.y_mean.copy_(y_mean)
        if delta_max is not None:
            self.delta_max.copy_(delta_max)
        glob = torch.cat([static, dev], 1)
        self.global_lo.copy_(glob.amin(0))
        self.global_hi.copy_(glob.amax(0))

    def static_z(self, b: dict[str, Any]) -> torch.Tensor:
        """Standardised, clipped static (graph-level) features, as the network sees them; ``[num_graphs, static_in]``."""
        return ((b["static"] - self.static_mean) / self.static_std).clamp(-_Z_CLIP, _Z_CLIP)

    def _global_z(self, b: dict[str, Any]) -> torch.Tensor:
        """:meth:`static_z` and the standardised, clipped device features side by side; ``[num_graphs, static_in + device_in]``."""
        return torch.cat([self.static_z(b), ((b["dev"] - self.dev_mean) / self.dev_std).clamp(-_Z_CLIP, _Z_CLIP)], 1)

    def _head(self, read: torch.Tensor, gl: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
        """The fully connected head on the readout ``[K, G, 2*hidden]`` and global features ``gl`` ``[G, ...]``:
        ``[K, G, 3]`` log-space predictions (the bounded correction of the log prior, or around the training mean)."""
        return self._head_hidden(read, gl, log_prior)[0]

    def _head_hidden(self, read: torch.Tensor, gl: torch.Tensor,
                     log_prior: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_head` and the last hidden layer (the input of ``fc3``, ``[K, G, hidden]``)."""
        z = torch.cat([read, gl.unsqueeze(0).expand(self.k, -1, -1)], 2)
        hid = torch.relu(self.fc2(torch.relu(self.fc1(z))))
        out = self.fc3(hid)
        if self.residual_on_prior:
            # the correction of the prior stays within the range seen in training (times a margin)
            out = self.delta_max * torch.tanh(out / self.delta_max)
            return log_prior.unsqueeze(0) + out, hid
        return self.y_mean.expand(read.shape[1], -1).unsqueeze(0) + out, hid

    def outside_training_range(self, b: dict[str, Any], *, device_features: bool = True) -> torch.Tensor:
        """Per graph: does any graph-level feature (size, batch, dtype, prior totals, device) lie outside
        the range seen in training (with a 5% margin of that range)?

        Args:
            b: :func:`collate_globals` of the graphs.
            device_features: also check the device features (``False`` checks the graph's own features
                only: a host checkpoint on another CPU, whose single training device is necessarily not
                this one, has its own measured floor instead).

        Shapes:
            returns ``[num_graphs]`` bool.
        """
        graph, device = self.outside_parts(b)
        return graph | device if device_features else graph

    def outside_parts(self, b: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per graph, separately: does any of its own graph-level features, and does any device feature, lie
        outside the range seen in training (with a 5% margin of that range)?

        Shapes:
            returns two ``[num_graphs]`` bool tensors.
        """
        glob = torch.cat([b["static"], b["dev"]], 1)
        tol = 0.05 * (self.global_hi - self.global_lo).nan_to_num(0.0, 0.0, 0.0) + 1e-4
        out = (glob < self.global_lo - tol) | (glob > self.global_hi + tol)
        n_static = b["static"].shape[1]
        return out[:, :n_static].any(1), out[:, n_static:].any(1)

    def forward(self, b: dict[str, Any]) -> torch.Tensor:
        k, g = self.k, b["num_graphs"]
        x = ((b["x"] - self.x_mean) / self.x_std).clamp(-_Z_CLIP, _Z_CLIP).unsqueeze(0).expand(k, -1, -1)
        h = torch.relu(self.embed(x))
        for blk in self.blocks:
            h = blk(h, b["adj"])
        n, d = h.shape[1], h.shape[2]
        flat = h.transpose(0, 1).reshape(n, k * d)
        mean = torch.sparse.mm(b["pool"], flat)
        mx = torch.full((g, k * d), -1e4, dtype=h.dtype).scatter_reduce(
            0, b["batch"].unsqueeze(1).expand(n, k * d), flat, reduce="amax", include_self=True)
        read = torch.cat([mean.reshape(g, k, d), mx.reshape(g, k, d)], 2).transpose(0, 1)
        return self._head(read, self._global_z(b), b["log_prior"])

    def infer(self, feats: Sequence[GraphFeatures], *, chunk_nodes: int = INFER_CHUNK_NODES,
              glob: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """See :meth:`infer_hidden` (this is its first tensor)."""
        return self.infer_hidden(feats, chunk_nodes=chunk_nodes, glob=glob)[0]

    def infer_hidden(self, feats: Sequence[GraphFeatures], *, chunk_nodes: int = INFER_CHUNK_NODES,
                     glob: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` on ``collate(feats)`` for inference: the same math, evaluated chunk by chunk.

        The graphs are cut into consecutive chunks of at most ``chunk_nodes`` kernel nodes (a graph is never
        split) so the ``[members, nodes, hidden]`` activations stay in the CPU's cache (one whole-batch
        graph of 1,024 graphs does not, and ran 3x slower); each chunk is collated with whole-chunk numpy
        operations, aggregated with one CSR sparse product for all members, and read out (mean pooling
        matrix, per-graph max); the fully connected head then runs once on all graphs. No autograd
        (``torch.inference_mode``); training uses :meth:`forward`, and ``tests/test_predictor_infer.py``
        checks both against a plain per-graph reference.

        Args:
            feats: feature sets of one style.
            chunk_nodes: node budget per chunk (speed only; results do not depend on it beyond float
                rounding).
            glob: the output of :func:`collate_globals` for ``feats`` when the caller already has it.

        Shapes:
            returns ``[members, num_graphs, 3]``, equal to ``forward(collate(feats))`` up to float rounding, and
            each member's last hidden layer ``[members, num_graphs, hidden]`` (the input of ``fc3``).
        """
        if not feats:
            return torch.zeros(self.k, 0, len(TARGETS)), torch.zeros(self.k, 0, self.fc3.weight.shape[1])
        with torch.inference_mode():
            glob = glob if glob is not None else collate_globals(feats)
            k, g = self.k, len(feats)
            n = np.fromiter((f.x.shape[0] for f in feats), dtype=np.int64, count=g)
            read = torch.empty(k, g, 2 * self.embed.weight.shape[2])
            for a, b in _chunks(n, chunk_nodes):
                read[:, a:b] = self._infer_readout(feats[a:b], n[a:b])
            return self._head_hidden(read, self._global_z(glob), glob["log_prior"])

    def _infer_readout(self, feats: Sequence[GraphFeatures], n: np.ndarray) -> torch.Tensor:
        """Embedding, SAGE blocks and mean+max readout of one chunk: ``[members, len(feats), 2 * hidden]``.

        Activations are node-major ``[nodes, K, d]``: one sparse product aggregates all members, the batched
        weights read and write member-major views of it (no copies), and the readout runs on the
        ``[nodes, K * d]`` matrix :meth:`forward` pools (the same products, so the results match it bit for
        bit on this machine).
        """
        k, g = self.k, len(feats)
        x, adj = _chunk_tensors(feats, n)
        num = x.shape[0]
        d = self.embed.weight.shape[2]
        x = ((x - self.x_mean) / self.x_std).clamp_(-_Z_CLIP, _Z_CLIP)
        h = torch.empty(num, k, d)
        torch.baddbmm(self.embed.bias, x.expand(k, -1, -1), self.embed.weight, out=h.transpose(0, 1)).relu_()
        z = torch.empty(num, k, d)
        for blk in self.blocks:
            agg = torch.sparse.mm(adj, h.view(num, k * d)).view(num, k, d)
            zt = z.transpose(0, 1)
            torch.baddbmm(blk.self_lin.bias, h.transpose(0, 1), blk.self_lin.weight, out=zt)
            zt.baddbmm_(agg.transpose(0, 1), blk.nbr_lin.weight)
            y = nn.functional.layer_norm(z, (d,)).mul_(blk.gamma.view(k, d)).add_(blk.beta.view(k, d))
            h.add_(y.relu_())
        flat = h.view(num, k * d)
        nt = torch.from_numpy(n)
        bt = torch.repeat_interleave(torch.arange(g), nt, output_size=num)
        pool = torch.sparse_coo_tensor(torch.stack([bt, torch.arange(num)]),
                                       (1.0 / nt.clamp_min(1).to(torch.float32))[bt], (g, num),
                                       is_coalesced=True, check_invariants=False)
        mean = torch.sparse.mm(pool, flat)
        # forward's max readout (the -1e4 fill included: an empty graph's max); one kernel for the chunk, faster
        # than a max per graph and several times faster than segment_reduce
        mx = torch.full((g, k * d), -1e4).scatter_reduce_(0, bt.unsqueeze(1).expand(num, k * d), flat, reduce="amax",
                                                          include_self=True)
        return torch.cat([mean.view(g, k, d), mx.view(g, k, d)], 2).transpose(0, 1)


def _chunk_tensors(feats: Sequence[GraphFeatures], n: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Node features ``[sum n, node_dim]`` and the row-normalised neighbour matrix of :func:`collate` as a
    CSR tensor ``[sum n, sum n]``, built with whole-batch numpy operations (no sort beyond one argsort of
    the destination indices)."""
    num = int(n.sum())
    x = torch.from_numpy(np.concatenate([f.x for f in feats]).astype(np.float32, copy=False))
    src, dst, inv = neighbours(feats, n)  # sorted by destination, 1 / in-degree in float32 as collate
    crow = np.zeros(num + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num), out=crow[1:])
    adj = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(src), torch.from_numpy(inv), (num, num),
                                  check_invariants=False)
    return x, adj


def collate_globals(feats: Sequence[GraphFeatures]) -> dict[str, torch.Tensor]:
    """The graph-level part of :func:`collate`: ``static``, ``dev`` and ``log_prior``
    (:func:`~dippm_nas.predictor._numpy_ensemble.global_arrays` as tensors)."""
    return {k: torch.from_numpy(v) for k, v in global_arrays(feats).items()}


class TorchEngine:
    """The predictor's view of a :class:`SageEnsemble`: numpy arrays in and out, read from the module's live
    parameters and buffers at every call (a caller may change them in place).
    :class:`~dippm_nas.predictor._numpy_ensemble.NumpyEnsemble` is the same interface without torch."""

    def __init__(self, model: SageEnsemble) -> None:
        self.model = model.eval()

    @property
    def residual_on_prior(self) -> bool:
        return bool(self.model.residual_on_prior)

    @property
    def delta_max(self) -> np.ndarray:
        return self.model.delta_max.detach().numpy()

    @property
    def global_hi(self) -> np.ndarray:
        return self.model.global_hi.detach().numpy()

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy() for k, v in self.model.state_dict().items()}

    def mean_std(self, feats: Sequence[GraphFeatures], b: dict[str, np.ndarray], *,
                 chunk_nodes: int = INFER_CHUNK_NODES) -> tuple[np.ndarray, np.ndarray]:
        """The members' mean and std (population) of the log targets; ``[G, 3]`` float32 each."""
        with torch.inference_mode():
            out = self.model.infer(feats, chunk_nodes=chunk_nodes, glob=_tensors(b))
            mean = out.mean(0)
            std = out.std(0, unbiased=False) if out.shape[0] > 1 else torch.zeros_like(mean)
        return mean.numpy(), std.numpy()

    def infer_hidden(self, feats: Sequence[GraphFeatures], b: dict[str, np.ndarray], *,
                     chunk_nodes: int = INFER_CHUNK_NODES) -> tuple[np.ndarray, np.ndarray]:
        """Every member's log-space prediction ``[K, G, 3]`` and last hidden layer ``[K, G, hidden]``."""
        with torch.inference_mode():
            out, hid = self.model.infer_hidden(feats, chunk_nodes=chunk_nodes, glob=_tensors(b))
        return out.numpy(), hid.numpy()

    def static_z(self, b: dict[str, np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            return self.model.static_z(_tensors(b)).numpy()

    def outside_parts(self, b: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            graph, device = self.model.outside_parts(_tensors(b))
        return graph.numpy(), device.numpy()


def _tensors(b: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v) for k, v in b.items()}


def collate(feats: Sequence[GraphFeatures]) -> dict[str, Any]:
    """Batch feature sets into one disjoint graph.

    Shapes:
        - ``x``: ``[sum nodes, node_dim]``; ``batch``: ``[sum nodes]`` graph of each node;
        - ``adj``: sparse ``[sum nodes, sum nodes]``, row-normalised neighbours (dataflow edges both ways);
        - ``pool``: sparse ``[num_graphs, sum nodes]``, mean over each graph's nodes;
        - ``static``: ``[num_graphs, static_dim]``; ``dev``: ``[num_graphs, device_dim]``;
        - ``log_prior``: ``[num_graphs, 3]`` log of the prior's latency, energy (0 when unknown), memory.
    """
    xs, srcs, dsts, batch = [], [], [], []
    off = 0
    for gi, f in enumerate(feats):
        n = f.x.shape[0]
        xs.append(f.x)
        ei = f.edge_index
        srcs.append(np.concatenate([ei[0], ei[1]]) + off)
        dsts.append(np.concatenate([ei[1], ei[0]]) + off)
        batch.append(np.full(n, gi, dtype=np.int64))
        off += n
    src = torch.from_numpy(np.concatenate(srcs).astype(np.int64))
    dst = torch.from_numpy(np.concatenate(dsts).astype(np.int64))
    deg = torch.bincount(dst, minlength=off).clamp_min(1).to(torch.float32)
    bt = torch.from_numpy(np.concatenate(batch))
    cnt = torch.bincount(bt, minlength=len(feats)).clamp_min(1).to(torch.float32)
    adj = torch.sparse_coo_tensor(torch.stack([dst, src]), (1.0 / deg)[dst], (off, off),
                                  check_invariants=False).coalesce()
    pool = torch.sparse_coo_tensor(torch.stack([bt, torch.arange(off)]), (1.0 / cnt)[bt], (len(feats), off),
                                   check_invariants=False).coalesce()
    return {
        "x": torch.from_numpy(np.concatenate(xs).astype(np.float32)), "adj": adj, "pool": pool, "batch": bt,
        "num_graphs": len(feats), **collate_globals(feats),
    }


