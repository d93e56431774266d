"""Output paths and deployment files: the rows of docs/reliability.md's "Outputs, deployment files and trial
records" section.

Every writer of a path refuses an output that is one of its inputs, a directory, a FIFO, a device or a
dangling symbolic link before it opens anything, and writes through a temporary file renamed into place; a
deployment file is read bounded in both formats and ``save`` -> ``load`` gives back every deployment
``Deployment`` accepts. A call that could block on a FIFO runs under :func:`within`, so a regression fails
the test instead of hanging the suite.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dippm_nas import Deployment
from dippm_nas._files import output_path, write_output
from dippm_nas._toml import loads_toml, read_toml_file, toml_depth
from dippm_nas.cli import main
from dippm_nas.dataset import DatasetStore, export_jsonl
from _hang import within as _within
from dippm_nas.devices import HostProfile
from dippm_nas.errors import DatasetError, DeploymentError, DeviceError, DippmNasError, InvalidValueError

#: Seconds a call that must not block gets before the test fails as a hang.
HANG_S = 20.0

posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX system")


def within(fn: Callable[[], Any], *, fifos: list[Path] = (), seconds: float = HANG_S) -> Any:  # type: ignore[assignment]
    """``fn()`` in a thread that fails the test as a hang after ``seconds`` (:func:`_hang.within`)."""
    return _within(fn, seconds=seconds, fifos=fifos)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("FIFOs need a POSIX system")
    p = tmp_path / "fifo.json"
    os.mkfifo(p)
    return p


# ------------------------------------------------------------------------------------------- the shared helper
def test_an_output_that_is_an_input_is_refused_however_it_is_named(tmp_path: Path) -> None:
    src = tmp_path / "in.sqlite"
    src.write_bytes(b"precious")
    link = tmp_path / "x.jsonl"
    link.symlink_to(src)
    hard = tmp_path / "hard.jsonl"
    os.link(src, hard)
    for out in (src, link, hard):
        with pytest.raises(InvalidValueError, match="is the input .*in.sqlite.*same file"):
            write_output(out, "replaced", "out", error=InvalidValueError, inputs=[src])
    assert src.read_bytes() == b"precious"


def test_a_symlink_to_another_file_is_written_through_and_a_new_file_gets_umask_permissions(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_output(link, "new", "out", error=InvalidValueError)
    assert link.is_symlink() and target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.json"
    write_output(fresh, "x", "out", error=InvalidValueError)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    out.write_text("old")
    with pytest.raises(RuntimeError, match="writer failed"):
        with output_path(out, "out", error=InvalidValueError) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    with pytest.raises(InvalidValueError, match="could not be written: .*unchanged"):
        with output_path(out, "out", error=InvalidValueError):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


@posix_only
def test_special_outputs_are_refused_before_anything_is_opened(tmp_path: Path, fifo: Path) -> None:
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    cases = {fifo: "is a FIFO", tmp_path: "is a directory", dangling: "dangling symbolic link",
             tmp_path / "no" / "x.json": "does not exist", "": "empty path"}
    if os.path.exists("/dev/full"):
        cases[Path("/dev/full")] = "is a character device"
    for path, why in cases.items():
        with pytest.raises(InvalidValueError, match=why):
            within(lambda path=path: write_output(path, "x", "out", error=InvalidValueError), fifos=[fifo])


# ------------------------------------------------------------------------------------------- dataset export
def test_dataset_export_onto_its_own_dataset_is_refused_and_the_dataset_kept(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "ds.sqlite"
    DatasetStore(db).close()
    before = _digest(db)
    link = tmp_path / "x.jsonl"
    link.symlink_to(db)
    with pytest.raises(DatasetError, match="is the input"):
        export_jsonl(db, link)
    assert main(["dataset", "export", str(db), "--out", str(link)]) == 2
    assert "--out" in capsys.readouterr().err
    assert _digest(db) == before and DatasetStore(db, create=False) is not None


@posix_only
def test_dataset_export_to_a_fifo_is_a_usage_error_not_a_hang(tmp_path: Path, fifo: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "ds.sqlite"
    DatasetStore(db).close()
    out = tmp_path / "pipe.jsonl"
    os.rename(fifo, out)
    assert within(lambda: main(["dataset", "export", str(db), "--out", str(out)]), fifos=[out]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "FIFO" in err
    with pytest.raises(DatasetError, match="FIFO"):
        within(lambda: export_jsonl(db, out), fifos=[out])


# ------------------------------------------------------------------------------------------- deployment / host-profile --out
@pytest.fixture
def no_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    detected = Deployment(host=HostProfile(name="test-host", speed=1.2, microbench_us=3.5), versions={"torch": "2.3.1"})
    monkeypatch.setattr(Deployment, "detect", classmethod(lambda cls, **_kw: detected))


@posix_only
@pytest.mark.parametrize("verb", ["deployment", "host-profile"])
def test_deployment_and_host_profile_out_special_files_are_usage_errors(
        verb: str, tmp_path: Path, fifo: Path, no_benchmark: None, capsys: pytest.CaptureFixture[str]) -> None:
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    outs = [fifo, dangling, tmp_path]
    if os.path.exists("/dev/full"):
        outs.append(Path("/dev/full"))
    for out in outs:
        assert within(lambda out=out: main([verb, "--out", str(out)]), fifos=[fifo]) == 2, out
        err = capsys.readouterr().err
        assert "--out" in err and str(out) in err
    good = tmp_path / "ok.json"
    assert main([verb, "--out", str(good)]) == 0 and good.is_file()


@posix_only
def test_writable_output_refuses_fifos_and_devices(tmp_path: Path, fifo: Path) -> None:
    from dippm_nas.cli._grammar import UsageError, writable_output

    with pytest.raises(UsageError, match="--out .*FIFO"):
        within(lambda: writable_output(fifo, "--out"), fifos=[fifo])
    if os.path.exists("/dev/null"):
        with pytest.raises(UsageError, match="character device"):
            writable_output("/dev/null", "--out")
    src = tmp_path / "in.csv"
    src.write_text("x")
    with pytest.raises(UsageError, match="is the input"):
        writable_output(src, "--out", inputs=[src])


# ------------------------------------------------------------------------------------------- Deployment.save / load
@posix_only
def test_deployment_save_to_a_directory_a_missing_folder_a_device_or_a_fifo_is_a_deployment_error(
        tmp_path: Path, fifo: Path) -> None:
    dep = Deployment(runtime="compiled")
    targets = [tmp_path, tmp_path / "missing" / "d.json", fifo]
    if os.path.exists("/dev/full"):
        targets.append(Path("/dev/full"))
    for target in targets:
        with pytest.raises(DeploymentError, match="deployment file"):
            within(lambda target=target: dep.save(target), fifos=[fifo])
    with pytest.raises(DeviceError, match="host profile file"):
        within(lambda: HostProfile(name="h").save(fifo), fifos=[fifo])


@posix_only
def test_a_toml_deployment_is_read_bounded_like_json(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("versions = " + "[" * 50_000 + "]" * 50_000 + "\n")
    inline = tmp_path / "inline.toml"
    inline.write_text("host = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n")
    pipe = tmp_path / "pipe.toml"
    os.mkfifo(pipe)
    cases = {deep: "nests arrays/inline tables 50000 levels deep", inline: "nests arrays/inline tables 50000",
             pipe: "FIFO"}
    if os.path.exists("/dev/zero"):
        zero = tmp_path / "zero.toml"
        zero.symlink_to("/dev/zero")
        cases[zero] = "character device"
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20))
    cases[big] = "bytes, more than"
    for path, why in cases.items():
        with pytest.raises(DeploymentError, match=why):
            within(lambda path=path: Deployment.load(path), fifos=[pipe])


def test_toml_nesting_is_counted_outside_strings_and_comments() -> None:
    assert toml_depth('a = "[[[["  # [[[\nb = [[1]]') == 2
    assert toml_depth("a = '''\n[[[ '''\nb = {c = [1]}") == 2
    assert toml_depth('a = """ ]]] [[[ """') == 0
    assert loads_toml("a = [[1]]", "t") == {"a": [[1]]}
    with pytest.raises(InvalidValueError, match="not valid TOML"):
        loads_toml("a = ", "t")
    with pytest.raises(InvalidValueError, match="levels deep"):
        loads_toml("a = " + "[" * 65 + "]" * 65, "t")
    # an unclosed string runs to the end: the scan is linear in the text, never quadratic
    assert toml_depth("'''" + "'" * 200_000) == 0 and toml_depth('"' * 300_001) == 0


def test_read_toml_file_refuses_non_utf8(tmp_path: Path) -> None:
    p = tmp_path / "x.toml"
    p.write_bytes(b"a = \"\xff\"\n")
    with pytest.raises(DeviceError, match="not UTF-8"):
        read_toml_file(p, "x", DeviceError, max_bytes=1000)


@pytest.mark.parametrize("versions, match", [
    ({"torch": "²"}, "versions\\['torch'\\] must look like"),
    ({"torch": "9" * 5000}, "1 to 128 characters"),
    ({"torch": "1" * 7 + ".0"}, "at most 6 digits"),
    ({"cuda": ""}, "1 to 128 characters"),
    ({"": "1"}, "1 to 128 characters"),
    ({"cuda": "\ud800"}, "lone surrogate"),
    ({"cuda": 12}, "map names to version strings"),
])
def test_deployment_versions_break_a_rule_with_a_deployment_error(versions: dict[str, Any], match: str) -> None:
    with pytest.raises(DeploymentError, match=match):
        Deployment(versions=versions)


def test_deployment_with_an_unknown_field_names_it_its_value_and_the_fields() -> None:
    with pytest.raises(DeploymentError, match=r"no field evil=1; fields: \['runtime'"):
        Deployment(evil=1)  # type: ignore[call-arg]
    with pytest.raises(DeploymentError, match="positional"):
        Deployment(*range(11))  # type: ignore[arg-type]
    assert dataclasses.replace(Deployment(), runtime="compiled").runtime == "compiled"


_ODD_TEXT = ["a b=c", "é\n\"x", "\x7f\\", "[x]", "#", "'''", "\x00", "🙂", "a.b", " "]


@pytest.mark.parametrize("ext", ["toml", "json"])
def test_save_then_load_gives_back_odd_version_names_and_host_names(tmp_path: Path, ext: str) -> None:
    versions = {f"k{i}{t}": t for i, t in enumerate(_ODD_TEXT)} | {"torch": "2.1.0+cu121"}
    for text in _ODD_TEXT:
        dep = Deployment(versions=versions, host=HostProfile(name=f"h{text}", cpu_model=text, speed=0.5,
                                                            clock_ghz=3.25, microbench_us=4.2),
                         tf32_matmul=False, autocast="bfloat16", input_copy="pinned")
        p = dep.save(tmp_path / f"d.{ext}")
        assert Deployment.load(p) == dep


hypothesis = pytest.importorskip("hypothesis", reason="the property test needs hypothesis (the dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dippm_nas.deployment import AUTOCAST_DTYPES, DEPLOYMENT_RUNTIMES, INPUT_COPIES, MAX_VERSION_CHARS  # noqa: E402

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=MAX_VERSION_CHARS)
_OPT_BOOL = st.none() | st.booleans()
_HOSTS = st.none() | st.builds(
    HostProfile, name=_TEXT, speed=st.floats(0.05, 20), framework=st.sampled_from(("torch-1", "torch-2")),
    cpu_model=st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    clock_ghz=st.none() | st.floats(0.1, 10.0), microbench_us=st.none() | st.floats(1e-3, 1e6),
    torch_version=st.text(st.characters(blacklist_categories=("Cs",)), max_size=20), source=_TEXT)
_DEPLOYMENTS = st.builds(
    Deployment, runtime=st.sampled_from(DEPLOYMENT_RUNTIMES), host=_HOSTS,
    framework=st.none() | st.sampled_from(("torch-1", "torch-2")), tf32_matmul=_OPT_BOOL, tf32_conv=_OPT_BOOL,
    autocast=st.none() | st.sampled_from(AUTOCAST_DTYPES), input_copy=st.none() | st.sampled_from(INPUT_COPIES),
    channels_last=st.booleans(), cudnn_benchmark=_OPT_BOOL,
    versions=st.none() | st.dictionaries(_TEXT.filter(lambda k: k != "torch"), _TEXT, max_size=4))

_EXAMPLES = int(os.environ.get("DIPPM_NAS_FUZZ_EXAMPLES", "60"))


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dep=_DEPLOYMENTS, ext=st.sampled_from(("toml", "json")))
def test_property_save_then_load_round_trips_every_deployment(dep: Deployment, ext: str, tmp_path: Path) -> None:
    path = tmp_path / f"d.{ext}"
    dep.save(path)
    assert Deployment.load(path) == dep


@settings(max_examples=_EXAMPLES, deadline=None)
@given(versions=st.dictionaries(st.text(max_size=6) | st.integers(), st.text(max_size=8) | st.integers()
                                | st.floats(), max_size=3))
def test_property_any_versions_mapping_is_accepted_or_a_deployment_error(versions: dict[Any, Any]) -> None:
    try:
        Deployment(versions=versions)
    except DippmNasError as e:
        assert isinstance(e, DeploymentError) and "versions" in str(e)



def test_a_deeply_nested_user_device_file_is_skipped_not_a_recursion_error(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.devices import DEVICE_DIR_ENV, get_device, list_devices
    from dippm_nas.devices import _registry

    (tmp_path / "deep.toml").write_text("id = 'deep'\nsms = " + "[" * 50_000 + "]" * 50_000 + "\n")
    monkeypatch.setenv(DEVICE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(_registry, "_user_env", None)  # read the directory again
    assert "deep" not in list_devices() and "rtx-3090" in list_devices()
    with pytest.raises(DeviceError, match="deep.toml .*nests arrays/inline tables 50000 levels deep"):
        get_device("deep")
