"""Named decoder architectures (published checkpoints' ``config.json``, written down in code) and
:func:`decoder_config`, which turns whatever a user gives into a :class:`DecoderConfig` once, at the entry.

Nothing is downloaded: each entry holds the fields of the checkpoint's ``config.json`` on the Hugging Face
Hub that the cost depends on (cited per entry), read by the same code as a ``transformers`` config.
Checkpoints stored in float32 (GPT-J, OPT, BLOOM, GPT-2) are listed in float16, the dtype serving engines
load them in (``dtype="auto"`` of vLLM turns a float32 checkpoint into float16).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dippm_nas._json import read_json_file
from dippm_nas.errors import InvalidTypeError, InvalidValueError
from dippm_nas.llm._config import WEIGHT_DTYPES, DecoderConfig, config_from_transformers

__all__ = ["ARCHITECTURES", "architecture", "decoder_config", "MAX_CONFIG_FILE_BYTES"]

#: The largest ``config.json`` read, bytes (a published one is a few KB).
MAX_CONFIG_FILE_BYTES = 16 * 2**20


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, max_pos: int, **extra: Any) -> dict:
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
            "max_position_embeddings": max_pos, "hidden_act": "silu", "tie_word_embeddings": False,
            "torch_dtype": "float16", **extra}


#: ``name -> (config.json fields, source)``: the architectures :func:`decoder_config` knows by name.
_ENTRIES: dict[str, tuple[dict[str, Any], str]] = {
    "llama-7b": (_llama(4096, 11008, 32, 32, 32, 32000, 2048), "huggyllama/llama-7b"),
    "llama-2-7b": (_llama(4096, 11008, 32, 32, 32, 32000, 4096), "meta-llama/Llama-2-7b-hf"),
    "llama-2-13b": (_llama(5120, 13824, 40, 40, 40, 32000, 4096), "meta-llama/Llama-2-13b-hf"),
    "llama-2-70b": (_llama(8192, 28672, 80, 64, 8, 32000, 4096), "meta-llama/Llama-2-70b-hf"),
    "llama-3-8b": (_llama(4096, 14336, 32, 32, 8, 128256, 8192, torch_dtype="bfloat16"), "meta-llama/Meta-Llama-3-8B"),
    "llama-3-70b": (_llama(8192, 28672, 80, 64, 8, 128256, 8192, torch_dtype="bfloat16"),
                    "meta-llama/Meta-Llama-3-70B"),
    "llama-3.1-8b": (_llama(4096, 14336, 32, 32, 8, 128256, 131072, torch_dtype="bfloat16",
                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
                     "meta-llama/Llama-3.1-8B"),
    "codellama-7b": (_llama(4096, 11008, 32, 32, 32, 32016, 16384, torch_dtype="bfloat16"),
                     "codellama/CodeLlama-7b-hf"),
    "codellama-13b": (_llama(5120, 13824, 40, 40, 40, 32016, 16384, torch_dtype="bfloat16"),
                      "codellama/CodeLlama-13b-hf"),
    "aquila-7b": (_llama(4096, 11008, 32, 32, 32, 100008, 2048),
                  "BAAI/Aquila-7B (model_type 'aquila': the Llama architecture)"),
    "mistral-7b": ({**_llama(4096, 14336, 32, 32, 8, 32000, 32768, torch_dtype="bfloat16"), "model_type": "mistral",
                    "sliding_window": 4096}, "mistralai/Mistral-7B-v0.1"),
    "mistral-7b-v0.3": ({**_llama(4096, 14336, 32, 32, 8, 32768, 32768, torch_dtype="bfloat16"),
                         "model_type": "mistral"}, "mistralai/Mistral-7B-v0.3"),
    "mistral-nemo-12b": ({**_llama(5120, 14336, 40, 32, 8, 131072, 1024000, torch_dtype="bfloat16"),
                          "model_type": "mistral", "head_dim": 128}, "mistralai/Mistral-Nemo-Base-2407"),
    "mixtral-8x7b": ({**_llama(4096, 14336, 32, 32, 8, 32000, 32768, torch_dtype="bfloat16"), "model_type": "mixtral",
                      "num_local_experts": 8, "num_experts_per_tok": 2}, "mistralai/Mixtral-8x7B-v0.1"),
    "qwen2-7b": ({**_llama(3584, 18944, 28, 28, 4, 152064, 131072, torch_dtype="bfloat16"), "model_type": "qwen2"},
                 "Qwen/Qwen2-7B"),
    "qwen1.5-7b": ({**_llama(4096, 11008, 32, 32, 32, 151936, 32768, torch_dtype="bfloat16"), "model_type": "qwen2"},
                   "Qwen/Qwen1.5-7B"),
    "gemma-2-2b": ({**_llama(2304, 9216, 26, 8, 4, 256000, 8192, torch_dtype="bfloat16"), "model_type": "gemma2",
                    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096,
                    "tie_word_embeddings": True}, "google/gemma-2-2b"),
    "gemma-2-9b": ({**_llama(3584, 14336, 42, 16, 8, 256000, 8192, torch_dtype="bfloat16"), "model_type": "gemma2",
                    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096,
                    "tie_word_embeddings": True}, "google/gemma-2-9b"),
    "phi-3-mini-4k": ({**_llama(3072, 8192, 32, 32, 32, 32064, 4096, torch_dtype="bfloat16"), "model_type": "phi3"},
                      "microsoft/Phi-3-mini-4k-instruct"),
    "phi-3-medium-4k": ({**_llama(5120, 17920, 40, 40, 10, 32064, 4096, torch_dtype="bfloat16"), "model_type": "phi3"},
                        "microsoft/Phi-3-medium-4k-instruct"),
    "gpt-j-6b": ({"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
                  "n_positions": 2048, "vocab_size": 50400, "activation_function": "gelu_new",
                  "tie_word_embeddings": False, "torch_dtype": "float16"}, "EleutherAI/gpt-j-6b"),
    "opt-6.7b": ({"model_type": "opt", "hidden_size": 4096, "ffn_dim": 16384, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "vocab_size": 50272, "max_position_embeddings": 2048,
                  "word_embed_proj_dim": 4096, "activation_function": "relu", "do_layer_norm_before": True,
                  "torch_dtype": "float16"}, "facebook/opt-6.7b"),
    "bloom-7b1": ({"model_type": "bloom", "hidden_size": 4096, "n_layer": 30, "n_head": 32, "vocab_size": 250880,
                   "torch_dtype": "float16"}, "bigscience/bloom-7b1"),
    "gpt2": ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
              "vocab_size": 50257, "activation_function": "gelu_new", "torch_dtype": "float16"}, "openai-community/gpt2"),
}

#: Names of the architectures :func:`decoder_config` knows, each with the Hugging Face repository whose
#: ``config.json`` it copies.
ARCHITECTURES: dict[str, str] = {k: v[1] for k, v in _ENTRIES.items()}


def architecture(name: str) -> DecoderConfig:
    """The :class:`DecoderConfig` of a named architecture.

    Raises:
        InvalidValueError: an unknown name (the names are listed).
    """
    entry = _ENTRIES.get(name)
    if entry is None:
        raise InvalidValueError(f"unknown architecture {name!r}; choices: {sorted(_ENTRIES)}")
    return config_from_transformers(entry[0], name)


#: gpt-fast's ``ModelArgs`` (a Llama-style decoder with a static KV cache: ``forward(idx, input_pos)``) ->
#: ``transformers`` Llama config keys
_GPT_FAST_KEYS = {"n_layer": "num_hidden_layers", "dim": "hidden_size", "n_head": "num_attention_heads",
                  "n_local_heads": "num_key_value_heads", "intermediate_size": "intermediate_size",
                  "vocab_size": "vocab_size", "block_size": "max_position_embeddings", "head_dim": "head_dim",
                  "rope_base": "rope_theta", "norm_eps": "rms_norm_eps"}
#: nanoGPT's ``GPTConfig`` (GPT-2 layout) -> ``transformers`` GPT-2 config keys
_NANOGPT_KEYS = {"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd", "vocab_size": "vocab_size",
                 "block_size": "n_positions"}


def _module_dtype(module: Any) -> str | None:
    """The dtype of a module's first floating-point parameter (meta tensors too), as a config names it."""
    params = getattr(module, "parameters", None)
    if params is None:
        return None
    for p in params():
        if p.dtype.is_floating_point:
            return str(p.dtype).removeprefix("torch.")
    return None


