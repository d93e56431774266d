"""The command-line grammar: list flags, --torch-device, --json, exit status, suggestions, named inputs."""

from __future__ import annotations

import argparse
import io
import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _compare import KERNEL_PATH_REL, assert_close
from dippm_nas import InputSpec, capture
from dippm_nas._version import __version__
from dippm_nas.cli import UsageError, main
from dippm_nas.cli._grammar import Spinner, closest, progress_enabled
from dippm_nas.cli._inputs import parse_input
from dippm_nas.cli._main import build_parser

DEV = "a100-sxm4-40gb"


def _json_out(capsys: pytest.CaptureFixture[str]) -> object:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- version, exit status
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"dippm-nas {__version__}"


def test_unknown_verb_is_a_usage_error_with_the_closest_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predcit", "x"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'predcit'" in err and "did you mean: predict" in err and err.startswith("usage:")


def test_unknown_device_suggests_the_closest_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "_models:TinyMobileNet", "--device", "a100"]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'a100'; did you mean: a100-pcie-40gb, a100-pcie-80gb, a100-sxm4-40gb, a100-sxm4-80gb" in err
    assert "choices: " in err and "host-cpu" in err
    assert main(["predict", "_models:TinyMobileNet", "--device", "rtx-309"]) == 2
    assert "did you mean: rtx-3090" in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["predict", "x", "--runtime", "eagr"], "unknown runtime 'eagr'; did you mean: eager?"),
    (["predict", "x", "--dtype", "flot16"], "unknown dtype 'flot16'; did you mean: float16"),
    (["predict", "x", "--batch", "0"], "--batch takes integers >= 1, got 0"),
    (["predict", "x", "--batch", "eight"], "--batch takes integers >= 1, got 'eight'"),
    (["predict", "x", "--shape", "3,224,224", "--input", "ids:8:int64"], "not both"),
    (["predict", "x", "--input", "ids"], "NAME:SHAPE[:DTYPE[:HIGH]]"),
    (["dataset", "build", "--space", "mlpp", "--n", "2", "--out", "x.sqlite"],
     "unknown search space 'mlpp'; did you mean: mlp"),
    (["dataset", "build", "--space", "mlp", "--n", "2", "--out", "x.sqlite", "--dtype", "int8"],
     "unknown dtype 'int8'"),
    (["dataset", "build", "--out", "x.sqlite", "--torch-device", "a100-sxm4-40gb"], "a catalogue id goes to --device"),
    (["dataset", "build", "--out", "x.sqlite", "--device", "a100-sxm4-40gb"], "the flag is --torch-device"),
    (["gpu-campaign", "--out", "x", "--runtime", "eagre"], "dippm-nas gpu-campaign: error: unknown runtime 'eagre'"),
    (["evaluate", "--data", "x", "--checkpoint", "c.pt", "--device", "h100"], "did you mean: h100-pcie-80gb"),
    (["predict", "x", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_usage_errors_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_errors_print_as_json_under_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "x", "--device", "a100", "--json"]) == 2
    d = _json_out(capsys)
    assert isinstance(d, dict) and d["type"] == "UsageError" and d["exit_status"] == 2
    assert d["error"].startswith("unknown device 'a100'") and DEV in d["choices"] and DEV in d["did_you_mean"]
    assert main(["predcit", "--json"]) == 2  # an argparse error too
    d = _json_out(capsys)
    assert d["type"] == "UsageError" and "predict" in d["choices"] and d["did_you_mean"][0] == "predict"
    # a runtime error (the work failed): exit 1, the error's own class
    assert main(["predict", "no_such_module_for_cli_test:build", "--json", "--no-cache"]) == 1
    d = _json_out(capsys)
    assert d["type"] == "ModelSpecError" and d["exit_status"] == 1 and d["choices"] is None


def test_runtime_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "no_such_module_for_cli_test:build", "--no-cache"]) == 1
    assert "dippm-nas predict: error:" in capsys.readouterr().err
    assert main(["dataset", "info", str(tmp_path / "missing.sqlite")]) == 1


# ----------------------------------------------------------------------------- list flags
@pytest.mark.parametrize("batch", [["1", "8", "64"], ["1,8,64"], ["1", "8,64"]])
def test_list_flags_take_spaces_or_commas(batch: list[str]) -> None:
    args = build_parser().parse_args(["predict", "m:f", "--batch", *batch, "--device", "rtx-3090,a100-sxm4-40gb"])
    assert args.batch == [1, 8, 64] and args.device == ["rtx-3090", DEV]
    assert build_parser().parse_args(["predict", "m:f", "--batch", "1", "--batch", "8"]).batch == [1, 8]
    assert build_parser().parse_args(["predict", "m:f"]).batch == [1]  # the default, not extended


