"""Scaled dot-product attention; the kernel (cudnn, splash, xla) is chosen by select_kernels.

FLOPs: 4 x keys x heads x head_dim per token (QK^T and PV), halved when causal (MaxText's
convention); a sliding window of w keys counts min(S, w) keys when `cap_window` is set.
"""

from __future__ import annotations

from axdsl.codegen import kernels
from axdsl.ir import nodes as ir
from axdsl.primitives.base import Flops, Primitive, Signature, Static, StaticKind
from axdsl.primitives.reductions import ir_fmt


def _shape(ctx, prim, args):
    q, k, v = (a.type.dims for a in args[:3])
    for name, dims in (("q", q), ("k", k), ("v", v)):
        if len(dims) != 4 or any(d.is_ellipsis for d in dims):
            ctx.fail(prim.span, f"`attention` needs {name} as [B, S, heads, head_dim], got {ir_fmt(dims)}")
    if not q[0].same(k[0]) or not k[0].same(v[0]):
        ctx.fail(prim.span, f"`attention` batch dims differ: {q[0]}, {k[0]}, {v[0]}")
    if not k[1].same(v[1]):
        ctx.fail(prim.span, f"`attention` k and v sequence dims differ: {k[1]} vs {v[1]}")
    if not q[3].same(k[3]):
        ctx.fail(prim.span, f"`attention` q and k head_dim differ: {q[3]} vs {k[3]}")
    if not k[2].same(v[2]):
        ctx.fail(prim.span, f"`attention` k and v have different head counts: {k[2]} vs {v[2]}")
    if q[2].size is not None and k[2].size is not None and q[2].size % k[2].size:
        ctx.fail(prim.span, f"`attention` query heads `{q[2]}` are not a multiple of kv heads `{k[2]}`",
                 "kv_heads must divide heads (GQA); MQA is kv_heads = 1")
    if prim.attr("window").value < 0:
        ctx.fail(prim.span, "`window` must be >= 0 (0 means no sliding window)")
    return q[:3] + (v[3],)


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    choice = prim.kernel or ir.KernelChoice("xla")
    window = prim.attr("window")
    mask = args[3] if prim.operand("mask") is not None else None
    code, note = kernels.emit_attention(
        kernel=choice.kernel, q=args[0], k=args[1], v=args[2], mask=mask,
        causal=prim.attr("causal").code, window=window.code if window.value else None,
        note="; ".join(choice.rejected),
    )
    if note:
        ctx.line(f"# {note}")
    return code


def work(prim: ir.Prim, seq: int, cap_window: bool) -> int:
    """Forward FLOPs per token at sequence length `seq`."""
    q = prim.args[0].type.dims  # [B, S, heads, head_dim]
    heads, head_dim = q[-2].size, q[-1].size
    window = prim.attr("window").value
    if cap_window and window and window < seq:
        return 4 * window * heads * head_dim  # every query sees (about) `window` keys
    full = 4 * seq * heads * head_dim
    return full // 2 if prim.attr("causal").value else full


def _flops(ctx, prim: ir.Prim) -> Flops:
    return Flops(attention=work(prim, ctx.seq, ctx.cap_window))


PRIMITIVES = (
    Primitive("attention", Signature(
        ("q", "k", "v"), (Static("causal", StaticKind.BOOL, False), Static("window", StaticKind.INT, 0)),
        ("mask",), doc="scaled dot-product attention; the kernel is chosen by a target pass"),
        emit=_emit, shape=_shape, flops=_flops, has_kernels=True),
)
