"""Lowering THE generated train step with jax, on abstract inputs, over fake CPU devices.

`lower_step` lowers here when jax can have as many host devices as the target has chips (jax not
yet imported, or imported with enough), else in a subprocess, `python -m axdsl.aot --lower ...`,
which prints its result as one JSON line. GPU and TPU targets are lowered for their own platform;
with libtpu installed, TPU targets are also compiled for the real topology.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from axdsl.aot.gpu import compile_for_gpus, target_config, target_cudnn
from axdsl.aot.tpu import compile_for_topology
from axdsl.aot.xla import memory_stats, short, xla_total
from axdsl.ir import nodes as ir

__all__ = [
    "RESULT_TAG",
    "abstract_batch",
    "lower_here",
    "lower_step",
    "request_devices",
    "xla_total",
]

RESULT_TAG = "AXDSL_AOT_RESULT "
# jax platform names by chip kind; others (trn) lower for the CPU.
PLATFORMS = {ir.ChipKind.CPU: "cpu", ir.ChipKind.GPU: "cuda", ir.ChipKind.TPU: "tpu"}


# ---------------------------------------------------------------------------- lowering
def lower_step(
    files: dict[str, str],
    spec: Path,
    target: str,
    model: str,
    batch: int,
    seq: int,
    sched: ir.Schedule,
    compile: bool,
) -> dict:
    """Lower the generated step here when jax can have `sched.chips` devices and the schedule's
    XLA flags (`schedule_flags`), else in a subprocess."""
    flags, chips = schedule_flags(sched), sched.chips
    if _can_run_here(chips, flags):
        return lower_here(files, model, batch, seq, chips, sched.kind, compile)
    return _lower_in_subprocess(spec, target, model, batch, seq, chips, compile, flags)


def schedule_flags(sched: ir.Schedule) -> list[str]:
    """The XLA flags the generated train.py sets before jax starts (a GPU schedule's, recorded by
    choose_xla_flags; none elsewhere). XLA reads its flags once, when its backend starts, and
    train.py sets them only when it loads before jax, so the compile that aot reports on must be
    given them the same way: they change what XLA:GPU compiles (cuBLAS gemms for Triton ones,
    no rematerialization pass)."""
    runtime = sched.gpu_runtime
    return [f.text for f in runtime.flags] if runtime is not None else []


def _can_run_here(chips: int, flags: list[str]) -> bool:
    if "jax" not in sys.modules:
        request_devices(chips, flags)
        return True
    current = os.environ.get("XLA_FLAGS", "").split()
    if any(f not in current for f in flags):  # this process's XLA started without them
        return False
    import jax

    try:
        return len(jax.devices("cpu")) >= chips
    except RuntimeError:
        return False


def request_devices(chips: int, schedule: list[str] | None = None) -> None:
    """Ask XLA for `chips` host devices, with the schedule's XLA flags; must run before jax is
    imported. The lowering runs on them, so jax starts its CPU backend only (JAX_PLATFORMS,
    unless set): with libtpu installed and no chip, starting the TPU backend printed libtpu's
    errors about worker hostnames."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = _with_flags(os.environ.get("XLA_FLAGS", ""), chips, schedule or [])


def _with_flags(flags: str, chips: int, schedule: list[str]) -> str:
    """`flags` asking for at least `chips` host devices, with the schedule's flags of names it
    does not set already."""
    m = re.search(r"--xla_force_host_platform_device_count=(\d+)", flags)
    if not (m and int(m.group(1)) >= chips):
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags).strip()
        flags = f"{flags} --xla_force_host_platform_device_count={chips}".strip()
    named = {f.split("=", 1)[0] for f in flags.split()}
    return " ".join([flags, *(f for f in schedule if f.split("=", 1)[0] not in named)]).strip()


