"""IR node types: immutable dataclasses carrying source spans.

This module holds the layer tree and forward expressions; origins, sections and resolved
settings live in origins.py, sections.py and settings.py and are re-exported here, so every
pass reads `from axdsl.ir import nodes as ir` and writes `ir.Schedule`, `ir.Origin`, ...

The IR is a tree of layer *instances* (every hyperparameter resolved, with where its value came
from), each with parameters, children and a forward body of typed tensor expressions. Passes
return new trees (`dataclasses.replace`); nothing is mutated in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from axdsl.errors import InternalError, Span, filled
from axdsl.ir.dtypes import DTYPES, DType  # noqa: F401 (part of the IR)
from axdsl.ir.expr import BinOp, Const, Expr
from axdsl.ir.origins import (  # noqa: F401 (part of the IR)
    DEFAULT,
    Choice,
    Origin,
    OriginKind,
    set_at,
    user_line,
)
from axdsl.ir.sections import (  # noqa: F401
    CallValue,
    Directive,
    DirectiveArg,
    NameValue,
    Section,
    SectionKind,
    SectionValue,
    Setting,
)
from axdsl.ir.settings import (  # noqa: F401
    CheckpointPolicy,
    ChipKind,
    ContextPolicy,
    ContextStrategy,
    DataKind,
    DataSource,
    PipelinePolicy,
    STAGE_AXIS,
    TokenWidth,
    FitTry,
    FlagSetting,
    GpuRuntime,
    Kernel,
    NamedCall,
    ObjectiveKind,
    OptimizerKind,
    QuantFormat,
    QuantPolicy,
    RematFit,
    RematKind,
    RematPolicy,
    Schedule,
    ScheduleKind,
    Tokenizer,
    TrainOn,
    TrainSettings,
    UpdateSkip,
    XlaFlag,
)

# Logical axis names a parameter or activation dim may carry; target rules map them to mesh axes.
LOGICAL_AXES = (
    "batch",
    "seq",
    "embed",
    "heads",
    "kv_heads",
    "head_dim",
    "mlp",
    "vocab",
    "experts",
    "layers",
    "norm",
)


# ------------------------------------------------------------------ values
@dataclass(frozen=True)
class LayerValue:
    """A layer with some hyperparameters set: the value of `RMSNorm(eps = 1e-5)`."""

    layer: str
    args: tuple[tuple[str, HValue], ...]
    span: Span
    arg_spans: tuple[tuple[str, Span], ...] = ()  # where each argument was written (`eps = 0`)

    def span_of(self, name: str) -> Span:
        """Where argument `name` was written; the whole constructor when it came from a base."""
        return dict(self.arg_spans).get(name, self.span)


@dataclass(frozen=True)
class PatternValue:
    """`[Block(attn = Attention(window = 4096)), Block()]`: layers that run in turn, the value of
    a list of layers. Only `repeat` runs one: layer i of `repeat(n, pattern)` is pattern[i % k]."""

    layers: tuple[LayerValue, ...]
    span: Span


@dataclass(frozen=True)
class RepeatValue:
    """`repeat(n, Block())`: a block stacked n times and run with `jax.lax.scan`; with a pattern
    of k layers, one scan over n / k groups that each run the k layers in order."""

    count: HValue
    layer: LayerValue | PatternValue
    span: Span


@dataclass(frozen=True)
class HValue:
    """A resolved hyperparameter value and the expression that computes it from the Config.

    `expr` keeps generated code symbolic: Attention's `head_dim` is `cfg.dim // cfg.heads`, not
    128. Layers, patterns and repeats have none (they are not Config values).
    """

    value: Any
    expr: Expr | None = None


# ------------------------------------------------------------------ shapes and types
@dataclass(frozen=True)
class Dim:
    """One dimension: a concrete size with the spec text that produced it, or a free dim (B, S).

    `size` is None for free dims and for `...`; `expr` computes the size from the Config (None:
    the size is just its number, see `size_expr`).
    """

    name: str
    size: int | None = None
    expr: Expr | None = None

    @property
    def size_expr(self) -> Expr:
        """The expression for a sized dim's size: its own, or its number."""
        if self.expr is not None:
            return self.expr
        if self.size is None:
            raise ValueError(f"dim `{self.name}` has no static size")
        return Const(self.size)

    @property
    def is_free(self) -> bool:
        return self.size is None and self.name != "..."

    @property
    def is_ellipsis(self) -> bool:
        return self.name == "..."

    def __str__(self) -> str:
        if self.size is None or self.name == str(self.size):
            return self.name
        return f"{self.name}={self.size}"

    def same(self, other: Dim) -> bool:
        if self.size is not None and other.size is not None:
            return self.size == other.size
        return self.size is None and other.size is None and self.name == other.name


