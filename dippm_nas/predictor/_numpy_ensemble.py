"""The GraphSAGE ensemble's inference in numpy, and the weights file it reads: a prediction without torch.

:class:`NumpyEnsemble` evaluates the function of :meth:`SageEnsemble.infer <dippm_nas.predictor.SageEnsemble.infer>`
(standardise and clip the inputs, a batched linear embedding, the SAGE blocks -- mean over the dataflow
neighbours in both directions, layer norm, residual --, mean + max readout, the fully connected head and the
``delta_max * tanh`` bound of the log-prior correction) on the checkpoint's weights as numpy arrays, in float32
like the torch pass. It answers the predictions of a process that has not loaded torch (``dippm-nas predict``
of a graph in the conversion cache: importing torch alone takes longer than the whole answer); a process that
uses torch anyway, and every batch larger than :data:`NUMPY_MAX_GRAPHS` graphs, runs the torch ensemble.
``tests/predictor/test_numpy_ensemble.py`` checks both give every field of every prediction to 3e-5 relative (the measured
agreement of CPU kernel paths, 3.2e-6 at most, with a margin: ``tests/kernel_paths.py``).

The weights come from a **derived file**, ``<cache_dir()>/checkpoints/<sha256 of the .pt>.npz`` (plain arrays,
read with ``allow_pickle=False``): the state dict, the novelty reference set and the metadata JSON, written the
first time the checkpoint is loaded through torch. It is named by the checkpoint's content, so a changed ``.pt``
never meets the weights of another, and it holds ``arrays_sha256``, the SHA-256 of every array it holds (name,
dtype, shape, bytes) together with the checkpoint's SHA-256 (:func:`arrays_digest`), checked on every read, so
weights edited or re-saved after it was written (``np.savez`` of the same keys with other values) are never
answered: they would give other figures than the checkpoint in a process that loads it through torch. A file
that is missing, unreadable, of another layout, whose digest does not match, or whose weights are not finite
(or whose standardisation scales are not > 0) is a miss, logged with the file's path and the reason: the torch
path loads the checkpoint and writes the file again. It is an integrity check, not a signature: whoever may
write the cache directory may also write a matching digest (the same holds for the checkpoint folders). The
:data:`DERIVED_KEEP` most recently written files are kept.

This module also holds what both engines share: the graph-level batch (:func:`global_arrays`), the chunking of
a batch and the standardisation constants.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dippm_nas._files import open_regular
from dippm_nas._paths import cache_dir
from dippm_nas.errors import CheckpointError
from dippm_nas.features import GraphFeatures
from dippm_nas.predictor._meta import TARGETS, CheckpointMeta

__all__ = ["NumpyEnsemble", "global_arrays", "state_shapes", "derived_weights_path", "read_derived_weights",
           "write_derived_weights", "checkpoint_digest", "arrays_digest", "INFER_CHUNK_NODES", "NUMPY_MAX_GRAPHS",
           "DERIVED_FORMAT",
           "DERIVED_KEEP", "chunks", "neighbours"]

logger = logging.getLogger(__name__)

EPS = 1e-9
#: Standardised inputs are clipped to ±Z_CLIP (robustness to graphs unlike the training data).
Z_CLIP = 5.0
#: Default node budget of one chunk of an inference pass: the activations of 5 members x 64 wide (1.3 MB)
#: stay in a core's L2 cache; one whole-batch graph of 1,024 graphs (~55 MB) spills to memory and ran 3x
#: slower, and much smaller chunks pay Python overhead per chunk.
INFER_CHUNK_NODES = 1024
#: The largest request (graphs) :class:`NumpyEnsemble` answers; a larger one loads the torch ensemble, whose
#: batched pass is the faster one (``docs/search_space_assembly.md``).
NUMPY_MAX_GRAPHS = 16
#: Version of the derived weights file's layout (2: with ``arrays_sha256``).
DERIVED_FORMAT = 2
#: Name of the array of a derived file that holds :func:`arrays_digest`.
_ARRAYS_DIGEST = "arrays_sha256"
#: Derived weights files kept in the cache directory (the most recently written; a training run that loads many
#: checkpoints does not fill the disk); a dropped one is written again by the next torch load.
DERIVED_KEEP = 16
#: ``torch.nn.functional.layer_norm``'s default epsilon, which the SAGE blocks use.
_LN_EPS = 1e-5


def global_arrays(feats: Sequence[GraphFeatures]) -> dict[str, np.ndarray]:
    """The graph-level batch of ``feats`` as float32 arrays: ``static`` ``[G, static_dim]``, ``dev``
    ``[G, device_dim]`` and ``log_prior`` ``[G, 3]`` (log of the prior's latency, energy -- 0 when unknown --
    and memory); :func:`~dippm_nas.predictor.collate_globals` is the same as torch tensors."""
    lp = [[math.log(max(f.prior_latency_ms, EPS)), math.log(max(f.prior_energy_j or 1.0, EPS)),
           math.log(max(f.prior_memory_mib, EPS))] for f in feats]
    return {
        "static": np.stack([f.static for f in feats]).astype(np.float32),
        "dev": np.stack([f.device for f in feats]).astype(np.float32),
        "log_prior": np.array(lp, dtype=np.float32).reshape(len(feats), len(TARGETS)),
    }


def chunks(n: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Consecutive ``[a, b)`` graph ranges whose node counts ``n`` sum to at most ``budget`` (a graph larger
    than the budget gets a chunk of its own)."""
    out, a, acc = [], 0, 0
    for i, ni in enumerate(n.tolist()):
        if acc + ni > budget and i > a:
            out.append((a, i))
            a, acc = i, 0
        acc += ni
    if a < len(n):
        out.append((a, len(n)))
    return out


