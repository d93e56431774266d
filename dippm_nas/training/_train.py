"""Training the GraphSAGE ensemble: hyper-parameters, the training loop, std floors and the checkpoint metadata.

Examples and splits are :mod:`dippm_nas.training._examples`; the validation split selects the epoch of each
member and fits the std floor; the test split is only ever used to report.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dippm_nas._platform import cpu_model_name, cpu_signature
from dippm_nas.devices import host_facts, resolve_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.features import FEATURE_SCHEMA_VERSION, GraphFeatures, device_dim, node_dim, static_dim
from dippm_nas.predictor import (DELTA_MARGIN, HOST_DEVICE, TARGET_UNITS, TARGETS, CheckpointMeta, GnnPredictor,
                                 NoveltyFloor, SageEnsemble, collate, collate_globals, novelty_scores)
from dippm_nas.prior import default_params
from dippm_nas.training._evaluate import metrics_table
from dippm_nas.training._examples import (Example, featurize_examples, heldout_timm_families, is_timm, labels_log,
                                          load_examples, split_examples)
from dippm_nas.training._novelty import fit_novel_floor, reference_set, split_d0

__all__ = ["TrainConfig", "train_ensemble", "fit_std_floor", "attach_novelty_reference", "train_predictor"]

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Hyper-parameters (defaults sized for a 2-core CPU).

    Attributes:
        hidden: hidden width; layers: SAGE blocks; members: ensemble size K.
        epochs: maximum epochs per member; patience: stop a member after this many epochs without a
            better validation loss.
        batch_size: graphs per step; lr, weight_decay: AdamW.
        huber_beta: Huber (smooth L1) transition, in log units (0.02 ≈ 2%).
        correction_penalty: with ``residual_on_prior``, adds this times the mean squared correction of
            the prior (log units, labelled targets only) to the training loss: the network then corrects
            the prior only where the data keep asking for it (0: off, the default). A float applies to
            every target; a ``{target: weight}`` mapping to the targets it names (a poor prior, such as
            the host's memory prior, needs its correction).
        style: feature style; fuse: coarsen; residual_on_prior: learn corrections of the prior.
        time_budget_s: wall-clock budget of all members together (split evenly).
        seed: base seed (member ``k`` uses ``seed + k``).
    """

    hidden: int = 64
    layers: int = 3
    members: int = 5
    epochs: int = 200
    patience: int = 30
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-5
    huber_beta: float = 0.02
    correction_penalty: float | dict[str, float] = 0.0
    style: str = "ours"
    fuse: bool = True
    residual_on_prior: bool = True
    time_budget_s: float = 840.0
    seed: int = 0
    threads: int = 2
    history: list[dict[str, float]] = field(default_factory=list, repr=False)


def _penalty_weights(cfg: TrainConfig) -> torch.Tensor | None:
    """``[3]`` per-target weights of the correction penalty, or ``None`` when it is off.

    Raises:
        DippmNasError: a negative weight or an unknown target.
    """
    p = cfg.correction_penalty
    w = dict(p) if isinstance(p, dict) else {t: float(p) for t in TARGETS}
    bad = {t: v for t, v in w.items() if t not in TARGETS or not (float(v) >= 0.0)}
    if bad:
        raise InvalidValueError(f"correction_penalty takes weights >= 0 for targets {list(TARGETS)}, got {bad}")
    if not cfg.residual_on_prior or not any(float(v) > 0 for v in w.values()):
        return None
    return torch.tensor([float(w.get(t, 0.0)) for t in TARGETS])


def _loss(pred: torch.Tensor, y: torch.Tensor, beta: float) -> torch.Tensor:
    mask = ~torch.isnan(y)
    if not mask.any():
        return pred.sum() * 0.0
    return torch.nn.functional.smooth_l1_loss(pred[mask], y[mask], beta=beta)


