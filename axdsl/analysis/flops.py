"""Model FLOPs and parameter counts, read off the IR (no jax: the build path may import this).

Model FLOPs are the work the model needs, not what the hardware executes (rematerialization and
padding are not counted), as MaxText computes them for MFU:

    every matmul or einsum with a parameter operand   2 x (its FLOPs per token)      per layer
        x @ w  (w: [in, out...])                      = 2 x (elements of w)
        einsum with a parameter                       = 2 x (product of the sizes of every
                                                        named dim other than B and S)
        the tied head  x @ transpose(embed.table)     = 2 x vocab x dim (it is a matmul too)
    moe(x, logits, w_gate, w_up, w_down, top_k)       top_k x 2 x (elements of one expert's
                                                      three matrices): only routed experts work;
                                                      capacity padding is not counted (MaxText)
    attention(q, k, v)                                4 x S x heads x head_dim      per layer
                                                      halved when causal; a sliding window
                                                      of w keys counts min(S, w) keys, not S
    ssd(x, dt, A, B, C, chunk)                        2 x min(chunk, S) x heads x (state +
                                                      head_dim) + 4 x heads x head_dim x state
                                                      per layer (with attention: sequence work)
    training                                          3 x forward (backward = 2 x forward)

Everything else (norms, activations, rope, the embedding gather, biases) is not counted, as in
MaxText. Layers under `repeat(n, ...)` count n times (nested repeats multiply).

    >>> from pathlib import Path
    >>> from axdsl.pipeline import compile_spec
    >>> m = compile_spec(Path("specs/llama3_8b.axl")).models[0]
    >>> f = model_flops(m, seq=8192)
    >>> f.train_per_token, f.per_step(batch=1)
    (51470401536, 421645529382912)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from axdsl import primitives
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import RefKind
from axdsl.ir.rewrite import forward_exprs, prims_of
from axdsl.primitives import Flops
from axdsl.primitives.moe import balanced_biases


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of one model: total, per layer type, per instance path, and embeddings."""

    total: int
    by_layer: dict[str, int] = field(default_factory=dict)  # layer type -> count (Attention: ...)
    by_path: dict[str, int] = field(default_factory=dict)  # "/blocks/attn/wq" -> count (all layers)
    embedding: int = 0  # parameters only gathered from (embedding tables, learned positions)
    # MoE selection biases that the balancing rule moves after each step (DeepSeek-V3's
    # e_score_correction_bias): stored and sharded as parameters, but state, not trained (their
    # gradient is zero) and a buffer in Hugging Face's count
    balancing: int = 0

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    @property
    def trained(self) -> int:
        """What the optimizer trains: the total less the balancing biases (Hugging Face's count)."""
        return self.total - self.balancing


@dataclass(frozen=True)
class FlopCount:
    """Forward model FLOPs per token of one model at one sequence length, and what follows."""

    model: str
    seq: int
    matmul: int  # forward FLOPs per token of matmuls with a parameter (all layers)
    attention: int  # forward FLOPs per token of attention (all layers), at `seq`
    by_path: dict[str, int] = field(default_factory=dict)  # instance path -> forward FLOPs per token

    @property
    def forward_per_token(self) -> int:
        return self.matmul + self.attention

    @property
    def train_per_token(self) -> int:
        """Forward and backward: 3 x forward."""
        return 3 * self.forward_per_token

    def per_step(self, batch: int) -> int:
        """Training FLOPs of one step over `batch` sequences of `seq` tokens (all chips together)."""
        return self.train_per_token * batch * self.seq


# ---------------------------------------------------------------------------- parameters
def param_count(model: ir.Model) -> ParamCount:
    total = embedding = 0
    by_layer: dict[str, int] = {}
    by_path: dict[str, int] = {}
    gathered = _gathered_params(model.root)
    for inst in model.root.walk():
        for p in inst.params:
            n = math.prod(d.size for d in p.full_dims)
            total += n
            by_layer[inst.layer] = by_layer.get(inst.layer, 0) + n
            path = f"{inst.path.rstrip('/')}/{p.name}"
            by_path[path] = n
            if (inst.path, p.name) in gathered:
                embedding += n
    balancing = sum(by_path.get("/" + path, 0) for path, _ in balanced_biases(model.root))
    return ParamCount(total, by_layer, by_path, embedding, balancing)


