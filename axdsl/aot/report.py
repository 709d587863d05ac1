"""What `axdsl aot` reports: the figures behind the fit verdict, its exit codes and byte formatting.

Who decides the verdict: XLA, when it compiled the step for the target's TPU topology (tpu.py):
a compile that succeeded fits (XLA checks the program against the chip's HBM), one that ran out
of HBM does not; the figure shown is XLA's peak (peak_memory_in_bytes, what a chip was measured
to need within 2.5%). Otherwise the analytic total (memory.py) against
USABLE_FRACTION of the chip's HBM, and the report says the verdict is analytic.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from axdsl.analysis.flops import FlopCount
from axdsl.analysis.memory import MemoryEstimate
from axdsl.analysis.platforms import facts
from axdsl.aot.xla import xla_total
from axdsl.targets import Profile

EXIT_FITS, EXIT_ERROR, EXIT_NO_FIT = 0, 1, 3


@dataclasses.dataclass
class Report:
    """Everything `run` prints; tests read it through `analyze`."""

    spec: Path
    target: str
    profile: Profile
    model: str
    estimate: MemoryEstimate
    flops: FlopCount
    params_total: int
    params_embedding: int
    hbm: int
    lowering: dict = dataclasses.field(default_factory=dict)
    suggestions: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # caveats printed with the header
    images: bool = False  # an image model's batch: no sequence, FLOPs not counted per token
    # why the step cannot run on this mesh whatever its memory (the batch does not split over
    # the mesh axes of `batch`, as train.py's check_settings refuses it), or None
    unsplittable: str | None = None

    @property
    def usable(self) -> int:
        """The analytic verdict's bound: what XLA gives a program where measured (TPU: 15.75 of
        v5e's 16 GiB), the memory pool the generated code asks for (GPUs), else a margin below
        the HBM for what the model misses."""
        return int(
            self.hbm * self.profile.usable_fraction(facts(self.profile.kind).usable_fraction)
        )

    @property
    def xla_decides(self) -> bool:
        """Whether XLA compiled for the target (or ran out of HBM compiling): then it decides."""
        return self.out_of_memory is not None or self.xla_peak is not None

    @property
    def out_of_memory(self) -> dict | None:
        """XLA's RESOURCE_EXHAUSTED figures (required, available), when the TPU compile ran out of
        HBM."""
        return self.lowering.get("xla_oom")

    @property
    def xla_peak(self) -> int | None:
        """XLA's per-chip HBM bytes for the target, when it compiled for the TPU topology."""
        lo = self.lowering
        return xla_total(lo["xla"], tpu=True) if lo.get("tpu_topology") and lo.get("xla") else None

    @property
    def limit(self) -> int:
        """What the deciding figure is held to: XLA's available HBM (what its own out-of-memory
        check uses; v5e 15.75 GiB), or the usable fraction of the HBM for the analytic figure."""
        if self.xla_decides:
            oom = self.out_of_memory or {}
            return oom.get("available") or self.lowering.get("hbm_available") or self.hbm
        return self.usable

    @property
    def peak(self) -> int | None:
        """The deciding per-chip figure: XLA's, or when its compile ran out of HBM, what its
        message says the program needs (None if it gave no figure)."""
        if self.out_of_memory is not None:
            return self.out_of_memory.get("required")
        return self.xla_peak if self.xla_peak is not None else self.estimate.total

    @property
    def ratio(self) -> float:
        """XLA's figure over the analytic total for this configuration (1.0 when XLA gave none):
        the correction the suggestions' analytic figures are shown with."""
        if not self.xla_decides or not self.peak or not self.estimate.total:
            return 1.0
        return self.peak / self.estimate.total

    @property
    def borderline(self) -> bool:
        """An analytic total over the usable memory by no more than the model's measured
        overestimate on this platform (platforms.py): it may fit, so it is not refused."""
        if self.xla_decides:
            return False
        over = facts(self.profile.kind).overestimate
        return self.limit < self.estimate.total <= self.limit * (1 + over)

    @property
    def fits(self) -> bool:
        """XLA's verdict where it compiled for the TPU topology: its compile checks the program
        against the chip's HBM and raises RESOURCE_EXHAUSTED when it does not fit, so a compiled
        step fits, whatever memory_analysis()'s sum says (a 32k-token Llama cut summed to 16.53
        GiB against 15.75, compiled, and trained on the chip; its peak was within it). Otherwise
        the analytic one."""
        if self.out_of_memory is not None or self.unsplittable is not None:
            return False
        if self.xla_peak is not None:
            return True
        return self.estimate.total <= self.limit or self.borderline


def gib(n: float) -> str:
    """Bytes as GiB, MiB or KiB."""
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if abs(n) >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"
