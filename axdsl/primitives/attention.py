"""Scaled dot-product attention; the kernel (cudnn, splash, vjp, xla) is chosen by select_kernels.

    attention(q, k, v, causal, window, scale, softcap, bias=, mask=, segment_ids=)

q, k [B, S, heads | kv_heads, head_dim], v [B, S, kv_heads, v_head_dim] -> [B, S, heads,
v_head_dim]. The logits q.k * scale (0: 1 / sqrt(head_dim)) are soft-capped to
softcap * tanh(logits / softcap) when softcap > 0 (Gemma 2), the additive `bias` is added, then
causal, the sliding `window`, the boolean `mask` (True: attend) and `segment_ids` (packed
sequences: a query sees only its own segment) drop keys. bias and mask broadcast to
[B, heads, S, S]; the shape rule checks every operand and points at the one that is wrong.

FLOPs: 2 x heads x (head_dim + v_head_dim) per key a token reads (QK^T and PV): S keys, S / 2
when causal (MaxText's convention), and a sliding window of w drops the (S - w)^2 / 2 oldest pairs
(a causal window reads about w - w^2 / 2S keys per token: base.Keys).

Kernels: the profile lists them in order of preference (`kernels = { attention = [...] }` in
profiles.toml); `kernel_violations` says why one cannot run a call, and select_kernels takes the
first that can. Codegen writes only the chosen call, with no backend branching:

    xla, cudnn   jax.nn.dot_product_attention(q, k, v, is_causal=..., implementation="cudnn");
                 segment ids become a same-segment boolean mask ([B, 1, S, S]) next to it
    xla          einsum_attention(q, k, v, ...), a plain-JAX helper copied into the model, for
                 what jax.nn.dot_product_attention cannot express: soft-capping and a v head dim
                 of its own
    splash       splash_attention(q, k, v, causal=..., window=..., scale=, softcap=,
                 segment_ids=), a helper copied into the model (its source is below) that runs
                 the TPU Pallas kernel from jax.experimental.pallas.ops.tpu.splash_attention; it
                 computes exactly what the XLA call computes (tests compare them on the CPU with
                 `PALLAS_INTERPRET = True`)
    vjp          vjp_attention(q, k, v, causal=..., window=, scale=, mask=), a helper copied into
                 the model: the einsums of einsum_attention with the backward written out (the
                 softmax's row term taken from the output, as flash attention does). The same
                 values as XLA's call; on XLA:CPU it avoids the transposed [B, heads, S, S]
                 copies and the reduction fused into a matmul that autodiff of the XLA call
                 gives, 19% of a train step on benchmarks/vs_maxtext.py's model (cpu's first)

Constraints, from the installed jax (0.10.2) sources:

    cudnn   jax/_src/nn/functions.py dot_product_attention(implementation="cudnn") and
            jax/_src/cudnn/fused_attention_stablehlo.py (check_layout, check_is_flash_attention,
            _check_qkv_bias_mask_spec):
            - q, k, v in bf16 or f16 (f32 raises NotImplementedError; fp8 is a separate API)
            - head_dim a multiple of 8, at most 128 (A100), 256 on Hopper and later (H100+)
            - GQA is native (kv heads may be fewer); causal and a left sliding window run in
              the kernel (local_window_size=(window - 1, 0) becomes sliding_window_length)
            - no soft-capping: dot_product_attention has no soft cap argument
            - v shaped like k: dot_product_attention checks it, so a v head dim of its own (the
              cuDNN MLA path, cuDNN >= 9.10 on Hopper) is not reachable through it
            - a mask or bias is added as one dense bias, which must span [S_q, S_kv]; segment
              ids reach it the same way (jax's packed-layout offsets are not exposed by
              dot_product_attention)
            - sharded only over batch and heads: no sequence (`seq`) or head_dim sharding, and
              q, k, v sharded alike (the `heads` and `kv_heads` rules agree); under
              context(strategy = "all_gather") it runs per shard inside shard_map, the mask of
              the tokens' original positions ([B, 1, S/n, S]) as its bias; not in the ring
    splash  jax/experimental/pallas/ops/tpu/splash_attention/ (BlockSizes, make_splash_mha):
            - bf16 or f32; sequence tiles of 128 (NUM_LANES), so max_seq % 128 == 0 (the helper
              raises ValueError for another runtime length); head_dim and v's head dim
              multiples of 64 (SPLASH_HEAD_DIM: a head takes cdiv(head_dim, 128) lanes, so 64
              pads to one lane; 64, 128 and 256 were run on a v5e, other widths were not)
            - causal, sliding-window or full masks (CausalMask, LocalMask, FullMask); an
              explicit mask array would need a per-batch dynamic mask, so it is not used, and
              there is no additive bias input; segment ids (SegmentIds) and the soft cap
              (attn_logits_soft_cap) are native; the scale is applied to q before the kernel
            - GQA is native (kv head = query head // group); any sharding: the helper runs in
              jax.shard_map over batch and heads and gathers what else is split; under
              context(strategy = "all_gather") splash_context_attention builds the mask over
              the whole sequence and shards its rows (q_seq_shards), so each shard's sequence
              is a multiple of 128; not in the ring
    vjp     the helper's own backward (axdsl/kernels/attention.py, vjp_attention):
            - no soft-capping and no additive bias: their backward (tanh's slope, the bias's
              own gradient) is not written out; a boolean mask and segment ids are (no gradient)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from axdsl.ir import nodes as ir
from axdsl.ir.expr import reads_config
from axdsl.primitives.base import (
    Decoding,
    Flops,
    Helper,
    HelperSection,
    KernelRule,
    Keys,
    Primitive,
    Signature,
    Static,
    StaticKind,
)
from axdsl.primitives.reductions import ir_fmt
from axdsl.primitives.attention_kernels import (
    CACHED_ATTENTION,
    EINSUM_ATTENTION,
    CONTEXT_ALL_GATHER,
    CONTEXT_IMPORTS,
    CONTEXT_ORDER_HELPER,
    CONTEXT_PARALLEL,
    CONTEXT_RING,
    SPLASH_ATTENTION,
    SPLASH_CONTEXT_ATTENTION,
    SPLASH_IMPORTS,
    VJP_ATTENTION,
    VJP_IMPORTS,
    vjp_kept_keys,
)
from axdsl.syntax.ast import at_least
from axdsl.targets import profiles

SPLASH_BLOCK = 128  # TPU lane width: splash tiles the sequence by 128
# head dims splash is run at: multiples of 64. A head takes cdiv(head_dim, 128) lanes, so 64 pads
# q.k to a full lane; on a v5e it still beat XLA's attention at Llama 3.2 1B's 32 heads of 64
# (benchmarks/RESULTS.md). Other widths are untested on a chip, so they keep XLA's attention.
SPLASH_HEAD_DIM = 64
# the first, XLA's reference, runs every call
KERNELS = (ir.Kernel.XLA, ir.Kernel.CUDNN, ir.Kernel.SPLASH, ir.Kernel.VJP)


def _shape(ctx, prim, args):
    q, k, v = (a.type.dims for a in args[:3])
    for name, dims in (("q", q), ("k", k), ("v", v)):
        if len(dims) != 4 or any(d.is_ellipsis for d in dims):
            ctx.fail(
                prim.span,
                f"`attention` needs {name} as [B, S, heads, head_dim], got {ir_fmt(dims)}",
            )
    if not q[0].same(k[0]) or not k[0].same(v[0]):
        ctx.fail(prim.span, f"`attention` batch dims differ: {q[0]}, {k[0]}, {v[0]}")
    if not k[1].same(v[1]):
        ctx.fail(
            prim.span,
            f"`attention` k and v sequence dims differ: {k[1]} vs {v[1]}",
            "each key needs its value: "
            "k [B, S, kv_heads, head_dim], v [B, S, kv_heads, v_head_dim]",
        )
    if not q[3].same(k[3]):
        ctx.fail(
            prim.span,
            f"`attention` q and k head_dim differ: {q[3]} vs {k[3]}",
            "q and k share a head_dim; v may have its own (v_head_dim)",
        )
    if not k[2].same(v[2]):
        ctx.fail(prim.span, f"`attention` k and v have different head counts: {k[2]} vs {v[2]}")
    if q[2].size is not None and k[2].size is not None and q[2].size % k[2].size:
        ctx.fail(
            prim.span,
            f"`attention` query heads `{q[2]}` are not a multiple of kv heads `{k[2]}`",
            "kv_heads must divide heads (GQA); MQA is kv_heads = 1",
        )
    scores = (q[0], q[2], q[1], k[1])  # [B, heads, S_q, S_kv]
    for name in ("mask", "bias"):
        operand = _typed(prim, args, name)
        if operand is not None:
            _check_scores_operand(ctx, prim, name, operand, scores)
    segments = _typed(prim, args, "segment_ids")
    if segments is not None:
        dims = segments.type.dims
        self_attention = q[1].same(k[1])  # queries and keys are the same tokens
        if len(dims) != 2 or not dims[0].same(q[0]) or not dims[1].same(q[1]) or not self_attention:
            ctx.fail(
                getattr(segments, "span", None) or prim.span,
                f"`attention` segment_ids must be [B, S] like q's batch and sequence "
                f"{ir_fmt((q[0], q[1]))}, got {ir_fmt(dims)}",
                "one segment id per token of a packed sequence; queries and keys share them",
            )
    return q[:3] + (v[3],)


def _typed(prim: ir.Prim, args, name: str) -> ir.TExpr | None:
    """Optional operand `name` among the typed `args` the shape rule gets, or None."""
    return args[3 + prim.optional.index(name)] if name in prim.optional else None


def _check_scores_operand(ctx, prim: ir.Prim, name: str, operand: ir.TExpr, scores) -> None:
    """A mask or bias broadcasts to the scores [B, heads, S_q, S_kv]: each dim equal or 1."""
    dims = ir.tensor_type(operand).dims
    ok = (
        len(dims) == 4
        and not any(d.is_ellipsis for d in dims)
        and all(d.same(want) or d.size == 1 for d, want in zip(dims, scores, strict=True))
    )
    if not ok:
        what = "a boolean mask (True: attend)" if name == "mask" else "an additive bias"
        ctx.fail(
            getattr(operand, "span", None) or prim.span,
            f"`attention` {name} must broadcast to the scores {ir_fmt(scores)}, got {ir_fmt(dims)}",
            f"{what} is [B or 1, heads or 1, S, S]: one value per query and key",
        )


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    choice = prim.kernel or ir.KernelChoice(KERNELS[0])
    window, scale, softcap = prim.attr("window"), prim.attr("scale"), prim.attr("softcap")

    def _number(a: ir.HValue) -> str:
        """A scale or cap: a Config value as its expression; literal arithmetic (DeepSeek's YaRN
        mscale**2 / sqrt(192)) as the number it is."""
        return ctx.code(a) if reads_config(a.expr) else repr(float(a.value))

    def operand(name: str) -> str | None:
        return args[3 + prim.optional.index(name)] if prim.operand(name) is not None else None

    k_dims, v_dims = ir.tensor_type(prim.args[1]).dims, ir.tensor_type(prim.args[2]).dims
    if ctx.decoding:
        return _emit_cached(ctx, prim, args, window, scale, softcap, _number)
    call = AttentionCall(
        q=args[0],
        k=args[1],
        v=args[2],
        causal=ctx.code(prim.attr("causal")),
        window=ctx.code(window) if window.value else None,
        scale=_number(scale) if _set(scale) else None,
        softcap=_number(softcap) if _set(softcap) else None,
        bias=operand("bias"),
        mask=operand("mask"),
        segment_ids=operand("segment_ids"),
        written_out=not v_dims[3].same(k_dims[3]),
        staged=ctx.staged,
    )
    context = ctx.schedule.context.value if ctx.schedule is not None else None
    if context is not None:
        return _emit_context(ctx, prim, call, choice, context)
    if call.segment_ids is not None and choice.kernel is not ir.Kernel.SPLASH:
        same = ctx.fresh("same_segment")
        ids = call.segment_ids
        ctx.line(f"{same} = {ids}[:, None, :, None] == {ids}[:, None, None, :]  # [B, 1, S, S]")
        call = replace(call, mask=same if call.mask is None else f"{call.mask} & {same}")
    ctx.kernel_comment(prim)
    if choice.rejected:
        ctx.line(f"# attention: {'; '.join(choice.rejected)}")
    code, helper = emit_attention(choice.kernel, call)
    if helper is not None:
        ctx.use_helper(helper)
    return code


def _emit_context(
    ctx, prim: ir.Prim, call: AttentionCall, choice: ir.KernelChoice, context: ir.ContextPolicy
) -> str:
    """Context parallelism (plan_context): the call runs on each shard's slice of the sequence
    inside jax.shard_map (`context_parallel`), gathering the keys and values once or passing
    them around the ring; its masks come from the tokens' original positions."""
    code, helpers = _context_call(call, choice, context)
    for name in helpers:
        ctx.use_helper(name)
    ctx.imports.add("import functools")
    ctx.line("# plan_context: the sequence is split over the `seq` mesh axis (context(...));")
    if context.strategy is ir.ContextStrategy.RING:
        ctx.line("# key/value blocks pass around its shards (ppermute), an online softmax adds up")
        return code
    ctx.line("# each shard gathers the keys and values once and attends with its own queries")
    ctx.kernel_comment(prim)
    if choice.rejected:
        ctx.line(f"# attention: {'; '.join(choice.rejected)}")
    return code


