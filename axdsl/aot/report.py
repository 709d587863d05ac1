"""What `axdsl aot` reports: the figures behind the fit verdict, its exit codes and byte formatting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from axdsl.analysis.flops import FlopCount
from axdsl.analysis.memory import MemoryEstimate
from axdsl.targets import Profile

EXIT_FITS, EXIT_ERROR, EXIT_NO_FIT = 0, 1, 3
# Memory the step may use: XLA and the runtime keep some for themselves (buffers of the
# collectives, fragmentation), and the analytic figures are good to about 10%.
USABLE_FRACTION = 0.9


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

    @property
    def usable(self) -> int:
        return int(self.hbm * USABLE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.estimate.total <= self.usable


def gib(n: float) -> str:
    """Bytes as GiB, MiB or KiB."""
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if abs(n) >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"
