"""What a primitive is: everything the compiler knows about one builtin, in one record.

A `Primitive` holds its signature (tensor operands and static attributes, checked when the
forward is built), its shape rule (infer_shapes), its emitter (codegen), the helper functions its
emitted code calls (their source and imports), its FLOPs (analysis), the activations it keeps for
the backward pass (memory analysis) and its kernels (select_kernels). Nothing else in the compiler
special-cases a primitive by name; passes and analyses read the flags below instead. The registry
sits below passes and codegen: nothing here imports them.

The contexts each rule receives are small protocols implemented by the stage that calls it:

    ShapeContext   fail(span, message, hint=None); axis_of(prim, dims, over) -> int
    EmitContext    see axdsl/codegen/expressions.py FunctionEmitter (fresh names, extra lines,
                   helpers by name (`use_helper`), dim sizes, einsum letters, the dropout key);
                   in the KV-cache decode path (axdsl/codegen/decode.py) `decoding` is True,
                   `decode_pos` names the new tokens' first position, `is_sequence(dim)` tells
                   the sequence dim and `cache_slot(prim)` gives an attention call its cache keys
    FlopContext    inst (the instance), param_at(expr) -> ir.Param | None
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, NoReturn, Protocol
from collections.abc import Callable

from axdsl.errors import Span
from axdsl.ir import nodes as ir
from axdsl.syntax.ast import Bound
from axdsl.ir.nodes import Decoding  # noqa: F401 (declared by each primitive; the IR records it)

REQUIRED = object()  # a static attribute without a default must be given


class StaticKind(Enum):
    """The kind of a static attribute, checked at build time."""

    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STRING = "string"
    DTYPE = "dtype"
    DIM = "dim"  # a named dim: a hyperparameter size or a free dim of the forward
    DIMS = "dims"  # a list of named dims, `[heads, head_dim]` (a tuple of ir.Dim)
    EINSUM = "einsum"  # an einsum spec (ir.EinsumSpec), parsed by the einsum primitive's lowering
    FORMAT = "format"  # a quantization format (ir.QuantFormat), set by quantize_matmuls


@dataclass(frozen=True)
class Static:
    """A static attribute; `bounds` are the values it may take (`window >= 0`), checked for every
    call where the value is written (at the user's line when a library layer passes it on), and
    `hint` says what the attribute means in that error ("0 means no sliding window")."""

    name: str
    kind: StaticKind
    default: Any = REQUIRED  # REQUIRED, None (absent) or a Python value
    bounds: tuple[Bound, ...] = ()
    hint: str | None = None


@dataclass(frozen=True)
class Signature:
    tensors: tuple[str, ...]  # positional tensor operands
    statics: tuple[
        Static, ...
    ] = ()  # static attributes, positional after the tensors or by keyword
    optional_tensors: tuple[str, ...] = ()  # keyword-only tensor operands
    doc: str = ""


@dataclass(frozen=True)
class Keys:
    """Which keys a token of a sequence mixer reads, as a function of the sequence length S.

    Attention reads S keys (S / 2 when causal, MaxText's convention), less those a sliding window
    of w drops: the (S - w)^2 / 2 oldest (query, key) pairs, so a causal window reads about
    w - w^2 / 2S keys per token. An SSD scan in chunks of c computes its whole c x c diagonal
    blocks: min(c, S) keys. The generated runtime's `Mixer.keys` is the same formula.
    """

    causal: bool = False
    window: int = 0  # a sliding window of this many keys; 0: none
    chunk: int = 0  # > 0: an SSD scan in chunks of this many positions (causal and window unused)

    def work(self, per_key: int, seq: int) -> int:
        """`per_key` x the keys a token reads at sequence length `seq`, in whole FLOPs."""
        if self.chunk:
            return per_key * min(self.chunk, seq)
        dropped = (seq - min(seq, self.window or seq)) ** 2  # 2 S x the keys dropped per token
        read = seq * seq if self.causal else 2 * seq * seq  # 2 S x the keys read without a window
        return per_key * (read - dropped) // (2 * seq)


@dataclass(frozen=True)
class Flops:
    """Forward model FLOPs per token of one primitive call (see axdsl/analysis/flops.py).

    `matmul` and `mixing` do not depend on the sequence length; a sequence mixer's work that does
    is `per_key` for each key a token reads (`keys`), so it can be counted at any S."""

    matmul: int = 0  # matmuls with a parameter
    mixing: int = 0  # sequence mixing that does not grow with S (an SSD's chunk states)
    per_key: int = 0  # sequence mixing per key a token reads (QK^T and PV: 2 heads (hd + v_hd))
    keys: Keys = Keys()

    def sequence(self, seq: int) -> int:
        """The sequence mixing per token at sequence length `seq`."""
        return self.mixing + self.keys.work(self.per_key, seq)


@dataclass(frozen=True)
class KernelRule:
    """A primitive's kernels: their names and why one cannot run a call.

    `names` are every kernel a target block may name (`kernels(attention = cudnn)`); the first is
    the fallback that runs every call. A profile lists its preference order per primitive
    (profiles.toml `kernels = { attention = ["cudnn", "xla"] }`).
    `violations(kernel, prim, model, schedule)` lists the reasons; empty means it can run.
    """

    names: tuple[ir.Kernel, ...]
    violations: Callable[..., list[str]]

    @property
    def fallback(self) -> ir.Kernel:
        return self.names[0]

    def preference(self, profile: Any, op: str) -> tuple[ir.Kernel, ...]:
        """The profile's kernels for primitive `op`, best first; the fallback alone if it lists
        none."""
        return tuple(profile.kernels.get(op, (self.fallback,)))


class HelperSection(IntEnum):
    """Where a helper sits among the generated model's helpers: small functions first, whole layers
    last; within a section, by name."""

    FUNCTION = 0  # a function of a tensor or two (rotary embedding, dropout)
    MATMUL = 1  # a matmul in another number format (fp8, int8)
    KERNEL = 2  # a hand-written kernel wrapper (splash attention)
    LAYER = 3  # a whole layer and its parts (a mixture of experts and its dispatch paths)


@dataclass(frozen=True)
class Source:
    """Top-level definitions of a module of axdsl/kernels/ (`module`: "rope" for
    axdsl/kernels/rope.py), copied into generated code as written there: each statement that
    defines one of `names`, or calls a method of one (`f.defvjp(...)`), in the module's order.
    Codegen reads the file as text (codegen/helpers.py); nothing imports it to build."""

    module: str
    names: tuple[str, ...]


HelperCode = Source | tuple[Source, ...] | str  # where a Helper's source is (see Helper)


@dataclass(frozen=True)
class Helper:
    """A function copied into the generated model when an emitter calls `ctx.use_helper(name)`.

    `code` is where its source is: definitions in axdsl/kernels/ (one `Source` or several, in
    order), source text, or a function of the set of helper names in use that returns either (a
    helper whose body depends on which of its parts the spec uses). `imports` are the import
    lines that source needs.
    """

    name: str
    code: HelperCode | Callable[[frozenset[str]], HelperCode]
    imports: tuple[str, ...] = ("import jax", "import jax.numpy as jnp")
    section: HelperSection = HelperSection.FUNCTION

    def code_for(self, used: frozenset[str]) -> HelperCode:
        """Its code when the helpers in `used` are in use."""
        return self.code(used) if callable(self.code) else self.code


ShapeRule = Callable[[Any, ir.Prim, tuple[ir.TExpr, ...]], tuple[ir.Dim, ...]]  # typed operands
Emitter = Callable[[Any, ir.Prim, list[str], list[int]], str]
FlopRule = Callable[[Any, ir.Prim], Flops]
# (call, schedule, on the decode path) -> the names of the helpers its generated code calls
NeedsRule = Callable[[ir.Prim, "ir.Schedule | None", bool], tuple[str, ...]]


def always(*names: str) -> NeedsRule:
    """The needs of a primitive whose every call calls the helpers `names`."""
    return lambda prim, schedule, decoding: names


MemoryRule = Callable[..., Any]


class FailContext(Protocol):
    """The part of a ShapeContext that reports: `fail` records a located error and aborts."""

    def fail(self, span: Span, message: str, hint: str | None = None) -> NoReturn: ...


def same_shape(ctx, prim: ir.Prim, args: tuple[ir.TExpr, ...]) -> tuple[ir.Dim, ...]:
    """The default shape rule: the result has the first operand's shape (elementwise ops)."""
    return ir.tensor_type(args[0]).dims


@dataclass(frozen=True)
class Primitive:
    """One builtin: its signature and a rule for every stage that needs one."""

    name: str
    signature: Signature
    emit: Emitter
    shape: ShapeRule = same_shape
    flops: FlopRule | None = None  # None: no model FLOPs (norms, activations, gathers)
    memory: MemoryRule | None = None  # None: elementwise (the result is like its first operand)
    unused_params: Callable[[Any, ir.Prim], int] | None = None  # per token idle (routed experts)
    lower: Callable | None = None  # a custom AST -> IR lowering (einsum's spec string)
    check: Callable | None = None  # an extra build-time check of the static attributes
    helpers: tuple[Helper, ...] = ()  # helper functions its emitter may call (`ctx.use_helper`)
    # which of them a call needs (plan_functions records it; the emitter's calls must agree)
    needs: NeedsRule | None = None
    aux_loss: bool = False  # adds to the auxiliary training loss (threaded through the scan)
    uses_rng: bool = False  # needs a PRNG key (dropout)
    gathers: bool = False  # indexes its first operand (an embedding table) instead of multiplying
    see_through: bool = False  # keeps which parameter its first operand is (transpose, cast)
    contraction: bool = False  # a matmul-like contraction quantize_matmuls may run in fp8/int8
    scalar_operands: bool = False  # operands may be scalars (einsum checks its own)
    kernels: KernelRule | None = None  # select_kernels chooses a kernel for it
    internal: bool = False  # made by a pass, not callable from a spec (quantized)
    emits_operands: bool = True  # codegen emits the operands first (quantized emits its own)
    operands: Callable[[ir.Prim], tuple] | None = None  # what analyses evaluate (default: args)
    decoding: Decoding = Decoding.POSITIONWISE  # its part in the KV-cache decode path
    decode_check: Callable[[ir.Prim], str | None] | None = (
        None  # why this call cannot decode, or None
    )
    # context parallelism (passes/plan_context.py): it runs wherever the sequence is split,
    # in the order it is given, from the tokens' positions its emitter passes (rope, attention);
    # a primitive without it that reads positions rules out the zig-zag order
    takes_positions: bool = False
    # why this call cannot run per shard of a split sequence under the policy, or None
    context_check: Callable[[ir.Prim, ir.ContextPolicy], str | None] | None = None
    # its code may run in jax.shard_map (splash, context parallelism): inside a pipeline's
    # stages, whose vmap holds the `stage` axis, its layer is marked staged (plan_functions)
    shard_mapped: bool = False

    @property
    def has_kernels(self) -> bool:
        return self.kernels is not None


# ---------------------------------------------------------------------------- memory rules
# A memory rule is `rule(t, prim, args, dims, label) -> value`: `t` is the memory tracer
# (axdsl/analysis/trace.py: t.new(dims, dtype, label, inputs), t.view(...), t.internal(...),
# t.save(v) keeps v for the backward, t.promote(*vals), t.static(attr), t.seq), `args` the
# evaluated operands, `dims` the result dims. Residuals are modelled as jax 0.10 saves them
# (`jax.ad_checkpoint.print_saved_residuals`).


@dataclass(frozen=True)
class Saves:
    """What an elementwise function's backward reads (jax 0.10.2, measured with
    print_saved_residuals): its input, extra same-dtype tensors, extra bool tensors, its output."""

    input: bool = True
    same: int = 0
    bools: int = 0
    output: bool = False


def elementwise_memory(t, x, dims, label: str, saves: Saves | None, fn: str = ""):
    """The result of an elementwise function of `x`, saving what `saves` says (None: its input)."""
    out = t.new(dims, x.dtype, f"{label} {fn}" if fn else label, (x,))
    saves = saves or Saves()
    if saves.input:
        t.save(x)
    name = fn or label.rsplit(": ", 1)[-1]
    for _ in range(saves.same):
        t.save(t.internal(dims, x.dtype, f"{label} {name} residual", (x,)))
    for _ in range(saves.bools):
        t.save(t.internal(dims, "bool", f"{label} {name} mask", (x,)))
    if saves.output:
        t.save(out)
    return out


def saves_memory(saves: Saves) -> MemoryRule:
    """A memory rule for an elementwise primitive that saves `saves`."""
    return lambda t, prim, args, dims, label: elementwise_memory(t, args[0], dims, label, saves)


def linear_memory(t, prim, args, dims, label: str):
    """Sums, means, casts, rope: the backward needs none of the inputs."""
    return t.new(dims, args[0].dtype, label, (args[0],))


def view_memory(t, prim, args, dims, label: str):
    """A reshape or transpose: the same buffer, seen with other dims."""
    return t.view(dims, args[0], label)