def train_ensemble(train_f: Sequence[GraphFeatures], train_y: torch.Tensor, val_f: Sequence[GraphFeatures],
                   val_y: torch.Tensor, cfg: TrainConfig, *, progress: bool = True) -> SageEnsemble:
    """Train ``cfg.members`` members; each keeps its best-validation-epoch weights.

    Shapes:
        ``train_y``, ``val_y``: ``[N, 3]`` log labels, NaN where a target is not measured.
    """
    torch.set_num_threads(cfg.threads)
    nd, sd = train_f[0].x.shape[1], train_f[0].static.shape[0]
    model = SageEnsemble(nd, sd, device_dim(), cfg.hidden, cfg.layers, cfg.members, cfg.residual_on_prior)
    allb = collate(train_f)
    ym = torch.nanmean(train_y, 0)
    gap = (train_y - allb["log_prior"]).abs()
    gap = torch.where(torch.isnan(gap), torch.zeros_like(gap), gap).amax(0)
    delta_max = (DELTA_MARGIN * gap).clamp_min(0.1)
    model.set_stats(allb["x"], allb["static"], allb["dev"], torch.nan_to_num(ym, nan=0.0), delta_max)
    logger.info("correction bound delta_max (log units) per target: %s", [round(float(v), 3) for v in delta_max])
    vb = collate(val_f) if val_f else None
    # all members step together on the same batches (one Python loop, K independent parameter sets);
    # each keeps the weights of its own best validation epoch
    n = len(train_f)
    K = cfg.members
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    penalty = _penalty_weights(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    best = [float("inf")] * K
    best_state: list[dict[str, torch.Tensor] | None] = [None] * K
    bad = [0] * K
    t0 = time.perf_counter()
    bar = tqdm(range(cfg.epochs), desc=f"training {K} members", disable=not progress, leave=False)
    for ep in bar:
        model.train()
        idx = list(range(n))
        rng.shuffle(idx)
        tot = 0.0
        for s in range(0, n, cfg.batch_size):
            bi = idx[s:s + cfg.batch_size]
            b = collate([train_f[i] for i in bi])
            out = model(b)  # [K, B, 3]
            loss = sum(_loss(out[k], train_y[bi], cfg.huber_beta) for k in range(K))
            if penalty is not None:
                seen = ~torch.isnan(train_y[bi])
                corr2 = (out - b["log_prior"].unsqueeze(0)) ** 2 * penalty  # [K, B, 3], weighted per target
                loss = loss + K * corr2[:, seen].mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0 * K)
            opt.step()
            tot += float(loss.detach()) / K * len(bi)
        sched.step()
        model.eval()
        with torch.no_grad():
            vout = model(vb) if vb is not None else None
        for k in range(K):
            vl = float(_loss(vout[k], val_y, cfg.huber_beta)) if vout is not None else tot / n
            if vl < best[k] - 1e-7:
                best[k], bad[k] = vl, 0
                best_state[k] = {name: p[k].detach().clone() for name, p in model.named_parameters()}
            else:
                bad[k] += 1
        cfg.history.append({"epoch": ep, "train_loss": tot / n, "val_loss_best": min(best),
                            "seconds": time.perf_counter() - t0})
        bar.set_postfix(train=f"{tot / n:.5f}", val=f"{min(best):.5f}")
        logger.info("epoch %d: train loss %.5f, best val loss %.5f (%.0f s)", ep, tot / n, min(best), time.perf_counter() - t0)
        if min(bad) >= cfg.patience or time.perf_counter() - t0 > cfg.time_budget_s:
            break
    with torch.no_grad():
        params = dict(model.named_parameters())
        for k in range(K):
            for name, v in (best_state[k] or {}).items():
                params[name][k].copy_(v)
    return model.eval()


def fit_std_floor(mean_log: np.ndarray, std_log: np.ndarray, y_log: np.ndarray, coverage: float = 0.95) -> float:
    """Smallest floor ``f`` with ``coverage`` of ``|y - mean| <= 2 sqrt(std² + f²)`` (validation data; rows
    without a label are ignored, no row at all gives 0)."""
    ok = ~np.isnan(y_log)
    if not ok.any():
        return 0.0
    return fit_novel_floor(np.abs(y_log[ok] - mean_log[ok]), std_log[ok], coverage=coverage)


