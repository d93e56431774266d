"""A decoder's architecture as numbers: :class:`DecoderConfig`, read from a ``transformers`` config.

Everything :mod:`dippm_nas.llm` predicts is arithmetic on these numbers: the weights (every parameter
counted, bias by bias), the KV cache per token, and the operators of one prefill pass and one decode step
(:mod:`dippm_nas.llm._graphs`). :func:`config_from_transformers` reads them off a ``transformers``
``PretrainedConfig`` or its ``to_dict()`` by attribute name, without importing ``transformers``:
``model_type`` picks the reader (:data:`MODEL_TYPES`). What each family's ``transformers`` implementation
holds (which layers carry a bias, which norms exist, whether the LM head is tied) is written in its reader;
``tests/llm/test_llm.py`` checks the parameter counts against ``transformers`` itself where it is installed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dippm_nas.errors import InvalidValueError

__all__ = ["DecoderConfig", "config_from_transformers", "MODEL_TYPES", "WEIGHT_DTYPES", "KV_DTYPES", "kv_dtype_bytes",
           "expected_active_experts", "ceil_div"]

#: Bytes per element of the dtypes a KV cache may be stored in (``float8_*``: the FP8 KV caches of vLLM and
#: TensorRT-LLM, scaled per tensor).
KV_DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: Dtypes the weights of a decoder may have here (the compute dtype of its matmuls).
WEIGHT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")

_NORMS = ("rms", "layer")
_MLPS = ("gated", "plain")
_POSITIONS = ("rope", "learned", "alibi")
_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")


def kv_dtype_bytes(dtype: str) -> int:
    """Bytes per element of a KV-cache dtype.

    Raises:
        InvalidValueError: a dtype not in :data:`KV_DTYPES` (the choices are listed).
    """
    try:
        return KV_DTYPES[dtype]
    except (KeyError, TypeError):
        raise InvalidValueError(f"kv_dtype must be one of {sorted(KV_DTYPES)} or None (the weights' dtype), "
                                f"got {dtype!r}") from None


@dataclass(frozen=True)
class DecoderConfig:
    """A decoder-only transformer, as the numbers its cost depends on.

    Attributes:
        name: what the architecture is called (a checkpoint name, ``"custom"``...).
        model_type: the ``transformers`` family (``"llama"``, ``"gpt2"``...), one of :data:`MODEL_TYPES`.
        num_layers: decoder blocks.
        hidden_size: width of the residual stream.
        num_heads: query heads.
        num_kv_heads: key/value heads (``num_heads``: multi-head; fewer: grouped-query; 1: multi-query).
        head_dim: width of one head (``hidden_size // num_heads`` unless the config says otherwise).
        intermediate_size: width of the MLP (of one expert for a mixture of experts).
        vocab_size: rows of the embedding and columns of the LM head.
        max_positions: longest sequence the positions cover (``None``: no limit, ALiBi).
        mlp: ``"gated"`` (SwiGLU / GeGLU: gate, up and down projections) or ``"plain"`` (up and down).
        activation: ``"silu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"relu"``.
        norm: ``"rms"`` (RMSNorm, a weight) or ``"layer"`` (LayerNorm, a weight and a bias).
        position: ``"rope"``, ``"learned"`` (a table of positions) or ``"alibi"`` (a bias in the scores).
        rotary_dim: dimensions of a head that RoPE rotates (``head_dim`` unless partial; 0 without RoPE).
        position_rows: rows of a learned position table (OPT's holds 2 more than ``max_positions``).
        rope_scaling: the config scales RoPE beyond ``max_positions`` (a longer prompt is allowed, with a
            warning).
        sliding_window: tokens a sliding-window layer attends to (``None``: every layer attends to all).
        sliding_window_every: every how many layers one uses the window (1: all of them; 2: every other one,
            starting with the first, as Gemma-2).
        num_experts: experts of a mixture-of-experts MLP (0: a dense MLP).
        experts_per_token: experts each token is routed to (top-k).
        qkv_bias, out_bias, mlp_bias: the query/key/value, attention output and MLP projections have biases.
        parallel_block: attention and MLP read the same normalised input and add to the residual together
            (GPT-J, GPT-NeoX).
        norms_per_layer: normalisation layers per block (2; GPT-J 1; Gemma-2 4).
        final_norm: a normalisation after the last block.
        embedding_norm: a LayerNorm right after the embedding (BLOOM).
        embed_dim: width of the token embedding when it differs from ``hidden_size`` (OPT's projections);
            ``None`` otherwise.
        tie_embeddings: the LM head shares the embedding's weight.
        lm_head_bias: the LM head has a bias (GPT-J).
        dtype: the dtype of the weights, one of :data:`WEIGHT_DTYPES`.
        attention_impl: how PyTorch eager computes attention in the ``transformers`` code of this family:
            ``"sdpa"`` (``scaled_dot_product_attention``, one kernel) or ``"manual"`` (matmul, softmax in
            float32, matmul).

    Raises:
        InvalidValueError: a field breaking its rule (the message names it, its value and the choices).
    """

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int | None
    mlp: str = "gated"
    activation: str = "silu"
    norm: str = "rms"
    position: str = "rope"
    rotary_dim: int = 0
    position_rows: int = 0
    rope_scaling: bool = False
    sliding_window: int | None = None
    sliding_window_every: int = 1
    num_experts: int = 0
    experts_per_token: int = 0
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    parallel_block: bool = False
    norms_per_layer: int = 2
    final_norm: bool = True
    embedding_norm: bool = False
    embed_dim: int | None = None
    tie_embeddings: bool = False
    lm_head_bias: bool = False
    dtype: str = "float16"
    attention_impl: str = "sdpa"

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "vocab_size"):
            _positive_int(self, name)
        for name, choices in (("mlp", _MLPS), ("norm", _NORMS), ("position", _POSITIONS),
                              ("activation", _ACTIVATIONS), ("dtype", WEIGHT_DTYPES),
                              ("attention_impl", ("sdpa", "manual"))):
            if getattr(self, name) not in choices:
                raise InvalidValueError(f"DecoderConfig.{name} must be one of {choices}, got {getattr(self, name)!r}")
        if self.num_heads % self.num_kv_heads:
            raise InvalidValueError(f"DecoderConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                                    f"({self.num_kv_heads}): each key/value head serves a group of query heads")
        if self.max_positions is not None:
            _positive_int(self, "max_positions")
        elif self.position != "alibi":
            raise InvalidValueError(f"DecoderConfig.max_positions may be None only with ALiBi positions, got "
                                    f"position={self.position!r}")
        if self.position == "rope":
            if not isinstance(self.rotary_dim, int) or not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
                raise InvalidValueError(f"DecoderConfig.rotary_dim must be an even int in 2..head_dim ({self.head_dim}) "
                                        f"with RoPE, got {self.rotary_dim!r}")
        if self.position == "learned":
            _positive_int(self, "position_rows")
        for name in ("sliding_window", "embed_dim"):
            if getattr(self, name) is not None:
                _positive_int(self, name)
        _positive_int(self, "sliding_window_every")
        for name in ("num_experts", "experts_per_token", "norms_per_layer"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidValueError(f"DecoderConfig.{name} must be an int >= 0, got {v!r}")
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise InvalidValueError(f"DecoderConfig.experts_per_token must be in 1..num_experts ({self.num_experts}) "
                                    f"for a mixture of experts, got {self.experts_per_token!r}")

    # ------------------------------------------------------------------ derived
    @property
    def is_moe(self) -> bool:
        """The MLP is a mixture of experts."""
        return self.num_experts > 0

    @property
    def weight_bytes_per_element(self) -> int:
        """Bytes per weight element."""
        return {"float16": 2, "bfloat16": 2, "float32": 4}[self.dtype]

    @property
    def norm_params(self) -> int:
        """Parameters of one normalisation layer."""
        return self.hidden_size * (2 if self.norm == "layer" else 1)

    @property
    def attention_params(self) -> int:
        """Parameters of one attention block (projections and their biases)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        n = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            n += q + 2 * kv
        if self.out_bias:
            n += h
        return n

    @property
    def expert_params(self) -> int:
        """Parameters of one MLP (one expert of a mixture)."""
        h, f = self.hidden_size, self.intermediate_size
        if self.mlp == "gated":
            return 3 * h * f + ((2 * f + h) if self.mlp_bias else 0)
        return 2 * h * f + ((f + h) if self.mlp_bias else 0)

    @property
    def mlp_params(self) -> int:
        """Parameters of one block's MLP: every expert and the router of a mixture."""
        if not self.is_moe:
            return self.expert_params
        return self.num_experts * self.expert_params + self.hidden_size * self.num_experts

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder block."""
        return self.attention_params + self.mlp_params + self.norms_per_layer * self.norm_params

    @property
    def embedding_params(self) -> int:
        """Parameters outside the blocks: token and position embeddings, their norm and projections, the final
        norm and an untied LM head."""
        h = self.hidden_size
        e = self.embed_dim or h
        n = self.vocab_size * e
        if e != h:
            n += 2 * e * h  # OPT's project_in and project_out (no bias)
        if self.position == "learned":
            n += self.position_rows * h
        if self.embedding_norm:
            n += self.norm_params
        if self.final_norm:
            n += self.norm_params
        if not self.tie_embeddings:
            n += self.vocab_size * e
        if self.lm_head_bias:
            n += self.vocab_size
        return n

    @property
    def param_count(self) -> int:
        """Every parameter, each tied weight counted once (what ``sum(p.numel() for p in model.parameters())``
        of the ``transformers`` model gives)."""
        return self.embedding_params + self.num_layers * self.layer_params

    @property
    def active_params_per_token(self) -> float:
        """Parameters one token's forward pass multiplies by (a mixture's routed experts only; the embedding
        row is a lookup, not a product)."""
        h = self.hidden_size
        e = self.embed_dim or h
        mlp = (self.experts_per_token * self.expert_params + h * self.num_experts) if self.is_moe else self.expert_params
        head = self.vocab_size * e + (2 * e * h if e != h else 0)
        return self.num_layers * (self.attention_params + mlp) + head

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights in :attr:`dtype`."""
        return self.param_count * self.weight_bytes_per_element

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> int:
        """Bytes of the keys and values one token leaves in the cache, over all layers.

        ``2 * num_layers * num_kv_heads * head_dim * bytes(kv_dtype)``; ``kv_dtype`` defaults to the weights'.
        """
        b = kv_dtype_bytes(kv_dtype or self.dtype)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * b

    def window_of_layer(self, layer: int) -> int | None:
        """The sliding window of block ``layer`` (``None``: it attends to every token)."""
        if self.sliding_window is None:
            return None
        return self.sliding_window if layer % self.sliding_window_every == 0 else None

    def with_dtype(self, dtype: str) -> "DecoderConfig":
        """A copy with the weights in ``dtype``."""
        return dataclasses.replace(self, dtype=dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields (:meth:`from_dict` reads it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DecoderConfig":
        """Inverse of :meth:`to_dict`; unknown keys are an error naming the valid ones."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidValueError(f"unknown DecoderConfig keys {unknown}; valid keys: {sorted(cls.__dataclass_fields__)}")
        return cls(**dict(d))


def _positive_int(cfg: DecoderConfig, name: str) -> None:
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidValueError(f"DecoderConfig.{name} must be an int >= 1, got {v!r}")


# ---------------------------------------------------------------------------------------------- readers
class _Reader:
    """Attribute access over a ``transformers`` config object or its ``to_dict()``."""

    def __init__(self, cfg: Any) -> None:
        self._d = cfg if isinstance(cfg, Mapping) else None
        self._obj = None if isinstance(cfg, Mapping) else cfg

    def get(self, key: str, default: Any = None) -> Any:
        if self._d is not None:
            v = self._d.get(key, default)
        else:
            v = getattr(self._obj, key, default)
        return default if v is None else v

    def need(self, key: str, model_type: str) -> Any:
        v = self.get(key)
        if v is None:
            raise InvalidValueError(f"a {model_type!r} config needs {key!r}; it is missing")
        return v

    def first(self, keys: tuple[str, ...], model_type: str) -> Any:
        for k in keys:
            v = self.get(k)
            if v is not None:
                return v
        raise InvalidValueError(f"a {model_type!r} config needs one of {list(keys)}; none is set")


def _dtype_of(r: _Reader) -> str:
    raw = r.get("torch_dtype") or r.get("dtype")
    text = str(raw).replace("torch.", "") if raw is not None else "float16"
    return text if text in WEIGHT_DTYPES else "float16"


def _act(name: Any) -> str:
    n = str(name or "silu").lower()
    if n in ("silu", "swish"):
        return "silu"
    if n in ("relu",):
        return "relu"
    if "tanh" in n or n in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python_tanh", "quick_gelu"):
        return "gelu_tanh"
    if n.startswith("gelu"):
        return "gelu"
    raise InvalidValueError(f"activation {name!r} is not modelled; choices: {list(_ACTIVATIONS)} (and their "
                            "transformers spellings: gelu_new, gelu_pytorch_tanh, swish)")


def _rope_scaled(r: _Reader) -> bool:
    """The config scales RoPE beyond its positions (``rope_scaling`` of transformers 4, a ``rope_parameters``
    whose ``rope_type`` is not ``"default"`` in transformers 5)."""
    for key in ("rope_scaling", "rope_parameters"):
        v = r.get(key)
        if isinstance(v, Mapping):
            kind = v.get("rope_type", v.get("type", "default"))
            if kind not in (None, "default"):
                return True
        elif v:
            return True
    return False


def _llama_like(r: _Reader, mt: str, name: str) -> DecoderConfig:
    """Llama, Mistral, Mixtral, Qwen2, Gemma, Gemma-2, Phi-3, StarCoder2: RoPE, pre-norm, GQA."""
    h = int(r.need("hidden_size", mt))
    heads = int(r.need("num_attention_heads", mt))
    kv = int(r.get("num_key_value_heads", heads))
    head_dim = int(r.get("head_dim") or h // heads)
    rotary = head_dim
    prf = r.get("partial_rotary_factor")
    if prf:
        rotary = int(head_dim * float(prf))
    window = r.get("sliding_window")
    if mt == "qwen2" and not r.get("use_sliding_window", False):
        window = None
    experts = int(r.get("num_local_experts", 0) or 0)
    gemma = mt in ("gemma", "gemma2")
    starcoder = mt == "starcoder2"
    bias = bool(r.get("use_bias", True)) if starcoder else bool(r.get("attention_bias", False))
    return DecoderConfig(
        name=name, model_type=mt, num_layers=int(r.need("num_hidden_layers", mt)), hidden_size=h, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, intermediate_size=int(r.need("intermediate_size", mt)),
        vocab_size=int(r.need("vocab_size", mt)), max_positions=int(r.need("max_position_embeddings", mt)),
        mlp="plain" if starcoder else "gated",
        activation=_act(r.get("hidden_activation") or r.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")),
        norm="layer" if starcoder else "rms", position="rope", rotary_dim=rotary, rope_scaling=_rope_scaled(r),
        sliding_window=int(window) if window else None, sliding_window_every=2 if mt == "gemma2" else 1,
        num_experts=experts, experts_per_token=int(r.get("num_experts_per_tok", 0) or 0) if experts else 0,
        qkv_bias=True if mt == "qwen2" else bias, out_bias=False if mt == "qwen2" else bias,
        mlp_bias=bool(r.get("mlp_bias", False)) or (starcoder and bias),
        norms_per_layer=4 if mt == "gemma2" else 2,
        tie_embeddings=bool(r.get("tie_word_embeddings", gemma or starcoder)), dtype=_dtype_of(r),
    )


def _gpt2(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = int(r.first(("n_embd", "hidden_size"), mt))
    heads = int(r.first(("n_head", "num_attention_heads"), mt))
    pos = int(r.first(("n_positions", "max_position_embeddings"), mt))
    return DecoderConfig(
        name=name, model_type=mt, num_layers=int(r.first(("n_layer", "num_hidden_layers"), mt)), hidden_size=h,
        num_heads=heads, num_kv_heads=heads, head_dim=h // heads, intermediate_size=int(r.get("n_inner") or 4 * h),
        vocab_size=int(r.need("vocab_size", mt)), max_positions=pos, mlp="plain",
        activation=_act(r.get("activation_function", "gelu_new")), norm="layer", position="learned",
        position_rows=pos, qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=True, dtype=_dtype_of(r),
    )


def _gptj(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = int(r.first(("n_embd", "hidden_size"), mt))
    heads = int(r.first(("n_head", "num_attention_heads"), mt))
    return DecoderConfig(
        name=name, model_type=mt, num_layers=int(r.first(("n_layer", "num_hidden_layers"), mt)), hidden_size=h,
        num_heads=heads, num_kv_heads=heads, head_dim=h // heads, intermediate_size=int(r.get("n_inner") or 4 * h),
        vocab_size=int(r.need("vocab_size", mt)), max_positions=int(r.first(("n_positions", "max_position_embeddings"), mt)),
        mlp="plain", activation=_act(r.get("activation_function", "gelu_new")), norm="layer", position="rope",
        rotary_dim=int(r.get("rotary_dim") or h // heads), mlp_bias=True, parallel_block=True, norms_per_layer=1,
        tie_embeddings=bool(r.get("tie_word_embeddings", False)), lm_head_bias=True, dtype=_dtype_of(r),
        attention_impl="manual",
    )


def _opt(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = int(r.need("hidden_size", mt))
    heads = int(r.need("num_attention_heads", mt))
    pos = int(r.need("max_position_embeddings", mt))
    e = int(r.get("word_embed_proj_dim") or h)
    bias = bool(r.get("enable_bias", True))
    before = bool(r.get("do_layer_norm_before", True))
    return DecoderConfig(
        name=name, model_type=mt, num_layers=int(r.need("num_hidden_layers", mt)), hidden_size=h, num_heads=heads,
        num_kv_heads=heads, head_dim=h // heads, intermediate_size=int(r.need("ffn_dim", mt)),
        vocab_size=int(r.need("vocab_size", mt)), max_positions=pos, mlp="plain",
        activation=_act(r.get("activation_function", "relu")), norm="layer", position="learned",
        position_rows=pos + 2,  # OPTLearnedPositionalEmbedding keeps an offset of 2 rows
        qkv_bias=bias, out_bias=bias, mlp_bias=bias,
        final_norm=before and not bool(r.get("_remove_final_layer_norm", False)),
        embed_dim=e if e != h else None, tie_embeddings=bool(r.get("tie_word_embeddings", True)), dtype=_dtype_of(r),
    )


def _bloom(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = int(r.first(("hidden_size", "n_embed"), mt))
    heads = int(r.first(("n_head", "num_attention_heads"), mt))
    return DecoderConfig(
        name=name, model_type=mt, num_layers=int(r.first(("n_layer", "num_hidden_layers"), mt)), hidden_size=h,
        num_heads=heads, num_kv_heads=heads, head_dim=h // heads, intermediate_size=4 * h,
        vocab_size=int(r.need("vocab_size", mt)), max_positions=None, mlp="plain", activation="gelu_tanh",
        norm="layer", position="alibi", qkv_bias=True, out_bias=True, mlp_bias=True, embedding_norm=True,
        tie_embeddings=bool(r.get("tie_word_embeddings", True)), dtype=_dtype_of(r), attention_impl="manual",
    )


def _gpt_neox(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = int(r.need("hidden_size", mt))
    heads = int(r.need("num_attention_heads", mt))
    hd = h // heads
    return DecoderConfig(
        name=name, model_type=mt, num_layers=int(r.need("num_hidden_layers", mt)), hidden_size=h, num_heads=heads,
        num_kv_heads=heads, head_dim=hd, intermediate_size=int(r.need("intermediate_size", mt)),
        vocab_size=int(r.need("vocab_size", mt)), max_positions=int(r.need("max_position_embeddings", mt)),
        mlp="plain", activation=_act(r.get("hidden_act", "gelu")), norm="layer", position="rope",
        rotary_dim=max(2, int(hd * float(r.get("rotary_pct", 0.25))) // 2 * 2), rope_scaling=_rope_scaled(r),
        qkv_bias=bool(r.get("attention_bias", True)), out_bias=bool(r.get("attention_bias", True)), mlp_bias=True,
        parallel_block=bool(r.get("use_parallel_residual", True)),
        tie_embeddings=bool(r.get("tie_word_embeddings", False)), dtype=_dtype_of(r),
    )


#: ``model_type`` of each ``transformers`` decoder family this package reads, and its reader.
_READERS: dict[str, Callable[[_Reader, str, str], DecoderConfig]] = {
    **dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2", "phi3", "starcoder2"), _llama_like),
    "gpt2": _gpt2, "gptj": _gptj, "opt": _opt, "bloom": _bloom, "gpt_neox": _gpt_neox,
}
#: The ``transformers`` model types :func:`decoder_config` reads.
MODEL_TYPES: tuple[str, ...] = tuple(_READERS)


def config_from_transformers(cfg: Any, name: str | None = None) -> DecoderConfig:
    """The :class:`DecoderConfig` of a ``transformers`` config object or its ``to_dict()``.

    Raises:
        InvalidValueError: no ``model_type``, an encoder-decoder, a family not in :data:`MODEL_TYPES`, a missing field.
    """
    r = _Reader(cfg)
    mt = r.get("model_type")
    if not mt:
        raise InvalidValueError("the config has no model_type, so its family is unknown; give a transformers config "
                                f"of one of {list(MODEL_TYPES)} or a DecoderConfig")
    mt = str(mt)
    if r.get("is_encoder_decoder", False):
        raise InvalidValueError(f"config model_type={mt!r} is an encoder-decoder, not a decoder-only causal LM; "
                                f"decoders read here: {list(MODEL_TYPES)}")
    reader = _READERS.get(mt)
    if reader is None:
        raise InvalidValueError(f"config model_type={mt!r} is not a decoder-only causal LM this package reads; "
                                f"choices: {list(MODEL_TYPES)} (or build a DecoderConfig)")
    label = name or str(r.get("_name_or_path") or r.get("name_or_path") or mt) or mt
    return reader(r, mt, label)


def expected_active_experts(config: DecoderConfig, tokens: int) -> float:
    """Experts of a mixture one layer's weights are read for when ``tokens`` tokens are routed together: with
    uniform routing of top-k of E, ``E * (1 - (1 - k / E) ** tokens)`` (0 for a dense MLP)."""
    if not config.is_moe:
        return 0.0
    e, k = config.num_experts, config.experts_per_token
    return e * (1.0 - (1.0 - k / e) ** max(tokens, 0)) if tokens > 0 else 0.0


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` of ints."""
    return -(-a // b)