def _context_call(
    call: AttentionCall, choice: ir.KernelChoice, context: ir.ContextPolicy
) -> tuple[str, tuple[str, ...]]:
    """The code of one context-parallel call and the helpers it calls (_context_helpers)."""
    qkv = f"{call.q}, {call.k}, {call.v}"
    keywords = "".join(
        f", {name}={code}"
        for name, code in (
            ("positions", f"context_order({call.q}.shape[1])" if context.balance else None),
            ("segment_ids", call.segment_ids),
            ("staged", "True" if call.staged else None),
        )
        if code is not None
    )
    operands = qkv + keywords
    settings = f"causal={call.causal}" + "".join(
        f", {name}={getattr(call, name)}"
        for name in ("window", "scale")
        if getattr(call, name) is not None
    )
    helpers = _context_helpers(call.softcap is not None, call.written_out, choice, context)
    local = helpers[-1]  # the per-shard attention: the ring, or the all-gather around `attend`
    if local == "splash_context_attention":  # its own shard_map: the kernel is built outside
        softcap = f", softcap={call.softcap}" if call.softcap is not None else ""
        return f"splash_context_attention({qkv}, {settings}{softcap}{keywords})", helpers
    if local == "einsum_attention":
        softcap = f", softcap={call.softcap}" if call.softcap is not None else ""
        settings += f", attend=functools.partial(einsum_attention, causal=False{softcap})"
    elif local == "vjp_attention":
        settings += ", attend=functools.partial(vjp_attention, causal=False)"
    elif choice.kernel is ir.Kernel.CUDNN and local == "context_attention_all_gather":
        cudnn = 'functools.partial(jax.nn.dot_product_attention, implementation="cudnn")'
        settings += f", attend={cudnn}"
    ring = context.strategy is ir.ContextStrategy.RING
    strategy = "context_attention_ring" if ring else "context_attention_all_gather"
    return f"context_parallel(functools.partial({strategy}, {settings}), {operands})", helpers


