"""Mixture of SwiGLU experts: softmax router, top-k, capacity (<= 0: dropless), auxiliary losses.

DeepSeek-V3's routing is the same primitive with statics: `score = "sigmoid"` (scores are
independent sigmoids, not a softmax), an optional `bias` [experts] added to the scores for the
choice of experts only (its weights stay the plain scores: DeepSeek's e_score_correction_bias),
`groups` > 1 with `top_groups` (experts in `groups` equal groups; a token picks among the experts
of its `top_groups` best groups, a group scored by the sum of its two best experts) and `scale`
(multiplies the routing weights after normalizing: routed_scaling_factor). With the defaults the
generated router is the plain softmax top-k (`moe_route`); any of these picks `moe_route_deepseek`.

`balance_rate` > 0 is DeepSeek-V3's auxiliary-loss-free load balancing: after each step the
bias (a parameter of the layer) moves by -balance_rate * sign(load - mean load), the tokens each
expert got in that step's batch. The forward is unchanged; the generated `moe_balance` gives the
bias that load surplus as its gradient (its true gradient is zero: the choice is discrete), and
train.py's optimizer applies the sign rule to the parameters `balanced_biases` lists, outside
AdamW, clipping and the logged gradient norm.

FLOPs: top_k x 2 x (elements of one expert's three matrices): only routed experts work;
capacity padding is not counted (MaxText).

Generated code: the layer's statements call the pieces of axdsl/kernels/moe.py the spec uses: a
router with its auxiliary loss (`moe_route`, or `moe_route_deepseek` with any of DeepSeek's
options), a dispatch path (`moe_with_capacity`, `moe_dropless`, or `moe_dispatch` when a
capacity_factor read from Config picks one at run time) and, balancing, `moe_balance`;
kernels.py holds only those.
"""

from __future__ import annotations

import json
import math

from axdsl.errors import did_you_mean
from axdsl.ir.expr import reads_config
from axdsl.ir import nodes as ir
from axdsl.syntax.ast import at_least
from axdsl.primitives.base import (
    Flops,
    Helper,
    HelperSection,
    Primitive,
    Signature,
    Static,
    StaticKind,
    Source,
)
from axdsl.primitives.reductions import ir_fmt

ROUTING = ("top_k", "normalize")  # the router's options
SELECTION = ("score", "groups", "top_groups", "scale")  # DeepSeek's, emitted only when used
LOSSES = ("aux_weight", "z_weight")
# The helpers (axdsl/kernels/moe.py), named so that kernels.py, which orders them by name, reads
# in the layer's order: a router and the auxiliary loss it computes, a dispatch path through the
# experts, the balancing update.
ROUTE, CHOOSE, AUX = "moe.route", "moe.route.deepseek", "moe.route.loss"
AUX_STATS = "moe.route.loss.stats"  # the loss's statistics, for a layer inside a pipeline
CAPACITY, DROPLESS, EITHER = "moe.run.capacity", "moe.run.dropless", "moe.run.either"
BALANCE = "moe.update.balance"  # the load surplus as the selection bias's gradient
BALANCE_STATS = "moe.update.balance.stats"  # the same, inside a pipeline's stages
CALLS = {  # the function of each helper that model.py calls
    ROUTE: "moe_route",  # softmax top-k
    CHOOSE: "moe_route_deepseek",  # sigmoid scores, a selection bias, group-limited top-k, scale
    CAPACITY: "moe_with_capacity",
    DROPLESS: "moe_dropless",
    EITHER: "moe_dispatch",  # capacity or dropless, as a capacity_factor read from Config says
    BALANCE: "moe_balance",
}
SCORES = ("softmax", "sigmoid")


def _selects(prim: ir.Prim) -> bool:
    """Whether the call uses any of DeepSeek's routing options (else the plain softmax router)."""
    return (
        prim.attr("score").value != "softmax"
        or prim.attr("groups").value != 1
        or prim.attr("scale").value != 1.0
        or prim.operand("bias") is not None
    )


