"""The helper a pipelined model calls (plan_pipeline), which no primitive owns.

Like FUSED_CROSS_ENTROPY (loss_fn's) and CONTEXT_ORDER_HELPER (a balanced root's reorder), it is
recorded by plan_functions from the schedule, not from a call's registry entry: the root's call
of its main repeat prints `pipeline(...)` when the target asks for pipeline(...). Its source is
axdsl/kernels/pipeline.py, copied into kernels.py; `primitives.HELPERS` lists it with the
primitives' helpers.
"""

from __future__ import annotations

from axdsl.primitives.base import Helper, HelperSection, Source

PIPELINE_HELPER = Helper(
    "pipeline",
    Source(
        "pipeline",
        ("pipeline", "_per_layer", "_aux_loss", "_stage_weights", "_mesh_has", "_constrain"),
    ),
    (
        "from collections.abc import Callable",
        "import jax",
        "import jax.numpy as jnp",
        "from jax.sharding import PartitionSpec as P",
    ),
    HelperSection.LAYER,
)
