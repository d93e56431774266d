"""MIG advisor: which Multi-Instance GPU profiles a model fits, and how fast it runs on each.

Fit rule (``rule="dippm-nas"``, the default). A profile fits when

    memory_mib + k_sigma * memory_mib_std  <=  usable memory of the profile (MiB)

where the usable memory is what ``nvidia-smi mig -lgip`` lists (a little below the name: 4.75 GiB on
A100-40GB's ``1g.5gb``), falling back to the nominal memory for profiles without a listing.
``memory_mib`` is the whole process as the GPU sees it (CUDA context, weights, the caller's input, the
activation peak, cuBLAS / cuDNN workspaces and the caching allocator's rounding: see
:mod:`dippm_nas.prior._memory`), and ``memory_mib_std`` its standard deviation; ``k_sigma`` defaults to
:data:`dippm_nas.budgets.DEFAULT_K_SIGMA` (1.0), the same margin budgets use. A prediction without a
memory std cannot have a margin: it is checked on its mean, the advice says so
(``memory_std_missing``, and a ``note`` on each fitting profile) and a warning is logged once. The bound is
inclusive. So on A100-40GB a model needing exactly 5 GiB (5120 MiB) does **not** fit ``1g.5gb``
(4864 MiB usable) and its smallest fit is ``1g.10gb``; exactly 4864 MiB fits; exactly 40 GiB fits no
profile (``7g.40gb`` offers 39.38 GiB), and the answer is "none fits" with the reason, never an error.
The smallest fit is the fitting profile with the least usable memory, then the fewest compute slices,
preferring profiles without media extensions.

DIPPM's rule (``rule="dippm"``) is memory-only: it compares the point prediction with the *nominal*
memory of the ladder ``1g``/1 memory slice, ``2g``/2, ``3g``/4, ``7g``/8 (``1g.5gb, 2g.10gb, 3g.20gb,
7g.40gb`` on A100-40GB). DIPPM used strict ``<`` bounds, which left a prediction exactly on a bound
without an answer; here the bounds are inclusive (``<=``), which closes that gap. Like DIPPM it ignores
the uncertainty and never picks ``1g.10gb`` or ``4g.20gb``.

Latency on a slice: with the graph, the whole GPU's prediction with each kernel re-timed on a device view of
the slice (its SMs, peaks scaled by SMs, DRAM bandwidth and L2 scaled by ``memory_slices / 8``; see
:meth:`Device.mig_slice`): the prediction's correction of the kernels (its GPU busy time over the prior's) and
its host timeline stay as they are, so a host-bound pass takes the same time on every slice and a 7g slice
(98 of the A100's 108 SMs, all of its memory slices) is at most about 10 % slower than the whole GPU
(``latency_basis="corrected"``). Without the graph, the prediction's device time is scaled by the slice's
worse resource ratio (an upper bound, ``latency_basis="scaled"``). Throughput is per GPU:
``instances_per_gpu * batch_size / latency``. Power and energy of one instance cannot be measured
(NVML reports the whole GPU), so the advice has no energy per slice.
"""

from dippm_nas.prior import (
    DIPPM_LADDER,
    MigAdvice,
    ProfileAdvice,
    advise,
    advise_many,
    mig_fit_violations,
)
from dippm_nas.prior import MIG_RULES as RULES

__all__ = ["advise", "advise_many", "mig_fit_violations", "MigAdvice", "ProfileAdvice", "RULES", "DIPPM_LADDER"]