def _shape(ctx, prim: ir.Prim, args):
    x, logits, w_gate, w_up, w_down = (a.type.dims for a in args[:5])
    if len(x) != 3 or any(d.is_ellipsis for d in x):
        ctx.fail(prim.span, f"`moe` needs x as [B, S, dim], got {ir_fmt(x)}")
    if len(logits) != 3 or not logits[0].same(x[0]) or not logits[1].same(x[1]):
        ctx.fail(
            prim.span,
            f"`moe` needs router logits as [B, S, experts] for x {ir_fmt(x)}, got {ir_fmt(logits)}",
        )
    experts = logits[2]
    for name, w, want in (
        ("w_gate", w_gate, (experts, x[2], None)),
        ("w_up", w_up, (experts, x[2], None)),
        ("w_down", w_down, (experts, None, x[2])),
    ):
        if len(w) != 3 or not all(d is None or d.same(g) for d, g in zip(want, w, strict=True)):
            shape = ", ".join("hidden" if d is None else str(d) for d in want)
            ctx.fail(prim.span, f"`moe` needs {name} as [{shape}], got {ir_fmt(w)}")
    if not w_gate[2].same(w_up[2]) or not w_gate[2].same(w_down[1]):
        ctx.fail(prim.span, f"`moe` expert hidden dims differ: {w_gate[2]}, {w_up[2]}, {w_down[1]}")
    k = prim.attr("top_k")
    if not 1 <= k.value <= (experts.size or k.value):
        ctx.fail(
            prim.span, f"`moe` top_k = {k.value} must be between 1 and the {experts.size} experts"
        )
    _check_groups(ctx, prim, experts, k.value)
    bias = prim.operand("bias")
    if bias is not None and (len(args[5].type.dims) != 1 or not args[5].type.dims[0].same(experts)):
        ctx.fail(
            prim.span,
            f"`moe` bias must be [{experts}], one per expert, got {ir_fmt(args[5].type.dims)}",
            "the selection bias is added to each token's expert scores",
        )
    _check_balance(ctx, prim, bias)
    return x


def _check_balance(ctx, prim: ir.Prim, bias: ir.TExpr | None) -> None:
    """A positive balance_rate (its bound, >= 0, is declared) needs a bias that is a parameter of
    this layer (it is what the balancing rule moves)."""
    rate = prim.attr("balance_rate").value
    if rate > 0 and not (isinstance(bias, ir.Ref) and bias.kind == ir.RefKind.PARAM):
        ctx.fail(
            prim.span,
            f"`moe` balance_rate={rate} needs `bias =` one of this layer's parameters, "
            + ("got none" if bias is None else "got an expression"),
            "balancing moves the selection bias after each step: declare `param score_bias: "
            "[experts] init zeros` and pass `bias = score_bias`",
        )


def balanced_biases(root: ir.Instance) -> list[tuple[str, float]]:
    """(parameter path, balance_rate) of every selection bias the balancing rule moves: train.py's
    BALANCE, in model order."""
    from axdsl.ir.rewrite import prims_of

    out: list[tuple[str, float]] = []
    for inst in root.walk():
        for prim in prims_of(inst, "moe"):
            bias = prim.operand("bias")
            if prim.attr("balance_rate").value > 0 and isinstance(bias, ir.Ref):
                path = "/".join([p for p in inst.path.split("/") if p] + [bias.name])
                if path not in dict(out):
                    out.append((path, prim.attr("balance_rate").value))
    return out


def _check_groups(ctx, prim: ir.Prim, experts: ir.Dim, top_k: int) -> None:
    """Groups split the experts evenly, at least two each (a group's score is its top two), and the
    chosen groups hold at least top_k experts."""
    groups, top = prim.attr("groups").value, prim.attr("top_groups").value
    if groups < 1 or experts.size is not None and experts.size % groups:
        ctx.fail(
            prim.span,
            f"`moe` experts `{experts}` do not split into `groups={groups}` equal groups",
            "experts are split into equal groups (DeepSeek-V3: 256 experts in 8 groups)",
        )
    per = (experts.size or 2 * groups) // groups
    if groups > 1 and per < 2:
        ctx.fail(
            prim.span,
            f"`moe` groups = {groups} leave {per} expert per group; each needs at least 2",
            "a group is scored by the sum of its two best experts",
        )
    if not 1 <= top <= groups or groups > 1 and top * per < top_k:
        ctx.fail(
            prim.span,
            f"`moe` top_groups = {top} must be between 1 and the {groups} groups and hold "
            f"top_k = {top_k} experts ({per} per group)",
        )


def _check(ctx, given: dict, attrs: dict) -> None:
    """Only the known scoring functions reach generated code."""
    score = attrs["score"].value
    if score not in SCORES:
        where = given.get("score")
        ctx.fail(
            where.span if where is not None else None,
            f"`moe` score must be one of {', '.join(SCORES)}, " f"got {json.dumps(score[:40])}",
            did_you_mean(score, list(SCORES)) or "",
        )


