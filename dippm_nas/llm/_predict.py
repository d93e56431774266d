"""``predict_generation``: a decoder, a workload and a device in, a :class:`GenerationPrediction` out."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from dippm_nas._logging import WarnOnce
from dippm_nas.deployment import DEPLOYMENT_RUNTIMES, Deployment
from dippm_nas.devices import Device, HostProfile, default_host_profile, resolve_device
from dippm_nas.errors import DeploymentError, InvalidValueError, UnsupportedDtypeError
from dippm_nas.llm._architectures import decoder_config
from dippm_nas.llm._config import WEIGHT_DTYPES, DecoderConfig
from dippm_nas.llm._engine_store import adapted_engine
from dippm_nas.llm._engines import ENGINES, ServingEngine, serving_engine
from dippm_nas.llm._parallel import allreduce_ms, resolve_tensor_parallel, shard_config
from dippm_nas.llm._prediction import GENERATION_FIGURES, GenerationPrediction, GenerationSlice
from dippm_nas.llm._timing import DeviceRun, GenerationExecution, run_on_device
from dippm_nas.llm._workload import LLMWorkload
from dippm_nas.prior import power_params_for
from dippm_nas.units import BYTES_PER_MIB, MS_PER_S

__all__ = ["predict_generation", "DEFAULT_DEVICE", "resolve_execution"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger, python_warning=True)

#: The device :func:`predict_generation` answers for when none is named.
DEFAULT_DEVICE = "a100-sxm4-40gb"


def _engine_of(deployment: Deployment | None, engine: str | None) -> str:
    """The engine a serving deployment names (``engine``, else a key of ``deployment.versions``, else vLLM)."""
    if engine is not None:
        if engine not in ENGINES:
            raise InvalidValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        return engine
    named = [e for e in ENGINES if deployment is not None and deployment.versions and
             (e in deployment.versions or e.replace("-", "_") in deployment.versions)]
    if len(named) > 1:
        raise DeploymentError(f"Deployment.versions names {named}: a serving deployment runs one engine")
    return named[0] if named else "vllm"


def resolve_execution(deployment: Deployment | Any = None, *, runtime: str | None = None,
                      engine: str | ServingEngine | None = None, host: HostProfile | str | None = None,
                      kv_block_size: int | None = None,
                      kv_dtype: str = "float16") -> tuple[GenerationExecution, Deployment, tuple[str, ...]]:
    """The :class:`~dippm_nas.llm._timing.GenerationExecution` of a generation, the deployment it resolves, and
    what had to be assumed.

    ``deployment`` is what :meth:`dippm_nas.Deployment.coerce` takes (a ``Deployment``, a mapping of its fields, a
    JSON/TOML file, ``None``), with ``runtime=`` and ``host=`` folded in; ``runtime="serving"`` takes its engine
    from ``engine`` (a name, or a :class:`ServingEngine` with your own constants) or from ``deployment.versions`` (a
    ``"vllm"`` or ``"tensorrt-llm"`` key); without either it is vLLM, and ``"engine"`` is among the assumptions.

    Raises:
        DeploymentError: a deployment that cannot be read, or ``runtime`` / ``host`` keywords that conflict with it.
        ExecutionRuntimeError / InvalidValueError: an unknown runtime or engine, a block size that is not an int
            >= 1 or given without a serving engine.
    """
    ex, dep, assumed, _ = _execution_of(deployment, runtime=runtime, engine=engine, host=host,
                                        kv_block_size=kv_block_size, kv_dtype=kv_dtype)
    return ex, dep, assumed


def _execution_of(deployment: Any, *, runtime: str | None, engine: str | ServingEngine | None,
                  host: HostProfile | str | None, kv_block_size: int | None,
                  kv_dtype: str) -> tuple[GenerationExecution, Deployment, tuple[str, ...], str]:
    """:func:`resolve_execution` and the label of the resolved deployment: the deployment is coerced and resolved
    once here (:attr:`~dippm_nas.deployment.ResolvedDeployment.label` read off the same resolution)."""
    dep = Deployment.coerce(deployment, runtime=runtime, host=host, runtimes=DEPLOYMENT_RUNTIMES)
    res = dep.resolve()
    assumed = [a for a in res.assumed if a in ("host", "framework")]
    prof = res.host
    if prof is None:
        prof = default_host_profile()
        if res.framework is not None and prof.framework != res.framework:
            prof = dataclasses.replace(prof, framework=res.framework)
    eng = None
    if res.runtime == "serving" and isinstance(engine, ServingEngine):
        eng = engine
    elif res.runtime == "serving":
        name = _engine_of(dep, engine)
        if engine is None and not any(k in (dep.versions or {}) for k in ("vllm", "tensorrt-llm", "tensorrt_llm")):
            assumed.append("engine")
        eng = serving_engine(name)
    elif engine is not None:
        raise InvalidValueError(f"engine={engine!r} needs runtime='serving', got runtime={res.runtime!r}")
    if kv_block_size is not None:
        if isinstance(kv_block_size, bool) or not isinstance(kv_block_size, int) or kv_block_size < 1:
            raise InvalidValueError(f"kv_block_size must be an int >= 1 (tokens per KV block), got {kv_block_size!r}")
        if eng is None:
            raise InvalidValueError(f"kv_block_size is a property of a paged KV cache: it needs runtime='serving', "
                                    f"got runtime={res.runtime!r}")
    ex = GenerationExecution(runtime=res.runtime, engine=eng, host=prof, block_size=kv_block_size,
                             kv_dtype=kv_dtype)
    return ex, dep, tuple(assumed), res.label


def _check_kv_dtype(kv_dtype: str, cfg: DecoderConfig, dev: Device, runtime: str) -> None:
    if kv_dtype.startswith("float8") and dev.fp8_tensor_tflops is None:
        raise UnsupportedDtypeError(f"LLMWorkload.kv_dtype={kv_dtype!r} needs FP8 support, which {dev.id!r} lacks "
                                    "(no FP8 tensor cores before Ada and Hopper); choose float16 or bfloat16")
    if kv_dtype == "bfloat16" and dev.bf16_tensor_tflops is None:
        raise UnsupportedDtypeError(f"LLMWorkload.kv_dtype='bfloat16' needs bfloat16 support, which {dev.id!r} lacks; "
                                    "choose float16")
    if runtime != "serving" and kv_dtype != cfg.dtype:
        raise InvalidValueError(f"LLMWorkload.kv_dtype={kv_dtype!r} differs from the weights' {cfg.dtype!r}: "
                                "transformers keeps its cache in the model's dtype; a quantised KV cache needs "
                                "runtime='serving'")


def _check_positions(cfg: DecoderConfig, wl: LLMWorkload) -> bool:
    """``True`` when the sequence goes beyond the positions (allowed only with RoPE scaling, with a warning)."""
    if cfg.max_positions is None or wl.total_len <= cfg.max_positions:
        return False
    if cfg.rope_scaling:
        _warn_once(f"positions:{cfg.name}", "prompt_len + output_len = %d exceeds max_positions = %d of %s; allowed "
                   "because its config scales RoPE (quality beyond the trained length is not modelled)",
                   wl.total_len, cfg.max_positions, cfg.name)
        return True
    raise InvalidValueError(f"LLMWorkload.prompt_len + output_len = {wl.prompt_len} + {wl.output_len} = {wl.total_len} "
                            f"exceeds the positions of {cfg.name!r} (max_positions = {cfg.max_positions}) and its "
                            "config does not scale RoPE")


def _check_sequence_fits(cfg: DecoderConfig, wl: LLMWorkload, kv_dtype: str, dev: Device) -> None:
    """One sequence's KV cache (``total_len`` tokens x the bytes one token leaves) fits the device's memory:
    beyond it not one sequence can be generated there, whatever the batch, and no latency exists to predict.
    This bounds the length of a model without a position limit (ALiBi) or with scaled RoPE."""
    per_token = cfg.kv_bytes_per_token(kv_dtype)
    memory = float(dev.memory_mib) * BYTES_PER_MIB
    if wl.total_len * per_token > memory:
        raise InvalidValueError(
            f"LLMWorkload.prompt_len + output_len = {wl.total_len:,} tokens: one sequence's KV cache alone takes "
            f"{wl.total_len * per_token / 2**30:,.4g} GiB ({per_token:,} bytes per token of {cfg.name!r} in "
            f"{kv_dtype}), more than the {memory / 2**30:,.4g} GiB of {dev.id!r}; at most "
            f"{int(memory // per_token):,} tokens per sequence fit there")


def _power_share(dev: Device, slice_dev: Device, compute_slices: int) -> Device:
    """A MIG slice with its share of the GPU's compute slices (``compute_slices / 7``; on an A30, of 4) of the
    board's idle and maximum power (an attribution: NVML measures only the whole GPU)."""
    if not dev.has_power:
        return slice_dev
    s = compute_slices / max(p.compute_slices for p in dev.mig_profiles)
    return dataclasses.replace(slice_dev, board_power_w=float(dev.board_power_w) * s,  # type: ignore[arg-type]
                               idle_power_w=float(dev.idle_power_w) * s)  # type: ignore[arg-type]


