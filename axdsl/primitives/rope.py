"""Rotary position embedding on [B, S, heads, head_dim], with its variants.

The plain form (the whole head_dim, Llama's half-split layout, no frequency scaling) emits
`apply_rope(x, theta)`, a self-contained helper. Every variant emits
`apply_rotary(x, <frequencies>, ...)`, whose frequencies come from one helper per scaling rule:

    rotary_dim     rotate only the first `rotary_dim` features of each head (Phi-2, GPT-NeoX)
    interleaved    rotate the pairs (x0, x1), (x2, x3), ... (GPT-J, DeepSeek) instead of
                   (x_i, x_{i + d/2}) (Llama, the half-split layout of Hugging Face's rotate_half)
    scaling        "linear" (positions / factor), "llama3" (Llama 3.1's per-wavelength blend of
                   scaled and unscaled frequencies) or "yarn" (YaRN's ramp between interpolation
                   and extrapolation, with its cos/sin attention factor)

Both read their cos and sin from `rotation_tables`: numpy constants when the positions are known
as the step is traced, so that XLA never computes cos and sin per element of the rotated tensor
(it fused them into the multiplies: 5.3% of a cpu training step, benchmarks/RESULTS.md).

The frequency formulas follow the papers and Hugging Face's modeling_rope_utils, so that real
checkpoints import exactly; tests/test_rope.py checks each against transformers.
"""

from __future__ import annotations

import json

from axdsl.errors import did_you_mean
from axdsl.ir import nodes as ir
from axdsl.ir.expr import reads_config
from axdsl.syntax.ast import above
from axdsl.primitives.base import (
    Decoding,
    Helper,
    Primitive,
    Signature,
    Static,
    StaticKind,
    linear_memory,
)
from axdsl.primitives.attention_kernels import CONTEXT_ORDER_HELPER
from axdsl.primitives.base import Source
from axdsl.primitives.reductions import ir_fmt

SCALINGS = ("none", "linear", "llama3", "yarn")

APPLY_ROPE = Source("rope", ("apply_rope",))

ROTATION_TABLES = Source("rope", ("rotation_tables",))

APPLY_ROTARY = Source("rope", ("apply_rotary",))

ROPE_FREQUENCIES = Source("rope", ("rope_frequencies",))

LLAMA3_FREQUENCIES = Source("rope", ("llama3_frequencies",))

YARN_FREQUENCIES = Source("rope", ("yarn_frequencies", "yarn_attention_factor"))


def _rope_shape(ctx, prim, args):
    dims = args[0].type.dims
    if len(dims) != 4 or any(d.is_ellipsis for d in dims):
        ctx.fail(prim.span, f"`rope` needs [B, S, heads, head_dim], got {ir_fmt(dims)}")
    head_dim = dims[-1].size
    rotary = _rotary_dim(prim, head_dim)
    if head_dim is None or rotary is None:
        ctx.fail(prim.span, f"`rope` needs a known head_dim, got `{dims[-1]}`")
    # An odd rotary dim r rotates r + 1 features at frequencies theta^(-2i / r), as transformers
    # does (GPT-NeoX's rotary_pct of a head of 12: 3 -> 4 features): apply_rotary rotates the
    # 2 * len(freqs) features rope_frequencies(r) gives. Interleaved pairs have no such rule
    # (transformers' GPT-J fails on an odd rotary_dim), so they need an even one.
    rotated = rotary + rotary % 2
    if rotary < 1 or rotated > head_dim:
        odd = f" (odd: {rotated} features rotate)" if rotary % 2 and rotary > 0 else ""
        ctx.fail(
            prim.span,
            f"`rope` rotates between 1 and the head size {head_dim} features, got {rotary}{odd}",
            "the rotary dim is how many features of each head rotate (Phi-2: 32 of 80); an odd "
            "one rotates one more, as transformers does (GPT-NeoX: 3 of a head of 12 rotate 4)",
        )
    if rotary % 2 and prim.attr("interleaved").value:
        ctx.fail(
            prim.span,
            f"`rope` interleaved pairs need an even rotary dim, got {rotary}",
            "interleaved rotation pairs (x0, x1), (x2, x3), ...; the half-split layout takes an "
            "odd rotary dim (it rotates one feature more, as transformers does)",
        )
    positions = args[1] if prim.optional else None
    if positions is not None:
        pdims = positions.type.dims
        if len(pdims) != 2 or not pdims[0].same(dims[0]) or not pdims[1].same(dims[1]):
            ctx.fail(
                getattr(positions, "span", None) or prim.span,
                f"`rope` positions must be [B, S] like x's batch and sequence "
                f"{ir_fmt(dims[:2])}, got {ir_fmt(pdims)}",
                "one position per token: a packed row's `segment_positions(segments)`",
            )
    return dims


