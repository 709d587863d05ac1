"""unroll_repeats: mark the repeated children that run as an unrolled loop on this target.

    unroll(16)   (the cpu profile's default)   a repeat of at most 16 layers is unrolled
    unroll(0)    (every other profile)          every repeat stays a rolled jax.lax.scan

    before:  /blocks : Block x2 remat(none)
    after:   /blocks : Block x2 remat(none) unrolled

Codegen emits `jax.lax.scan(step, x, params["blocks"], unroll=True)` for a marked child: the same
scan over the same stacked parameters, so the numerics do not move, but XLA sees straight-line
code. On a CPU, which runs one op at a time, the rolled loop buys only compile time and costs a
step: the backward's residuals go into [steps, ...] buffers that are zero-filled before the first
layer and written and read a slice at a time. Compile time grows with the layers unrolled, hence
the bound, counted in layers: `repeat(26, [Local(), Global()])` runs 13 steps of 2 layers, 26.

The models of one spec share their generated layer code, so a repeat is unrolled only when it has
at most `unroll` layers in every model of the spec (a 2-layer test model beside its 32-layer
original keeps the scan, as the original must).
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.ir import nodes as ir


def unroll_repeats(module: ir.Module) -> ir.Module:
    layers: dict[str, int] = {}  # a repeated child's path -> its most layers over the spec's models
    for model in module.models:
        for inst in model.root.walk():
            if inst.repeat is not None:
                n = int(inst.repeat.value) * (len(inst.children) if inst.pattern else 1)
                layers[inst.path] = max(layers.get(inst.path, 0), n)
    unrolled = {path for path, n in layers.items() if module.target.unrolls(n)}
    models = tuple(replace(m, root=_mark(m.root, unrolled)) for m in module.models)
    return replace(module, models=models)


def _mark(inst: ir.Instance, unrolled: set[str]) -> ir.Instance:
    children = tuple(_mark(c, unrolled) for c in inst.children)
    return replace(inst, children=children, unrolled=inst.path in unrolled)