def _paths(prim: ir.Prim) -> tuple[str, ...]:
    """The routing helpers a call runs: a capacity written in the spec picks the capacity or the
    dropless path; one read from Config (decided at run time) keeps both."""
    cf = prim.attr("capacity_factor")
    if reads_config(cf.expr):
        return (CAPACITY, DROPLESS)
    return (CAPACITY,) if cf.value > 0 else (DROPLESS,)


def _needs(prim: ir.Prim, schedule: ir.Schedule | None, decoding: bool) -> tuple[str, ...]:
    """The router (with its auxiliary loss), the dispatch paths and the balancing update a call
    uses."""
    paths = _paths(prim)
    balancing = prim.attr("balance_rate").value > 0
    piped = schedule is not None and schedule.pipeline.value is not None
    return (
        CHOOSE if _selects(prim) else ROUTE,
        AUX,
        *paths,
        *((EITHER,) if len(paths) == 2 else ()),
        *((BALANCE,) if balancing and not piped else ()),
        # a layer inside the pipeline's stages returns the loss's statistics (plan_pipeline)
        *((AUX_STATS,) if piped else ()),
        *((BALANCE_STATS,) if balancing and piped else ()),
    )


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    """The layer as the statements a reader follows: the router (its auxiliary loss joins this
    layer's), the dispatch through the experts and, with balance_rate > 0, the balancing update.

        weights, chosen, moe_aux = moe_route(logits, top_k=2, normalize=True, aux_weight=0.01, ...)
        moe_y = moe_dropless(x, weights, chosen, w_gate, w_up, w_down, batch_axes=("data",))

    Each is a helper of axdsl/kernels/moe.py, so kernels.py holds only the routing the spec uses:
    a capacity written in the spec picks the capacity or the dropless path; one read from Config
    calls `moe_dispatch`, which keeps both."""
    x, logits, w_gate, w_up, w_down = args[:5]
    bias = args[5] if prim.operand("bias") is not None else None
    weights, chosen = _route(ctx, prim, logits, bias)
    out = ctx.fresh("moe_y")
    call = f"{x}, {weights}, {chosen}, {w_gate}, {w_up}, {w_down}"
    ctx.line(f"{out} = {_dispatch(ctx, prim, call)}  # {ctx.shape_comment(prim.type)}")
    if prim.attr("balance_rate").value > 0 and ctx.staged:  # as statistics, inside a pipeline
        ctx.use_helper(BALANCE_STATS)
        balance = ctx.fresh("balance_aux")
        ctx.add_aux(balance)
        microbatches = ctx.schedule.pipeline.value.microbatches
        ctx.line(f"# {balance}: the bias's gradient, this micro-batch's load surplus times the")
        ctx.line(f"# {microbatches} micro-batches, which the pipeline averages (its loss is 0)")
        ctx.line(f"{balance} = moe_balance_stats({bias}, {chosen}, microbatches={microbatches})")
    elif prim.attr("balance_rate").value > 0:  # the bias's gradient: each expert's load surplus
        ctx.use_helper(BALANCE)
        ctx.line(
            f"{out} = {CALLS[BALANCE]}({out}, {bias}, {chosen})  # {ctx.shape_comment(prim.type)}"
        )
    return out


def _route(ctx, prim: ir.Prim, logits: str, bias: str | None) -> tuple[str, str]:
    """`weights, chosen, moe_aux = moe_route(...)` (or `moe_route_deepseek`, with DeepSeek's
    options and the bias); moe_aux joins this layer's auxiliary loss. The names of the routing
    weights and the chosen experts."""
    weights, chosen, aux = ctx.fresh("weights"), ctx.fresh("chosen"), ctx.fresh("moe_aux")
    ctx.add_aux(aux)
    router = CHOOSE if _selects(prim) else ROUTE
    ctx.use_helper(router)
    ctx.use_helper(AUX)  # both routers compute it
    call = f"{CALLS[router]}({logits}, {_kwargs(ctx, prim, ROUTING + LOSSES)}"
    if router == CHOOSE:
        call += ", " + _kwargs(ctx, prim, SELECTION) + ("" if bias is None else f", bias={bias}")
    per_choice = ctx.shape_comment(ir.TensorType((*_token_dims(prim), ir.Dim("top_k"))))
    if ctx.staged:  # inside the pipeline's stages: the loss's statistics (plan_pipeline)
        ctx.use_helper(AUX_STATS)
        call += ", aux=moe_aux_stats"
        ctx.line(f"# each token's routing {weights} and {chosen} experts {per_choice}, and {aux}:")
        ctx.line("# this micro-batch's statistics of the auxiliary loss, which the pipeline")
        ctx.line("# averages over the micro-batches (the loss is a product of batch means)")
    else:
        ctx.line(
            f"# each token's routing {weights} and {chosen} experts {per_choice}, and {aux} []"
        )
    ctx.line(f"{weights}, {chosen}, {aux} = {call})")
    return weights, chosen


