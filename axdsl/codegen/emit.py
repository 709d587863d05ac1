"""Emit `model.py` for one module: collect layer functions, the config, init and axes trees.

Each layer type becomes one function; instances whose resolved code differs (say two RMSNorms
with different eps literals) get numbered variants. Every model of a spec must share one
structure, since they share the functions and differ only in `Config` values.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from axdsl import __version__, resources
from axdsl.codegen import kernels, quant
from axdsl.codegen.expressions import FunctionEmitter
from axdsl.codegen.helpers import HELPERS
from axdsl.codegen.names import py_str, snake
from axdsl.errors import CompileError, Diagnostic
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import DType
from axdsl.ir.printer import value_text
from axdsl.ir.rewrite import prims_of
from axdsl import primitives
from axdsl.passes.annotate_sharding import dim_axes, spec_text


@dataclass
class LayerFunction:
    name: str
    layer: str
    args: str
    rng: bool
    body: list[str]
    doc: str
    paths: list[str]
    aux: bool = False  # returns (y, auxiliary loss)


@dataclass
class ConfigField:
    name: str
    type: str
    default: str
    comment: str


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.templates_dir())),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters["pystr"] = py_str
    return env


def render_template(name: str, **context) -> str:
    return _env().get_template(name).render(**context)


def emit_model(module: ir.Module) -> str:
    """The unformatted source of generated/<spec>/<target>/model.py."""
    per_model = [_functions(m.root, module.schedule) for m in module.models]
    first = per_model[0]
    for model, fns in zip(module.models[1:], per_model[1:]):
        if [(f.name, f.body) for f in fns] != [(f.name, f.body) for f in first]:
            raise CompileError([Diagnostic(
                model.span,
                f"model `{model.name}` has a different structure from `{module.models[0].name}`",
                "models in one spec share generated layer code; put this model in its own spec file",
            )])
    root = module.models[0].root
    functions = first
    body_text = "\n".join(line for f in functions for line in f.body)
    all_helpers = {**HELPERS, **quant.HELPERS, **kernels.HELPERS}
    helpers = [code for name, code in all_helpers.items() if f"{name}(" in body_text]
    fields = _config_fields(module.models[0])
    context = dict(
        version=__version__,
        spec=module.spec,
        sha256=module.sha256,
        target=module.target_name,
        models=[m.name for m in module.models],
        root_layer=root.layer,
        build_choices=_build_choices(root),
        fields=fields,
        configs=[(m.name, _overrides(fields, _config_fields(m))) for m in module.models],
        init_tree=_init_tree(root, root),
        axes_tree=_axes_tree(root),
        sharding=_sharding_context(module.schedule, root),
        helpers=helpers,
        functions=functions,
        root_fn=functions[-1].name,
        root_aux=functions[-1].aux,
        root_rng=functions[-1].rng,
        loss=has_lm_signature(root),
    )
    draft = render_template("model.py.j2", imports="", **context)
    return render_template("model.py.j2", imports=imports_for(draft), **context)


def imports_for(source: str) -> str:
    """Exactly the imports the body uses, standard library first (isort order)."""
    std = sorted(m for m in ("dataclasses", "functools", "math", "zlib") if f"{m}." in source)
    third = ["import jax", "import jax.numpy as jnp"]
    if "np." in source:
        third.append("import numpy as np")
    if "optax." in source:
        third.append("import optax")
    if "checkpoint_name(" in source:
        third.append("from jax.ad_checkpoint import checkpoint_name")
    for line in kernels.IMPORTS:
        if line.split()[-1] + "." in source:
            third.append(line)
    if "Mesh(" in source:
        third.append("from jax.sharding import Mesh")
    if "P(" in source:
        third.append("from jax.sharding import PartitionSpec as P")
    return "\n".join([f"import {m}" for m in std] + [""] + third)


# ----------------------------------------------------------------------------- functions
def _functions(root: ir.Instance, schedule: ir.Schedule | None = None) -> list[LayerFunction]:
    """Layer functions in post-order (leaves first), deduplicated by generated body."""
    out: list[LayerFunction] = []
    axes_of_dims = dim_axes(root)

    def visit(inst: ir.Instance) -> tuple[str, bool, bool]:
        child_fn, child_rng, child_aux = {}, {}, {}
        for c in inst.children:
            child_fn[c.name], child_rng[c.name], child_aux[c.name] = visit(c)
        own = _uses(inst, "uses_rng") or any(child_rng.values())
        aux = _uses(inst, "aux_loss") or any(child_aux.values())
        emitter = FunctionEmitter(inst, child_fn, child_rng, own, schedule, axes_of_dims,
                                  child_aux=child_aux, own_aux=aux)
        body = emitter.emit_body()
        args = ", ".join(f"{a.name}: jax.Array" for a in inst.forward.args)
        for f in out:
            if f.layer == inst.layer and f.body == body and f.args == args:
                f.paths.append(inst.path)
                return f.name, f.rng, f.aux
        base = snake(inst.layer)
        taken = sum(1 for f in out if f.layer == inst.layer)
        name = base if taken == 0 else f"{base}_{taken + 1}"
        sig = ", ".join(f"{a.name}: [{', '.join(d.name for d in a.dims)}]" for a in inst.forward.args)
        result = "[" + ", ".join(d.name for d in inst.forward.result) + "]"
        doc_head = f"{inst.layer} ({inst.layer_span.file}:{inst.layer_span.line}): {sig} -> {result}."
        out.append(LayerFunction(name, inst.layer, args, own, body, doc_head, [inst.path], aux))
        return name, own, aux

    visit(root)
    for f in out:
        where = ", ".join(f.paths)
        f.doc = f"{f.doc}\n\n    Used at {where}.\n    "
    return out


def _uses(inst: ir.Instance, flag: str) -> bool:
    """Whether this instance's own forward calls a primitive with registry flag `flag` set."""
    return any(getattr(primitives.get(p.name), flag) for p in prims_of(inst))


