"""Measure an LLM-generation trial: time to first token and decode time per output token, on this machine.

A generation trial (a :class:`~dippm_nas.trial.TrialRecord` with a ``generation`` section) names a decoder (an
architecture of :data:`dippm_nas.llm.ARCHITECTURES`, or the trial's ``decoder_config`` user attribute: a
:meth:`~dippm_nas.llm.DecoderConfig.to_dict`) and a workload (``prompt_len``, ``output_len``, ``batch_size``). The
validator enqueues it as a job of the pseudo search space :data:`GENERATION_SPACE` whose JSON config is
:func:`generation_job_config` (versioned by ``generation_job_version``); the worker rebuilds the decoder with
random weights from its config (``transformers.AutoModelForCausalLM.from_config``: nothing is downloaded) and
times it with :func:`measure_generation`:

- ``engine="transformers"``: ``generate(max_new_tokens=1, min_new_tokens=1, do_sample=False)`` is the time to first
  token (prefill); ``generate(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False)`` the whole
  generation; decode ms per token is ``(whole - first) / (output_len - 1)`` per repeat. ``warmup`` untimed pairs
  of calls first, then ``repeats`` timed pairs; the figures are medians over the repeats (standard deviation ddof=1),
  ``torch.cuda.synchronize`` around every timed call on CUDA (the measure package's conventions);
- ``engine="vllm"`` (the default where ``vllm`` is importable and the device is CUDA): the same two timings with
  ``vllm.LLM(load_format="dummy", tensor_parallel_size=...)`` and ``SamplingParams(max_tokens, min_tokens,
  temperature=0, ignore_eos=True)``.

A trial is refused before it is enqueued, with the reason, when its decoder cannot be rebuilt, its weights per
GPU exceed the validation device's memory, or it is split over more GPUs than one process here measures
(:func:`generation_skip_reason`).
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError, MissingDependencyError, ValidationError
from dippm_nas.llm import ARCHITECTURES, DecoderConfig, LLMWorkload, architecture, predict_generation
from dippm_nas.measure import Measurement

__all__ = ["GENERATION_SPACE", "GENERATION_JOB_VERSION", "GENERATION_ENGINES", "GenerationMeasurement",
           "measure_generation", "generation_job_config", "generation_skip_reason", "predicted_generation"]

logger = logging.getLogger(__name__)

#: The job queue's ``space`` of a generation job (not a search space: its config is a generation job config).
GENERATION_SPACE = "llm-generation"
#: Version of the generation job config (``config["generation_job_version"]``).
GENERATION_JOB_VERSION = 1
#: Engines :func:`measure_generation` times with.
GENERATION_ENGINES: tuple[str, ...] = ("transformers", "vllm")
#: The ``transformers`` families rebuilt from a :class:`DecoderConfig` (Llama-style keys).
_LLAMA_LIKE = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class GenerationMeasurement:
    """Measured generation of one workload (units in the field names).

    Attributes:
        model: the decoder's name. engine: ``"transformers"`` or ``"vllm"``. device: the torch device measured.
        prompt_len, output_len, batch_size: the workload.
        ttft_ms, ttft_ms_std: median and standard deviation of the time to first token (prefill), ms.
        decode_ms_per_token, decode_ms_per_token_std: median and standard deviation of the time per output token
            after the first, ms.
        total_ms: median time of the whole generation, ms.
        n_repeats: timed repeats (each a first-token call and a whole generation). warmup: untimed calls.
    """

    model: str
    engine: str
    device: str
    prompt_len: int
    output_len: int
    batch_size: int
    ttft_ms: float
    ttft_ms_std: float | None
    decode_ms_per_token: float
    decode_ms_per_token_std: float | None
    total_ms: float
    n_repeats: int
    warmup: int

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON data."""
        return asdict(self)

    def to_measurement(self, predicted: Mapping[str, Any] | None = None) -> Any:
        """A :class:`~dippm_nas.measure.Measurement` row for the validation results: ``latency_ms`` is the time to
        first token; ``details`` holds the decode figures and, with ``predicted`` (a job's prediction), the
        predicted decode ms per token and its error in percent."""
        details: dict[str, float] = {"ttft_ms": self.ttft_ms, "decode_ms_per_token": self.decode_ms_per_token,
                                     "total_ms": self.total_ms}
        if self.decode_ms_per_token_std is not None:
            details["decode_ms_per_token_std"] = self.decode_ms_per_token_std
        p = predicted_for_engine(predicted or {}, self.engine).get("decode_ms_per_token")
        if isinstance(p, (int, float)) and math.isfinite(p) and self.decode_ms_per_token > 0:
            details["predicted_decode_ms_per_token"] = float(p)
            details["decode_error_pct"] = 100.0 * (float(p) - self.decode_ms_per_token) / self.decode_ms_per_token
        resolved = self.decode_ms_per_token > 0 and self.ttft_ms > 0
        return Measurement(latency_ms=self.ttft_ms if resolved else None,
                           latency_ms_std=self.ttft_ms_std if resolved else None, energy_j=None, memory_mib=None,
                           memory_source=None, n_repeats=self.n_repeats, device=self.device,
                           environment={"generation": self.to_dict()}, latency_ms_median=self.ttft_ms,
                           status="ok" if resolved else "error",
                           reason=None if resolved else (
                               f"the median decode time per token ({self.decode_ms_per_token:.4g} ms) is not above "
                               "the timing noise: whole generations were not slower than first tokens"),
                           stop_reason="max_repeats", details=details, batch_size=self.batch_size,
                           energy_reason="a generation is timed, not metered",
                           memory_reason="a generation is timed, not metered")


