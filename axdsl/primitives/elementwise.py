"""Elementwise primitives: math functions, activations, soft-capping, cast and dropout (shape
unchanged)."""

from __future__ import annotations

import json

from axdsl.errors import did_you_mean
from axdsl.syntax.ast import Bound, BoundOp, above
from axdsl.primitives.base import (
    always,
    Helper,
    Primitive,
    Saves,
    Signature,
    Static,
    StaticKind,
    elementwise_memory,
    saves_memory,
)
from axdsl.primitives.base import Source

# The kinds `activate(x, kind)` accepts and the code each becomes (`{x}` is the operand). Only
# these strings reach generated code. `gelu` is the tanh approximation (jax.nn.gelu's default),
# as GPT-2 uses it; `gelu_tanh` names it explicitly and `gelu_exact` is the erf form (BERT, Gemma's
# `gelu_pytorch_tanh` is `gelu_tanh`).
ACTIVATION_CODE = {
    "gelu": "jax.nn.gelu({x})",
    "relu": "jax.nn.relu({x})",
    "silu": "jax.nn.silu({x})",
    "sigmoid": "jax.nn.sigmoid({x})",
    "tanh": "jax.nn.tanh({x})",
    "gelu_tanh": "jax.nn.gelu({x})",
    "gelu_exact": "jax.nn.gelu({x}, approximate=False)",
    "softplus": "jax.nn.softplus({x})",
    "relu2": "jnp.square(jax.nn.relu({x}))",
}
ACTIVATIONS = tuple(ACTIVATION_CODE)
_JAX_NN = ("relu", "gelu", "silu", "sigmoid", "softplus")
_JNP = ("tanh", "exp", "log", "sqrt", "abs", "square")
# What each function's backward keeps (jax 0.10.2, measured with print_saved_residuals).
SAVES = {
    "silu": Saves(input=True, same=2),
    "gelu": Saves(input=True, same=4),  # tanh approximation (jax.nn.gelu's default)
    "gelu_tanh": Saves(input=True, same=4),
    "gelu_exact": Saves(input=False, same=3),
    "softplus": Saves(input=False, same=2),
    "relu2": Saves(input=False, same=2, bools=1),
    "softcap": Saves(input=False, same=2),  # cap * tanh(x / cap): tanh's output and x / cap
    "relu": Saves(input=False, same=1, bools=1),
    "sigmoid": Saves(input=False, same=1),
    "tanh": Saves(input=False, same=1),
    "exp": Saves(input=False, output=True),
    "log": Saves(input=True),
    "rsqrt": Saves(input=False, same=1),
    "sqrt": Saves(input=False, same=1),
    "abs": Saves(input=False, bools=1),
    "square": Saves(input=False, same=1),
}


def _call(fn: str):
    """An emitter for `fn(x)`."""
    return lambda ctx, prim, args, precs: f"{fn}({args[0]})"


def _unary(name: str, fn: str) -> Primitive:
    return Primitive(
        name,
        Signature(("x",), doc=f"elementwise {name}"),
        emit=_call(fn),
        memory=saves_memory(SAVES[name]),
    )


def _activate_memory(t, prim, args, dims, label: str):
    kind = t.static(prim.attr("kind"))
    return elementwise_memory(t, args[0], dims, label, SAVES.get(kind), fn=kind)


def _cast_memory(t, prim, args, dims, label: str):
    target = t.static(prim.attr("dtype"))
    target = target.name if hasattr(target, "name") else str(target)
    if target == args[0].dtype:
        return args[0]
    return t.new(dims, target, label, (args[0],))


def _dropout_memory(t, prim, args, dims, label: str):
    """Keeps its boolean mask."""
    out = t.new(dims, args[0].dtype, label, (args[0],))
    t.save(t.internal(dims, "bool", f"{label} mask", (args[0],)))
    return out


def _emit_activate(ctx, prim, args, precs) -> str:
    kind = prim.attr("kind").value
    assert kind in ACTIVATION_CODE, kind  # checked when building; never emit an arbitrary name
    return ACTIVATION_CODE[kind].format(x=args[0])