# ----------------------------------------------------------------------------- deprecated flags
@pytest.mark.parametrize("argv, dest, value, old", [
    (["dataset", "build", "--out", "x", "--device", "cpu"], "torch_device", "cpu", "--device"),
    (["dataset", "build", "--out", "x", "--device", "host-cpu"], "torch_device", "cpu", "--device"),
    (["gpu-campaign", "--out", "x", "--device", "cuda:1"], "torch_device", "cuda:1", "--device"),
    (["gpu-campaign", "--out", "x", "--batches", "1,8"], "batches", [1, 8], "--batches"),
    (["validate-worker", "--storage", "sqlite://", "--device", DEV, "--cuda-device", "cuda:1"], "torch_device",
     "cuda:1", "--cuda-device"),
    (["evaluate", "--data", "d", "--checkpoint", "c", "--json", "r.json"], "json_out", "r.json", "--json PATH"),
])
def test_old_flags_work_one_more_release_with_a_message(argv: list[str], dest: str, value: object, old: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err
    assert f"{old} is deprecated" in err and "next release" in err


def test_new_flags_parse_silently(capsys: pytest.CaptureFixture[str]) -> None:
    p = build_parser()
    assert p.parse_args(["dataset", "build", "--out", "x", "--torch-device", "cuda:0"]).torch_device == "cuda:0"
    assert p.parse_args(["gpu-campaign", "--out", "x", "--batch", "1", "8"]).batches == [1, 8]
    args = p.parse_args(["evaluate", "--data", "d", "--checkpoint", "c", "--json", "--json-out", "r.json"])
    assert args.json is True and args.json_out == "r.json"
    assert capsys.readouterr().err == ""


def test_dataset_info_is_one_verb_and_stats_a_hidden_alias(capsys: pytest.CaptureFixture[str]) -> None:
    p = build_parser()
    assert p.parse_args(["dataset", "stats", "x.sqlite"]).func is p.parse_args(["dataset", "info", "x.sqlite"]).func
    with pytest.raises(SystemExit):
        p.parse_args(["dataset", "--help"])
    out = capsys.readouterr().out
    assert "info" in out and "stats" not in out


# ----------------------------------------------------------------------------- named inputs
def test_parse_input_forms() -> None:
    t = parse_input("input_ids:128:int64")
    assert (t.name, t.shape, t.dtype, t.high) == ("input_ids", (128,), "int64", 2)
    t = parse_input("input_ids:1x128:int64:30522")
    assert (t.shape, t.high) == ((1, 128), 30522)
    assert parse_input("pixels:3x32x32").dtype is None  # follows --dtype
    for bad in ("ids", "ids:0:int64", "ids:128:int9", "ids:128:int64:x", "1ids:128"):
        with pytest.raises(UsageError):
            parse_input(bad)


_TINY_IDS = textwrap.dedent('''
    import torch
    from torch import nn

    class TokenModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.head = nn.Linear(8, 2)

        def forward(self, input_ids, attention_mask):
            h = self.emb(input_ids) * attention_mask.unsqueeze(-1).to(torch.float32)
            return self.head(h.mean(1))

    def build():
        return TokenModel()
''')


def test_predict_named_int64_inputs_as_one_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str],
                                               caplog: pytest.LogCaptureFixture) -> None:
    from dippm_nas.predictor import set_predictor

    (tmp_path / "cli_token_model.py").write_text(_TINY_IDS)
    monkeypatch.chdir(tmp_path)
    argv = ["predict", "cli_token_model:build", "--input", "input_ids:16:int64:50", "--input",
            "attention_mask:16:int64", "--batch", "2", "4", "--device", f"{DEV},rtx-3090"]
    set_predictor("rtx-3090", None)
    with caplog.at_level(logging.WARNING, logger="py.warnings"):
        assert main([*argv, "--json"]) == 0
    # rtx-3090 has no checkpoint: the analytic prior answers, and the CLI says so once, as a log line
    said = [r.getMessage() for r in caplog.records if "no trained predictor checkpoint" in r.getMessage()]
    assert said == ["RuntimeWarning: no trained predictor checkpoint for device 'rtx-3090': answering with the "
                    "analytic prior (sources 'analytic')"]
    rows = _json_out(capsys)
    assert isinstance(rows, list) and len(rows) == 4  # 1 model x 2 devices x 2 batches x 1 dtype
    assert [(r["device"], r["batch_size"]) for r in rows] == [(DEV, 2), ("rtx-3090", 2), (DEV, 4), ("rtx-3090", 4)]
    assert rows[0]["input"] == "input_ids (2, 16) int64, attention_mask (2, 16) int64"
    for r in rows:
        assert r["model"] == "cli_token_model:build" and r["dtype"] == "float32" and r["latency_ms"] > 0
        assert {"latency_ms_std", "energy_j", "memory_mib", "mig", "latency_source"} <= set(r)
    assert main(argv) == 0  # the table: a header and one row per grid point
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["#", "model", "device", "batch", "dtype"]
    assert "latency_ms" in lines[0] and "MIG" in lines[0] and "source" in lines[0]
    assert [ln.split()[2:4] for ln in lines[1:5]] == [[DEV, "2"], ["rtx-3090", "2"], [DEV, "4"], ["rtx-3090", "4"]]


