"""What the fuzz registry (``fuzz_registry.py``) found on public entry points outside the causes of issue 45, one
test each: every case is now a ``DippmNasError`` naming the value, never another exception or a hang."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from dippm_nas.errors import DippmNasError


def _fifo(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    os.mkfifo(p)
    return p


def _within(seconds: float, fn: Any) -> BaseException | None:
    """Run ``fn`` in a thread; the exception it raised (None when it returned); fails if it is still running."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s (a FIFO read as a file?)"
    return box.get("e")


@pytest.mark.parametrize("reader", ["iter_jsonl", "read_campaign_rows", "load_examples", "read_csv",
                                    "checkpoint_digest", "OpProfileWriter"])
def test_a_fifo_given_to_a_streaming_reader_or_writer_is_refused_not_waited_on(tmp_path: Path, reader: str) -> None:
    from dippm_nas.dataset import iter_jsonl
    from dippm_nas.dataset.importers._csv import read_csv
    from dippm_nas.measure import OpProfileWriter, read_campaign_rows
    from dippm_nas.predictor import checkpoint_digest
    from dippm_nas.training import load_examples

    calls = {
        "iter_jsonl": lambda p: list(iter_jsonl(p)),
        "read_campaign_rows": lambda p: list(read_campaign_rows(p)),
        "load_examples": lambda p: load_examples([p]),
        "read_csv": lambda p: read_csv(p, ["model"], "timm benchmark", None),
        "checkpoint_digest": checkpoint_digest,
        "OpProfileWriter": OpProfileWriter,
    }
    suffix = {"read_csv": ".csv", "checkpoint_digest": ".pt"}.get(reader, ".jsonl")
    fifo = _fifo(tmp_path, "pipe" + suffix)
    e = _within(10, lambda: calls[reader](fifo))
    assert isinstance(e, DippmNasError) and "FIFO" in str(e), e


def test_a_csv_that_is_not_utf8_or_has_a_huge_field_is_a_dataset_error(tmp_path: Path) -> None:
    from dippm_nas.dataset import DatasetError
    from dippm_nas.dataset.importers._csv import read_csv

    binary = tmp_path / "b.csv"
    binary.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(DatasetError, match="UTF-8 CSV"):
        read_csv(binary, ["model"], "timm benchmark", None)
    huge = tmp_path / "h.csv"
    huge.write_text("model\n" + '"' + "x" * 200_000 + '"\n')
    with pytest.raises(DatasetError, match="field larger"):
        read_csv(huge, ["model"], "timm benchmark", None)


def test_a_jsonl_file_of_garbage_or_records_that_are_not_objects(tmp_path: Path) -> None:
    from dippm_nas.dataset import DatasetError, iter_jsonl

    gz = tmp_path / "x.jsonl.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(DatasetError, match="cannot be read"):
        list(iter_jsonl(gz))
    arr = tmp_path / "a.jsonl"
    arr.write_text("[]\n")
    with pytest.raises(DatasetError, match="not a dippm-nas-dataset-jsonl file"):
        list(iter_jsonl(arr))


@pytest.mark.parametrize("call", [
    lambda: __import__("dippm_nas.nni", fromlist=["quantize"]).quantize(math.nan, 1),
    lambda: __import__("dippm_nas.nni", fromlist=["quantize"]).quantize(3.0, 0),
    lambda: __import__("dippm_nas.llm", fromlist=["x"]).contiguous_capacity(math.nan, 1.0, 1.0),
    lambda: __import__("dippm_nas.llm", fromlist=["x"]).contiguous_capacity(100.0, 1.0, math.inf),
    lambda: __import__("dippm_nas.measure", fromlist=["x"]).summarize(None),
    lambda: __import__("dippm_nas.measure", fromlist=["x"]).summarize([1.0, math.nan]),
    lambda: __import__("dippm_nas.measure", fromlist=["x"]).trapezoid_energy_j(None, [1.0]),
    lambda: __import__("dippm_nas.training", fromlist=["x"]).split_d0([math.nan]),
    lambda: __import__("dippm_nas.training", fromlist=["x"]).split_d0(None),
    lambda: __import__("dippm_nas.training", fromlist=["x"]).fit_shrink_width(lambda c: c, None),
    lambda: __import__("dippm_nas.prior", fromlist=["x"]).HostModel(None),
    lambda: __import__("dippm_nas.prior", fromlist=["x"]).fit_op_table(None),
    lambda: __import__("dippm_nas.measure", fromlist=["x"]).RaplCounter(object()),
    lambda: __import__("dippm_nas.capture", fromlist=["x"]).file_key("text", None),
    lambda: __import__("dippm_nas.measure", fromlist=["x"]).profile_ops(1.5, None),
    lambda: __import__("dippm_nas.predictor", fromlist=["x"]).checkpoint_name(object()),
    lambda: __import__("dippm_nas.predictor", fromlist=["x"]).checkpoint_digest(object()),
    lambda: __import__("dippm_nas.training", fromlist=["x"]).scatter_png(None, "latency_ms", "x.png"),
    lambda: __import__("dippm_nas.training", fromlist=["x"]).write_report([], object()),
], ids=["quantize-nan", "quantize-q0", "capacity-nan", "capacity-inf", "summarize-none", "summarize-nan",
        "trapezoid-none", "split_d0-nan", "split_d0-none", "shrink-grid-none", "hostmodel-none", "op-table-none",
        "rapl-object", "file_key-text", "profile_ops-float", "checkpoint_name-object", "checkpoint_digest-object",
        "scatter-none", "report-path-object"])
def test_a_value_of_the_wrong_type_or_not_finite_is_a_clear_error(call: Any) -> None:
    with pytest.raises(DippmNasError):
        call()


def test_write_loopback_preload_onto_a_file_is_a_clear_error(tmp_path: Path) -> None:
    from dippm_nas.nni import write_loopback_preload

    f = tmp_path / "file"
    f.write_text("kept")
    with pytest.raises(DippmNasError, match="cannot write the loopback preload"):
        write_loopback_preload(f)
    assert f.read_text() == "kept"
    assert write_loopback_preload(tmp_path / "d").is_file()


def test_demo_seed_and_out_are_checked_before_the_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.cli import main

    assert main(["demo", "--seed", "-1"]) == 2
    assert "--seed" in capsys.readouterr().err
    out = tmp_path / "a-file"
    out.write_text("kept")
    assert main(["demo", "--out", str(out), "--trials", "1"]) == 2
    assert "--out" in capsys.readouterr().err and out.read_text() == "kept"


def test_train_checks_out_and_report_against_every_data_file(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    link = tmp_path / "out.pt"
    link.symlink_to(data)
    assert main(["train", "--data", str(data), "--data", str(tmp_path / "e.jsonl"), "--out", str(link)]) == 2
    assert "--out" in capsys.readouterr().err and data.read_text() == "{}\n"


@pytest.mark.parametrize("verb", [["demo"], ["train", "--data", "d.jsonl", "--out", "m.pt"], ["validate-worker"],
                                  ["gpu-campaign"], ["dataset", "build", "--space", "x", "--out", "d.sqlite"]])
def test_a_thread_count_beyond_any_host_is_a_usage_error(verb: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.cli import main

    assert main([*verb, "--threads", "9" * 40]) == 2
    assert "--threads" in capsys.readouterr().err
