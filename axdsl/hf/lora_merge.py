"""LoRA runs' checkpoints: read the adapters of a train state and merge them into the weights.

A run trained with `lora(...)` stores its train state as {params (the frozen base), lora
(adapters {path: {a: A [..., in, rank], b: B [..., rank, out]}}), opt_state, step, bad_steps}.
Merged, each target is W + (alpha / rank) * (A @ B) reshaped to W's shape, as train.py's
`merge_adapters` computes it; `export-hf` writes merged weights, and `axdsl export-lora` writes
the adapters alone or a merged params checkpoint (what `import-hf` writes: `--init-from` and
`export-hf` read it).

    axdsl export-lora SPEC RUN OUT [--merge]

The scale alpha / rank is read from the run's run.json (train.lora_alpha, train.lora_rank) when
the checkpoint is inside a run, else from the spec's train block.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from axdsl.hf.checkpoint import (
    find_checkpoint,
    flatten,
    metadata_tree,
    nest,
    quiet_orbax,
    save_params,
)
from axdsl.hf.errors import HFError, exit_code
from axdsl.runtime.files import replace_file


def has_adapters(meta: dict) -> bool:
    """Whether a checkpoint's stored tree is a LoRA train state."""
    return isinstance(meta.get("lora"), dict) and isinstance(meta.get("params"), dict)


def restore_item(path: Path, meta: dict, key: str) -> dict:
    """One item (`params` or `lora`) of a stored train state, as numpy arrays on the CPU."""
    import jax
    import orbax.checkpoint as ocp

    quiet_orbax()
    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    abstract = {
        key: jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one), meta[key]
        )
    }
    args = ocp.args.PyTreeRestore(
        item=abstract,
        partial_restore=True,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
    )
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.restore(path, args=args)[key]
    return jax.tree.map(np.asarray, tree)


def merge(
    params: dict[tuple[str, ...], np.ndarray],
    adapters: dict[tuple[str, ...], np.ndarray],
    scale: float,
) -> dict[tuple[str, ...], np.ndarray]:
    """Flat params with each adapted W replaced by W + scale * (A @ B), in W's dtype."""
    out = dict(params)
    for key in {k[:-1] for k in adapters}:
        a, b, w = adapters[key + ("a",)], adapters[key + ("b",)], params[key]
        delta = np.matmul(a.astype(np.float32), b.astype(np.float32)).reshape(w.shape)
        out[key] = (w.astype(np.float32) + scale * delta).astype(w.dtype)
    return out


def scale_of(path: Path, spec: Path) -> tuple[int, float]:
    """(rank, alpha) the run trained with: its run.json, else the spec's train block."""
    for parent in [path, *path.parents][:5]:
        run = parent / "run.json"
        if run.exists():
            try:
                train = json.loads(run.read_text(encoding="utf-8")).get("train", {})
            except (OSError, ValueError):
                break
            if "lora_rank" in train:
                return int(train["lora_rank"]), float(train["lora_alpha"])
            break
    from axdsl.errors import CompileError
    from axdsl.pipeline import compile_spec

    try:
        settings = dict(compile_spec(spec, "cpu").train.settings).get("lora")
    except CompileError as exc:
        raise HFError(f"cannot read the lora(...) settings of {spec}: {exc}") from None
    if settings is None:
        raise HFError(
            f"{path} holds LoRA adapters but neither its run.json nor {spec} says their scale",
            ["add the run's lora(rank = ..., alpha = ...) to the spec's train block"],
        )
    return settings.value.rank, settings.value.alpha


def merged_params(path: Path, meta: dict, spec: Path) -> dict[tuple[str, ...], np.ndarray]:
    """A LoRA train state's weights with the adapters merged in, flat by path."""
    rank, alpha = scale_of(path, spec)
    params = flatten(restore_item(path, meta, "params"))
    return merge(params, flatten(restore_item(path, meta, "lora")), alpha / rank)


def export_lora(spec: Path, ckpt: Path, out: Path, merge_weights: bool = False) -> int:
    """`axdsl export-lora`: a LoRA run's adapters alone, or its merged weights. Returns the exit
    code."""
    return exit_code(_export_lora, Path(spec), Path(ckpt), Path(out), merge_weights)


def _export_lora(spec: Path, ckpt: Path, out: Path, merge_weights: bool) -> None:
    path, _ = find_checkpoint(ckpt)
    path = path.absolute()
    meta = metadata_tree(path)
    if not has_adapters(meta):
        raise HFError(
            f"{path} has no LoRA adapters", ["give a run trained with lora(...) in its train block"]
        )
    if out.exists() and any(out.iterdir()):
        raise HFError(f"{out} exists and is not empty", ["choose a new directory"])
    rank, alpha = scale_of(path, spec)
    tree: Any
    if merge_weights:
        tree = nest(merged_params(path, meta, spec))
        what = "merged weights (a params checkpoint: --init-from and export-hf read it)"
    else:
        tree = restore_item(path, meta, "lora")
        what = f"adapters alone (rank {rank}, alpha {alpha:g}; lora.json says so)"
    save_params(out.absolute(), tree)
    if not merge_weights:
        targets = sorted("/".join(k[:-1]) for k in flatten(tree) if k[-1] == "a")
        lora = {"rank": rank, "alpha": alpha, "targets": targets}
        replace_file(out / "lora.json", json.dumps(lora, indent=2) + "\n")
    n = sum(int(a.size) for a in flatten(tree).values())
    print(f"wrote {out}: {n:,} parameters, {what}")
