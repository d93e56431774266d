"""``examples/optuna/llm_serving_config.py`` runs end to end, small: a Pareto set with σ, infeasible configurations
counted with their reasons, bad prices and SLOs refused."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

pytest.importorskip("optuna")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "optuna" / "llm_serving_config.py"


def _main():  # noqa: ANN202 - the example's main
    return runpy.run_path(str(EXAMPLE), run_name="example_llm_serving_config")["main"]


def test_serving_config_example_small(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out_json = tmp_path / "res.json"
    assert _main()(["--model", "llama-2-7b", "--prompt", "128", "256", "--output", "64", "--rate", "4",
                    "--devices", "l4", "h100-sxm5-80gb", "--price", "l4=0.8", "h100-sxm5-80gb=3.0",
                    "--tpot-ms", "200", "--trials", "10", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "10 trials" in out and "$/Mtok" in out
    res = json.loads(out_json.read_text())
    assert res["trials"] == 10 and res["pareto"]
    for e in res["pareto"]:
        assert e["feasible"] and e["cost_usd_per_million_tokens"] > 0 and e["tpot_ms_std"] > 0
        assert e["violations"]["tpot_ms"] <= 0


@pytest.mark.parametrize("argv, words", [
    (["--price", "0"], "price_per_gpu_hour"),
    (["--price", "1.0", "--tpot-ms", "0"], "ServingSLO.tpot_ms"),
    (["--price", "1.0", "--ttft-ms", "-3"], "ServingSLO.ttft_ms"),
])
def test_serving_config_example_refuses_bad_input(argv: list[str], words: str, capsys: pytest.CaptureFixture) -> None:
    assert _main()(["--model", "llama-2-7b", "--batch", "4", "--devices", "l4", "--trials", "1", *argv]) == 2
    assert words in capsys.readouterr().err