def _dispatch(ctx, prim: ir.Prim, routed: str) -> str:
    """The call of the dispatch path on `routed` (x, weights, chosen and the expert weights): the
    one a capacity written in the spec picks, or `moe_dispatch` for one read from Config."""
    paths = _paths(prim)
    dispatch = EITHER if len(paths) == 2 else paths[0]
    for helper in {dispatch, *paths}:  # moe_dispatch calls both paths
        ctx.use_helper(helper)
    call = f"{CALLS[dispatch]}({routed}"
    if CAPACITY in paths:
        call += f", capacity_factor={ctx.code(prim.attr('capacity_factor'))}"
    batch_axes = ctx.schedule.kept_axes("batch") if ctx.schedule is not None else ()
    if ctx.staged:  # inside the pipeline's stages, whose vmap holds the `stage` axis
        batch_axes = tuple(a for a in batch_axes if a != ir.STAGE_AXIS)
    if DROPLESS in paths and batch_axes:  # each batch shard dispatches its own tokens
        call += f", batch_axes={batch_axes!r}"
    if DROPLESS in paths and ctx.staged:  # its shard_map inside the pipeline's vmap
        call += ", staged=True"
    return call + ")"


def _kwargs(ctx, prim: ir.Prim, names: tuple[str, ...]) -> str:
    """`top_k=2, normalize=True`: the call's statics `names` as keyword arguments."""
    return ", ".join(f"{k}={ctx.code(prim.attr(k))}" for k in names)


def _token_dims(prim: ir.Prim) -> tuple[ir.Dim, ...]:
    """[B, S] of the router logits [B, S, experts]."""
    logits = prim.args[1].type
    assert isinstance(logits, ir.TensorType), "shape inference typed the router logits"
    return logits.dims[:-1]


def _flops(ctx, prim: ir.Prim) -> Flops:
    total = 0
    for w in prim.args[2:5]:
        p = ctx.param_at(w)
        if p is not None:
            total += math.prod(d.size for d in p.dims) // p.dims[0].size  # one expert
    return Flops(matmul=2 * prim.attr("top_k").value * total)


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """The generated layer: router softmax, then either one-hot dispatch to [B, experts,
    capacity] slots (capacity_factor > 0) or tokens sorted by expert and grouped matmuls
    (dropless); each expert runs a SwiGLU on its tokens. Expert matmuls are batched over experts,
    so save_dots keeps none of them."""
    x, logits, w_gate = args[0], args[1], args[2]
    top_k = int(t.static(prim.attr("top_k"), 1))
    cf = float(t.static(prim.attr("capacity_factor"), 0.0))
    experts, hidden, model_dim = w_gate.dims[0], w_gate.dims[-1], x.dims[-1]
    b, s = x.dims[0], x.dims[1]
    out = t.new(dims, x.dtype, label, tuple(args))
    t.save(t.internal((b, s, experts), "f32", f"{label} router softmax", (logits,)))
    k = ir.Dim("top_k", top_k)
    if cf > 0:
        cap = ir.Dim("capacity", max(1, math.ceil(top_k * t.seq * cf / experts.size)))
        slot = (b, experts, cap)
        for what, d in (
            ("slots", (b, k, s, experts, cap)),
            ("dispatch", (b, s, experts, cap)),
            ("combine", (b, s, experts, cap)),
        ):
            t.save(t.internal(d, x.dtype, f"{label} {what}", (logits,)))
    else:
        slot = (b, s, k)
    inner = [
        ("expert inputs", model_dim),
        ("gate", hidden),
        ("silu residual", hidden),
        ("silu residual", hidden),
        ("up", hidden),
        ("hidden", hidden),
        ("expert outputs", model_dim),
    ]
    for what, d in inner:
        t.save(t.internal(slot + (d,), x.dtype, f"{label} {what}", (x, logits)))
    if (
        cf <= 0
    ):  # XLA:TPU sorts and scatters the dispatched tokens in 32 bits (analysis/platforms.py)
        for _ in range(t.platform.moe_dispatch_u32):
            t.save(t.internal(slot + (model_dim,), "u32", f"{label} 32-bit dispatch", (x, logits)))
        # XLA:GPU expands the grouped matmuls (ragged_dot) into a masked dot per expert: the
        # backward's [experts, tokens x top_k, d] buffers, not kept (analysis/platforms.py)
        # how many: one chip's count, or with more chips train.py's multi-GPU XLA flags' count
        facts = t.platform
        wide, narrow = facts.moe_ragged_dense
        if math.prod(t.layout.sizes.values()) > 1 and facts.moe_ragged_dense_sharded is not None:
            wide, narrow = facts.moe_ragged_dense_sharded
        widths = (model_dim,) * wide + (hidden,) * narrow
        for i, d in enumerate(widths):
            rows = (experts, *slot, d)
            t.internal(rows, x.dtype, f"{label} ragged_dot per expert {i}", (x, logits), whole=True)
    return out