ELLIPSIS = Dim("...")


@dataclass(frozen=True)
class TensorType:
    dims: tuple[Dim, ...]

    def __str__(self) -> str:
        return "[" + ", ".join(str(d) for d in self.dims) + "]"


@dataclass(frozen=True)
class ScalarType:
    kind: str  # int, float, bool, string, dtype

    def __str__(self) -> str:
        return self.kind


Type = TensorType | ScalarType


# ------------------------------------------------------------------ forward expressions
class RefKind(StrEnum):
    """What a name in a forward refers to."""

    LOCAL = "local"  # a value assigned earlier in the same forward
    ARG = "arg"  # a forward argument
    PARAM = "param"  # one of this layer's parameters
    CHILD_PARAM = "child_param"  # a child's parameter, `embed.table` (owner names the child)
    HPARAM = "hparam"  # a hyperparameter: a static value
    DIM = "dim"  # a free dim's runtime size (`S`)


@dataclass(frozen=True)
class Ref:
    """A name in a forward, bound to what it refers to."""

    name: str
    kind: RefKind
    span: Span
    type: Type | None = None
    value: HValue | None = None  # for hparams and dims
    owner: str = ""  # for child_param: the child's name


@dataclass(frozen=True)
class Lit:
    value: Any  # int, float, bool, str or DType
    span: Span
    type: Type | None = None


# Operators a forward applies to tensors: arithmetic, `@`, and comparisons (a bool tensor).
COMPARE_OPS = (BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE, BinOp.EQ, BinOp.NE)
TENSOR_OPS = (BinOp.ADD, BinOp.SUB, BinOp.MUL, BinOp.DIV, BinOp.MATMUL) + COMPARE_OPS


@dataclass(frozen=True)
class Bin:
    op: BinOp  # one of TENSOR_OPS
    left: TExpr
    right: TExpr
    span: Span
    type: Type | None = None


@dataclass(frozen=True)
class Neg:
    operand: TExpr
    span: Span
    type: Type | None = None


@dataclass(frozen=True)
class EinsumSpec:
    """`einsum("B S dim, dim mlp -> B S mlp", x, w)`: dim names per operand and of the result.

    `dims` gives each name its Dim (a hyperparameter's size, or a free dim such as B).
    """

    operands: tuple[tuple[str, ...], ...]
    out: tuple[str, ...]
    dims: tuple[tuple[str, Dim], ...]

    def text(self) -> str:
        return ", ".join(" ".join(o) for o in self.operands) + " -> " + " ".join(self.out)


@dataclass(frozen=True)
class KernelChoice:
    """The kernel select_kernels chose for a primitive, and why the ones before it were not."""

    kernel: Kernel
    rejected: tuple[str, ...] = ()  # "cudnn not used: ..." for each kernel passed over
    origin: Origin = DEFAULT  # the profile's preference list, or a forcing target block


class Decoding(StrEnum):
    """How a primitive runs in the generated KV-cache decode path (axdsl/codegen/decode.py), where
    a call sees only the new tokens at positions pos, pos + 1, ...: never a whole sequence. Each
    primitive declares its own (axdsl/primitives/); a Prim records it, so the IR can tell which
    calls are position-wise without the registry."""

    # each position on its own; a static dim that is the sequence rules decoding out
    POSITIONWISE = "positionwise"
    POSITIONS = (
        "positions"  # reads token positions: its emitter shifts them by `pos` (rope, iota, prefix)
    )
    CACHED = "cached"  # reads earlier positions through the decode cache (attention)
    SEQUENCE = (
        "sequence"  # mixes positions without a cache (conv1d, ssd): the model has no decode path
    )


