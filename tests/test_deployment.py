"""Deployment: the settings of how inference runs, their PyTorch defaults, files and bad values."""

from __future__ import annotations

import json

import pytest

from dippm_nas import Deployment, DeploymentError
from dippm_nas import deployment as deployment_module
from dippm_nas.deployment import tf32_defaults
from dippm_nas.devices import HostProfile


def test_defaults_describe_nothing_but_the_runtime(monkeypatch):
    monkeypatch.setattr(deployment_module, "running_torch", lambda: None)  # a process without torch
    r = Deployment().resolve()
    assert r.runtime == "eager" and r.host is None and r.framework is None
    assert r.tf32_matmul is None and r.tf32_conv is None and r.input_copy is None
    assert r.assumed == ("host", "framework", "tf32", "input_copy", "autocast")
    assert r.from_process == () and r.process_torch is None
    assert r.cudnn_benchmark is False and r.autocast is None


def test_an_undescribed_framework_is_the_running_processes():
    import torch

    r = Deployment().resolve()
    version = torch.__version__.split("+")[0]
    assert r.framework == ("torch-1" if int(version.split(".")[0]) < 2 else "torch-2")
    assert r.from_process == ("framework", "tf32") and r.process_torch == version
    assert (r.tf32_matmul, r.tf32_conv) == (bool(torch.backends.cuda.matmul.allow_tf32),
                                            bool(torch.backends.cudnn.allow_tf32))
    assert r.assumed == ("host", "input_copy", "autocast")
    assert f"running process, torch {version}" in Deployment().label


@pytest.mark.parametrize("version, framework, flags", [("1.10.2", "torch-1", (True, True)),
                                                       ("2.4.0", "torch-2", (False, True))])
def test_the_running_processes_version_sets_framework_and_tf32(monkeypatch, version, framework, flags):
    monkeypatch.setattr(deployment_module, "running_torch",
                        lambda: deployment_module.RunningTorch(version, framework, *flags))
    r = Deployment().resolve()
    assert (r.framework, r.tf32_matmul, r.tf32_conv, r.process_torch) == (framework, *flags, version)
    # a described field wins: the framework, a torch version or a flag
    assert Deployment(framework="torch-2" if framework == "torch-1" else "torch-1").resolve().from_process == ()
    assert Deployment(versions={"torch": "2.1.0"}).resolve().framework == "torch-2"
    r = Deployment(tf32_matmul=not flags[0], tf32_conv=not flags[1]).resolve()
    assert r.from_process == ("framework",) and (r.tf32_matmul, r.tf32_conv) == (not flags[0], not flags[1])
    # a described host profile names its own framework: nothing is taken from the process
    r = Deployment(host=HostProfile.from_clock(2.5, framework="torch-2")).resolve()
    assert r.from_process == () and "framework" in r.assumed


@pytest.mark.parametrize("framework, version, expected", [
    ("torch-2", None, (False, True)),
    ("torch-1", None, (True, True)),
    (None, "1.6.0", (False, False)),
    (None, "1.7.1", (True, True)),
    (None, "1.11.0+cu113", (True, True)),
    (None, "1.12.0", (False, True)),
    (None, "2.3.1", (False, True)),
    (None, None, (None, None)),
])
def test_tf32_defaults_per_generation(monkeypatch, framework, version, expected):
    monkeypatch.setattr(deployment_module, "running_torch", lambda: None)  # a process without torch
    assert tf32_defaults(framework, version) == expected
    r = Deployment(framework=framework, versions={"torch": version} if version else None).resolve()
    assert (r.tf32_matmul, r.tf32_conv) == expected
    assert ("tf32" in r.assumed) == (expected == (None, None))


def test_explicit_flags_win_over_the_framework_defaults():
    r = Deployment(framework="torch-2", tf32_matmul=True, tf32_conv=False).resolve()
    assert (r.tf32_matmul, r.tf32_conv) == (True, False)


