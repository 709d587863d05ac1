"""Compiling THE generated train step for a real TPU topology on a machine without one.

With libtpu installed (`pip install -e '.[tpu]'`), `jax.experimental.topologies` describes a
TPU slice (`get_topology_desc("v5e:2x4", "tpu", chips_per_host_bounds=[2, 4, 1])`) whose
compile-only devices a mesh can be built on; XLA's TPU compiler then compiles the step as it
would on the slice, and its `memory_analysis()` is the per-chip memory the step will use. That
figure decides `axdsl aot`'s verdict (report.py), against the HBM XLA says a chip has for a
program (`hbm_available`), which is what its own RESOURCE_EXHAUSTED check compares with.

A slice's chips are split into hosts; libtpu's default host is 2x2x1, which a single chip (or
two) does not divide: `host_bounds` gives the bounds per chip count.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from typing import Any
from collections.abc import Callable

from axdsl.aot.xla import is_out_of_memory, memory_stats, out_of_memory, short

# TPU topologies by chip count for jax.experimental.topologies (2-D tori for v5e/v6e, 3-D for
# v4/v5p).
TPU_TOPOLOGY_2D = {
    1: "1x1",
    2: "1x2",
    4: "2x2",
    8: "2x4",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}
TPU_TOPOLOGY_3D = {
    1: "1x1x1",
    2: "1x1x2",
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
}
# libtpu's name of one host of each generation (TPU_ACCELERATOR_TYPE).
_ACCELERATOR_TYPES = {"v4": "v4-8", "v5e": "v5litepod-8", "v5p": "v5p-8", "v6e": "v6e-8"}
# What `build(devices)` returns: the mesh, the jitted step and its abstract arguments.
Build = Callable[[list], tuple[Any, Any, tuple]]
_HBM_AVAILABLE: dict[str, int | None] = {}  # device kind -> XLA's HBM for a program, per process


def libtpu_installed() -> bool:
    """Whether XLA's TPU compiler is here (the `tpu` extra)."""
    return importlib.util.find_spec("libtpu") is not None


def topology(target: str, chips: int) -> str | None:
    """The topology name of `chips` chips of `target`'s generation ("v5e:2x4"), if one is known."""
    m = re.match(r"tpu-(v\d+[a-z]*)", target)
    if not m:
        return None
    gen = m.group(1)
    shape = (TPU_TOPOLOGY_2D if gen in ("v5e", "v6e") else TPU_TOPOLOGY_3D).get(chips)
    return f"{gen}:{shape}" if shape else None


def host_bounds(target: str, chips: int, chips_per_host: int) -> list[int]:
    """Chips per host along each torus axis: the whole slice when it is one host or less (one
    chip is [1, 1, 1]; libtpu's default, [2, 2, 1], does not divide it), else one full host."""
    name = topology(target, min(chips, chips_per_host))
    dims = [int(d) for d in name.split(":")[1].split("x")] if name else [1, 1, 1]
    return (dims + [1, 1])[:3]


def compile_for_topology(target: str, chips: int, chips_per_host: int, build: Build) -> dict:
    """Compile the step for `chips` chips of `target`; XLA's per-chip memory, or why not."""
    if not libtpu_installed():
        return {
            "tpu": "libtpu is not installed: the verdict is analytic. For XLA's exact per-chip "
            "memory of this TPU, `pip install -e '.[tpu]'` (the libtpu jax[tpu] pins) and rerun"
        }
    name = topology(target, chips)
    if name is None:
        return {"tpu": f"no known TPU topology for {chips} chips of {target}"}
    bounds = host_bounds(target, chips, chips_per_host)
    try:
        devices = _devices(name, bounds)
    except Exception as exc:  # noqa: BLE001 - libtpu refused the topology: say so, stay analytic
        return {"tpu": f"no TPU topology {name} (host bounds {bounds}): {short(exc)}"}
    if len(devices) != chips:
        return {
            "tpu": f"TPU topology {name} has {len(devices)} compile devices, not {chips} chips "
            "(a chip with two cores): the verdict is analytic"
        }
    result: dict = {
        "tpu_topology": name,
        "host_bounds": bounds,
        "hbm_available": hbm_available(devices),
    }
    result.update(_compile(devices, build, name))
    return result


def _devices(name: str, bounds: list[int]) -> list:
    """The slice's compile-only devices. libtpu takes a lock file (/tmp/libtpu_lockfile) that
    makes a second process fail while one holds it; compiling without a chip shares nothing, so
    this process does not take it. Off a TPU VM, libtpu prints errors about the accelerator type
    and worker hostnames it cannot find; naming them (a host of the same generation) keeps it
    quiet. Variables already set are left alone; all are read once, when libtpu loads."""
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault(
        "TPU_ACCELERATOR_TYPE", _ACCELERATOR_TYPES.get(name.split(":")[0], "v5litepod-8")
    )
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

    return list(topologies.get_topology_desc(name, "tpu", chips_per_host_bounds=bounds).devices)


def _compile(devices: list, build: Build, name: str) -> dict:
    """Lower and compile on the topology; a compile that runs out of HBM is a verdict, not an
    error."""
    import jax

    t0 = time.perf_counter()
    try:
        mesh, step, args = build(devices)
        with jax.set_mesh(mesh):
            compiled = step.lower(*args).compile()
    except Exception as exc:  # noqa: BLE001
        seconds = round(time.perf_counter() - t0, 2)
        if is_out_of_memory(str(exc)):
            return {"xla_oom": out_of_memory(str(exc)), "compile_s": seconds}
        return {"tpu": f"compiling for TPU topology {name} failed: {short(exc)}"}
    return {
        "xla": memory_stats(compiled.memory_analysis()),
        "compile_s": round(time.perf_counter() - t0, 2),
    }


def hbm_available(devices: list) -> int | None:
    """The HBM XLA gives a program on one of these chips, in bytes (v5e: 15.75 GiB, v5p: 95.74):
    read off the RESOURCE_EXHAUSTED message of a small program that asks for far more (0.1 s)."""
    kind = devices[0].device_kind
    if kind not in _HBM_AVAILABLE:
        _HBM_AVAILABLE[kind] = _probe_hbm(devices[0])
    return _HBM_AVAILABLE[kind]


def _probe_hbm(device) -> int | None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.sharding.Mesh([device], ("x",))
    x = jax.ShapeDtypeStruct((2**20,), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))

    def too_big(v):  # a [2^20, 2^14] float32 temporary: 64 GiB, more than any chip has
        return jnp.cumsum(jnp.outer(v, v[: 2**14]), axis=0)[:: 2**14]

    try:
        jax.jit(too_big).lower(x).compile()
    except Exception as exc:  # noqa: BLE001 - the message is the point
        return out_of_memory(str(exc))["available"]
    return None
