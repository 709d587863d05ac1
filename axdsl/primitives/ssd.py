"""Mamba-2's state-space dual (SSD) scan, computed chunk by chunk (Dao & Gu 2024).

    ssd(x, dt, A, B, C, chunk = 256)    x [B, S, heads, head_dim], dt [B, S, heads], A [heads],
                                        B and C [B, S, groups, state] -> [B, S, heads, head_dim]

Per head h (with group g = h / (heads / groups)), a linear recurrence over the sequence with a
[head_dim, state] state:

    state[t] = exp(dt[t] A) state[t-1] + dt[t] x[t] B[t]^T      y[t] = state[t] C[t]

`dt` is the step size after softplus (and its bias), `A` the (negative) decay rate per head; the
D skip, the gate and the norm are ordinary .axl around it (std/mamba.axl). The scan is done as
SSD does it: within each chunk of `chunk` positions a masked, attention-like product (the
"diagonal blocks"), across chunks a `lax.scan` that carries the state from one chunk boundary to
the next. The products take their operands in x's dtype and accumulate in float32, the rest is
float32 (as mamba_ssm's kernels do; transformers' `torch_forward` is float32 throughout); S need
not be a multiple of the chunk size (the helper pads with zeros, which leave the state
unchanged: dt = 0).

FLOPs per token (sequence mixing, not parameter matmuls): within a chunk 2 min(chunk, S) (groups
state + heads head_dim) for the scores (once per group) and their product with x; across chunks
4 heads head_dim state for the chunk states and their read-out. Linear in S, unlike attention:
at S >= chunk a fixed figure per token, which train.py's MODEL_FLOPS keeps as a chunk term
(runtime.Mixer).
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.syntax.ast import above
from axdsl.primitives.base import (
    always,
    Decoding,
    Flops,
    Helper,
    Keys,
    Primitive,
    Signature,
    Static,
    StaticKind,
)
from axdsl.primitives.base import Source
from axdsl.primitives.reductions import ir_fmt

SSD = Source("ssd", ("ssd",))


def _shape(ctx, prim: ir.Prim, args):
    x, dt, a, b, c = (t.type.dims for t in args[:5])
    if len(x) != 4 or any(d.is_ellipsis for d in x):
        ctx.fail(prim.span, f"`ssd` needs x [B, S, heads, head_dim], got {ir_fmt(x)}")
    batch, seq, heads = x[0], x[1], x[2]
    if len(dt) != 3 or not (dt[0].same(batch) and dt[1].same(seq) and dt[2].same(heads)):
        ctx.fail(
            prim.span,
            f"`ssd` needs dt [{batch}, {seq}, {heads}] like x's first three dims, got {ir_fmt(dt)}",
            "dt is one step size per position and head (after softplus)",
        )
    if len(a) != 1 or not a[0].same(heads):
        ctx.fail(prim.span, f"`ssd` needs A [{heads}], one decay rate per head, got {ir_fmt(a)}")
    for name, t in (("B", b), ("C", c)):
        if len(t) != 4 or not (t[0].same(batch) and t[1].same(seq)):
            ctx.fail(
                prim.span, f"`ssd` needs {name} [{batch}, {seq}, groups, state], got {ir_fmt(t)}"
            )
    if not (b[2].same(c[2]) and b[3].same(c[3])):
        ctx.fail(
            prim.span,
            f"`ssd` B and C disagree: {ir_fmt(b)} and {ir_fmt(c)}",
            "B and C are both [B, S, groups, state]",
        )
    groups = b[2]
    if heads.size is None or groups.size is None or heads.size % groups.size:
        ctx.fail(
            prim.span,
            f"`ssd` groups `{groups}` must divide heads `{heads}`",
            "each group of B and C serves heads / groups heads",
        )
    return x


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    ctx.use_helper("ssd")
    return f"ssd({', '.join(args[:5])}, chunk={ctx.code(prim.attr('chunk'))})"


def _flops(ctx, prim: ir.Prim) -> Flops:
    """Per key of a chunk (min(chunk, S) keys: the whole diagonal block is computed): C.B once per
    group, the scores' product with x once per head; and the chunk states, which do not grow
    with S."""
    heads, head_dim = (ir.static_size(d) for d in ir.tensor_type(prim.args[0]).dims[2:])
    groups, state = (ir.static_size(d) for d in ir.tensor_type(prim.args[3]).dims[2:])
    return Flops(
        mixing=4 * heads * head_dim * state,
        per_key=2 * (groups * state + heads * head_dim),
        keys=Keys(chunk=prim.attr("chunk").value),
    )


# What XLA:TPU keeps of the list below (platforms.py `ssd_fused`): the scores, the discretized x
# and the states; it recomputes masks, decays, C.B and float32 copies inside their readers.
# XLA:GPU keeps these and a few more (platforms.py `ssd_extra_keeps`).
FUSED_KEEPS = frozenset(
    (
        "scores",
        "discretized x",
        "discretized x, operand",
        "chunk-state operand",
        "entering states",
        "entering states, operand",
        "dt broadcast",
        "decay to chunk end",
        "decay from chunk start",
        "chunk decay",
    )
)


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """What jax 0.10 keeps for the helper's backward (measured with saved_residuals, float32 and
    bfloat16 x; the sequence padded to whole chunks). In float32: x (or its float32 or padded
    copy) and dt, the broadcast dt and A, the discretized x, the per-position decays to the chunk
    end and from its start with their broadcasts, the chunk decays, two [B, heads, S, chunk]
    tensors (the difference of cumulative sums and its exponential) with their bool mask, C.B
    per group broadcast over its heads, the entering states and their broadcast decays, and the
    read-out product. In x's dtype: B and C per group, the scores, the chunk-state operand and the
    entering states; with x not float32 also its discretized copy in x's dtype."""
    x, dt = args[0], args[1]
    batch, seq, heads, head_dim = x.dims
    groups, state = args[3].dims[2], args[3].dims[3]
    chunk = t.static(prim.attr("chunk"))
    n = -(-t.seq // chunk)
    padded, chunks, within = (
        ir.Dim("S_padded", n * chunk),
        ir.Dim("chunks", n),
        ir.Dim("chunk", chunk),
    )
    low = x.dtype if x.dtype in ("bf16", "f16") else "f32"  # the products' operand dtype
    one = ir.Dim("1", 1)
    out = t.new(dims, "f32", label, tuple(args[:5]))
    internals: list[tuple[tuple[ir.Dim, ...], str, str]] = []
    if n * chunk == t.seq:
        t.save(dt)
        if low == "f32":
            t.save(x)
        else:
            internals.append(((batch, padded, heads, head_dim), "f32", "x in float32"))
    else:  # the padded copies, and jnp.pad's four fill values
        internals += [
            ((batch, padded, heads, head_dim), "f32", "padded x"),
            ((batch, padded, heads), "f32", "padded dt"),
            ((ir.Dim("4", 4),), "f32", "pad values"),
        ]
    internals += [
        ((batch, padded, heads), "f32", "dt broadcast"),
        ((heads,), "f32", "A broadcast"),
        ((batch, padded, heads, head_dim), "f32", "discretized x"),
        ((batch, padded, groups, state), low, "B per group"),
        ((batch, padded, groups, state), low, "C per group"),
        ((batch, heads, padded, within), "bool", "causal mask"),
        ((batch, heads, padded, within), "f32", "segment sums"),
        ((batch, heads, padded, within), "f32", "decay"),
        ((batch, groups, padded, within), "f32", "C.B per group"),
        ((batch, heads, padded, within), low, "scores"),
        ((batch, heads, padded), "f32", "decay to chunk end"),
        ((batch, padded, heads), "f32", "decay to chunk end, broadcast"),
        ((batch, padded, heads, head_dim), low, "chunk-state operand"),
        ((batch, heads, chunks), "f32", "chunk decay"),
        ((chunks, batch, heads, one, one), "f32", "scanned chunk decay"),
        ((chunks, batch, heads, head_dim, state), "f32", "entering states"),
        ((chunks, batch, heads, head_dim, state), low, "entering states, operand"),
        ((batch, heads, padded), "f32", "decay from chunk start"),
        ((batch, padded, heads, head_dim), "f32", "read-out product"),
        ((batch, padded, heads), "f32", "decay from chunk start, broadcast"),
    ]
    if low != "f32":
        internals.append(((batch, padded, heads, head_dim), low, "discretized x, operand"))
    if t.platform.ssd_fused:  # XLA recomputes the rest where it is read (analysis/platforms.py)
        keeps = FUSED_KEEPS | t.platform.ssd_extra_keeps  # XLA:GPU keeps more (platforms.GPU)
        internals = [i for i in internals if i[2] in keeps]
    for shape, dtype, what in internals:
        t.save(t.internal(shape, dtype, f"{label} {what}", (x,)))
    return out


PRIMITIVES = (
    Primitive(
        "ssd",
        Signature(
            ("x", "dt", "A", "B", "C"),
            (
                Static(
                    "chunk",
                    StaticKind.INT,
                    256,
                    above(0),
                    "the scan runs in chunks of this many positions (Mamba-2: 256)",
                ),
            ),
            doc="Mamba-2's chunked state-space scan: x [B, S, heads, head_dim], "
            "dt [B, S, heads], A [heads], B and C [B, S, groups, state]",
        ),
        emit=_emit,
        shape=_shape,
        flops=_flops,
        memory=_memory,
        helpers=(
            Helper("ssd", SSD, ("import functools", "import jax", "import jax.numpy as jnp")),
        ),
        needs=always("ssd"),
        decoding=Decoding.SEQUENCE,
    ),
)