def _context_helpers(
    softcap: bool, written_out: bool, choice: ir.KernelChoice, context: ir.ContextPolicy
) -> tuple[str, ...]:
    """The helpers a context-parallel call runs, the innermost last: the ring; or the all-gather
    around the chosen kernel (jax.nn.dot_product_attention by default, which is no helper, and
    with implementation="cudnn" for the cudnn kernel; einsum_attention for a soft cap or a
    different v_head_dim; the vjp kernel); or splash's own (splash_context_attention)."""
    helpers: tuple[str, ...] = ("context_parallel",)
    helpers += (CONTEXT_ORDER_HELPER.name,) if context.balance else ()
    if context.strategy is ir.ContextStrategy.RING:
        return (*helpers, "context_attention_ring")
    if choice.kernel is ir.Kernel.SPLASH:  # the kernel built over the whole sequence
        return (*helpers, "splash_context_attention")
    helpers += ("context_attention_all_gather",)
    if softcap or written_out:
        return (*helpers, "einsum_attention")
    if choice.kernel is ir.Kernel.VJP:
        return (*helpers, "vjp_attention")
    return helpers


def _context_needs(prim: ir.Prim, schedule: ir.Schedule) -> tuple[str, ...]:
    """The helpers of a context-parallel call (what _context_call prints)."""
    k_dims, v_dims = ir.tensor_type(prim.args[1]).dims, ir.tensor_type(prim.args[2]).dims
    choice = prim.kernel or ir.KernelChoice(KERNELS[0])
    written_out = not v_dims[3].same(k_dims[3])
    return _context_helpers(_set(prim.attr("softcap")), written_out, choice, schedule.context.value)


