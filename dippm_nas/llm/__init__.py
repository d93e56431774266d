"""LLM generation as a search objective: prefill and per-token decode latency, KV-cache memory, the batch a GPU
or MIG slice holds, tokens/s and J/token.

>>> from dippm_nas.llm import LLMWorkload, predict_generation
>>> pred = predict_generation("llama-2-7b", LLMWorkload(prompt_len=512, output_len=256, batch_size=16),
...                           "h100-sxm5-80gb", runtime="serving")                     # doctest: +SKIP
>>> pred.decode_ms_per_token, pred.tokens_per_s, pred.max_batch                        # doctest: +SKIP

A decoder is read from its ``transformers`` config (or a model, a ``config.json``, a name of
:data:`ARCHITECTURES`) into a :class:`DecoderConfig`; its prefill and decode-step graphs are built from those
numbers (:func:`prefill_graph`, :func:`decode_graph`) and timed by the analytic prior for the runtime of the
deployment (``"eager"``, ``"cuda-graphs"``, ``"compiled"``, ``"serving"``); a serving engine may shard the model over
the GPUs of one node (``tensor_parallel=N``). :func:`evaluate_serving` scores a serving configuration under traffic
and SLOs (``dippm_nas.optuna.serving_config_search`` searches them); :func:`adapt_engine` corrects an engine from a
few measured runs. ``docs/llm.md`` describes what is modelled, the constants and their sources, and the accuracy on
measured serving runs.
"""

from dippm_nas.llm._architectures import ARCHITECTURES, architecture, decoder_config
from dippm_nas.llm._config import (KV_DTYPES, MODEL_TYPES, WEIGHT_DTYPES, DecoderConfig, config_from_transformers,
                                   expected_active_experts, kv_dtype_bytes)
from dippm_nas.llm._engines import ENGINES, ENGINES_FILE, FRONTENDS, EngineTable, ServingEngine, engine_table, serving_engine
from dippm_nas.llm._engine_adapt import MeasuredServingRun, adapt_engine
from dippm_nas.llm._engine_store import ADAPTED_CONSTANTS, EngineAdaptation, adapted_engine
from dippm_nas.llm._graphs import STYLES, causal_keys_per_query, decode_graph, prefill_graph
from dippm_nas.llm._parallel import INTERCONNECTS, TensorParallel, resolve_tensor_parallel, shard_config
from dippm_nas.llm._memory import (KVCapacity, contiguous_capacity, kv_cache_bytes, paged_capacity, paged_kv_bytes,
                                   vllm_gpu_blocks)
from dippm_nas.llm._predict import DEFAULT_DEVICE, predict_generation, resolve_execution
from dippm_nas.llm._serving import (SERVING_FIGURES, ServingConfig, ServingEstimate, ServingSLO, ServingTraffic,
                                    evaluate_serving)
from dippm_nas.llm._prediction import GENERATION_FIGURES, Figure, GenerationPrediction, GenerationSlice
from dippm_nas.llm._timing import LLM_RUNTIMES, GenerationExecution
from dippm_nas.llm._workload import LLMWorkload

__all__ = [
    "LLMWorkload", "predict_generation", "GenerationPrediction", "GenerationSlice", "Figure", "GENERATION_FIGURES",
    "DEFAULT_DEVICE", "LLM_RUNTIMES", "GenerationExecution", "resolve_execution",
    "DecoderConfig", "decoder_config", "config_from_transformers", "ARCHITECTURES", "architecture", "MODEL_TYPES",
    "KV_DTYPES", "WEIGHT_DTYPES", "kv_dtype_bytes", "expected_active_experts",
    "prefill_graph", "decode_graph", "STYLES", "causal_keys_per_query",
    "kv_cache_bytes", "paged_kv_bytes", "KVCapacity", "contiguous_capacity", "paged_capacity", "vllm_gpu_blocks",
    "ServingTraffic", "ServingConfig", "ServingSLO", "ServingEstimate", "evaluate_serving", "SERVING_FIGURES",
    "MeasuredServingRun", "EngineAdaptation", "adapt_engine", "adapted_engine", "ADAPTED_CONSTANTS",
    "INTERCONNECTS", "TensorParallel", "resolve_tensor_parallel", "shard_config",
    "ServingEngine", "ENGINES", "FRONTENDS", "serving_engine", "engine_table", "EngineTable", "ENGINES_FILE",
]