def attach_novelty_reference(pred: GnnPredictor, train_feats: Sequence[GraphFeatures],
                             val_feats: Sequence[GraphFeatures], *, floor_log: dict[str, float] | None = None,
                             calibrated_on: str = "not calibrated: no rows of an unseen family") -> None:
    """Store the novelty reference set (training graphs) in ``pred`` and its threshold ``d0`` (validation
    quantile) in ``pred.meta.novelty``, with the novel-graph floors ``floor_log`` when given (see
    :mod:`dippm_nas.predictor._novelty`; ``scripts/fit/fit_novelty_floor.py`` fits them on unseen families)."""
    if not train_feats or not val_feats:
        return
    with torch.no_grad():
        pred.novelty_ref = reference_set(pred.model.static_z(collate_globals(train_feats)))
        d_val = novelty_scores(pred.model.static_z(collate_globals(val_feats)), pred.novelty_ref)
    pred.meta = dataclasses.replace(pred.meta, novelty=NoveltyFloor(
        d0=split_d0(d_val), floor_log=dict(floor_log or {}), calibrated_on=calibrated_on).to_dict())


def _label_threads(ex: Sequence[Example], device: str) -> int:
    """The torch thread count host-cpu features are computed at: the one every host row was measured
    with (``environment.threads``), else this process's (rows recording none, or several counts: then
    with a warning)."""
    counts = sorted({e.threads for e in ex if e.device == device and e.threads is not None})
    if len(counts) == 1:
        return counts[0]
    n = torch.get_num_threads()
    if counts:
        logger.warning("the %s rows were measured with several torch thread counts %s: their device features use "
                       "this process's %d; train one checkpoint per thread count", device, counts, n)
    return n


#: The fields of :func:`~dippm_nas._platform.cpu_signature` that name a processor (microcode and the
#: reported cache size can change under a VM with the same processor).
_PROCESSOR_FIELDS = ("vendor", "family", "model", "stepping", "flags_sha1")


def _processor(sig: dict[str, str]) -> dict[str, str]:
    return {k: sig[k] for k in _PROCESSOR_FIELDS if k in sig}


def _host_of(ex: Sequence[Example], device: str, threads: int | None = None) -> dict[str, Any] | None:
    """``CheckpointMeta.host`` of a host-cpu checkpoint: the CPU model its rows were measured on, the
    torch thread count its device features were measured at (``threads``, default
    :func:`_label_threads`: the rows' own; the predictor measures the host at this count whatever the
    caller's, so it answers for the measurements' thread count), the host microbenchmark they come
    from (this machine's) and the processors: ``label_processors``, those the rows record (distinct,
    where recorded), and ``features_processor``, this machine's. VMs sold under one CPU model string can
    be different processors, so a training run on another one than the rows' is warned about; ``None``
    for other devices.

    Raises:
        DippmNasError: host rows of several CPU models (one checkpoint per CPU model), or none recording it.
    """
    if device != HOST_DEVICE:
        return None
    rows = [e for e in ex if e.device == device]
    models = sorted({e.cpu_model for e in rows})
    if len(models) != 1 or not models[0]:
        raise InvalidValueError(f"a {device} checkpoint learns one CPU model: its rows must all record the same "
                                f"environment.cpu_model, got {models} (train one checkpoint per CPU model, "
                                "e.g. with one dataset file each)")
    threads = _label_threads(ex, device) if threads is None else threads
    facts = host_facts(threads=threads)
    here = cpu_model_name()
    if here != models[0]:
        logger.warning("the %s rows were measured on %r but this machine is %r: the device features come from "
                       "this machine's microbenchmark; train on the machine the data was measured on", device,
                       models[0], here)
    label_processors = [dict(t) for t in sorted({tuple(sorted(_processor(e.cpu_signature).items()))
                                                 for e in rows if e.cpu_signature})]
    this_processor = _processor(cpu_signature())
    unrecorded = sum(e.cpu_signature is None for e in rows)
    if label_processors and this_processor and this_processor not in label_processors:
        logger.warning("the %s rows were measured on the processor(s) %s but this machine's is %s (one CPU model "
                       "string %r can name several processors): the device features come from this machine's "
                       "microbenchmark; train on the machine the data was measured on", device, label_processors,
                       this_processor, models[0])
    keep = ("name", "fp32_tflops", "bandwidth_gbps", "host_dispatch_us", "sms", "l2_mib", "key", "measured_at")
    out: dict[str, Any] = {"cpu_model": models[0], "threads": threads,
                           "features_from": {k: facts.get(k) for k in keep},
                           "features_processor": this_processor, "label_processors": label_processors}
    if unrecorded:
        out["label_rows_without_processor"] = unrecorded
    return out