def _needs(prim: ir.Prim, schedule: ir.Schedule | None, decoding: bool) -> tuple[str, ...]:
    """The generated attention helper the chosen kernel calls (none for
    jax.nn.dot_product_attention), or the decode path's cached attention."""
    if decoding:
        return ("cached_attention", "einsum_attention")
    if schedule is not None and schedule.context.value is not None:
        return _context_needs(prim, schedule)
    kernel = (prim.kernel or ir.KernelChoice(KERNELS[0])).kernel
    if kernel is ir.Kernel.VJP:
        return ("vjp_attention",)
    if kernel is ir.Kernel.SPLASH:
        return ("splash_attention",)
    k_dims, v_dims = ir.tensor_type(prim.args[1]).dims, ir.tensor_type(prim.args[2]).dims
    written_out = not v_dims[3].same(k_dims[3])
    return ("einsum_attention",) if _set(prim.attr("softcap")) or written_out else ()


def _emit_cached(ctx, prim: ir.Prim, args: list[str], window, scale, softcap, number) -> str:
    """The decode path's call: write k and v into this call's cache slot at `pos`, attend over
    the cache (`_decode_check` has ruled out what it cannot run)."""
    k_slot, v_slot = ctx.cache_slot(prim)
    out = ctx.fresh("o")
    kwargs = "".join(
        f", {name}={code}"
        for name, code in (
            ("window", ctx.code(window) if window.value else None),
            ("scale", number(scale) if _set(scale) else None),
            ("softcap", number(softcap) if _set(softcap) else None),
        )
        if code is not None
    )
    ctx.use_helper("cached_attention")
    ctx.use_helper("einsum_attention")
    ctx.line(
        "# decoding: keys and values so far are in "
        f"cache[{ctx.py_str(k_slot)}], cache[{ctx.py_str(v_slot)}]"
    )
    ctx.line(
        f"{out}, new_cache[{ctx.py_str(k_slot)}], new_cache[{ctx.py_str(v_slot)}] "
        "= cached_attention("
    )
    ctx.line(
        f"    {args[0]}, {args[1]}, {args[2]}, "
        f"cache[{ctx.py_str(k_slot)}], cache[{ctx.py_str(v_slot)}], "
        f"{ctx.decode_pos}{kwargs}"
    )
    ctx.line(f")  # {ctx.shape_comment(prim.type)}")
    return out


