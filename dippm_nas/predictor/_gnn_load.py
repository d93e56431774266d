"""Checkpoint files of :class:`~dippm_nas.predictor.GnnPredictor`: a ``.pt`` file (or its derived numpy weights)
read into a network engine and its checked metadata, and written back.

:func:`load_checkpoint` is what :meth:`GnnPredictor.load` does: in a process that has not imported torch, the
checkpoint's derived weights file (plain numpy arrays in the cache directory, named by the checkpoint's SHA-256;
see :mod:`~dippm_nas.predictor._numpy_ensemble`) is read and the numpy engine answers; a checkpoint loaded through
torch writes that file when it is missing. :func:`save_checkpoint` writes the ``.pt`` file and its ``.json``
sidecar.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from dippm_nas._files import check_output, output_path, write_output
from dippm_nas.devices import resolve_device
from dippm_nas.errors import CheckpointError, InvalidValueError
from dippm_nas.predictor._checkpoint import is_shipped_checkpoint
from dippm_nas.predictor._meta import CheckpointMeta
from dippm_nas.predictor._numpy_ensemble import (NumpyEnsemble, checkpoint_digest, derived_weights_path,
                                                  read_derived_weights, write_derived_weights)

if TYPE_CHECKING:  # pragma: no cover
    from dippm_nas.predictor._ensemble import SageEnsemble

__all__ = ["ENGINES", "load_checkpoint", "save_checkpoint", "torch_engine", "to_torch", "weights_sha256"]

logger = logging.getLogger(__name__)

#: What :meth:`GnnPredictor.load` accepts as ``engine``.
ENGINES = ("auto", "torch", "numpy")

P = TypeVar("P")
#: ``build(engine_or_model, meta, novelty_ref)``: the predictor of a loaded checkpoint
Build = Callable[[Any, CheckpointMeta, Any], P]


def load_checkpoint(path: str | Path, device: str | None, engine: str, build: Build[P]) -> tuple[P, str, Path]:
    """The predictor ``build`` makes of checkpoint ``path`` (see the module docstring), its SHA-256 and path.

    Raises:
        CheckpointError: unreadable file, bad metadata, schema/width mismatch, other device.
        InvalidValueError: an unknown ``engine``.
    """
    if engine not in ENGINES:
        raise InvalidValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    path = Path(path)
    try:
        digest = checkpoint_digest(path)
    except OSError as e:
        raise CheckpointError(f"cannot read predictor checkpoint {path}: {type(e).__name__}: {e}") from e
    if engine == "numpy" or (engine == "auto" and "torch" not in sys.modules):
        derived = read_derived_weights(digest)
        if derived is None and engine == "numpy":
            _load_torch(path, digest, device)  # writes the derived file
            derived = read_derived_weights(digest)
        if derived is not None:
            try:
                return _from_arrays(path, derived, device, build), digest, path
            except CheckpointError as e:  # the torch path reads the checkpoint itself (and rewrites the file)
                if engine == "numpy":
                    raise
                logger.info("predictor: derived weights of %s not used: %s", path, e)
        elif engine == "numpy":
            raise CheckpointError(f"the derived weights of {path} could not be written to "
                                  f"{derived_weights_path(digest)} (is the cache directory writable?)")
    model, meta, ref = _load_torch(path, digest, device)
    return build(model, meta, ref), digest, path


def _from_arrays(path: Path, derived: tuple[dict[str, np.ndarray], str, np.ndarray | None], device: str | None,
                 build: Build[P]) -> P:
    state, meta_json, ref = derived
    meta = _checked_meta(path, meta_json, device)
    if ref is not None and (ref.ndim != 2 or ref.shape[1] != meta.static_dim):
        raise CheckpointError(f"checkpoint {path} novelty_ref must be a [R, {meta.static_dim}] array, "
                              f"got {ref.shape}")
    engine = NumpyEnsemble(state, meta)
    logger.info("loaded predictor checkpoint %s (device %s, targets %s; numpy engine)", path, meta.device,
                list(meta.targets))
    return build(engine, meta, ref)


def _load_torch(path: Path, digest: str, device: str | None) -> tuple["SageEnsemble", CheckpointMeta, Any]:
    """The torch ensemble, metadata and novelty reference of ``path`` (writing its derived weights file when
    missing)."""
    import torch

    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a checkpoint error
        raise CheckpointError(f"cannot read predictor checkpoint {path}: {_load_error_text(e)}") from e
    if not isinstance(blob, dict) or "meta" not in blob or "state" not in blob:
        raise CheckpointError(f"checkpoint {path} must hold a dict with 'meta' and 'state', got {type(blob).__name__}")
    meta = _checked_meta(path, blob["meta"], device)
    model = _torch_ensemble().SageEnsemble(meta.node_dim, meta.static_dim, meta.device_dim, meta.hidden,
                                           meta.layers, meta.members, meta.residual_on_prior)
    try:
        model.load_state_dict(blob["state"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path} weights do not match its metadata: {e}") from e
    ref = blob.get("novelty_ref")
    if ref is not None and (not isinstance(ref, torch.Tensor) or ref.dim() != 2 or ref.shape[1] != meta.static_dim):
        raise CheckpointError(f"checkpoint {path} novelty_ref must be a [R, {meta.static_dim}] tensor, "
                              f"got {getattr(ref, 'shape', type(ref).__name__)}")
    if read_derived_weights(digest) is None:
        write_derived_weights(digest, {k: v.detach().numpy() for k, v in model.state_dict().items()},
                              blob["meta"], None if ref is None else ref.detach().to(torch.float32).numpy())
    logger.info("loaded predictor checkpoint %s (device %s, targets %s)", path, meta.device, list(meta.targets))
    return model, meta, ref


def save_checkpoint(model: "SageEnsemble", meta: CheckpointMeta, novelty_ref: Any, path: str | Path) -> None:
    """Write ``path`` (``.pt``) and its ``.json`` metadata sidecar, each through a temporary file renamed into
    place (:func:`dippm_nas._files.output_path`).

    Raises:
        CheckpointError: ``path`` or its sidecar is a directory, a FIFO, a device or a dangling symbolic
            link, or the write fails.
    """
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    blob: dict[str, Any] = {"meta": meta.to_json(), "state": state}
    if novelty_ref is not None:
        blob["novelty_ref"] = torch.as_tensor(novelty_ref).detach().to(torch.float32).clone()
    check_output(path.with_suffix(".json"), "checkpoint sidecar", error=CheckpointError)
    with output_path(path, "checkpoint", error=CheckpointError) as tmp:
        torch.save(blob, tmp)
    write_output(path.with_suffix(".json"), meta.to_json() + "\n", "checkpoint sidecar", error=CheckpointError)


def to_torch(engine: NumpyEnsemble, meta: CheckpointMeta, novelty_ref: Any) -> tuple[Any, Any]:
    """The torch engine built from a numpy engine's weights, and the novelty reference as a tensor."""
    import torch

    m = meta
    model = _torch_ensemble().SageEnsemble(m.node_dim, m.static_dim, m.device_dim, m.hidden, m.layers,
                                           m.members, m.residual_on_prior)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in engine.state_dict().items()})
    if isinstance(novelty_ref, np.ndarray):
        novelty_ref = torch.from_numpy(novelty_ref.copy())
    return torch_engine(model), novelty_ref