def _figures(run: DeviceRun, wl: LLMWorkload, gpus: int = 1) -> dict[str, Any]:
    """The time, throughput and energy figures of one device run (``gpus`` GPUs running it, each its shard),
    with their σ."""
    e2e_s = run.e2e_ms / MS_PER_S
    tps = wl.tokens / e2e_s if e2e_s > 0 else 0.0
    otps = wl.batch_size * wl.output_len / e2e_s if e2e_s > 0 else 0.0
    rel = (run.e2e_std_ms / run.e2e_ms) if run.e2e_std_ms is not None and run.e2e_ms > 0 else None
    ejt = gpus * run.energy_j / (wl.batch_size * wl.output_len) if run.energy_j is not None else None

    def sd(v: float, s: float | None) -> float | None:
        return None if s is None else v * s

    per_seq = run.capacity.per_sequence_mib
    return {
        "prefill_ms": run.prefill, "prefill_ms_std": sd(run.prefill, run.prefill_sigma_log),
        "decode_ms_per_token": run.decode_mean, "decode_ms_per_token_std": sd(run.decode_mean, run.decode_sigma_log),
        "decode_ms_last": run.decode_last, "decode_ms_last_std": sd(run.decode_last, run.decode_sigma_log),
        "e2e_ms": run.e2e_ms, "e2e_ms_std": run.e2e_std_ms,
        "tokens_per_s": tps, "tokens_per_s_std": sd(tps, rel),
        "output_tokens_per_s": otps, "output_tokens_per_s_std": sd(otps, rel),
        "energy_j_per_token": ejt, "energy_j_per_token_std": sd(ejt, run.energy_rel) if ejt is not None else None,
        "peak_memory_mib": run.peak_memory_mib, "peak_memory_mib_std": run.peak_memory_std_mib,
        "max_batch": run.capacity.max_batch,
        "max_batch_std": (run.peak_memory_std_mib / per_seq) if run.peak_memory_std_mib is not None and per_seq > 0
        else None,
        "fits": wl.batch_size <= run.capacity.max_batch,
    }


