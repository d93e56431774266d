"""The non-eager runtimes of a measurement: :class:`RuntimeModule` (``torch.compile`` or a CUDA graph)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from dippm_nas.errors import ExecutionRuntimeError

__all__ = ["RuntimeModule", "RUNTIME_NAMES"]

#: Runtimes :class:`RuntimeModule` builds.
RUNTIME_NAMES: tuple[str, ...] = ("cuda-graphs", "compiled")


class RuntimeModule(torch.nn.Module):
    """Runs ``model`` compiled (``"compiled"``: ``torch.compile`` with its defaults) or as a captured CUDA
    graph (``"cuda-graphs"``), built on the first call.

    Built lazily so a measurer's ``copy.deepcopy`` / ``.to(dtype)`` / ``.to(device)`` act on the plain model:
    the first forward (a warm-up one) compiles it or captures the graph on the device it now lives on.
    A CUDA graph is captured after three warm-up passes on a side stream; a later call copies new input
    tensors into the captured ones (when they are other tensors) and replays it, returning the captured
    output tensors.

    Args:
        model: the model to run.
        runtime: one of :data:`RUNTIME_NAMES`.
    """

    def __init__(self, model: torch.nn.Module, runtime: str) -> None:
        super().__init__()
        if runtime not in RUNTIME_NAMES:
            raise ExecutionRuntimeError(f"runtime must be one of {RUNTIME_NAMES}, got {runtime!r}")
        self.inner = model
        self.runtime = runtime
        self._fn: Callable[..., Any] | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> "RuntimeModule":
        return RuntimeModule(copy.deepcopy(self.inner, memo), self.runtime)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:
            if self.runtime == "compiled":
                torch.compiler.reset()  # a fresh compile: no recompile limit carried over from other models
                self._fn = torch.compile(self.inner)
            else:
                self._fn = _cuda_graph(self.inner, args, kwargs)
        return self._fn(*args, **kwargs)


def _cuda_graph(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
    static_args = list(args)
    static_kwargs = dict(kwargs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(*static_args, **static_kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(*static_args, **static_kwargs)

    def replay(*a: Any, **k: Any) -> Any:
        pairs = [*zip(static_args, a), *((static_kwargs[n], v) for n, v in k.items() if n in static_kwargs)]
        for dst, src in pairs:
            if isinstance(dst, torch.Tensor) and src is not dst:
                dst.copy_(src)
        graph.replay()
        return static_out

    return replay