def test_inspect_takes_the_same_input_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cli_token_model2.py").write_text(_TINY_IDS)
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "cli_token_model2:build", "--input", "input_ids:8:int64", "--input",
                 "attention_mask:8:int64", "--batch", "1,3", "--json"]) == 0
    rows = _json_out(capsys)
    assert [r["batch_size"] for r in rows] == [1, 3] and all(r["num_nodes"] > 0 for r in rows)


# ----------------------------------------------------------------------------- progress
class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_spinner_shows_only_after_its_delay_and_erases_itself() -> None:
    buf = _Tty()
    with Spinner("capturing x", enabled=True, delay_s=0.05, interval_s=0.01, stream=buf) as s:
        time.sleep(0.3)
    assert s.shown and "capturing x" in buf.getvalue() and buf.getvalue().endswith("\r")
    quick = _Tty()
    with Spinner("capturing y", enabled=True, delay_s=5.0, stream=quick) as s:
        pass
    assert not s.shown and quick.getvalue() == ""


def test_progress_only_on_a_terminal_without_no_progress() -> None:
    assert progress_enabled(argparse.Namespace(no_progress=False), _Tty())
    assert not progress_enabled(argparse.Namespace(no_progress=True), _Tty())
    assert not progress_enabled(argparse.Namespace(no_progress=False), io.StringIO())


def test_closest_prefers_names_that_contain_the_value() -> None:
    ids = ["a100-pcie-40gb", "a100-sxm4-40gb", "h100-sxm5-80gb", "host-cpu"]
    assert closest("a100", ids) == ["a100-pcie-40gb", "a100-sxm4-40gb"]
    assert closest("hots-cpu", ids) == ["host-cpu"]


# ----------------------------------------------------------------------------- the cached path
def test_a_library_spec_is_answered_from_the_cache_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # the name key needs the library's version only: a graph stored under it answers without building the
    # model (here a torchvision name that does not even exist, with torchvision not imported)
    from dippm_nas.capture import _key
    from dippm_nas.cache import default_cache

    monkeypatch.setattr(_key, "_dist_version", lambda *names: "9.9")
    spec = InputSpec(shape=(3, 16, 16), batch_size=1)
    graph = capture("_models:TinyMobileNet", spec, cache=False)
    key = _key.named_model_key("torchvision:no_such_net", spec)
    assert key is not None and key != _key.named_model_key("torchvision:no_such_net", spec.with_batch_size(2))
    assert _key.named_model_key("_models:TinyMobileNet", spec) is None  # user code: keyed by its definition
    default_cache().put(key, graph)
    hit = capture("torchvision:no_such_net", spec)
    assert hit.cache_hit and hit.structural_hash() == graph.structural_hash()


def test_the_package_face_is_lazy_and_whole() -> None:
    # `import dippm_nas` loads no heavy package; every name of __all__ resolves (the later stages on first
    # access), and `capture` stays the function after its subpackage's modules are imported
    code = ("import sys, dippm_nas; heavy = sorted(m for m in ('torch', 'sqlalchemy', 'tvm', 'search_spaces') "
            "if m in sys.modules); import dippm_nas.capture._assemble, dippm_nas.predictor._ensemble; "
            "missing = [n for n in dippm_nas.__all__ if getattr(dippm_nas, n, None) is None]; "
            "from dippm_nas import capture, predict, mig; "
            "print(heavy, missing, capture.__module__, predict.__module__, mig.__name__, "
            "set(dippm_nas.__all__) <= set(dir(dippm_nas)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["[]", "[]", "dippm_nas.capture._capture", "dippm_nas.predictor._api", "dippm_nas.mig",
                                  "True"]