def _emit_softcap(ctx, prim, args, precs) -> str:
    """`cap * jnp.tanh(x / cap)`: logits squashed smoothly into (-cap, cap) (Gemma 2, Grok)."""
    cap = prim.attr("cap")
    return f"{ctx.code(cap, 2)} * jnp.tanh({ctx.paren(args[0], precs[0], 2)} / {ctx.code(cap, 3)})"


def _check_activate(ctx, given: dict, attrs: dict) -> None:
    """Only known activation names may reach generated code (no code injection through strings)."""
    kind = attrs["kind"].value
    if kind not in ACTIVATIONS:
        shown = kind if len(kind) <= 40 else kind[:37] + "..."
        ctx.fail(
            given["kind"].span,
            f"unknown activation {json.dumps(shown)} for `activate`",
            did_you_mean(kind, ACTIVATIONS) or f"activations are {', '.join(ACTIVATIONS)}",
        )


def _emit_cast(ctx, prim, args, precs) -> str:
    return f"{ctx.paren(args[0], precs[0], ctx.ATOM)}.astype({ctx.code(prim.attr('dtype'))})"


# `_fold` gives each dropout site and layer its own key (FunctionEmitter.next_rng, rng_arg).
DROPOUT = Source("dropout", ("dropout", "_fold"))


def _emit_dropout(ctx, prim, args, precs) -> str:
    ctx.use_helper("dropout")
    return f"dropout({args[0]}, {ctx.code(prim.attr('rate'))}, {ctx.next_rng()})"


PRIMITIVES = (
    *(_unary(n, f"jax.nn.{n}") for n in _JAX_NN),
    *(_unary(n, f"jnp.{n}") for n in _JNP),
    _unary("rsqrt", "jax.lax.rsqrt"),
    Primitive(
        "gelu_exact",
        Signature(("x",), doc="elementwise gelu, exact erf form (not the tanh approximation)"),
        emit=lambda ctx, prim, a, p: f"jax.nn.gelu({a[0]}, approximate=False)",
        memory=saves_memory(SAVES["gelu_exact"]),
    ),
    Primitive(
        "relu2",
        Signature(("x",), doc="elementwise squared relu, relu(x)^2 (Primer, Nemotron)"),
        emit=lambda ctx, prim, a, p: f"jnp.square(jax.nn.relu({a[0]}))",
        memory=saves_memory(SAVES["relu2"]),
    ),
    Primitive(
        "softcap",
        Signature(
            ("x",),
            (
                Static(
                    "cap",
                    StaticKind.FLOAT,
                    bounds=above(0),
                    hint="the result lies in (-cap, cap); Gemma 2 caps logits at 30.0",
                ),
            ),
            doc="logit soft-capping: cap * tanh(x / cap)",
        ),
        emit=_emit_softcap,
        memory=saves_memory(SAVES["softcap"]),
    ),
    Primitive(
        "activate",
        Signature(
            ("x",), (Static("kind", StaticKind.STRING),), doc="activation chosen by a string"
        ),
        emit=_emit_activate,
        check=_check_activate,
        memory=_activate_memory,
    ),
    Primitive(
        "cast",
        Signature(("x",), (Static("dtype", StaticKind.DTYPE),), doc="convert to a dtype"),
        emit=_emit_cast,
        see_through=True,
        memory=_cast_memory,
    ),
    Primitive(
        "dropout",
        Signature(
            ("x",),
            (
                Static(
                    "rate",
                    StaticKind.FLOAT,
                    bounds=(Bound(BoundOp.GE, 0), Bound(BoundOp.LT, 1)),
                    hint="the fraction of activations zeroed in training (0.1 is usual)",
                ),
            ),
            doc="dropout in training only",
        ),
        emit=_emit_dropout,
        helpers=(Helper("dropout", DROPOUT),),
        needs=always("dropout"),
        uses_rng=True,
        memory=_dropout_memory,
    ),
)
