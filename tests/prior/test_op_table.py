"""The host-CPU operator table: records from profiled calls and from graphs agree, the forest evaluated from
its arrays equals scikit-learn's, it survives JSON, and the prior uses it for the host's per-node times."""

from __future__ import annotations

import collections
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

import search_spaces as ss
from dippm_nas.errors import DippmNasError
from dippm_nas.prior import OpTable, PriorParams, aten_op_record, estimate, fit_op_table, graph_op_records
from dippm_nas.prior._op_table import N_FEATURES, _from_sklearn, record_features, reference_us


def _profile(space: str, seed: int, batch: int = 2) -> tuple[list, dict]:
    """Top-level aten calls of one forward (name, shapes, concrete inputs, µs, calls) and the model."""
    from dippm_nas.measure import profile_ops

    s = ss.get_space(space)
    cfg = s.sample(seed)
    spec = s.input_spec(cfg, batch_size=batch)
    model = ss.build_model(space, cfg)
    return profile_ops(model, spec, passes=1, warmup=1), {"model": model, "spec": spec}


@pytest.mark.parametrize("space", ["resnet", "vit", "mobilenetv3", "bert", "densenet", "convnext"])
def test_records_of_the_profiled_calls_match_those_of_the_graph(space: str) -> None:
    from dippm_nas.capture import capture

    ops, m = _profile(space, 3)
    calls: collections.Counter[str] = collections.Counter()
    for op in ops:  # identical calls come summed, with their count per forward
        if (r := aten_op_record(op[0], op[1], op[2])) is not None:
            calls[repr(r)] += round(op[4])
    graph = capture(m["model"], m["spec"], cache=False)
    nodes = collections.Counter(repr(r) for _, r in graph_op_records(graph))
    assert sum(calls.values()) > 3
    assert nodes == calls


def test_calls_that_are_not_records() -> None:
    assert aten_op_record("aten::view", [[2, 3], []], [None, [6]]) is None
    assert aten_op_record("aten::mul", [[2, 3], []], [None, 0.5]) is None  # scalar arithmetic
    assert aten_op_record("aten::mul", [[2, 3, 4, 4], [2, 3, 1, 1]], [None, None])[0] == "mul"


def test_forest_arrays_predict_what_sklearn_predicts() -> None:
    pytest.importorskip("sklearn")
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, N_FEATURES))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 3] * (x[:, 5] > 0) + 0.1 * rng.normal(size=600)
    reg = HistGradientBoostingRegressor(max_iter=40, max_leaf_nodes=15, random_state=0).fit(x, y)
    table = _from_sklearn(reg)
    xt = rng.normal(size=(50, N_FEATURES))
    np.testing.assert_allclose(table.predict_log_ratio(xt), reg.predict(xt), rtol=1e-9, atol=1e-9)
    back = OpTable.from_dict(json.loads(json.dumps(table.to_dict())))
    np.testing.assert_allclose(back.predict_log_ratio(xt), reg.predict(xt), rtol=1e-5, atol=1e-6)


def _synthetic_profiles() -> list[dict]:
    """Profiles whose op times follow a known law: 0.5 µs per MFLOP plus 3 µs, per call."""
    out = []
    for fam, seeds in (("resnet", range(6)), ("vgg", range(6)), ("vit", range(4))):
        for seed in seeds:
            ops, _ = _profile(fam, seed, batch=1)
            recs = []
            for op in ops:
                r = aten_op_record(op[0], op[1], op[2])
                if r is not None:
                    flops = math.exp(record_features(r)[-1]) - 1
                    recs.append([op[0], op[1], op[2], 3.0 + 0.5 * flops / 1e6, 1.0])
            total_us = sum(o[3] for o in recs) + 10.0 * len(recs)
            out.append({"family": fam, "latency_ms": total_us / 1e3, "ops": recs})
    return out


