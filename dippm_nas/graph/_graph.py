"""The operator graph: one node per Relax operator call, edges along the real dataflow."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dippm_nas._json import loads_json
from dippm_nas._optional import require
from dippm_nas.errors import GraphValidationError
from dippm_nas.spec import InputSpec

if TYPE_CHECKING:  # pragma: no cover
    from torch_geometric.data import Data

__all__ = ["OpNode", "StaticFeatures", "OperatorGraph", "GRAPH_FORMAT_VERSION", "READABLE_GRAPH_FORMATS",
           "STRUCTURAL_HASH_VERSION"]

#: Bumped whenever the JSON layout or the meaning of a node field changes; part of every cache key. Version 2
#: added each node's optional provenance (``"ms"``: its module stack, ``"ip"``: whether the exported operator
#: ran in place); a version-1 graph reads as one without provenance.
GRAPH_FORMAT_VERSION = 2
#: The ``format_version`` values :meth:`OperatorGraph.from_dict` reads.
READABLE_GRAPH_FORMATS = (1, 2)
#: The layout of :meth:`OperatorGraph.structural_hash`'s payload; provenance does not enter it, so a graph's
#: hash is the same in format 1 and 2.
STRUCTURAL_HASH_VERSION = 1

Shape = tuple[int, ...]


@dataclass(frozen=True)
class OpNode:
    """One operator call of the Relax graph.

    Attributes:
        index: position in execution (topological) order, ``0..num_nodes-1``.
        op: Relax operator name without the ``relax.`` prefix, e.g. ``"nn.conv2d"``, ``"matmul"``, ``"add"``.
        op_class: coarse class used by formulas and encoders: ``conv``, ``matmul``, ``attention``,
            ``elementwise``, ``activation``, ``normalization``, ``pool``, ``reduction``, ``softmax``,
            ``view``, ``memory`` (copies, concat, transpose…), ``gather``, ``cast`` or ``unknown``.
        output_shapes: shape of each output (most ops have one; batch_norm has three).
        output_dtype: dtype of the (first) output.
        input_shapes: shape of each tensor argument, in argument order (activations and weights).
        input_is_param: per tensor argument, whether it is a weight/constant (or derived only from constants).
        attrs: operator attributes as JSON values (conv strides/padding/dilation/groups/kernel, matmul m/n/k, ...).
        flops: floating-point operations of the node (a multiply-add counts 2).
        macs: multiply-accumulates of contraction ops (conv, matmul, attention); 0 for the others.
        bytes_read: bytes of every tensor argument read once.
        bytes_written: bytes of every output written once (0 for views, which move no data).
        param_bytes: bytes of the arguments that are weights.
        is_constant: every input is a weight, so a framework folds this node ahead of time (e.g. a
            weight transpose); it is kept in the graph but costs nothing at run time.
        known: whether dippm-nas has a formula for this op; unknown ops carry generic estimates
            (one flop per output element) and are counted in :attr:`OperatorGraph.unknown_ops`.
        module_stack: provenance: the modules whose call the exported operator ran in, outermost first, each
            its qualified name in the model (``"blocks.0.conv"``; a second call of one module ``"act@1"``), the
            model itself left out (``()``: called by the model's own ``forward``); ``None`` where the graph does
            not carry provenance (format 1, ONNX, assembled or analytic graphs).
        inplace: provenance: whether the exported operator this node comes from ran in place (``aten.relu_``,
            ``aten.add_``); ``None`` where unknown.
    """

    index: int
    op: str
    op_class: str
    output_shapes: tuple[Shape, ...]
    output_dtype: str
    input_shapes: tuple[Shape, ...]
    input_is_param: tuple[bool, ...]
    attrs: Mapping[str, Any]
    flops: int
    macs: int
    bytes_read: int
    bytes_written: int
    param_bytes: int
    is_constant: bool = False
    known: bool = True
    module_stack: tuple[str, ...] | None = None
    inplace: bool | None = None

    @property
    def output_shape(self) -> Shape:
        """Shape of the first output."""
        return self.output_shapes[0] if self.output_shapes else ()

    @property
    def output_elements(self) -> int:
        """Elements of all outputs."""
        return sum(math.prod(s) for s in self.output_shapes)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "i": self.index, "op": self.op, "cls": self.op_class,
            "out": [list(s) for s in self.output_shapes], "dt": self.output_dtype,
            "in": [list(s) for s in self.input_shapes], "par": [int(b) for b in self.input_is_param],
            "attrs": dict(self.attrs), "flops": self.flops, "macs": self.macs,
            "br": self.bytes_read, "bw": self.bytes_written, "pb": self.param_bytes,
            "const": int(self.is_constant), "known": int(self.known),
        }
        if self.module_stack is not None:
            d["ms"] = list(self.module_stack)
        if self.inplace is not None:
            d["ip"] = int(self.inplace)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OpNode":
        # Fast path: this runs for every node of every cached graph, and the frozen dataclass
        # __init__ (one object.__setattr__ per field) costs several microseconds per node.
        node = object.__new__(cls)
        node.__dict__.update(
            index=d["i"], op=d["op"], op_class=d["cls"],
            output_shapes=tuple(map(tuple, d["out"])), output_dtype=d["dt"],
            input_shapes=tuple(map(tuple, d["in"])), input_is_param=tuple(map(bool, d["par"])),
            attrs=d["attrs"], flops=d["flops"], macs=d["macs"], bytes_read=d["br"], bytes_written=d["bw"],
            param_bytes=d["pb"], is_constant=bool(d["const"]), known=bool(d["known"]),
            module_stack=_module_stack(d.get("ms")), inplace=None if d.get("ip") is None else bool(d["ip"]),
        )
        return node


def _module_stack(value: Any) -> tuple[str, ...] | None:
    """A node's ``"ms"`` field as a tuple of module names (``None`` when absent)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise GraphValidationError(f"a node's module stack (\"ms\") must be a list of module names, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class StaticFeatures:
    """Graph-level features: DIPPM's five plus ours (units in the names)."""

    total_macs: int
    batch_size: int
    num_conv: int
    num_dense: int
    num_relu: int
    param_count: int
    param_bytes: int
    activation_bytes: int
    depth: int
    total_flops: int

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class OperatorGraph:
    """A captured model: operator nodes in execution order and producer→consumer edges.

    Attributes:
        nodes: operator calls, ``nodes[i].index == i``, in a valid topological (execution) order.
        edges: ``(producer, consumer)`` node indices, one per tensor use (a residual add has two
            in-edges); sorted, without duplicates.
        input_consumers: for each model input name, the nodes that read it.
        outputs: indices of the nodes whose results the model returns.
        spec: the :class:`InputSpec` the model was captured with.
        param_count: elements of all weight tensors (parameters and buffers), each counted once.
        param_bytes: bytes of those tensors.
        mode: how the graph was made: ``"export"`` (``run_ep_decomposition=False``), ``"export+decompose"``
            (the decomposing fallback), ``"export+opaque"`` (ops neither mode converts kept as opaque,
            unknown nodes), ``"onnx"``, or ``"analytic"`` (built from a model's numbers, not captured: the
            prefill and decode graphs of :mod:`dippm_nas.llm`).
        source: a short description of the model (class name, SPEC string or file name).
        convert_seconds: wall time of export + conversion + graph build when it was captured.
        model_key: the pre-export key of the model definition (or of the ONNX file's bytes).
        cache_hit: whether this object came from the conversion cache (not serialised).
        timings: seconds spent per capture stage, ``export_s``, ``convert_s``, ``build_s`` (not serialised).
    """

    nodes: list[OpNode]
    edges: list[tuple[int, int]]
    input_consumers: dict[str, list[int]]
    outputs: list[int]
    spec: InputSpec
    param_count: int
    param_bytes: int
    mode: str
    source: str = ""
    convert_seconds: float = 0.0
    model_key: str = ""
    cache_hit: bool = field(default=False, compare=False)
    timings: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    _hash: str | None = field(default=None, repr=False, compare=False)
    _provenance_hash: str | None = field(default=None, repr=False, compare=False)
    _columns: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    _column_parts: tuple[Any, ...] | None = field(default=None, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ basics
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    @property
    def total_flops(self) -> int:
        """FLOPs of one forward pass (constant-folded nodes excluded)."""
        return sum(n.flops for n in self.nodes if not n.is_constant)

    @property
    def total_macs(self) -> int:
        """Multiply-accumulates of the contraction ops (constant-folded nodes excluded)."""
        return sum(n.macs for n in self.nodes if not n.is_constant)

    @property
    def unknown_ops(self) -> dict[str, int]:
        """``{op: count}`` of nodes without a formula (generic estimates)."""
        out: dict[str, int] = {}
        for n in self.nodes:
            if not n.known:
                out[n.op] = out.get(n.op, 0) + 1
        return out

    def op_histogram(self) -> dict[str, int]:
        """``{op: count}``, most frequent first."""
        h: dict[str, int] = {}
        for n in self.nodes:
            h[n.op] = h.get(n.op, 0) + 1
        return dict(sorted(h.items(), key=lambda kv: (-kv[1], kv[0])))

    def predecessors(self) -> list[list[int]]:
        """For each node, the producer indices of its inputs (from :attr:`edges`)."""
        preds: list[list[int]] = [[] for _ in self.nodes]
        for s, d in self.edges:
            preds[d].append(s)
        return preds

    def successors(self) -> list[list[int]]:
        """For each node, its consumer indices."""
        succ: list[list[int]] = [[] for _ in self.nodes]
        for s, d in self.edges:
            succ[s].append(d)
        return succ

    def depth(self) -> int:
        """Length (in nodes) of the longest path, ignoring constant-folded nodes."""
        level = [0] * self.num_nodes
        preds = self.predecessors()
        best = 0
        for n in self.nodes:
            deepest = 0
            for p in preds[n.index]:
                if level[p] > deepest:
                    deepest = level[p]
            level[n.index] = v = deepest + (0 if n.is_constant else 1)
            if v > best:
                best = v
        return best

    def static_features(self) -> StaticFeatures:
        """DIPPM's five static features (MACs, batch, #conv, #dense, #relu) plus params, activations, depth."""
        num_conv = num_dense = num_relu = 0
        act = 0
        for n in self.nodes:
            if n.op_class == "conv":
                num_conv += 1
            elif n.op_class == "matmul":
                num_dense += 1
            if n.op == "nn.relu":
                num_relu += 1
            if not n.is_constant:
                act += n.bytes_written
        return StaticFeatures(
            total_macs=self.total_macs, batch_size=self.spec.batch_size, num_conv=num_conv,
            num_dense=num_dense, num_relu=num_relu, param_count=self.param_count,
            param_bytes=self.param_bytes, activation_bytes=act, depth=self.depth(),
            total_flops=self.total_flops,
        )

    # --------------------------------------------------------------- validate
    def validate(self) -> "OperatorGraph":
        """Check the invariants every consumer relies on; return ``self``.

        A graph that passed is not checked again while its node, edge, output and input lists are the same
        objects of the same lengths (as :meth:`structural_hash` is kept: a graph is not edited in place once
        built).

        Raises:
            GraphValidationError: naming the first broken rule and the offending node or edge.
        """
        if self._passed():
            return self
        n = self.num_nodes
        if n == 0:
            raise GraphValidationError("an OperatorGraph must have at least one node, got 0")
        if not self._valid_at_a_glance():  # some rule is broken: find and name the first one
            self._validate_nodes_and_edges()
        for name, consumers in self.input_consumers.items():
            bad = [c for c in consumers if not 0 <= c < n]
            if bad:
                raise GraphValidationError(f"input {name!r} feeds nodes {bad} outside the {n} nodes")
        bad_out = [o for o in self.outputs if not 0 <= o < n]
        if bad_out or not self.outputs:
            raise GraphValidationError(f"outputs must be a non-empty list of node indices < {n}, got {self.outputs}")
        self.mark_valid()
        return self

    def mark_valid(self, *, structural_hash: str | None = None) -> None:
        """Record that the graph, as its lists are now, keeps the rules of :meth:`validate`, so the next
        :meth:`validate` returns at once (called by :meth:`validate`, and by a builder whose graphs keep the rules
        by construction: the block assembler). A graph whose lists are replaced or change length afterwards is
        checked again.

        Args:
            structural_hash: the graph's :meth:`structural_hash`, when the builder computed it another way (the
                block assembler, from its blocks' fragments, checked against :meth:`structural_hash` once per
                process); ``None`` leaves it to be computed on first use.
        """
        if structural_hash is not None:
            self._hash = structural_hash
        parts = (self.nodes, self.edges, self.outputs, self.input_consumers)
        self.__dict__["_valid_as"] = (parts, tuple(map(len, parts)))

    def _passed(self) -> bool:
        """Whether :meth:`mark_valid` saw these very lists, of these lengths."""
        seen = self.__dict__.get("_valid_as")
        if seen is None:
            return False
        parts = (self.nodes, self.edges, self.outputs, self.input_consumers)
        return all(a is b for a, b in zip(seen[0], parts)) and seen[1] == tuple(map(len, parts))

    def _valid_at_a_glance(self) -> bool:
        """The node and edge rules of :meth:`validate` checked in bulk: ``True`` when none is broken (a
        ``False`` leaves naming the first broken rule to :meth:`_validate_nodes_and_edges`)."""
        nodes, n = self.nodes, self.num_nodes
        if [nd.index for nd in nodes] != list(range(n)):
            return False
        if any(len(nd.input_shapes) != len(nd.input_is_param) for nd in nodes):
            return False
        counts = [v for nd in nodes for v in (nd.flops, nd.macs, nd.bytes_read, nd.bytes_written, nd.param_bytes)]
        if set(map(type, counts)) != {int} or min(counts) < 0:
            return False
        dims = [d for nd in nodes for s in (*nd.output_shapes, *nd.input_shapes) for d in s]
        if dims and (set(map(type, dims)) != {int} or min(dims) < 0):
            return False
        try:
            return all(0 <= s < d < n for s, d in self.edges) and len(set(self.edges)) == len(self.edges)
        except (TypeError, ValueError):
            return False

    def _validate_nodes_and_edges(self) -> None:
        """The node and edge rules of :meth:`validate`, one node and edge at a time (raises on the first)."""
        n = self.num_nodes
        for i, node in enumerate(self.nodes):
            if node.index != i:
                raise GraphValidationError(f"nodes[{i}].index must be {i}, got {node.index} (op {node.op})")
            if len(node.input_shapes) != len(node.input_is_param):
                raise GraphValidationError(
                    f"node {i} ({node.op}): input_shapes and input_is_param must have equal length, "
                    f"got {len(node.input_shapes)} and {len(node.input_is_param)}"
                )
            for name in ("flops", "macs", "bytes_read", "bytes_written", "param_bytes"):
                v = getattr(node, name)
                if not isinstance(v, int) or v < 0:
                    raise GraphValidationError(f"node {i} ({node.op}): {name} must be an int >= 0, got {v!r}")
            dims = [d for s in (*node.output_shapes, *node.input_shapes) for d in s]
            if dims and not (set(map(type, dims)) == {int} and min(dims) >= 0):  # else: find the bad shape
                for s in (*node.output_shapes, *node.input_shapes):
                    if any((not isinstance(d, int)) or d < 0 for d in s):
                        raise GraphValidationError(f"node {i} ({node.op}): shapes must be ints >= 0, got {s!r}")
        seen = set()
        for e in self.edges:
            s, d = e
            if not (0 <= s < n and 0 <= d < n):
                raise GraphValidationError(f"edge {e} points outside the {n} nodes")
            if s >= d:
                raise GraphValidationError(
                    f"edge {e} goes backwards: producers must precede consumers in execution order"
                )
            if e in seen:
                raise GraphValidationError(f"edge {e} appears twice")
            seen.add(e)

    # ------------------------------------------------------------ fingerprint
    def structural_hash(self) -> str:
        """SHA-256 of the structure: ops, attributes, shapes, dtypes and edges; weights excluded.

        Two instances of one architecture captured with one InputSpec share it; timing, source, conversion
        mode and the nodes' provenance (:attr:`OpNode.module_stack`, :attr:`OpNode.inplace`) do not enter it.
        """
        if self._hash is None:
            payload = {
                "v": STRUCTURAL_HASH_VERSION,
                "nodes": [
                    [n.op, [list(s) for s in n.output_shapes], n.output_dtype, [list(s) for s in n.input_shapes],
                     [int(b) for b in n.input_is_param], dict(n.attrs)]
                    for n in self.nodes
                ],
                "edges": self.edges,
                "inputs": {k: sorted(v) for k, v in sorted(self.input_consumers.items())},
                "outputs": self.outputs,
            }
            blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
            self._hash = hashlib.sha256(blob).hexdigest()
        return self._hash

    # ---------------------------------------------------------------- serialise
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (no pickle anywhere); :meth:`from_dict` is its inverse."""
        return {
            "format_version": GRAPH_FORMAT_VERSION,
            "nodes": [n.to_dict() for n in self.nodes],
            "edges": [list(e) for e in self.edges],
            "input_consumers": self.input_consumers,
            "outputs": self.outputs,
            "spec": self.spec.to_dict(),
            "param_count": self.param_count,
            "param_bytes": self.param_bytes,
            "mode": self.mode,
            "source": self.source,
            "convert_seconds": self.convert_seconds,
            "model_key": self.model_key,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OperatorGraph":
        if d.get("format_version") not in READABLE_GRAPH_FORMATS:
            raise GraphValidationError(
                f"graph format_version must be one of {READABLE_GRAPH_FORMATS}, got {d.get('format_version')!r}"
            )
        return cls(
            nodes=[OpNode.from_dict(n) for n in d["nodes"]],
            edges=[(int(s), int(t)) for s, t in d["edges"]],
            input_consumers={k: list(v) for k, v in d["input_consumers"].items()},
            outputs=list(d["outputs"]),
            spec=InputSpec.from_dict(d["spec"]),
            param_count=int(d["param_count"]),
            param_bytes=int(d["param_bytes"]),
            mode=d["mode"],
            source=d.get("source", ""),
            convert_seconds=float(d.get("convert_seconds", 0.0)),
            model_key=d.get("model_key", ""),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> "OperatorGraph":
        """Inverse of :meth:`to_json` (read as :func:`~dippm_nas._json.loads_json` does: nested at most
        :data:`~dippm_nas._json.MAX_JSON_DEPTH` levels).

        Raises:
            GraphValidationError: the text is not JSON or nests deeper than that.
        """
        return cls.from_dict(loads_json(text, "graph JSON", GraphValidationError))

    # --------------------------------------------------------------- to PyG
    def to_pyg(self) -> "Data":
        """A ``torch_geometric.data.Data`` (``pip install 'dippm-nas[pyg]'``) with the dataflow ``edge_index`` and per-node numeric fields.

        Op encodings (one-hot, attributes) are the job of :mod:`dippm_nas.features`; this gives the
        structure plus raw per-node quantities.

        Shapes:
            - ``edge_index``: ``[2, num_edges]`` (int64)
            - ``flops``, ``macs``, ``bytes_read``, ``bytes_written``, ``param_bytes``: ``[num_nodes]`` (float64)
            - ``is_constant``, ``known``: ``[num_nodes]`` (bool)
            - ``op``: list of ``num_nodes`` op names

        Raises:
            MissingDependencyError: torch-geometric is not installed.
        """
        import torch

        Data = require("torch_geometric.data", "pyg", "OperatorGraph.to_pyg()").Data
        ei = torch.tensor(self.edges, dtype=torch.long).reshape(-1, 2).t().contiguous()

        def col(name: str, dtype: "torch.dtype" = torch.float64) -> "torch.Tensor":
            return torch.tensor([getattr(n, name) for n in self.nodes], dtype=dtype)

        return Data(
            edge_index=ei, num_nodes=self.num_nodes,
            flops=col("flops"), macs=col("macs"), bytes_read=col("bytes_read"),
            bytes_written=col("bytes_written"), param_bytes=col("param_bytes"),
            is_constant=col("is_constant", torch.bool), known=col("known", torch.bool),
            op=[n.op for n in self.nodes],
        )

    @property
    def has_provenance(self) -> bool:
        """Whether the nodes carry provenance (:attr:`OpNode.module_stack`): graphs captured from a PyTorch
        module in graph format 2; the memory prior's eager-liveness rules use it where present."""
        return self.provenance_digest() is not None

    def provenance_digest(self) -> str | None:
        """SHA-256 of the nodes' provenance (:attr:`OpNode.module_stack`, :attr:`OpNode.inplace`), ``None`` for a
        graph without any: what, besides :meth:`structural_hash`, a result computed from provenance depends on
        (two captures of one structure from differently nested modules differ here). Computed once per graph,
        as :meth:`structural_hash` is."""
        if self._provenance_hash is None:
            if all(nd.module_stack is None for nd in self.nodes):
                self._provenance_hash = ""
            else:
                blob = json.dumps([[nd.module_stack, nd.inplace] for nd in self.nodes],
                                  separators=(",", ":")).encode()
                self._provenance_hash = hashlib.sha256(blob).hexdigest()
        return self._provenance_hash or None

    def summary(self) -> dict[str, Any]:
        """The figures ``dippm-nas inspect`` prints."""
        return {
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "gflops": self.total_flops / 1e9,
            "gmacs": self.total_macs / 1e9,
            "params": self.param_count,
            "ops": self.op_histogram(),
            "mode": self.mode,
            "unknown_ops": self.unknown_ops,
        }


def _edges_sorted(edges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(set(edges))