# A primitive's static attribute: a hyperparameter value, a Dim, an einsum spec, a format.
StaticValue = Any


@dataclass(frozen=True)
class Prim:
    """A builtin primitive call (silu, mean, attention, rope, ...), defined in axdsl/primitives/.

    `attrs` are its static arguments, named by its signature; `optional` lists the keyword
    tensor operands given (they follow the positional ones in `args`); `kernel` is set by
    select_kernels on primitives that have kernels; `decoding` is the primitive's own, from its
    registry entry.
    """

    name: str
    args: tuple[TExpr, ...]
    attrs: tuple[tuple[str, StaticValue], ...]
    span: Span
    type: Type | None = None
    optional: tuple[str, ...] = ()
    kernel: KernelChoice | None = None
    # hyperparameters its static attributes read (`rope(q, rope_theta, rotary_dim = rope_dim)`:
    # rope_theta, rope_dim), for errors in a library layer to blame the user's line; not semantics
    reads: tuple[str, ...] = field(default=(), compare=False)
    decoding: Decoding = field(kw_only=True, compare=False)

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)

    def operand(self, name: str) -> TExpr | None:
        """An optional tensor operand by name, or None when it was not given."""
        if name not in self.optional:
            return None
        first = len(self.args) - len(self.optional)
        return self.args[first + self.optional.index(name)]


@dataclass(frozen=True)
class CallChild:
    """`child(x, ...)`; with `over` set, `scan(child, x, over = S)`: the child runs once per step
    of dim S of its inputs, carrying its first argument (a recurrent or state-space cell).

    A scan's `args` are the child's arguments in order: the initial carry when `init` is given
    (`scan_init`), then the inputs it slices along `over`; without `init` the carry starts at zeros.
    """

    child: str
    args: tuple[TExpr, ...]
    span: Span
    type: Type | None = None
    over: Dim | None = None  # the dim a `scan` runs along
    scan_init: bool = False  # args[0] is the scan's initial carry


TExpr = Ref | Lit | Bin | Neg | Prim | CallChild


@dataclass(frozen=True)
class Let:
    name: str
    value: TExpr
    point: str | None  # a named point for remat (`as mlp_hidden`)
    span: Span


@dataclass(frozen=True)
class Ret:
    value: TExpr
    span: Span


Stmt = Let | Ret


@dataclass(frozen=True)
class Arg:
    name: str
    dims: tuple[Dim, ...]
    span: Span


@dataclass(frozen=True)
class Forward:
    args: tuple[Arg, ...]
    result: tuple[Dim, ...]
    body: tuple[Stmt, ...]
    span: Span