def state_shapes(meta: CheckpointMeta) -> dict[str, tuple[int, ...]]:
    """Name and shape of every array of the state dict of the ensemble ``meta`` describes (the keys of
    ``SageEnsemble.state_dict()``)."""
    k, h, nt = meta.members, meta.hidden, len(TARGETS)
    glob = meta.static_dim + meta.device_dim
    out: dict[str, tuple[int, ...]] = {"embed.weight": (k, meta.node_dim, h), "embed.bias": (k, 1, h)}
    for i in range(meta.layers):
        out.update({f"blocks.{i}.self_lin.weight": (k, h, h), f"blocks.{i}.self_lin.bias": (k, 1, h),
                    f"blocks.{i}.nbr_lin.weight": (k, h, h), f"blocks.{i}.gamma": (k, 1, h),
                    f"blocks.{i}.beta": (k, 1, h)})
    out.update({"fc1.weight": (k, 2 * h + glob, h), "fc1.bias": (k, 1, h), "fc2.weight": (k, h, h),
                "fc2.bias": (k, 1, h), "fc3.weight": (k, h, nt), "fc3.bias": (k, 1, nt)})
    for name, dim in (("x", meta.node_dim), ("static", meta.static_dim), ("dev", meta.device_dim)):
        out[f"{name}_mean"] = (dim,)
        out[f"{name}_std"] = (dim,)
    out.update({"y_mean": (nt,), "delta_max": (nt,), "global_lo": (glob,), "global_hi": (glob,)})
    return out


