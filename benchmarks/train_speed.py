"""Training speed of the generated train step on this machine: tokens/s, model TFLOP/s per device, MFU.

    python benchmarks/train_speed.py                       # tiny_llama and llama_50m, their train blocks
    python benchmarks/train_speed.py --specs llama_50m --batch 4 --seq 512 --steps 10

For each spec it imports the committed generated/<spec>/cpu/train.py (check it is current with
`axdsl build --check`), creates the sharded train state, and runs the jitted train steps exactly as
train.py's loop does (calls of up to steps_per_call steps, buffer donation, the global batches
sharded over the mesh), on real batches of the default data placed on the devices beforehand. The
first call (compilation included) is warm-up and not timed; the timed calls are dispatched back to
back and waited for once, at the end.

Model FLOPs are train.py's MODEL_FLOPS (MaxText's formula: 6 x matmul parameters per token, plus
each sequence mixer's work at tc.seq: runtime.ModelFlops.per_token), not XLA's count; MFU is against the target profile's peak per chip
(PEAK_FLOPS_PER_CHIP; the cpu profile says 0.17 TFLOP/s, a measured f32 matmul peak of this kind
of machine). Run it without XLA_FLAGS' fake devices: they split the same cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(spec: str, steps: int, warmup: int, batch: int | None, seq: int | None,
            package: str = "generated", steps_per_call: int | None = None) -> dict:
    """One spec's figures; `package` is the generated root it is imported from. `warmup` steps
    run in one untimed call, then `steps` in calls of up to steps_per_call (default: the target's)."""
    import jax

    tm = importlib.import_module(f"{package}.{spec}.cpu.train")
    tc = tm.TRAIN
    tc = dataclasses.replace(tc, batch=batch or tc.batch, seq=seq or tc.seq, warmup=0,
                             steps_per_call=steps_per_call or tc.steps_per_call)
    most = tc.steps_per_call
    cfg = tm.CONFIGS[tc.model]
    mesh = tm.make_mesh()
    tokens, _ = tm.runtime.split(tm.runtime.stdlib_bytes(8 << 20))
    with jax.set_mesh(mesh):
        sharding = tm.batch_sharding(mesh)
        batches = [tm.runtime.get_batch(tokens, tc, i, sharding) for i in range(max(warmup, 1) + steps)]
        began = time.perf_counter()
        state = tm.init_state(cfg, tc, mesh, jax.random.key(tc.seed))
        jax.block_until_ready(state)
        init_s = time.perf_counter() - began
        train_steps = tm.make_train_steps(cfg, tc, mesh)

        def run(todo: list) -> tuple[dict, dict]:
            """`todo` in calls of up to `most` steps (a call takes `most` batches, uses the first n)."""
            out = state
            for i in range(0, len(todo), most):
                call = todo[i : i + most]
                out, metrics = train_steps(out, call + call[-1:] * (most - len(call)), len(call))
            return out, {k: v[len(call) - 1] for k, v in metrics.items()}

        began = time.perf_counter()
        state, metrics = run(batches[: max(warmup, 1)])
        jax.block_until_ready(metrics)
        warmup_s = time.perf_counter() - began
        began = time.perf_counter()
        state, metrics = run(batches[max(warmup, 1) :])
        jax.block_until_ready((state, metrics))
        seconds = time.perf_counter() - began
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(state["params"]))
    flops = tm.MODEL_FLOPS[tc.model].per_token(tc.seq) * tc.batch * tc.seq * steps
    per_device = flops / seconds / jax.device_count()
    return {
        "spec": spec, "params_m": params / 1e6, "batch": tc.batch, "seq": tc.seq,
        "devices": jax.device_count(), "init_s": init_s, "warmup_s": warmup_s,
        "step_s": seconds / steps, "tokens_per_s": tc.batch * tc.seq * steps / seconds,
        "tflops_per_device": per_device / 1e12, "mfu": per_device / tm.PEAK_FLOPS_PER_CHIP,
        "loss": float(metrics["loss"]),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specs", nargs="+", default=["tiny_llama", "llama_50m"])
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20 tiny, 5 otherwise)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first, one call (compilation)")
    p.add_argument("--steps-per-call", type=int, default=None, help="default: the target's (cpu: 8)")
    p.add_argument("--batch", type=int, default=None, help="default: the spec's train block")
    p.add_argument("--seq", type=int, default=None, help="default: the spec's train block")
    args = p.parse_args(argv)
    import jax

    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} device(s)")
    header = (f"{'spec':<12} {'params':>8} {'batch x seq':>12} {'init s':>7} {'warm-up s':>9} {'step s':>8} "
              f"{'tokens/s':>10} {'TFLOP/s/dev':>11} {'MFU':>6}")
    if jax.devices()[0].platform == "cpu":
        print("(MFU on cpu is nominal: against the cpu profile's placeholder peak, not this machine's)")
    print(header)
    for spec in args.specs:
        steps = args.steps or (20 if spec.startswith("tiny") else 5)
        r = measure(spec, steps, args.warmup, args.batch, args.seq, steps_per_call=args.steps_per_call)
        print(f"{r['spec']:<12} {r['params_m']:>7.1f}M {r['batch']:>5} x {r['seq']:<5} {r['init_s']:>7.1f} "
              f"{r['warmup_s']:>9.1f} {r['step_s']:>8.3f} {r['tokens_per_s']:>10.0f} "
              f"{r['tflops_per_device']:>11.4f} {r['mfu']:>6.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
