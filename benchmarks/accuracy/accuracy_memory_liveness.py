"""How well the prior's activation liveness agrees with eager PyTorch, per family, before -> after (no GPU needed).

For each model, batch size and precision, the label is :func:`dippm_nas.measure.reference_activation_peak`:
the model runs eagerly on fake tensors under a dispatch mode that tracks live storages (exact eager
liveness, Python frames' references included), under ``torch.no_grad()``; in float32 on the fake ``cpu``
device, and under ``torch.autocast(dtype=float16)`` on the fake ``cuda`` device (CUDA's autocast operator
lists, fused attention; a CUDA-enabled torch build, no GPU) where the build has CUDA, else CPU autocast.
The prediction ("after") is :func:`dippm_nas.prior.activation_liveness` with eager retention, inputs apart,
and ``autocast`` for the autocast rows; "before" is the same function of another version of
``dippm_nas/prior/_memory.py`` (``--before-module``, e.g. ``git show BASE:dippm_nas/prior/_memory.py``), which
may not take ``autocast`` (its float32 figure is used). Per family and precision: MAPE, bias, the worst error,
the models more than 3 % low; over everything, the root-mean-square relative error of "after". Each row also
keeps ``provenance`` (whether the priced graph carries it) and ``structural_mib`` (the same graph priced without
its provenance, by the structural rules alone); ``--sigma`` prints the σ of the activation part from them
(:func:`sigma_figures`: ``ACTIVATION_REL_SIGMA_PROVENANCE`` and ``ACTIVATION_REL_SIGMA`` of
``dippm_nas/prior/_memory.py``; give it the zoo and the search-space rows together). With ``--mig DEVICE`` it also checks the MIG
advice of each float32 model: no profile recommended whose usable memory is below the reference peak plus the
weights, the input and the CUDA context (:func:`dippm_nas.mig.mig_fit_violations`).

Models: 30 torchvision and 20 timm image models (3x224x224) and 5 ``transformers`` encoders and decoders
built from configs in code (nothing downloaded; ``input_ids`` of ``--seq`` tokens); with ``--dataset``, also
``--per-family`` graphs of each search-space family of a dataset export with graphs (float32, their own batch
sizes; ``--whole-capture`` prices each model captured whole, with provenance, instead of its stored graph)::

    git show BASE:dippm_nas/prior/_memory.py > /tmp/memory_before.py
    PYTHONPATH=$PWD nice -n 10 /work/venv-vision/bin/python benchmarks/accuracy/accuracy_memory_liveness.py \\
        --torchvision default --timm default --transformers default --batches 8,32 --token-batches 2,8 \\
        --before-module /tmp/memory_before.py --mig a100-sxm4-40gb --rows /tmp/liveness_rows.jsonl

``--rows`` keeps one JSON line per (model, batch, precision), and the search-space rows, and is read back on a
rerun (resumable; with search-space rows in it the dataset is not sampled again); ``--rows ROWS --sigma`` alone
prints the table and the σ of a rows file.
``--reference-rows`` takes the reference figures of an earlier run's rows and recomputes before and after
(minutes instead of the tracker's passes; the tracker does not depend on the prior's code).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._common import machine  # noqa: E402
from dippm_nas.measure import reference_activation_peak  # noqa: E402
from dippm_nas.prior import activation_liveness  # noqa: E402
from dippm_nas.spec import InputSpec  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402

MIB = 2**20
LOW_LIMIT = -0.03

DEFAULT_TORCHVISION = ("resnet18,resnet34,resnet50,resnet101,wide_resnet50_2,resnext50_32x4d,vgg11_bn,vgg13,vgg16,"
                       "densenet121,densenet169,mobilenet_v2,mobilenet_v3_large,mobilenet_v3_small,efficientnet_b0,"
                       "efficientnet_b2,efficientnet_v2_s,convnext_tiny,regnet_y_400mf,regnet_y_800mf,"
                       "regnet_x_1_6gf,mnasnet1_0,shufflenet_v2_x1_0,squeezenet1_0,alexnet,googlenet,vit_b_16,"
                       "vit_b_32,swin_t,maxvit_t")
DEFAULT_TIMM = ("vit_small_patch16_224,deit_tiny_patch16_224,swin_tiny_patch4_window7_224,convnext_nano,"
                "efficientnet_b1,mobilenetv3_large_100,resnet26d,regnety_008,mixer_b16_224,convmixer_768_32,"
                "levit_128,poolformer_s12,coat_lite_tiny,ghostnet_100,rexnet_100,cspresnet50,dla34,"
                "hrnet_w18_small,inception_v3,xception41")
_HERE = "benchmarks.accuracy.accuracy_memory_liveness"
DEFAULT_TRANSFORMERS = "bert_base,distilbert,qwen2_small,llama_small,opt_small"
_FAMILIES = (("vit|deit", "vit"), ("swin", "swin"), ("convnext", "convnext"), ("densenet", "densenet"),
             ("mobilenet|mnasnet|efficientnet|ghostnet|rexnet", "mobile"), ("resnet|resnext|cspresnet", "resnet"),
             ("vgg|alexnet", "vgg"), ("regnet", "regnet"), ("bert", "encoder"), ("gpt|llama|opt|qwen", "decoder"))


# ------------------------------------------------------------------ transformers built from configs
def _last_hidden(model: Any, keys: tuple[str, ...]) -> Any:
    from dippm_nas.measure.campaign_models import LastHidden

    return LastHidden(model, keys).eval()


def distilbert() -> Any:
    """DistilBERT encoder (``transformers.DistilBertConfig()`` defaults: 6 layers, hidden 768)."""
    import transformers

    return _last_hidden(transformers.DistilBertModel(transformers.DistilBertConfig(attn_implementation="sdpa")),
                        ("input_ids",))


def llama_small() -> Any:
    """A Llama decoder: 4 layers, hidden 768, 12 heads, MLP 2048, vocabulary 32000, no KV cache."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=4,
                                   num_attention_heads=12, num_key_value_heads=12, use_cache=False,
                                   attn_implementation="sdpa")
    return _last_hidden(transformers.LlamaModel(cfg), ("input_ids",))


