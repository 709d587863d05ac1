"""`axdsl import-hf SPEC HF_DIR`: Hugging Face safetensors -> an orbax params checkpoint.

config.json is checked against the spec's models before any tensor is read; then every axdsl
parameter must be filled and every HF tensor used (a tied `lm_head` equal to the embedding and
HF's non-parameter buffers excepted).
"""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from axdsl.hf.arch import Arch, load_spec, pick
from axdsl.hf.facts import Facts
from axdsl.hf.checkpoint import nest, save_params
from axdsl.hf.config import FAMILIES, family_of_config, mismatches
from axdsl.hf.errors import HFError, exit_code, warn_capacity
from axdsl.hf.families import get, rules
from axdsl.hf.family import Family
from axdsl.hf.layout import BUFFERS, Rule
from axdsl.hf.safetensors_io import Reader, need_safetensors
from axdsl.runtime.files import replace_file


def import_hf(spec: Path, hf_dir: Path, model: str | None = None, out: Path | None = None) -> int:
    """`axdsl import-hf`: HF safetensors -> an orbax params checkpoint. Returns the exit code."""
    return exit_code(
        _import_hf, Path(spec), Path(hf_dir), model, None if out is None else Path(out)
    )


def _read_config(hf_dir: Path) -> dict:
    path = hf_dir / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"), parse_constant=_not_finite)
    except FileNotFoundError:
        raise HFError(f"{path} not found: is {hf_dir} a Hugging Face model directory?") from None
    except (OSError, ValueError) as exc:
        raise HFError(f"cannot read {path}: {exc}") from None
    if not isinstance(cfg, dict):  # a list was an AttributeError (exit 70)
        raise HFError(f"{path} is not a JSON object: is {hf_dir} a Hugging Face model directory?")
    return cfg


def _not_finite(name: str) -> float:
    """json's hook for NaN and Infinity, which no config field means (rope_theta NaN imported)."""
    raise ValueError(f"it holds {name}, not a finite number")


def _load_rule(r: Rule, reader: Reader, layers: int) -> tuple[np.ndarray, ...]:
    """The arrays of one rule (layered ones stacked over the layers). Raises KeyError,
    ValueError."""
    if not r.layered:
        return r.load(reader.get, 0)
    per_layer = [r.load(reader.get, i) for i in r.layer_ids(layers)]
    return tuple(np.stack([pl[j] for pl in per_layer]) for j in range(len(r.paths)))


def _map_tensors(arch: Arch[Facts], rs: list[Rule], reader: Reader) -> tuple[dict, list[str]]:
    """Every rule's arrays, in the parameters' dtypes; and what did not map."""
    import jax.numpy as jnp

    out: dict[tuple[str, ...], np.ndarray] = {}
    problems: list[str] = []
    for r in rs:
        names = ", ".join("/".join(p) for p in r.paths)
        try:
            arrays = _load_rule(r, reader, arch.facts.layers)
        except KeyError as exc:
            problems.append(f"missing tensor {exc.args[0]} (for {names})")
            continue
        except ValueError as exc:
            problems.append(f"cannot map to {names}: {exc}")
            continue
        for p, a in zip(r.paths, arrays, strict=True):
            shape, dtype = arch.params[p]
            if tuple(a.shape) != shape:
                problems.append(
                    f"{'/'.join(p)}: the HF tensors give shape {tuple(a.shape)}, "
                    f"the spec expects {shape}"
                )
                continue
            out[p] = np.asarray(a).astype(jnp.dtype(dtype))
        reader.cache.clear()
    return out, problems


def _skipped(family: Family, key: str) -> bool:
    """A tensor of a related checkpoint the family's model has not (BertForPreTraining's pooler)."""
    return family.skipped is not None and family.skipped.search(key) is not None


