"""choose_xla_flags and the generated train.py: a GPU schedule's XLA flags and memory fraction.

The GPU train.py sets them before it imports jax, under the user's own XLA_FLAGS (a flag of the
same name the user set wins) and XLA_PYTHON_CLIENT_MEM_FRACTION (the user's wins); CPU and TPU
train.py set nothing. XLA aborts on a flag it does not know, so where the CUDA plugin is
installed a GPU compile with no GPU (jax.experimental.topologies) runs with exactly the
generated flags.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from axdsl.ir import nodes as ir
from axdsl.pipeline import compile_spec
from axdsl.targets import profiles

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "tiny_llama.axl"
GPU_TRAIN = ROOT / "generated" / "tiny_llama" / "gpu_h100" / "train.py"
IMPORT_JAX = "import jax  # noqa: E402\n"

# A minimal H100 SXM as XLA's GPU compiler reads it (GpuTargetConfigProto, text form).
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84942979072 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 patch: 0 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def _prelude() -> str:
    """The generated GPU train.py up to its `import jax`: the part that sets the environment."""
    text = GPU_TRAIN.read_text(encoding="utf-8")
    assert IMPORT_JAX in text
    return text[: text.index(IMPORT_JAX)]


def _run(code: str, env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _environment_after_prelude(env: dict[str, str]) -> dict[str, str]:
    show = "\nprint(json.dumps({k: os.environ.get(k) for k in ('XLA_FLAGS', 'XLA_PYTHON_CLIENT_MEM_FRACTION')}))"
    return json.loads(_run(_prelude() + "\nimport json" + show, env).splitlines()[-1])


def test_gpu_schedule_records_flags_and_fraction():
    gpu = compile_spec(SPEC, "gpu-h100").target.gpu_runtime
    assert gpu is not None
    flags = {f.flag: f.value for f in gpu.flags}
    assert flags[ir.XlaFlag.LATENCY_HIDING_SCHEDULER] == "true"
    assert flags[ir.XlaFlag.TRITON_GEMM] == "false"
    assert flags[ir.XlaFlag.DISABLE_HLO_PASSES] == "rematerialization"
    assert flags[ir.XlaFlag.PIPELINED_ALL_GATHER] == "true"  # 8 chips: the collectives' flags
    assert all(f.reason for f in gpu.flags)
    assert gpu.mem_fraction == profiles()["gpu-h100"].mem_fraction
    one = compile_spec(SPEC, "gpu-h100-1").target.gpu_runtime
    assert one is not None and ir.XlaFlag.PIPELINED_ALL_GATHER not in {f.flag for f in one.flags}
    for target in ("cpu", "tpu-v5e"):
        assert compile_spec(SPEC, target).target.gpu_runtime is None


def test_gpu_train_sets_the_flags_and_fraction_before_jax():
    recorded = compile_spec(SPEC, "gpu-h100").target.gpu_runtime
    assert recorded is not None
    env = _environment_after_prelude({})
    assert env["XLA_FLAGS"] == " ".join(f.text for f in recorded.flags)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == str(recorded.mem_fraction)


def test_the_users_flags_and_fraction_win():
    mine = "--xla_gpu_enable_command_buffer=FUSION --xla_dump_to=/tmp/hlo"
    env = _environment_after_prelude({"XLA_FLAGS": mine, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    flags = env["XLA_FLAGS"].split()
    assert flags[-2:] == mine.split()
    assert not any(f.startswith("--xla_gpu_enable_command_buffer=") for f in flags[:-2])
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"


@pytest.mark.parametrize("target", ["cpu", "tpu_v5e"])
def test_cpu_and_tpu_train_set_no_xla_environment(target):
    trains = sorted((ROOT / "generated").glob(f"*/{target}/train.py"))
    assert trains
    for train in trains:
        text = train.read_text(encoding="utf-8")
        assert "XLA_FLAGS" not in text and "MEM_FRACTION" not in text, train


@pytest.mark.skipif(
    importlib.util.find_spec("jax_plugins.xla_cuda13") is None,
    reason="jax-cuda13-plugin is not installed: no GPU compiler to check the flags with",
)
def test_a_gpu_compile_accepts_exactly_the_generated_flags():
    """XLA aborts the process on an unknown flag; with triton gemms off, a matmul is cuBLAS's."""
    compile_here = f"""
import re
import jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec as P
topo = topologies.get_topology_desc(platform="cuda", target_config={H100!r}, topology="1x1x2")
mesh = topologies.make_mesh(topo, (2,), ("d",))
x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P("d")))
w = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "d")))
text = jax.jit(lambda x, w: jnp.sum(x @ w)).lower(x, w).compile().as_text()
print(os.environ["XLA_FLAGS"])
print(sorted(set(re.findall(r'custom_call_target="([^"]+)"', text))))
"""
    out = _run(_prelude() + IMPORT_JAX + compile_here, {"JAX_PLATFORMS": "cpu"})
    flags, calls = out.splitlines()[-2:]
    assert "--xla_gpu_enable_triton_gemm=false" in flags.split()
    assert "__cublas$lt$matmul" in calls