def _unused_params(ctx, prim: ir.Prim) -> int:
    """Expert weights a token does not use: (experts - top_k) / experts of them."""
    logits = prim.args[1].type
    assert isinstance(logits, ir.TensorType), "shape inference typed the router logits"
    experts = logits.dims[-1].size
    k = prim.attr("top_k").value
    weights = (ctx.param_at(a) for a in prim.args[2:5])
    elems = sum(math.prod(d.size for d in p.dims) for p in weights if p is not None)
    return elems * (experts - k) // experts


# ---------------------------------------------------------------------------- generated code
_JAX = ("import jax", "import jax.numpy as jnp")
_HELPERS = (
    Helper(ROUTE, Source("moe", (CALLS[ROUTE],)), _JAX, HelperSection.LAYER),
    Helper(AUX, Source("moe", ("_moe_aux_loss", "_moe_load")), _JAX, HelperSection.LAYER),
    Helper(AUX_STATS, Source("moe", ("moe_aux_stats",)), _JAX, HelperSection.LAYER),
    Helper(CHOOSE, Source("moe", (CALLS[CHOOSE], "_moe_choose")), _JAX, HelperSection.LAYER),
    Helper(
        CAPACITY, Source("moe", (CALLS[CAPACITY],)), (*_JAX, "import math"), HelperSection.LAYER
    ),
    Helper(
        DROPLESS,
        Source("moe", (CALLS[DROPLESS], "_moe_dropless_rows")),
        (*_JAX, "import math"),
        HelperSection.LAYER,
    ),
    Helper(EITHER, Source("moe", (CALLS[EITHER],)), ("import jax",), HelperSection.LAYER),
    Helper(
        BALANCE,
        Source("moe", (CALLS[BALANCE], "_moe_balance", "_moe_balance_fwd", "_moe_balance_bwd")),
        _JAX,
        HelperSection.LAYER,
    ),
    Helper(BALANCE_STATS, Source("moe", ("moe_balance_stats",)), _JAX, HelperSection.LAYER),
)


def _decode_check(prim: ir.Prim) -> str | None:
    """Capacity-limited routing drops tokens by how many run together, so one token at a time
    routes differently from the whole sequence; dropless routing is per token."""
    capacity = prim.attr("capacity_factor").value
    if capacity > 0:
        return (
            f"`moe` with capacity_factor {capacity} "
            "(capacity-limited routing depends on the batch of tokens)"
        )
    return None


PRIMITIVES = (
    Primitive(
        "moe",
        Signature(
            ("x", "logits", "w_gate", "w_up", "w_down"),
            (
                Static("top_k", StaticKind.INT, 2),
                Static("capacity_factor", StaticKind.FLOAT, 1.25),
                Static("normalize", StaticKind.BOOL, True),
                Static("aux_weight", StaticKind.FLOAT, 0.01, at_least(0), "0 turns it off"),
                Static("z_weight", StaticKind.FLOAT, 0.001, at_least(0), "0 turns it off"),
                Static("score", StaticKind.STRING, "softmax"),
                Static("groups", StaticKind.INT, 1),
                Static("top_groups", StaticKind.INT, 1),
                Static("scale", StaticKind.FLOAT, 1.0),
                Static(
                    "balance_rate",
                    StaticKind.FLOAT,
                    0.0,
                    at_least(0),
                    "0 turns balancing off; DeepSeek-V3 uses 0.001",
                ),
            ),
            optional_tensors=("bias",),
            doc="mixture of SwiGLU experts: softmax or sigmoid router (DeepSeek: selection bias, "
            "group-limited top-k, scale, bias balancing), top-k, capacity (<= 0: dropless), "
            "aux losses",
        ),
        emit=_emit,
        shape=_shape,
        check=_check,
        flops=_flops,
        memory=_memory,
        unused_params=_unused_params,
        aux_loss=True,
        needs=_needs,
        helpers=_HELPERS,
        decode_check=_decode_check,
    ),
)