# ------------------------------------------------------------------ layers
class HParamKind(StrEnum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STRING = "string"
    DTYPE = "dtype"
    LAYER = "Layer"
    ENUM = "enum"


@dataclass(frozen=True)
class HParamType:
    """A hyperparameter's declared type; `options` are an enum's allowed strings."""

    kind: HParamKind
    options: tuple[str, ...] = ()

    def __str__(self) -> str:
        return (
            f"enum({', '.join(self.options)})" if self.kind is HParamKind.ENUM else str(self.kind)
        )


@dataclass(frozen=True)
class HParam:
    name: str
    type: HParamType
    value: HValue
    origin: Origin
    span: Span


class InitKind(StrEnum):
    """A parameter initializer. log_arange(start): log(start + i) along the last dim (Mamba's
    A_log); dt_log_uniform(low, high): softplus^-1 of a log-uniform step in [low, high] (its
    dt_bias)."""

    NORMAL = "normal"
    TRUNC_NORMAL = "trunc_normal"
    UNIFORM = "uniform"
    ZEROS = "zeros"
    ONES = "ones"
    LOG_ARANGE = "log_arange"
    DT_LOG_UNIFORM = "dt_log_uniform"

    @property
    def arity(self) -> int:
        """How many arguments the initializer takes."""
        return _INIT_ARITY[self]


_INIT_ARITY = {
    InitKind.NORMAL: 1,
    InitKind.TRUNC_NORMAL: 1,
    InitKind.UNIFORM: 1,
    InitKind.ZEROS: 0,
    InitKind.ONES: 0,
    InitKind.LOG_ARANGE: 1,
    InitKind.DT_LOG_UNIFORM: 2,
}


@dataclass(frozen=True)
class Init:
    kind: InitKind
    args: tuple[HValue, ...]
    span: Span


@dataclass(frozen=True)
class Param:
    name: str
    dims: tuple[Dim, ...]  # per-layer shape
    axes: tuple[str, ...]
    init: Init
    dtype: DType
    span: Span
    stack: tuple[Dim, ...] = ()  # leading dims added by stack_repeats (one per enclosing repeat)
    # Mesh axes per full dim, set by annotate_sharding: () means replicated along that dim.
    sharding: tuple[tuple[str, ...], ...] | None = None

    @property
    def full_dims(self) -> tuple[Dim, ...]:
        return self.stack + self.dims

    @property
    def full_axes(self) -> tuple[str, ...]:
        return ("layers",) * len(self.stack) + self.axes


@dataclass(frozen=True)
class Instance:
    """One layer in the model tree. `path` is "/" for the root, else "/blocks/attn" and so on."""

    path: str
    name: str
    layer: str
    hparams: tuple[HParam, ...]
    params: tuple[Param, ...]
    children: tuple[Instance, ...]
    forward: Forward | None
    span: Span  # where this instance was created (child decl or model)
    layer_span: Span  # where its layer is defined
    repeat: HValue | None = (
        None  # set on a `repeat(n, ...)` child (n / k for a pattern of k layers)
    )
    pattern: bool = False  # a group of a repeated pattern: children "0".."k-1", run in order
    remat: RematPolicy | None = None  # set by insert_remat on repeated children
    unrolled: bool = False  # set by unroll_repeats: this repeat runs as an unrolled loop
    # set by shard_activations on a repeated child: where its scan's carry lives on the mesh
    carry_sharding: ActivationSharding | None = None

    def hparam(self, name: str) -> HParam | None:
        return next((h for h in self.hparams if h.name == name), None)

    def child(self, name: str) -> Instance | None:
        return next((c for c in self.children if c.name == name), None)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def fwd(self) -> Forward:
        """This layer's forward: every instance of a built IR has one (a layer without a forward
        is a compile error of the builder), so later stages read it without a None check."""
        return filled(self.forward, f"the forward of {self.path}", "resolve")

    def expect_child(self, name: str) -> Instance:
        """The child `name`, which the builder bound every `name(...)` call and `name.param`
        reference to; an InternalError when there is none (a compiler bug)."""
        return filled(self.child(name), f"child `{name}` of {self.path}", "resolve")

    def expect_param(self, name: str) -> Param:
        """The parameter `name`, which the builder bound every PARAM reference to."""
        return filled(self.param(name), f"parameter `{name}` of {self.path}", "resolve")

    def walk(self) -> Iterator[Instance]:
        yield self
        for c in self.children:
            yield from c.walk()

    def holds_stack(self) -> bool:
        """Whether a stacked (repeated) layer is below this one, outside any other stacked layer:
        the layers between the root and such a stack pass it their weights uncast."""
        return any(c.repeat is not None or c.holds_stack() for c in self.children)

    def stack_of(self, path: str) -> Instance | None:
        """The outermost stacked layer on the way from this layer down to the one at `path` (that
        layer included), or None when none of them is repeated."""
        inst: Instance | None = self
        for name in [n for n in path.split("/") if n]:
            assert inst is not None  # the loop returns as soon as it is None
            inst = inst.child(name)
            if inst is None or inst.repeat is not None:
                return inst
        return None


def plain(v: Any) -> Any:
    """A primitive attribute's plain value: an HValue unwrapped, anything else as it is."""
    return v.value if isinstance(v, HValue) else v


def hparam_origins(tree: dict[str, Instance], path: str, name: str) -> Iterator[Origin]:
    """The origins of hyperparameter `name` at `path` (tree: instances by path), following
    inherited values outwards to where the value was set: what `user_line` reads to blame the
    user's line for an error in a library layer."""
    seen = set()
    while path in tree and path not in seen:
        seen.add(path)
        hp = tree[path].hparam(name)
        if hp is None:
            return
        yield hp.origin
        if hp.origin.kind is not OriginKind.INHERITED:
            return
        path = hp.origin.where


def master_weight_paths(root: Instance) -> frozenset[str]:
    """The layers of a mixed-precision model (`dtype` and `param_dtype` set) that receive master
    weights (cfg.param_dtype) and cast them to the compute dtype as they read them: the root, and
    below it each unstacked layer holding a stack (a repeated pattern's groups-and-tail layer).
    Each casts what it calls except its stacks, which are cast one layer at a time in their scan
    step, and the layers it passes master weights on to. Empty for a single-precision model."""
    if root.hparam("dtype") is None or root.hparam("param_dtype") is None:
        return frozenset()
    out: set[str] = set()

    def visit(inst: Instance) -> None:
        out.add(inst.path)
        for c in inst.children:
            if c.repeat is None and c.holds_stack():
                visit(c)

    visit(root)
    return frozenset(out)


# What the last passes decide for codegen, recorded so that codegen only prints it:
# shard_activations -> Instance.carry_sharding, split_head -> Model.head, plan_decode ->
# Model.decode, select_config -> Module.config. `axdsl dump` prints each (ir/printer.py) and
# tests/ir/<pass>.test shows it.

# Positions per chunk of the fused cross-entropy without a target (a target's is its profile's
# loss_chunk): the generated LOSS_CHUNK, and axdsl aot's.
LOSS_CHUNK = 512


@dataclass(frozen=True)
class ActivationSharding:
    """Where an activation lives on the mesh: each dim's logical axis (None: no rule reads it)
    and the mesh axes the target's rules give it, each mesh axis used once per tensor."""

    logical: tuple[str | None, ...]
    mesh: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class CacheEntry:
    """One array of the KV cache: an attention call's keys (`k`, `k2`, ...) or values (`v`, ...).

    Its shape is [*stack, batch, length, *dims[2:]]: one slice per stacked layer around it, then
    the attention operand's dims past its [B, S]."""

    path: str  # in the cache tree, which mirrors the parameter tree: "blocks/attn/k"
    stack: tuple[HValue, ...]  # the repeat counts of the stacked layers around the attention
    dims: tuple[Dim, ...]  # the attention operand's dims, [B, S, kv_heads, head_dim]
    sharding: ActivationSharding | None  # None on a target without a mesh (no schedule)


@dataclass(frozen=True)
class DecodePlan:
    """How a next-token LM decodes over a KV cache (plan_decode), or why it cannot.

    `cached` are the layers whose decode variant takes and returns a part of the cache (those
    holding an attention call, and their ancestors); the other layers run as in the forward."""

    problem: str | None  # why this model cannot decode over a KV cache; None when it can
    cached: tuple[str, ...] = ()  # instance paths, leaves first
    cache: tuple[CacheEntry, ...] = ()


@dataclass(frozen=True)
class ConfigFields:
    """The root hyperparameters of the generated `Config` (select_config), in declaration order,
    and those fixed when the file was built (the code reads none of them)."""

    fields: tuple[str, ...]
    fixed: tuple[str, ...]


@dataclass(frozen=True)
class HeadSplit:
    """The root cut in two: `body` returns the hidden state, `head` maps it to the logits."""

    body: Instance  # the root's forward up to the head, returning `hidden`
    head: Instance  # forward(hidden) -> logits: the tail of the root's statements
    hidden: str  # the value the head reads, its one argument
    params: tuple[str, ...]  # the top-level keys of the parameter tree the head reads
    chunk: int = LOSS_CHUNK  # positions per chunk of the fused cross-entropy on this target


@dataclass(frozen=True)
class SharedFunction:
    """One generated layer function (set by plan_functions): its name and the instances that
    call it, which have one structure (layer, resolved forward, parameters, children's functions),
    so one body serves them all."""

    name: str
    layer: str
    paths: tuple[str, ...]  # in the order the model tree is visited, leaves first
    rng: bool = False  # it takes a dropout key (its forward, or a child's, is random)
    aux: bool = False  # it returns an auxiliary loss too (its forward's, or a child's)
    master: bool = False  # it reads master weights and casts them (ir.master_weight_paths)
    takes_pos: bool = False  # the decode path shares it: it reads positions from `pos`
    # its context-parallel attention runs inside pipeline()'s vmap over the `stage` axis
    staged: bool = False

    @property
    def roles(self) -> tuple[str, ...]:
        """The flags set, by name, for `axdsl dump`."""
        flags: tuple[tuple[str, bool], ...] = (
            ("rng", self.rng),
            ("aux", self.aux),
            ("master", self.master),
            ("pos", self.takes_pos),
            ("staged", self.staged),
        )
        return tuple(n for n, on in flags if on)


@dataclass(frozen=True)
class Model:
    name: str
    root: Instance
    span: Span
    head: HeadSplit | None = None  # set by split_head: the fused cross-entropy's cut
    decode: DecodePlan | None = None  # set by plan_decode on a next-token LM
    # set by plan_functions: the generated layer functions in post-order (leaves first)
    functions: tuple[SharedFunction, ...] = ()


@dataclass(frozen=True)
class Module:
    """Everything built from one spec file: its models, its train block and its target blocks."""

    spec: str  # display path of the main spec file
    sha256: str
    models: tuple[Model, ...]
    train_block: Section | None  # the spec's `train { }`, as written
    target_blocks: tuple[Section, ...]  # the spec's `target "pattern" { }` blocks, as written
    target_name: str = "cpu"  # the target this module is built for, e.g. gpu-h100-8
    passes_run: tuple[str, ...] = field(default=())
    schedule: Schedule | None = None  # set by configure_target
    train_settings: TrainSettings | None = None  # set by configure_train
    config: ConfigFields | None = None  # set by select_config
    # set by plan_functions: the generated helpers the models' code calls, by name, sorted
    helpers: tuple[str, ...] = ()

    # Typed views of the fields later passes fill. The fields stay Optional, since the IR between
    # passes really lacks them (`axdsl dump --after check` prints a module without a schedule);
    # a stage that runs after the pass reads the view, which has the plain type, and a read before
    # the pass ran is a compiler bug that raises InternalError instead of an AttributeError on None.
    @property
    def target(self) -> Schedule:
        """The resolved schedule of `target_name` (the blocks as written are `target_blocks`)."""
        return filled(self.schedule, "Module.schedule", "configure_target")

    @property
    def train(self) -> TrainSettings:
        """The resolved train settings (the block as written is `train_block`)."""
        return filled(self.train_settings, "Module.train_settings", "configure_train")

    def report_at(self, span: Span | None) -> Span:
        """Where a diagnostic about a resolved setting points: `span`, the line that set it, or
        when a default set it (no line of its own), the spec's train block, else its first model."""
        if span is not None:
            return span
        return self.train_block.span if self.train_block is not None else self.models[0].span


def tensor_type(e: TExpr) -> TensorType:
    """The tensor type infer_shapes gave `e`. Reading it on a scalar or an untyped expression is
    a compiler bug: the pass reported a non-tensor where a tensor is required as a user error."""
    if not isinstance(e.type, TensorType):
        raise InternalError(f"expected a tensor type at {e.span}, got {e.type}")
    return e.type


def static_size(d: Dim) -> int:
    """The size of a dim that has one (a parameter's, after the builder resolved it); reading it
    on a free dim (B, S) or `...` is a compiler bug."""
    return filled(d.size, f"the size of dim {d.name}", "resolve")
