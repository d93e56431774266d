"""Build an :class:`OperatorGraph` from a Relax ``IRModule`` (the output of either Relax frontend).

One node per operator call (``relax.Call`` whose ``op`` is a ``tvm.ir.Op``); ``TupleGetItem``, ``Tuple``
and variable-to-variable bindings are aliases that route edges to the producing node, never nodes.
Weights are Relax constants: they are not nodes, they are the ``input_is_param`` arguments of the
nodes that read them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dippm_nas.errors import GraphCaptureError
from dippm_nas.graph._formulas import cost_of
from dippm_nas.graph._graph import OperatorGraph, OpNode
from dippm_nas.spec import InputSpec, dtype_bytes

#: ``global_symbol`` prefix of the extern function an opaque op calls (``dippm_nas.opaque.unfold``, made by
#: :func:`dippm_nas.capture._converters.opaque_convert_map`); the graph node is named after what follows it.
OPAQUE_PREFIX = "dippm_nas.opaque."
#: Name hint of the Relax bindings the capture emits for PyTorch's SDPA math path (q, k, v that are not 4-D:
#: ``dippm_nas.capture``'s converter); their graph nodes carry ``attrs[SDPA_MATH_ATTR] = True``. A name hint
#: ``f"{SDPA_MATH_NAME}_rank{rank}_"`` records the rank of the call's inputs too (``attrs[SDPA_RANK_ATTR] = rank``;
#: Relax appends digits to repeated name hints, after the closing ``_``).
SDPA_MATH_NAME = "dippm_sdpa_math"
#: The :attr:`OpNode.attrs` key marking a node of PyTorch's SDPA math path (``True``; absent elsewhere): the
#: kernels eager PyTorch runs inside ``scaled_dot_product_attention`` for query, key and value that are not 4-D,
#: whose dtype depends on the PyTorch version (float32 from 2.5), not on autocast.
SDPA_MATH_ATTR = "sdpa_math"
#: The :attr:`OpNode.attrs` key giving, on a node of the SDPA math path, the rank of the call's query, key and
#: value (the largest of the three; ``3`` for 3-D inputs, which PyTorch 2.14 on runs on the fused kernels, ``5``
#: and more on the math path in every version); absent on graphs captured before it was recorded (priced as the
#: math path in every version).
SDPA_RANK_ATTR = "sdpa_rank"
_RANK_HINT = re.compile(r"_rank(\d+)_")

__all__ = ["graph_from_relax"]

Shape = tuple[int, ...]

# A "value" flowing through the function: a tensor produced by node ``node`` (output ``index``),
# a model input, or a constant.
_INPUT = -1
_CONST = -2


class _Val:
    __slots__ = ("producer", "index", "shape", "dtype", "name", "is_param", "const_id")

    def __init__(self, producer: int, index: int, shape: Shape, dtype: str, name: str = "",
                 is_param: bool = False, const_id: int = 0) -> None:
        self.producer = producer
        self.index = index
        self.shape = shape
        self.dtype = dtype
        self.name = name
        self.is_param = is_param
        self.const_id = const_id

    @property
    def nbytes(self) -> int:
        try:
            return math.prod(self.shape) * dtype_bytes(self.dtype)
        except Exception:
            return math.prod(self.shape) * 4


def _tensor_types(ty: Any) -> list[tuple[Shape, str]]:
    """Flatten a Relax type into ``[(shape, dtype)]`` of its tensors."""
    from tvm import relax
    from tvm.ir import TupleType

    if isinstance(ty, relax.TensorType):
        if ty.shape is None:
            raise GraphCaptureError(f"tensor type {ty} has an unknown shape: dynamic shapes are not supported")
        try:
            shape = tuple(int(d) for d in ty.shape)
        except (TypeError, ValueError) as e:
            raise GraphCaptureError(
                f"tensor type {ty} has a symbolic shape; capture needs static shapes (fixed batch and sizes)"
            ) from e
        return [(shape, str(ty.dtype))]
    if isinstance(ty, TupleType):
        out: list[tuple[Shape, str]] = []
        for f in ty.fields:
            out.extend(_tensor_types(f))
        return out
    return []


_ATTR_FIELDS: dict[type, tuple[str, ...]] = {}


def _to_json(v: Any) -> Any:
    """FFI attribute value -> plain JSON value (lists, ints, floats, strs, None)."""
    if v is None or type(v) in (bool, int, str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, str):  # tvm_ffi String / dtype subclass str
        return str(v)
    if isinstance(v, Sequence):  # tvm_ffi Array
        return [_to_json(x) for x in v]
    val = getattr(v, "value", None)  # IntImm, FloatImm, PrimValue
    if isinstance(val, (bool, int, float)):
        return _to_json(val)
    return str(v)


def _attrs_of(attrs: Any) -> dict[str, Any]:
    if attrs is None:
        return {}
    cls = type(attrs)
    names = _ATTR_FIELDS.get(cls)
    if names is None:
        info = getattr(cls, "__tvm_ffi_type_info__", None)
        names = tuple(f.name for f in info.fields) if info is not None else ()
        _ATTR_FIELDS[cls] = names
    return {n: _to_json(getattr(attrs, n)) for n in names}


def _bindings(func: Any) -> Iterator[Any]:
    body = func.body
    for block in body.blocks:
        yield from block.bindings


def graph_from_relax(mod: Any, spec: InputSpec, *, mode: str, input_names: list[str] | None = None,
                     source: str = "", model_key: str = "", float_dtype: str | None = None,
                     provenance: Mapping[Any, tuple[tuple[str, ...], bool]] | None = None) -> OperatorGraph:
    """Turn the ``main`` function of a Relax module into an :class:`OperatorGraph`.

    Args:
        mod: ``tvm.IRModule`` from ``from_exported_program`` or ``from_onnx``.
        spec: the input spec the module was made with.
        mode: ``"export"``, ``"export+decompose"``, ``"export+opaque"`` or ``"onnx"``.
        input_names: names to give the function parameters, in order (default: the Relax names).
        source: description of the model.
        model_key: the pre-export key, if any.
        float_dtype: when given, every floating-point tensor (activations and weights) is re-typed to
            this dtype: how a float32 export represents the model cast to half precision.
        provenance: ``{relax.Var: (module stack, in place)}`` of the variables the converters of an exported
            program's FX nodes returned (:func:`dippm_nas.capture`'s conversion records them): each node gets
            the provenance of its variable, or of the next one that has it (the bindings a converter emits
            before the one it returns), as :attr:`OpNode.module_stack` and :attr:`OpNode.inplace`, the in-place
            flag on the returned variable's node only; ``None``: no provenance.

    Raises:
        GraphCaptureError: no ``main`` function, symbolic shapes, or an empty graph.
    """
    from tvm import relax
    from tvm.ir import Op

    try:
        func = mod["main"]
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types
        raise GraphCaptureError(f"the Relax module has no 'main' function: {e}") from e

    walk = _Walk(float_dtype)
    walk.add_params(list(func.params), input_names)
    own: dict[int, tuple[tuple[str, ...], bool]] = {}  # node -> the provenance of the variable it makes
    for b in _bindings(func):
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, Op):
            walk.add_call(b.var, b.value)
            tag = provenance.get(b.var) if provenance is not None else None
            if tag is not None:
                own[len(walk.nodes) - 1] = tag
        else:
            # aliases: TupleGetItem, Tuple, Var, Constant bound to a var
            walk.values[b.var] = walk.resolve(b.value)
            tag = provenance.get(b.var) if provenance is not None else None
            if tag is not None:  # a converter returned an alias (batch norm's first output): its producer's
                for v in walk.values[b.var]:
                    if v.producer >= 0 and v.producer not in own:
                        own[v.producer] = tag

    outputs: list[int] = []
    for v in walk.resolve(func.body.body):
        if v.producer >= 0 and v.producer not in outputs:
            outputs.append(v.producer)
    if not walk.nodes:
        raise GraphCaptureError("the model has no operator calls (it returns its input unchanged?)")
    if own:
        _tag_nodes(walk.nodes, own)
    return OperatorGraph(
        nodes=walk.nodes, edges=sorted(walk.edges), input_consumers=walk.input_consumers, outputs=outputs, spec=spec,
        param_count=int(walk.param_count), param_bytes=int(walk.param_bytes), mode=mode, source=source,
        model_key=model_key,
    )


_FLOATS = ("float64", "float32", "float16", "bfloat16")


def _tag_nodes(nodes: list[OpNode], own: Mapping[int, tuple[tuple[str, ...], bool]]) -> None:
    """Set each node's provenance (see :func:`graph_from_relax`), in place on the freshly built nodes: its own,
    else the next node's that has one (else the last one's)."""
    following = own[max(own)]
    for i in range(len(nodes) - 1, -1, -1):
        tag = own.get(i)
        if tag is not None:
            following = tag
        nodes[i].__dict__.update(module_stack=following[0], inplace=bool(tag[1]) if tag is not None else False)


class _Walk:
    """One pass over the bindings of a Relax function: the tensor values of each variable, the operator nodes
    and edges made so far, the weights met (each constant counted once) and the consumers of each input.

    Args:
        float_dtype: when given, the dtype every floating-point tensor is re-typed to.
    """

    def __init__(self, float_dtype: str | None) -> None:
        from tvm import relax
        from tvm.ir import Tuple as RTuple, TupleGetItem

        self._relax, self._tuple, self._get_item = relax, RTuple, TupleGetItem
        self.float_dtype = float_dtype
        self.values: dict[Any, list[_Val]] = {}  # Var -> its tensor values (a tuple var has several)
        self.input_consumers: dict[str, list[int]] = {}
        self.const_ids: dict[int, _Val] = {}
        self.param_count = 0
        self.param_bytes = 0
        self.nodes: list[OpNode] = []
        self.edges: set[tuple[int, int]] = set()
        self.node_const: list[bool] = []

    def types_of(self, ty: Any) -> list[tuple[Shape, str]]:
        tt = _tensor_types(ty)
        if self.float_dtype is None:
            return tt
        return [(s, self.float_dtype if d in _FLOATS else d) for s, d in tt]

    def add_params(self, params: list[Any], input_names: list[str] | None) -> None:
        """The function's parameters as the graph's inputs, named ``input_names`` when there is one per parameter."""
        names = input_names if input_names is not None and len(input_names) == len(params) else None
        for i, p in enumerate(params):
            name = names[i] if names else str(p.name)
            self.values[p] = [_Val(_INPUT, j, s, d, name=name) for j, (s, d) in enumerate(self.types_of(p.ty))]
            self.input_consumers[name] = []

    def const_val(self, c: Any) -> _Val:
        key = c.value.data_ptr() if hasattr(c.value, "data_ptr") else id(c)
        v = self.const_ids.get(key)
        if v is None:
            (shape, dt), = self.types_of(c.ty) or [((), "float32")]
            v = _Val(_CONST, 0, shape, dt, is_param=True, const_id=key)
            self.const_ids[key] = v
            if len(shape) >= 1:  # scalars made by the converter are not weights
                self.param_count += math.prod(shape)
                self.param_bytes += v.nbytes
        return v

    def resolve(self, expr: Any) -> list[_Val]:
        """The tensor values an expression stands for (none for shapes, strings and other non-tensors)."""
        relax = self._relax
        if isinstance(expr, relax.Var):
            return self.values.get(expr, [])
        if isinstance(expr, relax.Constant if hasattr(relax, "Constant") else ()):
            return [self.const_val(expr)]
        if type(expr).__name__ in ("GenericConst", "Constant"):
            return [self.const_val(expr)]
        if isinstance(expr, self._tuple):
            out: list[_Val] = []
            for f in expr.fields:
                out.extend(self.resolve(f))
            return out
        if isinstance(expr, self._get_item):
            vals = self.resolve(expr.tuple_value)
            idx = int(expr.index)
            return [vals[idx]] if 0 <= idx < len(vals) else []
        return []  # ShapeExpr, PrimValue, StringImm, ...: not tensors

    def _op_name(self, value: Any) -> str:
        op = str(value.op.name)
        op = op[6:] if op.startswith("relax.") else op
        if op == "call_dps_packed" and isinstance(value.args[0], self._relax.ExternFunc):
            symbol = str(value.args[0].global_symbol)
            if symbol.startswith(OPAQUE_PREFIX):  # an op the frontend could not convert, kept by name
                op = symbol[len(OPAQUE_PREFIX):]
        return op

    def add_call(self, var: Any, value: Any) -> None:
        """An operator call bound to ``var``: its node (costs from :func:`cost_of`), its edges and input uses."""
        op = self._op_name(value)
        args: list[_Val] = []
        for a in value.args:
            args.extend(self.resolve(a))
        out_types = self.types_of(var.ty)
        idx = len(self.nodes)
        in_shapes = tuple(a.shape for a in args)
        arg_is_param = tuple(a.is_param or (a.producer >= 0 and self.node_const[a.producer]) for a in args)
        is_const = all(arg_is_param)
        attrs = _attrs_of(value.attrs)
        out_shapes = tuple(s for s, _ in out_types)
        cost = cost_of(op, in_shapes, out_shapes, attrs)
        attrs.update(cost.derived_attrs)
        hint = str(getattr(var, "name", None) or getattr(var, "name_hint", ""))
        if hint.startswith(SDPA_MATH_NAME):
            attrs[SDPA_MATH_ATTR] = True
            rank = _RANK_HINT.match(hint[len(SDPA_MATH_NAME):])
            if rank:
                attrs[SDPA_RANK_ATTR] = int(rank.group(1))
        if cost.view:
            br = bw = 0
        else:
            br = sum(a.nbytes for a in args)
            bw = sum(math.prod(s) * dtype_bytes(d) if d in _SAFE_DT else math.prod(s) * 4 for s, d in out_types)
        pb = sum(a.nbytes for a, p in zip(args, arg_is_param) if p)
        self.nodes.append(OpNode(
            index=idx, op=op, op_class=cost.op_class, output_shapes=out_shapes,
            output_dtype=out_types[0][1] if out_types else "void", input_shapes=in_shapes,
            input_is_param=arg_is_param, attrs=attrs, flops=int(cost.flops), macs=int(cost.macs),
            bytes_read=int(br), bytes_written=int(bw), param_bytes=int(pb), is_constant=is_const,
            known=cost.known,
        ))
        self.node_const.append(is_const)
        for a in args:
            if a.producer >= 0:
                self.edges.add((a.producer, idx))
            elif a.producer == _INPUT:
                lst = self.input_consumers[a.name]
                if not lst or lst[-1] != idx:
                    lst.append(idx)
        self.values[var] = [_Val(idx, j, s, d) for j, (s, d) in enumerate(out_types)]


_SAFE_DT = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"})