def _reason(run: DeviceRun, wl: LLMWorkload, where: str, engine: str | None) -> str:
    cap = run.capacity
    if cap.max_batch == 0:
        return f"nothing fits on {where}: {cap.reason}"
    if wl.batch_size > cap.max_batch:
        if engine is not None:
            return (f"{wl.batch_size} sequences exceed the {cap.max_batch} the KV cache of {engine} holds on {where}: "
                    f"the batch runs in {len(run.waves)} waves")
        return f"{wl.batch_size} sequences exceed the {cap.max_batch} that fit on {where}"
    return ""


def _model_and_device(model_or_config: Any, workload: Any, device: str | Device,
                      dtype: str | None) -> tuple[DecoderConfig, Device]:
    """The decoder (in ``dtype`` when given) and the GPU, checked against each other."""
    if dtype is not None and (not isinstance(dtype, str) or dtype not in WEIGHT_DTYPES):
        raise InvalidValueError(f"dtype must be one of {WEIGHT_DTYPES} or None (the config's), got {dtype!r}")
    cfg = decoder_config(model_or_config, dtype=dtype)
    if not isinstance(workload, LLMWorkload):
        raise InvalidValueError(f"workload must be an LLMWorkload(prompt_len, output_len, batch_size), got "
                                f"{type(workload).__name__}")
    dev = resolve_device(device)
    if dev.kind != "gpu":
        raise InvalidValueError(f"predict_generation models GPUs; {dev.id!r} is a {dev.kind}")
    if cfg.dtype not in dev.dtypes or (cfg.dtype == "bfloat16" and dev.bf16_tensor_tflops is None):
        raise UnsupportedDtypeError(f"the weights' dtype {cfg.dtype!r} of {cfg.name!r} is not supported by {dev.id!r}; "
                                    f"choose dtype= among {[d for d in dev.dtypes if d in WEIGHT_DTYPES]}")
    return cfg, dev


