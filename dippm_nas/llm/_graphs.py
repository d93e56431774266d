"""The operators of one prefill pass and one decode step of a decoder, built from its config.

A prefill pass runs the prompt (``seqs`` sequences of ``prompt_len`` tokens) through every block and gives the
first token; a decode step runs one token per sequence against a KV cache holding ``kv_len`` tokens. Both are
:class:`~dippm_nas.graph.OperatorGraph` objects with the node records a capture makes (Relax op names, shapes,
FLOPs, bytes read and written, weights), so the analytic prior times them on any catalogue device as it
times a captured model: roofline per kernel, the host and GPU timelines of the execution runtime, power over
the timeline, activation liveness. They are built from the numbers (milliseconds for a 70B decoder) instead
of exported (minutes), and they differ between three ways of running a decoder (:data:`STYLES`):

``"eager"``
    ``transformers`` in PyTorch eager with its default ``DynamicCache``: the operators of the library's
    modeling code as PyTorch runs them (RMSNorm as eight kernels, in float32; RoPE through ``rotate_half``;
    ``repeat_kv`` materialising grouped keys and values; ``scaled_dot_product_attention`` or, for GPT-J and
    BLOOM, matmul / softmax / matmul); each decode step concatenates the new keys and values to the cache (a
    copy of the whole cache per layer), and ``generate``'s greedy step (argmax, finished-sequence bookkeeping,
    the stopping check) follows the LM head.
``"static"``
    the same code with a ``StaticCache`` (what replaying a decode step from a CUDA graph needs): new keys and
    values are written in place into buffers of the final length, and attention reads the whole buffer with a
    mask, so a step costs the same at every position.
``"fused"``
    a serving engine of the vLLM / TensorRT-LLM class: residual add fused into RMSNorm, one QKV and one
    gate/up GEMM, rotary and SiLU-and-mul kernels, the new keys and values written into a paged cache, flash
    attention over the prompt and paged attention over the cache (grouped heads read once), the LM head on the
    last token of each sequence, the sampler's softmax, log-softmax and argmax.

Attention FLOPs count the keys each query reads: a causal prefill reads ``(S + 1) / 2`` keys per query on
average (flash kernels skip masked tiles), a sliding-window layer at most its window. A mixture-of-experts
layer reads the weights of the experts its tokens are routed to (expected count under uniform top-k
routing, :func:`~dippm_nas.llm._config.expected_active_experts`) and multiplies each token by ``k`` of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OperatorGraph, OpNode, cost_of
from dippm_nas.llm._config import KV_DTYPES, DecoderConfig, ceil_div, expected_active_experts
from dippm_nas.spec import InputSpec

__all__ = ["STYLES", "prefill_graph", "decode_graph", "causal_keys_per_query"]

#: Ways of running a decoder the graphs describe (see the module docstring).
STYLES: tuple[str, ...] = ("eager", "static", "fused")

_BYTES = {**KV_DTYPES, "int64": 8, "int32": 4, "bool": 1}
_VIEW = frozenset({"reshape", "permute_dims", "strided_slice", "expand_dims", "broadcast_to"})
_ACT_OP = {"silu": "nn.silu", "gelu": "nn.gelu", "gelu_tanh": "nn.gelu_tanh", "relu": "nn.relu"}


def causal_keys_per_query(seq: int, window: int | None) -> float:
    """Mean keys a query of a causal prefill over ``seq`` tokens attends to (at most ``window`` of them)."""
    if window is None or seq <= window:
        return (seq + 1) / 2.0
    return (window * (window + 1) / 2.0 + (seq - window) * window) / seq


@dataclass(frozen=True)
class _V:
    """A tensor flowing through the graph: made by node ``producer`` (-1: a graph input, -2: a weight)."""

    producer: int
    shape: tuple[int, ...]
    dtype: str
    name: str = ""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _BYTES[self.dtype]

    def as_shape(self, shape: tuple[int, ...]) -> "_V":
        """The same tensor seen with another shape (a layout the code indexes it in; no node)."""
        return _V(self.producer, shape, self.dtype, self.name)


class _Builder:
    """Appends operator nodes in execution order, with their dataflow edges and bytes."""

    def __init__(self) -> None:
        self.nodes: list[OpNode] = []
        self.edges: set[tuple[int, int]] = set()
        self.inputs: dict[str, list[int]] = {}

    def input(self, name: str, shape: tuple[int, ...], dtype: str) -> _V:
        self.inputs[name] = []
        return _V(-1, shape, dtype, name)

    @staticmethod
    def weight(shape: tuple[int, ...], dtype: str) -> _V:
        return _V(-2, shape, dtype)

    def op(self, op: str, args: list[_V], shape: tuple[int, ...], dtype: str, attrs: dict[str, Any] | None = None, *,
           outs: int = 1, flops: float | None = None, macs: float | None = None, bytes_read: float | None = None,
           bytes_written: float | None = None, param_bytes: float | None = None) -> _V:
        """Append one node; FLOPs and MACs from the graph's formulas unless given, bytes from the shapes
        (views move none) unless given."""
        idx = len(self.nodes)
        attrs = dict(attrs or {})
        in_shapes = tuple(a.shape for a in args)
        out_shapes = (shape,) * outs
        cost = cost_of(op, in_shapes, out_shapes, attrs)
        attrs.update(cost.derived_attrs)
        view = op in _VIEW
        br = 0 if view else sum(a.nbytes for a in args)
        bw = 0 if view else outs * math.prod(shape) * _BYTES[dtype]
        pb = sum(a.nbytes for a in args if a.producer == -2)
        is_param = tuple(a.producer == -2 for a in args)
        self.nodes.append(OpNode(
            index=idx, op=op, op_class=cost.op_class, output_shapes=out_shapes, output_dtype=dtype,
            input_shapes=in_shapes, input_is_param=is_param, attrs=attrs,
            flops=int(round(cost.flops if flops is None else flops)), macs=int(round(cost.macs if macs is None else macs)),
            bytes_read=int(round(br if bytes_read is None else bytes_read)),
            bytes_written=int(round(bw if bytes_written is None else bytes_written)),
            param_bytes=int(round(pb if param_bytes is None else param_bytes)), is_constant=all(is_param) and bool(args),
        ))
        for a in args:
            if a.producer >= 0:
                self.edges.add((a.producer, idx))
            elif a.producer == -1:
                lst = self.inputs[a.name]
                if not lst or lst[-1] != idx:
                    lst.append(idx)
        return _V(idx, shape, dtype)

    def graph(self, cfg: DecoderConfig, spec: InputSpec, source: str) -> OperatorGraph:
        return OperatorGraph(
            nodes=self.nodes, edges=sorted(self.edges), input_consumers=self.inputs, outputs=[len(self.nodes) - 1],
            spec=spec, param_count=cfg.param_count, param_bytes=cfg.weight_bytes, mode="analytic", source=source,
            model_key=f"llm:{source}",
        ).validate()


class _Decoder:
    """Emits the operators of one forward pass of ``cfg`` over ``n`` sequences of ``q`` new tokens each."""

    def __init__(self, cfg: DecoderConfig, style: str, n: int, q: int, kv_len: int, kv_dtype: str,
                 prefill: bool, identical: bool = False, kv_partition: int | None = None) -> None:
        self.c, self.style, self.n, self.q, self.kv_len, self.prefill = cfg, style, n, q, kv_len, prefill
        self.kv_partition = kv_partition
        self.routed = q if identical else n * q  # distinct tokens the router sees (identical sequences route alike)
        self.kv_dtype = kv_dtype if style == "fused" else cfg.dtype  # transformers keeps its cache in the model dtype
        self.dt = cfg.dtype
        self.b = _Builder()
        self.t = n * q  # tokens of the pass

    # ------------------------------------------------------------------ small pieces
    def act(self, width: int) -> tuple[int, ...]:
        return (self.n, self.q, width)

    def linear(self, x: _V, out: int, bias: bool) -> _V:
        w = self.b.weight((x.shape[-1], out), self.dt)
        shape = (*x.shape[:-1], out)
        y = self.b.op("matmul", [x, w], shape, self.dt)
        if bias:
            y = self.b.op("add", [y, self.b.weight((out,), self.dt)], shape, self.dt)
        return y

    def norm(self, x: _V, residual: _V | None = None) -> tuple[_V, _V]:
        """(normalised x, the residual stream after adding ``residual``): eager adds apart, fused adds inside."""
        c, b = self.c, self.b
        h = c.hidden_size
        shape = x.shape
        if self.style == "fused":
            w = [b.weight((h,), self.dt)] + ([b.weight((h,), self.dt)] if c.norm == "layer" else [])
            op = "nn.rms_norm" if c.norm == "rms" else "nn.layer_norm"
            if residual is None:
                y = b.op(op, [x, *w], shape, self.dt, {"axes": [-1]})
                return y, x
            y = b.op(op, [x, residual, *w], shape, self.dt, {"axes": [-1]}, outs=2)  # writes both
            return y, y
        if residual is not None:
            x = b.op("add", [x, residual], shape, self.dt)
        if c.norm == "layer":
            return b.op("nn.layer_norm", [x, b.weight((h,), self.dt), b.weight((h,), self.dt)], shape, self.dt,
                        {"axes": [-1]}), x
        # transformers' RMSNorm: to float32, pow, mean, + eps, rsqrt, *, back to the dtype, * weight
        f = b.op("astype", [x], shape, "float32")
        sq = b.op("power", [f], shape, "float32")
        m = b.op("mean", [sq], (*shape[:-1], 1), "float32", {"axis": [-1], "keepdims": True})
        e = b.op("add", [m], m.shape, "float32")
        r = b.op("rsqrt", [e], m.shape, "float32")
        y = b.op("multiply", [f, r], shape, "float32")
        y = b.op("astype", [y], shape, self.dt)
        return b.op("multiply", [b.weight((h,), self.dt), y], shape, self.dt), x

    def rope(self, q: _V, k: _V) -> tuple[_V, _V]:
        c, b = self.c, self.b
        if c.position != "rope":
            return q, k
        if self.style == "fused":  # one kernel rotates q and k in place
            y = b.op("ewise_fma", [q, k], q.shape, self.dt, bytes_written=q.nbytes + k.nbytes,
                     flops=3 * (math.prod(q.shape) + math.prod(k.shape)) * c.rotary_dim / c.head_dim)
            return y, y.as_shape(k.shape)
        out = []
        for v in (q, k):  # x * cos + rotate_half(x) * sin; rotate_half = cat(-x2, x1)
            half = (*v.shape[:-1], c.rotary_dim // 2)
            x2 = b.op("strided_slice", [v], half, self.dt)
            neg = b.op("negative", [x2], half, self.dt)
            rot = b.op("concat", [neg, b.op("strided_slice", [v], half, self.dt)], (*v.shape[:-1], c.rotary_dim), self.dt)
            a1 = b.op("multiply", [v], v.shape, self.dt)
            a2 = b.op("multiply", [rot], rot.shape, self.dt)
            out.append(b.op("add", [a1, a2], v.shape, self.dt))
        return out[0], out[1]

    def attention(self, q: _V, k: _V, v: _V, layer: int) -> _V:
        """Attention of the pass's queries over the cache (decode) or the prompt (prefill)."""
        c, b = self.c, self.b
        n, sq, h, kvh, d = self.n, self.q, c.num_heads, c.num_kv_heads, c.head_dim
        window = c.window_of_layer(layer)
        if self.prefill:
            keys_per_q = causal_keys_per_query(sq, window)
            sk = sq
        else:
            sk = self.kv_len
            keys_per_q = float(min(sk, window) if window else sk)
        macs = n * h * sq * keys_per_q * 2 * d
        flops = 2 * macs + 5 * n * h * sq * keys_per_q
        out_shape = (n, sq, h, d)
        if self.style == "fused" or c.attention_impl == "sdpa":
            heads_read = kvh if self.style == "fused" else h  # eager reads repeat_kv's copies
            kv_dt = self.kv_dtype if self.style == "fused" else self.dt
            kv_bytes = 2 * n * min(sk, window or sk) * heads_read * d * _BYTES[kv_dt]
            attrs: dict[str, object] = {"causal_mask": "TopLeft"} if self.prefill else {}
            if not self.prefill and self.style == "fused" and self.kv_partition:
                attrs["kv_partition"] = int(self.kv_partition)  # the engine's kernel: blocks per head and partition
            return b.op("nn.attention", [q, k, v], out_shape, self.dt, attrs, flops=flops, macs=macs,
                        bytes_read=q.nbytes + kv_bytes)
        # manual attention (GPT-J, BLOOM): scores, mask, softmax in float32, weighted sum
        sdt = "float32" if c.model_type == "gptj" else self.dt
        if sdt == "float32":
            q = b.op("astype", [q], q.shape, "float32")
            k = b.op("astype", [k], k.shape, "float32")
        scores_shape = (n, h, sq, sk)
        q, k, v = q.as_shape((n, h, sq, d)), k.as_shape((n, h, d, sk)), v.as_shape((n, h, sk, d))  # heads first
        s = b.op("matmul", [q, k], scores_shape, sdt, flops=macs, macs=macs / 2)
        if c.position == "alibi":
            s = b.op("add", [s], scores_shape, sdt)
        s = b.op("where", [s], scores_shape, sdt)
        p = b.op("nn.softmax", [s], scores_shape, "float32", {"axis": -1})
        p = b.op("astype", [p], scores_shape, self.dt)
        a = b.op("matmul", [p, v], (n, h, sq, d), self.dt, flops=macs, macs=macs / 2)
        return a.as_shape(out_shape)

    # ------------------------------------------------------------------ one block
    def block(self, x: _V, residual: _V | None, layer: int) -> tuple[_V, _V]:
        c, b = self.c, self.b
        n, q, h, d = self.n, self.q, c.num_heads, c.head_dim
        kvh = c.num_kv_heads
        hs, res = self.norm(x, residual)
        fused = self.style == "fused"
        if fused:
            qkv = self.linear(hs, (h + 2 * kvh) * d, c.qkv_bias)
            qh, kh, vh = qkv.as_shape((n, q, h, d)), qkv.as_shape((n, q, kvh, d)), qkv.as_shape((n, q, kvh, d))
        else:
            qh, kh, vh = (b.op("reshape", [self.linear(hs, heads * d, c.qkv_bias)], (n, q, heads, d), self.dt)
                          for heads in (h, kvh, kvh))
        qh, kh = self.rope(qh, kh)
        kc, vc = self.cache(kh, vh, layer)
        a = self.attention(qh, kc, vc, layer)
        if not fused:
            a = b.op("layout_transform", [a], a.shape, self.dt)  # .transpose(1, 2).contiguous()
        a = b.op("reshape", [a], self.act(h * d), self.dt)
        o = self.linear(a, c.hidden_size, c.out_bias)
        if c.parallel_block:  # GPT-J / NeoX: the MLP reads the same normalised input (NeoX: its own norm)
            m = self.mlp(hs if c.norms_per_layer == 1 else self.norm(res, None)[0])
            s = b.op("add", [o, m], o.shape, self.dt)
            return s, res
        if c.norms_per_layer == 4:  # Gemma-2: a norm after attention and after the MLP as well
            o = self.norm(o, None)[0]
        hs2, res2 = self.norm(o, res)
        m = self.mlp(hs2)
        if c.norms_per_layer == 4:
            m = self.norm(m, None)[0]
        return m, res2

    def cache(self, k: _V, v: _V, layer: int) -> tuple[_V, _V]:
        """The keys and values attention reads, after this pass's are added to the cache."""
        c, b = self.c, self.b
        n, kvh, d = self.n, c.num_kv_heads, c.head_dim
        if self.style == "fused":  # reshape_and_cache: new keys and values into their blocks
            new = k.nbytes + v.nbytes
            b.op("scatter_nd", [k, v], k.shape, self.kv_dtype, bytes_read=new,
                 bytes_written=new * _BYTES[self.kv_dtype] // _BYTES[self.dt])
            if self.prefill:
                return k, v
            shape = (n, self.kv_len, kvh, d)
            return b.input(f"key_cache_{layer}", shape, self.kv_dtype), b.input(f"value_cache_{layer}", shape,
                                                                                  self.kv_dtype)
        out = []
        for name, new in (("key", k), ("value", v)):
            if self.prefill:
                cur = new
            elif self.style == "static":  # index_copy_ into the buffer of the final length
                buf = b.input(f"{name}_cache_{layer}", (n, self.kv_len, kvh, d), self.dt)
                b.op("index_put", [buf, new], new.shape, self.dt, bytes_read=new.nbytes, bytes_written=new.nbytes)
                cur = buf
            else:  # DynamicCache: torch.cat of the past and the new token
                past = b.input(f"past_{name}_{layer}", (n, self.kv_len - self.q, kvh, d), self.dt)
                cur = b.op("concat", [past, new], (n, self.kv_len, kvh, d), self.dt, {"axis": 1})
            if c.num_heads != kvh:  # repeat_kv: expand + reshape copies the grouped heads
                cur = b.op("repeat", [cur], (*cur.shape[:2], c.num_heads, d), self.dt)
            out.append(cur)
        return out[0], out[1]

    def mlp(self, x: _V) -> _V:
        c, b = self.c, self.b
        f = c.intermediate_size
        act = _ACT_OP[c.activation]
        if c.is_moe:
            return self.moe(x)
        if c.mlp == "plain":
            u = self.linear(x, f, c.mlp_bias)
            u = b.op(act, [u], u.shape, self.dt)
            return self.linear(u, c.hidden_size, c.mlp_bias)
        if self.style == "fused":
            gu = self.linear(x, 2 * f, c.mlp_bias)
            u = b.op(act, [gu], self.act(f), self.dt, flops=6 * self.t * f)  # act_and_mul: reads 2f, writes f
        else:
            g = b.op(act, [self.linear(x, f, c.mlp_bias)], self.act(f), self.dt)
            u = b.op("multiply", [g, self.linear(x, f, c.mlp_bias)], self.act(f), self.dt)
        return self.linear(u, c.hidden_size, c.mlp_bias)

    def moe(self, x: _V) -> _V:
        """Router, top-k, and the routed experts' GEMMs over the weights of the experts in use."""
        c, b = self.c, self.b
        h, f, e, k, t = c.hidden_size, c.intermediate_size, c.num_experts, c.experts_per_token, self.t
        logits = self.linear(x, e, False)
        b.op("topk", [b.op("nn.softmax", [logits], logits.shape, "float32", {"axis": -1})], (t, k), "float32",
             {"k": k})
        active = max(1, math.ceil(expected_active_experts(c, self.routed) - 1e-9))
        rows = ceil_div(t * k, active)  # tokens per active expert
        width = 2 * f if c.mlp == "gated" else f
        w1 = b.weight((active, h, width), self.dt)
        xin = b.op("take", [x], (active, rows, h), self.dt)  # gather the routed tokens
        u = b.op("matmul", [xin, w1], (active, rows, width), self.dt, flops=2 * t * k * h * width,
                 macs=t * k * h * width)
        u = b.op(_ACT_OP[c.activation], [u], (active, rows, f), self.dt)
        w2 = b.weight((active, f, h), self.dt)
        y = b.op("matmul", [u, w2], (active, rows, h), self.dt, flops=2 * t * k * f * h, macs=t * k * f * h)
        y = b.op("multiply", [y], y.shape, self.dt)  # routing weights
        return b.op("scatter_elements", [y], x.shape, self.dt, bytes_written=2 * x.nbytes)  # sum into the tokens

    # ------------------------------------------------------------------ the whole pass
    def build(self, source: str) -> OperatorGraph:
        c, b = self.c, self.b
        e = c.embed_dim or c.hidden_size
        ids = b.input("input_ids", (self.n, self.q), "int64")
        table = b.weight((c.vocab_size, e), self.dt)
        x = b.op("take", [table, ids], self.act(e), self.dt)
        if c.position == "learned":
            pos = b.op("take", [b.weight((c.position_rows, c.hidden_size), self.dt), ids], self.act(c.hidden_size),
                       self.dt)
            if e != c.hidden_size:
                x = self.linear(x, c.hidden_size, False)
            x = b.op("add", [x, pos], x.shape, self.dt)
        elif e != c.hidden_size:
            x = self.linear(x, c.hidden_size, False)
        if c.model_type in ("gemma", "gemma2"):
            x = b.op("multiply", [x], x.shape, self.dt)  # * sqrt(hidden_size)
        if c.embedding_norm:
            x = self.norm(x, None)[0]
        if c.position == "rope" and self.style != "fused":  # cos and sin of the positions, once per pass
            cs = (self.n, self.q, c.rotary_dim)
            b.op("cos", [ids], cs, "float32")
            b.op("sin", [ids], cs, "float32")
        residual: _V | None = None
        for layer in range(c.num_layers):
            x, residual = self.block(x, residual, layer)
        x = self.norm(x, residual)[0] if c.final_norm else b.op("add", [x, residual], x.shape, self.dt)
        last = b.op("strided_slice", [x], (self.n, 1, c.hidden_size), self.dt)  # the LM head sees the last token
        if e != c.hidden_size:
            last = self.linear(last, e, False)
        # the LM head (the embedding's table, transposed, when tied)
        logits = b.op("matmul", [last, b.weight((e, c.vocab_size), self.dt)], (self.n, 1, c.vocab_size), self.dt)
        if c.lm_head_bias:
            logits = b.op("add", [logits, b.weight((c.vocab_size,), self.dt)], logits.shape, self.dt)
        if c.model_type == "gemma2":  # final logit soft-capping: / cap, tanh, * cap
            logits = b.op("multiply", [b.op("tanh", [b.op("divide", [logits], logits.shape, self.dt)], logits.shape,
                                            self.dt)], logits.shape, self.dt)
        self.sample(logits)
        spec = InputSpec(inputs={"input_ids": ((self.q,), "int64")}, batch_size=self.n, dtype=self.dt)
        return b.graph(c, spec, source)

    def sample(self, logits: _V) -> None:
        """Pick the next token of each sequence (greedy)."""
        b, n, v = self.b, self.n, self.c.vocab_size
        f = b.op("astype", [logits], (n, v), "float32")
        if self.style == "fused":  # vLLM's sampler: probabilities and log-probabilities, then argmax
            b.op("nn.softmax", [f], f.shape, "float32", {"axis": -1})
            b.op("nn.log_softmax", [f], f.shape, "float32", {"axis": -1})
            b.op("argmax", [f], (n,), "int64", {"axis": -1})
            return
        # generate(): argmax, padding of finished sequences, the ids grow by one, EOS and length checks
        tok = b.op("argmax", [f], (n,), "int64", {"axis": -1})
        t1 = b.op("multiply", [tok], (n,), "int64")
        t2 = b.op("add", [t1], (n,), "int64")
        b.op("concat", [b.input("generated_ids", (n, self.kv_len), "int64"), t2], (n, self.kv_len + 1), "int64",
             {"axis": 1})
        done = b.op("equal", [t2], (n,), "bool")
        b.op("logical_and", [b.op("max", [done], (1,), "bool")], (n,), "bool")


def _check_style(style: str) -> str:
    if style not in STYLES:
        raise InvalidValueError(f"style must be one of {STYLES}, got {style!r}")
    return style


def prefill_graph(config: DecoderConfig, seqs: int, prompt_len: int, *, style: str = "eager",
                  kv_dtype: str | None = None, identical_sequences: bool = False) -> OperatorGraph:
    """The prefill pass of ``seqs`` prompts of ``prompt_len`` tokens, up to the first token of each.

    Args:
        config: the decoder.
        seqs: prompts in the pass (the batch, or the sequences a serving engine packs into one step).
        prompt_len: tokens of each prompt.
        style: one of :data:`STYLES`.
        kv_dtype: the dtype keys and values are written to the cache in (``"fused"`` only; default the weights').
        identical_sequences: every prompt is the same (a mixture of experts reads the experts of one prompt's tokens).
    """
    _check_style(style)
    d = _Decoder(config, style, seqs, prompt_len, prompt_len, kv_dtype or config.dtype, prefill=True,
                 identical=identical_sequences)
    return d.build(f"{config.name} prefill {seqs}x{prompt_len} {style}")


def decode_graph(config: DecoderConfig, batch: int, kv_len: int, *, style: str = "eager",
                 kv_dtype: str | None = None, identical_sequences: bool = False,
                 kv_partition: int | None = None) -> OperatorGraph:
    """One decode step of ``batch`` sequences whose cache holds ``kv_len`` tokens after the step (the new
    token included; for ``"static"`` the buffer length, which attention reads whole).

    Args:
        config: the decoder.
        batch: sequences in the step.
        kv_len: tokens in the cache, ``>= 2``.
        style: one of :data:`STYLES`.
        kv_dtype: the cache's dtype (``"fused"`` only; default the weights').
        identical_sequences: every sequence is the same and generates alike (a mixture of experts reads the
            experts of one token per step).
        kv_partition: ``"fused"`` only: cache tokens one thread block of the attention kernel reads (a serving
            engine's paged attention runs a block per sequence, query head and partition); ``None``: the prior
            tiles the attention's output.
    """
    _check_style(style)
    if kv_partition is not None and (isinstance(kv_partition, bool) or not isinstance(kv_partition, int)
                                     or kv_partition < 1):
        raise InvalidValueError(f"kv_partition must be an int >= 1 or None, got {kv_partition!r}")
    d = _Decoder(config, style, batch, 1, kv_len, kv_dtype or config.dtype, prefill=False,
                 identical=identical_sequences, kv_partition=kv_partition)
    return d.build(f"{config.name} decode {batch}@{kv_len} {style}")
