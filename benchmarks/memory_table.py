"""The analytic per-chip memory (axdsl/analysis/memory.py) against XLA's TPU compile, per config.

    python benchmarks/memory_table.py            # 20 TPU configs (5 on a v5e 2x4) + 7 CPU ones
    python benchmarks/memory_table.py --quick    # 5 TPU configs + 1 CPU one
    python benchmarks/memory_table.py --gpu      # 14 GPU configs (H100 x1, x8, H200), no GPU

On the 2 shared cores here a TPU compile takes 15-220 s (25 min for all, with other compiles
running beside it); `--quick` or `--only NAME` for less, `--xla-cache` to skip the compiles.

Each config is a spec at the shapes measured on a TPU v5e chip (/work/tpu_results, issue 34): the
Llama 3.2 1B, a 32k-token Llama, Gemma 2, a Qwen3 MoE and Mamba-2 cut to one chip, under each remat
policy. The generated train step is compiled deviceless for tpu-v5e-1 (libtpu, no chip) and XLA's
figure (its peak_memory_in_bytes, what a chip was measured to need within 2.5%, or what its
RESOURCE_EXHAUSTED message says the program needs) is printed beside the analytic total, with the
error in %. The "verdict" column
says whether the analytic verdict (total <= XLA's available HBM) agrees with XLA's. A few small
configs are compiled for this CPU too (XLA:CPU's memory_analysis). Without libtpu only the CPU
rows and the analytic figures are printed.

`--json FILE` writes the rows; `--xla-cache FILE` reuses XLA's figures of an earlier run (the
analytic side is recomputed: the fast loop when changing the model).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # the cpu-8 rows

LLAMA_1B = """import "std/transformer.axl"
model llama1b = DecoderLM {
  vocab = 128256  dim = 2048  layers = 16  heads = 32  kv_heads = 8  ffn = 8192  tied = true
  rope_theta = 500000.0  max_seq = 2048  norm = RMSNorm(eps = 1e-5)
  block = Block(attn = Attention(rope_scaling = "llama3", rope_factor = 32.0, rope_low_freq = 1.0,
                                 rope_high_freq = 4.0, rope_original_max_seq = 8192))
  dtype = bf16  param_dtype = bf16
}
"""
LLAMA_32K = """import "std/transformer.axl"
model llama32k = DecoderLM {
  vocab = 128256  dim = 2048  layers = 2  heads = 16  kv_heads = 8  ffn = 8192  tied = true
  rope_theta = 500000.0  max_seq = 32768  norm = RMSNorm(eps = 1e-5)
  dtype = bf16  param_dtype = f32
}
"""
GPT2_MHA = """import "std/transformer.axl"
model gpt2m = DecoderLM {
  vocab = 50304  dim = 1024  layers = 24  heads = 16  ffn = 4096  max_seq = 1024
  positions = "learned"  tied = true  norm = LayerNorm(eps = 1e-5)
  block = Block(attn = Attention(rope = false, bias = true), mlp = MLP(hidden = ffn, act = "gelu", bias = true))
  dtype = bf16  param_dtype = f32
}
"""
GEMMA2 = """import "std/transformer.axl"
model gemma2 = DecoderLM {
  vocab = 256000  dim = 2304  layers = 6  heads = 8  kv_heads = 4  ffn = 9216  max_seq = 8192
  rope_theta = 10000.0  tied = true  norm = GemmaRMSNorm(eps = 1e-6)
  embed_multiplier = sqrt(dim)  logit_softcap = 30.0
  block = [Block(post_norms = true, mlp = GatedMLP(hidden = ffn, act = "gelu_tanh"),
                 attn = Attention(head_dim = 256, scale = 0.0625, softcap = 50.0, window = 4096)),
           Block(post_norms = true, mlp = GatedMLP(hidden = ffn, act = "gelu_tanh"),
                 attn = Attention(head_dim = 256, scale = 0.0625, softcap = 50.0))]
  dtype = bf16  param_dtype = bf16
}
"""
QWEN3_MOE = """import "std/transformer.axl"
model qwen3moe = DecoderLM {
  vocab = 151936  dim = 2048  layers = 2  heads = 32  kv_heads = 4  ffn = 768  max_seq = 2048
  norm = RMSNorm(eps = 1e-6)  rope_theta = 1000000.0
  block = Block(attn = Attention(head_dim = 128, qk_norm = true),
                mlp = MoE(hidden = ffn, experts = 32, top_k = 8, capacity_factor = 0.0))
  dtype = bf16  param_dtype = bf16
}
"""
MAMBA2 = """import "std/mamba.axl"
model mamba2 = DecoderLM {
  vocab = 50288  dim = 2560  layers = 4  heads = 80  positions = "none"  tied = true
  norm = RMSNorm(eps = 1e-5)  block = MambaBlock()
  dtype = bf16  param_dtype = f32
}
"""
# Small shapes for the CPU compiles (XLA:CPU's memory_analysis, a few seconds each); the llama
# is tests/test_aot.py's MID_LLAMA.
LLAMA_SMALL = """import "std/transformer.axl"
model small = DecoderLM {
  vocab = 2048  dim = 256  layers = 4  heads = 8  kv_heads = 4  ffn = 768  max_seq = 512
  rope_theta = 500000.0  norm = RMSNorm(eps = 1e-5)  dtype = f32  param_dtype = f32
}
"""
MOE_SMALL = """import "std/transformer.axl"
model small = DecoderLM {
  vocab = 8192  dim = 256  layers = 2  heads = 8  kv_heads = 2  ffn = 128  max_seq = 512
  norm = RMSNorm(eps = 1e-6)  block = Block(attn = Attention(head_dim = 32, qk_norm = true),
    mlp = MoE(hidden = ffn, experts = 8, top_k = 2, capacity_factor = 0.0))
  dtype = bf16  param_dtype = f32
}
"""
MAMBA_SMALL = """import "std/mamba.axl"
model small = DecoderLM {
  vocab = 8192  dim = 256  layers = 2  heads = 8  positions = "none"  tied = true
  norm = RMSNorm(eps = 1e-5)  block = MambaBlock()  dtype = bf16  param_dtype = f32
}
"""
NO_INT8 = "quantize(none)"  # int8_einsum is a custom_vjp: save_dots would see no dots to save

# DeepSeek-V3's layers cut down (MLA, 64 routed experts of 512 + a shared one, top-8 of 8 groups)
# for the multi-chip rows: the dropless MoE's experts gathered whole, on a v5e 2x4 topology.
DEEPSEEK_SMALL = """import "std/deepseek.axl"
model ds_small = DecoderLM {
  vocab = 2048  dim = 1024  layers = 4  dense_layers = 1  heads = 8  ffn = 4608  max_seq = 1024
  norm = RMSNorm(eps = 1e-6)
  dense_block = Block(attn = MLAttention(q_rank = 256, kv_rank = 128, nope_dim = 64, rope_dim = 64,
                                         v_head_dim = 128), mlp = SwiGLU(hidden = ffn))
  block = Block(attn = MLAttention(q_rank = 256, kv_rank = 128, nope_dim = 64, rope_dim = 64,
                                   v_head_dim = 128),
                mlp = DeepSeekMoE(hidden = 512, experts = 64, top_k = 8, groups = 8, top_groups = 4,
                                  scale = 2.5, shared = 1, capacity_factor = 0.0, balance_rate = 0.001))
  dtype = bf16  param_dtype = f32
}
"""
# Llama 3 8B whole (specs/llama3_8b.axl): 32 layers in one scan compile in about 10 s for 8 GPUs.
LLAMA_8B = """import "std/transformer.axl"
model llama8b = DecoderLM {
  vocab = 128256  dim = 4096  layers = 32  heads = 32  kv_heads = 8  ffn = 14336
  rope_theta = 500000.0  max_seq = 8192  norm = RMSNorm(eps = 1e-5)
  dtype = bf16  param_dtype = f32
}
"""
# 16 layers of dim 1024 for the pipelined rows (stage 4 x fsdp 2 on a v5e 2x4 topology).
LLAMA_PP = """import "std/transformer.axl"
model lm = DecoderLM {
  vocab = 32768  dim = 1024  layers = 16  heads = 8  kv_heads = 8  ffn = 4096  max_seq = 1024
  dtype = bf16  param_dtype = f32
}
"""

@dataclass(frozen=True)
class Config:
    """One row: a model, its train shapes and the target block that picks its schedule."""

    name: str
    kind: str  # what the row shows (dense, GQA, long sequence, ...)
    text: str
    batch: int
    seq: int
    schedule: str  # the target block's body
    target: str = "tpu-v5e-1"
    quick: bool = False


def tpu(remat: str, extra: str = "") -> str:
    return f"remat({remat}) {NO_INT8} {extra}".strip()


CONFIGS = (
    Config("llama1b full", "dense GQA, splash", LLAMA_1B, 4, 2048, tpu("full"), quick=True),
    Config("llama1b full xla-attn", "dense GQA, XLA attention", LLAMA_1B, 4, 2048,
           tpu("full", "kernels(attention = xla)")),
    Config("llama1b save_dots", "remat save_dots", LLAMA_1B, 4, 2048, tpu("save_dots"), quick=True),
    Config("llama1b save=[qkv]", "remat save = [names]", LLAMA_1B, 4, 2048,
           tpu("save = [query_proj, key_proj, value_proj]")),
    Config("llama1b none", "remat none", LLAMA_1B, 4, 2048, tpu("none")),
    Config("gpt2-medium full", "dense MHA, LayerNorm", GPT2_MHA, 8, 1024, tpu("full")),
    Config("llama 32k full", "long sequence", LLAMA_32K, 1, 32768, tpu("full"), quick=True),
    Config("llama 32k none", "long sequence, remat none", LLAMA_32K, 1, 32768, tpu("none")),
    Config("gemma2 full", "soft-capped, windowed", GEMMA2, 1, 8192, tpu("full"), quick=True),
    Config("gemma2 none", "soft-capped, remat none", GEMMA2, 1, 8192, tpu("none")),
    Config("qwen3-moe full", "MoE 32 experts top-8", QWEN3_MOE, 4, 2048, tpu("full")),
    Config("qwen3-moe 2x1024 full", "MoE, half the tokens", QWEN3_MOE, 2, 1024, tpu("full")),
    Config("qwen3-moe full int8", "MoE, int8 attention (v5e's default)", QWEN3_MOE, 4, 2048,
           "remat(full)"),
    # v5e 2x4, 2026-12-07 (plan): XLA 2.58 GiB, analytic 2.30; XLA 1.47, analytic 1.46; XLA 2.35,
    # analytic 2.32 (the layout of specs/deepseek_v3.axl's v5p-1024 plan)
    Config("deepseek ep4 full", "MoE, expert = 4 x fsdp = 2", DEEPSEEK_SMALL, 16, 1024,
           "mesh(expert = 4, fsdp = -1) remat(full)", "tpu-v5e-8"),
    Config("deepseek fsdp8 full", "MoE, fsdp = 8", DEEPSEEK_SMALL, 16, 1024,
           "mesh(fsdp = -1) remat(full)", "tpu-v5e-8"),
    Config("deepseek dp2 full", "MoE, data = 2 x fsdp = 4", DEEPSEEK_SMALL, 16, 1024,
           "mesh(data = 2, fsdp = -1) remat(full)", "tpu-v5e-8"),
    # XLA 2.44 GiB, analytic 2.16 (stages keep each iteration's micro-batch and weights)
    Config("pipeline 4x2 r2", "PP, 8 micro-batches, repeats 2", LLAMA_PP, 32, 1024,
           "mesh(stage = 4, fsdp = 2) remat(full) kernels(attention = xla) "
           "pipeline(microbatches = 8, repeats = 2)", "tpu-v5e-8"),
    # XLA 2.05 GiB, analytic 1.59: no per-iteration weights (repeats 1); the gap is the loss and
    # head after the pipeline (bf16[8, 512, 32768] chunks where 4 sequences a chip were modelled)
    Config("pipeline 4x2 r1", "PP, 8 micro-batches", LLAMA_PP, 32, 1024,
           "mesh(stage = 4, fsdp = 2) remat(full) kernels(attention = xla) "
           "pipeline(microbatches = 8)", "tpu-v5e-8"),
    Config("mamba2 full", "Mamba-2 SSD", MAMBA2, 4, 2048, tpu("full"), quick=True),
    Config("mamba2 none", "Mamba-2, remat none", MAMBA2, 4, 2048, tpu("none")),
    Config("cpu llama none", "CPU: dense GQA, f32", LLAMA_SMALL, 8, 256,
           "remat(none) kernels(attention = xla)", "cpu-8", quick=True),
    Config("cpu llama f32 full", "CPU: dense GQA, f32", LLAMA_SMALL, 8, 256,
           "remat(full) kernels(attention = xla)", "cpu-8"),
    Config("cpu moe none", "CPU: MoE", MOE_SMALL, 8, 256, "remat(none)", "cpu-8"),
    # One device: the same per-chip work as a chip of cpu-8, but no batch sharding. The dropless
    # MoE's dispatch runs per batch shard (shard_map), so the cpu-8 row matches this one; it was
    # -52% while one flat argsort over B * S * top_k replicated the whole batch's dispatch.
    Config("cpu moe none 1 device", "CPU: MoE, unsharded", MOE_SMALL, 1, 256, "remat(none)", "cpu"),
    Config("cpu llama int8", "CPU: int8 matmuls", LLAMA_SMALL, 8, 256,
           "remat(none) kernels(attention = xla) quantize(int8)", "cpu-8"),
    Config("cpu llama fp8", "CPU: fp8 matmuls", LLAMA_SMALL, 8, 256,
           "remat(none) kernels(attention = xla) quantize(fp8)", "cpu-8"),
    Config("cpu mamba2 full", "CPU: Mamba-2", MAMBA_SMALL, 8, 512, "remat(full)", "cpu-8"),
    # GPU rows (--gpu): compiled by XLA's GPU compiler with no GPU (jax's CUDA plugin,
    # axdsl/aot/gpu.py); the gpu profiles quantize to fp8 by default, `quantize(none)` is bf16.
    Config("gpu llama1b fsdp8 full", "GPU: dense 1B, FSDP 8, fp8", LLAMA_1B, 8, 2048,
           "remat(full)", "gpu-h100-8", quick=True),
    Config("gpu llama1b fsdp8 full bf16", "GPU: dense 1B, FSDP 8, bf16", LLAMA_1B, 8, 2048,
           f"remat(full) {NO_INT8}", "gpu-h100-8"),
    Config("gpu llama1b fsdp8 save=[qkv]", "GPU: remat save = [names], bf16", LLAMA_1B, 8, 2048,
           f"remat(save = [query_proj, key_proj, value_proj]) {NO_INT8}", "gpu-h100-8"),
    Config("gpu llama1b fsdp8 none", "GPU: remat none, bf16", LLAMA_1B, 8, 2048,
           f"remat(none) {NO_INT8}", "gpu-h100-8"),
    Config("gpu llama1b 1 gpu full", "GPU: dense 1B, one H100, fp8", LLAMA_1B, 4, 2048,
           "remat(full)", "gpu-h100-1"),
    Config("gpu llama1b 1 gpu save_dots", "GPU: remat save_dots, bf16", LLAMA_1B, 4, 2048,
           f"remat(save_dots) {NO_INT8}", "gpu-h100-1"),
    Config("gpu llama8b fsdp8 full", "GPU: dense 8B, FSDP 8, fp8", LLAMA_8B, 8, 2048,
           "remat(full)", "gpu-h100-8", quick=True),
    Config("gpu llama8b fsdp8 none bf16", "GPU: dense 8B, remat none, bf16", LLAMA_8B, 8, 1024,
           f"remat(none) {NO_INT8}", "gpu-h100-8"),
    Config("gpu llama 32k full", "GPU: 32k tokens, H200, fp8", LLAMA_32K, 1, 32768,
           "remat(full)", "gpu-h200-1", quick=True),
    Config("gpu llama 32k none", "GPU: 32k tokens, remat none, bf16", LLAMA_32K, 1, 32768,
           f"remat(none) {NO_INT8}", "gpu-h200-1"),
    Config("gpu qwen3-moe full", "GPU: MoE 32 experts top-8", QWEN3_MOE, 4, 2048,
           "remat(full)", "gpu-h100-1"),
    Config("gpu qwen3-moe fsdp8 full", "GPU: MoE, FSDP 8", QWEN3_MOE, 8, 2048,
           "remat(full)", "gpu-h100-8"),
    Config("gpu mamba2 full", "GPU: Mamba-2 SSD", MAMBA2, 4, 2048, "remat(full)", "gpu-h100-1",
           quick=True),
    Config("gpu mamba2 none", "GPU: Mamba-2, remat none", MAMBA2, 4, 2048,
           f"remat(none) {NO_INT8}", "gpu-h100-1"),
)


@dataclass
class Row:
    """A config's figures in bytes per chip (XLA's None when it gave none)."""

    name: str
    kind: str
    target: str
    analytic: int
    xla: int | None
    xla_oom: bool
    available: int | None
    seconds: float
    note: str = ""

    @property
    def error(self) -> float | None:
        return None if not self.xla else 100 * (self.analytic - self.xla) / self.xla

    @property
    def verdict(self) -> str:
        """Whether the analytic verdict agrees with XLA's (XLA's: it compiled, without
        RESOURCE_EXHAUSTED; the analytic one: within the HBM XLA gives a program)."""
        if self.xla is None or self.available is None:
            return ""
        xla_fits, ours = not self.xla_oom, self.analytic <= self.available
        if xla_fits == ours:
            return "agree"
        return "REFUSES a fit" if xla_fits else "accepts a no-fit"


def measure(cfg: Config, tmp: Path, cache: dict) -> Row:
    """Build, estimate and compile one config (XLA's figures from `cache` when it has them)."""
    from axdsl.aot import analyze, xla_total

    spec = tmp / f"{cfg.name.replace(' ', '_').replace('=', '').replace('[', '').replace(']', '')}.axl"
    spec.write_text(cfg.text + f"train {{ batch = {cfg.batch}  seq = {cfg.seq} }}\n"
                    f'target "*" {{ {cfg.schedule} }}\n')
    t0 = time.perf_counter()
    cached = cache.get(cfg.name)
    r = analyze(spec, cfg.target, compile=cfg.target.startswith("cpu"), lower=cached is None)
    if cached is not None:
        xla, oom, available, note = cached["xla"], cached["xla_oom"], cached["available"], cached["note"]
    else:
        lo = r.lowering
        note = lo.get("tpu") or lo.get("gpu") or lo.get("error") or ""
        oom = lo.get("xla_oom") is not None
        tpu = bool(lo.get("tpu_topology"))  # a GPU's figure: arguments + temp + outputs
        xla = lo["xla_oom"]["required"] if oom else (xla_total(lo["xla"], tpu) if lo.get("xla") else None)
        available = (lo.get("xla_oom") or {}).get("available") or lo.get("hbm_available")
        if lo.get("gpu_topology"):  # XLA:GPU compiles any size: its figure against the pool
            available = r.limit
            oom = xla is not None and xla > available
    return Row(cfg.name, cfg.kind, cfg.target, r.estimate.total, xla, oom, available,
               round(time.perf_counter() - t0, 1), note[:80])


def peak_report(dump: Path, top: int = 12) -> str:
    """What XLA:GPU keeps at its peak, from a dump of the step (`--dump`): the live-range file's
    "Live ranges at N (peak)" section with each buffer's shape from the buffer assignment, the
    largest `top` by size, and the sum by shape."""
    ranges = sorted(dump.glob("*jit_step*gpu_after_optimizations-live-range.txt"),
                    key=lambda f: f.stat().st_mtime)  # the newest last
    if not ranges:
        return f"no step dump in {dump}"
    text = ranges[-1].read_text()
    assignment = ranges[-1].with_name(ranges[-1].name.replace("live-range", "buffer-assignment"))
    shapes = {}
    for m in re.finditer(r"value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=\d+,offset=\d+\): (\S+)",
                         assignment.read_text()):
        name = m.group(1) if "{" in m.group(1) else m.group(1) + "{}"
        shapes.setdefault(name, m.group(2).split("{")[0])
    section = text.split("(peak):", 1)[1].split("Stack trace", 1)[0]
    live = [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"^\s+(\S+): (\d+) bytes", section, re.M)]
    by_shape: dict[str, list[int]] = {}
    for name, size in live:
        by_shape.setdefault(shapes.get(name, "?"), []).append(size)
    g = 2**20
    lines = [f"peak: {sum(s for _, s in live) / g:,.1f} MiB of temporaries live in {len(live)} buffers"]
    lines += [f"  {len(v)} x {k}: {sum(v) / g:,.1f} MiB"
              for k, v in sorted(by_shape.items(), key=lambda kv: -sum(kv[1]))[:top]]
    return "\n".join(lines)


