"""XLA compile time of a mixed local/global model against its depth (target: flat in depth).

Builds a tiny DecoderLM whose block is the pattern [local (sliding-window) attention, global
attention] with 4 and with 96 layers, then times `jax.jit(loss_fn).lower(...).compile()` of the
training loss and its gradient, each in a fresh process (no compile cache), so the figure is
what a user waits for. `repeat(layers, [..., ...])` is one `jax.lax.scan` over layers / 2
groups, so the compiled program does not grow with depth; an unrolled loop would grow linearly.

    python benchmarks/compile_depth.py            # 4 and 96 layers
    python benchmarks/compile_depth.py 4 24 96    # any depths
    python benchmarks/compile_depth.py --unrolled 4 24   # the same model written layer by layer
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SPEC = """\
import "std/transformer.axl"

model mixed = DecoderLM {{
  vocab = 256  dim = 64  layers = {layers}  heads = 4  kv_heads = 2  ffn = 128  max_seq = 128  dtype = f32
  block = [Block(attn = Attention(window = 16)), Block()]
}}
"""

# The same model with one child per layer, for comparison: no repeat, no scan.
UNROLLED = """\
import "std/transformer.axl"

layer Unrolled(vocab: int, dim: int, heads: int, kv_heads: int, ffn: int, max_seq: int = 128,
               dtype: dtype = f32, param_dtype: dtype = f32) {{
  child embed = Embedding()
{children}
  child final_norm = RMSNorm()
  param head: [dim, vocab] axes(embed, vocab)
  forward(tokens: [B, S]) -> [B, S, vocab] {{
    x = embed(tokens)
{calls}
    return final_norm(x) @ head
  }}
}}
model mixed = Unrolled {{ vocab = 256  dim = 64  heads = 4  kv_heads = 2  ffn = 128 }}
"""


def unrolled_spec(layers: int) -> str:
    kinds = ["Block(attn = Attention(window = 16))", "Block()"]
    children = "\n".join(f"  child b{i} = {kinds[i % 2]}" for i in range(layers))
    calls = "\n".join(f"    x = b{i}(x)" for i in range(layers))
    return UNROLLED.format(children=children, calls=calls)


# Run in a fresh process: build, import the generated model, time lower + compile.
CHILD = """\
import importlib.util, sys, time
from pathlib import Path
import jax, jax.numpy as jnp
from axdsl.build import build_files
spec, out = Path(sys.argv[1]), Path(sys.argv[2])
files = build_files(spec, "cpu")
(out / "model.py").write_text(files["model.py"])
loader = importlib.util.spec_from_file_location("mixed_model", out / "model.py")
model = importlib.util.module_from_spec(loader)
loader.loader.exec_module(model)
cfg = model.Config()
params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
batch = jax.ShapeDtypeStruct((8, 129), jnp.int32)
step = jax.jit(jax.value_and_grad(lambda p, b: model.loss_fn(cfg, p, b)[0]))
start = time.perf_counter()
lowered = step.lower(params, batch)
lowered_at = time.perf_counter()
lowered.compile()
done = time.perf_counter()
scans = files["model.py"].count("jax.lax.scan(")
print(f"{lowered_at - start:.3f} {done - lowered_at:.3f} {scans}")
"""


def measure(layers: int, unrolled: bool = False) -> tuple[float, float, int]:
    """(lower seconds, compile seconds, lax.scan calls in model.py) of a `layers`-deep model."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / f"mixed_{layers}.axl"
        spec.write_text(unrolled_spec(layers) if unrolled else SPEC.format(layers=layers), encoding="utf-8")
        out = subprocess.run([sys.executable, "-c", CHILD, str(spec), tmp], cwd=ROOT,
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "JAX_PLATFORMS": "cpu"})
    lower, compile_, scans = out.stdout.split()
    return float(lower), float(compile_), int(scans)


def main(argv: list[str]) -> None:
    unrolled = "--unrolled" in argv
    depths = [int(a) for a in argv if a != "--unrolled"] or [4, 96]
    print(("unrolled, " if unrolled else "repeat(layers, [local, global]), ") + "training step (loss + grad):")
    print("layers  lower (s)  compile (s)  lax.scan in model.py")
    for n in depths:
        lower, compile_, scans = measure(n, unrolled)
        print(f"{n:6d}  {lower:9.3f}  {compile_:11.3f}  {scans:d}")


if __name__ == "__main__":
    main(sys.argv[1:])
