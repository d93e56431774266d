"""Eager liveness from the graph's provenance (:attr:`~dippm_nas.graph.OpNode.module_stack`,
:attr:`~dippm_nas.graph.OpNode.inplace`), where a graph carries it (captured from a PyTorch module, graph
format 2):

- a module's argument lives until the module returns: ``nn.Module.__call__`` holds its positional arguments
  for the whole call (``_call_impl(*args)``), and so does the caller's frame (``x = self.stem(x);
  x = self.stages(x)`` keeps the stem's output until ``stages`` returns); a tensor a node reads is the argument
  of the outermost module call of the node's stack that the tensor's producer is not in, and lives until that
  call's last node;
- an activation is in place only where the exported operator was (``relu_``, not ``relu``), sharing its one
  activation input's storage.
"""

from __future__ import annotations

from collections.abc import Sequence

from dippm_nas.graph import OpNode

__all__ = ["module_argument_rule", "provenance_inplace"]


def _call_spans(nodes: "Sequence[OpNode]") -> dict[str, int]:
    """The last node of each module call (a name of any node's stack)."""
    last: dict[str, int] = {}
    for i, nd in enumerate(nodes):
        for call in nd.module_stack or ():
            last[call] = i
    return last


def module_argument_rule(nodes: "Sequence[OpNode]", preds: list[list[int]]) -> list[tuple[int, int]]:
    """``(producer, until)``: each tensor read inside a module call it was not made in lives until the call's
    last node (the module docstring's first rule)."""
    last = _call_spans(nodes)
    out = []
    for i, nd in enumerate(nodes):
        stack = nd.module_stack
        if not stack or nd.is_constant:
            continue
        for p in preds[i]:
            if nodes[p].is_constant:
                continue
            outer = nodes[p].module_stack or ()
            k = 0
            while k < len(stack) and k < len(outer) and stack[k] == outer[k]:
                k += 1
            if k < len(stack) and last[stack[k]] > i:
                out.append((p, last[stack[k]]))
    return out


def provenance_inplace(nodes: "Sequence[OpNode]", preds: list[list[int]], outputs: "set[int]") -> list[int]:
    """The nodes whose exported operator ran in place on their one activation input (the module docstring's
    second rule): they share that input's storage."""
    out = []
    for i, nd in enumerate(nodes):
        if not nd.inplace or nd.is_constant:
            continue
        live = [p for p in preds[i] if not nodes[p].is_constant]
        if len(live) == 1 and live[0] not in outputs:
            out.append(i)
    return out
