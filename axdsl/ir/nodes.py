"""IR node types: immutable dataclasses carrying source spans.

This module holds the layer tree and forward expressions; origins, sections and resolved
settings live in origins.py, sections.py and settings.py and are re-exported here, so every
pass reads `from axdsl.ir import nodes as ir` and writes `ir.Schedule`, `ir.Origin`, ...

The IR is a tree of layer *instances* (every hyperparameter resolved, with where its value came
from), each with parameters, children and a forward body of typed tensor expressions. Passes
return new trees (`dataclasses.replace`); nothing is mutated in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from axdsl.errors import Span

if TYPE_CHECKING:  # the plans refer back to nodes; only the annotations need them
    from axdsl.ir.head import HeadSplit
    from axdsl.ir.plans import ActivationSharding, ConfigFields, DecodePlan
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
    DataKind,
    DataSource,
    FitTry,
    Kernel,
    NamedCall,
    ObjectiveKind,
    QuantFormat,
    QuantPolicy,
    RematFit,
    RematKind,
    RematPolicy,
    Schedule,
    Tokenizer,
    TrainSettings,
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

# Spec dtype names and the numpy/jax names they mean.
DTYPES = {
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "i8": "int8",
    "i32": "int32",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
}


# ------------------------------------------------------------------ values
@dataclass(frozen=True)
class DType:
    name: str  # spec name, e.g. "bf16"

    @property
    def jnp(self) -> str:
        return DTYPES[self.name]


@dataclass(frozen=True)
class LayerValue:
    """A layer with some hyperparameters set: the value of `RMSNorm(eps = 1e-5)`."""

    layer: str
    args: tuple[tuple[str, HValue], ...]
    span: Span


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
    """A resolved hyperparameter value and the Python expression that computes it from `cfg`.

    `code` keeps generated code symbolic: Attention's `head_dim` is `cfg.dim // cfg.heads`, not 128.
    """

    value: Any
    code: str = ""


# ------------------------------------------------------------------ shapes and types
@dataclass(frozen=True)
class Dim:
    """One dimension: a concrete size with the spec text that produced it, or a free dim (B, S).

    `size` is None for free dims and for `...`; `code` is the Python expression for the size.
    """

    name: str
    size: int | None = None
    code: str = ""

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
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
TENSOR_OPS = ("+", "-", "*", "/", "@") + COMPARE_OPS


@dataclass(frozen=True)
class Bin:
    op: str  # one of TENSOR_OPS
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


# A primitive's static attribute: a hyperparameter value, a Dim, an einsum spec, a format.
StaticValue = Any


@dataclass(frozen=True)
class Prim:
    """A builtin primitive call (silu, mean, attention, rope, ...), defined in axdsl/primitives/.

    `attrs` are its static arguments, named by its signature; `optional` lists the keyword
    tensor operands given (they follow the positional ones in `args`); `kernel` is set by
    select_kernels on primitives that have kernels.
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


# initializer -> its argument count. log_arange(start): log(start + i) along the last dim (Mamba's
# A_log); dt_log_uniform(low, high): softplus^-1 of a log-uniform step in [low, high] (its dt_bias).
INIT_KINDS = {
    "normal": 1,
    "trunc_normal": 1,
    "uniform": 1,
    "zeros": 0,
    "ones": 0,
    "log_arange": 1,
    "dt_log_uniform": 2,
}


@dataclass(frozen=True)
class Init:
    kind: str  # one of INIT_KINDS
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

    def walk(self):
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
        inst = self
        for name in [n for n in path.split("/") if n]:
            inst = inst.child(name)
            if inst is None or inst.repeat is not None:
                return inst
        return None


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


@dataclass(frozen=True)
class Model:
    name: str
    root: Instance
    span: Span
    head: HeadSplit | None = None  # set by split_head: the fused cross-entropy's cut
    decode: DecodePlan | None = None  # set by plan_decode on a next-token LM


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
