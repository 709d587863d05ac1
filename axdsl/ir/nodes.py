"""IR node types: immutable dataclasses carrying source spans.

The IR is a tree of layer *instances* (every hyperparameter resolved, with where its value came
from), each with parameters, children and a forward body of typed tensor expressions. Passes
return new trees (`dataclasses.replace`); nothing is mutated in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from axdsl.errors import Span

# Logical axis names a parameter or activation dim may carry; target rules map them to mesh axes.
LOGICAL_AXES = (
    "batch", "seq", "embed", "heads", "kv_heads", "head_dim", "mlp", "vocab", "experts", "layers",
    "norm",
)

# Spec dtype names and the numpy/jax names they mean.
DTYPES = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
    "i8": "int8", "i32": "int32", "u8": "uint8", "u16": "uint16", "u32": "uint32",
}


# ------------------------------------------------------------------ origins
class OriginKind(Enum):
    """Where a resolved value came from."""

    SET = "set"  # written in the spec (a model setting, a constructor argument, a train key)
    INHERITED = "inherited"  # taken from the nearest enclosing layer with the same name
    DEFAULT = "default"  # the declaration's or the compiler's default
    PROFILE = "profile"  # a hardware profile's default (targets/profiles.toml)
    TARGET_BLOCK = "target"  # a directive in a matching `target "pattern" { }` block


@dataclass(frozen=True)
class Origin:
    """Where a value came from, printed by `axdsl dump` and in generated comments.

    `where` is the owner's path (INHERITED), the profile name (PROFILE) or the block's pattern
    (TARGET_BLOCK); `note` says why a default was adjusted.
    """

    kind: OriginKind
    span: Span | None = None
    where: str = ""
    note: str = ""

    def __str__(self) -> str:
        match self.kind:
            case OriginKind.SET:
                return f"set at {self.span or '?'}"
            case OriginKind.INHERITED:
                return f"inherited from {self.where}"
            case OriginKind.PROFILE:
                return f"profile {self.where}"
            case OriginKind.TARGET_BLOCK:
                return f'target "{self.where}" at {self.span}'
        return f"default ({self.note})" if self.note else "default"

    @property
    def is_default(self) -> bool:
        return self.kind is OriginKind.DEFAULT

    @property
    def from_spec(self) -> bool:
        """Written by the user: a setting or a target block directive."""
        return self.kind in (OriginKind.SET, OriginKind.TARGET_BLOCK)


def set_at(span: Span) -> Origin:
    return Origin(OriginKind.SET, span)


DEFAULT = Origin(OriginKind.DEFAULT)


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
    args: tuple[tuple[str, "HValue"], ...]
    span: Span


@dataclass(frozen=True)
class RepeatValue:
    """`repeat(n, Block())`: a block stacked n times and run with `jax.lax.scan`."""

    count: "HValue"
    layer: LayerValue
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

    def same(self, other: "Dim") -> bool:
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


@dataclass(frozen=True)
class Bin:
    op: str  # + - * / @
    left: "TExpr"
    right: "TExpr"
    span: Span
    type: Type | None = None


@dataclass(frozen=True)
class Neg:
    operand: "TExpr"
    span: Span
    type: Type | None = None


@dataclass(frozen=True)
class EinsumSpec:
    """`einsum("B S dim, dim mlp -> B S mlp", x, w)`: dim names per operand and of the result.

    `dims` gives each name its Dim (a hyperparameter's size, or a free dim such as B).
    """

    operands: tuple[tuple[str, ...], ...]
    out: tuple[str, ...]
    dims: tuple[tuple[str, "Dim"], ...]

    def text(self) -> str:
        return ", ".join(" ".join(o) for o in self.operands) + " -> " + " ".join(self.out)


@dataclass(frozen=True)
class KernelChoice:
    """The kernel select_kernels chose for a primitive, and why the ones before it were not."""

    kernel: str  # cudnn, splash, xla
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
    args: tuple["TExpr", ...]
    attrs: tuple[tuple[str, StaticValue], ...]
    span: Span
    type: Type | None = None
    optional: tuple[str, ...] = ()
    kernel: KernelChoice | None = None

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)

    def operand(self, name: str) -> "TExpr | None":
        """An optional tensor operand by name, or None when it was not given."""
        if name not in self.optional:
            return None
        first = len(self.args) - len(self.optional)
        return self.args[first + self.optional.index(name)]


@dataclass(frozen=True)
class CallChild:
    child: str
    args: tuple["TExpr", ...]
    span: Span
    type: Type | None = None


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
@dataclass(frozen=True)
class HParam:
    name: str
    type: str  # int, float, bool, string, dtype, Layer, enum(...)
    value: HValue
    origin: Origin
    span: Span


@dataclass(frozen=True)
class Init:
    kind: str  # normal, trunc_normal, uniform, zeros, ones
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
    children: tuple["Instance", ...]
    forward: Forward | None
    span: Span  # where this instance was created (child decl or model)
    layer_span: Span  # where its layer is defined
    repeat: HValue | None = None  # set on a `repeat(n, ...)` child
    remat: "RematPolicy | None" = None  # set by insert_remat on repeated children

    def hparam(self, name: str) -> HParam | None:
        return next((h for h in self.hparams if h.name == name), None)

    def child(self, name: str) -> "Instance | None":
        return next((c for c in self.children if c.name == name), None)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass(frozen=True)
class NameValue:
    """A bare name in a section, kept for the pass that knows what names mean there (`fp8`)."""

    id: str


@dataclass(frozen=True)
class CallValue:
    """`adamw(lr = 3e-4)` in a section: a function name with positional and keyword values."""

    fn: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


# A section value: a literal (int, float, bool, str), a NameValue, a CallValue, or a tuple (a list).
SectionValue = Any


@dataclass(frozen=True)
class Setting:
    """`name = value` in a section."""

    name: str
    value: SectionValue
    span: Span


@dataclass(frozen=True)
class DirectiveArg:
    """One argument of a directive: `name` is None for a positional one."""

    name: str | None
    value: SectionValue
    span: Span


@dataclass(frozen=True)
class Directive:
    """`mesh(data = -1, fsdp = 8)` in a section: positional and keyword values, each with its span."""

    name: str
    args: tuple[DirectiveArg, ...]
    kwargs: tuple[DirectiveArg, ...]
    span: Span


class SectionKind(Enum):
    TRAIN = "train"
    TARGET = "target"


@dataclass(frozen=True)
class Section:
    """A `train { }` or `target "pattern" { }` block: settings and directives, values resolved.

    Values stay close to the syntax (see `SectionValue`); the passes that read a section
    (configure_train, configure_target) check its keys and values.
    """

    kind: SectionKind
    pattern: str | None
    settings: tuple[Setting, ...]
    directives: tuple[Directive, ...]
    span: Span


# ------------------------------------------------------------------ target schedule
@dataclass(frozen=True)
class Choice:
    """One resolved setting and where it came from (a default, a profile, a spec line)."""

    value: Any
    origin: Origin = DEFAULT

    @property
    def span(self) -> Span | None:
        return self.origin.span


class RematKind(StrEnum):
    NONE = "none"  # keep every activation
    FULL = "full"  # keep only the block's input
    SAVE_DOTS = "save_dots"  # keep matmul outputs without batch dims
    SAVE = "save"  # keep the named points listed
    OFFLOAD = "offload"  # move some named points to host memory, keep others


@dataclass(frozen=True)
class RematPolicy:
    """How the scanned block is rematerialized: none, full, save_dots, save or offload names."""

    kind: RematKind
    save: tuple[str, ...] = ()
    offload: tuple[str, ...] = ()


class QuantFormat(StrEnum):
    NONE = "none"
    FP8 = "fp8"  # e4m3 forward, e5m2 gradients (H100, H200, B200)
    INT8 = "int8"  # per-channel symmetric, straight-through backward (TPU v5e, v5p)


@dataclass(frozen=True)
class QuantPolicy:
    """Matmuls with a parameter operand under layer paths matching `layers` run in `format`."""

    format: "QuantFormat"
    layers: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class Schedule:
    """The schedule for one target: profile defaults overridden by the first matching block."""

    name: str  # as requested, e.g. gpu-h100-8
    profile: str  # e.g. gpu-h100
    kind: str  # the profile's chip family: cpu, gpu, tpu, trn
    chips: int
    matched: str | None  # the pattern of the target block that matched, if any
    matched_span: Span | None
    mesh: Choice  # value: tuple[(axis, size as written)]; sizes resolved in `mesh_sizes`
    mesh_sizes: tuple[tuple[str, int], ...]
    rules: tuple[tuple[str, Choice], ...]  # logical axis -> Choice(tuple of mesh axes)
    remat: Choice  # value: RematPolicy
    quantize: Choice  # value: QuantPolicy
    kernels: tuple[tuple[str, Choice], ...]  # op -> Choice(kernel name or "auto")

    def rule(self, logical: str) -> tuple[str, ...]:
        return next((c.value for k, c in self.rules if k == logical), ())

    def rule_choice(self, logical: str) -> Choice | None:
        return next((c for k, c in self.rules if k == logical), None)

    def size(self, mesh_axis: str) -> int:
        return dict(self.mesh_sizes)[mesh_axis]


@dataclass(frozen=True)
class NamedCall:
    """An optimizer or schedule with every argument resolved: adamw(lr = 3e-4, b1 = 0.9, ...)."""

    name: str
    args: tuple[tuple[str, Any], ...]

    def arg(self, key: str, default: Any = None) -> Any:
        return dict(self.args).get(key, default)


class DataKind(StrEnum):
    DEFAULT = "default"  # the Python standard library's .py files, read as bytes
    TOKENS = "tokens"  # a flat binary file of token ids
    TEXT = "text"  # a text file or a directory of them, read as bytes


@dataclass(frozen=True)
class DataSource:
    kind: DataKind
    path: str | None = None
    dtype: str | None = None  # tokens: "u16" or "u32"


@dataclass(frozen=True)
class CheckpointPolicy:
    every: int = 100
    keep: int = 3
    async_save: bool = True
    dir: str = "checkpoints"


@dataclass(frozen=True)
class TrainSettings:
    """The resolved `train { }` section: every setting with its value and where it came from.

    Values are ints and floats, a dtype name (dtype, param_dtype), NamedCall (optimizer,
    schedule), DataSource (data) and CheckpointPolicy (checkpoint).
    """

    settings: tuple[tuple[str, Choice], ...]

    def get(self, name: str) -> Any:
        return dict(self.settings)[name].value

    def choice(self, name: str) -> Choice:
        return dict(self.settings)[name]


@dataclass(frozen=True)
class Model:
    name: str
    root: Instance
    span: Span


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
