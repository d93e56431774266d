"""Per-node provenance of an exported program through the Relax conversion: the module stack each FX node ran
in (``nn_module_stack``) and whether its ATen operator is in place (``relu_``), keyed by the Relax variable the
node's converter returned (:func:`convert_tagged`). :func:`~dippm_nas.graph.graph_from_relax` gives every
graph node the provenance of the FX node whose converter emitted it.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["convert_tagged", "node_provenance"]

logger = logging.getLogger(__name__)

#: Provenance of one FX node: its module stack (outermost first, the model itself left out) and whether the
#: operator is in place.
Provenance = tuple[tuple[str, ...], bool]


def _inplace(target: Any) -> bool:
    """Whether an ATen operator writes into its first argument (``aten.relu_.default``, ``aten.add_.Tensor``)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    args = list(schema.arguments)
    if not args or args[0].alias_info is None or not args[0].alias_info.is_write:
        return False
    return not any(a.kwarg_only and a.name == "out" for a in args)


def node_provenance(node: Any, strip: int = 0) -> Provenance:
    """The provenance of one FX node of an exported program: the qualified names of the modules of its
    ``nn_module_stack`` (a repeated call of one module suffixed ``@k``, as its key is), the root module and the
    ``strip`` outermost ones after it left out (their path too, from the names of the others); and whether its
    operator is in place."""
    stack = []
    for key, value in (node.meta.get("nn_module_stack") or {}).items():
        path = value[0] if isinstance(value, tuple) and value else str(value)
        if not path:
            continue  # the root module
        at = str(key).rpartition("@")
        stack.append(f"{path}@{at[2]}" if at[1] and at[2].isdigit() else path)
    if strip and len(stack) >= strip:  # the wrapper's own path leaves the names too ("inner.layers.0")
        prefix = stack[strip - 1].partition("@")[0] + "."
        stack = [m[len(prefix):] if m.startswith(prefix) else m for m in stack[strip:]]
    return tuple(stack), _inplace(node.target)


def _importer_class() -> Any:
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    class TaggingImporter(ExportedProgramImporter):  # type: ignore[misc, valid-type]
        """The Relax importer, recording the variable each converter returns against its FX node."""

        tags: dict[Any, Provenance]
        strip: int = 0

        def _translate_fx_graph(self, graph_module: Any, nodes: Any, inputs_vars: dict, custom_ops: Any = None
                                ) -> tuple:
            tags = self.tags

            def wrap(fn: Any) -> Any:
                def tagged(node: Any, *rest: Any) -> Any:
                    out = fn(node, *rest)
                    prov = node_provenance(node, self.strip)
                    for var in out if isinstance(out, (list, tuple)) else (out,):
                        if type(var).__name__ in ("Var", "DataflowVar"):
                            tags.setdefault(var, prov)
                    return out

                return tagged

            self.convert_map = {name: wrap(fn) for name, fn in self.convert_map.items()}
            return super()._translate_fx_graph(graph_module, nodes, inputs_vars, custom_ops)

    return TaggingImporter


def convert_tagged(ep: Any, decompose: bool, custom_convert_map: dict[str, Any] | None, strip: int = 0
                   ) -> tuple[Any, dict[Any, Provenance]]:
    """``from_exported_program(ep, run_ep_decomposition=decompose, custom_convert_map=...)`` and the provenance
    of the variables its converters returned (``{relax.Var: (module stack, in place)}``); ``strip``: outer
    modules to leave out of each stack (a wrapper the capture put around the model)."""
    if decompose:
        ep = ep.run_decompositions()
    importer = _importer_class()()
    importer.tags = {}
    importer.strip = strip
    mod = importer.from_exported_program(ep, False, False, False, custom_convert_map)
    return mod, importer.tags
