"""The primitive registry: every builtin a forward can call, each defined in one module here.

    axdsl/primitives/<group>.py   PRIMITIVES = (Primitive("rope", Signature(...), emit=...,
                                                          shape=..., flops=..., memory=...), ...)

Every module of this package that defines `PRIMITIVES` is registered (a module without it, such
as `base`, only supports the others), so adding a primitive is one new or edited module (plus its
tests): the forward builder, infer_shapes, codegen, select_kernels and the FLOPs and memory
analyses look primitives up here and never special-case one by name. The helper functions a
primitive's emitted code calls are part of its entry (`Primitive.helpers`), and so is which of
them a call needs (`Primitive.needs`; a weight matmul `x @ w` on the dense kernel: `matmul_needs`);
`HELPERS` collects them by name for codegen. `FUSED_CROSS_ENTROPY` is the one helper no call
needs: the next-token loss_fn of a model whose head split_head cut calls it; `CONTEXT_ORDER_HELPER`
is the other: the root of a balanced context-parallel model reorders its inputs by it;
`PIPELINE_HELPER`, which no primitive owns, runs a pipelined model's main repeat (plan_pipeline).
"""

from __future__ import annotations

import importlib
import pkgutil

from axdsl.primitives.base import REQUIRED, Flops, Helper, Primitive, Signature, Static, StaticKind
from axdsl.primitives.attention_kernels import CONTEXT_ORDER_HELPER
from axdsl.primitives.einsum import matmul_needs
from axdsl.primitives.losses import FUSED_CROSS_ENTROPY
from axdsl.primitives.pipeline import PIPELINE_HELPER

__all__ = [
    "CONTEXT_ORDER_HELPER",
    "FUSED_CROSS_ENTROPY",
    "HELPERS",
    "PIPELINE_HELPER",
    "REGISTRY",
    "REQUIRED",
    "Flops",
    "Helper",
    "Primitive",
    "Signature",
    "Static",
    "StaticKind",
    "get",
    "callable_names",
    "matmul_needs",
]


def _load() -> dict[str, Primitive]:
    registry: dict[str, Primitive] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for prim in getattr(module, "PRIMITIVES", ()):
            if prim.name in registry:
                raise AssertionError(f"primitive `{prim.name}` is defined twice ({info.name})")
            registry[prim.name] = prim
    return registry


def _helpers(registry: dict[str, Primitive]) -> dict[str, Helper]:
    out: dict[str, Helper] = {}
    for prim in registry.values():
        for helper in prim.helpers:
            if helper.name in out:
                raise AssertionError(f"helper `{helper.name}` is defined twice ({prim.name})")
            out[helper.name] = helper
    if PIPELINE_HELPER.name in out:
        raise AssertionError(f"helper `{PIPELINE_HELPER.name}` is defined twice")
    out[PIPELINE_HELPER.name] = PIPELINE_HELPER
    return out


REGISTRY: dict[str, Primitive] = _load()
HELPERS: dict[str, Helper] = _helpers(REGISTRY)


def get(name: str) -> Primitive:
    return REGISTRY[name]


def callable_names() -> list[str]:
    """The primitives a spec may call (the ones passes create are excluded)."""
    return sorted(n for n, p in REGISTRY.items() if not p.internal)