def predict_generation(model_or_config: Any, workload: LLMWorkload, device: str | Device = DEFAULT_DEVICE, *,
                       deployment: Deployment | Any = None, mig: bool = True, runtime: str | None = None,
                       engine: str | ServingEngine | None = None, kv_block_size: int | None = None,
                       dtype: str | None = None, host: HostProfile | str | None = None,
                       tensor_parallel: int = 1, interconnect: str | None = None) -> GenerationPrediction:
    """Predicted prefill and decode latency, throughput, energy per token, memory and the largest batch of
    generating ``workload`` with a decoder on ``device`` (and on each of its MIG profiles).

    Args:
        model_or_config: a ``transformers`` config or decoder model (Llama, Mistral, Mixtral, Qwen2, Gemma,
            Phi-3, GPT-2, GPT-J, OPT, BLOOM, GPT-NeoX, ...: :data:`~dippm_nas.llm.MODEL_TYPES`), its
            ``config.json`` (path or dict), a name of :data:`~dippm_nas.llm.ARCHITECTURES`, or a
            :class:`~dippm_nas.llm.DecoderConfig`. Only the architecture is read: no weights, no download.
        workload: prompt and output lengths, batch size and KV-cache dtype.
        device: catalogue id (``dippm-nas devices``) or a :class:`~dippm_nas.devices.Device`; default
            ``"a100-sxm4-40gb"``.
        deployment: how the generation runs: ``Deployment(runtime="eager")`` (``transformers`` in PyTorch eager,
            ``DynamicCache``; the default), ``"cuda-graphs"`` (a ``StaticCache`` decode step replayed from a CUDA
            graph), ``"compiled"`` (``torch.compile`` of the static-cache model) or ``"serving"`` (a vLLM /
            TensorRT-LLM class engine; its ``versions`` may name ``"vllm"`` or ``"tensorrt-llm"``), and the host; a
            mapping of its fields or a JSON/TOML deployment file too (:meth:`dippm_nas.Deployment.coerce`).
        mig: add the figures on one instance of each MIG profile (``mig`` of the result).
        runtime: shorthand for ``Deployment(runtime=...)`` (same names).
        engine: ``"vllm"`` or ``"tensorrt-llm"`` for ``runtime="serving"`` (default: the deployment's, else vLLM), or
            a :class:`~dippm_nas.llm.ServingEngine` with your own constants.
        kv_block_size: tokens per KV block of a serving engine (default the engine's: vLLM 16, TensorRT-LLM 64).
        dtype: the weights' dtype, overriding the config's (``"float16"``, ``"bfloat16"``, ``"float32"``).
        host: shorthand for ``Deployment(host=...)``: a host profile, its file, or ``"default"``.
        tensor_parallel: GPUs of one node the serving engine shards the model over (heads, KV heads, MLP and
            vocabulary; two all-reduces per layer on the node's link). ``peak_memory_mib``, ``max_batch`` and the
            memory parts are then one GPU's; times, tokens/s and J/token the node's. No MIG figures with more
            than one GPU.
        interconnect: the link the all-reduces take, ``"nvlink"`` or ``"pcie"`` (default: NVLink when the board
            has it for that many GPUs, else PCIe).

    Returns:
        A :class:`GenerationPrediction`; a batch that does not fit is ``fits=False`` with a ``reason``
        (``max_batch = 0`` when not one sequence fits), never an exception.

    Raises:
        InvalidValueError: a config that is not a decoder-only causal LM, a sequence longer than the model's
            positions without RoPE scaling, a sequence whose KV cache alone exceeds the device's memory, a batch
            that would run in more than :data:`~dippm_nas.llm._timing.MAX_WAVES` waves, a quantised KV cache outside a serving engine, an unknown runtime,
            engine or dtype (the choices are listed).
        UnsupportedDtypeError: a weights or KV-cache dtype the device lacks.
        DeviceError: an unknown device; more GPUs than its node holds, an interconnect the board lacks.
        InvalidValueError: ``tensor_parallel`` that does not divide the heads (or the KV heads as the engines need),
            or more than one GPU outside ``runtime="serving"``.
    """
    cfg, dev = _model_and_device(model_or_config, workload, device, dtype)
    kv_dtype = workload.kv_dtype or cfg.dtype
    ex, dep, assumed, label = _execution_of(deployment, runtime=runtime, engine=engine, host=host,
                                            kv_block_size=kv_block_size, kv_dtype=kv_dtype)
    ex, adapted = _adapted(ex, dep, dev, engine)
    tp = resolve_tensor_parallel(cfg, dev, tensor_parallel, interconnect, ex.runtime)
    ex = dataclasses.replace(ex, tp=tp, identical_sequences=workload.identical_sequences)
    _check_kv_dtype(kv_dtype, cfg, dev, ex.runtime)
    beyond = _check_positions(cfg, workload)
    _check_sequence_fits(cfg, workload, kv_dtype, dev)
    wl = workload
    shard = shard_config(cfg, tp.size)
    run = run_on_device(shard, dev, ex, wl.prompt_len, wl.output_len, wl.batch_size)
    figs = _figures(run, wl, tp.size)
    eng_name = ex.engine.name if ex.engine is not None else None
    sources = _sources(ex, dev, figs)
    kv_seq = cfg.kv_bytes_per_token(kv_dtype) * wl.total_len / BYTES_PER_MIB
    details = _details(cfg, shard, ex, label, assumed, run, wl, kv_dtype, beyond, adapted)
    slices = _mig_slices(cfg, dev, ex, wl, (run.prefill_sigma_log, run.decode_sigma_log)) \
        if mig and dev.has_mig and tp.size == 1 else None
    return GenerationPrediction(
        model=cfg.name, device=dev.id, workload=wl,
        weights_mib=cfg.weight_bytes / BYTES_PER_MIB, weights_mib_std=0.0,
        kv_cache_mib=kv_seq * wl.batch_size, kv_cache_mib_std=0.0,
        kv_cache_mib_per_sequence=kv_seq, kv_cache_mib_per_sequence_std=0.0,
        reason=_reason(run, wl, dev.id if tp.size == 1 else f"each of {tp.size} {dev.id} GPUs", eng_name),
        sources=sources, mig=slices, details=details, **figs,
    )