def qwen2_small() -> Any:
    """A Qwen2 decoder: 4 layers, hidden 768, 12 heads (4 key-value heads), MLP 2048, no KV cache."""
    import transformers

    cfg = transformers.Qwen2Config(hidden_size=768, intermediate_size=2048, num_hidden_layers=4,
                                   num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
                                   use_cache=False, attn_implementation="sdpa")
    return _last_hidden(transformers.Qwen2Model(cfg), ("input_ids",))


def opt_small() -> Any:
    """An OPT decoder: 4 layers, hidden 768, 12 heads, FFN 3072, no KV cache."""
    import transformers

    cfg = transformers.OPTConfig(hidden_size=768, ffn_dim=3072, num_hidden_layers=4, num_attention_heads=12,
                                 use_cache=False, attn_implementation="sdpa")
    return _last_hidden(transformers.OPTModel(cfg), ("input_ids",))


def _model_spec(source: str, name: str) -> str:
    if source != "transformers":
        return f"{source}:{name}"
    return f"dippm_nas.measure.campaign_models:{name}" if name in ("bert_base", "gpt2_small") else f"{_HERE}:{name}"


def _input_spec(source: str, name: str, batch: int, seq: int) -> InputSpec:
    if source != "transformers":
        return InputSpec(shape=(3, 224, 224), batch_size=batch)
    inputs = [{"name": "input_ids", "shape": [seq], "dtype": "int64", "high": 30000}]
    if name == "bert_base":
        inputs.append({"name": "attention_mask", "shape": [seq], "dtype": "int64", "high": 2})
    return InputSpec.from_dict({"inputs": inputs, "batch_size": batch, "dtype": "float32"})


def family(source: str, name: str) -> str:
    """``source:family`` of a model, by its name."""
    for pattern, fam in _FAMILIES:
        if re.search(pattern, name):
            return f"{source}:{fam}"
    return f"{source}:other"