def test_the_deployment_framework_is_the_host_profiles():
    host = HostProfile.from_clock(2.25)  # framework torch-2 by default
    r = Deployment(host=host, framework="torch-1", autocast="none").resolve()
    assert r.host.framework == "torch-1" and r.host.speed == host.speed
    assert r.assumed == ("input_copy",)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_file_round_trip(tmp_path, suffix):
    d = Deployment(runtime="cuda-graphs", host=HostProfile.from_clock(2.25, framework="torch-1"), framework="torch-1",
                   tf32_matmul=True, autocast="bfloat16", input_copy="pinned", channels_last=True,
                   cudnn_benchmark=True, versions={"torch": "1.10.0", "cuda": "11.3"})
    p = d.save(tmp_path / f"dep{suffix}")
    back = Deployment.load(p)
    assert back == d and hash(back) == hash(d) and back.key == d.key
    assert Deployment.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_autocast_none_is_described_and_none_is_not(monkeypatch):
    monkeypatch.setattr(deployment_module, "running_torch", lambda: None)
    full = dict(host=HostProfile.from_clock(2.25), framework="torch-2", input_copy="none")
    assert Deployment(**full, autocast="none").resolve().assumed == ()
    assert Deployment(**full, autocast="float16").resolve().assumed == ()
    r = Deployment(**full).resolve()
    assert r.assumed == ("autocast",) and r.autocast is None and "autocast unknown" in r.label
    assert "autocast" not in Deployment(**full, autocast="none").label
    assert Deployment(autocast="none").key != Deployment().key


def test_format_1_files_with_a_null_autocast_load_as_not_described(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"format": 1, "runtime": "eager", "autocast": None, "input_copy": "none"}),
                 encoding="utf-8")
    d = Deployment.load(p)
    assert d.autocast is None and "autocast" in d.resolve().assumed
    assert d.to_dict()["format"] == 2  # written as format 2: an old key names no new deployment
    assert Deployment.from_dict({"format": 1, "autocast": "none"}).autocast == "none"


def test_host_path_is_read_at_construction(tmp_path):
    p = tmp_path / "host.json"
    HostProfile.from_clock(2.0, name="slow").save(p)
    assert Deployment(host=str(p)).host.name == "slow"
    with pytest.raises(DeploymentError, match="cannot read host profile"):
        Deployment(host=str(tmp_path / "missing.json"))


def test_keys_differ_by_every_setting():
    base = Deployment()
    others = [Deployment(runtime="compiled"), Deployment(framework="torch-2"), Deployment(tf32_matmul=True),
              Deployment(autocast="float16"), Deployment(autocast="none"), Deployment(input_copy="none"), Deployment(channels_last=True),
              Deployment(cudnn_benchmark=False), Deployment(host=HostProfile.from_clock(3.0))]
    keys = {base.key, *(o.key for o in others)}
    assert len(keys) == len(others) + 1


@pytest.mark.parametrize("kwargs, field", [
    ({"runtime": "fast"}, "runtime"), ({"host": ""}, "host"), ({"host": 3.0}, "host"),
    ({"framework": "torch-3"}, "framework"), ({"tf32_matmul": 1}, "tf32_matmul"),
    ({"tf32_conv": "yes"}, "tf32_conv"), ({"autocast": "fp16"}, "autocast"), ({"input_copy": True}, "input_copy"),
    ({"channels_last": None}, "channels_last"), ({"cudnn_benchmark": 0}, "cudnn_benchmark"),
    ({"versions": ["2.3"]}, "versions"), ({"versions": {"torch": 2}}, "versions"),
    ({"versions": {"torch": "latest"}}, "versions"),
])
def test_bad_values_name_the_field_and_the_choices(kwargs, field):
    with pytest.raises(DeploymentError, match=f"Deployment.{field}"):
        Deployment(**kwargs)


def test_files_with_unknown_keys_or_bad_values_are_refused(tmp_path):
    with pytest.raises(DeploymentError, match="unknown deployment keys"):
        Deployment.from_dict({"runtme": "eager"})
    with pytest.raises(DeploymentError, match="format"):
        Deployment.from_dict({"format": 3})
    p = tmp_path / "d.toml"
    p.write_text('runtime = "eager"\nautocast = "int8"\n', encoding="utf-8")
    with pytest.raises(DeploymentError, match=r"d\.toml.*autocast"):
        Deployment.load(p)
    p.write_text('runtime = [', encoding="utf-8")
    with pytest.raises(DeploymentError, match="cannot read deployment"):
        Deployment.load(p)


def test_detect_reads_this_torch():
    torch = pytest.importorskip("torch")
    d = Deployment.detect(measure_host=False)
    assert d.versions["torch"] == torch.__version__.split("+")[0]
    assert d.framework == ("torch-1" if torch.__version__.startswith("1.") else "torch-2")
    assert d.tf32_matmul == bool(torch.backends.cuda.matmul.allow_tf32)
    assert d.host is None and d.input_copy is None
