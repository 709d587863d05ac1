"""choose_update_skip: the form in which the generated train step skips a non-finite update.

Both forms keep the old parameters and optimizer state, bit for bit, when the loss or the gradient
norm is not finite; they differ only in what the compiler keeps in memory, which is measured per
platform (analysis/platforms.py `update_skip`, `cond_update`, `select_update`):

    cond     jax.lax.cond(ok, update, keep, params, opt_state): only the taken branch runs.
             XLA:CPU and XLA:TPU write the update over the donated state in place; XLA:GPU
             makes the new parameters and both Adam moments beside the old ones and copies
             them back (llama 3 8B on 8 H100s: +11.2 GiB a GPU).
    select   jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old): the update always runs,
             then each leaf is selected. XLA:GPU fuses the select into the update's elementwise
             loop and writes in place (the same 8B step: 14.99 -> 10.74 GiB of temporaries);
             XLA:CPU keeps about 0.57 of (parameters + moments) live before the select.

    before:  schedule gpu-h100-8: ... (update_skip cond, the default)
    after:   schedule gpu-h100-8: ...
               update_skip(select)  # choose_update_skip: ...

It runs before fit_remat, whose memory estimates include the update.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.analysis.platforms import facts
from axdsl.ir import nodes as ir


def choose_update_skip(module: ir.Module) -> ir.Module:
    """Record the platform's cheaper form of the skipped update on the schedule."""
    skip = facts(module.target.kind).update_skip
    if skip is module.target.update_skip:
        return module
    return replace(module, schedule=replace(module.target, update_skip=skip))