class NumpyEnsemble:
    """The trained ensemble's inference in numpy (float32), for one checkpoint's weights.

    Args:
        state: the state dict (:func:`state_shapes` names and shapes) as float32 arrays.
        meta: the checkpoint's metadata (architecture and flags).

    Raises:
        CheckpointError: an array is missing, of another shape, or not finite where it must be.
    """

    def __init__(self, state: Mapping[str, np.ndarray], meta: CheckpointMeta) -> None:
        want = state_shapes(meta)
        missing = sorted(set(want) - set(state))
        bad = {n: tuple(state[n].shape) for n in want if n in state and tuple(state[n].shape) != want[n]}
        if missing or bad:
            raise CheckpointError(f"weights do not match the metadata: missing {missing}, wrong shapes {bad} "
                                  f"(expected {({n: want[n] for n in bad})})")
        self.state = {n: np.ascontiguousarray(state[n], dtype=np.float32) for n in want}
        self.k = meta.members
        self.layers = meta.layers
        self.residual_on_prior = bool(meta.residual_on_prior)

    # the buffers the predictor reads (the torch engine's live tensors, here fixed arrays)
    @property
    def delta_max(self) -> np.ndarray:
        return self.state["delta_max"]

    @property
    def global_lo(self) -> np.ndarray:
        return self.state["global_lo"]

    @property
    def global_hi(self) -> np.ndarray:
        return self.state["global_hi"]

    def state_dict(self) -> dict[str, np.ndarray]:
        return dict(self.state)

    def static_z(self, b: Mapping[str, np.ndarray]) -> np.ndarray:
        """Standardised, clipped static features of :func:`global_arrays` ``b``; ``[G, static_dim]``."""
        s = self.state
        return np.clip((b["static"] - s["static_mean"]) / s["static_std"], -Z_CLIP, Z_CLIP)

    def outside_parts(self, b: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per graph: does any of its own graph-level features, and does any device feature, lie outside the
        training range (5% margin)? Two ``[G]`` bool arrays, as ``SageEnsemble.outside_parts``."""
        lo, hi = self.global_lo, self.global_hi
        glob = np.concatenate([b["static"], b["dev"]], 1)
        with np.errstate(invalid="ignore", over="ignore"):
            span = np.nan_to_num(hi - lo, nan=0.0, posinf=0.0, neginf=0.0)
        tol = np.float32(0.05) * span + np.float32(1e-4)
        out = (glob < lo - tol) | (glob > hi + tol)
        n_static = b["static"].shape[1]
        return out[:, :n_static].any(1), out[:, n_static:].any(1)

    def mean_std(self, feats: Sequence[GraphFeatures], b: Mapping[str, np.ndarray], *,
                 chunk_nodes: int = INFER_CHUNK_NODES) -> tuple[np.ndarray, np.ndarray]:
        """The members' mean and std (population) of the log targets; ``[G, 3]`` float32 each."""
        out = self.infer(feats, b, chunk_nodes=chunk_nodes)
        std = out.std(0) if out.shape[0] > 1 else np.zeros_like(out[0])
        return out.mean(0), std

    def infer(self, feats: Sequence[GraphFeatures], b: Mapping[str, np.ndarray], *,
              chunk_nodes: int = INFER_CHUNK_NODES) -> np.ndarray:
        """Every member's log-space prediction; ``[members, G, 3]`` float32 (``SageEnsemble.infer``)."""
        return self.infer_hidden(feats, b, chunk_nodes=chunk_nodes)[0]

    def infer_hidden(self, feats: Sequence[GraphFeatures], b: Mapping[str, np.ndarray], *,
                     chunk_nodes: int = INFER_CHUNK_NODES) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`infer` and each member's last hidden layer (the input of ``fc3``, what an adaptation's
        residual head reads); ``[members, G, 3]`` and ``[members, G, hidden]`` float32."""
        s, k, g = self.state, self.k, len(feats)
        d = s["embed.weight"].shape[2]
        if not g:
            return np.zeros((k, 0, len(TARGETS)), dtype=np.float32), np.zeros((k, 0, d), dtype=np.float32)
        n = np.fromiter((f.x.shape[0] for f in feats), dtype=np.int64, count=g)
        read = np.empty((k, g, 2 * d), dtype=np.float32)
        for a, z in chunks(n, chunk_nodes):
            read[:, a:z] = self._readout(feats[a:z], n[a:z])
        dev_z = np.clip((b["dev"] - s["dev_mean"]) / s["dev_std"], -Z_CLIP, Z_CLIP)
        gl = np.concatenate([self.static_z(b), dev_z], 1)
        h = np.concatenate([read, np.broadcast_to(gl, (k, *gl.shape))], 2)
        h = np.maximum(self._linear("fc1", h), 0.0)
        h = np.maximum(self._linear("fc2", h), 0.0)
        out = self._linear("fc3", h)
        if self.residual_on_prior:
            dm = s["delta_max"]
            return b["log_prior"][None] + dm * np.tanh(out / dm), h
        return s["y_mean"][None, None] + out, h

    def _linear(self, name: str, h: np.ndarray) -> np.ndarray:
        """Member ``i``'s linear layer on ``h[i]``: ``[K, N, d_in] -> [K, N, d_out]``."""
        return np.matmul(h, self.state[f"{name}.weight"]) + self.state[f"{name}.bias"]

    def _readout(self, feats: Sequence[GraphFeatures], n: np.ndarray) -> np.ndarray:
        """Embedding, SAGE blocks and mean+max readout of one chunk: ``[members, len(feats), 2 * hidden]``."""
        s, k, g = self.state, self.k, len(feats)
        x = np.concatenate([f.x for f in feats]).astype(np.float32, copy=False)
        x = np.clip((x - s["x_mean"]) / s["x_std"], -Z_CLIP, Z_CLIP)
        src, dst, inv = neighbours(feats, n)
        h = np.maximum(self._linear("embed", np.broadcast_to(x, (k, *x.shape))), 0.0)  # [K, N, d]
        for i in range(self.layers):
            p = f"blocks.{i}."
            agg = np.zeros_like(h)
            if dst.size:  # mean over the neighbours: one sum per destination row of the sorted edge list
                starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
                agg[:, dst[starts]] = np.add.reduceat(h[:, src] * inv[:, None], starts, axis=1)
            z = self._linear(p + "self_lin", h) + np.matmul(agg, s[p + "nbr_lin.weight"])
            mu = z.mean(-1, keepdims=True)
            var = np.square(z - mu).mean(-1, keepdims=True)
            y = (z - mu) / np.sqrt(var + np.float32(_LN_EPS)) * s[p + "gamma"] + s[p + "beta"]
            h = h + np.maximum(y, 0.0)
        ends = np.cumsum(n)
        mean = np.zeros((k, g, h.shape[2]), dtype=np.float32)
        mx = np.full((k, g, h.shape[2]), -1e4, dtype=np.float32)
        for j in range(g):
            if n[j]:
                part = h[:, ends[j] - n[j]:ends[j]]
                mean[:, j] = part.sum(1) * np.float32(1.0 / n[j])
                mx[:, j] = np.maximum(part.max(1), np.float32(-1e4))
        return np.concatenate([mean, mx], 2)