def _context_check(prim: ir.Prim, context: ir.ContextPolicy) -> str | None:
    """Why this call cannot run per shard of a split sequence: a mask or bias is an [S, S]
    operand (T5's relative bias) the shards would have to slice by their positions; the ring's
    online softmax has no soft cap."""
    for name in ("mask", "bias"):
        if prim.operand(name) is not None:
            return f"an attention with an explicit {name} (causal, window and segment_ids split)"
    if context.strategy is ir.ContextStrategy.RING and prim.attr("softcap").value:
        return (
            "a soft-capped attention: the ring's online softmax runs on raw logits; "
            'context(strategy = "all_gather") runs it'
        )
    return None


def _decode_check(prim: ir.Prim) -> str | None:
    """Why this call cannot run over a KV cache: the cache holds causal self-attention's keys.
    Segment ids are no obstacle: a decoded row holds one sequence (its prompt and what follows),
    so every cached key is of its segment."""
    q, k = ir.tensor_type(prim.args[0]).dims, ir.tensor_type(prim.args[1]).dims
    if not q[1].same(k[1]):
        return "cross-attention (its keys are not the decoded tokens)"
    if not prim.attr("causal").value:
        return "non-causal attention (a token would see later tokens)"
    for name in ("bias", "mask"):
        if prim.operand(name) is not None:
            return f"attention with an explicit {name.replace('_', ' ')}"
    return None


def _set(value) -> bool:
    """A float static that is on (nonzero), like `window`: a spec's models share one structure,
    so the value decides the call and the code (a literal or `cfg.softcap`) fills it in."""
    return value is not None and bool(value.value)


def _flops(ctx, prim: ir.Prim) -> Flops:
    """2 x heads x (head_dim + v_head_dim) per key (QK^T, then PV); which keys: causal and
    window."""
    # q: [B, S, heads, head_dim]; v: [..., v_head_dim]
    q, v = ir.tensor_type(prim.args[0]).dims, ir.tensor_type(prim.args[2]).dims
    keys = Keys(causal=bool(prim.attr("causal").value), window=prim.attr("window").value or 0)
    return Flops(
        per_key=2 * ir.static_size(q[-2]) * (ir.static_size(q[-1]) + ir.static_size(v[-1])),
        keys=keys,
    )


def _compute_dtype(model: ir.Model) -> str:
    h = model.root.hparam("dtype")
    return h.value.value.name if h is not None and isinstance(h.value.value, ir.DType) else "f32"


def kernel_violations(
    kernel: ir.Kernel, prim: ir.Prim, model: ir.Model, sched: ir.Schedule | None = None
) -> list[str]:
    """Why `kernel` cannot run this attention call for `model`; empty when it can."""
    out = []
    dtype = _compute_dtype(model)
    max_seq = model.root.hparam("max_seq")
    q_dims, k_dims, v_dims = (ir.tensor_type(a).dims for a in prim.args[:3])
    head_dim, v_head_dim = q_dims[-1].size, v_dims[-1].size
    mask, bias = prim.operand("mask"), prim.operand("bias")
    softcap = prim.attr("softcap").value
    if kernel is ir.Kernel.CUDNN:
        if softcap:
            out.append(
                f"softcap {softcap}: soft-capping is not supported by cuDNN "
                "(jax.nn.dot_product_attention has no soft cap)"
            )
        if not v_dims[-1].same(k_dims[-1]):
            out.append(
                f"v_head_dim {v_dims[-1].size} differs from head_dim {head_dim}; "
                "jax.nn.dot_product_attention needs v shaped like k (cuDNN's MLA path is "
                "not exposed)"
            )
        if dtype not in ("bf16", "f16"):
            out.append(f"{model.name} computes in {dtype}; cuDNN flash attention needs bf16 or f16")
        limit = profiles()[sched.profile].cudnn_head_dim_max if sched is not None else 128
        if head_dim is None or head_dim > limit or head_dim % 8:
            chip = f" on {sched.profile}" if sched is not None else ""
            out.append(
                f"{model.name} has head_dim {head_dim}; cuDNN needs a multiple of 8 "
                f"up to {limit}{chip}"
            )
        for name, operand in (("mask", mask), ("bias", bias)):
            if operand is None:
                continue
            m_dims = ir.tensor_type(operand).dims
            if len(m_dims) < 2 or not (m_dims[-2].same(q_dims[1]) and m_dims[-1].same(k_dims[1])):
                out.append(
                    f"a {name} that is not [..., S, S]; jax's cuDNN path adds it as a "
                    "bias, which must span the query and key sequences"
                )
        if sched is not None and sched.context.value is None:  # context(...): per shard
            out.extend(_cudnn_sharding_violations(sched))
    if kernel in FLASH_KERNELS and sched is not None and sched.context.value is not None:
        out.extend(_context_violations(kernel, sched.context.value, model, sched))
    if kernel is ir.Kernel.SPLASH:
        if dtype not in ("bf16", "f32"):
            out.append(f"{model.name} computes in {dtype}; splash attention takes bf16 or f32")
        if head_dim is None or head_dim % SPLASH_HEAD_DIM:
            out.append(
                f"{model.name} has head_dim {head_dim}; "
                f"splash needs a multiple of {SPLASH_HEAD_DIM}"
            )
        if v_head_dim is None or v_head_dim % SPLASH_HEAD_DIM:
            out.append(
                f"{model.name} has v_head_dim {v_head_dim}; "
                f"splash needs a multiple of {SPLASH_HEAD_DIM}"
            )
        if max_seq is not None and max_seq.value.value % SPLASH_BLOCK:
            out.append(
                f"{model.name} has max_seq {max_seq.value.value}; "
                f"splash needs a multiple of {SPLASH_BLOCK}"
            )
        if mask is not None:
            out.append("an explicit mask; splash runs causal and sliding-window masks only")
        if bias is not None:
            out.append("an additive bias; splash attention has no bias input")
    elif kernel is ir.Kernel.VJP:
        if softcap:
            out.append(f"softcap {softcap}: the vjp kernel's backward has no soft-cap slope")
        if bias is not None:
            out.append("an additive bias; the vjp kernel's backward gives it no gradient")
    return out


