"""Block decomposition: how a search space splits a candidate into blocks, so its graph can be assembled.

A search space that subclasses :class:`BlockSearchSpace` says, for any config, which blocks the model is
made of (a stem, each stage's first and later blocks with their hyper-parameters, a head...) and how their
outputs feed each other: a :class:`BlockPlan`. dippm-nas then captures each *distinct* block once (per
input shape, batch size and dtype), keeps it in the conversion cache under its own key, and assembles a
candidate's :class:`~dippm_nas.graph.OperatorGraph` from the block graphs in milliseconds
(:func:`dippm_nas.capture.assemble`), instead of exporting the whole model.

The contract that makes the assembled graph *exactly* the whole capture's (same
:meth:`~dippm_nas.graph.OperatorGraph.structural_hash`):

1. Running the plan's blocks in plan order, each on its inputs, performs exactly the operator calls the
   model built from the config performs, in the same order: every operator of the model belongs to
   exactly one block, and the model's ``forward`` finishes one block's operators before it starts the
   next block's.
2. A block's module (:meth:`BlockSearchSpace.build_block`) runs the same code on the same
   hyper-parameters as that part of the model, and its inputs have the shapes and dtypes the model gives
   them there.
3. Each block output is a tensor the block computes (not one of its inputs passed through), and a
   block's outputs are distinct tensors.
4. A block's graph depends only on its ``kind``, its ``params`` and its input shapes and dtypes (plus the
   batch size and dtype of the candidate): those are its cache key, with :meth:`BlockSearchSpace.code_digest`.

A space that cannot keep this contract does not subclass :class:`BlockSearchSpace`: its candidates are
captured whole, as before. ``tests/capture/test_assembly.py`` checks the contract on random configs of every
space that opts in (assembled hash == whole-capture hash).

Example (a space of plain conv stacks)::

    import search_spaces as ss
    from search_spaces import Block, BlockPlan, BlockSearchSpace

    class ConvStack(nn.Module):
        def __init__(self, widths, num_classes):
            super().__init__()
            self.stages = nn.Sequential(*[ConvStage(a, b) for a, b in zip([3, *widths], widths)])
            self.head = Head(widths[-1], num_classes)
        def forward(self, x):
            return self.head(self.stages(x))

    @ss.register_space("convstack")
    class ConvStackSpace(BlockSearchSpace):
        params = {"widths": ss.ListOf(ss.IntRange(8, 512), 1, 6), "resolution": ss.IntRange(32, 512),
                  "num_classes": ss.IntRange(1, 1000)}
        def default_config(self): return {"widths": [32, 64], "resolution": 224, "num_classes": 10}
        def _build(self, cfg): return ConvStack(cfg["widths"], cfg["num_classes"])
        def _sample(self, rng): ...

        def _blocks(self, cfg):
            side, cin, parts = cfg["resolution"], 3, []
            for w in cfg["widths"]:
                parts.append(("stage", {"cin": cin, "cout": w}, (cin, side, side)))
                cin, side = w, side // 2
            parts.append(("head", {"cin": cin, "num_classes": cfg["num_classes"]}, (cin, side, side)))
            return BlockPlan.chain(parts)

        def _build_block(self, kind, params):
            if kind == "stage":
                return ConvStage(params["cin"], params["cout"])
            return Head(params["cin"], params["num_classes"])

``docs/search_space_assembly.md`` describes the interface at length.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Union

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._registry import SearchSpace

__all__ = ["BlockInput", "Block", "BlockPlan", "BlockSearchSpace", "Source"]

#: Where a block input comes from: a model input's name (a key of the candidate's
#: :class:`~dippm_nas.spec.InputSpec`, ``"x"`` for a single-input model), or ``(block, output)``: output
#: ``output`` of the block at index ``block`` of the plan (an earlier one).
Source = Union[str, tuple[int, int]]


@dataclass(frozen=True)
class BlockInput:
    """One input of a block.

    Attributes:
        source: see :data:`Source`.
        shape: per-sample shape the block reads there (without the batch dimension).
        name: keyword the block module's ``forward`` takes this input by; a block with a single
            floating-point input gets it positionally instead (so ``nn.Sequential`` blocks work).
        dtype: ``None`` for the candidate's compute dtype, else the input's own (``"int64"`` for token ids).
    """

    source: Source
    shape: tuple[int, ...]
    name: str = "x"
    dtype: str | None = None


@dataclass(frozen=True)
class Block:
    """One block of a candidate: what to build and what it reads.

    Attributes:
        kind: block type within the space (``"stem"``, ``"layer"``, ``"head"``...), passed to
            :meth:`BlockSearchSpace._build_block`.
        params: the block's hyper-parameters, plain JSON (everything, besides its input shapes, that
            decides its operator graph); passed to :meth:`BlockSearchSpace._build_block`.
        inputs: the block's inputs, in the order its ``forward`` takes them.
        num_outputs: tensors its ``forward`` returns (a tuple when more than one).
    """

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[BlockInput, ...] = ()
    num_outputs: int = 1


@dataclass(frozen=True)
class BlockPlan:
    """A candidate as blocks: the blocks in execution order and the model outputs.

    Attributes:
        blocks: every block, in the order the model executes them; an input's source is a model input or
            an earlier block.
        outputs: ``(block, output)`` of each model output, in the order ``forward`` returns them.
    """

    blocks: tuple[Block, ...]
    outputs: tuple[tuple[int, int], ...]

    @classmethod
    def chain(cls, parts: Sequence[tuple[str, Mapping[str, Any], tuple[int, ...]]],
              input_name: str = "x") -> "BlockPlan":
        """A sequential plan: each block reads the previous block's only output, the first the model input.

        Args:
            parts: ``(kind, params, input shape)`` of each block, in execution order (shapes per sample).
            input_name: the model input the first block reads (``"x"`` for a single-input model).
        """
        blocks = tuple(
            Block(kind, params, (BlockInput(input_name if i == 0 else (i - 1, 0), tuple(shape)),))
            for i, (kind, params, shape) in enumerate(parts)
        )
        return cls(blocks, ((len(blocks) - 1, 0),))

    def check(self, space: str, input_names: Sequence[str]) -> "BlockPlan":
        """Check that every source exists and comes earlier; return ``self``.

        Raises:
            SearchSpaceError: naming the block and the broken rule (a bug of the space's :meth:`_blocks`).
        """
        if not self.blocks:
            raise SearchSpaceError(f"{space}: a block plan needs at least one block")
        names = set(input_names)
        for i, b in enumerate(self.blocks):
            if not isinstance(b.num_outputs, int) or b.num_outputs < 1:
                raise SearchSpaceError(f"{space}: block {i} ({b.kind}) must have num_outputs >= 1, "
                                       f"got {b.num_outputs!r}")
            if not b.inputs:
                raise SearchSpaceError(f"{space}: block {i} ({b.kind}) reads nothing; every block needs an input")
            kw = [inp.name for inp in b.inputs]
            if len(set(kw)) != len(kw):
                raise SearchSpaceError(f"{space}: block {i} ({b.kind}) input names must be unique, got {kw}")
            for inp in b.inputs:
                self._check_source(space, i, b, inp.source, names)
        for src in self.outputs:
            self._check_source(space, len(self.blocks), None, tuple(src), set())
        if not self.outputs:
            raise SearchSpaceError(f"{space}: a block plan needs at least one output")
        return self

    def _check_source(self, space: str, i: int, b: Block | None, src: Any, names: set[str]) -> None:
        where = f"block {i} ({b.kind})" if b is not None else "the plan's outputs"
        if isinstance(src, str):
            if src not in names:
                raise SearchSpaceError(f"{space}: {where} reads model input {src!r}; the inputs are {sorted(names)}")
            return
        ok = (isinstance(src, tuple) and len(src) == 2 and all(isinstance(v, int) for v in src)
              and 0 <= src[0] < i and 0 <= src[1] < self.blocks[src[0]].num_outputs)
        if not ok:
            raise SearchSpaceError(f"{space}: {where} reads {src!r}; a source must be a model input name or "
                                   f"(block, output) of an earlier block (blocks before it: {i})")


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """Digest of every module of the ``search_spaces`` package (the built-in families share helpers)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _file_digest(cls: type) -> str:
    h = hashlib.sha256()
    for klass in cls.__mro__:
        if klass in (BlockSearchSpace, SearchSpace, abc.ABC, object):
            continue
        try:
            path = inspect.getsourcefile(klass)
        except TypeError:  # defined interactively: its name is all there is
            path = None
        h.update(f"{klass.__module__}.{klass.__qualname__}".encode())
        if path and Path(path).is_file():
            h.update(Path(path).read_bytes())
    return h.hexdigest()


class BlockSearchSpace(SearchSpace):
    """A :class:`~search_spaces.SearchSpace` whose candidates dippm-nas assembles from cached blocks.

    Subclasses implement :meth:`_blocks` (config -> :class:`BlockPlan`) and :meth:`_build_block`
    (kind and params -> ``nn.Module``) besides the :class:`SearchSpace` methods, and keep the contract of
    :mod:`search_spaces._blocks` (the assembled graph equals the whole capture's).

    When each method is called:

    - :meth:`blocks` (which calls :meth:`_blocks` on the validated config) for every candidate, in the
      caller's process: keep it cheap, it is most of the per-candidate cost once blocks are cached;
    - :meth:`build_block` (which calls :meth:`_build_block` under a fixed seed) only for a block missing
      from the cache, possibly in a worker process;
    - :meth:`code_digest` once per process: it enters every block's cache key.

    Attributes:
        block_version: a string that enters every block's cache key; change it when the code that
            builds blocks changes outside the files :meth:`code_digest` reads.
    """

    block_version: ClassVar[str] = "1"

    # ------------------------------------------------------------------ to implement
    @abc.abstractmethod
    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """The blocks of a validated, complete config (see :class:`BlockPlan`, :meth:`BlockPlan.chain`)."""

    @abc.abstractmethod
    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        """The module of one block; its ``forward`` takes the block's inputs (see :class:`BlockInput`)."""

    # ------------------------------------------------------------------ public
    def blocks(self, config: Mapping[str, Any], *, validated: bool = False) -> BlockPlan:
        """The :class:`BlockPlan` of a config.

        Args:
            config: a config of this space.
            validated: ``config`` is a dict :meth:`validate` returned, unchanged since (it is not checked
                again: a caller that has just validated it, as :func:`dippm_nas.capture.assemble` has, saves
                the second check). Default ``False``.

        Raises:
            SearchSpaceError: the config is outside the space (naming the key and its allowed values).
        """
        cfg = dict(config) if validated else self.validate(config)
        return self._blocks(cfg).check(self.name, [t.name for t in self.input_spec(cfg).tensors])

    def build_block(self, block: Block, *, seed: int = 0) -> nn.Module:
        """The module of ``block`` in eval mode, weights seeded (they do not enter the graph).

        Raises:
            SearchSpaceError: the block's builder failed (the original exception is chained).
        """
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                module = self._build_block(block.kind, dict(block.params))
        except SearchSpaceError:
            raise
        except Exception as e:  # noqa: BLE001 - a builder bug or an unknown kind: say which block
            raise SearchSpaceError(f"building block {block.kind!r} {dict(block.params)!r} of {self.name} failed: "
                                   f"{type(e).__name__}: {e}") from e
        return module.eval()

    def code_digest(self) -> str:
        """Digest of the code that builds this space's blocks; part of every block's cache key.

        The default hashes, with :attr:`block_version`, the source files of this class and its bases (for
        the families of the ``search_spaces`` package: every module of the package). Override it (or
        bump :attr:`block_version`) when blocks are built from code elsewhere.
        """
        cls = type(self)
        if cls.__module__.split(".")[0] == "search_spaces":
            code = _package_digest()
        else:
            code = _file_digest(cls)
        return hashlib.sha256(f"{code}|{self.block_version}".encode()).hexdigest()[:20]
