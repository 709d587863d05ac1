"""Orbax params checkpoints: nest/flatten parameter paths, write one (import), find and read one
(export).

The checkpoint `import-hf` writes is a params-only orbax checkpoint (`ocp.StandardCheckpointer`)
whose tree is the tree of the generated `init_params(cfg, key)`. `export-hf` reads such a
checkpoint or a `train.py` run (its "state" item's `params`).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from axdsl.checkpoints import good_steps
from axdsl.hf.facts import Arch, Facts
from axdsl.hf.errors import HFError


def nest(flat: dict[tuple[str, ...], Any]) -> dict:
    """path -> array, as the nested dicts of `init_params`."""
    tree: dict = {}
    for path, a in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = a
    return tree


def flatten(tree: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Nested dicts -> path -> leaf (the inverse of `nest`)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def save_params(out: Path, tree: dict) -> None:
    """Write `tree` (numpy arrays) as an orbax StandardCheckpointer checkpoint at `out`."""
    import jax
    import orbax.checkpoint as ocp

    quiet_orbax()
    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    tree = jax.tree.map(lambda a: jax.device_put(a, one), tree)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(out, tree)
        ckptr.wait_until_finished()


def find_checkpoint(ckpt: Path) -> tuple[Path, str | None]:
    """The orbax pytree directory to read, and the model a run's run.json names (if any)."""
    if not ckpt.exists():
        raise HFError(f"{ckpt} does not exist")
    if (ckpt / "_METADATA").exists():
        return ckpt, None  # a params checkpoint, or a run step's "state" item
    if (ckpt / "state" / "_METADATA").exists():
        return ckpt / "state", None  # one step of a train.py run
    run_model = None
    base = ckpt
    if (ckpt / "run.json").exists():
        try:
            info = json.loads((ckpt / "run.json").read_text(encoding="utf-8"))
            run_model = info.get("model")
            base = ckpt / info.get("train", {}).get("checkpoint_dir", "checkpoints")
        except (OSError, ValueError, AttributeError):
            base = ckpt / "checkpoints"
    elif (ckpt / "checkpoints").is_dir():
        base = ckpt / "checkpoints"
    steps = good_steps(base, lambda m: print(f"axdsl: warning: {m}", file=sys.stderr))
    if not steps:
        raise HFError(
            f"no complete, undamaged orbax checkpoint found in {ckpt}",
            [
                "give a params checkpoint (import-hf's output), a train.py run directory, "
                "its checkpoints/ directory or one step directory"
            ],
        )
    return base / str(steps[0]) / "state", run_model


def _no_missing_metadata_warning(record: logging.LogRecord) -> bool:
    """absl's log filter: drop orbax's "Metadata file does not exist" about a train state's item
    directory (train.py's CheckpointManager keeps that file a level up), a warning a user of
    export-lora and export-hf can do nothing about."""
    return not str(record.msg).startswith("Metadata file does not exist")


def quiet_orbax() -> None:
    """Install _no_missing_metadata_warning once."""
    log = logging.getLogger("absl")
    if _no_missing_metadata_warning not in log.filters:
        log.addFilter(_no_missing_metadata_warning)


def metadata_tree(path: Path) -> dict:
    """The stored tree of an orbax checkpoint (shapes and dtypes, no arrays read)."""
    import orbax.checkpoint as ocp

    quiet_orbax()

    meta = ocp.StandardCheckpointer().metadata(path)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    if not isinstance(tree, dict):
        raise HFError(f"cannot read the tree of the orbax checkpoint {path}")
    return tree


def restore_params(
    path: Path, arch: Arch[Facts], stored: dict[tuple[str, ...], Any], state: bool
) -> dict:
    """Read the parameters (of a train state: only its params) onto the CPU, in the stored
    dtypes."""
    import jax
    import orbax.checkpoint as ocp

    quiet_orbax()
    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    flat = {
        p: jax.ShapeDtypeStruct(shape, stored[p].dtype if p in stored else dtype, sharding=one)
        for p, (shape, dtype) in arch.params.items()
    }
    abstract = nest(flat)
    if state:  # a train state: read only its params
        abstract = {"params": abstract}
        args = ocp.args.PyTreeRestore(
            item=abstract,
            partial_restore=True,
            restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        )
        with ocp.PyTreeCheckpointer() as ckptr:
            return ckptr.restore(path, args=args)["params"]
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path, abstract)