def _details(cfg: DecoderConfig, shard: DecoderConfig, ex: GenerationExecution, deployment_label: str,
             assumed: Sequence[str], run: DeviceRun, wl: LLMWorkload, kv_dtype: str, beyond: bool,
             adapted: str | None) -> dict[str, Any]:
    """The ``details`` of a generation prediction: what ran (runtime, engine, deployment, host, dtypes), what was
    assumed, the waves, the memory parts, the engine's and the tensor-parallel figures, the engine adaptation."""
    return {
        "runtime": ex.runtime, "engine": ex.engine.name if ex.engine is not None else None,
        "waves": list(run.waves), "assumed": list(assumed),
        "deployment": deployment_label, "kv_dtype": kv_dtype, "dtype": cfg.dtype, "host_profile": ex.host.name,
        "params": cfg.param_count, "kv_bytes_per_token": cfg.kv_bytes_per_token(kv_dtype),
        "beyond_positions": beyond, **run.memory, **_engine_details(ex, run, wl),
        **_tp_details(shard, ex, wl, kv_dtype), "engine_adaptation": adapted,
    }


def _sources(ex: GenerationExecution, dev: Device, figs: dict[str, Any]) -> dict[str, str]:
    """The source of each figure: latencies ``"predicted"`` by a fitted serving engine, else ``"analytic"``; energy
    ``"predicted"`` with the device's fitted power constants, ``"unavailable"`` without a figure; the rest analytic."""
    latency_src = "predicted" if ex.engine is not None and ex.engine.fitted else "analytic"
    energy_src = "unavailable" if figs["energy_j_per_token"] is None else (
        "predicted" if power_params_for(dev).fitted else "analytic")
    sources = {name: "analytic" for name in GENERATION_FIGURES}
    for name in ("prefill_ms", "decode_ms_per_token", "decode_ms_last", "e2e_ms", "tokens_per_s",
                 "output_tokens_per_s"):
        sources[name] = latency_src
    sources["energy_j_per_token"] = energy_src
    return sources