def _context_violations(
    kernel: ir.Kernel, context: ir.ContextPolicy, model: ir.Model, sched: ir.Schedule
) -> list[str]:
    """Why a flash kernel cannot run under context(...): the ring computes attention in its own
    key blocks (kernels/context.py), so no kernel runs there; under all_gather a kernel runs on
    each shard's queries (cuDNN with the mask of original positions as its dense bias, splash
    with its rows' original positions), and splash tiles each shard's sequence by 128."""
    if context.strategy is ir.ContextStrategy.RING:
        return [
            'context(strategy = "ring") computes attention in its own key blocks with an online '
            f"softmax, not in the {kernel} kernel"
        ]
    max_seq, shards = model.root.hparam("max_seq"), sched.size("seq")
    if kernel is ir.Kernel.SPLASH and max_seq is not None:
        if max_seq.value.value % (SPLASH_BLOCK * shards):
            return [
                f"{model.name} has max_seq {max_seq.value.value}; splash over {shards} `seq` "
                f"shards needs a multiple of {SPLASH_BLOCK * shards} ({SPLASH_BLOCK} a shard)"
            ]
    return []


def _cudnn_sharding_violations(sched: ir.Schedule) -> list[str]:
    """jax partitions cuDNN attention over batch and heads only, with q, k, v sharded alike."""

    def split(logical: str) -> tuple[str, ...]:
        return tuple(a for a in sched.kept_axes(logical) if sched.size(a) > 1)

    out = []
    if split("seq"):
        out.append(
            f"the sequence is sharded over {', '.join(split('seq'))} on {sched.name}; "
            "jax's cuDNN attention cannot shard the sequence dim"
        )
    if split("head_dim"):
        out.append(
            f"head_dim is sharded over {', '.join(split('head_dim'))} on {sched.name}; "
            "jax's cuDNN attention cannot shard head_dim"
        )
    if split("heads") != split("kv_heads"):
        out.append(
            f"heads ({', '.join(split('heads')) or 'replicated'}) and kv_heads "
            f"({', '.join(split('kv_heads')) or 'replicated'}) are sharded differently on "
            f"{sched.name}; jax's cuDNN attention needs q, k, v sharded alike"
        )
    return out


FLASH_KERNELS = (ir.Kernel.CUDNN, ir.Kernel.SPLASH)
# kernels/splash.py's SPLASH_FUSED_DQ_BYTES (the kernel is text to this package: it imports jax)
SPLASH_FUSED_DQ_BYTES = 4 << 30
# kernels/context.py's RING_KEY_BLOCK: keys the ring's online softmax takes at a time
RING_KEY_BLOCK = 512


