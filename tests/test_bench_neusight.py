"""benchmarks/a100_neusight_layers.py: traces are summed per A100 inference trace, models rebuilt to shape."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "a100_neusight_layers.py"


def _bench():
    spec = importlib.util.spec_from_file_location("a100_neusight_layers", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_traces_are_summed_per_a100_inference_trace(tmp_path: Path) -> None:
    b = _bench()
    head = "source_repo,device,trace,node_index,latency\n"
    rows = ["x,NVIDIA_A100-PCIE-40GB,bert_large-inf-512-16,0,1.5",
            "x,NVIDIA_A100-PCIE-40GB,bert_large-inf-512-16,1,2.25",
            "x,NVIDIA_A100-PCIE-40GB,bert_large-train-512-16,0,9.0",   # training: not an inference label
            "x,NVIDIA_L4,gpt2_large-inf-1024-4,0,7.0",                 # another GPU
            "x,NVIDIA_A100-PCIE-40GB,t5_small-inf-512-4,0,3.0",        # a model the script does not rebuild
            "x,NVIDIA_A100-PCIE-40GB,opt_13-inf-2048-2,0,"]            # an empty latency counts 0
    (tmp_path / b._FILE).write_text(head + "\n".join(rows) + "\n")
    got = b.load_traces(tmp_path)
    assert [(t["trace"], t["seq"], t["batch"], t["nodes"]) for t in got] == [
        ("bert_large-inf-512-16", 512, 16, 2), ("opt_13-inf-2048-2", 2048, 2, 1)]
    assert got[0]["label_ms"] == pytest.approx(3.75) and got[1]["label_ms"] == 0.0


@pytest.mark.parametrize("name,out_last", [("bert_large", 2), ("gpt2_large", 50257)])
def test_models_are_rebuilt_with_the_traces_widths(name: str, out_last: int) -> None:
    b = _bench()
    model, inputs = b.build(name, 8)
    ids = torch.zeros(1, 8, dtype=torch.int64)
    kwargs = {k: (ids if k == "input_ids" else torch.ones_like(ids)) for k in inputs}
    with torch.inference_mode():
        out = model.eval()(**kwargs)
    assert out.shape[-1] == out_last and out.shape[0] == 1
    assert set(inputs) <= {"input_ids", "attention_mask"} and all(v == ((8,), "int64") for v in inputs.values())