def test_fitted_table_in_the_prior_gives_the_host_node_times() -> None:
    pytest.importorskip("sklearn")
    from dippm_nas.capture import capture

    table = fit_op_table(_synthetic_profiles(), exclude_families=["vit"], max_iter=60, source="synthetic")
    assert table.metrics["excluded_families"] == ["vit"] and table.per_op_us >= 0 and table.scale > 0
    params = dataclasses.replace(PriorParams.uncalibrated(), op_tables={"host-cpu": table})
    back = PriorParams.from_dict(json.loads(json.dumps(params.to_dict())))
    assert set(back.op_tables) == {"host-cpu"}
    s = ss.get_space("vit")
    cfg = s.sample(7)
    graph = capture(ss.build_model("vit", cfg), s.input_spec(cfg, batch_size=1), cache=False)
    est = estimate(graph, "host-cpu", params=back)
    recs = graph_op_records(graph)
    # the memoised record times are the forest's own (a vit repeats its blocks: fewer unique records)
    direct = np.array([reference_us(r) for _, r in recs]) * np.exp(
        back.op_tables["host-cpu"].predict_log_ratio(np.array([record_features(r) for _, r in recs])))
    assert len({repr(r) for _, r in recs}) < len(recs)
    np.testing.assert_allclose(back.op_tables["host-cpu"].record_us([r for _, r in recs]), direct, rtol=1e-12)
    back.op_tables["host-cpu"].clear_memo()  # a cold start computes the same times
    assert not back.op_tables["host-cpu"]._memo
    np.testing.assert_allclose(back.op_tables["host-cpu"].record_us([r for _, r in recs]), direct, rtol=1e-12)
    want_us = table.scale * table.record_us([r for _, r in recs]).sum() + table.per_op_us * len(recs)
    assert est.latency_ms == pytest.approx(want_us / 1e3, rel=1e-6)
    assert est.node_time_ms[[i for i, _ in recs]].min() > 0
    others = np.setdiff1d(np.arange(len(graph.nodes)), [i for i, _ in recs])
    assert np.all(est.node_time_ms[others] == 0) and np.all(est.node_host_ms[others] == 0)
    # an op the table has no kind for keeps the analytic prior's time, never zero
    class Padded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(torch.nn.functional.pad(x, (2, 2, 2, 2), mode="reflect"))

    from dippm_nas.spec import InputSpec

    padded = capture(Padded().eval(), InputSpec(batch_size=1, shape=(3, 16, 16)), cache=False)
    pad = [n.index for n in padded.nodes if "pad" in n.op]
    assert pad and not any(i in pad for i, _ in graph_op_records(padded))
    with_table = estimate(padded, "host-cpu", params=back)
    analytic = estimate(padded, "host-cpu", params=PriorParams.uncalibrated())
    assert with_table.node_time_ms[pad[0]] == analytic.node_time_ms[pad[0]] > 0
    # GPUs and tables of other devices are untouched
    assert estimate(graph, "a100-sxm4-40gb", params=back).latency_ms == pytest.approx(
        estimate(graph, "a100-sxm4-40gb", params=PriorParams.uncalibrated()).latency_ms)


def test_a_table_of_another_record_schema_is_refused() -> None:
    pytest.importorskip("sklearn")
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(1)
    x = rng.normal(size=(100, N_FEATURES))
    d = _from_sklearn(HistGradientBoostingRegressor(max_iter=3).fit(x, x[:, 0])).to_dict()
    with pytest.raises(DippmNasError, match="record schema"):
        OpTable.from_dict({**d, "kinds": d["kinds"][:-1]})
    with pytest.raises(DippmNasError, match="format"):
        OpTable.from_dict({**d, "format": 99})
    with pytest.raises(DippmNasError, match="out of range"):
        OpTable.from_dict({**d, "left": [len(d["left"]) + 5] * len(d["left"])})
    with pytest.raises(DippmNasError, match="two families"):
        fit_op_table([{"family": "a", "latency_ms": 1.0, "ops": []}])


def test_an_operator_larger_than_any_profiled_one_scales_with_its_work() -> None:
    """Trees do not extrapolate: the table learns the ratio to a reference time that grows with FLOPs and
    elements, so a conv 16x larger than the largest profiled one is predicted about 16x slower, not capped."""
    pytest.importorskip("sklearn")
    profiles = _synthetic_profiles()
    table = fit_op_table(profiles, max_iter=60)
    convs = [r for p in profiles for op in p["ops"] if (r := aten_op_record(op[0], op[1], op[2])) and r[0] == "conv"]
    big = max(convs, key=lambda r: math.exp(record_features(r)[-1]))
    kind, x, w, p = big
    bigger = (kind, [x[0] * 16, *x[1:]], w, p)  # 16x the batch: 16x the FLOPs and activations
    t_big, t_bigger = table.record_us([big, bigger])
    assert 8 < t_bigger / t_big < 24


def test_reference_time_of_an_embedding_counts_the_rows_looked_up() -> None:
    from dippm_nas.prior._op_table import reference_us

    small, large = ("embedding", [1000, 64], [128], [0.0] * 8), ("embedding", [100_000, 64], [128], [0.0] * 8)
    assert reference_us(small) == reference_us(large)  # the table's size is not read
    assert reference_us(("embedding", [1000, 64], [256], [0.0] * 8)) > reference_us(small)