def splash_fused_backward(seq: int, head_dim: int, q_bytes: float) -> bool:
    """Whether kernels/splash.py's `splash_block_sizes` takes the fused backward kernel, whose dq
    is written once per key tile of 1024 (seq / 1024 copies of q) before they are summed."""
    return seq % 1024 == 0 and head_dim <= 128 and seq // 1024 * q_bytes <= SPLASH_FUSED_DQ_BYTES


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """q, k, v; then flash kernels the output and log-sum-exp (splash's fused backward a copy of dq
    per key tile besides, not kept), XLA the [B, heads, S, S] internals:
    the masked logits and exp in float32 (and two more with soft-capping), the mask, the
    probabilities in the compute dtype."""
    q, k, v = args[:3]
    heads = q.dims[-2]
    out = t.new(dims, q.dtype, label, (q, k, v))
    for x in (q, k, v):
        t.save(x)
    if t.context is not None and t.context.strategy is ir.ContextStrategy.RING:
        return _ring_memory(t, q, k, out, label)
    if t.context is not None:  # all_gather: the backward keeps this shard's gathered keys, values
        for x, what in ((k, "keys"), (v, "values")):
            full = (x.dims[0], ir.Dim("S_kv", t.seq), *x.dims[2:])
            t.save(t.internal(full, x.dtype, f"{label} gathered {what}", (x,)))
    kernel = prim.kernel.kernel if prim.kernel is not None else KERNELS[0]
    if kernel is ir.Kernel.CUDNN and t.context is not None:  # the mask, as cuDNN's dense bias
        scores = (q.dims[0], ir.Dim("1", 1), q.dims[1], ir.Dim("S_kv", t.seq))
        t.save(t.internal(scores, q.dtype, f"{label} mask bias", (q, k)))
    if kernel in FLASH_KERNELS:
        t.save(out)
        t.save(t.internal((q.dims[0], heads, q.dims[1]), "f32", f"{label} logsumexp", (q, k)))
        head_dim = ir.static_size(q.dims[-1])
        if kernel is ir.Kernel.SPLASH and splash_fused_backward(
            t.seq, head_dim, t.nbytes(q) / t.lane_padding(q)
        ):
            # a backward temporary; XLA:TPU's total grows by a fraction of it (platforms.py)
            tiles = ir.Dim("key tiles", int(t.seq // 1024 * t.platform.splash_dq_live))
            t.internal((tiles, *q.dims), q.dtype, f"{label} dq per key tile", (q, k))
        return out
    scores = (q.dims[0], heads, q.dims[1], ir.Dim("S_kv", t.seq))  # keys: the full sequence
    if (
        kernel is ir.Kernel.VJP
    ):  # its backward keeps the probabilities in v's dtype and its output grouped
        t.save(out)
        t.save(t.internal(dims, q.dtype, f"{label} grouped output", (q, k, v)))
        window = t.static(prim.attr("window"))
        kept = vjp_kept_keys(t.seq, bool(t.static(prim.attr("causal"))), window or None)
        blocks = (
            q.dims[0],
            heads,
            q.dims[1],
            ir.Dim("S_kv kept", kept),
        )  # query blocks skip masked keys
        t.save(t.internal(blocks, v.dtype, f"{label} probabilities", (q, k)))
        t.internal(
            blocks, "f32", f"{label} logits", (q, k)
        )  # not kept; its backward has two such cotangents
        return out
    internals = [("f32", "masked logits"), ("f32", "exp")]
    if prim.attr("softcap").value:  # tanh's backward keeps its output and 1 - tanh^2
        internals += [("f32", "soft-capped logits"), ("f32", "soft-cap slope")]
    masked = prim.operand("mask") is not None or prim.operand("segment_ids") is not None
    if t.static(prim.attr("causal")) or t.static(prim.attr("window")) or masked:
        internals.append(("bool", "mask"))
    if q.dtype != "f32":
        internals.append((q.dtype, "probabilities"))
    for dtype, what in internals:
        t.save(t.internal(scores, dtype, f"{label} {what}", (q, k)))
    return out


def _ring_memory(t, q, k, out, label: str):
    """Ring attention (kernels/context.py) keeps its output and float32 log-sum-exp for the
    backward; in flight, the key/value block arriving besides the one in use, and the float32
    logits of half this shard's queries by one block of at most RING_KEY_BLOCK keys: nothing
    grows with the whole sequence, nor with the square of a shard's."""
    shards = t.context.shards or 1
    t.save(out)
    t.save(t.internal((q.dims[0], q.dims[-2], q.dims[1]), "f32", f"{label} logsumexp", (q, k)))
    t.internal(k.dims, k.dtype, f"{label} arriving keys", (k,))
    t.internal(k.dims, k.dtype, f"{label} arriving values", (k,))
    half = max(1, t.seq // (2 * shards))
    block = max(b for b in range(1, min(half, RING_KEY_BLOCK) + 1) if half % b == 0)
    rows, keys = ir.Dim("tile", half), ir.Dim("key block", block)
    t.internal((q.dims[0], q.dims[-2], rows, keys), "f32", f"{label} block logits", (q, k))
    return out


# ---------------------------------------------------------------------------- generated code
@dataclass(frozen=True)
class AttentionCall:
    """The Python code of one attention call's operands and settings; None where not given."""

    q: str
    k: str
    v: str
    causal: str
    window: str | None = None
    scale: str | None = None  # None: 1 / sqrt(head_dim)
    softcap: str | None = None  # None: no soft-capping
    bias: str | None = None
    mask: str | None = None
    segment_ids: str | None = None  # splash takes them; the others get them as `mask`
    written_out: bool = False  # v's head_dim is not k's: jax.nn.dot_product_attention cannot
    staged: bool = False  # inside the pipeline's stages: a shard_map leaves `stage` to its vmap


def emit_attention(kernel: ir.Kernel, call: AttentionCall) -> tuple[str, str | None]:
    """The expression of one attention call on `kernel`, and the generated helper it calls (None
    for jax.nn.dot_product_attention): the kernel decides both, so no caller reads the text."""
    q, k, v = call.q, call.k, call.v
    if kernel is ir.Kernel.VJP:
        if call.softcap is not None or call.bias is not None:  # select_kernels never picks vjp then
            raise AssertionError("vjp attention takes no soft cap or bias")
        extra = "".join(
            f", {name}={getattr(call, name)}"
            for name in ("window", "scale", "mask")
            if getattr(call, name) is not None
        )
        return f"vjp_attention({q}, {k}, {v}, causal={call.causal}{extra})", "vjp_attention"
    if kernel is ir.Kernel.SPLASH:
        if call.mask is not None or call.bias is not None:  # select_kernels never picks splash then
            raise AssertionError("splash attention takes no explicit mask or bias")
        extra = "".join(
            f", {name}={getattr(call, name)}"
            for name in ("scale", "softcap", "segment_ids")
            if getattr(call, name) is not None
        )
        extra += ", staged=True" if call.staged else ""
        code = f"splash_attention({q}, {k}, {v}, causal={call.causal}, window={call.window}{extra})"
        return code, "splash_attention"
    if call.softcap is not None or call.written_out:  # only the xla kernel runs these
        kwargs = [f"causal={call.causal}"]
        for name in ("window", "scale", "softcap", "bias", "mask"):
            if getattr(call, name) is not None:
                kwargs.append(f"{name}={getattr(call, name)}")
        return f"einsum_attention({q}, {k}, {v}, {', '.join(kwargs)})", "einsum_attention"
    kwargs = [f"is_causal={call.causal}"]
    for name in ("bias", "mask", "scale"):
        if getattr(call, name) is not None:
            kwargs.append(f"{name}={getattr(call, name)}")
    if call.window is not None:
        kwargs.append(f"local_window_size=({call.window} - 1, 0)")
    kwargs.append(f'implementation="{kernel}"')
    return f"jax.nn.dot_product_attention({q}, {k}, {v}, {', '.join(kwargs)})", None


PRIMITIVES = (
    Primitive(
        "attention",
        Signature(
            ("q", "k", "v"),
            (
                Static("causal", StaticKind.BOOL, False),
                Static("window", StaticKind.INT, 0, at_least(0), "0 means no sliding window"),
                Static("scale", StaticKind.FLOAT, 0.0, at_least(0), "0 means 1 / sqrt(head_dim)"),
                Static("softcap", StaticKind.FLOAT, 0.0, at_least(0), "0 means no soft-capping"),
            ),
            ("mask", "bias", "segment_ids"),
            doc="scaled dot-product attention; the kernel is chosen by a target pass",
        ),
        emit=_emit,
        shape=_shape,
        flops=_flops,
        memory=_memory,
        kernels=KernelRule(KERNELS, kernel_violations),
        needs=_needs,
        helpers=(
            Helper("splash_attention", SPLASH_ATTENTION, SPLASH_IMPORTS, HelperSection.KERNEL),
            Helper("einsum_attention", EINSUM_ATTENTION),
            Helper("vjp_attention", VJP_ATTENTION, VJP_IMPORTS),
            Helper("cached_attention", CACHED_ATTENTION),
            Helper("context_parallel", CONTEXT_PARALLEL, CONTEXT_IMPORTS),
            Helper(
                "splash_context_attention",
                SPLASH_CONTEXT_ATTENTION,
                (*SPLASH_IMPORTS, "import numpy as np"),
                HelperSection.KERNEL,
            ),
            Helper(
                "context_attention_all_gather",
                CONTEXT_ALL_GATHER,
                ("import functools", "from collections.abc import Callable", "import jax"),
            ),
            Helper(
                "context_attention_ring",
                CONTEXT_RING,
                ("import functools", "import jax", "import jax.numpy as jnp"),
            ),
            CONTEXT_ORDER_HELPER,
        ),
        decoding=Decoding.CACHED,
        decode_check=_decode_check,
        takes_positions=True,
        shard_mapped=True,
        context_check=_context_check,
    ),
)
