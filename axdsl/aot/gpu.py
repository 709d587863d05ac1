"""Compiling THE generated train step for real NVIDIA GPUs on a machine without one.

With the CUDA plugin installed (`pip install -e '.[gpu]'`: jax-cuda13-plugin and -pjrt at the
installed jax's version), `jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=TEXT, topology="1xHOSTSxGPUS")` describes GPUs that XLA's GPU compiler can compile
for, and a mesh can be built on, with no GPU and no CUDA libraries. TEXT is the chip's
GpuTargetConfigProto, shipped as data beside the profiles (axdsl/targets/gpu/<profile>.txtpb).
jax must start its CPU backend only (JAX_PLATFORMS=cpu, which aot's lowering sets): the plugin's
own start-up check wants a GPU and cuDNN.

Two things jax reads from the machine rather than from the target, and that this module supplies
from the target config while compiling (`target_cudnn`):
- cuDNN's version: jax asks the installed cuDNN for it before it builds a cuDNN attention call,
  and there is none here;
- the compute capability: jax reads it from the default backend, the CPU here, so it would treat
  an H100 as pre-Hopper and refuse cuDNN attention with head_dim > 128.

Unlike XLA's TPU compiler, XLA's GPU compiler does not refuse a step that is too big (a 126 GB
step compiled for an 80 GB H100): report.py compares XLA's figure with the memory pool the
generated train.py asks for. XLA:GPU allocates a program's temporaries as one block of
`temp_size`, so its figure is arguments + temporaries + outputs not donated (xla.xla_total).
What the compiled program runs (cuDNN calls, fp8 gemms, collectives) is read off its HLO text by
hlo.py.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import math
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from axdsl.aot.hlo import inventory
from axdsl.aot.xla import memory_stats, short

CONFIGS = Path(__file__).resolve().parent.parent / "targets" / "gpu"
# What `build(devices)` returns: the mesh, the jitted step and its abstract arguments.
Build = Callable[[list], tuple[Any, Any, tuple]]
# The CUDA plugins jax loads (jax_plugins.<name>), newest first.
PLUGINS = ("xla_cuda13", "xla_cuda12")
INSTALL_HINT = (
    "for XLA's exact per-GPU memory and the kernels the step runs, `pip install -e '.[gpu]'` "
    "(jax's CUDA plugin at jax's version, about 130 MB; no GPU or CUDA libraries needed) and rerun"
)


def plugin_installed() -> bool:
    """Whether jax's CUDA plugin is here (the `gpu` extra)."""
    try:
        return any(importlib.util.find_spec(f"jax_plugins.{p}") is not None for p in PLUGINS)
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False


def plugin_mismatch() -> str | None:
    """Why the installed CUDA plugin cannot serve this jax (another version: jax refuses to load
    it, or loads it and fails), or None."""
    import jax

    for name in ("jax-cuda13-plugin", "jax-cuda12-plugin"):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if version != jax.__version__:
            return (
                f"{name} {version} is installed for jax {jax.__version__}: "
                f"`pip install {name}=={jax.__version__} "
                f"{name.replace('plugin', 'pjrt')}=={jax.__version__}`"
            )
        return None
    return None


def target_config(profile: str) -> str | None:
    """The GpuTargetConfigProto text of a GPU profile ("gpu-h100"), if axdsl ships one."""
    path = CONFIGS / f"{profile}.txtpb"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def config_value(text: str, message: str, field: str) -> int:
    """An integer field of a nested message in a target config: `config_value(text,
    "cuda_compute_capability", "major")` is 9 for an H100 (0 where the text gives none)."""
    m = re.search(rf"{message}\s*{{([^}}]*)}}", text)
    f = re.search(rf"\b{field}:\s*(\d+)", m.group(1)) if m else None
    return int(f.group(1)) if f else 0


def device_memory(text: str) -> int:
    """The device memory a target config gives each GPU, in bytes."""
    m = re.search(r"device_memory_size:\s*(\d+)", text)
    return int(m.group(1)) if m else 0


def topology(chips: int, chips_per_host: int) -> str:
    """jax's name for `chips` GPUs, `chips_per_host` to a host: slices x hosts x GPUs per host
    ("1x1x8" one node of 8, "1x4x8" four nodes)."""
    per_host = min(chips, chips_per_host)
    return f"1x{math.ceil(chips / per_host)}x{per_host}"


@contextlib.contextmanager
def target_cudnn(text: str) -> Iterator[None]:
    """While tracing, jax's cuDNN attention checks see the target's cuDNN version and compute
    capability instead of this machine's (none, and the CPU's). jax keeps these checks in a
    private module; if it moves, nothing is patched and cuDNN attention fails to trace, which
    the report says."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
    except ImportError:
        yield
        return
    version = tuple(config_value(text, "dnn_version_info", k) for k in ("major", "minor", "patch"))
    capability = tuple(config_value(text, "cuda_compute_capability", k) for k in ("major", "minor"))

    def at_least(c: str) -> bool:
        return capability >= tuple(int(x) for x in c.split("."))

    def equal(c: str) -> bool:
        return capability == tuple(int(x) for x in c.split("."))

    patched = {
        "check_cudnn_version": lambda: version[0] * 10000 + version[1] * 100 + version[2],
        "check_compute_capability": at_least,
        "is_cuda_compute_capability_equal": equal,
    }
    saved = {k: getattr(fa, k) for k in patched if hasattr(fa, k)}
    try:
        for k, f in patched.items():
            if k in saved:
                setattr(fa, k, f)
        yield
    finally:
        for k, f in saved.items():
            setattr(fa, k, f)


def compile_for_gpus(profile: str, chips: int, chips_per_host: int, build: Build) -> dict:
    """Compile the step for `chips` GPUs of `profile`; XLA's per-GPU memory and the kernels the
    program runs, or why not."""
    if not plugin_installed():
        return {
            "gpu": f"jax's CUDA plugin is not installed: the verdict is analytic; {INSTALL_HINT}"
        }
    mismatch = plugin_mismatch()
    if mismatch is not None:
        return {"gpu": f"the verdict is analytic: {mismatch}"}
    text = target_config(profile)
    if text is None:
        return {"gpu": f"axdsl has no target config for {profile}: the verdict is analytic"}
    name = topology(chips, chips_per_host)
    try:
        devices = _devices(text, name)
    except Exception as exc:  # noqa: BLE001 - the plugin refused the topology: stay analytic
        return {"gpu": f"no GPU topology {name}: {short(exc)}"}
    result: dict = {"gpu_topology": name, "device_memory": device_memory(text)}
    result.update(_compile(devices, build, name, text))
    return result


def _devices(text: str, name: str) -> list:
    from jax.experimental import topologies

    return list(
        topologies.get_topology_desc(platform="cuda", target_config=text, topology=name).devices
    )


def _compile(devices: list, build: Build, name: str, text: str) -> dict:
    """Lower and compile on the GPU topology: XLA's memory figures and the program's kernels."""
    import jax

    t0 = time.perf_counter()
    try:
        with target_cudnn(text):
            mesh, step, args = build(devices)
            with jax.set_mesh(mesh):
                compiled = step.lower(*args).compile()
    except Exception as exc:  # noqa: BLE001
        return {"gpu": f"compiling for GPU topology {name} failed: {short(exc)}"}
    return {
        "xla": memory_stats(compiled.memory_analysis()),
        "compile_s": round(time.perf_counter() - t0, 2),
        "kernels": inventory(compiled.as_text()),
    }