def train_predictor(paths: Sequence[str | Path], device: str, *, split: str = "random", heldout_families: Sequence[str] = (),
                    devices: Sequence[str] | None = None, cfg: TrainConfig | None = None, data_sources: Sequence[str] = (),
                    command: str = "", progress: bool = True, examples: Sequence[Example] | None = None,
                    targets: Sequence[str] | None = None, holdout_frac: float = 0.25,
                    prior_params: Any = None, dtypes: Sequence[str] | None = None) -> tuple[GnnPredictor, dict[str, Any]]:
    """Load, split, featurise, train, fit the std floor and evaluate on the test split.

    Args:
        paths: dataset files.
        device: the catalogue id the checkpoint answers for (its rows give the held-out metrics).
        split: ``"random"``, ``"family"`` or ``"timm-family"``; heldout_families: for ``"family"``;
            holdout_frac: for ``"timm-family"``.
        devices: devices whose rows train the model (``None``: all in the data).
        dtypes: compute dtypes whose rows train the model (``None``: all in the data).
        cfg: hyper-parameters.
        data_sources: free-text description of the data for the metadata.
        examples: already loaded examples (skips ``paths``).
        targets: train only these targets (default: every target with labels); the others are answered
            by the analytic prior.
        prior_params: the analytic prior's constants (:class:`~dippm_nas.prior.PriorParams`) the features
            and the residual are computed with and the checkpoint pins (default: the shipped fitted ones).

    Returns:
        ``(predictor, report)``; ``report`` holds the split sizes, metrics and predictions on test.
    """
    cfg = cfg or TrainConfig()
    device = resolve_device(device).id
    ex = _training_examples(paths, examples, device, devices, dtypes, targets)
    tr, va, te = split_examples(ex, mode=split, heldout_families=heldout_families, seed=cfg.seed,
                                holdout_frac=holdout_frac)
    if split == "timm-family":
        heldout_families = heldout_timm_families(ex, holdout_frac=holdout_frac, seed=cfg.seed)
        logger.info("timm-family split holds out %d timm families: %s", len(heldout_families), heldout_families)
    logger.info("split %s: train %d, val %d, test %d", split, len(tr), len(va), len(te))
    params = prior_params if prior_params is not None else default_params()
    host_threads = _label_threads(ex, HOST_DEVICE) if any(e.device == HOST_DEVICE for e in ex) else None
    t0 = time.perf_counter()
    ftr, fva, fte = (featurize_examples(s, style=cfg.style, fuse=cfg.fuse, prior_params=params,
                                        host_threads=host_threads, progress=progress)
                     for s in (tr, va, te))
    feat_s = time.perf_counter() - t0
    ytr, yva = labels_log(tr), labels_log(va)
    t0 = time.perf_counter()
    model = train_ensemble(ftr, ytr, fva, yva, cfg, progress=progress)
    train_s = time.perf_counter() - t0
    targets = {t: TARGET_UNITS[t] for t in TARGETS if any(t in e.y for e in ex if e.device == device)}
    meta = CheckpointMeta(
        device=device, targets=targets, feature_schema_version=FEATURE_SCHEMA_VERSION, feature_style=cfg.style,
        data_sources=list(data_sources) or [str(p) for p in paths], heldout_metrics={}, date=date.today().isoformat(),
        trained_on=sorted({e.device for e in tr}), hidden=cfg.hidden, layers=cfg.layers, members=cfg.members,
        residual_on_prior=cfg.residual_on_prior, std_floor_log={}, prior_params=params.to_dict(),
        node_dim=node_dim(cfg.style), static_dim=static_dim(cfg.style), device_dim=device_dim(), command=command,
        host=_host_of(ex, device, host_threads),
    )
    pred = GnnPredictor(model, meta, device, load_calibration=False)
    floors = {}
    va_dev = [i for i, e in enumerate(va) if e.device == device]
    if va_dev:
        m, s = pred.predict_log([fva[i] for i in va_dev])
        y = labels_log([va[i] for i in va_dev]).numpy()
        for j, t in enumerate(TARGETS):
            if t in targets:
                floors[t] = fit_std_floor(m[:, j], s[:, j], y[:, j])
    pred.meta = dataclasses.replace(meta, std_floor_log=floors)
    attach_novelty_reference(pred, ftr, [fva[i] for i in va_dev])
    te_dev = [i for i, e in enumerate(te) if e.device == device]
    report: dict[str, Any] = {"split": split, "heldout_families": list(heldout_families),
                              "sizes": {"train": len(tr), "val": len(va), "test": len(te), "test_on_device": len(te_dev)},
                              "featurize_s": feat_s, "train_s": train_s, "config": {k: v for k, v in vars(cfg).items() if k != "history"}}
    _evaluate_on_test(pred, report, te, fte, te_dev, device, split, heldout_families)
    return pred, report