def _gathered_params(root: ir.Instance) -> set[tuple[str, str]]:
    """Parameters that are indexed (embed, prefix) rather than multiplied: embedding tables."""
    out = set()
    for inst in root.walk():
        for e in prims_of(inst):
            if primitives.get(e.name).gathers and e.args:
                p = param_of(inst, e.args[0])
                if p is not None:
                    out.add(p)
    return out


# ---------------------------------------------------------------------------- FLOPs
@dataclass(frozen=True)
class RuleContext:
    """What a primitive's FLOP or parameter rule may ask: its instance, the sequence length,
    and which parameter an operand is."""

    inst: ir.Instance
    seq: int = 1
    cap_window: bool = True

    def param_at(self, e: ir.TExpr) -> ir.Param | None:
        return param_at(self.inst, e)


def expr_flops(inst: ir.Instance, e: ir.TExpr, seq: int, cap_window: bool = True) -> Flops:
    """Forward FLOPs per token of one expression node (not of its operands)."""
    if isinstance(e, ir.Bin):
        return Flops(matmul=matmul_flops_per_token(inst, e))
    if isinstance(e, ir.Prim) and primitives.get(e.name).flops is not None:
        return primitives.get(e.name).flops(RuleContext(inst, seq, cap_window), e)
    return Flops()


def model_flops(model: ir.Model, seq: int) -> FlopCount:
    """Forward model FLOPs per token of `model` at sequence length `seq` (see the module doc)."""
    matmul = attention = 0
    by_path: dict[str, int] = {}
    for inst in model.root.walk():
        layers = layer_count(model.root, inst)
        here = 0
        for e in forward_exprs(inst):
            f = expr_flops(inst, e, seq)
            matmul += f.matmul * layers
            attention += f.attention * layers
            here += (f.matmul + f.attention) * layers
        if here:
            by_path[inst.path] = here
    return FlopCount(model.name, seq, matmul, attention, by_path)


def training_flops_per_token(model: ir.Model) -> tuple[int, int]:
    """(matmul FLOPs, attention FLOPs per unit of sequence length) per token, forward + backward.

    Training FLOPs per token at sequence length S are `dense + attn * S` (sliding windows are
    counted at full length here; `model_flops` caps them).
    """
    dense = model_flops(model, seq=1).matmul
    attn = sum(expr_flops(inst, e, seq=1, cap_window=False).attention * layer_count(model.root, inst)
               for inst in model.root.walk() for e in forward_exprs(inst))
    return 3 * dense, 3 * attn


def layer_count(root: ir.Instance, inst: ir.Instance) -> int:
    """How many times `inst` runs per forward: the product of the repeat counts above it."""
    n, path = 1, ""
    parts = inst.path.strip("/").split("/") if inst.path != "/" else []
    by_path = {i.path: i for i in root.walk()}
    for part in parts:
        path += "/" + part
        node = by_path[path]
        if node.repeat is not None:
            n *= int(node.repeat.value)
    return n


def _through(e: ir.TExpr) -> ir.TExpr:
    """Look through transpose, cast and quantized: they keep which parameter an operand is."""
    while isinstance(e, ir.Prim) and primitives.get(e.name).see_through and e.args:
        e = e.args[0]
    return e


def param_of(inst: ir.Instance, e: ir.TExpr) -> tuple[str, str] | None:
    """(instance path, param name) when `e` is a parameter, possibly transposed or cast."""
    p = param_at(inst, e)
    if p is None:
        return None
    e = _through(e)
    return (inst.path if e.kind is RefKind.PARAM else inst.child(e.owner).path, e.name)


def param_at(inst: ir.Instance, e: ir.TExpr) -> ir.Param | None:
    """The parameter `e` refers to (through transpose/cast/quantized), in `inst` or a child."""
    e = _through(e)
    if isinstance(e, ir.Ref) and e.kind is RefKind.PARAM:
        return inst.param(e.name)
    if isinstance(e, ir.Ref) and e.kind is RefKind.CHILD_PARAM:
        child = inst.child(e.owner)
        return child.param(e.name) if child is not None else None
    return None


def matmul_flops_per_token(inst: ir.Instance, e: ir.TExpr) -> int:
    """Forward FLOPs per token of `x @ w` with a parameter operand: 2 x the elements of w."""
    if isinstance(e, ir.Bin) and e.op == "@":
        for operand in (e.right, e.left):
            p = param_at(inst, operand)
            if p is not None:
                return 2 * math.prod(d.size for d in p.dims)
        return 0
    if isinstance(e, ir.Prim):
        return expr_flops(inst, e, seq=1).matmul
    return 0
