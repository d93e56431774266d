"""Training splits: the timm-family split (held-out timm model families by hash), the CLI flags, and
evaluation σ equal to the σ the predictor returns."""

from __future__ import annotations

import math

import pytest
import torch

from dippm_nas.errors import DippmNasError
from dippm_nas.features import featurize
from dippm_nas.training import evaluate_examples
from dippm_nas.training import Example, heldout_timm_families, split_examples, timm_family
from test_predictor import DEV, _graphs, _predictor
from _models import features_deployment


def _ex(key: str, *, source: str = "timm", name: str = "", device: str = "rtx-3090", family: str = "timm") -> Example:
    return Example(None, device, {"latency_ms": 1.0}, family, key, source, name)  # type: ignore[arg-type]


def _timm_rows() -> list[Example]:
    out = []
    for f in range(60):
        for v in range(3):
            for dev in ("rtx-3090", "rtx-4090"):
                out.append(_ex(f"k{f}_{v}", name=f"fam{chr(97 + f % 26)}{chr(97 + f // 26)}_{v}", device=dev))
    return out


@pytest.mark.parametrize("name, fam", [
    ("resnet50", "resnet"), ("resnet50d", "resnet"), ("vit_base_patch16_224", "vit"), ("convnext_tiny", "convnext"),
    ("convnextv2_tiny", "convnextv"), ("tf_efficientnet_b0", "efficientnet"), ("efficientnet_b0", "efficientnet"),
    ("gluon_resnet50_v1b", "resnet"), ("legacy_seresnet18", "seresnet"), ("mobilenetv3_large_100", "mobilenetv"),
    ("ResNet18", "resnet"),
])
def test_timm_family_names(name: str, fam: str) -> None:
    assert timm_family(name) == fam


def test_timm_family_split_holds_out_whole_families_and_keeps_other_rows_random() -> None:
    accel = [_ex(f"a{i}", source="accel-nasbench", device=d, family="mbconv") for i in range(300)
             for d in ("a100-sxm4-40gb", "rtx-3090")]
    rows = accel + _timm_rows()
    tr, va, te = split_examples(rows, mode="timm-family", seed=0, holdout_frac=0.25)
    assert len(tr) + len(va) + len(te) == len(rows)
    held = set(heldout_timm_families(rows, holdout_frac=0.25, seed=0))
    assert 0.1 < len(held) / 60 < 0.4  # ~25% of 60 families
    # every timm row of a held-out family is test; no timm row of another family is
    for part, is_test in ((tr, False), (va, False), (te, True)):
        for e in part:
            if e.source == "timm":
                assert (timm_family(e.name) in held) == is_test
    # the non-timm rows are split exactly as the random split splits them
    rtr, rva, rte = split_examples(accel, mode="random", seed=0)
    for mine, ref in ((tr, rtr), (va, rva), (te, rte)):
        assert [e.key + e.device for e in mine if e.source != "timm"] == [e.key + e.device for e in ref]
    # an architecture measured on two GPUs is on one side only
    side = {}
    for name, part in (("tr", tr), ("va", va), ("te", te)):
        for e in part:
            assert side.setdefault(e.key, name) == name
    # another seed holds out other families
    assert set(heldout_timm_families(rows, holdout_frac=0.25, seed=1)) != held


def test_timm_family_split_sends_an_architecture_shared_with_a_heldout_family_to_test() -> None:
    rows = _timm_rows()
    held = heldout_timm_families(rows, holdout_frac=0.25, seed=0)
    kept = next(f"fam{chr(97 + f % 26)}{chr(97 + f // 26)}" for f in range(60)
                if f"fam{chr(97 + f % 26)}{chr(97 + f // 26)}" not in held)
    shared = [_ex("same", name=f"{held[0]}_x"), _ex("same", name=f"{kept}_x", device="rtx-4090")]
    _, _, te = split_examples(rows + shared, mode="timm-family", seed=0)
    assert sum(e.key == "same" for e in te) == 2


def test_timm_family_split_errors() -> None:
    accel = [_ex(f"a{i}", source="accel-nasbench") for i in range(10)]
    with pytest.raises(DippmNasError, match="needs timm rows"):
        split_examples(accel, mode="timm-family")
    with pytest.raises(DippmNasError, match="holdout_frac"):
        split_examples(_timm_rows(), mode="timm-family", holdout_frac=1.0)
    with pytest.raises(DippmNasError, match="split mode"):
        split_examples(accel, mode="nope")


def test_cli_accepts_the_new_flags_and_keeps_the_old_ones() -> None:
    from dippm_nas.cli._main import build_parser

    p = build_parser()
    a = p.parse_args(["train", "--data", "a.jsonl", "--data", "b.sqlite", "--split", "timm-family",
                      "--holdout-frac", "0.3", "--out", "x.pt"])
    assert a.data == ["a.jsonl", "b.sqlite"] and a.split == "timm-family" and a.holdout_frac == 0.3
    a = p.parse_args(["train", "--data", "a.jsonl", "--split", "family", "--holdout", "resnet,vit", "--out", "x.pt"])
    assert a.holdout == "resnet,vit" and a.holdout_frac == 0.25
    a = p.parse_args(["evaluate", "--checkpoint", "c.pt", "--data", "t.sqlite", "--split", "timm-family",
                      "--eval-device", "rtx-3090", "--json", "r.json"])
    assert a.eval_device == "rtx-3090" and a.json_out == "r.json" and a.json is False  # --json PATH: deprecated form
    assert p.parse_args(["evaluate", "--checkpoint", "c.pt", "--data", "t.sqlite"]).eval_device is None


def test_evaluation_sigma_is_the_predictors_sigma_outside_the_training_range() -> None:
    p = _predictor()
    graphs = _graphs(3)
    feats = [featurize(g, DEV) for g in graphs]
    from dippm_nas.predictor import collate

    b = collate(feats[:2])
    p.model.set_stats(b["x"], b["static"], b["dev"], torch.zeros(3), torch.full((3,), 0.4))
    preds = p.predict_graphs(graphs, mig=False, deployment=features_deployment())  # evaluation's: the features'
    exs = [Example(g, DEV, {"latency_ms": 1.0}, "x", g.structural_hash()) for g in graphs]
    _, rows = evaluate_examples(p, feats, exs)
    assert [r["outside_training_range"] for r in rows] == [bool(pr.details["outside_training_range"]) for pr in preds]
    assert rows[2]["outside_training_range"]
    for r, pr in zip(rows, preds):
        assert math.isclose(r["latency_ms_std"], pr.latency_ms_std, rel_tol=1e-6)
