"""Causal depthwise 1-D convolution over the sequence, as Mamba's short conv before its scan.

    conv1d(x, w, b = bias)    x [B, S, C], w [K, C] (K taps per channel), b [C] -> [B, S, C]

out[t] = sum_k w[k] * x[t - K + 1 + k] (+ b): each position sees itself and the K - 1 before it,
zeros before the first position, each channel on its own. FLOPs: 2 K C per token when `w` is a
parameter (counted with the matmuls: it multiplies weights).
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.primitives.base import Decoding, Flops, Helper, Primitive, Signature, always
from axdsl.primitives.base import Source
from axdsl.primitives.reductions import ir_fmt

CAUSAL_CONV1D = Source("conv", ("causal_conv1d",))


def _shape(ctx, prim: ir.Prim, args):
    x, w = args[0].type.dims, args[1].type.dims
    if len(x) != 3 or any(d.is_ellipsis for d in x):
        ctx.fail(prim.span, f"`conv1d` needs x [B, S, channels], got {ir_fmt(x)}")
    if len(w) != 2 or w[0].size is None:
        ctx.fail(prim.span, f"`conv1d` needs w [taps, channels] of known taps, got {ir_fmt(w)}")
    if not w[1].same(x[2]):
        ctx.fail(
            prim.span,
            f"`conv1d` channels disagree: x is {ir_fmt(x)} but w is {ir_fmt(w)}",
            "w is [taps, channels], one filter per channel of x's last dim",
        )
    bias = args[2] if prim.operand("b") is not None else None  # the typed operand
    if bias is not None and (len(bias.type.dims) != 1 or not bias.type.dims[0].same(x[2])):
        ctx.fail(prim.span, f"`conv1d` bias must be [{x[2]}], got {ir_fmt(bias.type.dims)}")
    return x


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    ctx.use_helper("causal_conv1d")
    bias = f", b={args[2]}" if prim.operand("b") is not None else ""
    return f"causal_conv1d({args[0]}, {args[1]}{bias})"


def _flops(ctx, prim: ir.Prim) -> Flops:
    if ctx.param_at(prim.args[1]) is None:
        return Flops()
    taps, channels = (ir.static_size(d) for d in ir.tensor_type(prim.args[1]).dims)
    return Flops(matmul=2 * taps * channels)


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """Keeps x and w (jax 0.10, measured with print_saved_residuals); the bias needs nothing."""
    out = t.new(dims, args[0].dtype, label, tuple(args))
    t.save(args[0])
    t.save(args[1])
    return out


PRIMITIVES = (
    Primitive(
        "conv1d",
        Signature(
            ("x", "w"),
            optional_tensors=("b",),
            doc="causal depthwise conv over S: x [B, S, C], w [K, C], b = [C]",
        ),
        emit=_emit,
        shape=_shape,
        flops=_flops,
        memory=_memory,
        helpers=(Helper("causal_conv1d", CAUSAL_CONV1D, ("import jax",)),),
        needs=always("causal_conv1d"),
        decoding=Decoding.SEQUENCE,
    ),
)
