"""`axdsl export-hf SPEC CKPT_DIR OUT_DIR`: an orbax checkpoint -> config.json + model.safetensors.

The family comes from the spec's structure (`family_of_arch`); the experts are written in the
per-expert (hub) layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from axdsl.hf.arch import Arch, load_spec, pick
from axdsl.hf.facts import Facts
from axdsl.hf.checkpoint import find_checkpoint, flatten, metadata_tree, restore_params
from axdsl.hf.config import FAMILIES, family_of_arch, hf_config, mismatches
from axdsl.hf.errors import HFError, exit_code, warn_capacity
from axdsl.hf.families import rules
from axdsl.hf.importer import IMPORT_INFO
from axdsl.hf.lora_merge import has_adapters, merge, restore_item, scale_of
from axdsl.hf.safetensors_io import need_safetensors
from axdsl.runtime.files import replace_file, replace_file_with


def export_hf(spec: Path, ckpt_dir: Path, out: Path, model: str | None = None) -> int:
    """`axdsl export-hf`: an orbax checkpoint -> config.json + model.safetensors. Returns the exit
    code."""
    return exit_code(_export_hf, Path(spec), Path(ckpt_dir), Path(out), model)


def _shape_problems(arch: Arch[Facts], stored: dict[tuple[str, ...], Any]) -> list[str]:
    out = []
    for p, (shape, _) in arch.params.items():
        if p not in stored:
            out.append(f"the checkpoint has no {'/'.join(p)}")
        elif tuple(stored[p].shape) != shape:
            out.append(
                f"{'/'.join(p)}: checkpoint shape {tuple(stored[p].shape)}, spec shape {shape}"
            )
    out += [
        f"the checkpoint's {'/'.join(p)} is not a parameter of the spec"
        for p in stored
        if p not in arch.params
    ]
    return out


def _checkpointed_model(
    archs: list[Arch[Facts]], model: str | None, spec: Path, path: Path, stored: dict
) -> Arch[Facts]:
    """The model `model`, whose shapes the checkpoint must have; by default the first that has
    them."""
    if model is not None:
        arch = pick(archs, model, spec)
        problems = _shape_problems(arch, stored)
        if problems:
            raise HFError(f"{path} is not a checkpoint of model `{arch.name}` of {spec}", problems)
        return arch
    found = [(a, _shape_problems(a, stored)) for a in archs]
    ok = [a for a, problems in found if not problems]
    if not ok:
        raise HFError(
            f"{path} matches no model of {spec}",
            [f"{a.name}: {p}" for a, problems in found for p in problems[:5]],
        )
    return ok[0]


def _check_out_dir(out: Path) -> None:
    taken = [p.name for p in out.glob("*.safetensors")] + [
        p.name for p in (out / "config.json", out / "model.safetensors.index.json") if p.exists()
    ]
    if taken:
        raise HFError(f"{out} already holds a model", [f"remove {', '.join(sorted(taken))} first"])


def _hf_tensors(
    family: str, arch: Arch[Facts], flat: dict[tuple[str, ...], np.ndarray]
) -> dict[str, np.ndarray]:
    """Every parameter as HF tensors (layer i of a stacked parameter as HF's layer i)."""
    tensors: dict[str, np.ndarray] = {}
    for r in rules(family, arch, None):
        if r.layered:
            for j, i in enumerate(
                r.layer_ids(arch.facts.layers)
            ):  # slice j of the stack is HF layer i
                tensors.update(r.save(tuple(flat[p][j] for p in r.paths), i))
        else:
            tensors.update(r.save(tuple(flat[p] for p in r.paths), 0))
    return {k: np.ascontiguousarray(a) for k, a in tensors.items()}


def _export_hf(spec: Path, ckpt_dir: Path, out: Path, model: str | None) -> None:
    need_safetensors()
    from safetensors.numpy import save_file

    archs = load_spec(spec)
    path, run_model = find_checkpoint(ckpt_dir)
    meta = metadata_tree(path.absolute())
    state = isinstance(meta.get("params"), dict) and ("opt_state" in meta or "step" in meta)
    stored = flatten(meta["params"] if state else meta)
    arch = _checkpointed_model(archs, model or run_model, spec, path, stored)
    family = family_of_arch(arch)
    cfg = hf_config(arch, family)
    problems = mismatches(arch, family, cfg)  # what the family cannot express
    if problems:
        raise HFError(f"model `{arch.name}` cannot be written as a {FAMILIES[family]}", problems)
    warn_capacity(arch, family)
    _check_out_dir(out)
    try:
        params = restore_params(path.absolute(), arch, stored, state)
    except (ValueError, OSError, KeyError) as exc:
        raise HFError(f"cannot read the orbax checkpoint {path}: {exc}") from None
    flat = {p: np.asarray(a) for p, a in flatten(params).items()}
    if has_adapters(meta):  # a LoRA run: its weights with the adapters merged in
        rank, alpha = scale_of(path.absolute(), spec)
        flat = merge(flat, flatten(restore_item(path.absolute(), meta, "lora")), alpha / rank)
        print(f"merged the LoRA adapters (rank {rank}, alpha {alpha:g}) into the weights")
    tensors = _hf_tensors(family, arch, flat)
    out.mkdir(parents=True, exist_ok=True)
    source = import_source(ckpt_dir)
    if source is not None:
        carried = carry_over(source, cfg, out)
        print(f"from {source}: {', '.join(carried)}" if carried else f"from {source}: nothing")
    replace_file_with(  # the new file gets 0666 less the umask (safetensors alone writes 0600)
        out / "model.safetensors",
        lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}),
    )
    replace_file(out / "config.json", json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    n = sum(int(a.size) for a in tensors.values())
    print(
        f"wrote {out / 'config.json'} and {out / 'model.safetensors'}: {n:,} parameters of "
        f"`{arch.name}` as {FAMILIES[family]}"
    )


# What a config.json's architecture does not say but a user of the exported model needs: its
# token ids, and the files beside it (generation defaults, the tokenizer).
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
CARRIED_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def import_source(ckpt_dir: Path) -> Path | None:
    """The Hugging Face directory a checkpoint's parameters came from, when it is still there:
    import.json beside an import-hf checkpoint, in a run fine-tuned from an HF directory, or
    beside the params checkpoint a run's init_from names (its run.json)."""
    places = [ckpt_dir, ckpt_dir.parent]
    try:
        init = json.loads((ckpt_dir / "run.json").read_text(encoding="utf-8"))["train"]["init_from"]
        places += [Path(init), Path(init).parent] if init else []
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for where in places:
        try:
            hf_dir = Path(json.loads((where / IMPORT_INFO).read_text(encoding="utf-8"))["hf_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return hf_dir if (hf_dir / "config.json").is_file() else None
    return None


def carry_over(source: Path, cfg: dict, out: Path) -> list[str]:
    """The source config.json's token ids into `cfg`, and its generation config and tokenizer
    files into `out` (byte for byte; a file already in `out` is left as it is); what was carried,
    by name."""
    carried = []
    try:
        original = json.loads((source / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        original = {}
    for key in TOKEN_KEYS:
        if isinstance(original, dict) and original.get(key) is not None:
            cfg[key] = original[key]
            carried.append(key)
    for name in CARRIED_FILES:
        if (source / name).is_file() and not (out / name).exists():  # never over a user's file
            replace_file(out / name, (source / name).read_bytes())
            carried.append(name)
    return carried
