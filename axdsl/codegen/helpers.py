"""Helper functions copied into generated code only when an emitted line calls them.

Each helper is defined by its primitive (`Primitive.helpers`, collected in `primitives.HELPERS`):
its source and the imports that source needs. The emitters record which helpers they call
(`FunctionEmitter.use_helper`); `select` returns the source of those, in a fixed order, and their
imports, so nothing is found by searching rendered text and nothing here names a primitive.
"""

from __future__ import annotations

from axdsl import primitives


def select(used: set[str]) -> tuple[list[str], set[str]]:
    """(sources, import lines) of the helpers in `used`: by section (small functions first, whole
    layers last), then by name. A helper whose source depends on the others in use sees them all."""
    unknown = used - set(primitives.HELPERS)
    assert not unknown, f"emitters used undefined helpers {sorted(unknown)}"
    chosen = sorted((primitives.HELPERS[n] for n in used), key=lambda h: (h.section, h.name))
    names = frozenset(used)
    imports = {line for h in chosen for line in h.imports}
    return [h.source(names) for h in chosen], imports