def _leftovers(
    family: Family, arch: Arch[Facts], rs: list[Rule], reader: Reader, out: dict
) -> list[str]:
    """A tied head that differs from the table, unfilled parameters and unused HF tensors."""
    problems = []
    keys = set(reader.where)
    tied = family.tied_head
    if arch.facts.tied and tied in keys:  # a tied head saved anyway: it must be the table
        head = reader.get(tied)
        table = out.get(("embed", "table"))
        if table is not None and not np.array_equal(head.astype(table.dtype), table):
            problems.append(f"{tied} differs from the token embedding, but the spec ties them")
    for p in arch.params:
        if p not in out and not any(p in r.paths for r in rs):
            problems.append(f"no HF tensor maps to the spec's parameter {'/'.join(p)}")
    skipped = sorted(k for k in keys - reader.used if _skipped(family, k))
    if skipped:
        print(
            f"note: skipped {len(skipped)} tensors {family.hf_class} does not have"
            f"{family.skipped_what}: "
            f"{', '.join(skipped)}",
            file=sys.stderr,
        )
    unused = sorted(
        k for k in keys - reader.used if not BUFFERS.search(k) and not _skipped(family, k)
    )
    problems += [
        f"HF tensor {k} {list(reader.where[k].get_slice(k).get_shape())} maps to no "
        f"parameter of the spec"
        for k in unused
    ]
    return problems


def convert_from_hf(
    arch: Arch[Facts], family: str, hf_dir: Path
) -> dict[tuple[str, ...], np.ndarray]:
    """Read and map every tensor: path -> array in the parameter's dtype. Raises HFError."""
    with ExitStack() as stack:
        reader = Reader(hf_dir, stack)
        rs = rules(family, arch, set(reader.where))
        out, problems = _map_tensors(arch, rs, reader)
        problems += _leftovers(get(family), arch, rs, reader, out)
        if problems:
            raise HFError(
                f"the tensors in {hf_dir} do not fill the spec's model `{arch.name}`", problems
            )
    return out


def _matching_model(
    archs: list[Arch[Facts]], model: str | None, spec: Path, hf_dir: Path, family: str, cfg: dict
) -> Arch[Facts]:
    """The model `model`, which config.json must match; by default the first that matches."""
    if model is not None:
        arch = pick(archs, model, spec)
        problems = mismatches(arch, family, cfg)
        if problems:
            raise HFError(
                f"{hf_dir / 'config.json'} ({family}) does not match model `{arch.name}` "
                f"of {spec}",
                problems,
            )
        return arch
    found = [(a, mismatches(a, family, cfg)) for a in archs]
    ok = [a for a, problems in found if not problems]
    if not ok:
        details = [f"{a.name}: {p}" for a, problems in found for p in problems]
        raise HFError(f"{hf_dir / 'config.json'} ({family}) matches no model of {spec}", details)
    return ok[0]


IMPORT_INFO = (
    "import.json"  # beside the params checkpoint: what `axdsl sample` needs to rebuild the model
)


def write_import_info(out: Path, spec: Path, model: str, hf_dir: Path) -> None:
    """Record the spec, model and source of an import beside `out`, so `axdsl sample DIR` can
    build the model and read the parameters without being told them again."""
    import json

    info = {
        "spec": str(spec.absolute()),
        "model": model,
        "hf_dir": str(hf_dir.absolute()),
        "params": out.name,
    }
    replace_file(out.parent / IMPORT_INFO, json.dumps(info, indent=2) + "\n")


def _import_hf(spec: Path, hf_dir: Path, model: str | None, out: Path | None) -> None:
    need_safetensors()
    archs = load_spec(spec)
    cfg = _read_config(hf_dir)
    family = family_of_config(cfg)
    arch = _matching_model(archs, model, spec, hf_dir, family, cfg)
    warn_capacity(arch, family)
    out = (out if out is not None else Path("runs") / f"{spec.stem}-hf" / "params").absolute()
    if out.exists():
        raise HFError(f"{out} already exists", ["remove it or choose another --out"])
    arrays = convert_from_hf(arch, family, hf_dir)
    save_params(out, nest(arrays))
    write_import_info(out, spec, arch.name, hf_dir)
    n = sum(int(np.prod(a.shape)) for a in arrays.values())
    print(f"wrote {out}: {n:,} parameters of `{arch.name}` from {hf_dir} ({FAMILIES[family]})")
