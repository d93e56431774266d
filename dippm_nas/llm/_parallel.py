"""Tensor parallelism of a serving engine over the GPUs of one node: the shard each GPU holds and the
all-reduces that join the shards.

Megatron-style tensor parallelism over ``N`` GPUs (what vLLM's ``tensor_parallel_size`` and TensorRT-LLM's
``tp_size`` do): each GPU holds ``num_heads / N`` query heads, ``num_kv_heads / N`` key/value heads (one
replicated head per GPU when ``N`` exceeds them: ``N`` must then be a multiple of the KV heads), ``1 / N`` of
the MLP's width (of every expert's, for a mixture of experts: both engines shard each expert's FFN, not the
experts), and ``1 / N`` of the vocabulary in the embedding and the LM head; norms and the router are replicated.
So one GPU runs the prefill and decode graphs of the shard (:func:`shard_config`), keeps its weights and its
KV cache, and the pass joins the shards with an all-reduce of the residual stream (``tokens * hidden``
elements) after attention and after the MLP of every layer, plus one after the vocabulary-parallel embedding:
``2 * layers + 1`` all-reduces per pass.

One all-reduce of ``M`` bytes over ``N`` GPUs moves ``2 (N - 1) / N * M`` bytes over each GPU's link (ring
or two-shot), at the link's bandwidth in one direction (:func:`link_gbps`): NVLink (``nvlink_gbps / 2``,
the datasheet quoting both directions) or PCIe (``pcie_gbps``). Messages of at most
``custom_allreduce_max_mib`` over NVLink among 2, 4, 6 or 8 GPUs take the engines' custom peer-to-peer
all-reduce, larger ones, other GPU counts and PCIe take NCCL; each has its own fixed time (``allreduce_us``, ``nccl_us``), and ``allreduce_bw_scale``
multiplies the ideal transfer time (:class:`~dippm_nas.llm.ServingEngine`, fitted on multi-GPU runs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dippm_nas.devices import Device
from dippm_nas.errors import DeviceError, InvalidValueError
from dippm_nas.llm._config import DecoderConfig, ceil_div
from dippm_nas.llm._engines import ServingEngine
from dippm_nas.units import BYTES_PER_MIB

__all__ = ["INTERCONNECTS", "CUSTOM_ALLREDUCE_SIZES", "TensorParallel", "resolve_tensor_parallel", "shard_config", "link_gbps",
           "allreduce_ms"]

#: Links a node's GPUs may all-reduce over.
INTERCONNECTS: tuple[str, ...] = ("nvlink", "pcie")
#: GPU counts the custom all-reduce serves (vLLM's ``CustomAllreduce._SUPPORTED_WORLD_SIZES``); others take NCCL.
CUSTOM_ALLREDUCE_SIZES: tuple[int, ...] = (2, 4, 6, 8)


@dataclass(frozen=True)
class TensorParallel:
    """How a generation is split over the GPUs of one node.

    Attributes:
        size: GPUs (1: no tensor parallelism).
        interconnect: ``"nvlink"`` or ``"pcie"``; ``None`` with one GPU.
        link_gbps: the link's bandwidth of one GPU in one direction, GB/s (0 with one GPU).
    """

    size: int = 1
    interconnect: str | None = None
    link_gbps: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise InvalidValueError(f"TensorParallel.size must be an int >= 1, got {self.size!r}")
        if self.size > 1 and self.interconnect not in INTERCONNECTS:
            raise InvalidValueError(f"TensorParallel.interconnect must be one of {INTERCONNECTS} with more than one "
                                    f"GPU, got {self.interconnect!r}")
        v = self.link_gbps
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf") or \
                (self.size > 1 and v <= 0):
            raise InvalidValueError(f"TensorParallel.link_gbps must be a finite number > 0 with more than one GPU, "
                                    f"got {v!r}")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def link_gbps(dev: Device, interconnect: str) -> float:
    """Bandwidth of one GPU's ``interconnect`` in one direction, GB/s.

    Raises:
        InvalidValueError: an interconnect not in :data:`INTERCONNECTS`.
        DeviceError: a link the board lacks (``nvlink_gbps`` / ``pcie_generation`` absent).
    """
    if interconnect not in INTERCONNECTS:
        raise InvalidValueError(f"interconnect must be one of {INTERCONNECTS}, got {interconnect!r}")
    if interconnect == "nvlink":
        if dev.nvlink_gbps is None:
            raise DeviceError(f"interconnect='nvlink': device {dev.id!r} has no NVLink (nvlink_gbps is absent); "
                              f"choices for it: {available_interconnects(dev)}")
        return float(dev.nvlink_gbps) / 2.0
    pcie = dev.pcie_gbps
    if pcie is None:
        raise DeviceError(f"interconnect='pcie': device {dev.id!r} has no PCIe link figures (pcie_generation, "
                          f"pcie_lanes); choices for it: {available_interconnects(dev)}")
    return float(pcie)


def available_interconnects(dev: Device) -> list[str]:
    """The links of :data:`INTERCONNECTS` the board has."""
    out = []
    if dev.nvlink_gbps is not None:
        out.append("nvlink")
    if dev.pcie_gbps is not None:
        out.append("pcie")
    return out


def _check_heads(cfg: DecoderConfig, tp: int) -> None:
    if cfg.num_heads % tp:
        divisors = [d for d in range(1, cfg.num_heads + 1) if cfg.num_heads % d == 0 and d <= 64]
        raise InvalidValueError(f"tensor_parallel={tp} does not divide num_heads={cfg.num_heads} of {cfg.name!r}: "
                                f"each GPU holds num_heads / tensor_parallel query heads; choices: {divisors}")
    kv = cfg.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise InvalidValueError(f"tensor_parallel={tp} and num_kv_heads={kv} of {cfg.name!r}: vLLM and TensorRT-LLM "
                                "need the KV heads divided evenly (num_kv_heads a multiple of tensor_parallel) or "
                                "replicated (tensor_parallel a multiple of num_kv_heads)")


def resolve_tensor_parallel(cfg: DecoderConfig, dev: Device, tensor_parallel: int, interconnect: str | None,
                            runtime: str) -> TensorParallel:
    """Check a tensor-parallel request against the decoder, the node and the runtime.

    The link defaults to NVLink when the board has it and it reaches every GPU asked for (through NVSwitch, or a
    bridge joining two boards), else PCIe.

    Raises:
        InvalidValueError: ``tensor_parallel`` not an int >= 1, not dividing the heads (or the KV heads as the
            engines require), tensor parallelism outside a serving engine, an unknown interconnect.
        DeviceError: more GPUs than the node holds (``gpus_per_node``), an interconnect the board lacks, an NVLink
            bridge asked to join more than two GPUs.
    """
    tp = tensor_parallel
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InvalidValueError(f"tensor_parallel must be an int >= 1 (GPUs of one node), got {tp!r}")
    if interconnect is not None and interconnect not in INTERCONNECTS:
        raise InvalidValueError(f"interconnect must be one of {INTERCONNECTS} or None, got {interconnect!r}")
    if tp == 1:
        if interconnect is not None:
            link_gbps(dev, interconnect)  # still a link the board must have
        return TensorParallel()
    if runtime != "serving":
        raise InvalidValueError(f"tensor_parallel={tp} needs runtime='serving' (vLLM / TensorRT-LLM shard the "
                                f"model over GPUs), got runtime={runtime!r}")
    node = dev.gpus_per_node or 1
    if tp > node:
        raise DeviceError(f"tensor_parallel={tp} exceeds the {node} GPU(s) of one {dev.id!r} node "
                          f"(gpus_per_node={dev.gpus_per_node!r}); tensor parallelism here stays in one node")
    _check_heads(cfg, tp)
    if interconnect is None:
        interconnect = "nvlink" if dev.nvlink_gbps is not None and (dev.nvswitch or tp <= 2) else "pcie"
    if interconnect == "nvlink" and dev.nvlink_gbps is not None and not dev.nvswitch and tp > 2:
        raise DeviceError(f"interconnect='nvlink' with tensor_parallel={tp}: the NVLink of {dev.id!r} is a bridge "
                          "joining two boards (nvswitch = false); choose tensor_parallel=2 or interconnect='pcie'")
    return TensorParallel(size=tp, interconnect=interconnect, link_gbps=link_gbps(dev, interconnect))


def shard_config(cfg: DecoderConfig, tp: int) -> DecoderConfig:
    """The decoder one GPU of ``tp`` runs: its heads, KV heads (one replicated head when ``tp`` exceeds them),
    MLP (every expert's) width and vocabulary shard; the config itself when ``tp == 1``.

    Raises:
        InvalidValueError: ``tp`` not an int >= 1, or not dividing the heads (or the KV heads as the engines need).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InvalidValueError(f"tensor_parallel must be an int >= 1 (GPUs of one node), got {tp!r}")
    if tp == 1:
        return cfg
    _check_heads(cfg, tp)
    kv = cfg.num_kv_heads // tp if cfg.num_kv_heads >= tp else 1
    return dataclasses.replace(cfg, name=f"{cfg.name} (1/{tp} tensor-parallel shard)", num_heads=cfg.num_heads // tp,
                               num_kv_heads=kv, intermediate_size=ceil_div(cfg.intermediate_size, tp),
                               vocab_size=ceil_div(cfg.vocab_size, tp))


def allreduce_ms(cfg: DecoderConfig, tokens: int, tp: TensorParallel, engine: ServingEngine) -> tuple[float, bool]:
    """Time of the ``2 * layers + 1`` all-reduces of one pass over ``tokens`` tokens, ms, and whether they take
    the custom all-reduce (else NCCL)."""
    if tp.size == 1 or tokens <= 0:
        return 0.0, False
    message = tokens * cfg.hidden_size * cfg.weight_bytes_per_element
    custom = tp.interconnect == "nvlink" and tp.size in CUSTOM_ALLREDUCE_SIZES and \
        message <= engine.custom_allreduce_max_mib * BYTES_PER_MIB
    fixed_us = engine.allreduce_us if custom else engine.nccl_us
    bus_s = 2.0 * (tp.size - 1) / tp.size * message / (tp.link_gbps * 1e9) * engine.allreduce_bw_scale
    count = 2 * cfg.num_layers + 1
    return count * (fixed_us / 1e3 + bus_s * 1e3), custom
