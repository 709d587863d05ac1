"""The facts of a model that Hugging Face interop compares: `Arch`, and how the spec states each.

An `Arch` holds what a Hugging Face config.json states (dims, heads, norm, rope, window,
feed-forward kind, experts, ...) as typed facts, plus every parameter's path, shape and dtype,
and the structure no HF family has (`problems`). `Facts` holds the facts every family states
and `AttentionFacts` those of std's Block and Attention; each family's own type extends one of
them (`Family.facts`: DecoderFacts in decoder_arch.py, MoeFacts in decoder.py, the others in
their family's module), and `FIELDS` says how the spec states every fact of every declared type.
This module sits below every other module of axdsl/hf: the families and the readers of the IR
build on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

F = TypeVar("F", bound="Facts")
G = TypeVar("G", bound="Facts")
FactsT = TypeVar("FactsT", bound="Facts", covariant=True)  # an Arch's facts type


def fact(spec: str) -> Any:
    """A fact, unknown (None) until a reader states it; `spec` is how the spec states it."""
    return field(default=None, metadata={"spec": spec})


@dataclass
class Facts:
    """The facts every model states that a Hugging Face config.json states, each a typed field:
    read from the spec's IR (the family's reader) or from a config.json (the family's rows). A fact
    is typed as the value its readers state; one no reader stated is None (an Optional type marks
    the facts that code reads while they may be unknown). `written` records the facts a reader
    stated (for comparing blocks).

    Each family declares its own type below this one (`Family.facts`: DecoderFacts, MoeFacts,
    DeepSeekFacts, Mamba2Facts, BertFacts, VitFacts, T5Facts, ...), which takes only its own facts.
    A bare `Facts` is the facts of a model no reader has typed yet (a reader's scratch, or one
    built by hand): it takes any fact a declared type has, though only its own are typed. Code that
    serves every family reads the others with `get`."""

    vocab: int = fact("vocab")
    dim: int = fact("dim")
    layers: int = fact("layers")
    heads: int = fact("heads")
    kv_heads: int = fact("kv_heads")
    head_dim: int = fact("attention head_dim")
    max_seq: int = fact("max_seq")
    positions: str = fact("positions")
    tied: bool = fact("tied")
    norm: str | None = fact("norm layer")
    norm_eps: float | None = fact("norm eps")
    norm_bias: bool | None = fact("LayerNorm bias")
    block: str = fact("block layer")
    causal: bool = fact("attention causal")
    rope: bool = fact("attention rope")
    attn_bias: bool = fact("attention bias")
    out_bias: bool = fact("attention out_bias")
    qk_norm: bool = fact("attention qk_norm")
    mlp: str | None = fact("feed-forward layer")
    hidden: int = fact("feed-forward hidden")
    act: str = fact("MLP act")
    mlp_bias: bool = fact("MLP bias")
    written: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.written.clear()  # the facts given to __init__ are not stated by a reader

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "written":
            if name not in _names(type(self)):
                raise AttributeError(f"{type(self).__name__} has no fact `{name}`")
            self.__dict__.setdefault("written", set()).add(name)
        object.__setattr__(self, name, value)

    if not TYPE_CHECKING:  # at run time only: to mypy, a bare Facts has its own facts alone

        def __getattr__(self, name: str) -> Any:
            """A bare Facts reads any declared type's fact, None until stated (a model of a root
            no family reads is exported, then refused, as llama's); a typed one only its own."""
            if type(self) is Facts and name in FIELDS:
                return None
            raise AttributeError(f"{type(self).__name__} has no fact `{name}`")

    def set(self, **facts: Any) -> None:
        """State several facts at once."""
        for name, value in facts.items():
            setattr(self, name, value)

    def update(self, other: Facts) -> None:
        """State every fact `other` states."""
        for name in other.written:
            setattr(self, name, getattr(other, name))

    def get(self, name: str) -> Any:
        """Fact `name` of any declared type: None when this model's type has not that fact (a
        Mamba-2 model has no attention window) or no reader stated it. For code that serves every
        family (comparing config.json with the spec, detection); a family's own code reads its
        type's fields."""
        if name not in FIELDS:
            raise AttributeError(f"no family has a fact `{name}`")
        return getattr(self, name, None)


@dataclass
class AttentionFacts(Facts):
    """std's Block of std's Attention: what ViT and every attention decoder state beyond `Facts`."""

    window: int = fact("attention window")
    scale: float = fact("attention scale")
    softcap: float = fact("attention softcap")
    post_norms: bool = fact("Block post_norms")


def declared(base: type[F]) -> list[type[F]]:
    """`base` and every type declared below it (the families' modules declare theirs)."""
    out = [base]
    for sub in base.__subclasses__():
        out += [t for t in declared(sub) if t not in out]
    return out


_OWN: dict[type[Facts], frozenset[str]] = {}


def _own(cls: type[Facts]) -> frozenset[str]:
    """The facts type `cls` has (its fields and its bases')."""
    if cls not in _OWN:
        _OWN[cls] = frozenset(f.name for f in fields(cls)) - {"written"}
    return _OWN[cls]


def _names(cls: type[Facts]) -> frozenset[str]:
    """The facts an instance of `cls` takes: its own; a bare Facts, any declared type's."""
    return frozenset(FIELDS) if cls is Facts else _own(cls)


class _Fields(Mapping[str, str]):
    """fact -> how the spec states it (for messages), over every declared type: made again when
    a type is declared, so a family's type counts from when its module is imported."""

    _cache: tuple[tuple[type[Facts], ...], dict[str, str]] = ((), {})

    def _table(self) -> dict[str, str]:
        types = tuple(declared(Facts))
        if self._cache[0] == types:
            return self._cache[1]
        out: dict[str, str] = {}
        for cls in types:
            for f in fields(cls):
                if f.name != "written" and out.setdefault(f.name, f.metadata["spec"]) != (
                    f.metadata["spec"]
                ):
                    raise AssertionError(f"two facts types state `{f.name}` differently")
        self._cache = (types, out)
        return out

    def __getitem__(self, name: str) -> str:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


FIELDS: Mapping[str, str] = _Fields()


def narrowest(base: type[F], read: Facts) -> F:
    """The facts a reader stated in its scratch `read`, as the smallest type declared below `base`
    that has every one of them (a DecoderLM of MoE blocks: MoeFacts). When none has them all (a
    pattern of blocks of two families, already a problem of the model's), the one that has the
    most; the facts it has not are dropped."""
    candidates = sorted(declared(base), key=lambda t: len(_own(t)))
    best = max(candidates, key=lambda t: len(read.written & _own(t)))  # first of the smallest
    out = best()
    for name in sorted(read.written & _own(best)):
        setattr(out, name, getattr(read, name))
    return out


@dataclass
class Arch(Generic[FactsT]):
    """What a spec's model is, read from its IR: the facts a Hugging Face config states (typed as
    the family's reader states them)."""

    name: str
    facts: FactsT
    params: dict[tuple[str, ...], tuple[tuple[int, ...], str]]  # path -> (shape, dtype name)
    problems: list[str] = field(default_factory=list)  # structure no HF family has
    root: str = ""  # the model's root layer (std's DecoderLM, BertMLM, VisionTransformer, T5)
    pattern: int = (
        0  # the length of a repeated pattern of blocks (blocks/0, blocks/1, ...); 0: one block
    )
    tail: int = (
        0  # layers after the scanned groups when the pattern does not divide them (blocks/tail/<e>)
    )

    def with_facts(self, facts: G) -> Arch[G]:
        """This model with `facts` (a reader's typed facts) for its own."""
        return Arch(
            self.name, facts, self.params, self.problems, self.root, self.pattern, self.tail
        )


def hv(inst: Any, name: str, default: Any = None) -> Any:
    """Hyperparameter `name` of an IR instance (`default` when it or the instance is absent)."""
    h = inst.hparam(name) if inst is not None else None
    return default if h is None else h.value.value


def at(root: Any, path: str) -> Any:
    """The instance at `path` (a/b/c) below `root`, or None."""
    inst = root
    for part in path.split("/"):
        inst = None if inst is None else inst.child(part)
    return inst
