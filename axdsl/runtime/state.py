"""The train state's shardings and its abstract (shape-only) tree, which checkpoints restore into.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import jax
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def state_shardings(optimizer, params: dict, param_specs: dict, mesh) -> dict:
    """Shardings of the train state {params, opt_state, step, bad_steps}: optimizer moments follow
    their parameters (`params` may be abstract), everything else replicates."""
    opt_state = jax.eval_shape(optimizer.init, params)
    opt_specs = optax.tree_map_params(  # a moment shaped like its parameter shares its layout
        optimizer,
        lambda leaf, spec, param: (
            leaf
            if isinstance(leaf, optax.MaskedNode)
            else spec if leaf.shape == param.shape else P()
        ),
        opt_state,
        param_specs,
        params,
        transform_non_params=lambda _: P(),
        is_leaf=lambda x: isinstance(
            x, (P, optax.MaskedNode)
        ),  # MaskedNode: a frozen parameter's (no) state
    )
    state = {"params": param_specs, "opt_state": opt_specs, "step": P(), "bad_steps": P()}
    return jax.tree.map(lambda s: NamedSharding(mesh, s), state, is_leaf=lambda x: isinstance(x, P))


def abstract(new_state, shardings: dict) -> dict:
    """The shapes, dtypes and shardings of `new_state(key)`, without allocating (restore, AOT)."""
    shapes = jax.eval_shape(new_state, jax.random.key(0))
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )
