"""The kernels behind tpu_bench's gaps, timed alone on one TPU v5e: the SSD scan and splash blocks.

    python benchmarks/tpu_kernels.py ssd      # Mamba-2 2.7B's SSD (4 x 2048, 80 heads of 64)
    python benchmarks/tpu_kernels.py splash   # splash block sizes at Llama 3.2 1B and 32k shapes
    python benchmarks/tpu_kernels.py --cpu    # both at test size on this CPU (the code runs)

Each case is jit(value_and_grad) of one call, forward and backward, the median of 10 timed calls
after 2. It prints the time, the matmul FLOPs the case needs (forward + backward = 3x forward) and
their rate against the chip's 197 TFLOP/s, and each variant's largest difference from the first
(the reference). Needs only jax: it runs on the chip as it is.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import jax
import jax.numpy as jnp

PEAK = 197e12


def timed(fn, *args, reps: int = 10) -> float:
    """The median seconds of `reps` calls of a compiled fn after two warm-ups."""
    out = fn(*args)
    jax.block_until_ready(out)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------- SSD
def segsum_masked(a):
    """The segment sum axdsl's ssd used before 2026-12-07: a cumulative sum of masked copies
    (transformers' `segment_sum`), kept here as the measured "before"."""
    n = a.shape[-1]
    x = jnp.broadcast_to(a[..., :, None], (*a.shape, n))
    x = jnp.where(jnp.tril(jnp.ones((n, n), bool), -1), x, 0.0)
    x = jnp.cumsum(x, axis=-2)
    return jnp.where(jnp.tril(jnp.ones((n, n), bool)), x, -jnp.inf)


def segsum_diff(a):
    """The difference of one cumulative sum (mamba_ssm's kernels): no [L, L] cumsum."""
    n = a.shape[-1]
    cum = jnp.cumsum(a, axis=-1)
    return jnp.where(jnp.tril(jnp.ones((n, n), bool)), cum[..., :, None] - cum[..., None, :], -jnp.inf)


def ssd_ref(x, dt, a, b, c, chunk):
    """axdsl's ssd before 2026-12-07 (transformers' form): f32 throughout, B and C per head."""
    batch, seq, heads, head_dim = x.shape
    groups = b.shape[2]
    x, dt, a, b, c = (t.astype(jnp.float32) for t in (x, dt, a, b, c))
    b = jnp.repeat(b, heads // groups, axis=2)
    c = jnp.repeat(c, heads // groups, axis=2)
    x = x * dt[..., None]
    log_decay = a * dt
    x, log_decay, b, c = (t.reshape(batch, -1, chunk, *t.shape[2:]) for t in (x, log_decay, b, c))
    log_decay = log_decay.transpose(0, 3, 1, 2)
    cum = jnp.cumsum(log_decay, axis=-1)
    decay = jnp.exp(segsum_masked(log_decay))
    scores = jnp.einsum("bclhn,bcshn->bhcls", c, b) * decay
    y_diag = jnp.einsum("bhcls,bcshp->bclhp", scores, x)
    to_end = jnp.exp(cum[..., -1:] - cum)
    chunk_states = jnp.einsum("bclhn,bhcl,bclhp->bchpn", b, to_end, x)

    def step(state, inputs):
        chunk_decay, new = inputs
        return state * chunk_decay[..., None, None] + new, state

    _, entering = jax.lax.scan(step, jnp.zeros_like(chunk_states[:, 0]),
                               (jnp.exp(cum[..., -1]).transpose(2, 0, 1), chunk_states.transpose(1, 0, 2, 3, 4)))
    entering = entering.transpose(1, 0, 2, 3, 4)
    y_off = jnp.einsum("bclhn,bchpn,bhcl->bclhp", c, entering, jnp.exp(cum))
    return (y_diag + y_off).reshape(batch, -1, heads, head_dim)[:, :seq]


def ssd_grouped(x, dt, a, b, c, chunk, *, mm_dtype=jnp.float32, segsum=segsum_masked):
    """C.B once per group (not per head), each product's operands in mm_dtype, f32 accumulation:
    the variants weighed; kernels/ssd.py is the bf16-operand, segsum_diff, chunk-256 one."""
    batch, seq, heads, head_dim = x.shape
    groups, state = b.shape[2], b.shape[3]
    hg = heads // groups
    f32 = jnp.float32
    dt, a = dt.astype(f32), a.astype(f32)
    xdt = x.astype(f32) * dt[..., None]  # [B, S, H, P]
    log_decay = a * dt  # [B, S, H]
    n = seq // chunk
    xdt = xdt.reshape(batch, n, chunk, groups, hg, head_dim)
    b = b.reshape(batch, n, chunk, groups, state)
    c = c.reshape(batch, n, chunk, groups, state)
    log_decay = log_decay.reshape(batch, n, chunk, groups, hg).transpose(0, 3, 4, 1, 2)  # [B,G,h,n,L]
    cum = jnp.cumsum(log_decay, axis=-1)
    mm = functools.partial(jnp.einsum, preferred_element_type=f32)
    cast = lambda t: t.astype(mm_dtype)  # noqa: E731
    cb = mm("bclgn,bcsgn->bgcls", cast(c), cast(b))  # [B, G, n, L, L]
    scores = cb[:, :, None] * jnp.exp(segsum(log_decay))  # [B, G, h, n, L, L]
    y_diag = mm("bghcls,bcsghp->bclghp", cast(scores), cast(xdt))
    to_end = jnp.exp(cum[..., -1:] - cum)  # [B, G, h, n, L]
    xs_end = xdt * to_end.transpose(0, 3, 4, 1, 2)[..., None]  # [B, n, L, G, h, P]
    chunk_states = mm("bclgn,bclghp->bcghpn", cast(b), cast(xs_end))

    def step(st, inputs):
        chunk_decay, new = inputs
        return st * chunk_decay[..., None, None] + new, st

    decays = jnp.exp(cum[..., -1]).transpose(3, 0, 1, 2)  # [n, B, G, h]
    _, entering = jax.lax.scan(step, jnp.zeros_like(chunk_states[:, 0]), (decays, chunk_states.transpose(1, 0, 2, 3, 4, 5)))
    entering = entering.transpose(1, 0, 2, 3, 4, 5)  # [B, n, G, h, P, N]
    y_off = mm("bclgn,bcghpn->bclghp", cast(c), cast(entering))
    y_off = y_off * jnp.exp(cum).transpose(0, 3, 4, 1, 2)[..., None]
    return (y_diag + y_off).reshape(batch, seq, heads, head_dim)


def bench_ssd(cpu: bool) -> None:
    batch, seq, heads, head_dim, state = (1, 256, 4, 64, 128) if cpu else (4, 2048, 80, 64, 128)
    keys = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(keys[0], (batch, seq, heads, head_dim), jnp.bfloat16)
    dt = jax.nn.softplus(jax.random.normal(keys[1], (batch, seq, heads)) - 2.0)
    a = -jnp.exp(jax.random.uniform(keys[2], (heads,), minval=0.0, maxval=2.7))
    b = jax.random.normal(keys[3], (batch, seq, 1, state), jnp.bfloat16)
    c = jax.random.normal(keys[4], (batch, seq, 1, state), jnp.bfloat16)
    cot = jax.random.normal(keys[5], (batch, seq, heads, head_dim), jnp.float32)
    print(f"SSD: B={batch} S={seq} heads={heads} head_dim={head_dim} state={state}, forward + backward")
    cases = {"ref (f32, B and C per head, chunk 256)": functools.partial(ssd_ref, chunk=256)}
    for chunk, mm_dtype, segsum in [
        (256, jnp.float32, segsum_masked), (256, jnp.float32, segsum_diff),
        (256, jnp.bfloat16, segsum_masked), (256, jnp.bfloat16, segsum_diff),
        (128, jnp.bfloat16, segsum_masked), (128, jnp.bfloat16, segsum_diff),
    ]:
        if True:
            if True:
                cases[f"grouped, {jnp.dtype(mm_dtype).name} operands, {segsum.__name__}, chunk {chunk}"] = (
                    functools.partial(ssd_grouped, chunk=chunk, mm_dtype=mm_dtype, segsum=segsum))
    want = None
    for name, fn in cases.items():
        def loss(x, dt, b, c, fn=fn):
            return jnp.sum(fn(x, dt, a, b, c) * cot)

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
        try:
            seconds = timed(step, x, dt, b, c)
            value, grads = step(x, dt, b, c)
        except Exception as exc:  # noqa: BLE001 - a variant failing is a result
            print(f"  {name:60s} FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        got = jax.tree.map(lambda t: t.astype(jnp.float32), (value, grads))
        want = got if want is None else want
        err = max(float(jnp.max(jnp.abs(g - w)) / (jnp.max(jnp.abs(w)) + 1e-30))
                  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
        print(f"  {name:60s} {seconds * 1e3:8.2f} ms  max rel diff {err:.1e}", flush=True)


# ------------------------------------------------------------------------------------- splash
def bench_splash(cpu: bool) -> None:
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as sk,
        splash_attention_mask as sm,
    )

    shapes = [(1, 2, 1, 256, 128)] if cpu else [(4, 32, 8, 2048, 64), (1, 16, 8, 32768, 128)]
    blocks = [(128, 128, 128, False)] if cpu else [
        (512, 512, 512, False), (512, 512, 512, True), (1024, 1024, 512, False), (1024, 1024, 1024, True),
        (2048, 1024, 512, True), (2048, 2048, 1024, True),
    ]
    for batch, heads, kv_heads, seq, dim in shapes:
        keys = jax.random.split(jax.random.key(1), 4)
        q = jax.random.normal(keys[0], (batch, heads, seq, dim), jnp.bfloat16)
        k = jax.random.normal(keys[1], (batch, kv_heads, seq, dim), jnp.bfloat16)
        v = jax.random.normal(keys[2], (batch, kv_heads, seq, dim), jnp.bfloat16)
        cot = jax.random.normal(keys[3], q.shape, jnp.bfloat16)
        flops = 3 * 4 * batch * heads * seq * seq / 2 * dim  # causal: half the scores; fwd + bwd
        print(f"splash: B={batch} heads={heads} kv_heads={kv_heads} S={seq} head_dim={dim}, causal, "
              f"fwd + bwd {flops / 1e12:.2f} TFLOP")
        for bq, bkv, bkvc, fused in blocks:
            if seq % max(bq, bkv):
                continue
            sizes = sk.BlockSizes(
                block_q=bq, block_kv=bkv, block_kv_compute=bkvc, block_q_dkv=bq, block_kv_dkv=bkv,
                block_kv_dkv_compute=bkvc, block_q_dq=None if fused else bq,
                block_kv_dq=None if fused else bkv, use_fused_bwd_kernel=fused)
            try:
                kernel = sk.make_splash_mha(sm.MultiHeadMask([sm.CausalMask((seq, seq))] * heads),
                                            block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                            interpret=cpu)

                def loss(q, k, v, kernel=kernel):
                    return jnp.sum(jax.vmap(kernel)(q, k, v).astype(jnp.float32) * cot)

                step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
                seconds = timed(step, q, k, v, reps=3 if cpu else 10)
            except Exception as exc:  # noqa: BLE001
                print(f"  q {bq} kv {bkv} compute {bkvc} fused {fused}: FAILED {str(exc)[:200]}")
                continue
            print(f"  q {bq:5d} kv {bkv:5d} compute {bkvc:5d} fused bwd {fused!s:5s} "
                  f"{seconds * 1e3:8.2f} ms  {flops / seconds / PEAK:6.1%} of peak", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="*", help="ssd, splash (default both)")
    p.add_argument("--cpu", action="store_true", help="test sizes, Pallas interpreted")
    args = p.parse_args(argv)
    print(jax.devices())
    f = jax.random.normal(jax.random.key(2), (2, 512, 512), jnp.float32)
    exact = jnp.einsum("bij,bjk->bik", f, f, precision="highest")
    for name, prec in (("default", None), ("bf16 operands", "bf16")):
        got = jnp.einsum("bij,bjk->bik", f.astype(jnp.bfloat16), f.astype(jnp.bfloat16),
                         preferred_element_type=jnp.float32) if prec else jnp.einsum("bij,bjk->bik", f, f)
        print(f"f32 matmul, {name}: max |diff| from highest precision {float(jnp.max(jnp.abs(got - exact))):.2e}")
    for what in args.what or ["ssd", "splash"]:
        {"ssd": bench_ssd, "splash": bench_splash}[what](args.cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
