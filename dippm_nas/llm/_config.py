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
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dippm_nas.errors import InvalidValueError

__all__ = ["DecoderConfig", "config_from_transformers", "MODEL_TYPES", "WEIGHT_DTYPES", "KV_DTYPES", "kv_dtype_bytes",
           "expected_active_experts", "ceil_div", "SIZE_LIMITS", "DTYPE_ALIASES"]

#: Bytes per element of the dtypes a KV cache may be stored in (``float8_*``: the FP8 KV caches of vLLM and
#: TensorRT-LLM, scaled per tensor).
KV_DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: Dtypes the weights of a decoder may have here (the compute dtype of its matmuls).
WEIGHT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")

#: Spellings of a weights dtype in configs that name one of :data:`WEIGHT_DTYPES` (``torch.float16`` is read as
#: ``float16``); any other ``torch_dtype`` (``"float8"``, ``"int8"``...) is an error, never read as float16.
DTYPE_ALIASES: dict[str, str] = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32",
                                 "fp32": "float32"}

#: The largest value of each size a config may give, and why: beyond it the decoder cannot exist on any GPU
#: (or is far beyond every published one), and the arithmetic and the graphs built from it would not end in
#: memory. ``{kind: (most, reason)}``; the fields of each kind are in :data:`_SIZE_KINDS`.
SIZE_LIMITS: dict[str, tuple[int, str]] = {
    "layers": (1024, "the deepest published decoder has 126 blocks (Llama-3.1-405B), and a pass's graph holds "
                     "about 30 operators per block"),
    "width": (2**20, "one 2**20 x 2**20 float16 weight matrix is 2 TiB, more than any GPU's memory; the widest "
                     "published decoder has hidden_size 16,384 and intermediate_size 53,248 (Llama-3.1-405B)"),
    "vocab": (2**24, "the largest published vocabulary has 256,000 tokens (Gemma)"),
    "positions": (2**31, "the longest published context window is 10 million tokens (Llama 4 Scout)"),
    "experts": (4096, "the published mixtures route among at most 256 experts (DeepSeek-V3)"),
}
_SIZE_KINDS: dict[str, str] = {
    "num_layers": "layers", "hidden_size": "width", "num_heads": "width", "num_kv_heads": "width",
    "head_dim": "width", "intermediate_size": "width", "embed_dim": "width", "rotary_dim": "width",
    "vocab_size": "vocab", "max_positions": "positions", "position_rows": "positions",
    "sliding_window": "positions", "sliding_window_every": "layers", "num_experts": "experts",
    "experts_per_token": "experts", "norms_per_layer": "layers",
}

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
            _positive_int(self, name, low=0)
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


def _limit_text(name: str) -> tuple[int, str]:
    most, why = SIZE_LIMITS[_SIZE_KINDS[name]]
    return most, f"at most {most:,}: {why}"


def _positive_int(cfg: DecoderConfig, name: str, *, low: int = 1) -> None:
    v = getattr(cfg, name)
    most, why = _limit_text(name)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= most:
        raise InvalidValueError(f"DecoderConfig.{name} must be an int >= {low} and {why}; got {_shown(v)}")


def _shown(v: Any) -> str:
    text = repr(v) if not isinstance(v, int) or v.bit_length() < 64 else f"an int of {v.bit_length()} bits"
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------------------------------------- readers
_REQUIRED = object()


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

    def size(self, keys: str | tuple[str, ...], model_type: str, field: str, *, default: Any = _REQUIRED,
             low: int = 1) -> Any:
        """The int at the first of ``keys`` that is set, checked as ``DecoderConfig.<field>`` is (an int, or a
        float with an integral value, from ``low`` to the field's limit of :data:`SIZE_LIMITS`); ``default``
        when none is set (required without one)."""
        keys = (keys,) if isinstance(keys, str) else keys
        key = next((k for k in keys if self.get(k) is not None), None)
        if key is None:
            if default is _REQUIRED:
                raise InvalidValueError(f"a {model_type!r} config needs one of {list(keys)}; none is set" if len(keys) > 1
                                        else f"a {model_type!r} config needs {keys[0]!r}; it is missing")
            return default
        v = self.get(key)
        most, why = _limit_text(field)
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= most:
            raise InvalidValueError(f"{key} of a {model_type!r} config must be an int >= {low} and {why}; got "
                                    f"{_shown(v)}")
        return v

    def fraction(self, key: str, model_type: str, default: float) -> float:
        """The number at ``key`` in (0, 1] (``default`` when not set)."""
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 1):
            raise InvalidValueError(f"{key} of a {model_type!r} config must be a number in (0, 1], got {_shown(v)}")
        return float(v)


