"""gpu-* steps compiled by XLA's GPU compiler with no GPU (axdsl/aot/gpu.py), and what they run.

The compiles need jax's CUDA plugin (the `gpu` extra, which .ci/run installs); without it they
are skipped and the rest still runs. Each compile is a 2-layer model: a few seconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from axdsl.aot import analyze, selected_kernels
from axdsl.aot import gpu
from axdsl.aot.hlo import fp8_gemms, inventory, missing, summary
from axdsl.pipeline import compile_spec
from axdsl.targets import profiles

PLUGIN = gpu.plugin_installed()
needs_plugin = pytest.mark.skipif(not PLUGIN, reason="jax's CUDA plugin (the gpu extra) is absent")

SPEC = """import "std/transformer.axl"
model lm = DecoderLM {{
  vocab = 512  dim = 256  layers = 2  heads = {heads}  kv_heads = 1  ffn = 512  max_seq = 256
  dtype = bf16  param_dtype = f32
}}
train {{ batch = 4  seq = 128 }}
{target}
"""
# A matmul written as quantize-dequantize around a dot in bf16: the pattern fp8 must not become.
BF16_DOT = """HloModule m, entry_computation_layout={(f8e4m3fn[4,4]{1,0}, f8e4m3fn[4,4]{1,0})->bf16[4,4]{1,0}}