#: Runs the CLI as `python -m dippm_nas` does, with the library versions of the name key fixed as the test's,
#: then says which heavy packages the process loaded (on stderr, after the verb's output).
_CACHED_PREDICT = """
import json, runpy, sys
from dippm_nas.capture import _key
_key._dist_version = lambda *names: "9.9"
sys.argv = ["dippm-nas", *sys.argv[1:]]
try:
    runpy.run_module("dippm_nas", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
loaded = sorted(m for m in ("torch", "sqlalchemy", "tvm", "torchvision", "scipy", "pydantic") if m in sys.modules)
print(json.dumps({"exit": code, "loaded": loaded}), file=sys.stderr)
"""


def _close(a: object, b: object, path: str = "") -> None:
    assert_close(a, b, rel=KERNEL_PATH_REL, abs_tol=1e-9, path=path)


def test_a_cached_predict_loads_neither_torch_nor_sqlalchemy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # the cached path of `dippm-nas predict`: the graph from the default SQLite file (read with sqlite3), the
    # network from the checkpoint's derived weights (numpy engine); the same answer as this process's torch path
    from dippm_nas.capture import _key
    from dippm_nas.cache import default_cache
    from dippm_nas.predictor import derived_weights_path, find_checkpoint, checkpoint_digest, set_predictor

    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_key, "_dist_version", lambda *names: "9.9")
    argv = ["predict", "torchvision:tiny_net", "--shape", "3,16,16", "--batch", "1,8", "--json"]
    for b in (1, 8):
        spec = InputSpec(shape=(3, 16, 16), batch_size=b)
        default_cache().put(_key.named_model_key("torchvision:tiny_net", spec), capture("_models:TinyResNet", spec,
                                                                                        cache=False))
    default_cache().close()
    set_predictor(DEV, None)  # loaded again here, through torch: that load writes the derived weights
    try:
        assert main(argv) == 0
    finally:
        set_predictor(DEV, None)
    want = _json_out(capsys)
    assert derived_weights_path(checkpoint_digest(find_checkpoint(DEV))).is_file()

    script = tmp_path / "run_cli.py"
    script.write_text(_CACHED_PREDICT)
    out = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "DIPPM_NAS_CACHE_DIR": str(tmp_path)})
    report = json.loads(out.stderr.strip().splitlines()[-1])
    assert report == {"exit": 0, "loaded": []}, out.stderr
    got = json.loads(out.stdout)
    # the network answered (its novelty score and σ; the correction itself is withheld this far from training)
    assert [r["batch_size"] for r in got] == [1, 8] and all(r["details"]["novelty"] > 0 for r in got)
    _close(got, want)


def test_parsing_imports_neither_tvm_nor_torchvision() -> None:
    code = ("import sys; from dippm_nas.cli._main import build_parser; build_parser().parse_args(['predict', 'm:f']); "
            "print(sorted(m for m in ('tvm', 'torchvision', 'optuna', 'nni', 'matplotlib', 'torch', 'sqlalchemy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_validate_worker_prints_json_lines_under_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    assert main(["validate-worker", "--storage", url, "--device", "host-cpu", "--idle-exit", "0.1", "--poll", "0.05",
                 "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["start", "end"]
    assert events[0]["device"] == "host-cpu" and events[0]["torch_device"] == "cpu" and events[1]["handled"] == 0
    assert main(["validate-worker", "--storage", url, "--device", "hostcpu", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["did_you_mean"] == ["host-cpu"]


def test_versions_for_keys_come_from_the_distribution_that_provides_the_module() -> None:
    import torch
    import tvm

    from dippm_nas.capture import _key

    assert _key._dist_version("torch", "torch") == torch.__version__
    assert _key._dist_version("tvm", "apache-tvm", "tvm") == tvm.__version__
    assert _key._dist_version("json", "torch") is None  # a module the distribution does not provide
    assert _key._dist_version("no_such_module_xyz", "torch") is None
    assert f"tvm={tvm.__version__};" in _key.converter_version()


def test_json_output_is_strict_json() -> None:
    from dippm_nas.cli._grammar import json_text

    text = json_text({"kendall_tau": float("nan"), "rows": [1.5, float("inf")], "path": Path("x")})
    assert json.loads(text) == {"kendall_tau": None, "rows": [1.5, None], "path": "x"}


def test_a_grid_point_that_fails_is_a_row_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", "_models:TinyMobileNet", "--shape", "3,16,16", "--device", "host-cpu", DEV, "--dtype", "float16"]
    assert main([*argv, "--json"]) == 1  # host-cpu has no float16: that row fails, the A100 row is predicted
    failed, ok = _json_out(capsys)
    assert failed["device"] == "host-cpu" and failed["type"] == "UnsupportedDtypeError" and "float16" in failed["error"]
    assert ok["device"] == DEV and ok["latency_ms"] > 0 and "error" not in ok
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "failed: UnsupportedDtypeError" in out and "failed    row 1: UnsupportedDtypeError" in out