def _rotary_dim(prim, head_dim: int | None) -> int | None:
    """The rotated features of each head: `rotary_dim`, or the whole head when it is 0."""
    given = prim.attr("rotary_dim")
    return head_dim if given is None or given.value == 0 else given.value


THETA_HINT = "the base of the rotary frequencies: 10000.0 (Llama 2), 500000.0 (Llama 3)"


def _check(ctx, given: dict, attrs: dict) -> None:
    """Only known scaling rules reach generated code; each rule's parameters make sense."""
    scaling = attrs["scaling"].value
    where = given.get("scaling")
    if scaling not in SCALINGS:
        ctx.fail(
            where.span if where is not None else None,
            f"unknown rope scaling {json.dumps(scaling[:40])}",
            did_you_mean(scaling, SCALINGS) or f"scalings are {', '.join(SCALINGS)}",
        )
    if scaling == "none":
        return
    factor = attrs["factor"].value
    if factor <= 0:
        ctx.fail(_span(given, "factor", where), f"rope scaling factor must be > 0, got {factor}")
    if scaling == "llama3" and attrs["high_freq_factor"].value <= attrs["low_freq_factor"].value:
        ctx.fail(
            _span(given, "high_freq_factor", where),
            f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
            f"{attrs['high_freq_factor'].value} <= {attrs['low_freq_factor'].value}",
            "Llama 3.1 uses low_freq_factor = 1.0, high_freq_factor = 4.0",
        )
    if scaling in ("llama3", "yarn") and attrs["original_max_seq"].value <= 0:
        ctx.fail(
            _span(given, "original_max_seq", where),
            f"{scaling} rope scaling needs original_max_seq > 0 (the pretraining context)",
        )


def _span(given: dict, name: str, fallback):
    node = given.get(name, fallback)
    return node.span if node is not None else None


def _is_plain(prim, head_dim: int) -> bool:
    return (
        _rotary_dim(prim, head_dim) == head_dim
        and not prim.attr("interleaved").value
        and prim.attr("scaling").value == "none"
    )


def _non_default(ctx, prim, defaults: dict) -> str:
    """`, name=value` for each attribute that differs from the helper's default."""
    out = ""
    for name, default in defaults.items():
        v = prim.attr(name)
        if v.value != default:
            out += (
                f", {name}={v.value!r}" if isinstance(default, bool) else f", {name}={ctx.code(v)}"
            )
    return out


def _needs(prim: ir.Prim, schedule: ir.Schedule | None, decoding: bool) -> tuple[str, ...]:
    """`apply_rope` for the plain rotation, else `apply_rotary` with its frequencies."""
    head_dim = ir.tensor_type(prim.args[0]).dims[-1].size
    balanced = _balanced(schedule, decoding) and not prim.optional
    order = (CONTEXT_ORDER_HELPER.name,) if balanced else ()
    if head_dim is not None and _is_plain(prim, head_dim):  # sized: infer_shapes checks it
        return ("apply_rope", "rotation_tables", *order)
    scaling = prim.attr("scaling").value
    frequencies = {"none": (), "linear": (), "llama3": ("llama3_frequencies",)}
    extra = frequencies.get(scaling, ("yarn_frequencies",))  # as _emit: the rest is YaRN
    return ("apply_rotary", "rotation_tables", "rope_frequencies", *extra, *order)


def _emit(ctx, prim, args: list[str], precs: list[int]) -> str:
    head_dim = prim.args[0].type.dims[-1].size
    theta = ctx.code(prim.attr("theta"))
    if _is_plain(prim, head_dim):
        ctx.use_helper("apply_rope")
        ctx.use_helper("rotation_tables")
        return f"apply_rope({args[0]}, theta={theta}{_offset(ctx, prim, args)})"
    ctx.use_helper("apply_rotary")
    ctx.use_helper("rotation_tables")
    ctx.use_helper("rope_frequencies")
    given = prim.attr("rotary_dim")
    size = given.expr if given is not None and given.value else prim.args[0].type.dims[-1].size_expr
    # literal arithmetic (`128 + 64 - 128` from a slice) reads better as its value
    rotary = ctx.code(size) if reads_config(size) else str(_rotary_dim(prim, head_dim))
    a = {
        k: ctx.code(prim.attr(k))
        for k in (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_seq",
            "beta_fast",
            "beta_slow",
            "truncate",
            "attention_factor",
            "mscale",
            "mscale_all_dim",
        )
    }
    scaling = prim.attr("scaling").value
    extra = []
    if scaling == "none":
        freqs = f"rope_frequencies({rotary}, {theta})"
    elif scaling == "linear":
        freqs = f"rope_frequencies({rotary}, {theta}) / {ctx.code(prim.attr('factor'), 3)}"
    elif scaling == "llama3":
        ctx.use_helper("llama3_frequencies")
        freqs = (
            f"llama3_frequencies({rotary}, {theta}, factor={a['factor']}, "
            f"low_freq_factor={a['low_freq_factor']}, high_freq_factor={a['high_freq_factor']}, "
            f"original_max_seq={a['original_max_seq']})"
        )
    else:
        ctx.use_helper("yarn_frequencies")
        optional = _non_default(ctx, prim, {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True})
        freqs = (
            f"yarn_frequencies({rotary}, {theta}, factor={a['factor']}, "
            f"original_max_seq={a['original_max_seq']}{optional})"
        )
        if prim.attr("attention_factor").value:
            extra.append(f"scale={a['attention_factor']}")
        else:
            ms = [a["mscale"], a["mscale_all_dim"]] if prim.attr("mscale_all_dim").value else []
            extra.append(f"scale=yarn_attention_factor({', '.join([a['factor'], *ms])})")
    if prim.attr("interleaved").value:
        extra.insert(0, "interleaved=True")
    return f"apply_rotary({', '.join([args[0], freqs, *extra])}{_offset(ctx, prim, args)})"