def _head_dim(r: _Reader, mt: str, hidden: int, heads: int) -> int:
    """The width of one head: the config's ``head_dim``, else ``hidden // heads``, which needs ``hidden`` to be
    a multiple of ``heads`` (``transformers`` splits the width evenly; so does nanoGPT). One check for every
    family and every way a config arrives (a dict, a config object, a module's ``config``)."""
    explicit = r.size("head_dim", mt, "head_dim", default=None)
    if explicit is not None:
        return explicit
    if hidden % heads:
        raise InvalidValueError(f"a {mt!r} config's hidden size ({hidden}) must be a multiple of its attention heads "
                                f"({heads}) when it gives no head_dim: each head takes hidden_size / heads channels "
                                f"(here {hidden / heads:.4g})")
    return hidden // heads


def _dtype_of(r: _Reader) -> str:
    """The weights' dtype the config names (``torch_dtype``, or ``dtype`` of transformers 5), float16 when it
    names none; a spelling of :data:`DTYPE_ALIASES` is read as the dtype it names.

    Raises:
        InvalidValueError: a dtype not in :data:`WEIGHT_DTYPES` (``"float8"``, ``"int8"``...): weights in it
            are not modelled, and reading them as float16 would be silently wrong.
    """
    raw = r.get("torch_dtype") or r.get("dtype")
    if raw is None:
        return "float16"
    text = str(raw).removeprefix("torch.") if isinstance(raw, str) or type(raw).__name__ == "dtype" else None
    text = DTYPE_ALIASES.get(text, text) if text is not None else None
    if text not in WEIGHT_DTYPES:
        raise InvalidValueError(f"the config's torch_dtype {_shown(raw)} is not a weights dtype modelled here; "
                                f"choices: {list(WEIGHT_DTYPES)} (and {sorted(DTYPE_ALIASES)}); give dtype= to choose "
                                "the weights' dtype instead (an FP8 KV cache is LLMWorkload(kv_dtype='float8_e4m3fn'))")
    return text


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
    h = r.size("hidden_size", mt, "hidden_size")
    heads = r.size("num_attention_heads", mt, "num_heads")
    kv = r.size("num_key_value_heads", mt, "num_kv_heads", default=heads)
    head_dim = _head_dim(r, mt, h, heads)
    rotary = head_dim
    if r.get("partial_rotary_factor"):
        rotary = int(head_dim * r.fraction("partial_rotary_factor", mt, 1.0))
    window = r.size("sliding_window", mt, "sliding_window", default=None) \
        if r.get("sliding_window") not in (False, 0) else None
    if mt == "qwen2" and not r.get("use_sliding_window", False):
        window = None
    experts = r.size("num_local_experts", mt, "num_experts", default=0, low=0)
    gemma = mt in ("gemma", "gemma2")
    starcoder = mt == "starcoder2"
    bias = bool(r.get("use_bias", True)) if starcoder else bool(r.get("attention_bias", False))
    return DecoderConfig(
        name=name, model_type=mt, num_layers=r.size("num_hidden_layers", mt, "num_layers"), hidden_size=h,
        num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=r.size("intermediate_size", mt, "intermediate_size"),
        vocab_size=r.size("vocab_size", mt, "vocab_size"),
        max_positions=r.size("max_position_embeddings", mt, "max_positions"),
        mlp="plain" if starcoder else "gated",
        activation=_act(r.get("hidden_activation") or r.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")),
        norm="layer" if starcoder else "rms", position="rope", rotary_dim=rotary, rope_scaling=_rope_scaled(r),
        sliding_window=window, sliding_window_every=2 if mt == "gemma2" else 1,
        num_experts=experts,
        experts_per_token=r.size("num_experts_per_tok", mt, "experts_per_token", default=0, low=0) if experts else 0,
        qkv_bias=True if mt == "qwen2" else bias, out_bias=False if mt == "qwen2" else bias,
        mlp_bias=bool(r.get("mlp_bias", False)) or (starcoder and bias),
        norms_per_layer=4 if mt == "gemma2" else 2,
        tie_embeddings=bool(r.get("tie_word_embeddings", gemma or starcoder)), dtype=_dtype_of(r),
    )


def _gpt2(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = r.size(("n_embd", "hidden_size"), mt, "hidden_size")
    heads = r.size(("n_head", "num_attention_heads"), mt, "num_heads")
    pos = r.size(("n_positions", "max_position_embeddings"), mt, "max_positions")
    return DecoderConfig(
        name=name, model_type=mt, num_layers=r.size(("n_layer", "num_hidden_layers"), mt, "num_layers"),
        hidden_size=h, num_heads=heads, num_kv_heads=heads, head_dim=_head_dim(r, mt, h, heads),
        intermediate_size=r.size("n_inner", mt, "intermediate_size", default=None) or 4 * h,
        vocab_size=r.size("vocab_size", mt, "vocab_size"), max_positions=pos, mlp="plain",
        activation=_act(r.get("activation_function", "gelu_new")), norm="layer", position="learned",
        position_rows=pos, qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=True, dtype=_dtype_of(r),
    )


def _gptj(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = r.size(("n_embd", "hidden_size"), mt, "hidden_size")
    heads = r.size(("n_head", "num_attention_heads"), mt, "num_heads")
    hd = _head_dim(r, mt, h, heads)
    return DecoderConfig(
        name=name, model_type=mt, num_layers=r.size(("n_layer", "num_hidden_layers"), mt, "num_layers"),
        hidden_size=h, num_heads=heads, num_kv_heads=heads, head_dim=hd,
        intermediate_size=r.size("n_inner", mt, "intermediate_size", default=None) or 4 * h,
        vocab_size=r.size("vocab_size", mt, "vocab_size"),
        max_positions=r.size(("n_positions", "max_position_embeddings"), mt, "max_positions"),
        mlp="plain", activation=_act(r.get("activation_function", "gelu_new")), norm="layer", position="rope",
        rotary_dim=r.size("rotary_dim", mt, "rotary_dim", default=None) or hd, mlp_bias=True, parallel_block=True,
        norms_per_layer=1, tie_embeddings=bool(r.get("tie_word_embeddings", False)), lm_head_bias=True,
        dtype=_dtype_of(r), attention_impl="manual",
    )


def _opt(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = r.size("hidden_size", mt, "hidden_size")
    heads = r.size("num_attention_heads", mt, "num_heads")
    pos = r.size("max_position_embeddings", mt, "max_positions")
    e = r.size("word_embed_proj_dim", mt, "embed_dim", default=None) or h
    bias = bool(r.get("enable_bias", True))
    before = bool(r.get("do_layer_norm_before", True))
    return DecoderConfig(
        name=name, model_type=mt, num_layers=r.size("num_hidden_layers", mt, "num_layers"), hidden_size=h,
        num_heads=heads, num_kv_heads=heads, head_dim=_head_dim(r, mt, h, heads),
        intermediate_size=r.size("ffn_dim", mt, "intermediate_size"),
        vocab_size=r.size("vocab_size", mt, "vocab_size"), max_positions=pos, mlp="plain",
        activation=_act(r.get("activation_function", "relu")), norm="layer", position="learned",
        position_rows=pos + 2,  # OPTLearnedPositionalEmbedding keeps an offset of 2 rows
        qkv_bias=bias, out_bias=bias, mlp_bias=bias,
        final_norm=before and not bool(r.get("_remove_final_layer_norm", False)),
        embed_dim=e if e != h else None, tie_embeddings=bool(r.get("tie_word_embeddings", True)), dtype=_dtype_of(r),
    )


def _bloom(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = r.size(("hidden_size", "n_embed"), mt, "hidden_size")
    heads = r.size(("n_head", "num_attention_heads"), mt, "num_heads")
    return DecoderConfig(
        name=name, model_type=mt, num_layers=r.size(("n_layer", "num_hidden_layers"), mt, "num_layers"),
        hidden_size=h, num_heads=heads, num_kv_heads=heads, head_dim=_head_dim(r, mt, h, heads),
        intermediate_size=4 * h, vocab_size=r.size("vocab_size", mt, "vocab_size"), max_positions=None,
        mlp="plain", activation="gelu_tanh", norm="layer", position="alibi", qkv_bias=True, out_bias=True,
        mlp_bias=True, embedding_norm=True, tie_embeddings=bool(r.get("tie_word_embeddings", True)),
        dtype=_dtype_of(r), attention_impl="manual",
    )


def _gpt_neox(r: _Reader, mt: str, name: str) -> DecoderConfig:
    h = r.size("hidden_size", mt, "hidden_size")
    heads = r.size("num_attention_heads", mt, "num_heads")
    hd = _head_dim(r, mt, h, heads)
    return DecoderConfig(
        name=name, model_type=mt, num_layers=r.size("num_hidden_layers", mt, "num_layers"), hidden_size=h,
        num_heads=heads, num_kv_heads=heads, head_dim=hd,
        intermediate_size=r.size("intermediate_size", mt, "intermediate_size"),
        vocab_size=r.size("vocab_size", mt, "vocab_size"),
        max_positions=r.size("max_position_embeddings", mt, "max_positions"),
        mlp="plain", activation=_act(r.get("hidden_act", "gelu")), norm="layer", position="rope",
        rotary_dim=max(2, int(hd * r.fraction("rotary_pct", mt, 0.25)) // 2 * 2), rope_scaling=_rope_scaled(r),
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


def config_from_transformers(cfg: Any, name: str | None = None, *, dtype: str | None = None) -> DecoderConfig:
    """The :class:`DecoderConfig` of a ``transformers`` config object or its ``to_dict()``.

    Args:
        cfg: the config.
        name: the architecture's name (default: the config's ``_name_or_path`` or model type).
        dtype: the weights' dtype (one of :data:`WEIGHT_DTYPES`), instead of the config's ``torch_dtype``.

    Every size is read as an int within :data:`SIZE_LIMITS`, and a hidden size that the attention heads do not
    divide (without a ``head_dim``) is refused, whichever family and form the config has.

    Raises:
        InvalidValueError: no ``model_type``, an encoder-decoder, a family not in :data:`MODEL_TYPES`, a missing
            field, a size that is not an int or is beyond its limit, a ``torch_dtype`` that is not modelled.
    """
    if dtype is not None:
        if not isinstance(dtype, str) or dtype not in WEIGHT_DTYPES:
            raise InvalidValueError(f"dtype must be one of {list(WEIGHT_DTYPES)} or None (the config's), got "
                                    f"{_shown(dtype)}")
        cfg = {**_as_dict(cfg), "torch_dtype": dtype, "dtype": None}
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


def _as_dict(cfg: Any) -> dict[str, Any]:
    """A config as a dict (a mapping as it is, a config object through ``to_dict()`` or its attributes)."""
    if isinstance(cfg, Mapping):
        return dict(cfg)
    to_dict = getattr(cfg, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(cfg))


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