def _lower_in_subprocess(
    spec: Path,
    target: str,
    model: str,
    batch: int,
    seq: int,
    chips: int,
    compile: bool,
    schedule: list[str],
) -> dict:
    env = dict(os.environ)
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")
    ).strip()
    env["XLA_FLAGS"] = _with_flags(flags, chips, schedule)
    env.setdefault("JAX_PLATFORMS", "cpu")  # as request_devices: the lowering runs on the host
    root = str(Path(__file__).resolve().parents[2])  # the directory holding axdsl/
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [
        sys.executable,
        "-m",
        "axdsl.aot",
        "--lower",
        str(spec),
        "--target",
        target,
        "--model",
        model,
        "--batch",
        str(batch),
        "--seq",
        str(seq),
    ] + (["--compile"] if compile else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
            result["subprocess"] = True
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"error": f"lowering subprocess exited {proc.returncode}: " + " | ".join(tail)}


def lower_here(
    files: dict[str, str],
    model: str,
    batch: int,
    seq: int,
    chips: int,
    kind: ir.ChipKind,
    compile: bool,
) -> dict:
    """Import the generated files as a throwaway package and lower (maybe compile) its step."""
    tmp = Path(tempfile.mkdtemp(prefix="axdsl_aot_"))
    package = f"_axdsl_aot_{os.getpid()}_{abs(hash(files['model.py'])) % 10**8}"
    from axdsl.build import (
        write_atomic,
    )  # the <root>/<spec>/<target>/ layout, with <root>/runtime.py

    write_atomic(tmp / package / "spec" / "target", files, make_packages=True)
    sys.path.insert(0, str(tmp))
    result: dict = {"devices": chips, "platform": PLATFORMS.get(kind, "cpu")}
    try:
        train = importlib.import_module(f"{package}.spec.target.train")
        mod = importlib.import_module(f"{package}.spec.target.model")
        with _cudnn_of(train, kind):
            _lower_generated(train, mod, result, model, batch, seq, chips, kind, compile)
    except Exception as exc:  # noqa: BLE001 - the generated code failed: say so, exit 1
        msg = short(exc)
        if "cuDNN" in msg or "cudnn" in msg:
            result["skipped"] = (
                "the step uses cuDNN attention, which jax traces only on a machine "
                "with an NVIDIA GPU; the figures are analytic only"
            )
        else:
            result["error"] = (
                f"lowering the generated train step failed: {type(exc).__name__}: {msg}"
            )
    finally:
        sys.path.remove(str(tmp))
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def _lower_generated(
    train,
    mod,
    result: dict,
    model: str,
    batch: int,
    seq: int,
    chips: int,
    kind: ir.ChipKind,
    compile: bool,
) -> None:
    """Check the configuration, lower the step on the mesh, then compile where it means
    something."""
    import jax

    sized = {"seq": seq} if hasattr(train.TRAIN, "seq") else {}  # a classifier's has no seq
    tc = dataclasses.replace(train.TRAIN, model=model, batch=batch, **sized)
    cfg = mod.CONFIGS[model]
    mesh = mod.make_mesh(jax.devices("cpu")[:chips])
    result["mesh"] = {k: int(v) for k, v in mesh.shape.items()}
    if hasattr(train, "check_config"):
        try:
            train.check_config(cfg, tc, mesh)
        except SystemExit as exc:
            result["error"] = f"the generated train.py rejects this configuration: {exc}"
            return
    t0 = time.perf_counter()
    # abstract_state and make_train_step make a PRNG key eagerly (for eval_shape): outside
    # the mesh, on the default device, which also works for a TPU topology without chips.
    state = train.abstract_state(cfg, tc, mesh)
    tokens = abstract_batch(train, tc, mesh)
    step = train.make_train_step(cfg, tc, mesh)
    with jax.set_mesh(mesh):  # the model pins activation layouts only inside a mesh context
        lowered = _lower_for_platform(step, state, tokens, result)
        result["lower_s"] = round(time.perf_counter() - t0, 2)
        result["hlo_chars"] = len(lowered.as_text())
        if compile and result["platform"] == "cpu" and kind is ir.ChipKind.CPU:
            t0 = time.perf_counter()
            compiled = lowered.compile()
            result["compile_s"] = round(time.perf_counter() - t0, 2)
            result["xla"] = memory_stats(compiled.memory_analysis())
        elif compile:
            result["compile_note"] = (
                f"not compiled: a {kind} step compiled for this CPU would not "
                f"give the {kind}'s memory"
            )
    if kind is ir.ChipKind.TPU:
        result.update(_compile_for_tpu(train, mod, cfg, tc, chips))
    elif kind is ir.ChipKind.GPU:
        result.update(_compile_for_gpu(train, mod, cfg, tc, chips))


