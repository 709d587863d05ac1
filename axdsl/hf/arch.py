"""The spec's side of Hugging Face interop: what a spec's model is, read from its IR.

`arch_of` reads a model's parameters and hands its root instance to the reader of the family
registry's entry for that root layer (std's DecoderLM, BertMLM, VisionTransformer or T5); the
`Arch` it fills (axdsl/hf/facts.py) holds the facts a Hugging Face config.json states.
"""

from __future__ import annotations

from pathlib import Path
from axdsl.hf.errors import HFError
from axdsl.hf.facts import FIELDS, Arch, Facts
from axdsl.hf.families import roots


def _param_tree(root) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    """Every parameter as path -> (full shape, dtype), in the nesting of `init_params`."""
    out = {}
    for inst in root.walk():
        base = tuple(p for p in inst.path.split("/") if p)
        for p in inst.params:
            out[base + (p.name,)] = (tuple(d.size for d in p.full_dims), p.dtype.jnp)
    return out


def arch_of(model) -> Arch[Facts]:
    """The Arch of one IR model (an `ir.Model` after stack_repeats)."""
    root = model.root
    arch = Arch(model.name, Facts(), _param_tree(root), root=root.layer)
    read = roots().get(root.layer)
    if read is None:
        names = list(roots())
        arch.problems.append(
            f"the model is a {root.layer}; Hugging Face interop needs std's "
            f"{', '.join(names[:-1])} or {names[-1]}"
        )
        return arch
    return read(arch, root)


def load_spec(spec: Path) -> list[Arch[Facts]]:
    """The Arch of every model of a spec (compiled for cpu, up to stack_repeats)."""
    from axdsl.pipeline import compile_spec

    module = compile_spec(Path(spec), "cpu", after="stack_repeats")
    return [arch_of(m) for m in module.models]


def pick(archs: list[Arch[Facts]], name: str | None, spec: Path) -> Arch[Facts]:
    """The model called `name`; HFError naming the spec's models when there is none."""
    names = [a.name for a in archs]
    for a in archs:
        if a.name == name:
            return a
    raise HFError(f"{spec} has no model `{name}`", [f"its models: {', '.join(names)}"])


__all__ = ["FIELDS", "Arch", "arch_of", "load_spec", "pick"]
