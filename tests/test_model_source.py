"""ModelSource: every form a user hands to capture / predict parsed in one place, and the moved SPEC names."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
from _models import TinyVGG
from torch import nn

import dippm_nas
import search_spaces as ss
from dippm_nas import InputSpec, InputSpecError, ModelSpecError, capture
from dippm_nas.capture import SOURCE_KINDS, ModelSource, load_callable, load_model
from dippm_nas.errors import SearchSpaceError

SPEC = InputSpec(shape=(3, 16, 16), batch_size=2)
MLP = {"in_features": 12, "hidden": [16, 8], "activation": "gelu", "norm": "batchnorm", "out_features": 3}


def test_each_form_is_parsed_to_its_kind_with_its_label(tmp_path: Path) -> None:
    module = TinyVGG().eval()
    cases = {
        "module": (module, "TinyVGG"),
        "onnx": (tmp_path / "m.onnx", "m.onnx"),
        "spec": ("torchvision:resnet18", "torchvision:resnet18"),
        "factory": (TinyVGG, "TinyVGG"),
    }
    for kind, (model, label) in cases.items():
        src = ModelSource.parse(model, SPEC)
        assert (src.kind, src.label, src.spec) == (kind, label, SPEC)
        assert src.graph is None and not src.assemblable and src.search_space is None
    onnx = ModelSource.parse(str(tmp_path / "M.ONNX"), SPEC)
    assert onnx.kind == "onnx" and isinstance(onnx.model, Path)
    assert ModelSource.parse(functools.partial(TinyVGG), SPEC).label == "TinyVGG"
    assert set(SOURCE_KINDS) == {"graph", "module", "onnx", "spec", "factory"}
    assert ModelSource.parse(ModelSource.parse(module, SPEC)).model is module  # a ModelSource passes through


def test_a_graph_carries_its_spec_and_refuses_another() -> None:
    graph = capture(TinyVGG().eval(), SPEC, cache=False)
    src = ModelSource.parse(graph)
    assert src.kind == "graph" and src.graph is graph and src.spec == SPEC
    assert ModelSource.parse(graph, SPEC).graph is graph
    with pytest.raises(InputSpecError, match="differs from spec=.*pass spec=None with a graph"):
        ModelSource.parse(graph, SPEC.with_batch_size(4))
    assert capture(graph, None) is graph  # capture of a graph is the graph


def test_bad_values_name_the_rule_the_value_and_the_forms() -> None:
    with pytest.raises(InputSpecError, match=r"spec is required with a model \(module: InputSpec"):
        ModelSource.parse(TinyVGG())
    with pytest.raises(InputSpecError, match="spec must be a dippm_nas.InputSpec.*got str '3,16,16'"):
        ModelSource.parse(TinyVGG(), "3,16,16")  # type: ignore[arg-type]
    with pytest.raises(ModelSpecError, match=r"model must be one of: an OperatorGraph; a torch.nn.Module; .*"
                                             r"zero-argument factory.*got int 3"):
        ModelSource.parse(3, SPEC)
    with pytest.raises(ModelSpecError, match="non-empty string"):
        ModelSource.parse("", SPEC)
    with pytest.raises(ModelSpecError, match="model SPEC must be one of"):
        ModelSource.parse("resnet18", SPEC).build()


def test_build_runs_factories_and_wraps_their_failures() -> None:
    def boom() -> nn.Module:
        raise RuntimeError("no such width")

    assert isinstance(ModelSource.parse(lambda: nn.Linear(2, 2), SPEC).build(), nn.Linear)
    with pytest.raises(ModelSpecError, match="the model factory .*boom raised RuntimeError: no such width"):
        ModelSource.parse(boom, SPEC).build()
    with pytest.raises(ModelSpecError, match="returned str, expected a torch.nn.Module"):
        ModelSource.parse(lambda: "x", SPEC).build()


def test_search_space_candidates_are_read_once() -> None:
    cfg = ss.get_space("mlp").validate(MLP)
    spec = ss.get_space("mlp").input_spec(cfg, batch_size=2)
    built = ModelSource.parse(ss.build_model("mlp", cfg), spec)
    assert (built.kind, built.search_space, built.search_space_config, built.assemblable) == ("module", "mlp", cfg,
                                                                                              True)
    lazy = ModelSource.parse(functools.partial(ss.build_model, "mlp", cfg), spec)
    assert (lazy.kind, lazy.search_space, lazy.assemblable, lazy.label) == ("factory", "mlp", True, "mlp candidate")
    assert ModelSource.from_space("mlp", cfg, spec).search_space_config == cfg
    seeded = ModelSource.parse(functools.partial(ss.build_model, "mlp", cfg, seed=3), spec)
    assert seeded.search_space is None and not seeded.assemblable
    changed = ss.build_model("mlp", cfg)
    changed.net[0] = nn.Linear(changed.net[0].in_features, 17)
    edited = ModelSource.parse(changed, spec)  # still declares its space (recorded), but is captured whole
    assert edited.search_space == "mlp" and not edited.assemblable
    with pytest.raises(SearchSpaceError, match="unknown search space 'nope'; choices"):
        ModelSource.from_space("nope", cfg, spec)
    with pytest.raises(SearchSpaceError, match="must be a mapping"):
        ModelSource.from_space("mlp", [1], spec)  # type: ignore[arg-type]


def test_a_factory_is_captured_as_the_module_it_builds() -> None:
    by_factory = capture(TinyVGG, SPEC, cache=False)
    assert by_factory.structural_hash() == capture(TinyVGG().eval(), SPEC, cache=False).structural_hash()


@pytest.mark.filterwarnings("ignore:no trained predictor checkpoint")
def test_predict_many_fails_a_bad_item_alone_with_its_own_error() -> None:
    graph = capture(TinyVGG().eval(), SPEC, cache=False)
    out = dippm_nas.predict_many([graph, (TinyVGG(), "3,16,16"), "torchvision:resnet18", ModelSource.parse(graph)],
                                 device="h100-sxm5-80gb", cache=False)
    assert out[0].latency_ms > 0 and out[3].latency_ms == pytest.approx(out[0].latency_ms)
    assert isinstance(out[1], InputSpecError) and str(out[1]).startswith("item 1: spec must be a dippm_nas.InputSpec")
    assert isinstance(out[2], InputSpecError) and "item 2 must be an OperatorGraph, a ModelSource or a (model" \
        in str(out[2])


def test_parsing_a_spec_string_loads_no_torch() -> None:
    code = ("import sys; from dippm_nas import InputSpec; from dippm_nas.capture import ModelSource; "
            "s = ModelSource.parse('torchvision:resnet18', InputSpec(shape=(3, 8, 8))); "
            "assert s.kind == 'spec' and 'torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_moved_names_keep_their_old_path_with_a_deprecation_warning() -> None:
    import dippm_nas.spec as spec_module

    for name, new in (("load_model", load_model), ("load_callable", load_callable)):
        with pytest.warns(DeprecationWarning, match=rf"dippm_nas.spec.{name} is deprecated and will be removed in "
                                                    r"dippm-nas 0.2: import it from dippm_nas.capture"):
            assert getattr(spec_module, name) is new
    with pytest.warns(DeprecationWarning, match="MAX_ONNX_BYTES"):
        from dippm_nas.spec import MAX_ONNX_BYTES
    assert MAX_ONNX_BYTES == 2**31
    with pytest.raises(AttributeError, match="module 'dippm_nas.spec' has no attribute 'nope'"):
        spec_module.nope  # noqa: B018
