"""Code for the attention kernel that select_kernels chose: one call, no backend branching."""

from __future__ import annotations


def emit_attention(kernel: str, q: str, k: str, v: str, mask: str | None, causal: str,
                   window: str | None, note: str) -> tuple[str, str]:
    """(expression, comment) for one attention call; the comment says why others were not used."""
    if kernel == "splash":
        raise NotImplementedError("splash attention emission")  # filled in with the splash helper
    kwargs = [f"is_causal={causal}"]
    if mask is not None:
        kwargs.append(f"mask={mask}")
    if window is not None:
        kwargs.append(f"local_window_size=({window} - 1, 0)")
    kwargs.append(f'implementation="{kernel}"')
    return f"jax.nn.dot_product_attention({q}, {k}, {v}, {', '.join(kwargs)})", note


HELPERS: dict[str, str] = {}
# Import lines a helper needs, added when the module alias they bind (last word) is used.
IMPORTS: tuple[str, ...] = ()
