"""check: static checks on the resolved tree that do not need shapes.

Logical axes: every parameter names one known axis per dim, none twice. One logical axis may
have several sizes (an MoE expert's hidden dim and a shared expert's are both `mlp`):
annotate_sharding checks that the target's mesh divides each of them. Names: generated
identifiers must be valid Python and not keywords or emitted names (no code injection).
"""

from __future__ import annotations

import keyword

from axdsl.errors import Diagnostics, did_you_mean
from axdsl.ir import nodes as ir

# Names the generated model module defines itself; spec names may not take them.
RESERVED = {
    "cfg",
    "params",
    "rng",
    "jax",
    "jnp",
    "np",
    "optax",
    "math",
    "functools",
    "dataclasses",
    "zlib",
    "Config",
    "CONFIGS",
    "init_params",
    "param_axes",
    "forward",
    "loss_fn",
    "checkpoint_name",
    "scan_body",
    "self",
    "None",
    "True",
    "False",
    "Param",
    "param_table",
    "_nest",
    "shard",
    "make_mesh",
    "param_specs",
    "forward_with_aux",
}

# Names every decoded layer function takes or defines (codegen/decode.py): its `cache` and `pos`
# arguments and the `new_cache` it returns. A forward's input or variable may not take them.
DECODE_NAMES = {"cache", "pos", "new_cache"}


def check(module: ir.Module) -> ir.Module:
    diags = Diagnostics()
    for model in module.models:
        _check_identifier(model.name, model.span, diags, "model")
        for inst in model.root.walk():
            _check_identifier(inst.layer, inst.layer_span, diags, "layer")
            for p in inst.params:
                _check_param(inst, p, diags)
                _check_identifier(p.name, p.span, diags, "parameter")
            for c in inst.children:
                _check_identifier(c.name, c.span, diags, "child")
            for h in inst.hparams:
                _check_identifier(h.name, h.span, diags, "hyperparameter")
            if inst.forward:
                for a in inst.forward.args:
                    _check_identifier(a.name, a.span, diags, "argument", local=True)
                    for d in a.dims:
                        if d.is_free:
                            _check_identifier(d.name, a.span, diags, "dim")
                for s in inst.forward.body:
                    if isinstance(s, ir.Let):
                        _check_identifier(s.name, s.span, diags, "variable", local=True)
                        if s.point is not None:
                            _check_identifier(s.point, s.span, diags, "named point")
    diags.raise_if_any()
    return module


def _check_identifier(name: str, span, diags: Diagnostics, what: str, local: bool = False) -> None:
    """A spec name that becomes a Python identifier: no keyword, no name the generated module
    defines, and for a forward's inputs and variables (`local`) none a decoded layer's function
    uses for its cache and positions."""
    if local and name in DECODE_NAMES:
        diags.error(
            span,
            f"{what} name `{name}` is reserved: the generated decode path (KV cache) names its "
            "own argument so",
            "rename it",
        )
    elif keyword.iskeyword(name) or keyword.issoftkeyword(name):
        diags.error(
            span,
            f"{what} name `{name}` is a Python keyword, reserved in generated code",
            "rename it",
        )
    elif name in RESERVED or name.startswith("__"):
        diags.error(
            span, f"{what} name `{name}` is reserved: the generated code defines it", "rename it"
        )


def _check_param(inst: ir.Instance, p: ir.Param, diags: Diagnostics) -> None:
    if len(p.axes) != len(p.dims):
        diags.error(
            p.span,
            f"parameter `{p.name}` has {len(p.dims)} dims but {len(p.axes)} logical axes",
            "name one logical axis per dim in `axes(...)`",
        )
        return
    seen = set()
    for axis in p.axes:  # one per dim: checked above
        if axis not in ir.LOGICAL_AXES:
            diags.error(
                p.span,
                f"unknown logical axis `{axis}` on parameter `{p.name}`",
                did_you_mean(axis, ir.LOGICAL_AXES) or f"known axes: {', '.join(ir.LOGICAL_AXES)}",
            )
            continue
        if axis in seen:
            diags.error(
                p.span,
                f"logical axis `{axis}` is used twice on parameter `{p.name}`",
                "a tensor can be sharded along one axis name once",
            )
        seen.add(axis)