def _check_decoder(decoder: Any) -> DecoderConfig:
    if not isinstance(decoder, DecoderConfig):
        raise ValidationError(f"decoder must be a dippm_nas.llm.DecoderConfig, got {type(decoder).__name__}")
    return decoder


def _check_count(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValidationError(f"{name} must be an int >= {low}, got {value!r:.80}")
    return value


def _check_device_name(device: Any) -> str:
    if not isinstance(device, str) or not device:
        raise ValidationError(f"device must be a catalogue id (a non-empty str), got {device!r:.80}")
    return device


def predicted_for_engine(predicted: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """A generation job's prediction for the engine that measured it: ``predicted["by_engine"][engine]`` over the
    job's default figures (the prediction itself when it has no ``by_engine``)."""
    by_engine = predicted.get("by_engine")
    own = by_engine.get(engine) if isinstance(by_engine, Mapping) else None
    return {**predicted, **own} if isinstance(own, Mapping) else dict(predicted)


def transformers_config_of(config: DecoderConfig) -> Any:
    """The ``transformers`` config of a Llama-style :class:`DecoderConfig` (families ``llama``, ``mistral``,
    ``qwen2``), for ``AutoModelForCausalLM.from_config``.

    Raises:
        ValidationError: another family (the families rebuilt are named).
        MissingDependencyError: ``transformers`` is not installed.
    """
    if config.model_type not in _LLAMA_LIKE:
        raise ValidationError(f"a generation is rebuilt for model_type in {list(_LLAMA_LIKE)}, got "
                              f"{config.model_type!r} ({config.name!r})")
    try:
        import transformers
    except ImportError as e:
        raise MissingDependencyError("measuring a generation needs transformers: pip install transformers") from e
    return transformers.AutoConfig.for_model(
        config.model_type, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim, vocab_size=config.vocab_size,
        max_position_embeddings=config.max_positions or 4096, tie_word_embeddings=config.tie_embeddings,
        dtype=config.dtype)


def generation_job_config(decoder: DecoderConfig, workload: Mapping[str, Any], *, tensor_parallel: int = 1,
                          engine: str | None = None) -> dict[str, Any]:
    """The JSON config of a generation job (checked: the workload must make an :class:`~dippm_nas.llm.LLMWorkload`)."""
    _check_decoder(decoder)
    if not isinstance(workload, Mapping):
        raise ValidationError(f"workload must be a mapping (prompt_len, output_len, batch_size), got "
                              f"{type(workload).__name__}")
    wl = _workload_of(workload)
    _check_count(tensor_parallel, "tensor_parallel", 1)
    if engine is not None and engine not in GENERATION_ENGINES:
        raise ValidationError(f"engine must be one of {list(GENERATION_ENGINES)} or None, got {engine!r:.80}")
    return {"generation_job_version": GENERATION_JOB_VERSION, "decoder_config": decoder.to_dict(),
            "workload": {"prompt_len": wl.prompt_len, "output_len": wl.output_len, "batch_size": wl.batch_size},
            "tensor_parallel": tensor_parallel, "engine": engine}


def read_generation_job(config: Mapping[str, Any]) -> tuple[DecoderConfig, LLMWorkload, int]:
    """The decoder, workload and tensor parallelism of a generation job config (a :class:`ValidationError` naming
    what is wrong otherwise)."""
    if not isinstance(config, Mapping) or config.get("generation_job_version") != GENERATION_JOB_VERSION:
        got = config.get("generation_job_version") if isinstance(config, Mapping) else type(config).__name__
        raise ValidationError(f"a generation job config needs generation_job_version {GENERATION_JOB_VERSION}, "
                              f"got {got!r}")
    try:
        decoder = DecoderConfig.from_dict(config["decoder_config"])
    except (KeyError, TypeError) as e:
        raise ValidationError(f"a generation job config needs a decoder_config mapping ({e})") from e
    tp = config.get("tensor_parallel", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValidationError(f"tensor_parallel must be an int >= 1, got {tp!r}")
    return decoder, _workload_of(config.get("workload")), tp


def _workload_of(workload: Any) -> LLMWorkload:
    if not isinstance(workload, Mapping):
        raise ValidationError(f"workload must be a mapping, got {type(workload).__name__}")
    try:
        return LLMWorkload(prompt_len=workload.get("prompt_len"), output_len=workload.get("output_len"),
                           batch_size=workload.get("batch_size", 1))
    except DippmNasError as e:
        raise ValidationError(f"bad generation workload {dict(workload)!r}: {e}") from e


def decoder_of_trial(model: str | None, user_attrs: Mapping[str, Any]) -> tuple[DecoderConfig | None, str]:
    """The decoder of a generation trial: its ``decoder_config`` user attribute, else the architecture named
    ``model``; ``None`` and why when neither gives one."""
    raw = user_attrs.get("decoder_config")
    if raw is not None:
        try:
            return DecoderConfig.from_dict(raw), ""
        except (DippmNasError, TypeError, KeyError) as e:
            return None, f"its decoder_config user attribute is not a DecoderConfig ({e})"
    if isinstance(model, str) and model in ARCHITECTURES:
        return architecture(model), ""
    return None, (f"its decoder {model!r} is not an architecture of dippm_nas.llm.ARCHITECTURES and the trial has "
                  "no decoder_config user attribute (trial.set_user_attr('decoder_config', "
                  "decoder_config(model).to_dict()))")


def generation_skip_reason(decoder: DecoderConfig, tensor_parallel: int, device: str,
                           gpus_here: int | None = None) -> str | None:
    """Why a generation of ``decoder`` split over ``tensor_parallel`` GPUs cannot be measured on catalogue device
    ``device`` (``None`` when it can): weights per GPU over the device's memory, a CPU asked for tensor
    parallelism, more GPUs than ``gpus_here`` (the GPUs this machine has; ``None``: not known here), or a family
    that is not rebuilt."""
    _check_decoder(decoder)
    _check_count(tensor_parallel, "tensor_parallel", 1)
    if gpus_here is not None:
        _check_count(gpus_here, "gpus_here", 0)
    dev = resolve_device(_check_device_name(device))
    if decoder.model_type not in _LLAMA_LIKE:
        return (f"its decoder {decoder.name!r} is of model_type {decoder.model_type!r}; a generation is rebuilt "
                f"for {list(_LLAMA_LIKE)}")
    weights_mib = decoder.weight_bytes / 2**20 / tensor_parallel
    memory_mib = dev.usable_memory_mib or dev.memory_gib * 1024.0  # a CPU: the host's memory
    if weights_mib > memory_mib:
        return (f"its weights ({weights_mib:.0f} MiB per device, tensor parallel {tensor_parallel}) exceed the "
                f"memory of {dev.id} ({memory_mib:.0f} MiB)")
    if tensor_parallel > 1 and dev.kind == "cpu":
        return f"it is split over {tensor_parallel} GPUs and {dev.id} is a CPU (tensor parallelism needs GPUs)"
    if gpus_here is not None and tensor_parallel > gpus_here:
        return f"it is split over {tensor_parallel} GPUs and this machine has {gpus_here}"
    return None


def predicted_generation(decoder: DecoderConfig, workload: LLMWorkload, tensor_parallel: int,
                         device: str) -> dict[str, Any]:
    """A generation job's prediction for catalogue device ``device``: ``latency_ms`` (the prefill, compared with the
    measured time to first token), ``ttft_ms``, ``decode_ms_per_token`` and their ``*_std``, per engine the worker
    may measure with (``by_engine``: ``"transformers"`` is :func:`~dippm_nas.llm.predict_generation` with
    ``runtime="eager"``, ``"vllm"`` with ``runtime="serving", engine="vllm"``). A CPU has no generation prediction
    (``predict_generation`` models GPUs): the figures are ``None`` and ``prediction_reason`` says why."""
    _check_decoder(decoder)
    if not isinstance(workload, LLMWorkload):
        raise ValidationError(f"workload must be a dippm_nas.llm.LLMWorkload, got {type(workload).__name__}")
    _check_count(tensor_parallel, "tensor_parallel", 1)
    dev = resolve_device(_check_device_name(device))
    out: dict[str, Any] = {"device": dev.id, "batch_size": workload.batch_size, "generation": True,
                           "latency_ms": None, "latency_ms_std": None, "latency_source": None,
                           "ttft_ms": None, "decode_ms_per_token": None}
    if dev.kind == "cpu":
        out["prediction_reason"] = (f"predict_generation models GPUs and {dev.id} is a {dev.kind}: the generation "
                                    "is measured, not compared")
        return out
    by_engine: dict[str, dict[str, Any]] = {}
    for engine, kwargs in (("transformers", {"runtime": "eager"}), ("vllm", {"runtime": "serving", "engine": "vllm"})):
        try:
            p = predict_generation(decoder, workload, dev.id, mig=False, tensor_parallel=tensor_parallel, **kwargs)
        except DippmNasError as e:
            by_engine[engine] = {"prediction_reason": str(e)}
            continue
        by_engine[engine] = {"latency_ms": p.prefill_ms, "latency_ms_std": p.prefill_ms_std,
                             "latency_source": p.sources.get("prefill_ms"), "ttft_ms": p.prefill_ms,
                             "decode_ms_per_token": p.decode_ms_per_token,
                             "decode_ms_per_token_std": p.decode_ms_per_token_std}
    out["by_engine"] = by_engine
    out.update(by_engine["transformers" if tensor_parallel == 1 else "vllm"])
    return out


def _default_engine(torch_device: str) -> str:
    if not torch_device.startswith("cuda"):
        return "transformers"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "transformers"
    return "vllm"


def measure_generation(decoder: DecoderConfig, workload: LLMWorkload | Mapping[str, Any], torch_device: str = "cpu",
                       *, engine: str | None = None, tensor_parallel: int = 1, warmup: int = 1,
                       repeats: int = 5, seed: int = 0) -> GenerationMeasurement:
    """Time the generation of ``workload`` by ``decoder`` (random weights) on ``torch_device`` (see the module
    docstring).

    Args:
        decoder: the decoder (Llama-style families). workload: an :class:`~dippm_nas.llm.LLMWorkload` or its dict.
        torch_device: ``"cpu"`` or ``"cuda:N"``. engine: one of :data:`GENERATION_ENGINES` (``None``: vLLM when
            importable on CUDA, else transformers). tensor_parallel: GPUs (vLLM only; transformers measures one).
        warmup: untimed calls (>= 0). repeats: timed repeats (>= 2). seed: of the random weights and prompt.

    Raises:
        ValidationError: a bad argument, an engine that is not installed, tensor parallelism without vLLM.
    """
    _check_decoder(decoder)
    wl = workload if isinstance(workload, LLMWorkload) else _workload_of(workload)
    if not isinstance(torch_device, str) or not (torch_device == "cpu" or torch_device == "cuda"
                                                 or torch_device.startswith("cuda:")):
        raise ValidationError(f"torch_device must be 'cpu', 'cuda' or 'cuda:N', got {torch_device!r:.80}")
    _check_count(warmup, "warmup", 0)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise ValidationError(f"repeats must be an int >= 2 (a standard deviation needs two), got {repeats!r:.80}")
    _check_count(tensor_parallel, "tensor_parallel", 1)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValidationError(f"seed must be an int in [0, 2**32), got {seed!r:.80}")
    if engine is not None and engine not in GENERATION_ENGINES:
        raise ValidationError(f"engine must be one of {list(GENERATION_ENGINES)} or None, got {engine!r:.80}")
    engine = engine or _default_engine(torch_device)
    _check_room(decoder, torch_device, tensor_parallel)
    if engine == "transformers" and tensor_parallel != 1:
        raise ValidationError(f"tensor_parallel={tensor_parallel} needs engine 'vllm'; transformers' generate "
                              "measures one device")
    timer = (_VllmTimer if engine == "vllm" else _TransformersTimer)(decoder, wl, torch_device, tensor_parallel,
                                                                        seed)
    for _ in range(warmup):  # both call shapes: the first of each pays one-off costs
        timer.time(1)
        timer.time(wl.output_len)
    first, whole = [], []
    for _ in range(repeats):
        first.append(timer.time(1))
        whole.append(timer.time(wl.output_len))
    per_token = [(w - f) / max(wl.output_len - 1, 1) for f, w in zip(first, whole)]
    return GenerationMeasurement(
        model=decoder.name, engine=engine, device=torch_device, prompt_len=wl.prompt_len, output_len=wl.output_len,
        batch_size=wl.batch_size, ttft_ms=statistics.median(first), ttft_ms_std=statistics.stdev(first),
        decode_ms_per_token=statistics.median(per_token), decode_ms_per_token_std=statistics.stdev(per_token),
        total_ms=statistics.median(whole), n_repeats=repeats, warmup=warmup)


def _free_bytes(torch_device: str) -> int | None:
    """Memory free for the weights on ``torch_device`` now (``None`` when it cannot be read)."""
    if torch_device == "cpu":
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        import torch

        return int(torch.cuda.mem_get_info(torch.device(torch_device))[0])
    except Exception:  # noqa: BLE001 - no CUDA here: the engine reports it when it builds the model
        return None


def _check_room(decoder: DecoderConfig, torch_device: str, tensor_parallel: int) -> None:
    """Refuse, before building anything, weights (float32 on a CPU) that exceed the free memory of the device."""
    per_element = 4 if torch_device == "cpu" else decoder.weight_bytes_per_element
    need = decoder.param_count * per_element / tensor_parallel
    free = _free_bytes(torch_device)
    if free is not None and need > free:
        raise ValidationError(f"the weights of {decoder.name!r} ({need / 2**20:.0f} MiB on {torch_device}) exceed "
                              f"its free memory ({free / 2**20:.0f} MiB)")


class _TransformersTimer:
    """``generate`` of a randomly initialised ``transformers`` decoder; :meth:`time` returns ms of one call."""

    def __init__(self, decoder: DecoderConfig, wl: LLMWorkload, torch_device: str, _tp: int, seed: int) -> None:
        import torch
        import transformers

        torch.manual_seed(seed)
        hf = transformers_config_of(decoder)
        dtype = getattr(torch, decoder.dtype) if torch_device.startswith("cuda") else torch.float32
        self._torch, self._cuda = torch, torch_device.startswith("cuda")
        self.model = transformers.AutoModelForCausalLM.from_config(hf, dtype=dtype).to(torch_device).eval()
        self.ids = torch.randint(0, decoder.vocab_size, (wl.batch_size, wl.prompt_len), device=torch_device)
        self.mask = torch.ones_like(self.ids)

    def time(self, new_tokens: int) -> float:
        torch = self._torch
        with torch.inference_mode():
            if self._cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.model.generate(input_ids=self.ids, attention_mask=self.mask, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            if self._cuda:
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3


class _VllmTimer:
    """vLLM with dummy (random) weights from the decoder's config; :meth:`time` returns ms of one batch."""

    def __init__(self, decoder: DecoderConfig, wl: LLMWorkload, torch_device: str, tp: int, seed: int) -> None:
        try:
            import vllm
        except ImportError as e:
            raise ValidationError("engine 'vllm' needs vllm: pip install vllm") from e
        import random

        self._dir = tempfile.TemporaryDirectory(prefix="dippm-gen-")
        transformers_config_of(decoder).save_pretrained(self._dir.name)
        self._vllm = vllm
        self.llm = vllm.LLM(model=self._dir.name, load_format="dummy", skip_tokenizer_init=True,
                            tensor_parallel_size=tp, dtype=decoder.dtype, seed=seed, enforce_eager=False)
        rng = random.Random(seed)
        self.prompts = [{"prompt_token_ids": [rng.randrange(decoder.vocab_size) for _ in range(wl.prompt_len)]}
                        for _ in range(wl.batch_size)]

    def time(self, new_tokens: int) -> float:
        params = self._vllm.SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0,
                                           ignore_eos=True)
        t0 = time.perf_counter()
        self.llm.generate(self.prompts, params, use_tqdm=False)
        return (time.perf_counter() - t0) * 1e3


def measure_generation_job(config: Mapping[str, Any], torch_device: str, predicted: Mapping[str, Any],
                           *, warmup: int = 1, repeats: int = 5) -> Any:
    """The :class:`~dippm_nas.measure.Measurement` of a generation job's config (see :meth:`GenerationMeasurement.
    to_measurement`); a job that does not fit the device is an ``"oom"`` row."""
    decoder, wl, tp = read_generation_job(config)
    try:
        m = measure_generation(decoder, wl, torch_device, engine=config.get("engine") if config.get("engine")
                               in GENERATION_ENGINES else None, tensor_parallel=tp, warmup=warmup, repeats=repeats)
    except RuntimeError as e:
        if "out of memory" not in str(e).lower():
            raise
        return Measurement(latency_ms=None, latency_ms_std=None, energy_j=None, memory_mib=None, memory_source=None,
                           n_repeats=0, device=torch_device, environment={}, status="oom", reason=str(e)[:500])
    return m.to_measurement(predicted)