def _training_examples(paths: Sequence[str | Path], examples: Sequence[Example] | None, device: str,
                       devices: Sequence[str] | None, dtypes: Sequence[str] | None,
                       targets: Sequence[str] | None) -> list[Example]:
    """The examples :func:`train_predictor` trains on: loaded (or given), of ``devices``, with only ``targets``.

    Raises:
        InvalidValueError: an unknown target, or no example of ``device`` left.
    """
    ex = list(examples) if examples is not None else load_examples(paths, devices=devices, dtypes=dtypes)
    if devices is not None:
        ex = [e for e in ex if e.device in devices]
    if targets is not None:
        bad = [t for t in targets if t not in TARGETS]
        if bad:
            raise InvalidValueError(f"targets must be among {list(TARGETS)}, got {bad}")
        ex = [dataclasses.replace(e, y={t: v for t, v in e.y.items() if t in targets}) for e in ex]
        ex = [e for e in ex if e.y]
    if not any(e.device == device for e in ex):
        raise InvalidValueError(f"no examples of device {device!r} in the data; devices present: {sorted({e.device for e in ex})}")
    return ex


def _evaluate_on_test(pred: GnnPredictor, report: dict[str, Any], te: list[Example], fte: list[Any],
                      te_dev: list[int], device: str, split: str, heldout_families: Sequence[str]) -> None:
    """The test split's metrics in ``report`` and the checkpoint's ``heldout_metrics`` (and, for the timm-family
    split, the held-out timm families per GPU)."""
    if te_dev:
        tab, rows = metrics_table(pred, [fte[i] for i in te_dev], [te[i] for i in te_dev])
        report["metrics"] = tab
        report["rows"] = rows
        if split == "timm-family":
            heldout = {f"timm-family:{device} non-timm rows, random 70/15/15 test": tab}
        else:
            heldout = {f"{split}" + (f":{','.join(heldout_families)}" if heldout_families else ""): tab}
        pred.meta = dataclasses.replace(pred.meta, heldout_metrics=heldout)
    if split == "timm-family":
        # the held-out timm families, per GPU, through the device features
        by_dev: dict[str, Any] = {}
        for dev in sorted({e.device for e in te if is_timm(e)}):
            idx = [i for i, e in enumerate(te) if e.device == dev and is_timm(e)]
            by_dev[dev], _ = metrics_table(pred, [fte[i] for i in idx], [te[i] for i in idx])
        report["timm_heldout_metrics"] = by_dev
        pred.meta = dataclasses.replace(pred.meta, heldout_metrics={
            **pred.meta.heldout_metrics,
            **{f"timm-family:{dev} held-out timm families ({len(heldout_families)})": tab for dev, tab in by_dev.items()}})