def _module_config(cfg: Any, module: Any) -> dict[str, Any] | None:
    """The ``transformers``-style dict of a plain ``nn.Module``'s ``config`` attribute in one of the two layouts
    PyTorch decoders written by hand use: gpt-fast's ``ModelArgs`` (``n_layer``, ``dim``, ``n_head``,
    ``n_local_heads``, ``intermediate_size``, ``vocab_size``, ``block_size``) or nanoGPT's ``GPTConfig``
    (``n_layer``, ``n_head``, ``n_embd``, ``vocab_size``, ``block_size``, ``bias``); ``None`` for neither."""
    get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
    dtype = _module_dtype(module) or "float32"
    if get("dim") is not None and get("n_layer") is not None:
        out: dict[str, Any] = {"model_type": "llama", "hidden_act": "silu", "tie_word_embeddings": False,
                               "torch_dtype": dtype}
        for src, dst in _GPT_FAST_KEYS.items():
            if get(src) is not None:
                out[dst] = get(src)
        out.setdefault("num_key_value_heads", out.get("num_attention_heads"))
        return out
    if get("n_embd") is not None and get("n_layer") is not None:
        out = {"model_type": "gpt2", "activation_function": "gelu_new", "tie_word_embeddings": True,
               "torch_dtype": dtype}
        out.update({dst: get(src) for src, dst in _NANOGPT_KEYS.items() if get(src) is not None})
        if get("bias") is False:
            raise InvalidValueError("a nanoGPT GPTConfig with bias=False is not read (GPT-2 layers carry biases); "
                                    "give a DecoderConfig(..., bias=False) as the module's config instead")
        return out
    return None


