"""The ring attention's temporary memory per chip at two sequence lengths (not a timed test).

    JAX_PLATFORMS=cpu python benchmarks/ring_memory.py [--seqs 4096 16384] [--shards 4]

Compiles context_attention_ring (axdsl/kernels/context.py), forward and backward, inside
jax.shard_map over `--shards` fake CPU devices, causal in zig-zag order, one sequence of 4 heads
of 64 in bfloat16, and prints XLA's memory_analysis() of one device: its temporaries (what the
ring's tiles and softmax state take) and its arguments. Flat temporaries per token as the
sequence grows is what the blocked inner loop is for: the logits of one step were
[B, heads, S/2n, S/2n] float32 before it, [B, heads, S/2n, block] with it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def temp_bytes(seq: int, shards: int, heads: int = 4, head_dim: int = 64) -> tuple[int, int]:
    """(temporary bytes, argument bytes) of one device's compiled forward + backward."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from axdsl.kernels import context

    mesh = Mesh(np.asarray(jax.devices()[:shards]), ("seq",))
    order = context.zigzag_order(seq, shards)
    attend = functools.partial(context.context_attention_ring, causal=True)

    def loss(q, k, v):
        run = functools.partial(context.context_parallel, attend, positions=order)
        return jnp.sum(run(q, k, v).astype(jnp.float32) ** 2)

    shape = jax.ShapeDtypeStruct((1, seq, heads, head_dim), jnp.bfloat16)
    with jax.set_mesh(mesh):
        sharded = jax.NamedSharding(mesh, P(None, "seq"))
        args = [jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharded)] * 3
        step = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    memory = step.memory_analysis()
    assert memory is not None, "this backend gives no memory analysis"
    return memory.temp_size_in_bytes, memory.argument_size_in_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.shards}")
    print(f"ring attention, causal, zig-zag, {args.shards} shards, 4 heads of 64, bf16, fwd + bwd")
    print(f"{'seq':>8} {'per shard':>10} {'temp MiB':>10} {'args MiB':>10} {'temp B/token':>13}")
    for seq in args.seqs:
        temp, arg = temp_bytes(seq, args.shards)
        local = seq // args.shards
        print(
            f"{seq:>8} {local:>10} {temp / 2**20:>10.1f} {arg / 2**20:>10.1f} {temp / local:>13.0f}"
        )


if __name__ == "__main__":
    main()