def _builder(train, mod, cfg, tc):
    """What tpu.py and gpu.py compile: the mesh on the topology's devices, the step and its
    abstract arguments."""

    def build(devices: list):
        mesh = mod.make_mesh(devices)
        # abstract_state's PRNG key runs on the default (CPU) device: a topology has no chips to run
        # it.
        args = (train.abstract_state(cfg, tc, mesh), abstract_batch(train, tc, mesh))
        return mesh, train.make_train_step(cfg, tc, mesh), args

    return build


def _compile_for_tpu(train, mod, cfg, tc, chips: int) -> dict:
    """Compile the same step for the target's real TPU topology (tpu.py), when libtpu is here."""
    from axdsl.targets import parse_target, profiles

    profile = profiles()[parse_target(train.TARGET)[0]]
    build = _builder(train, mod, cfg, tc)
    return compile_for_topology(train.TARGET, chips, profile.chips_per_host, build)


def _compile_for_gpu(train, mod, cfg, tc, chips: int) -> dict:
    """Compile the same step for the target's GPUs (gpu.py), when jax's CUDA plugin is here."""
    from axdsl.targets import parse_target, profiles

    profile = profiles()[parse_target(train.TARGET)[0]]
    build = _builder(train, mod, cfg, tc)
    return compile_for_gpus(profile.name, chips, profile.chips_per_host, build)


def _cudnn_of(train, kind: ir.ChipKind):
    """For a GPU target, jax's cuDNN checks see the target's cuDNN and compute capability while
    the step is traced (gpu.target_cudnn); elsewhere nothing changes."""
    from axdsl.targets import parse_target

    text = target_config(parse_target(train.TARGET)[0]) if kind is ir.ChipKind.GPU else None
    return target_cudnn(text) if text else contextlib.nullcontext()


def abstract_batch(train, tc, mesh):
    """The shape of one global batch, sharded as train.py shards it: tokens [B, S + 1] for
    next_token (and a loss_mask of that shape for chat data); for the other objectives the dict
    of fields runtime.get_examples builds."""
    import jax
    import jax.numpy as jnp

    from axdsl.objectives import batch_fields, get

    sharding = train.batch_sharding(mesh)

    def field(*shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct((tc.batch, *shape), dtype, sharding=sharding)

    objective = getattr(
        train, "BATCHES", getattr(train, "OBJECTIVE", "next_token")
    )  # loss(): its data's batches
    if objective == "next_token":  # chat data (CHAT_FIELDS): tokens and loss_mask, both rows
        chat = getattr(train, "CHAT_FIELDS", None)
        return {k: field(tc.seq + 1) for k in chat} if chat else field(tc.seq + 1)
    if get(objective).preferences:  # answers, masks [B, S + 1]; dpo's reference logps ref_* [B]
        rows = get(objective).fields
        return {
            k: field(dtype=jnp.float32) if k.startswith("ref_") else field(tc.seq + 1) for k in rows
        }
    if objective == "classify":
        shape, _ = train.IMAGES[tc.model]
        return {"images": field(*shape, dtype=jnp.float32), "labels": field()}
    return {k: field(tc.seq) for k in batch_fields(objective, train.INPUTS)}  # seq2seq, masked_lm


def _lower_for_platform(step, state, tokens, result: dict):
    """Lower for the target's platform; if that fails (not cpu), say why and lower for the CPU."""
    platform = result["platform"]
    try:
        return step.trace(state, tokens).lower(lowering_platforms=(platform,))
    except Exception as exc:  # noqa: BLE001 - report why, then fall back to the CPU lowering
        if platform == "cpu":
            raise
        result["note"] = f"lowering for {platform} failed ({short(exc)}); lowered for cpu instead"
        result["platform"] = "cpu"
        return step.trace(state, tokens).lower(lowering_platforms=("cpu",))
