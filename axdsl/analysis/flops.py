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
    attention(q, k, v)                                2 x heads x (head_dim + v_head_dim) per key
                                                      a token reads, per layer: S keys, S / 2
                                                      causal; a sliding window of w drops the
                                                      (S - w)^2 / 2 oldest pairs (causal: about
                                                      w - w^2 / 2S keys per token)
    ssd(x, dt, A, B, C, chunk)                        2 x min(chunk, S) x heads x (state +
                                                      head_dim) + 4 x heads x head_dim x state
                                                      per layer: linear in S, not like attention
    training                                          3 x forward (backward = 2 x forward)

Everything else (norms, activations, rope, the embedding gather, biases) is not counted, as in
MaxText. Layers under `repeat(n, ...)` count n times (nested repeats multiply).

    >>> from pathlib import Path
    >>> from axdsl.pipeline import compile_spec
    >>> m = compile_spec(Path("specs/llama3_8b.axl")).models[0]
    >>> f = model_flops(m, seq=8192)
    >>> f.train_per_token, f.per_step(batch=1)
    (51470401536, 421645529382912)

Training FLOPs per token as a function of S, as train.py's MODEL_FLOPS holds them (the SSD's
chunk caps its keys: a sequence twice as long costs twice as much, not four times):

    >>> mamba = compile_spec(Path("specs/mamba2_2_7b.axl")).models[0]
    >>> t = training_flops(mamba)
    >>> t.per_token(4096) == t.per_token(8192) == 3 * model_flops(mamba, 8192).forward_per_token
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from axdsl import primitives
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import RefKind
from axdsl.ir.rewrite import forward_exprs, prims_of
from axdsl.primitives import Flops
from axdsl.primitives.base import Keys
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
    attention: int  # forward FLOPs per token of attention and other sequence mixing (SSD), at `seq`
    by_path: dict[str, int] = field(
        default_factory=dict
    )  # instance path -> forward FLOPs per token

    @property
    def forward_per_token(self) -> int:
        return self.matmul + self.attention

    @property
    def train_per_token(self) -> int:
        """Forward and backward: 3 x forward."""
        return 3 * self.forward_per_token

    def per_step(self, batch: int) -> int:
        """Training FLOPs of one step over `batch` sequences of `seq` tokens (all chips
        together)."""
        return self.train_per_token * batch * self.seq


def pipelined_share(flops: FlopCount, child: str) -> float:
    """The fraction of the forward FLOPs per token that the repeat at path `child` does (the
    part pipeline(...) runs in stages)."""
    inside = sum(
        n for path, n in flops.by_path.items() if path == child or path.startswith(child + "/")
    )
    return inside / flops.forward_per_token if flops.forward_per_token else 0.0


def bubble_slowdown(flops: FlopCount, pipeline: ir.PipelinePolicy) -> float:
    """How much longer a step takes at the same FLOP rate when its pipelined repeat idles each
    stage for the bubble: the repeat's share of the FLOPs takes 1 / (1 - bubble) as long, the
    layers outside the pipeline as long as before. 1 / this is the best MFU the step can reach.

        >>> from axdsl.ir.settings import PipelinePolicy
        >>> f = FlopCount("m", 1, matmul=90, attention=0, by_path={"/blocks": 80, "/head": 10})
        >>> p = PipelinePolicy(microbatches=4, stages=4, child="/blocks")  # bubble 3 / 7
        >>> round(bubble_slowdown(f, p), 4)  # 1/9 + 8/9 x 7/4
        1.6667
    """
    share = pipelined_share(flops, pipeline.child)
    return 1 - share + share / (1 - pipeline.bubble)


# ---------------------------------------------------------------------------- parameters
def param_count(model: ir.Model) -> ParamCount:
    total = embedding = 0
    by_layer: dict[str, int] = {}
    by_path: dict[str, int] = {}
    gathered = _gathered_params(model.root)
    for inst in model.root.walk():
        for p in inst.params:
            n = math.prod(ir.static_size(d) for d in p.full_dims)
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
    """What a primitive's FLOP or parameter rule may ask: its instance, and which parameter an
    operand is."""

    inst: ir.Instance

    def param_at(self, e: ir.TExpr) -> ir.Param | None:
        return param_at(self.inst, e)


@dataclass(frozen=True)
class Mixer:
    """One kind of sequence mixing in a model: training FLOPs `per_key` (all its layers) for each
    key a token reads, which `keys` gives at a sequence length."""

    keys: Keys
    per_key: int


@dataclass(frozen=True)
class TrainingFlops:
    """Training FLOPs per token (3 x forward) as a function of the sequence length S: what
    train.py's MODEL_FLOPS holds (runtime.ModelFlops, the same formula)."""

    model: str
    dense: int  # per token at any S: matmuls with a parameter, an SSD's chunk states
    mixers: tuple[Mixer, ...] = ()  # one per kind of keys (causal attention, a window, a chunk)

    def per_token(self, seq: int) -> int:
        """Training FLOPs per token of a sequence of `seq` tokens."""
        return self.dense + sum(m.keys.work(m.per_key, seq) for m in self.mixers)


def expr_flops(inst: ir.Instance, e: ir.TExpr) -> Flops:
    """Forward FLOPs per token of one expression node (not of its operands)."""
    if isinstance(e, ir.Bin):
        return Flops(matmul=matmul_flops_per_token(inst, e))
    rule = primitives.get(e.name).flops if isinstance(e, ir.Prim) else None
    if isinstance(e, ir.Prim) and rule is not None:
        return rule(RuleContext(inst), e)
    return Flops()


def _model_exprs(model: ir.Model) -> Iterator[tuple[ir.Instance, int, Flops]]:
    """(instance, how many times it runs, forward FLOPs) of every expression of `model`."""
    for inst in model.root.walk():
        layers = layer_count(model.root, inst)
        for e in forward_exprs(inst):
            yield inst, layers, expr_flops(inst, e)


def model_flops(model: ir.Model, seq: int) -> FlopCount:
    """Forward model FLOPs per token of `model` at sequence length `seq` (see the module doc)."""
    matmul = attention = 0
    by_path: dict[str, int] = {}
    for inst, layers, f in _model_exprs(model):
        matmul += f.matmul * layers
        attention += f.sequence(seq) * layers
        if f.matmul or f.sequence(seq):
            by_path[inst.path] = by_path.get(inst.path, 0) + (f.matmul + f.sequence(seq)) * layers
    return FlopCount(model.name, seq, matmul, attention, by_path)


def training_flops(model: ir.Model) -> TrainingFlops:
    """Training FLOPs per token of `model` as a function of S: 3 x forward, per kind of keys.

    Attention's work grows with S (causal: S / 2 keys), a sliding window's and an SSD's stop
    growing at w or the chunk: one `dense + attn * S` pair cannot say both."""
    dense = 0
    per_key: dict[Keys, int] = {}
    for _, layers, f in _model_exprs(model):
        dense += 3 * (f.matmul + f.mixing) * layers
        if f.per_key:
            per_key[f.keys] = per_key.get(f.keys, 0) + 3 * f.per_key * layers
    return TrainingFlops(model.name, dense, tuple(Mixer(k, n) for k, n in per_key.items()))


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
    ref = _through(e)
    if param_at(inst, e) is None or not isinstance(ref, ir.Ref):
        return None
    owner = inst if ref.kind is RefKind.PARAM else inst.expect_child(ref.owner)
    return (owner.path, ref.name)


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
                return 2 * math.prod(ir.static_size(d) for d in p.dims)
        return 0
    if isinstance(e, ir.Prim):
        return expr_flops(inst, e).matmul
    return 0