%gemm_fusion_dot (parameter_0: f8e4m3fn[4,4], parameter_1: f8e4m3fn[4,4]) -> bf16[4,4] {
  %parameter_0 = f8e4m3fn[4,4]{1,0} parameter(0)
  %convert.1 = bf16[4,4]{1,0} convert(%parameter_0)
  %parameter_1 = f8e4m3fn[4,4]{1,0} parameter(1)
  %convert.2 = bf16[4,4]{1,0} convert(%parameter_1)
  ROOT %dot.3 = bf16[4,4]{1,0} dot(%convert.1, %convert.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f8e4m3fn[4,4], w: f8e4m3fn[4,4]) -> bf16[4,4] {
  %x = f8e4m3fn[4,4]{1,0} parameter(0)
  %w = f8e4m3fn[4,4]{1,0} parameter(1)
  %ar = ((bf16[4,4]{1,0}, /*index=1*/bf16[4,4]{1,0}), bf16[4,4]{1,0}) all-reduce-start(%x), replica_groups={}
  %ard = bf16[4,4]{1,0} all-reduce-done(%ar)
  ROOT %fusion = bf16[4,4]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion_dot
}
"""


def _spec(tmp_path: Path, heads: int = 2, target: str = "") -> Path:
    path = tmp_path / "lm.axl"
    path.write_text(SPEC.format(heads=heads, target=target))
    return path


# ---------------------------------------------------------------------------- no compile
def test_topologies_name_hosts_of_eight():
    assert gpu.topology(1, 8) == "1x1x1"
    assert gpu.topology(8, 8) == "1x1x8"
    assert gpu.topology(64, 8) == "1x8x8"


def test_every_gpu_profile_ships_its_target_config_with_the_profiles_memory():
    for name, p in profiles().items():
        if p.kind.value != "gpu":
            continue
        text = gpu.target_config(name)
        assert text is not None, name
        assert gpu.device_memory(text) / 2**30 == pytest.approx(p.hbm_gib, abs=0.01), name
        assert gpu.config_value(text, "cuda_compute_capability", "major") >= 8
        # cuDNN flash attention's head_dim bound follows the capability (jax: 256 from 9.0)
        hopper = gpu.config_value(text, "cuda_compute_capability", "major") >= 9
        assert p.cudnn_head_dim_max == (256 if hopper else 128), name


def test_without_the_plugin_aot_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(gpu, "plugin_installed", lambda: False)
    result = gpu.compile_for_gpus("gpu-h100", 8, 8, build=lambda devices: None)
    assert "pip install -e '.[gpu]'" in result["gpu"] and "analytic" in result["gpu"]


def test_the_inventory_types_a_dots_operands_and_sees_a_bf16_matmul():
    inv = inventory(BF16_DOT)
    assert inv["gemms"] == {"bf16 x bf16": 1}
    assert inv["collectives"] == {"all-reduce": 1}  # the async pair once; a tuple type with `=`
    assert fp8_gemms(inv) == 0
    problems = missing(inv, cudnn=True, fp8=True)
    assert len(problems) == 2 and "fp8" in problems[1] and "cuDNN" in problems[0]
    assert missing(inv, cudnn=False, fp8=False) == []
    assert summary(inv)[0] == "gemms: 1 (0 fp8 x fp8; 1 bf16 x bf16)"


# ---------------------------------------------------------------------------- compiles
@needs_plugin
def test_gpu_h100_step_runs_cudnn_attention_and_fp8_gemms(tmp_path):
    # gpu-h100's defaults: cuDNN attention and fp8 matmuls in the blocks, FSDP over 2 GPUs.
    spec = _spec(tmp_path)
    r = analyze(spec, "gpu-h100-2")
    lo = r.lowering
    assert lo.get("gpu_topology") == "1x1x2", lo
    assert selected_kernels(compile_spec(spec, "gpu-h100-2").models[0]) == (True, True)
    inv = lo["kernels"]
    assert any("fmhaSoftmaxBackward" in k for k in inv["cudnn"]), inv
    assert any(k.endswith("fmhaSoftmax") for k in inv["cudnn"]), inv
    # 7 matmuls with a parameter per layer, each with its two backward gemms, in fp8; only the
    # tied head stays bf16
    assert fp8_gemms(inv) >= 21, inv
    assert r.kernel_problems == []
    assert inv["collectives"].get("all-gather") and inv["collectives"].get("reduce-scatter")
    # XLA decides: its figure against the pool train.py asks for
    assert r.gpu and r.xla_decides and r.fits
    assert r.limit == int(lo["device_memory"] * profiles()["gpu-h100"].mem_fraction)
    assert r.peak == lo["xla"]["argument"] + lo["xla"]["temp"] + max(
        lo["xla"]["output"] - lo["xla"]["alias"], 0
    )


@needs_plugin
def test_head_dim_256_takes_cudnn_on_hopper_with_no_gpu(tmp_path):
    # jax would read the compute capability from this CPU and refuse head_dim > 128; the target
    # config's 9.0 is what it sees while the step is traced (gpu.target_cudnn).
    # Unquantized, the step's gemms are all bf16 (and XLA's attention would have none of cuDNN's).
    spec = _spec(tmp_path, heads=1, target='target "gpu*" { quantize(none) }')
    r = analyze(spec, "gpu-h100-1")
    assert "error" not in r.lowering and "gpu" not in r.lowering, r.lowering
    inv = r.lowering["kernels"]
    assert inv["cudnn"] and fp8_gemms(inv) == 0 and inv["gemms"].get("bf16 x bf16"), inv
    assert r.kernel_problems == [] and inv["collectives"] == {}  # one GPU
    # the patch is undone afterwards
    from jax._src.cudnn import fused_attention_stablehlo as fa

    assert not re.search(r"axdsl", fa.check_compute_capability.__module__)


def test_a_gpu_step_bigger_than_the_pool_does_not_fit(tmp_path):
    # XLA:GPU compiles a step of any size (a 126 GB step compiled for an 80 GB H100): its figure
    # is held to the pool train.py asks for, and the compile's success says nothing.
    spec = _spec(tmp_path)
    r = analyze(spec, "gpu-h100-1", lower=False)
    pool = int(84942979072 * 0.90)
    xla = {"argument": 10 * 2**30, "temp": pool - 10 * 2**30 + 1, "output": 8, "alias": 8}
    r.lowering = {"gpu_topology": "1x1x1", "device_memory": 84942979072, "xla": xla}
    assert r.gpu and r.xla_decides and r.limit == pool and r.peak == pool + 1 and not r.fits
    xla["temp"] -= 1
    assert r.fits
    r.lowering["gpu"] = "compiling for GPU topology 1x1x1 failed: ..."
    del r.lowering["xla"]  # no figure: the analytic verdict again
    assert not r.gpu and not r.xla_decides
