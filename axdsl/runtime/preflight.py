"""Before the data and the first step: does the run fit this machine's memory and disk?

The train state's shapes are known without allocating it (train.py's abstract_state). Its
parameters, optimizer state and one gradient per parameter must fit the memory of each device
(host RAM for the CPU devices, which share it; the device's own memory elsewhere), and one
checkpoint of the state must fit the run directory's disk. Activations come on top: `axdsl aot`
models the whole step. Otherwise one line with the figures and exit 1, not an out-of-memory kill
or a full disk after the compute was spent; --no-preflight skips it.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import math
import shutil
import sys
from pathlib import Path

import jax

DISK_MARGIN = 1.1  # a checkpoint's metadata and checksums come on top of its arrays


def _bytes(leaf, per_device: bool) -> int:
    """One array's bytes, whole or of its shard on one device."""
    shape = leaf.sharding.shard_shape(leaf.shape) if per_device else leaf.shape
    return math.prod(shape) * leaf.dtype.itemsize


def host_available() -> int | None:
    """Linux's MemAvailable in bytes (what can be allocated without swapping), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def device_available() -> tuple[int | None, str]:
    """(bytes the state may use, what that is): host RAM for CPU devices (shared by all the
    local ones), else one device's memory limit."""
    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return host_available(), "available host memory"
    stats = device.memory_stats() or {}
    return stats.get("bytes_limit"), f"the memory of one {device.device_kind}"


def preflight(run_dir: Path, abstract: dict, skip: bool = False) -> None:
    """Refuse (exit 1, with the figures) a run whose state cannot fit, or whose checkpoint cannot
    be written; `abstract`: the train state's ShapeDtypeStructs with their shardings."""
    if skip:
        return
    leaves = jax.tree.leaves(abstract)
    grads = jax.tree.leaves(abstract.get("params", {}))  # one gradient per parameter
    available, what = device_available()
    on_host = jax.local_devices()[0].platform == "cpu"
    # CPU devices share the host's memory: every copy of every shard; elsewhere one device's
    copies = (lambda leaf: len(leaf.sharding.addressable_devices)) if on_host else (lambda _: 1)
    need = sum(_bytes(leaf, True) * copies(leaf) for leaf in leaves + grads)
    problems = []
    if available is not None and need > available:
        problems.append(
            f"the parameters, optimizer state and gradients need {need / 2**30:.2f} GiB "
            f"{'on this host' if on_host else 'per device'}, more than {what} "
            f"({available / 2**30:.2f} GiB), before any activation"
        )
    checkpoint = sum(_bytes(leaf, False) for leaf in leaves) * DISK_MARGIN
    where = next((p for p in [run_dir, *run_dir.absolute().parents] if p.exists()), None)
    free = shutil.disk_usage(where).free if where is not None else None
    if free is not None and checkpoint > free:
        problems.append(
            f"a checkpoint takes {checkpoint / 2**30:.2f} GiB and {where} has "
            f"{free / 2**30:.2f} GiB free"
        )
    if problems:
        sys.exit(
            "error: this run does not fit this machine: " + "; ".join(problems) + ".\n  hint: "
            "`axdsl aot SPEC --target T` shows the whole step's memory and what would fit (more "
            "devices, remat, micro-batches, a smaller optimizer state); --no-preflight runs anyway"
        )
