"""Analytic per-chip memory (axdsl/analysis/memory.py) against XLA's memory_analysis on this CPU.

    python benchmarks/aot_report.py            # about 4 minutes on 2 cores

Compiles the generated train step of llama- and GPT-2-shaped models (4.2 M parameters, f32, 8 fake
devices, data parallel) under each remat policy, and a bf16 one with a 32000 vocab at seq 2048,
and prints XLA's arguments and temporaries next to the analytic state and temporaries. The
figures are per device, in MiB.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from axdsl.aot import analyze, xla_total  # noqa: E402

LLAMA = """import "std/transformer.axl"
model mid = DecoderLM {
  vocab = 2048  dim = 256  layers = 4  heads = 8  kv_heads = 4  ffn = 768  max_seq = 512
  rope_theta = 500000.0  norm = RMSNorm(eps = 1e-5)  dtype = f32  param_dtype = f32
}
"""
GPT2 = """import "std/transformer.axl"
model mid = DecoderLM {
  vocab = 2048  dim = 256  layers = 4  heads = 8  ffn = 1024  max_seq = 512
  positions = "learned"  tied = true  norm = LayerNorm(eps = 1e-5)
  block = Block(attn = Attention(rope = false, bias = true), mlp = MLP(hidden = ffn, act = "gelu", bias = true))
  dtype = f32  param_dtype = f32
}
"""
# Mixed precision with a large vocabulary and sequences longer than one LOSS_CHUNK: the fused
# cross-entropy's chunks and the per-layer casts of the stacked weights show in XLA's figures.
LLAMA_BF16 = """import "std/transformer.axl"
model mv = DecoderLM {
  vocab = 32000  dim = 256  layers = 4  heads = 4  kv_heads = 2  ffn = 768  max_seq = 2048
  rope_theta = 10000.0  norm = RMSNorm(eps = 1e-5)  dtype = bf16  param_dtype = f32
}
"""
SHAPES = ((8, 256), (16, 128), (8, 512))
MODELS = (("llama", LLAMA, SHAPES), ("gpt2", GPT2, SHAPES), ("bf16-32k", LLAMA_BF16, ((8, 2048),)))


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    mib = 2**20
    print(f"{'model':8} {'remat':9} {'batch x seq':>11} | {'XLA arg':>8} {'temp':>7} {'total':>7} | "
          f"{'ours state':>10} {'temps':>7} {'total':>7} | {'temps':>7} {'total':>7}")
    for name, text, shapes in MODELS:
        for remat in ("none", "full", "save_dots"):
            spec = tmp / f"{name}_{remat}.axl"
            spec.write_text(text + f'target "cpu*" {{ remat({remat}) }}\n')
            for batch, seq in shapes:
                t0 = time.perf_counter()
                r = analyze(spec, "cpu-8", batch=batch, seq=seq, compile=True)
                x, e = r.lowering["xla"], r.estimate
                total = xla_total(x)
                print(f"{name:8} {remat:9} {batch:>5} x {seq:<4}| {x['argument'] / mib:8.1f} "
                      f"{x['temp'] / mib:7.1f} {total / mib:7.1f} | {e.state / mib:10.1f} "
                      f"{e.temporaries / mib:7.1f} {e.total / mib:7.1f} | "
                      f"{100 * (e.temporaries - x['temp']) / x['temp']:+6.1f}% "
                      f"{100 * (e.total - total) / total:+6.1f}%   ({time.perf_counter() - t0:.0f} s)",
                      flush=True)


if __name__ == "__main__":
    main()
