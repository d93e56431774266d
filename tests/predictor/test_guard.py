"""The leave-group-out guards of an adaptation (dippm_nas/predictor/_guard.py): the groups of the measured rows, a
group's own bias that leave-one-row-out would learn and leave-group-out does not, and a shared trend that both keep."""

from __future__ import annotations

import numpy as np

from dippm_nas.predictor import fit_residual_head
from dippm_nas.predictor._guard import keep_targets, row_groups


def test_rows_are_grouped_by_family_else_by_embedding_clusters() -> None:
    g = row_groups(["ResNet", "ResNet(50)", "VGG", "VGG", "MobileNetV2"], None)
    assert g.by == "family" and g.count == 3 and g.index[0] == g.index[1] and g.index[2] == g.index[3]
    rng = np.random.default_rng(0)
    emb = np.concatenate([rng.normal(0, 0.1, (10, 4)), rng.normal(5, 0.1, (10, 4))])
    c = row_groups(["MBConvNet"] * 20, emb)
    assert c.by == "clusters" and 2 <= c.count <= 5
    # no cluster mixes the two blobs
    assert not set(c.index[:10]) & set(c.index[10:])
    assert row_groups(["X", "X"], emb[:2]).by == "rows"
    # a library prefix is not the family: the model's name is
    tv = row_groups(["torchvision:densenet121", "torchvision:densenet169", "torchvision:vgg16", "timm:vgg11"], None)
    assert tv.by == "family" and tv.count == 2 and tv.index[0] == tv.index[1] and tv.index[2] == tv.index[3]


def _grouped(rng: np.random.Generator, n_groups: int = 6, per: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    groups = np.repeat(np.arange(n_groups), per)
    onehot = np.eye(n_groups)[groups]
    h = np.concatenate([onehot, rng.normal(0, 1, (len(groups), 3))], 1)
    h = h[None] + rng.normal(0, 0.02, (3, *h.shape))  # three members, nearly the same features
    return h, groups, onehot


def test_a_groups_own_bias_is_not_carried_to_the_next_group() -> None:
    rng = np.random.default_rng(1)
    h, groups, _ = _grouped(rng)
    bias = rng.choice([-0.3, 0.3], size=groups.max() + 1)
    r = bias[groups] + rng.normal(0, 0.01, len(groups))
    loo = fit_residual_head("latency_ms", h, r)  # each row its own group: learns each family's bias
    assert loo.ridge is not None
    logo = fit_residual_head("latency_ms", h, r, groups=groups)
    assert logo.ridge is None and not logo.members(h).any()


def test_a_trend_shared_by_every_group_is_kept_nearly_whole() -> None:
    rng = np.random.default_rng(2)
    h, groups, _ = _grouped(rng, n_groups=5, per=8)
    r = 0.2 * h.mean(0)[:, -1] + rng.normal(0, 0.01, len(groups))
    head = fit_residual_head("latency_ms", h, r, groups=groups)
    assert head.ridge is not None and head.shrink > 0.7
    assert head.loo_rmse_log < 0.5 * head.loo_rmse_none_log
    resid = r - head.members(h).mean(0)
    assert np.sqrt(np.mean(resid ** 2)) < 0.05


def test_factors_are_kept_only_where_they_win_out_of_group() -> None:
    raw = {"latency_ms": np.full(12, 0.4), "memory_mib": np.array([0.1, -0.1] * 6)}
    oog = {"latency_ms": np.full(12, 0.05) + np.linspace(-0.01, 0.01, 12), "memory_mib": np.array([0.3, -0.3] * 6)}
    assert keep_targets(raw, oog) == {"latency_ms": True, "memory_mib": False}
    assert keep_targets({"latency_ms": np.array([0.4, np.nan])}, {"latency_ms": np.array([0.0, 0.0])}) == \
        {"latency_ms": False}  # one row of evidence is none
