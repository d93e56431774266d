"""NNI search spaces sampled with Optuna: every NNI 3.0 type with NNI's meaning (q rounding and clipping,
randint's half-open range, log and normal types, nested choices), the way back from an NNI value to
Optuna's parameters (import_data), and the errors. Needs Optuna only; the comparison with NNI's own
``deformat_parameters`` skips without NNI.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FixedTrial

from dippm_nas.errors import SearchSpaceError
from dippm_nas.nni import SUPPORTED_TYPES, parse_search_space, quantize

PHI = NormalDist().cdf


def dim(typ: str, value: list):
    return parse_search_space({"x": {"_type": typ, "_value": value}})["x"]


def test_every_nni_type_is_supported() -> None:
    assert set(SUPPORTED_TYPES) == {"choice", "randint", "uniform", "quniform", "loguniform", "qloguniform",
                                    "normal", "qnormal", "lognormal", "qlognormal"}


def test_quantize_is_nnis_round_then_clip() -> None:
    assert quantize(4.4, 3) == 3.0 and quantize(4.6, 3) == 6.0
    assert quantize(4.5, 3) == 6.0 and quantize(7.5, 3) == 6.0  # Python's round: half to even (1.5 -> 2, 2.5 -> 2)
    assert quantize(1.2, 3, 1, 10) == 1.0  # round gives 0, clipped up to low
    assert quantize(10.0, 3, 1, 10) == 9.0 and quantize(11.9, 3, 1, 11) == 11.0  # 12 clipped down to high
    assert quantize(-7.3, 0.5) == -7.5  # the normal types are not clipped
    assert isinstance(quantize(3, 1), float)  # q types give floats, as in NNI


def test_choice_of_primitives_and_of_lists() -> None:
    d = dim("choice", ["relu", "gelu", 3, None])
    assert d.distribution == CategoricalDistribution(["relu", "gelu", 3, None]) and d.choices is None
    assert d.sample(FixedTrial({"x": "gelu"})) == "gelu"
    lists = dim("choice", [[64], [128, 128], {"a": 1}])
    assert lists.distribution == CategoricalDistribution([0, 1, 2])  # index-coded
    assert lists.decode(1) == [128, 128] and lists.decode(2) == {"a": 1}
    v = lists.decode(1)
    v.append(0)
    assert lists.decode(1) == [128, 128]  # a copy each time


def test_randint_is_half_open_with_nnis_ceil() -> None:
    assert dim("randint", [2, 5]).distribution == IntDistribution(2, 4)
    assert dim("randint", [1.5, 4.2]).distribution == IntDistribution(2, 4)  # ceil(1.5)=2 .. ceil(4.2)=5 exclusive
    d = dim("randint", [-3, 0])
    assert d.sample(FixedTrial({"x": -1})) == -1 and isinstance(d.decode(-1), int)


def test_uniform_and_loguniform() -> None:
    u = dim("uniform", [0.1, 0.5])
    assert u.distribution == FloatDistribution(0.1, 0.5) and u.decode(0.3) == 0.3
    lg = dim("loguniform", [1e-4, 1e-1])
    assert lg.distribution == FloatDistribution(1e-4, 1e-1, log=True) and lg.decode(0.01) == 0.01


def test_quniform_values_and_their_probabilities_are_nnis() -> None:
    d = dim("quniform", [1, 10, 3])
    assert d.distribution == FloatDistribution(1.0, 10.0)  # sampled continuous, rounded after
    assert [d.decode(x) for x in (1.0, 1.49, 1.51, 4.49, 4.51, 7.49, 7.51, 10.0)] == [
        1.0, 1.0, 3.0, 3.0, 6.0, 6.0, 9.0, 9.0]
    # uniform on [1, 10]: P(1) = 0.5/9, P(3) = P(6) = 3/9, P(9) = 2.5/9 (NNI's clip(round(u / q) * q, low, high))
    n = 90_000
    grid = [1 + 9 * (i + 0.5) / n for i in range(n)]
    counts: dict[float, int] = {}
    for x in grid:
        counts[d.decode(x)] = counts.get(d.decode(x), 0) + 1
    assert sorted(counts) == [1.0, 3.0, 6.0, 9.0]
    for v, p in {1.0: 0.5 / 9, 3.0: 3 / 9, 6.0: 3 / 9, 9.0: 2.5 / 9}.items():
        assert counts[v] / n == pytest.approx(p, abs=1e-3)
    # a step that does not divide the range is fine (NNI clips)
    assert dim("quniform", [0, 1, 0.3]).decode(1.0) == pytest.approx(0.9)


def test_qloguniform_rounds_the_log_sample_and_clips() -> None:
    d = dim("qloguniform", [1, 100, 10])
    assert d.distribution == FloatDistribution(1.0, 100.0, log=True)
    assert [d.decode(x) for x in (1.2, 4.9, 5.1, 14.9, 96.0, 100.0)] == [1.0, 1.0, 10.0, 10.0, 100.0, 100.0]


def test_normal_types_map_a_probability_through_the_inverse_cdf() -> None:
    n = dim("normal", [1.0, 2.0])
    assert n.distribution == FloatDistribution(1e-12, 1 - 1e-12)
    assert n.decode(0.5) == pytest.approx(1.0) and n.decode(PHI(1.0)) == pytest.approx(3.0)
    assert n.decode(1e-12) == pytest.approx(1.0 - 2.0 * 7.034, abs=0.01)  # tails cut at about 7 sigma
    qn = dim("qnormal", [0.0, 1.0, 0.5])
    assert qn.decode(PHI(0.74)) == 0.5 and qn.decode(PHI(-2.3)) == -2.5  # not clipped
    ln = dim("lognormal", [0.0, 1.0])
    assert ln.decode(PHI(1.0)) == pytest.approx(math.e)
    qln = dim("qlognormal", [0.0, 1.0, 1.0])
    assert qln.decode(PHI(1.0)) == 3.0 and qln.decode(PHI(-5.0)) == 0.0  # round(exp(-5)) = 0


def test_normal_sampled_by_optunas_random_sampler_has_nnis_moments() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    d = dim("normal", [5.0, 2.0])
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    xs = []
    for _ in range(2000):
        t = study.ask()
        xs.append(d.sample(t))
        study.tell(t, 0.0)
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    assert mean == pytest.approx(5.0, abs=0.15) and sd == pytest.approx(2.0, rel=0.06)


def test_nested_choice_samples_only_the_chosen_options_keys() -> None:
    space = {"layer": {"_type": "choice", "_value": [
        {"_name": "conv", "kernel": {"_type": "choice", "_value": [3, 5]},
         "width": {"_type": "quniform", "_value": [8, 64, 8]}},
        {"_name": "pool"},
    ]}, "lr": {"_type": "loguniform", "_value": [1e-3, 1e-1]}}
    dims = parse_search_space(space)
    d = dims["layer"]
    assert d.distribution == CategoricalDistribution(["conv", "pool"])
    (conv, conv_keys), (pool, pool_keys) = d.options
    assert (conv, pool, pool_keys) == ("conv", "pool", {})
    assert [k.param for k in conv_keys.values()] == ["layer/conv/kernel", "layer/conv/width"]
    v = d.sample(FixedTrial({"layer": "conv", "layer/conv/kernel": 5, "layer/conv/width": 21.0}))
    assert v == {"_name": "conv", "kernel": 5, "width": 24.0}
    assert d.sample(FixedTrial({"layer": "pool"})) == {"_name": "pool"}
    # with a real study, the inner keys exist only in the trials that chose their option
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(20):
        t = study.ask()
        val = {k: x.sample(t) for k, x in dims.items()}
        seen.add(val["layer"]["_name"])
        assert ("layer/conv/kernel" in t.params) == (val["layer"]["_name"] == "conv")
        study.tell(t, 0.0)
    assert seen == {"conv", "pool"}
    # a deeper nest
    deep = parse_search_space({"a": {"_type": "choice", "_value": [
        {"_name": "x", "b": {"_type": "choice", "_value": [{"_name": "y", "c": {"_type": "randint", "_value": [0, 2]}},
                                                            {"_name": "z"}]}}]}})
    assert deep["a"].sample(FixedTrial({"a": "x", "a/x/b": "y", "a/x/b/y/c": 1})) == {
        "_name": "x", "b": {"_name": "y", "c": 1}}


def test_choice_with_some_named_dicts_is_plain_as_in_nni() -> None:
    d = dim("choice", [{"_name": "a"}, 3])  # not every option is a dict with _name: plain values
    assert d.options is None and d.decode(0) == {"_name": "a"}


def test_encode_inverts_sampling_for_every_type() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {
        "c": {"_type": "choice", "_value": ["a", "b", 1.5]},
        "l": {"_type": "choice", "_value": [[1], [2, 2]]},
        "r": {"_type": "randint", "_value": [0, 10]},
        "u": {"_type": "uniform", "_value": [-1, 1]},
        "qu": {"_type": "quniform", "_value": [1, 10, 3]},
        "lu": {"_type": "loguniform", "_value": [1e-3, 1]},
        "qlu": {"_type": "qloguniform", "_value": [1, 100, 10]},
        "n": {"_type": "normal", "_value": [0, 1]},
        "qn": {"_type": "qnormal", "_value": [0, 2, 0.5]},
        "ln": {"_type": "lognormal", "_value": [0, 1]},
        "qln": {"_type": "qlognormal", "_value": [1, 1, 2]},
        "nest": {"_type": "choice", "_value": [{"_name": "p", "k": {"_type": "quniform", "_value": [0, 1, 0.25]}},
                                               {"_name": "q"}]},
    }
    dims = parse_search_space(space)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(30):
        t = study.ask()
        values = {k: d.sample(t) for k, d in dims.items()}
        encoded: dict = {}
        for k, d in dims.items():
            encoded.update(d.encode(values[k]))
        assert set(encoded) == set(t.params)
        fixed = FixedTrial({name: internal for name, (_, internal) in encoded.items()})
        again = {k: d.sample(fixed) for k, d in dims.items()}
        for k in dims:
            if isinstance(values[k], float):
                assert again[k] == pytest.approx(values[k], rel=1e-9, abs=1e-12), k
            else:
                assert again[k] == values[k], k
        study.tell(t, 0.0)


@pytest.mark.parametrize("typ, value, bad, match", [
    ("quniform", [1, 10, 3], 2.0, "not a value it takes"),      # NNI never gives 2 here
    ("quniform", [1, 10, 3], 12.0, "outside"),
    ("randint", [2, 5], 5, r"not an int in \[2, 5\)"),
    ("choice", ["a", "b"], "c", "not one of the choices"),
    ("choice", [[1], [2]], [3], "not one of the choices"),
    ("lognormal", [0, 1], -1.0, "is not > 0"),
    ("uniform", [0, 1], "x", "finite number"),
])
def test_encode_rejects_values_the_key_cannot_take(typ: str, value: list, bad, match: str) -> None:
    with pytest.raises(SearchSpaceError, match=match):
        dim(typ, value).encode(bad)


def test_encode_rejects_unknown_nested_options_and_keys() -> None:
    d = dim("choice", [{"_name": "p", "k": {"_type": "randint", "_value": [0, 3]}}, {"_name": "q"}])
    with pytest.raises(SearchSpaceError, match=r"'_name': one of \['p', 'q'\]"):
        d.encode({"_name": "r"})
    with pytest.raises(SearchSpaceError, match="lacks key 'k'"):
        d.encode({"_name": "p"})
    with pytest.raises(SearchSpaceError, match=r"has no keys \['z'\]"):
        d.encode({"_name": "q", "z": 1})


@pytest.mark.parametrize("space, match", [
    ({"x": {"_type": "beta", "_value": [0, 1]}}, "not one of NNI's types"),
    ({"x": {"_type": "choice", "_value": []}}, "non-empty"),
    ({"x": {"_type": "choice", "_value": [1, 1]}}, "distinct"),
    ({"x": {"_type": "choice", "_value": [{"_name": "a"}, {"_name": "a"}]}}, "distinct, non-empty string _name"),
    ({"x": {"_type": "choice", "_value": [{"_name": "a", "k": {"_type": "uniform", "_value": [1, 0]}}]}},
     "low < high"),
    ({"x": {"_type": "uniform", "_value": [1, 0]}}, "low < high"),
    ({"x": {"_type": "loguniform", "_value": [0, 1]}}, "0 < low < high"),
    ({"x": {"_type": "qloguniform", "_value": [1, 10]}}, r"\[low, high, q\]"),
    ({"x": {"_type": "quniform", "_value": [0, 1, 0]}}, "q > 0"),
    ({"x": {"_type": "normal", "_value": [0, 0]}}, "sigma > 0"),
    ({"x": {"_type": "qnormal", "_value": [0, 1]}}, r"\[mu, sigma, q\]"),
    ({"x": {"_type": "randint", "_value": [3, 3]}}, "ceil"),
    ({"x": {"_type": "uniform", "_value": [0, float("inf")]}}, "finite"),
    ({"x": {"_type": "uniform"}}, "_type"),
    ({"dippm": {"_type": "choice", "_value": [1]}}, "reserved"),
    ({"a/p/k": {"_type": "choice", "_value": [1]},
      "a": {"_type": "choice", "_value": [{"_name": "p", "k": {"_type": "choice", "_value": [2]}}]}},
     "same Optuna parameter names"),
    ({}, "non-empty"),
])
def test_parse_search_space_states_the_rule_and_the_value(space: dict, match: str) -> None:
    with pytest.raises(SearchSpaceError, match=match):
        parse_search_space(space)


def test_decoding_matches_nnis_own_deformat_parameters() -> None:
    """The same internal sample gives the same value here and in NNI 3.0 (``deformat_parameters``)."""
    pytest.importorskip("nni", reason="compares with NNI's own formatting (pip install -e '.[nni]')")
    from nni.common.hpo_utils.formatting import deformat_parameters, format_search_space

    space = {
        "qu": {"_type": "quniform", "_value": [1, 10, 3]},
        "qlu": {"_type": "qloguniform", "_value": [1, 100, 10]},
        "qn": {"_type": "qnormal", "_value": [1, 2, 0.5]},
        "ln": {"_type": "lognormal", "_value": [0.5, 1]},
        "qln": {"_type": "qlognormal", "_value": [0, 1, 2]},
        "r": {"_type": "randint", "_value": [3, 9]},
    }
    nni_space = format_search_space(space)
    dims = parse_search_space(space)
    for i in range(101):
        f = i / 100
        # NNI's internal values: uniform value, log of it, the normal draw, the index past the lower bound
        nni_x = {("qu",): 1 + 9 * f, ("qlu",): math.log(100) * f, ("qn",): 1 + 2 * (6 * f - 3),
                 ("ln",): 0.5 + (6 * f - 3), ("qln",): 6 * f - 3, ("r",): min(int(6 * f), 5)}
        want = deformat_parameters(nni_x, nni_space)
        ours = {"qu": 1 + 9 * f, "qlu": math.exp(math.log(100) * f), "qn": PHI(6 * f - 3), "ln": PHI(6 * f - 3),
                "qln": PHI(6 * f - 3), "r": 3 + min(int(6 * f), 5)}
        for k, d in dims.items():
            got = d.decode(min(max(ours[k], 1e-12), 1 - 1e-12) if "normal" in d.type else ours[k])
            assert got == pytest.approx(want[k], rel=1e-9, abs=1e-9), (k, f, got, want[k])