def neighbours(feats: Sequence[GraphFeatures], n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dataflow edges of a chunk both ways, sorted by destination: ``(src, dst, 1 / in-degree of dst)``."""
    num = int(n.sum())
    e = np.fromiter((f.edge_index.shape[1] for f in feats), dtype=np.int64, count=len(feats))
    ei = np.concatenate([f.edge_index for f in feats], axis=1).astype(np.int64, copy=False)
    if ei.size:
        ei = ei + np.repeat(np.cumsum(n) - n, e)
    src = np.concatenate([ei[0], ei[1]])
    dst = np.concatenate([ei[1], ei[0]])
    order = np.argsort(dst, kind="stable")
    deg = np.maximum(np.bincount(dst, minlength=num), 1).astype(np.float32)
    src, dst = src[order], dst[order]
    return src, dst, (np.float32(1.0) / deg)[dst]


# ---------------------------------------------------------------------------------------- the derived file
def checkpoint_digest(path: Path) -> str:
    """SHA-256 of a checkpoint file's bytes (hex).

    Raises:
        CheckpointError: ``path`` is missing, unreadable or not a regular file (a FIFO is refused, never waited
            on).
    """
    h = hashlib.sha256()
    with open_regular(path, "predictor checkpoint", error=CheckpointError) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def derived_weights_path(digest: str) -> Path:
    """Where the derived weights of the checkpoint with SHA-256 ``digest`` live."""
    return cache_dir() / "checkpoints" / f"{digest}.npz"


def write_derived_weights(digest: str, state: Mapping[str, np.ndarray], meta_json: str,
                          novelty_ref: np.ndarray | None) -> Path | None:
    """Write the derived weights file of a checkpoint (atomically); ``None`` (logged) when the cache directory
    is not writable: the next process loads the checkpoint through torch again."""
    path = derived_weights_path(digest)
    arrays: dict[str, np.ndarray] = {f"state.{k}": np.asarray(v, dtype=np.float32) for k, v in state.items()}
    arrays["meta"] = np.array(meta_json)
    arrays["sha256"] = np.array(digest)
    arrays["format"] = np.array(DERIVED_FORMAT)
    if novelty_ref is not None:
        arrays["novelty_ref"] = np.asarray(novelty_ref, dtype=np.float32)
    arrays[_ARRAYS_DIGEST] = np.array(arrays_digest(digest, arrays))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:16]}-", suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        logger.debug("predictor: cannot write the derived weights %s: %s", path, e)
        return None
    _prune(path.parent, keep=path)
    return path


def _prune(folder: Path, keep: Path) -> None:
    """Delete the oldest derived files beyond :data:`DERIVED_KEEP` (never ``keep``, the one just written)."""
    try:
        files = sorted(folder.glob("*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in [p for p in files if p != keep][max(DERIVED_KEEP - 1, 0):]:
            old.unlink(missing_ok=True)
    except OSError as e:  # another process pruning at once, a file gone between glob and stat
        logger.debug("predictor: pruning the derived weights in %s: %s", folder, e)


def arrays_digest(digest: str, arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 (hex) binding the arrays of a derived file to the checkpoint with SHA-256 ``digest``: of the
    checkpoint's digest and, by name, every array's name, dtype, shape and bytes (``arrays_sha256`` itself left
    out)."""
    h = hashlib.sha256(b"dippm-nas derived weights\0" + digest.encode() + b"\0")
    for name in sorted(n for n in arrays if n != _ARRAYS_DIGEST):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _check_values(state: Mapping[str, np.ndarray], ref: np.ndarray | None) -> None:
    """Raise ``ValueError`` naming the arrays that are not finite, or standardisation scales that are not > 0."""
    bad = sorted(n for n, a in state.items() if a.dtype.kind == "f" and not np.isfinite(a).all())
    if ref is not None and not np.isfinite(ref).all():
        bad.append("novelty_ref")
    if bad:
        raise ValueError(f"arrays {bad} hold NaN or infinite values")
    scales = sorted(n for n, a in state.items() if n.endswith("_std") and a.dtype.kind == "f" and not (a > 0).all())
    if scales:
        raise ValueError(f"standardisation scales {scales} must be > 0")


def read_derived_weights(digest: str) -> tuple[dict[str, np.ndarray], str, np.ndarray | None] | None:
    """``(state, meta JSON, novelty_ref)`` of the derived file of the checkpoint with SHA-256 ``digest``, or
    ``None`` when there is none or it cannot be trusted (unreadable, another layout, another digest inside,
    arrays that do not match their ``arrays_sha256``, weights that are not finite); every such file is logged
    with its path and the reason."""
    path = derived_weights_path(digest)
    try:
        with np.load(path, allow_pickle=False) as z:
            files = set(z.files)
            if not {"meta", "sha256", "format", _ARRAYS_DIGEST} <= files:
                raise ValueError(f"keys {sorted(files)} lack meta, sha256, format or {_ARRAYS_DIGEST}")
            if int(z["format"]) != DERIVED_FORMAT or str(z["sha256"]) != digest:
                raise ValueError(f"format {int(z['format'])} / digest {str(z['sha256'])[:12]}... is not "
                                 f"{DERIVED_FORMAT} / {digest[:12]}...")
            arrays = {k: z[k] for k in files}
        if arrays_digest(digest, arrays) != str(arrays[_ARRAYS_DIGEST]):
            raise ValueError(f"its arrays do not match their {_ARRAYS_DIGEST} (changed after it was written)")
        state = {k[len("state."):]: v for k, v in arrays.items() if k.startswith("state.")}
        ref = arrays.get("novelty_ref")
        _check_values(state, ref)
        meta_json = str(arrays["meta"])
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - a damaged file is a miss: the torch path loads the checkpoint
        logger.info("predictor: ignoring the derived weights %s (%s: %s); the checkpoint is read through torch "
                    "and the file written again", path, type(e).__name__, e)
        return None
    return state, meta_json, ref
