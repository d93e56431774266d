"""benchmarks/accuracy/accuracy_timm_transformers.py: the family of a timm model name and the per-GPU summary (the
scoring needs a captured timm dataset and runs as a script)."""

from __future__ import annotations


import pytest


from _scripts import load_script
def _load():
    return load_script("accuracy_timm_transformers")


def test_family_of_timm_names() -> None:
    m = _load()
    assert m.family_of("vit_base_patch16_224") == "vit" and m.family_of("flexivit_small") == "vit"
    assert m.family_of("deit_base_distilled_patch16_224") == "deit"
    assert m.family_of("swin_small_patch4_window7_224") == "swin"
    assert m.family_of("beitv2_base_patch16_224") == "beit"
    assert m.family_of("resnet50") is None and m.family_of("densenet169") is None


def test_summary_per_gpu_and_family() -> None:
    m = _load()
    keys = [f"{v}_{mode}_ms" for v in m.VARIANTS for mode in m.MODES]
    recs = [{"device": "rtx-3090", "family": "vit", "label_ms": 10.0, **dict.fromkeys(keys, 12.0)},
            {"device": "rtx-3090", "family": "swin", "label_ms": 10.0, **dict.fromkeys(keys, 9.0)}]
    s = m.summarise(recs)
    assert s["gpus"]["rtx-3090"]["n"] == 2
    assert s["gpus"]["rtx-3090"]["after_described"] == pytest.approx(15.0)
    assert s["cells"]["rtx-3090 swin"]["before_undescribed"] == pytest.approx(10.0)
