"""choose_xla_flags: the XLA flags and memory fraction of a GPU schedule, each with its reason.

What the fast H100 recipes set (MaxText's GPU configs, NVIDIA JAX-Toolbox's GPU_performance.md
and its MaxText page), kept where they fit this compiler's choices:

    latency-hiding scheduler on      collectives and host copies overlap compute
    command buffers off              CUDA graphs, until measured on this code
    Triton gemms off                 matmuls in cuBLAS/cuBLASLt (fp8: cuBLASLt's fp8 gemm)
    rematerialization pass off       remat is by named points (insert_remat, fit_remat); XLA's
                                     own pass must not recompute more behind that choice
    more than one chip: combine thresholds, pipelined all-gather / reduce-scatter / all-reduce,
                        double-buffered layer loops (FSDP's collectives overlap the layers)

and the memory fraction of the profile (XLA_PYTHON_CLIENT_MEM_FRACTION; fit_remat and `axdsl aot`
size a step to that pool). Other chips get none (`Schedule.gpu_runtime` stays None).

    before:  schedule gpu-h100-8: profile gpu-h100, 8 chips; no target block matched
    after:   schedule gpu-h100-8: profile gpu-h100, 8 chips; no target block matched
               --xla_gpu_enable_latency_hiding_scheduler=true  # choose_xla_flags: ...
               ...
               XLA_PYTHON_CLIENT_MEM_FRACTION=0.9  # choose_xla_flags: ...

The generated train.py sets them before it imports jax, under the user's own XLA_FLAGS (a flag
the user sets wins). XLA aborts on a flag it does not know, so every flag here is one that
jaxlib 0.10.2 and 0.11.2 accept (tests/test_xla_flags.py compiles for a GPU with them).
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.errors import filled
from axdsl.ir import nodes as ir
from axdsl.ir.printer import remat_text
from axdsl.targets import profiles

F = ir.XlaFlag
RECIPES = "MaxText's and JAX-Toolbox's H100 recipes"

# Every GPU step: how XLA schedules and which libraries run the matmuls.
ALWAYS = (
    ir.FlagSetting(
        F.LATENCY_HIDING_SCHEDULER,
        "true",
        f"order the step so collectives and host copies run while compute does ({RECIPES})",
    ),
    ir.FlagSetting(
        F.COMMAND_BUFFER,
        "",
        "no CUDA graphs: JAX-Toolbox's MaxText recipe turns them off; off until measured here",
    ),
)

# More than one chip: the collectives of FSDP and data parallelism, in few large messages that
# overlap the layers (JAX-Toolbox's MaxText recipe).
COLLECTIVES = (
    ir.FlagSetting(
        F.ALL_REDUCE_COMBINE_BYTES,
        str(2**30),
        "gradient all-reduces combined up to 1 GiB: large messages use more of NVLink",
    ),
    ir.FlagSetting(
        F.ALL_GATHER_COMBINE_BYTES,
        str(2**30),
        "FSDP's weight all-gathers combined up to 1 GiB (at least a layer's weights)",
    ),
    ir.FlagSetting(
        F.REDUCE_SCATTER_COMBINE_BYTES,
        str(2**27),
        "FSDP's gradient reduce-scatters combined up to 128 MiB",
    ),
    ir.FlagSetting(
        F.ALL_GATHER_COMBINE_BY_DIM,
        "false",
        "all-gathers combine whatever dimension they gather on, into fewer messages",
    ),
    ir.FlagSetting(
        F.REDUCE_SCATTER_COMBINE_BY_DIM,
        "false",
        "reduce-scatters combine whatever dimension they scatter on, into fewer messages",
    ),
    ir.FlagSetting(
        F.PIPELINED_ALL_GATHER,
        "true",
        "the scan over layers gathers the next layer's weights while this layer computes",
    ),
    ir.FlagSetting(
        F.PIPELINED_REDUCE_SCATTER,
        "true",
        "the scan over layers scatters a layer's gradients while the next layer computes",
    ),
    ir.FlagSetting(
        F.PIPELINED_ALL_REDUCE,
        "true",
        "the scan over layers all-reduces a layer's gradients while the next layer computes",
    ),
    ir.FlagSetting(
        F.WHILE_LOOP_DOUBLE_BUFFERING,
        "true",
        "layer loops unrolled by two, so one layer's collectives overlap the other's compute",
    ),
)


def choose_xla_flags(module: ir.Module) -> ir.Module:
    schedule = module.target
    if schedule.kind is not ir.ChipKind.GPU:
        return module
    flags = ALWAYS + (_gemms(schedule), _remat(schedule))
    collectives = COLLECTIVES if schedule.chips > 1 else ()
    profile = profiles()[schedule.profile]
    fraction = filled(profile.mem_fraction, f"{profile.name}'s mem_fraction", "profiles.toml")
    runtime = ir.GpuRuntime(flags + collectives, fraction, _fraction_reason(fraction))
    return replace(module, schedule=replace(schedule, gpu_runtime=runtime))


def _gemms(schedule: ir.Schedule) -> ir.FlagSetting:
    """cuBLAS gemms; with fp8 matmuls, cuBLASLt's fp8 gemm (a Triton gemm otherwise)."""
    fp8 = schedule.quantize.value.format is ir.QuantFormat.FP8
    why = (
        "matmuls in cuBLAS/cuBLASLt, the fp8 ones as cuBLASLt's fp8 gemm "
        "(__cublas$lt$matmul$f8), not Triton gemms"
        if fp8
        else "matmuls in cuBLAS/cuBLASLt, as MaxText's H100 recipe, not Triton gemms"
    )
    return ir.FlagSetting(F.TRITON_GEMM, "false", why)


def _remat(schedule: ir.Schedule) -> ir.FlagSetting:
    """XLA's rematerialization pass off: the schedule's remat policy decides what is recomputed."""
    policy = remat_text(schedule.remat.value)
    return ir.FlagSetting(
        F.DISABLE_HLO_PASSES,
        "rematerialization",
        f"the schedule's remat({policy}) decides what is recomputed; XLA's pass must not redo it",
    )


def _fraction_reason(fraction: float) -> str:
    return (
        f"XLA's allocator takes {fraction:.0%} of the HBM (jax's default 75%), the rest is for "
        "CUDA, cuBLAS and NCCL; fit_remat and `axdsl aot` size a step to this pool"
    )