def render(rows: list[Row]) -> str:
    """The table, in GiB, as markdown."""
    g = 2**30
    out = ["| config | shows | target | analytic GiB | XLA GiB | error | verdict |",
           "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        xla = "-" if r.xla is None else f"{r.xla / g:.2f}" + (" (OOM)" if r.xla_oom else "")
        err = "-" if r.error is None else f"{r.error:+.1f}%"
        out.append(f"| {r.name} | {r.kind} | {r.target} | {r.analytic / g:.2f} | {xla} | {err} | "
                   f"{r.verdict or r.note} |")
    worst = max((abs(r.error) for r in rows if r.error is not None), default=0.0)
    out.append(f"\nworst |error| {worst:.1f}%; verdicts that disagree: "
               f"{sum(r.verdict not in ('', 'agree') for r in rows)}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a subset: five TPU configs, one CPU")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU rows instead (XLA's GPU compiler, jax's CUDA plugin)")
    ap.add_argument("--only", help="configs whose name contains this")
    ap.add_argument("--dump", type=Path, help="XLA's dumps of the steps' compiles in this folder "
                    "(buffer assignment, live ranges); GPU rows print what is live at the peak")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--xla-cache", type=Path, help="reuse XLA's figures from an earlier --json")
    args = ap.parse_args()
    cache = {}
    if args.xla_cache and args.xla_cache.exists():
        cache = {r["name"]: {"xla": r["xla"], "xla_oom": r["xla_oom"], "available": r["available"],
                             "note": r["note"]} for r in json.loads(args.xla_cache.read_text())}
    configs = [c for c in CONFIGS if (c.quick or not args.quick) and (not args.only or args.only in c.name)
               and c.target.startswith("gpu") == args.gpu]
    tmp, rows = Path(tempfile.mkdtemp()), []
    if args.dump:  # XLA reads its flags once, when jax starts its backend (after this)
        os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={args.dump} "
                                   "--xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*jit_step.*")
    for cfg in configs:
        rows.append(measure(cfg, tmp, cache))
        r = rows[-1]
        if args.dump and cfg.target.startswith("gpu"):
            print(peak_report(args.dump), file=sys.stderr)
        print(f"{r.name:24} analytic {r.analytic / 2**30:6.2f} GiB  XLA "
              f"{'-' if r.xla is None else f'{r.xla / 2**30:6.2f}'} GiB  "
              f"{'' if r.error is None else f'{r.error:+6.1f}%'}  ({r.seconds} s) {r.note}",
              file=sys.stderr, flush=True)
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