def _offset(ctx, prim: ir.Prim, args: list[str]) -> str:
    """`, offset=pos` in a layer the decode path runs, whose tokens start at cache position `pos`
    (0 in the forward: the default offset, so training traces the same); in a forward that runs
    the sequence in zig-zag order (plan_context's balance), the positions of that order. Given
    `positions` (a packed row's; in the decode path pos, pos + 1, ...), it reads them."""
    x = args[0]
    if prim.optional:
        return f", positions={args[1]}"
    if ctx.balanced:
        ctx.use_helper(CONTEXT_ORDER_HELPER.name)
        x = x if x.isidentifier() else f"({x})"
        return f", positions=context_order({x}.shape[1])"
    return f", offset={ctx.decode_pos}" if ctx.decoding or ctx.takes_pos else ""


def _balanced(schedule: ir.Schedule | None, decoding: bool) -> bool:
    """Whether a forward on `schedule` runs the sequence in zig-zag order (see _offset)."""
    context = schedule.context.value if schedule is not None else None
    return context is not None and bool(context.balance) and not decoding


_NUMPY = ("import jax", "import jax.numpy as jnp", "import numpy as np")
_MATH = ("import math", "import numpy as np")

PRIMITIVES = (
    Primitive(
        "rope",
        Signature(
            ("x",),
            (
                Static(  # frequencies theta ** (-2i / d): 0 or less is inf or nan
                    "theta",
                    StaticKind.FLOAT,
                    10000.0,
                    above(0),
                    THETA_HINT,
                ),
                Static("rotary_dim", StaticKind.INT, 0),  # 0: the whole head_dim
                Static("interleaved", StaticKind.BOOL, False),
                Static("scaling", StaticKind.STRING, "none"),
                Static("factor", StaticKind.FLOAT, 1.0),
                Static("low_freq_factor", StaticKind.FLOAT, 1.0),
                Static("high_freq_factor", StaticKind.FLOAT, 4.0),
                Static("original_max_seq", StaticKind.INT, 0),
                Static("beta_fast", StaticKind.FLOAT, 32.0),
                Static("beta_slow", StaticKind.FLOAT, 1.0),
                Static("truncate", StaticKind.BOOL, True),
                Static(
                    "attention_factor", StaticKind.FLOAT, 0.0
                ),  # yarn: 0 = from factor and mscale
                Static("mscale", StaticKind.FLOAT, 1.0),
                Static("mscale_all_dim", StaticKind.FLOAT, 0.0),
            ),
            optional_tensors=("positions",),
            doc=(
                "rotary embedding on [B, S, H, D]: partial, interleaved, "
                "linear/llama3/yarn scaling; `positions` [B, S] (a packed row's) or 0, 1, ..."
            ),
        ),
        emit=_emit,
        shape=_rope_shape,
        check=_check,
        memory=linear_memory,
        decoding=Decoding.POSITIONS,
        takes_positions=True,
        needs=_needs,
        helpers=(
            Helper("apply_rope", APPLY_ROPE, _NUMPY),
            Helper("apply_rotary", APPLY_ROTARY, _NUMPY),
            Helper("rotation_tables", ROTATION_TABLES, _NUMPY),
            Helper("rope_frequencies", ROPE_FREQUENCIES, ("import numpy as np",)),
            Helper("llama3_frequencies", LLAMA3_FREQUENCIES, _MATH),
            Helper("yarn_frequencies", YARN_FREQUENCIES, _MATH),
        ),
    ),
)