def has_lm_signature(root: ir.Instance) -> bool:
    f = root.forward
    return len(f.args) == 1 and len(f.args[0].dims) == 2 and len(f.result) == 3


# ----------------------------------------------------------------------------- config
_PY_TYPES = {"int": "int", "float": "float", "dtype": "jax.typing.DTypeLike"}


def _config_fields(model: ir.Model) -> list[ConfigField]:
    fields = []
    for h in model.root.hparams:
        if h.type not in _PY_TYPES:
            continue
        v = h.value.value
        default = f"jnp.{v.jnp}" if isinstance(v, DType) else repr(v)
        fields.append(ConfigField(h.name, _PY_TYPES[h.type], default, f"{h.origin}"))
    return fields


def _overrides(base: list[ConfigField], fields: list[ConfigField]) -> str:
    by_name = {f.name: f.default for f in base}
    return ", ".join(f"{f.name}={f.default}" for f in fields if by_name.get(f.name) != f.default)


def _build_choices(root: ir.Instance) -> list[str]:
    lines = []
    for inst in root.walk():
        for h in inst.hparams:
            if h.type in ("bool", "string", "Layer") or h.type.startswith("enum"):
                if inst is root or h.origin.kind is ir.OriginKind.SET or h.type == "bool" and h.value.value:
                    if h.type == "Layer" and inst is not root:
                        continue
                    prefix = "" if inst is root else inst.path.strip("/") + "."
                    lines.append(f"{prefix}{h.name} = {value_text(h.value.value)}")
    return lines


# ----------------------------------------------------------------------------- trees
def _init_tree(inst: ir.Instance, root: ir.Instance) -> str:
    items = []
    root_pdtype = root.hparam("param_dtype")
    for p in inst.params:
        dims = [d.code or str(d.size) for d in p.full_dims]
        shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
        if root_pdtype is not None and root_pdtype.value.value == p.dtype:
            dtype = "cfg.param_dtype"
        else:
            dtype = f"jnp.{p.dtype.jnp}"
        path = (inst.path.rstrip("/") + "/" + p.name).lstrip("/")
        args = [f"key", py_str(path), shape, dtype, py_str(p.init.kind)]
        if p.init.args:
            args.append(p.init.args[0].code)
        items.append(f"{py_str(p.name)}: _param({', '.join(args)})")
    for c in inst.children:
        items.append(f"{py_str(c.name)}: {_init_tree(c, root)}")
    return "{" + ", ".join(items) + ("," if items else "") + "}"


def _axes_tree(inst: ir.Instance) -> str:
    items = []
    for p in inst.params:
        axes = ", ".join(py_str(a) for a in p.full_axes) + ("," if len(p.full_axes) == 1 else "")
        items.append(f"{py_str(p.name)}: ({axes})")
    for c in inst.children:
        items.append(f"{py_str(c.name)}: {_axes_tree(c)}")
    return "{" + ", ".join(items) + ("," if items else "") + "}"


def _specs_tree(inst: ir.Instance) -> str:
    items = [f"{py_str(p.name)}: {spec_text(p.sharding)}" for p in inst.params]
    items += [f"{py_str(c.name)}: {_specs_tree(c)}" for c in inst.children]
    return "{" + ", ".join(items) + ("," if items else "") + "}"


# ----------------------------------------------------------------------------- schedule
_REMAT_DOC = {
    "full": "keep only each layer's input; recompute the rest in the backward pass",
    "save_dots": "keep matmul outputs without batch dims; recompute the rest",
    "save": "keep the named points listed; recompute the rest",
    "offload": "move the offloaded points to host memory, keep the saved ones; recompute the rest",
}


def _remat_policy(r: ir.RematPolicy) -> str:
    names = lambda xs: "[" + ", ".join(py_str(x) for x in xs) + "]"  # noqa: E731
    if r.kind == "full":
        return "jax.checkpoint_policies.nothing_saveable"
    if r.kind == "save_dots":
        return "jax.checkpoint_policies.dots_with_no_batch_dims_saveable"
    if r.kind == "save":
        return f"jax.checkpoint_policies.save_only_these_names(*{names(r.save)})"
    return ("jax.checkpoint_policies.save_and_offload_only_these_names(\n"
            f"    names_which_can_be_saved={names(r.save)},\n"
            f"    names_which_can_be_offloaded={names(r.offload)},\n"
            '    offload_src="device",\n    offload_dst="pinned_host",\n)')


def _sharding_context(s: ir.Schedule | None, root: ir.Instance) -> dict | None:
    if s is None:
        return None
    written = dict(s.mesh.value)
    mesh = {a: written.get(a, 1) for a, _ in s.mesh_sizes}
    resolved = ", ".join(f"{a}={n}" for a, n in s.mesh_sizes if n != 1 or mesh[a] == -1)
    rules = [f"{k} -> {', '.join(c.value)}" for k, c in s.rules if any(written.get(a, 1) != 1 for a in c.value)]
    r = s.remat.value
    uses_remat = any(i.remat is not None and i.remat.kind != "none" for i in root.walk())
    return dict(
        name=s.name, chips=s.chips, mesh_origin=s.mesh.origin, resolved=resolved,
        mesh_shape="{" + ", ".join(f"{py_str(a)}: {n}" for a, n in mesh.items()) + "}",
        rules="; ".join(rules) or "everything replicated but the batch",
        specs_tree=_specs_tree(root),
        remat=(r.kind, _REMAT_DOC[r.kind], s.remat.origin, _remat_policy(r)) if uses_remat else None,
    )