def weights_sha256(engine: Any) -> str:
    """SHA-256 of an engine's weights (float32, by sorted name): the hash of a predictor built in memory."""
    h = hashlib.sha256()
    for k, v in sorted(engine.state_dict().items()):
        h.update(k.encode())
        h.update(np.ascontiguousarray(v, dtype=np.float32).tobytes())
    return h.hexdigest()


def _torch_ensemble() -> Any:
    """The torch ensemble's module, imported with the first torch ensemble: a prediction through the numpy
    engine never loads torch."""
    from dippm_nas.predictor import _ensemble

    return _ensemble


def torch_engine(model: "SageEnsemble") -> Any:
    """The engine that runs a torch ensemble (:class:`~dippm_nas.predictor._ensemble.TorchEngine`)."""
    return _torch_ensemble().TorchEngine(model)


#: The part of torch's refusal of a non-weights object that names it ("Unsupported global: GLOBAL argparse.Namespace").
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _load_error_text(e: Exception) -> str:
    """What ``torch.load(weights_only=True)`` raised, without torch's advice to load the file with
    ``weights_only=False`` or to allow-list its classes: either would run code a checkpoint file carries, and a
    predictor checkpoint holds tensors and plain data only."""
    text = str(e)
    if "weights_only" not in text and "Weights only load failed" not in text:
        return f"{type(e).__name__}: {text}"
    m = _UNSUPPORTED_GLOBAL.search(text)
    what = f"an object of class {m.group(1)}" if m else "an object that is not tensors or plain data"
    return (f"it holds {what}, and predictor checkpoints are read with torch.load(weights_only=True), which "
            "never unpickles objects (they can run code); a checkpoint written by GnnPredictor.save or "
            "`dippm-nas train` holds tensors and plain data only: write it again with one of those")


def _checked_meta(path: Path, meta_json: Any, device: str | None) -> CheckpointMeta:
    """The checked metadata of checkpoint ``path``, which must answer for ``device`` (when given)."""
    meta = CheckpointMeta.from_json(meta_json, origin=f"checkpoint {path}", trusted=is_shipped_checkpoint(path))
    meta.check()
    if device is not None and resolve_device(device).id != meta.device:
        raise CheckpointError(f"checkpoint {path.name} is for device {meta.device!r}, asked for {device!r}")
    return meta
