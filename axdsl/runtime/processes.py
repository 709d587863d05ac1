"""Multi-host start (jax.distributed), the persistent compile cache, and which process leads.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import argparse
import os
from pathlib import Path

import jax


def set_compile_cache(args: argparse.Namespace) -> None:
    """Cache compiled programs on disk, so that a restart loads the train step instead of
    compiling."""
    if args.compile_cache == "none" or (
        not args.compile_cache and os.environ.get("JAX_COMPILATION_CACHE_DIR")
    ):
        return
    cache = Path(args.compile_cache) if args.compile_cache else args.out / "compile_cache"
    jax.config.update("jax_compilation_cache_dir", str(cache.absolute()))


def join_processes(args: argparse.Namespace) -> None:
    """Join the other processes of a multi-process run, before any other JAX call.

    With --coordinator the flags say where and who; under srun with several tasks or on a
    multi-host TPU VM, `jax.distributed.initialize()` reads the cluster's environment itself.
    """
    cluster = int(os.environ.get("SLURM_NTASKS", "1")) > 1 or "," in os.environ.get(
        "TPU_WORKER_HOSTNAMES", ""
    )
    if args.coordinator or cluster:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)


def is_lead() -> bool:
    """Whether this is process 0, the one that prints and writes run.json and metrics.jsonl."""
    return jax.process_index() == 0
