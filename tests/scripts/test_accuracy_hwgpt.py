"""benchmarks/accuracy/accuracy_hwgpt.py: its row reading (A100 and energy rows dropped), sampling and metrics on a
tiny synthetic CSV (the scoring itself needs ../shared/data and runs as a script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dippm_nas.errors import InvalidValueError

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy" / "accuracy_hwgpt.py"
HEAD = ("search_space,arch_id,device,gpu_model,metric,median,batch_size,seq_len,precision,n_embd,n_layer,"
        "n_head_per_layer,mlp_ratio_per_layer,bias,head_size,padded_vocab_size\n")
ARCH = "192,2,4;8,2;3,False,64,50254"


def _load():
    spec = importlib.util.spec_from_file_location("accuracy_hwgpt", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["accuracy_hwgpt"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


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
