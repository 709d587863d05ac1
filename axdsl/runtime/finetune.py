"""Fine-tuning: parameters loaded from another run's checkpoint (checked against this model's
tree), and the labels that freeze parameters by glob pattern.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import fnmatch
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from axdsl.runtime.checkpoints import checkpoint_problem


def init_from_path(tc, spec: str, from_flag: bool) -> Path:
    """Where tc.init_from is: relative to the spec's directory when the spec names it, to the
    working directory when --init-from does (as data_path)."""
    path = Path(tc.init_from)
    return path if from_flag or path.is_absolute() else Path(spec).parent / path


def _newest_good_step(path: Path) -> Path | None:
    """A train.py run's step directory to read parameters from: `path` itself (one step), or the
    newest intact step of a run directory or its checkpoints/ directory; None when `path` is not
    a run's.
    """
    if (path / "state").is_dir():
        return path
    checkpoints = path / "checkpoints" if (path / "run.json").exists() else path
    steps = sorted((int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()), reverse=True)
    for step in steps:
        problem = checkpoint_problem(checkpoints / str(step))
        if problem is None:
            return checkpoints / str(step)
        print(f"init_from: skipping checkpoint {step}: {problem}", file=sys.stderr)
    if steps:
        sys.exit(f"error: init_from {path}: no intact checkpoint among steps {steps}")
    return None


def _tree_mismatch(stored, abstract: dict) -> str | None:
    """The first parameter whose path, shape or dtype differs between a checkpoint and the model."""
    got = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(stored)}
    want = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(abstract)}
    for key in sorted(want.keys() | got.keys()):
        if key not in got:
            return f"it has no parameter {key}"
        if key not in want:
            return f"it has a parameter {key} the model does not"
        if tuple(got[key].shape) != tuple(want[key].shape) or np.dtype(got[key].dtype) != np.dtype(
            want[key].dtype
        ):
            return (
                f"{key} is {np.dtype(got[key].dtype).name}{list(got[key].shape)} there, "
                f"{np.dtype(want[key].dtype).name}{list(want[key].shape)} in the model"
            )
    return None


def load_params(tc, spec: str, from_flag: bool, abstract: dict) -> dict:
    """The parameters a fine-tuning run starts from (tc.init_from), placed as `abstract` says:
    a params checkpoint (what `axdsl import-hf` writes) or a train.py run (its directory, its
    checkpoints/ or one step; only the params of its newest intact step are read). Their paths,
    shapes and dtypes must be the model's; what differs is named."""
    path = init_from_path(tc, spec, from_flag)
    where = (
        f"{tc.init_from!r} from --init-from"
        if from_flag
        else f"{tc.init_from!r} in {spec}, relative to its directory"
    )
    if not path.is_dir():
        sys.exit(f"error: init_from {path} is not a directory ({where})")
    if (path / "config.json").exists():
        sys.exit(
            f"error: init_from {path} is a Hugging Face model: "
            f"`axdsl train SPEC --init-from {path}` converts it, "
            f"or `axdsl import-hf SPEC {path}` writes a params checkpoint to start from"
        )
    step = _newest_good_step(path)
    source, item = (step / "state", {"params": abstract}) if step is not None else (path, abstract)
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        stored = checkpointer.metadata(source).item_metadata.tree
    except Exception as exc:  # orbax raises many types for what is not a checkpoint
        sys.exit(
            f"error: init_from {source} is not an orbax checkpoint: "
            f"{str(exc).splitlines()[0][:300]}"
        )
    if step is not None and stored.get("lora"):  # its params are the base, without adapters
        sys.exit(
            f"error: init_from {path} is a LoRA run: its checkpoint holds the base weights and "
            "the adapters apart, and starting from the base alone would drop what it learned; "
            f"merge them first, `axdsl export-lora SPEC {path} --merge --out DIR`, and start "
            "from DIR"
        )
    stored = stored["params"] if step is not None else stored
    if problem := _tree_mismatch(stored, abstract):
        sys.exit(f"error: init_from {source} does not fit model {tc.model}: {problem}")
    args = jax.tree.map(
        lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, dtype=a.dtype), abstract
    )
    restore = ocp.args.PyTreeRestore(
        item=item,
        restore_args=args if step is None else {"params": args},
        partial_restore=step is not None,
    )
    params = checkpointer.restore(source, args=restore)
    print(f"starting from the parameters in {source}", file=sys.stderr)
    return params["params"] if step is not None else params


def param_path(path) -> str:
    """A jax tree path as a parameter path: `blocks/attn/wq`."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def freeze_labels(patterns: str, balance: dict | None = None):
    """optax.multi_transform's labels for tc.freeze (comma-separated globs over parameter paths such
    as `embed/table` or `blocks/attn/*`): "frozen" where a pattern matches, "balance RATE" for a
    path of `balance` (MoE selection biases, path -> rate) that is not frozen, else "train"."""
    globs = [g.strip() for g in patterns.split(",") if g.strip()]
    balance = balance or {}

    def labels(params):
        def label(path, _):
            name = param_path(path)
            if any(fnmatch.fnmatchcase(name, g) for g in globs):
                return "frozen"
            return f"balance {balance[name]}" if name in balance else "train"

        return jax.tree_util.tree_map_with_path(label, params)

    return labels
