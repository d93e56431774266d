"""benchmarks/accuracy/accuracy_hwgpt.py: its row reading (A100 and energy rows dropped), sampling and metrics on a
tiny synthetic CSV (the scoring itself needs ../shared/data and runs as a script)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _scripts import load_script
from dippm_nas.errors import InvalidValueError

HEAD = ("search_space,arch_id,device,gpu_model,metric,median,batch_size,seq_len,precision,n_embd,n_layer,"
        "n_head_per_layer,mlp_ratio_per_layer,bias,head_size,padded_vocab_size\n")
ARCH = "192,2,4;8,2;3,False,64,50254"


def _load():
    return load_script("accuracy_hwgpt")


def _csv(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "hw.csv"
    p.write_text(HEAD + "".join(line + "\n" for line in lines))
    return p


def test_rows_are_read_and_a100_and_energy_rows_dropped(tmp_path: Path) -> None:
    m = _load()
    p = _csv(tmp_path, [
        f"s,s-00000,h100,NVIDIA H100,latency,6.5,8,1024,bfloat16_autocast,{ARCH}",
        f"s,s-00000,h100,NVIDIA H100,energy,0.01,8,1024,bfloat16_autocast,{ARCH}",
        f"s,s-00000,a100,NVIDIA A100,latency,not-a-number,8,1024,bfloat16_autocast,{ARCH}",  # never parsed
        f"m,m-00003,v100,NVIDIA V100,latency,12.0,4,1024,float16_autocast,{ARCH}",
    ])
    rows = m.read_hwgpt_rows(p)
    assert [(r.space, r.arch_id, r.device, r.autocast, r.batch_size, r.median_ms) for r in rows] == [
        ("s", "s-00000", "h100", "bfloat16", 8, 6.5), ("m", "m-00003", "v100", "float16", 4, 12.0)]
    assert rows[0].config["num_heads"] == [4, 8] and rows[0].config["seq_len"] == 1024


@pytest.mark.parametrize("bad,match", [
    ("s,s-1,h100,NVIDIA H100,latency,6.5,8,1024,int8,", r"precision in \['bfloat16_autocast'"),
    ("s,s-1,h100,NVIDIA H100,latency,-1,8,1024,bfloat16_autocast,", r"median must be > 0 ms"),
    ("s,s-1,h100,NVIDIA H100,latency,x,8,1024,bfloat16_autocast,", r":2: unreadable HW-GPT-Bench latency row"),
])
def test_a_bad_row_is_named(tmp_path: Path, bad: str, match: str) -> None:
    m = _load()
    with pytest.raises(InvalidValueError, match=match):
        m.read_hwgpt_rows(_csv(tmp_path, [bad + ARCH]))


def test_sample_is_seeded_and_per_space(tmp_path: Path) -> None:
    m = _load()
    lines = [f"{s},{s}-{i:05d},h100,NVIDIA H100,latency,{1 + i},8,1024,bfloat16_autocast,{ARCH}"
             for s in "sm" for i in range(6)]
    rows = m.read_hwgpt_rows(_csv(tmp_path, lines))
    a, b = m.sample_archs(rows, 3, seed=1), m.sample_archs(rows, 3, seed=1)
    assert a == b and set(a) == {"s", "m"} and all(len(v) == 3 for v in a.values())
    assert all(x.startswith("s-") for x in a["s"])
    assert m.sample_archs(rows, 10, seed=1)["s"] == [f"s-{i:05d}" for i in range(6)]


def test_metrics_of_known_ratios() -> None:
    m = _load()
    recs = [{"label_ms": 10.0, "p": 8.0}, {"label_ms": 20.0, "p": 16.0}, {"label_ms": 40.0, "p": 36.0}]
    out = m._metrics(recs, "p")
    assert out["mape_pct"] == pytest.approx(100 * (0.2 + 0.2 + 0.1) / 3)
    assert out["tau"] == pytest.approx(1.0) and out["ratio_min"] == pytest.approx(0.8)
    assert out["ratio_max"] == pytest.approx(0.9)


def _unit(released: str, backend: str, label: float, c: float, m: float, base: float = 1.0) -> dict:
    return {"released": released, "device": released, "arch_id": f"{released}-{label}", "attn_backend": backend,
            "label_ms": label, "unit_ms": base + max(c, m) / 1e3, "attn_compute_us": [c],
            "attn_memory_us": [m]}


def test_repricing_changes_only_the_attention_nodes_compute_bound_part() -> None:
    _load()
    import fit_transformer_kernels as ftk

    r = _unit("a40", "flash", 2.0, c=1000.0, m=200.0)
    assert ftk.repriced_ms(r, 1.0, 1.0) == pytest.approx(r["unit_ms"])
    assert ftk.repriced_ms(r, 0.5, 9.0) == pytest.approx(1.0 + 2.0)  # compute doubled, eta_efficient unused
    assert ftk.repriced_ms(r, 10.0, 1.0) == pytest.approx(1.0 + 0.2)  # memory-bound floor


def test_leave_one_gpu_out_fit_excludes_the_gpu() -> None:
    _load()
    import fit_transformer_kernels as ftk

    # a40 says eta 0.5 (label = 1 + 1000/0.5 µs), a6000 says 0.25; v100 the memory-efficient kernel at 0.4
    recs = [_unit("a40", "flash", 3.0, 1000.0, 0.0), _unit("a6000", "flash", 5.0, 1000.0, 0.0),
            _unit("v100", "efficient", 3.5, 1000.0, 0.0)]
    without_a6000 = ftk.fit_etas(recs, exclude="a6000", pooled=False)
    assert without_a6000["flash"] == pytest.approx(0.5, rel=0.04)
    assert ftk.fit_etas(recs, exclude="a40", pooled=False)["flash"] == pytest.approx(0.25, rel=0.04)
    assert without_a6000["efficient"] == pytest.approx(0.4, rel=0.04)
    assert ftk.fit_etas(recs, exclude="v100", pooled=False)["efficient"] is None
    # pooled: one value for both, between what each GPU says, the excluded GPU not among them
    pooled = ftk.fit_etas(recs, exclude="a6000")
    assert pooled["flash"] == pooled["efficient"] and 0.38 <= pooled["flash"] <= 0.52


def test_diagnosis_recovers_a_latency_per_memory_bound_kernel() -> None:
    """Rows made as compute + memory + 3 µs per memory-bound kernel: the latency fit finds 3 µs and multiplier 1,
    and the small/large split gives the small kernels the larger multiplier."""
    _load()
    import numpy as np

    import fit_transformer_kernels as ftk

    rng = np.random.default_rng(0)
    comp, large, small = rng.uniform(1, 5, 40), rng.uniform(1, 3, 40), rng.uniform(0.1, 0.5, 40)
    kernels = small / 2e-3 / 1e3 + rng.uniform(0.05, 0.3, 40)  # thousands of memory-bound kernels
    fixed = rng.uniform(0.2, 0.6, 40)
    label = comp + large + small + fixed + 3.0 * kernels
    d = ftk.diagnosis(np.column_stack([comp, large, small, fixed, kernels, label]))
    assert d["latency_us"] == pytest.approx(3.0, rel=0.02) and d["latency_memory_x"] == pytest.approx(1.0, rel=0.02)
    assert d["mape_pct_latency"] < 0.5 < d["mape_pct_as_is"]
    assert d["memory_small_x"] > d["memory_large_x"]


def _part(released: str, space: str, group: str, c: float, m: float, fixed: float, label: float) -> dict:
    import numpy as np

    return {"space": space, "released": released, "device": released, "label_ms": label,
            "groups": {"architecture": group, "memory": group, "autocast": group, "geforce": group},
            "c": np.array([c * 1e3]), "m": np.array([m * 1e3]), "t": np.array([(max(c, m) + fixed) * 1e3])}


def test_device_rules_fit_a_group_on_the_other_gpus_only() -> None:
    """Two GPUs of one group whose memory-bound time is 2x the prediction: leave-one-GPU-out, each gets memory x2
    from the other; a GPU alone in its group keeps (1, 1); the shipped prior ("none") is scored unchanged."""
    _load()
    import fit_transformer_kernels as ftk

    recs = []
    for gpu, group, mem_x in (("g1", "a", 2.0), ("g2", "a", 2.0), ("g3", "b", 3.0)):
        for i, space in enumerate(("s", "s", "s", "m", "m", "m")):
            c, m = 1.0 + 0.1 * i, 2.0 + 0.3 * i  # memory-bound nodes
            recs.append(_part(gpu, space, group, c, m, 0.5, max(c, m * mem_x) + 0.5))
    out = ftk.device_rules(recs)
    assert out["none"]["fixed_memory_x"]["g1"] == (1.0, 1.0) and out["none"]["met"] == 0
    for key in ftk.RULE_KEYS:
        used = out[key]["fixed_memory_x"]
        assert used["g1"][1] == pytest.approx(2.0, rel=0.05) and used["g2"][1] == pytest.approx(2.0, rel=0.05)
        assert used["g3"] == (1.0, 1.0)
        assert out[key]["gpu_mape_pct"]["g1"] < 2.0 and out[key]["gpu_mape_pct"]["g3"] > 20.0


def test_vidur_bandwidth_reads_single_gpu_rows_above_the_size_floor(tmp_path: Path) -> None:
    _load()
    import fit_transformer_kernels as ftk

    head = "gpu,num_tokens,n_embd,num_tensor_parallel_workers,time_stats.add.median,time_stats.input_layernorm.median\n"
    # 8192 tokens x 4096 x 2 B = 64 MiB per tensor: add moves 192 MiB in 0.1 ms, RMSNorm 128 MiB in 0.2 ms
    rows = ["h100,8192,4096,1,0.1,0.2", "h100,8192,4096,2,9.9,9.9", "h100,128,4096,1,9.9,9.9"]
    (tmp_path / ftk.VIDUR_FILE).write_text(head + "\n".join(rows) + "\n")
    got = ftk.vidur_bandwidth(tmp_path)
    mib64 = 8192 * 4096 * 2
    assert got == {"h100": pytest.approx({"add": 3 * mib64 / 1e-4 / 1e9, "input_layernorm": 2 * mib64 / 2e-4 / 1e9})}