def _adapted(ex: GenerationExecution, dep: Deployment, dev: Device,
             engine: Any) -> tuple[GenerationExecution, str | None]:
    """The engine adapted on measured runs of this device and of the engine version the deployment names
    (:func:`~dippm_nas.llm.adapt_engine`), when one is stored and no :class:`ServingEngine` was passed."""
    if ex.engine is None or isinstance(engine, ServingEngine) or not dep.versions:
        return ex, None
    name = ex.engine.name
    version = dep.versions.get(name) or dep.versions.get(name.replace("-", "_"))
    if not version:
        return ex, None
    eng = adapted_engine(dev.id, name, str(version))
    if eng is None:
        return ex, None
    eng = dataclasses.replace(eng, frontend=ex.engine.frontend)
    return dataclasses.replace(ex, engine=eng), f"{dev.id}, {name} {version}"


def _tp_details(shard: DecoderConfig, ex: GenerationExecution, wl: LLMWorkload, kv_dtype: str) -> dict[str, Any]:
    """Tensor parallelism: GPUs, link, one GPU's weights and KV cache, the all-reduce time of a decode step."""
    tp = ex.tp
    out: dict[str, Any] = {"tensor_parallel": tp.size, "interconnect": tp.interconnect}
    if tp.size == 1 or ex.engine is None:
        return out
    comm, custom = allreduce_ms(shard, wl.batch_size, tp, ex.engine)
    out.update(link_gbps=tp.link_gbps, weights_mib_per_gpu=shard.weight_bytes / BYTES_PER_MIB,
               kv_cache_mib_per_gpu=shard.kv_bytes_per_token(kv_dtype) * wl.total_len * wl.batch_size / BYTES_PER_MIB,
               allreduce_ms_per_decode_step=comm, allreduce="custom" if custom else "nccl",
               per_gpu="peak_memory_mib, max_batch and memory parts are one GPU's; times, tokens/s and J/token the node's")
    return out


def _engine_details(ex: GenerationExecution, run: Any, wl: LLMWorkload) -> dict[str, Any]:
    """A serving engine's KV blocks (size, count, MiB allocated) and its constants' source; none without one."""
    if ex.engine is None:
        return {}
    return {"kv_block_size": ex.block_size or ex.engine.block_size, "kv_blocks": run.capacity.blocks,
            "kv_cache_mib_allocated": wl.batch_size * run.capacity.per_sequence_mib,
            "engine_source": ex.engine.source}


def _mig_slices(cfg: DecoderConfig, dev: Device, ex: GenerationExecution, wl: LLMWorkload,
                sigmas: tuple[float | None, float | None]) -> dict[str, GenerationSlice]:
    """One :class:`GenerationSlice` per MIG profile (profiles with the same compute and memory share one run)."""
    out: dict[str, GenerationSlice] = {}
    runs: dict[tuple[int, int, int], DeviceRun] = {}
    for p in dev.mig_profiles:
        key = (dev.profile_sms(p), p.memory_slices, int(p.usable_memory_mib))
        run = runs.get(key)
        if run is None:
            sl = _power_share(dev, dev.mig_slice(p), p.compute_slices)
            run = runs[key] = run_on_device(cfg, sl, ex, wl.prompt_len, wl.output_len, wl.batch_size,
                                                    sigmas=sigmas)
        f = _figures(run, wl)
        f.pop("decode_ms_last_std")
        out[p.name] = GenerationSlice(profile=p.name, instances_per_gpu=p.max_instances,
                                      reason=_reason(run, wl, f"one {p.name} instance",
                                                     ex.engine.name if ex.engine else None), **f)
    return out