def _law_profiles(families: dict[str, range], cache_bytes: float, speedup: float) -> list[dict]:
    """Profiles whose every call takes exactly its reference time, with the weights of models whose working
    set fits in ``cache_bytes`` read ``speedup`` times faster (the law the residency model assumes)."""
    from dippm_nas.prior import working_set_bytes

    out = []
    for fam, seeds in families.items():
        for seed in seeds:
            ops, _ = _profile(fam, seed, batch=2)
            recs = [(op, r) for op in ops if (r := aten_op_record(op[0], op[1], op[2])) is not None]
            s = speedup if working_set_bytes((r, op[4]) for op, r in recs) <= cache_bytes else 1.0
            calls = [[op[0], op[1], op[2], op[4] * reference_us(r, weight_speedup=s), op[4]] for op, r in recs]
            out.append({"family": fam, "latency_ms": sum(c[3] for c in calls) / 1e3, "ops": calls, "hot": s > 1})
    return out


def test_cache_residency_carries_to_an_unseen_family_of_cached_models() -> None:
    """Tables fitted on CNNs too large for the cache predict small MLPs (whose weights stay cached between
    passes) at the DRAM rate unless the residency model is on; with it, at the cached rate."""
    pytest.importorskip("sklearn")
    from dippm_nas.prior import working_set_bytes

    train = _law_profiles({"resnet": range(5), "vgg": range(5)}, cache_bytes=0, speedup=1.0)
    sizes = [working_set_bytes((r, op[4]) for op in p["ops"] if (r := aten_op_record(op[0], op[1], op[2])))
             for p in train]
    cache = 0.9 * min(sizes)  # every CNN is larger than the cache
    mlps = [p for p in _law_profiles({"mlp": range(30)}, cache_bytes=cache, speedup=2.0) if p["hot"]]
    assert len(mlps) >= 4
    off = fit_op_table(train, max_iter=60)
    on = fit_op_table(train, max_iter=60, cache_bytes=cache, weight_cache_speedup=2.0)
    assert on.metrics["cache_resident_models"] == 0 and on.cache_bytes == cache

    def err(table: OpTable) -> float:
        e = []
        for p in mlps:
            recs = [(r, op[4]) for op in p["ops"] if (r := aten_op_record(op[0], op[1], op[2]))]
            s = table.weight_speedup(working_set_bytes(recs))
            pred = table.scale * float(table.record_us([r for r, _ in recs], weight_speedup=s)
                                       .dot([c for _, c in recs])) + table.per_op_us * sum(c for _, c in recs)
            e.append(abs(pred / (p["latency_ms"] * 1e3) - 1))
        return float(np.mean(e))

    print(f"mean abs error on {len(mlps)} cached MLPs: {err(off):.3f} without the residency model, {err(on):.3f} with")
    assert err(on) < 0.5 * err(off) and err(off) > 0.2


def test_reference_time_reads_cached_weights_faster_and_the_table_keeps_the_setting() -> None:
    pytest.importorskip("sklearn")
    from sklearn.ensemble import HistGradientBoostingRegressor

    from dippm_nas.prior import working_set_bytes

    lin = ("linear", [4, 1024], [2048, 1024], [0.0] * 8)
    mm = ("matmul", [4, 1024], [1024, 2048], [0.0] * 8)
    assert reference_us(lin, weight_speedup=2.0) < reference_us(lin)
    assert reference_us(mm, weight_speedup=2.0) == reference_us(mm)  # a second activation, not a weight
    assert working_set_bytes([(lin, 2.0), (mm, 1.0)]) == 4 * (2 * (4 * 1024 + 2048 * 1024) + 4 * 1024)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(100, N_FEATURES))
    t = _from_sklearn(HistGradientBoostingRegressor(max_iter=3).fit(x, x[:, 0]))
    assert t.cache_bytes == 0 and t.weight_speedup(1.0) == 1.0  # off unless fitted with it
    on = dataclasses.replace(t, cache_bytes=1e6, weight_cache_speedup=1.8)
    assert on.weight_speedup(1e6) == 1.8 and on.weight_speedup(1e6 + 1) == 1.0
    assert on.record_us([lin], weight_speedup=1.8)[0] < on.record_us([lin])[0]  # memo keyed by the speed-up
    back = OpTable.from_dict(json.loads(json.dumps(on.to_dict())))
    assert (back.cache_bytes, back.weight_cache_speedup) == (1e6, 1.8)
    old = {k: v for k, v in t.to_dict().items() if k not in ("cache_bytes", "weight_cache_speedup")}
    assert OpTable.from_dict(old).cache_bytes == 0  # tables fitted before the setting read as off
    with pytest.raises(DippmNasError, match="weight_cache_speedup >= 1"):
        dataclasses.replace(t, weight_cache_speedup=0.5)
    with pytest.raises(DippmNasError, match="non-numeric"):
        OpTable.from_dict({**on.to_dict(), "cache_bytes": "16 MiB"})
