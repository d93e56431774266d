"""``torch.autocast`` as the prior prices it: each node's run-time dtype and the cast kernels autocast adds.

Under ``torch.autocast("cuda", dtype=low)`` (PyTorch documentation, "Automatic Mixed Precision package",
"CUDA Op-Specific Behavior"):

- ops of the lower-precision list (``conv*``, ``linear``, ``matmul``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``,
  ``scaled_dot_product_attention``: the graph's ``conv``, ``matmul`` and ``attention`` classes) run in ``low``;
  their floating-point inputs of another dtype are cast first, each cast a kernel of its own. Weights are
  cast too; autocast caches a weight's cast within one autocast region, so a forward pass wrapped in its own
  region casts each weight once (:data:`AUTOCAST_FP32_OPS` has the float32 list);
- ops of the float32 list (softmax, log-softmax, layer norm, group norm, exp, log, pow, rsqrt, sum, prod,
  cumsum, softplus, ...) run in float32, their half-precision inputs cast up first;
- every other op runs in the dtype its inputs promote to: half-precision activations stay half precision, an
  op with a float32 weight tensor (a layer scale ``x * gamma``, an embedding) promotes to float32 (type
  promotion inside the op's kernel, no cast kernel); batch norm runs in its input's dtype with float32
  statistics (cuDNN's mixed-precision batch norm); a bias add fused into its convolution or GEMM takes that
  op's dtype.

Bytes move at the run-time dtype's width (:attr:`AutocastPlan.bytes_scale`). A cast is a kernel reading the
tensor at one width and writing it at the other, and a host dispatch without the Python module call of an
operator (priced in :func:`~dippm_nas.prior.node_costs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dippm_nas.graph import OperatorGraph

__all__ = ["AutocastPlan", "autocast_plan", "AUTOCAST_FP32_OPS", "AUTOCAST_LOW_CLASSES"]

#: Graph op classes autocast runs in the low dtype (PyTorch's "CUDA Ops that can autocast to float16").
AUTOCAST_LOW_CLASSES: frozenset[str] = frozenset({"conv", "conv_depthwise", "matmul", "attention"})
#: Relax ops autocast runs in float32 (PyTorch's "CUDA Ops that can autocast to float32", by their Relax names).
AUTOCAST_FP32_OPS: frozenset[str] = frozenset({
    "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.group_norm", "exp", "log", "log2", "log10", "log1p",
    "expm1", "power", "rsqrt", "reciprocal", "sum", "prod", "cumsum", "cumprod", "nn.softplus", "tan", "sinh",
    "cosh", "asin", "acos", "erfinv",
})
#: Ops that keep their input's dtype with float32 statistics (cuDNN batch norm takes half input, float weights).
_INPUT_DTYPE_OPS = frozenset({"nn.batch_norm", "nn.instance_norm"})
_SIZE = {0: 4.0, 1: 2.0, 2: 2.0, 3: 8.0}
_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}


@dataclass(frozen=True)
class AutocastPlan:
    """What autocast does to one graph.

    Shapes:
        every array is ``[num_nodes]``.

    Attributes:
        dtype: run-time dtype code of each node (0 float32, 1 float16, 2 bfloat16, 3 float64, -1 not floating
            point), the codes of :func:`~dippm_nas.prior.graph_facts`.
        bytes_scale: the node's bytes at run time over its bytes as captured.
        casts: cast kernels autocast launches before the node (its activations and weights of another dtype).
        cast_bytes: bytes those casts read and write.
    """

    dtype: np.ndarray
    bytes_scale: np.ndarray
    casts: np.ndarray
    cast_bytes: np.ndarray


def autocast_plan(graph: OperatorGraph, low: str, classes: tuple[str, ...], captured: np.ndarray,
                  fused: np.ndarray) -> AutocastPlan:
    """The :class:`AutocastPlan` of ``graph`` under autocast to ``low`` (``"float16"`` or ``"bfloat16"``).

    Args:
        graph: the captured graph (validated).
        low: the autocast dtype.
        classes: each node's constants class (``conv_depthwise`` apart).
        captured: each node's dtype code as captured.
        fused: bias adds run inside the preceding convolution or GEMM.
    """
    low_code = _CODE[low]
    nodes = graph.nodes
    n = len(nodes)
    preds = graph.predecessors()
    spec = graph.spec
    # the floating-point inputs, by name: their dtype code and elements of one batch
    float_inputs = {t.name: (_CODE[spec.tensor_dtype(t)], math.prod((spec.batch_size, *t.shape)))
                    for t in spec.tensors if spec.tensor_dtype(t) in _CODE}
    reads = {}  # node -> the floating-point inputs it reads
    for name, consumers in graph.input_consumers.items():
        if name in float_inputs:
            for c in consumers:
                reads.setdefault(c, []).append(float_inputs[name])
    dtype = np.array(captured, dtype=np.int64)
    scale = np.ones(n)
    casts = np.zeros(n)
    cast_bytes = np.zeros(n)
    out_elems = np.array([float(nd.output_elements) for nd in nodes])
    for nd in nodes:
        i = nd.index
        if captured[i] not in _SIZE or nd.is_constant:
            continue
        p_size = _SIZE[int(captured[i])]  # weights keep the model's dtype
        live = [p for p in preds[i] if not nodes[p].is_constant]
        act_codes = [int(dtype[p]) for p in live if dtype[p] in _SIZE]
        act_codes += [c for c, _ in reads.get(i, ())]
        act_elems = sum(math.prod(s) for s, par in zip(nd.input_shapes, nd.input_is_param) if not par)
        par_elems = sum(math.prod(s) for s, par in zip(nd.input_shapes, nd.input_is_param) if par and len(s) > 0)
        if classes[i] in AUTOCAST_LOW_CLASSES or nd.op in AUTOCAST_FP32_OPS:
            code = low_code if classes[i] in AUTOCAST_LOW_CLASSES else 0
            for p in live:
                if dtype[p] in _SIZE and dtype[p] != code:
                    casts[i] += 1
                    cast_bytes[i] += out_elems[p] * (_SIZE[int(dtype[p])] + _SIZE[code])
            for c, elems in reads.get(i, ()):
                if c != code:
                    casts[i] += 1
                    cast_bytes[i] += elems * (_SIZE[c] + _SIZE[code])
            if code == low_code and par_elems and int(captured[i]) != low_code:
                casts[i] += sum(1 for s, par in zip(nd.input_shapes, nd.input_is_param) if par and len(s) > 0)
                cast_bytes[i] += par_elems * (p_size + _SIZE[code])
            # inputs read at the op's dtype (after the casts); weights too for a low-precision op
            new_in = act_elems * _SIZE[code] + par_elems * (_SIZE[code] if code == low_code else p_size)
        else:
            if fused[i] and live:  # a bias add run inside its convolution or GEMM
                code = int(dtype[live[0]])
            elif nd.op_class == "cast":
                code = int(captured[i])
            elif nd.op in _INPUT_DTYPE_OPS or nd.op_class == "view":
                code = act_codes[0] if act_codes else int(captured[i])
            else:  # type promotion: the widest floating-point input, weight tensors included
                cands = act_codes + ([int(captured[i])] if par_elems else [])
                code = max(cands, key=lambda c: _SIZE[c]) if cands else int(captured[i])
            in_w = float(np.mean([_SIZE[c] for c in act_codes])) if act_codes else _SIZE[code]
            new_in = act_elems * in_w + par_elems * p_size
        dtype[i] = code
        old = (act_elems + par_elems + out_elems[i]) * _SIZE[int(captured[i])]
        if old > 0:
            scale[i] = (new_in + out_elems[i] * _SIZE[code]) / old
    return AutocastPlan(dtype=dtype, bytes_scale=scale, casts=casts, cast_bytes=cast_bytes)
