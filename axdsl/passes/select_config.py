"""select_config: the root hyperparameters the generated `Config` keeps, and those fixed at build.

    model lm = DecoderLM { vocab = 32  dim = 16 ... }      ->    config: vocab, dim, layers, ...
      embed_multiplier: float = 1.0  # default                   fixed: embed_multiplier = 1.0,
      logit_softcap: float = 0.0  # default                             logit_softcap = 0.0

A numeric or dtype hyperparameter of the root becomes a `Config` field when the generated code
reads it: a size, count, scale or dtype some forward, parameter shape, initializer or repeat
count computes from (`cfg.dim // cfg.heads`), or one the generated program reads by name
(`dtype`, `param_dtype`; the runtime's `vocab` and `max_seq`). One whose every use the build
already settled (`dense_layers = 0` removed the dense blocks; `logit_softcap = 0.0` chose the
head without a cap) and that the spec leaves at its default is fixed: the model file lists it
among the values fixed when it was built, and changing it means rebuilding. A value the spec
writes (a ViT's `image`, which the code reads as `height` and `width`) or that the models of the
spec set differently stays a field, so `CONFIGS` describes every model as the spec does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import replace

from axdsl.ir import nodes as ir
from axdsl.ir.expr import Expr, Field, subexprs
from axdsl.ir.nodes import ConfigFields

# Fields the generated program reads by name whatever the layers compute: the casts of the
# model file, and the runtime's checks of the data (vocab) and the sequence length (max_seq).
READ_BY_NAME = ("dtype", "param_dtype", "vocab", "max_seq")
CONFIG_KINDS = (ir.HParamKind.INT, ir.HParamKind.FLOAT, ir.HParamKind.DTYPE)


def select_config(module: ir.Module) -> ir.Module:
    read = set(READ_BY_NAME)
    for model in module.models:
        read |= config_reads(model.root)
    first = module.models[0].root
    keep: list[str] = []
    fixed: list[str] = []
    for h in first.hparams:
        if h.type.kind not in CONFIG_KINDS:
            continue
        values = {_value(m.root, h.name) for m in module.models}
        written = any(_written(m.root, h.name) for m in module.models)
        (keep if h.name in read or written or len(values) > 1 else fixed).append(h.name)
    return replace(module, config=ConfigFields(tuple(keep), tuple(fixed)))


def _value(root: ir.Instance, name: str) -> object:
    h = root.hparam(name)
    return h.value.value if h is not None else None


def _written(root: ir.Instance, name: str) -> bool:
    """Whether the spec sets this hyperparameter (then it describes the model, read or not)."""
    h = root.hparam(name)
    return h is not None and h.origin.kind is ir.OriginKind.SET


def config_reads(root: ir.Instance) -> set[str]:
    """The Config fields the code of `root`'s tree computes from: every size and value code below
    it but the hyperparameter declarations themselves (a declared one is read where it is used)."""
    return {s.name for e in _exprs(root) for s in subexprs(e) if isinstance(s, Field)}


def _exprs(node: object) -> Iterator[Expr]:
    """The expression of every HValue and Dim under `node` (a dataclass tree) but `hparams`."""
    if isinstance(node, (ir.HValue, ir.Dim)):
        if node.expr is not None:
            yield node.expr
        return
    if isinstance(node, (tuple, list)):
        for x in node:
            yield from _exprs(x)
        return
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            if f.name not in ("hparams", "span", "layer_span", "origin"):
                yield from _exprs(getattr(node, f.name))