# ------------------------------------------------------------------ one row
def _before_fn(path: Path | None) -> Any:
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("_memory_before", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["_memory_before"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.activation_liveness


@dataclass(frozen=True)
class _Reference:
    """The tracker's figures a row needs (from :func:`reference_activation_peak` or a rows file)."""

    peak_block_bytes: int
    input_bytes: int
    peak_op: str


def one_row(source: str, name: str, batch: int, seq: int, mode: str, before: Any, mig: str | None,
            known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The reference, before and after figures of one model, batch and precision (``fp32`` / ``fp16``);
    ``known``: a row of an earlier run whose reference figures are taken instead of tracking the pass again
    (the tracker does not depend on the prior's code)."""
    import dippm_nas
    import torch

    model_spec = _model_spec(source, name)
    spec = _input_spec(source, name, batch, seq)
    ac = None if mode == "fp32" else "float16"
    device = "cpu" if ac is None or not torch.backends.cuda.is_built() else "cuda"
    t0 = time.perf_counter()
    if known is not None:
        ref: Any = _Reference(round(known["reference_mib"] * MIB), round(known["input_mib"] * MIB), known["peak_op"])
    else:
        ref = reference_activation_peak(model_spec, spec, device=device, autocast=ac)
    g = dippm_nas.capture(model_spec, spec)
    version = torch.__version__  # the tracker's: the SDPA math path holds what this version's holds
    after = activation_liveness(g, retention=True, include_inputs=False, autocast=ac,
                                torch_version=version).peak_allocated_bytes
    structural = activation_liveness(without_provenance(g), retention=True, include_inputs=False,
                                     autocast=ac, torch_version=version).peak_allocated_bytes
    if before is not None:
        try:
            prev = before(g, retention=True, include_inputs=False, autocast=ac).peak_allocated_bytes
        except TypeError:  # a version without autocast: its float32 figure
            prev = before(g, retention=True, include_inputs=False).peak_allocated_bytes
    else:
        prev = math.nan
    row = {"source": source, "name": name, "family": family(source, name), "batch": batch, "mode": mode,
           "device": device, "reference_mib": ref.peak_block_bytes / MIB, "after_mib": after / MIB,
           "before_mib": prev / MIB, "provenance": g.has_provenance, "structural_mib": structural / MIB,
           "weights_mib": g.param_bytes / MIB, "input_mib": ref.input_bytes / MIB, "peak_op": ref.peak_op,
           "torch_version": version, "seconds": time.perf_counter() - t0}
    if mig:
        row.update(_mig_check(g, mig, ref, ac))
    return row


def without_provenance(graph: Any) -> Any:
    """``graph`` without its nodes' provenance (``module_stack``, ``inplace``): what the structural rules alone
    price, as for a format-1 graph or an assembled candidate."""
    from dippm_nas.graph import OperatorGraph

    d = graph.to_dict()
    for nd in d["nodes"]:
        nd.pop("ms", None)
        nd.pop("ip", None)
    return OperatorGraph.from_dict(d)


def _mig_check(graph: Any, device_id: str, ref: Any, ac: str | None) -> dict[str, Any]:
    from dippm_nas.devices import get_device
    from dippm_nas.mig import advise, mig_fit_violations
    from dippm_nas.prior import predict

    dev = get_device(device_id)
    p = predict(graph, device_id, mig=False, autocast=ac)
    need = ref.peak_block_bytes / MIB + graph.param_bytes / MIB + ref.input_bytes / MIB + dev.runtime_baseline_mib
    adv = advise(p, device_id)
    return {"mig_needed_mib": need, "mig_predicted_mib": p.memory_mib, "mig_smallest_fit": adv.smallest_fit,
            "mig_violations": mig_fit_violations(adv, need)}


def search_space_rows(dataset: Path, per_family: int, seed: int, before: Any,
                      whole: bool = False) -> list[dict[str, Any]]:
    """float32 rows of ``per_family`` distinct graphs of each search-space family of a dataset export with
    graphs, rebuilt from their configs (their own batch sizes); ``whole``: "after" prices the model captured
    whole (its graph carries provenance) instead of the stored graph (none, as an assembled candidate's)."""
    import random

    import search_spaces as ss

    import dippm_nas
    from dippm_nas.dataset import iter_jsonl
    from dippm_nas.graph import OperatorGraph

    graphs: dict[str, Any] = {}
    rows = []
    for r in iter_jsonl(dataset):
        if r["type"] == "graph":
            graphs[r["structural_hash"]] = r["graph"]
        elif r["type"] == "measurement" and r.get("graph_hash"):
            rows.append(r)
    random.Random(seed).shuffle(rows)
    out: list[dict[str, Any]] = []
    count: dict[str, int] = {}
    seen: set[str] = set()
    for r in rows:
        sp, h = r["space"], r["graph_hash"]
        if count.get(sp, 0) >= per_family or h in seen or h not in graphs:
            continue
        g = OperatorGraph.from_dict(graphs[h])
        try:
            model = ss.build_model(sp, r["config"])
            ref = reference_activation_peak(model, g.spec)
            priced = dippm_nas.capture(model, g.spec) if whole else g
        except Exception as e:  # noqa: BLE001 - a benchmark reports what it skipped and goes on
            print(f"  skipped {sp} {r['config']}: {type(e).__name__}: {e}")
            continue
        seen.add(h)
        count[sp] = count.get(sp, 0) + 1
        after = activation_liveness(priced, retention=True, include_inputs=False).peak_allocated_bytes
        prev = before(g, retention=True, include_inputs=False).peak_allocated_bytes if before else math.nan
        structural = activation_liveness(without_provenance(priced), retention=True,
                                         include_inputs=False).peak_allocated_bytes
        out.append({"source": "space", "name": f"{sp}#{count[sp]}", "family": f"space:{sp}",
                    "batch": g.spec.batch_size, "mode": "fp32", "device": "cpu",
                    "reference_mib": ref.peak_block_bytes / MIB, "after_mib": after / MIB, "before_mib": prev / MIB,
                    "provenance": priced.has_provenance, "structural_mib": structural / MIB,
                    "weights_mib": g.param_bytes / MIB, "input_mib": ref.input_bytes / MIB, "peak_op": ref.peak_op})
    return out


# ------------------------------------------------------------------ the table
def _stats(rs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    errs = [(r[key] - r["reference_mib"]) / r["reference_mib"] for r in rs]
    if not errs or any(math.isnan(e) for e in errs):
        return math.nan, math.nan, math.nan
    return 100 * sum(map(abs, errs)) / len(errs), 100 * sum(errs) / len(errs), 100 * min(errs)


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Print the per-family table (before -> after) and the totals; return them."""
    out: dict[str, Any] = {"machine": machine(), "groups": {}}
    print(f"\n{'family':<24}{'prec':>5}{'n':>4}{'MAPE % before -> after':>25}{'bias % b -> a':>16}"
          f"{'min % b -> a':>16}{'>3% low':>9}   worst (after)")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["family"], r["mode"]), []).append(r)
    for (fam, mode), rs in sorted(groups.items()):
        mb, bb, lb = _stats(rs, "before_mib")
        ma, ba, la = _stats(rs, "after_mib")
        worst = max(rs, key=lambda r: abs(r["after_mib"] / r["reference_mib"] - 1))
        low = sum(r["after_mib"] < (1 + LOW_LIMIT) * r["reference_mib"] for r in rs)
        print(f"{fam:<24}{mode:>5}{len(rs):>4}{mb:>12.1f} -> {ma:>7.1f}{bb:>+8.1f} -> {ba:>+5.1f}{lb:>+8.1f} -> "
              f"{la:>+5.1f}{low:>9}   {worst['name']} bs{worst['batch']} ({worst['after_mib']:.1f} vs "
              f"{worst['reference_mib']:.1f} MiB)")
        out["groups"][f"{fam}|{mode}"] = {"n": len(rs), "mape_before_pct": mb, "mape_after_pct": ma,
                                          "bias_before_pct": bb, "bias_after_pct": ba, "min_before_pct": lb,
                                          "min_after_pct": la, "more_than_3pct_low": low}
    for mode in sorted({r["mode"] for r in rows}) + ["all"]:
        rs = [r for r in rows if mode in ("all", r["mode"])]
        errs = [r["after_mib"] / r["reference_mib"] - 1 for r in rs]
        within = sum(abs(e) <= 0.03 for e in errs)
        low = sum(e < LOW_LIMIT for e in errs)
        rms = math.sqrt(sum(e * e for e in errs) / len(errs))
        mb, _, _ = _stats(rs, "before_mib")
        ma, _, _ = _stats(rs, "after_mib")
        print(f"{mode:>5}: {len(rs)} rows, MAPE {mb:.1f} % -> {ma:.1f} %, within 3 %: {within}/{len(rs)}, more than "
              f"3 % low: {low}, RMS relative error (sigma of the activation part) {rms:.3f}")
        out[mode] = {"n": len(rs), "mape_before_pct": mb, "mape_after_pct": ma, "within_3pct": within,
                     "more_than_3pct_low": low, "rms_rel_err": rms}
    mig = [r for r in rows if "mig_violations" in r]
    if mig:
        bad = [f"{r['name']} bs{r['batch']} {r['mode']}: {r['mig_violations']}" for r in mig if r["mig_violations"]]
        print(f"MIG advice: {len(mig)} rows checked, {len(bad)} recommend a slice below reference + weights + input + "
              f"context" + "".join(f"\n  {b}" for b in bad))
        out["mig"] = {"n": len(mig), "violations": bad}
    return out


def _rms(errs: list[float]) -> float:
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else math.nan


def sigma_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Print and return the relative σ of the activation part, the RMS relative error of the liveness against the
    reference: with provenance ("after" of the rows whose priced graph carries it), per precision, and the larger
    of the two (``ACTIVATION_REL_SIGMA_PROVENANCE``); without provenance (``structural_mib``: the same graphs
    stripped of it, and the search-space rows' stored graphs, which carry none), float32 zoo and search-space rows
    together (``ACTIVATION_REL_SIGMA``), and the autocast rows apart."""
    out: dict[str, Any] = {"with_provenance": {}, "without_provenance": {}}
    for mode in ("fp32", "fp16"):
        errs = [r["after_mib"] / r["reference_mib"] - 1 for r in rows if r["mode"] == mode and r.get("provenance")]
        out["with_provenance"][mode] = {"n": len(errs), "rms_rel_err": _rms(errs)}
        for part, keep in (("zoo", lambda r: r["source"] != "space"), ("space", lambda r: r["source"] == "space"),
                           ("all", lambda r: True)):
            errs = [r["structural_mib"] / r["reference_mib"] - 1 for r in rows
                    if r["mode"] == mode and "structural_mib" in r and keep(r)]
            out["without_provenance"][f"{mode}_{part}"] = {"n": len(errs), "rms_rel_err": _rms(errs)}
    wp, np_ = out["with_provenance"], out["without_provenance"]
    out["with_provenance_sigma"] = max(wp["fp32"]["rms_rel_err"], wp["fp16"]["rms_rel_err"])
    out["without_provenance_sigma"] = np_["fp32_all"]["rms_rel_err"]
    print("sigma of the activation part (RMS relative error against the reference):")
    print(f"  with provenance: fp32 {wp['fp32']['rms_rel_err']:.3f} ({wp['fp32']['n']} rows), fp16 autocast "
          f"{wp['fp16']['rms_rel_err']:.3f} ({wp['fp16']['n']} rows); the larger, ACTIVATION_REL_SIGMA_PROVENANCE: "
          f"{out['with_provenance_sigma']:.3f}")
    print("  without provenance (structural rules): " + ", ".join(
        f"{k} {v['rms_rel_err']:.3f} ({v['n']} rows)" for k, v in np_.items()
        if v["n"] and not (k.endswith("_all") and v["n"] == np_[k.replace("_all", "_zoo")]["n"]))
        + f"; fp32 all, ACTIVATION_REL_SIGMA: {out['without_provenance_sigma']:.3f}")
    return out


def _read_rows(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=None, help="an export with graphs of search-space models")
    ap.add_argument("--per-family", type=int, default=8, help="distinct graphs per search-space family")
    ap.add_argument("--whole-capture", action="store_true",
                    help="price each search-space model captured whole (with provenance), not its stored graph")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torchvision", default="", help="comma-separated names, or 'default' (30 models)")
    ap.add_argument("--timm", default="", help="comma-separated names, or 'default' (20 models)")
    ap.add_argument("--transformers", default="", help="comma-separated builders, or 'default' (5 models)")
    ap.add_argument("--batches", default="8,32", help="batch sizes of the image models")
    ap.add_argument("--token-batches", default="2,8", help="batch sizes of the transformers")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence of the transformers")
    ap.add_argument("--modes", default="fp32,fp16", help="fp32 and/or fp16 (autocast)")
    ap.add_argument("--before-module", type=Path, default=None, help="another version's prior/_memory.py")
    ap.add_argument("--mig", default=None, help="check the MIG advice on this device id, e.g. a100-sxm4-40gb")
    ap.add_argument("--rows", type=Path, default=None, help="JSON lines of the rows (read back on a rerun)")
    ap.add_argument("--sigma", action="store_true",
                    help="print the activation part's sigma with and without provenance (rows need structural_mib)")
    ap.add_argument("--json", type=Path, default=None, help="write the table's figures here")
    ap.add_argument("--reference-rows", type=Path, default=None,
                    help="JSON lines of an earlier run (--rows): take their reference figures instead of tracking "
                         "those passes again; before and after are recomputed")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    before = _before_fn(args.before_module)
    rows = _read_rows(args.rows)
    done = {(r["source"], r["name"], r["batch"], r["mode"]) for r in rows}
    known = {(r["source"], r["name"], r["batch"], r["mode"]): r for r in _read_rows(args.reference_rows)}
    lists = {"torchvision": DEFAULT_TORCHVISION if args.torchvision == "default" else args.torchvision,
             "timm": DEFAULT_TIMM if args.timm == "default" else args.timm,
             "transformers": DEFAULT_TRANSFORMERS if args.transformers == "default" else args.transformers}
    for source, names in lists.items():
        batches = args.token_batches if source == "transformers" else args.batches
        for name in [n for n in names.split(",") if n]:
            for batch in (int(b) for b in batches.split(",")):
                for mode in args.modes.split(","):
                    if (source, name, batch, mode) in done:
                        continue
                    try:
                        row = one_row(source, name, batch, args.seq, mode, before, args.mig,
                                      known.get((source, name, batch, mode)))
                    except Exception as e:  # noqa: BLE001 - a benchmark reports what it skipped and goes on
                        print(f"  skipped {source}:{name} bs{batch} {mode}: {type(e).__name__}: {str(e)[:200]}")
                        continue
                    rows.append(row)
                    print(f"  {source}:{name} bs{batch} {mode}: reference {row['reference_mib']:.1f} MiB, before "
                          f"{row['before_mib']:.1f}, after {row['after_mib']:.1f} ({row['seconds']:.0f} s)", flush=True)
                    if args.rows is not None:
                        with args.rows.open("a") as f:
                            f.write(json.dumps(row) + "\n")
    if args.dataset is not None and not any(r["source"] == "space" for r in rows):
        space = search_space_rows(args.dataset, args.per_family, args.seed, before, args.whole_capture)
        rows += space
        if args.rows is not None:
            with args.rows.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in space)
    if not rows:
        ap.error("nothing to compare: give --dataset / --torchvision / --timm / --transformers")
    summary = report(rows)
    if args.sigma:
        summary["sigma"] = sigma_figures(rows)
    if args.json is not None:
        write_output(args.json, json.dumps(summary, indent=1), "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
