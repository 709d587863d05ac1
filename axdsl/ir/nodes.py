"""IR node types: immutable dataclasses carrying source spans.

The IR is a tree of layer *instances* (every hyperparameter resolved, with where its value came
from), each with parameters, children and a forward body of typed tensor expressions. Passes
return new trees (`dataclasses.replace`); nothing is mutated in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
@dataclass(frozen=True)
class Ref:
    """A name in a forward: kind is local, arg, param, child_param, hparam or dim."""

    name: str
    kind: str
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
class Prim:
    """A builtin primitive (silu, mean, attention, rope, ...); attrs are static keyword values."""

    name: str
    args: tuple["TExpr", ...]
    attrs: tuple[tuple[str, Any], ...]
    span: Span
    type: Type | None = None

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)


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
    origin: str  # "set", "default", or "inherited from <path>"
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
class Directive:
    """`mesh(data = -1, fsdp = 8)` in a section: positional and keyword values, each with its span."""

    name: str
    args: tuple[tuple[Any, Span], ...]
    kwargs: tuple[tuple[str, Any, Span], ...]
    span: Span


@dataclass(frozen=True)
class Section:
    """A `train { }` or `target "pattern" { }` block: settings and directives, values resolved.

    Values stay close to the syntax: a bare name is ("name", id), a list a tuple, a call
    ("call", fn, args, kwargs); passes that read a section check its keys and values.
    """

    kind: str
    pattern: str | None
    settings: tuple[tuple[str, Any, Span], ...]
    directives: tuple[Directive, ...]
    span: Span


# ------------------------------------------------------------------ target schedule
@dataclass(frozen=True)
class Choice:
    """One resolved target setting and where it came from (a profile default or a spec line)."""

    value: Any
    origin: str
    span: Span | None = None


@dataclass(frozen=True)
class RematPolicy:
    """How the scanned block is rematerialized: none, full, save_dots, save or offload names."""

    kind: str
    save: tuple[str, ...] = ()
    offload: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuantPolicy:
    """Matmuls with a parameter operand under layer paths matching `layers` run in `format`."""

    format: str  # none, fp8, int8
    layers: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class TargetConfig:
    """The schedule for one target: profile defaults overridden by the first matching block."""

    name: str  # as requested, e.g. gpu-h100-8
    profile: str  # e.g. gpu-h100
    kind: str  # cpu, gpu, tpu, trn
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
class TrainSpec:
    """The resolved `train { }` section: every setting with its value and where it came from."""

    settings: tuple[tuple[str, Choice], ...]

    def get(self, name: str) -> Any:
        return dict(self.settings)[name].value


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
    train: Section | None
    targets: tuple[Section, ...]
    target: str = "cpu"
    passes_run: tuple[str, ...] = field(default=())
    schedule: TargetConfig | None = None  # set by configure_target
    training: TrainSpec | None = None  # set by configure_train
