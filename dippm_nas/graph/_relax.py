"""Build an :class:`OperatorGraph` from a Relax ``IRModule`` (the output of either Relax frontend).

One node per operator call (``relax.Call`` whose ``op`` is a ``tvm.ir.Op``); ``TupleGetItem``, ``Tuple``
and variable-to-variable bindings are aliases that route edges to the producing node, never nodes.
Weights are Relax constants: they are not nodes, they are the ``input_is_param`` arguments of the
nodes that read them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from dippm_nas.errors import GraphCaptureError
from dippm_nas.graph._formulas import cost_of
from dippm_nas.graph._graph import OperatorGraph, OpNode
from dippm_nas.spec import InputSpec, dtype_bytes

#: ``global_symbol`` prefix of the extern function an opaque op calls (``dippm_nas.opaque.unfold``, made by
#: :func:`dippm_nas.capture._converters.opaque_convert_map`); the graph node is named after what follows it.
OPAQUE_PREFIX = "dippm_nas.opaque."

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
                     source: str = "", model_key: str = "", float_dtype: str | None = None) -> OperatorGraph:
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

    Raises:
        GraphCaptureError: no ``main`` function, symbolic shapes, or an empty graph.
    """
    from tvm import relax
    from tvm.ir import Op, Tuple as RTuple, TupleGetItem

    try:
        func = mod["main"]
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types
        raise GraphCaptureError(f"the Relax module has no 'main' function: {e}") from e

    floats = ("float64", "float32", "float16", "bfloat16")

    def types_of(ty: Any) -> list[tuple[Shape, str]]:
        tt = _tensor_types(ty)
        if float_dtype is None:
            return tt
        return [(s, float_dtype if d in floats else d) for s, d in tt]

    values: dict[Any, list[_Val]] = {}  # Var -> its tensor values (a tuple var has several)
    input_consumers: dict[str, list[int]] = {}
    params = list(func.params)
    names = input_names if input_names is not None and len(input_names) == len(params) else None
    for i, p in enumerate(params):
        name = names[i] if names else str(p.name)
        types = types_of(p.ty)
        values[p] = [_Val(_INPUT, j, s, d, name=name) for j, (s, d) in enumerate(types)]
        input_consumers[name] = []

    const_ids: dict[int, _Val] = {}
    param_count = 0
    param_bytes = 0

    def const_val(c: Any) -> _Val:
        nonlocal param_count, param_bytes
        key = c.value.data_ptr() if hasattr(c.value, "data_ptr") else id(c)
        v = const_ids.get(key)
        if v is None:
            (shape, dt), = types_of(c.ty) or [((), "float32")]
            v = _Val(_CONST, 0, shape, dt, is_param=True, const_id=key)
            const_ids[key] = v
            if len(shape) >= 1:  # scalars made by the converter are not weights
                param_count += math.prod(shape)
                param_bytes += v.nbytes
        return v

    def resolve(expr: Any) -> list[_Val]:
        if isinstance(expr, relax.Var):
            return values.get(expr, [])
        if isinstance(expr, relax.Constant if hasattr(relax, "Constant") else ()):
            return [const_val(expr)]
        if type(expr).__name__ in ("GenericConst", "Constant"):
            return [const_val(expr)]
        if isinstance(expr, RTuple):
            out: list[_Val] = []
            for f in expr.fields:
                out.extend(resolve(f))
            return out
        if isinstance(expr, TupleGetItem):
            vals = resolve(expr.tuple_value)
            idx = int(expr.index)
            return [vals[idx]] if 0 <= idx < len(vals) else []
        return []  # ShapeExpr, PrimValue, StringImm, ...: not tensors

    nodes: list[OpNode] = []
    edges: set[tuple[int, int]] = set()
    node_const: list[bool] = []

    for b in _bindings(func):
        value = b.value
        var = b.var
        if isinstance(value, relax.Call) and isinstance(value.op, Op):
            op = str(value.op.name)
            op = op[6:] if op.startswith("relax.") else op
            if op == "call_dps_packed" and isinstance(value.args[0], relax.ExternFunc):
                symbol = str(value.args[0].global_symbol)
                if symbol.startswith(OPAQUE_PREFIX):  # an op the frontend could not convert, kept by name
                    op = symbol[len(OPAQUE_PREFIX):]
            args: list[_Val] = []
            for a in value.args:
                args.extend(resolve(a))
            out_types = types_of(var.ty)
            idx = len(nodes)
            in_shapes = tuple(a.shape for a in args)
            arg_is_param = tuple(a.is_param or (a.producer >= 0 and node_const[a.producer]) for a in args)
            is_const = all(arg_is_param)
            attrs = _attrs_of(value.attrs)
            out_shapes = tuple(s for s, _ in out_types)
            cost = cost_of(op, in_shapes, out_shapes, attrs)
            attrs.update(cost.derived_attrs)
            if cost.view:
                br = bw = 0
            else:
                br = sum(a.nbytes for a in args)
                bw = sum(math.prod(s) * dtype_bytes(d) if d in _SAFE_DT else math.prod(s) * 4 for s, d in out_types)
            pb = sum(a.nbytes for a, p in zip(args, arg_is_param) if p)
            nodes.append(OpNode(
                index=idx, op=op, op_class=cost.op_class, output_shapes=out_shapes,
                output_dtype=out_types[0][1] if out_types else "void", input_shapes=in_shapes,
                input_is_param=arg_is_param, attrs=attrs, flops=int(cost.flops), macs=int(cost.macs),
                bytes_read=int(br), bytes_written=int(bw), param_bytes=int(pb), is_constant=is_const,
                known=cost.known,
            ))
            node_const.append(is_const)
            for a in args:
                if a.producer >= 0:
                    edges.add((a.producer, idx))
                elif a.producer == _INPUT:
                    lst = input_consumers[a.name]
                    if not lst or lst[-1] != idx:
                        lst.append(idx)
            values[var] = [_Val(idx, j, s, d) for j, (s, d) in enumerate(out_types)]
        else:
            # aliases: TupleGetItem, Tuple, Var, Constant bound to a var
            values[var] = resolve(value)

    outputs: list[int] = []
    for v in resolve(func.body.body):
        if v.producer >= 0 and v.producer not in outputs:
            outputs.append(v.producer)
    if not nodes:
        raise GraphCaptureError("the model has no operator calls (it returns its input unchanged?)")
    graph = OperatorGraph(
        nodes=nodes, edges=sorted(edges), input_consumers=input_consumers, outputs=outputs, spec=spec,
        param_count=int(param_count), param_bytes=int(param_bytes), mode=mode, source=source,
        model_key=model_key,
    )
    return graph


_SAFE_DT = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"})