def decoder_config(model_or_config: Any, *, name: str | None = None, dtype: str | None = None) -> DecoderConfig:
    """The :class:`DecoderConfig` of a decoder, read once at the entry.

    Args:
        model_or_config: a :class:`DecoderConfig`; a name of :data:`ARCHITECTURES`; a ``transformers`` config
            object, its ``to_dict()``, or the path of a ``config.json`` (or of the directory holding it); or a
            ``transformers`` model (an object whose ``config`` is such a config); or a plain ``torch.nn.Module``
            whose ``config`` attribute is a :class:`DecoderConfig`, gpt-fast's ``ModelArgs`` (the Llama-style
            decoder with a static KV cache, ``forward(idx, input_pos)``) or nanoGPT's ``GPTConfig``, an object or a
            dict; the dtype is its parameters' (``meta`` tensors are enough).
        name: the name to give the architecture (default: the config's ``_name_or_path`` or model type).
        dtype: the weights' dtype (one of :data:`~dippm_nas.llm.WEIGHT_DTYPES`) instead of the config's.

    A ``config.json`` is read as every JSON file is (:func:`dippm_nas._json.read_json_file`: a regular file of
    at most :data:`MAX_CONFIG_FILE_BYTES`, nested at most 64 levels); every size in it is bounded
    (:data:`~dippm_nas.llm._config.SIZE_LIMITS`).

    Raises:
        InvalidValueError: not a decoder-only causal LM (an encoder, an encoder-decoder, an unknown family: the
            families read here are listed), a config missing a field, an unreadable file, or an unknown name.
        InvalidTypeError: an object that is none of the above.
    """
    if dtype is not None and (not isinstance(dtype, str) or dtype not in WEIGHT_DTYPES):
        raise InvalidValueError(f"dtype must be one of {list(WEIGHT_DTYPES)} or None (the config's), got {dtype!r}")
    cfg = _decoder_config(model_or_config, name, dtype)
    return cfg if dtype is None or cfg.dtype == dtype else cfg.with_dtype(dtype)


def _decoder_config(obj: Any, name: str | None, dtype: str | None) -> DecoderConfig:
    """:func:`decoder_config` of each form of ``obj``."""
    if isinstance(obj, DecoderConfig):
        return obj if name is None else dataclasses.replace(obj, name=name)
    if isinstance(obj, str) and obj in _ENTRIES:
        cfg = architecture(obj)
        return cfg if name is None else dataclasses.replace(cfg, name=name)
    if isinstance(obj, (str, Path)):
        p = Path(obj)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise InvalidValueError(f"{str(obj)!r} is neither a known architecture name nor a config.json file; "
                                    f"architectures: {sorted(_ENTRIES)}")
        data = read_json_file(p, f"cannot read the config {str(p)!r}", InvalidValueError,
                              max_bytes=MAX_CONFIG_FILE_BYTES)
        return config_from_transformers(data, name or p.parent.name or None, dtype=dtype)
    if isinstance(obj, Mapping) or (hasattr(obj, "model_type") and hasattr(obj, "to_dict")):
        return config_from_transformers(obj, name, dtype=dtype)
    inner = getattr(obj, "config", None)
    if isinstance(inner, DecoderConfig):
        return inner if name is None else dataclasses.replace(inner, name=name)
    if inner is not None and hasattr(inner, "model_type"):
        return config_from_transformers(inner, name or str(getattr(inner, "_name_or_path", "") or "") or None,
                                        dtype=dtype)
    if inner is not None:
        fields = _module_config(inner, obj)
        if fields is not None:
            return config_from_transformers(fields, name or type(obj).__name__, dtype=dtype)
    raise InvalidTypeError(
        "model_or_config must be a DecoderConfig, an architecture name (dippm_nas.llm.ARCHITECTURES), a transformers "
        f"config or model, a config dict, or the path of a config.json; got {type(obj).__name__}"
    )
