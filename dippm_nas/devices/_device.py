"""The :class:`Device` record and its MIG profiles, validated when they are built.

A device is a bag of facts with units in the field names. Spec-sheet figures come from the data
files under ``dippm_nas/devices/data`` (each cites its source); ``idle_power_w`` and
``runtime_baseline_mib`` are observed typical values meant to be calibrated; ``host-cpu`` peaks are
measured on the machine at first use.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dippm_nas._schema import from_file_data
from dippm_nas.errors import DeviceError, UnsupportedDtypeError
from dippm_nas.units import MIB_PER_GIB

__all__ = ["Device", "MigProfile", "DEVICE_KINDS", "PCIE_LANE_GBPS", "NVLINK_GENERATIONS", "device_from_dict"]

#: What kind of processor a device is.
DEVICE_KINDS: tuple[str, ...] = ("gpu", "cpu")
#: Data rate of one PCI Express lane in one direction after line encoding, GB/s, per generation (PCI-SIG base
#: specifications: 2.5 and 5 GT/s with 8b/10b encoding; 8, 16 and 32 GT/s with 128b/130b).
PCIE_LANE_GBPS: dict[int, float] = {1: 0.25, 2: 0.5, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}

#: NVLink generations a board may carry (3: Ampere, 4: Hopper, 5: Blackwell).
NVLINK_GENERATIONS: tuple[int, ...] = (1, 2, 3, 4, 5)

_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_MIG_NAME_RE = re.compile(r"^(\d+)g\.(\d+)gb(\+me)?$")



@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of a device.

    Attributes:
        name: the profile name as NVIDIA writes it, e.g. ``"1g.5gb"`` or ``"1g.5gb+me"``.
        compute_slices: compute slices out of 7 (the ``Ng`` of the name).
        memory_slices: memory slices out of 8; they also divide DRAM bandwidth and L2.
        memory_gib: memory in the name (nominal), GiB.
        max_instances: how many instances of this profile fit on one GPU.
        usable_memory_gib: memory a process can use on the instance, as ``nvidia-smi mig -lgip``
            lists it (a little below the name), GiB; ``None`` when no listing is known, in which
            case :attr:`usable_memory_mib` falls back to the nominal figure.
        sms: streaming multiprocessors of the instance as ``-lgip`` lists them; ``None`` to derive
            them from the device (``sms_in_mig_mode * compute_slices / 7``).
        media_extensions: the ``+me`` variant (same compute and memory, plus media engines).
    """

    name: str
    compute_slices: int
    memory_slices: int
    memory_gib: float
    max_instances: int
    usable_memory_gib: float | None = None
    sms: int | None = None
    media_extensions: bool = False

    def __post_init__(self) -> None:
        m = _MIG_NAME_RE.match(self.name)
        if not m:
            raise DeviceError(f"MIG profile name must look like '1g.5gb' or '1g.5gb+me', got {self.name!r}")
        if int(m.group(1)) != self.compute_slices:
            raise DeviceError(
                f"MIG profile {self.name!r}: compute_slices must match the name ({m.group(1)}), "
                f"got {self.compute_slices}"
            )
        if bool(m.group(3)) != self.media_extensions:
            raise DeviceError(
                f"MIG profile {self.name!r}: media_extensions must be {bool(m.group(3))} for this name, "
                f"got {self.media_extensions}"
            )
        if not 1 <= self.compute_slices <= 7:
            raise DeviceError(f"MIG profile {self.name!r}: compute_slices must be in 1..7, got {self.compute_slices}")
        if not 1 <= self.memory_slices <= 8:
            raise DeviceError(f"MIG profile {self.name!r}: memory_slices must be in 1..8, got {self.memory_slices}")
        if not 1 <= self.max_instances <= 7:
            raise DeviceError(f"MIG profile {self.name!r}: max_instances must be in 1..7, got {self.max_instances}")
        _positive(self.memory_gib, f"MIG profile {self.name!r}: memory_gib")
        if self.usable_memory_gib is not None:
            _positive(self.usable_memory_gib, f"MIG profile {self.name!r}: usable_memory_gib")
            if self.usable_memory_gib > self.memory_gib:
                raise DeviceError(
                    f"MIG profile {self.name!r}: usable_memory_gib ({self.usable_memory_gib}) must not exceed "
                    f"the nominal memory_gib ({self.memory_gib})"
                )
        if self.sms is not None and (not isinstance(self.sms, int) or self.sms < 1):
            raise DeviceError(f"MIG profile {self.name!r}: sms must be an int >= 1 or absent, got {self.sms!r}")

    @property
    def usable_memory_mib(self) -> float:
        """Memory available to a process on the instance, MiB (the ``-lgip`` figure, else nominal)."""
        gib = self.usable_memory_gib if self.usable_memory_gib is not None else self.memory_gib
        return gib * MIB_PER_GIB

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Device:
    """Facts about one processor, units in the names.

    Attributes:
        id: catalogue id, lower case, e.g. ``"a100-sxm4-40gb"``.
        name: marketing name, e.g. ``"NVIDIA A100-SXM4-40GB"``.
        kind: ``"gpu"`` or ``"cpu"``.
        architecture: e.g. ``"ampere"``, ``"hopper"``, ``"ada"``, ``"blackwell"``, ``"x86_64"``.
        sms: streaming multiprocessors (for a CPU: the threads the benchmark used).
        fp32_tflops: dense FP32 peak on CUDA cores (CPU: measured matmul rate), TFLOP/s.
        fp16_tflops: dense FP16 peak on CUDA cores (non-tensor), TFLOP/s; ``None`` if unknown
            (the FP32 peak is used for half-precision non-contraction work then).
        tf32_tensor_tflops: dense TF32 tensor-core peak, TFLOP/s; ``None`` without tensor cores.
        fp16_tensor_tflops: dense FP16 tensor-core peak with FP32 accumulation (what PyTorch uses),
            TFLOP/s; ``None`` without tensor cores.
        bf16_tensor_tflops: dense BF16 tensor-core peak with FP32 accumulation, TFLOP/s.
        fp64_tflops: dense FP64 peak on CUDA cores, TFLOP/s; ``None`` when not catalogued (the device
            then has no ``float64`` dtype).
        fp64_tensor_tflops: dense FP64 tensor-core (DMMA) peak, TFLOP/s, which cuBLAS uses for FP64 GEMMs
            (A100, H100); ``None`` without FP64 tensor cores. FP64 convolutions keep ``fp64_tflops``.
        fp8_tensor_tflops: dense FP8 tensor-core peak with FP32 accumulation, TFLOP/s; ``None`` without FP8
            tensor cores (before Ada and Hopper). An FP8 KV cache (:mod:`dippm_nas.llm`) needs it.
        memory_gib: device memory as named on the datasheet, GiB.
        usable_memory_mib: memory a process can use (``nvidia-smi`` total), MiB; defaults to
            ``memory_gib`` when no listing is known.
        bandwidth_gbps: peak DRAM bandwidth, GB/s (10**9 bytes per second).
        l2_mib: last-level cache, MiB.
        board_power_w: board power limit (TDP/TBP), W; ``None`` when unknown (no energy figure then).
        idle_power_w: observed typical draw with nothing running in the active power state, W
            (not a datasheet figure; calibratable); ``None`` when unknown.
        runtime_baseline_mib: device memory taken by the CUDA context and library handles before
            the first tensor, MiB (observed typical; calibratable).
        cublas_workspace_mib: cuBLAS workspace PyTorch allocates per handle/stream, MiB.
        mig_profiles: MIG GPU-instance profiles; empty for devices without MIG.
        sms_in_mig_mode: SMs available to MIG instances in total (98 on A100); ``None`` without MIG.
        host_dispatch_us: framework dispatch time per operator on the host, µs; ``None`` to use
            the prior's calibrated default (host-cpu measures it).
        pcie_generation: PCI Express generation of the board's host link (3, 4, 5, ...); ``None`` when unknown.
        pcie_lanes: lanes of that link (16 on every catalogued board); ``None`` when unknown.
        nvlink_generation: NVLink generation of the board (3 Ampere, 4 Hopper, 5 Blackwell); ``None`` without
            NVLink.
        nvlink_gbps: NVLink bandwidth of one GPU, both directions together, GB/s, as NVIDIA's datasheets quote it
            (H100 SXM 900); ``None`` without NVLink.
        nvswitch: the NVLinks reach every GPU of the node through NVSwitch (HGX / DGX boards); ``False`` with
            NVLink: a bridge joining two boards.
        gpus_per_node: GPUs one node of this board holds (HGX: 8); ``None`` when not catalogued (one GPU).
        geforce: a GeForce board (NVIDIA's consumer line), whose datasheet FP16/BF16 tensor peak with FP32
            accumulation is half its FP16-accumulate rate; a GeForce GPU without efficiency multipliers of its own
            gets the prior's GeForce default entry (:data:`dippm_nas.prior.GEFORCE_SCALE_KEY`), the geometric mean
            of the fitted GeForce GPUs', not the default of every fitted GPU. ``False`` for TITAN, professional
            (RTX A-series, A40) and data-centre boards.
        sources: where each figure comes from, ``{field: citation}``.
        checks: fields whose figure should be re-checked against the vendor before it drives a result.
        notes: free text.
    """

    id: str
    name: str
    kind: str
    architecture: str
    sms: int
    fp32_tflops: float
    memory_gib: float
    bandwidth_gbps: float
    l2_mib: float
    board_power_w: float | None = None
    idle_power_w: float | None = None
    fp16_tflops: float | None = None
    tf32_tensor_tflops: float | None = None
    fp16_tensor_tflops: float | None = None
    bf16_tensor_tflops: float | None = None
    fp64_tflops: float | None = None
    fp64_tensor_tflops: float | None = None
    fp8_tensor_tflops: float | None = None
    usable_memory_mib: float | None = None
    runtime_baseline_mib: float = 0.0
    cublas_workspace_mib: float = 0.0
    mig_profiles: tuple[MigProfile, ...] = ()
    sms_in_mig_mode: int | None = None
    host_dispatch_us: float | None = None
    pcie_generation: int | None = None
    pcie_lanes: int | None = None
    nvlink_generation: int | None = None
    nvlink_gbps: float | None = None
    nvswitch: bool = False
    gpus_per_node: int | None = None
    geforce: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)
    checks: tuple[str, ...] = ()
    notes: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID_RE.match(self.id):
            raise DeviceError(
                f"device id must be lower-case letters, digits, '.', '_' or '-' (e.g. 'a100-sxm4-40gb'), got {self.id!r}"
            )
        if self.kind not in DEVICE_KINDS:
            raise DeviceError(f"device {self.id!r}: kind must be one of {DEVICE_KINDS}, got {self.kind!r}")
        if not isinstance(self.sms, int) or isinstance(self.sms, bool) or self.sms < 1:
            raise DeviceError(f"device {self.id!r}: sms must be an int >= 1, got {self.sms!r}")
        for name in ("fp32_tflops", "memory_gib", "bandwidth_gbps", "l2_mib"):
            _positive(getattr(self, name), f"device {self.id!r}: {name}")
        for name in ("fp16_tflops", "tf32_tensor_tflops", "fp16_tensor_tflops", "bf16_tensor_tflops",
                     "fp64_tflops", "fp64_tensor_tflops", "fp8_tensor_tflops", "board_power_w", "idle_power_w", "usable_memory_mib", "host_dispatch_us"):
            v = getattr(self, name)
            if v is not None:
                _positive(v, f"device {self.id!r}: {name}")
        if self.pcie_generation is not None and self.pcie_generation not in PCIE_LANE_GBPS:
            raise DeviceError(f"device {self.id!r}: pcie_generation must be one of {sorted(PCIE_LANE_GBPS)} or absent, "
                              f"got {self.pcie_generation!r}")
        if self.pcie_lanes is not None and self.pcie_lanes not in (1, 2, 4, 8, 16):
            raise DeviceError(f"device {self.id!r}: pcie_lanes must be one of 1, 2, 4, 8, 16 or absent, "
                              f"got {self.pcie_lanes!r}")
        self._check_node()
        for name in ("runtime_baseline_mib", "cublas_workspace_mib"):
            v = getattr(self, name)
            if not _is_number(v) or v < 0:
                raise DeviceError(f"device {self.id!r}: {name} must be a finite number >= 0, got {v!r}")
        if (self.board_power_w is None) != (self.idle_power_w is None):
            raise DeviceError(
                f"device {self.id!r}: give both board_power_w and idle_power_w or neither, got "
                f"board_power_w={self.board_power_w!r}, idle_power_w={self.idle_power_w!r}"
            )
        if self.board_power_w is not None and self.idle_power_w is not None and self.idle_power_w >= self.board_power_w:
            raise DeviceError(
                f"device {self.id!r}: idle_power_w ({self.idle_power_w}) must be below board_power_w "
                f"({self.board_power_w})"
            )
        if self.usable_memory_mib is not None and self.usable_memory_mib > self.memory_gib * MIB_PER_GIB * 1.001:
            raise DeviceError(
                f"device {self.id!r}: usable_memory_mib ({self.usable_memory_mib}) must not exceed memory_gib "
                f"({self.memory_gib} GiB = {self.memory_gib * MIB_PER_GIB:.0f} MiB)"
            )
        object.__setattr__(self, "mig_profiles", tuple(self.mig_profiles))
        object.__setattr__(self, "checks", tuple(self.checks))
        object.__setattr__(self, "sources", dict(self.sources))
        names = [p.name for p in self.mig_profiles]
        if len(set(names)) != len(names):
            raise DeviceError(f"device {self.id!r}: MIG profile names must be unique, got {names}")
        if self.mig_profiles:
            if self.kind != "gpu":
                raise DeviceError(f"device {self.id!r}: only GPUs have MIG profiles, kind is {self.kind!r}")
            if self.sms_in_mig_mode is None or not 1 <= self.sms_in_mig_mode <= self.sms:
                raise DeviceError(
                    f"device {self.id!r}: a device with MIG profiles needs sms_in_mig_mode in 1..{self.sms}, "
                    f"got {self.sms_in_mig_mode!r}"
                )
            for p in self.mig_profiles:
                if p.memory_gib > self.memory_gib * 1.001:
                    raise DeviceError(
                        f"device {self.id!r}: MIG profile {p.name!r} has more memory ({p.memory_gib} GiB) than "
                        f"the device ({self.memory_gib} GiB)"
                    )
                if p.sms is not None and p.sms > self.sms:
                    raise DeviceError(
                        f"device {self.id!r}: MIG profile {p.name!r} has more SMs ({p.sms}) than the device ({self.sms})"
                    )
        unknown_checks = [c for c in self.checks if c not in self.__dataclass_fields__]
        if unknown_checks:
            raise DeviceError(
                f"device {self.id!r}: checks names unknown fields {unknown_checks}; choices: "
                f"{sorted(self.__dataclass_fields__)}"
            )

    def _check_node(self) -> None:
        if self.nvlink_generation is not None and self.nvlink_generation not in NVLINK_GENERATIONS:
            raise DeviceError(f"device {self.id!r}: nvlink_generation must be one of {NVLINK_GENERATIONS} or absent, "
                              f"got {self.nvlink_generation!r}")
        if self.nvlink_gbps is not None:
            _positive(self.nvlink_gbps, f"device {self.id!r}: nvlink_gbps")
        if (self.nvlink_gbps is None) != (self.nvlink_generation is None):
            raise DeviceError(f"device {self.id!r}: give both nvlink_generation and nvlink_gbps or neither, got "
                              f"{self.nvlink_generation!r} and {self.nvlink_gbps!r}")
        if not isinstance(self.nvswitch, bool) or (self.nvswitch and self.nvlink_gbps is None):
            raise DeviceError(f"device {self.id!r}: nvswitch must be a bool, and true only with NVLink "
                              f"(nvlink_gbps), got {self.nvswitch!r}")
        if not isinstance(self.geforce, bool) or (self.geforce and self.kind != "gpu"):
            raise DeviceError(f"device {self.id!r}: geforce must be a bool, and true only for a GPU, got "
                              f"{self.geforce!r} (kind {self.kind!r})")
        g = self.gpus_per_node
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= 72):
            raise DeviceError(f"device {self.id!r}: gpus_per_node must be an int in 1..72 or absent, got {g!r}")

    # ------------------------------------------------------------------ derived
    @property
    def has_mig(self) -> bool:
        """Whether the device can be partitioned with MIG."""
        return bool(self.mig_profiles)

    @property
    def pcie_gbps(self) -> float | None:
        """Data rate of the host link in one direction, GB/s: lanes x the generation's rate per lane after line
        encoding (:data:`PCIE_LANE_GBPS`); ``None`` when the generation or the width is unknown."""
        if self.pcie_generation is None or self.pcie_lanes is None:
            return None
        return PCIE_LANE_GBPS[self.pcie_generation] * self.pcie_lanes

    @property
    def memory_mib(self) -> float:
        """Memory a process can use, MiB (``usable_memory_mib`` when known, else ``memory_gib``)."""
        return self.usable_memory_mib if self.usable_memory_mib is not None else self.memory_gib * MIB_PER_GIB

    @property
    def has_power(self) -> bool:
        """Whether the device has the power figures an energy estimate needs."""
        return self.board_power_w is not None and self.idle_power_w is not None

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Compute dtypes the device has a peak for (and so the prior can run)."""
        out = ["float32"]
        if self.fp16_tensor_tflops is not None or self.fp16_tflops is not None:
            out.append("float16")
        if self.bf16_tensor_tflops is not None:
            out.append("bfloat16")
        if self.fp64_tflops is not None:
            out.append("float64")
        return tuple(out)

    def check_dtype(self, dtype: str) -> None:
        """Raise :class:`UnsupportedDtypeError` when the device has no peak for ``dtype``."""
        if dtype not in self.dtypes:
            raise UnsupportedDtypeError(
                f"device {self.id!r} cannot run dtype {dtype!r}: its catalogue entry has no peak for it "
                f"(supported: {list(self.dtypes)})"
            )

    def mig_profile(self, name: str) -> MigProfile:
        """The MIG profile called ``name``.

        Raises:
            DeviceError: the device has no MIG, or no profile of that name (the choices are listed).
        """
        if not self.mig_profiles:
            raise DeviceError(f"device {self.id!r} does not support MIG; it has no profiles")
        for p in self.mig_profiles:
            if p.name == name:
                return p
        raise DeviceError(
            f"device {self.id!r} has no MIG profile {name!r}; choices: {[p.name for p in self.mig_profiles]}"
        )

    def profile_sms(self, profile: MigProfile) -> int:
        """SMs of a MIG instance: the ``-lgip`` figure, else ``sms_in_mig_mode * compute_slices / 7``."""
        if profile.sms is not None:
            return profile.sms
        assert self.sms_in_mig_mode is not None
        return max(1, int(self.sms_in_mig_mode * profile.compute_slices // 7))

    def mig_slice(self, profile: MigProfile | str) -> "Device":
        """A device view of one MIG instance, for running the prior on the slice.

        SMs come from :meth:`profile_sms`; every peak scales with ``SMs / sms``; DRAM bandwidth and
        L2 scale with ``memory_slices / 8``; memory is the instance's usable memory. Power figures
        are dropped (NVML cannot measure one instance's energy), so the slice has no energy estimate.
        """
        p = self.mig_profile(profile) if isinstance(profile, str) else profile
        sms = self.profile_sms(p)
        f = sms / self.sms
        m = p.memory_slices / 8.0

        def scale(v: float | None) -> float | None:
            return None if v is None else v * f

        return dataclasses.replace(
            self,
            id=f"{self.id}.mig-{p.name.replace('+', '-')}",
            name=f"{self.name} MIG {p.name}",
            sms=sms,
            fp32_tflops=self.fp32_tflops * f,
            fp16_tflops=scale(self.fp16_tflops),
            tf32_tensor_tflops=scale(self.tf32_tensor_tflops),
            fp16_tensor_tflops=scale(self.fp16_tensor_tflops),
            bf16_tensor_tflops=scale(self.bf16_tensor_tflops),
            fp64_tflops=scale(self.fp64_tflops),
            fp64_tensor_tflops=scale(self.fp64_tensor_tflops),
            fp8_tensor_tflops=scale(self.fp8_tensor_tflops),
            memory_gib=p.memory_gib,
            usable_memory_mib=p.usable_memory_mib,
            bandwidth_gbps=self.bandwidth_gbps * m,
            l2_mib=self.l2_mib * m,
            board_power_w=None,
            idle_power_w=None,
            mig_profiles=(),
            sms_in_mig_mode=None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field (MIG profiles as dicts)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["mig_profiles"] = [p.to_dict() for p in self.mig_profiles]
        d["checks"] = list(self.checks)
        d["sources"] = dict(self.sources)
        return d


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v: Any, what: str) -> None:
    if not _is_number(v) or v <= 0:
        raise DeviceError(f"{what} must be a finite number > 0, got {v!r}")


def device_from_dict(d: Mapping[str, Any], *, origin: str = "<dict>", trusted: bool = False) -> Device:
    """Build a :class:`Device` from the mapping a TOML data file holds.

    Keys are the :class:`Device` field names (and ``measured``, the fields the host benchmark fills);
    ``[[mig_profiles]]`` tables are :class:`MigProfile` fields; ``[sources]`` maps field names to citations.
    The mapping is checked against the dataclasses' fields (:mod:`dippm_nas._schema`): every value must
    have its field's type (``checks = "fp32_tflops"`` is not a list, ``name = 5`` not a string), and unknown
    keys are an error at every level, so a typo in a user file is caught instead of silently ignored.

    Args:
        d: the parsed file.
        origin: where it came from, for error messages.
        trusted: a built-in data file (shipped with dippm-nas; its tests check each against the schema):
            built by the dataclasses' own checks alone.

    Raises:
        DeviceError: naming ``origin``, the field path, the bad value and what is expected: a value of the
            wrong type, unknown or missing keys, or values breaking a rule.
    """
    if not isinstance(d, Mapping):
        raise DeviceError(f"{origin}: a device must be a table (mapping) of its fields, got {type(d).__name__}")
    kw = {k: v for k, v in d.items() if k != "measured"}
    if not trusted:
        return from_file_data(Device, kw, origin, DeviceError)
    profiles = tuple(MigProfile(**p) for p in kw.pop("mig_profiles", ()))
    return Device(mig_profiles=profiles, **{**kw, "checks": tuple(kw.get("checks", ()))})
