"""Emit `model.py` for one module: collect layer functions, the config and the parameter table.

The layer functions and the helpers are printed as plan_functions recorded them (`Model.functions`,
`Module.helpers`): one function per entry, numbered variants included, and a check that each
entry's instances print one body and that the emitters call exactly the recorded helpers. Every
model of a spec must share one structure, since they share the functions and differ only in
`Config` values.
"""

from __future__ import annotations

import json
import keyword
from dataclasses import dataclass, replace

import jinja2

from axdsl import __version__, primitives, resources
from axdsl.codegen import helpers
from axdsl.codegen.decode import DecodePath, decode_path
from axdsl.codegen.emit_objective import objective_code, objective_doc
from axdsl.codegen.expressions import FunctionEmitter, LayerFunction, dims_text
from axdsl.codegen.names import EinsumLetters, dim_label, py_comment, py_doc, py_str, sh, spec_text
from axdsl.codegen.pyexpr import py, py_value
from axdsl.errors import CompileError, Diagnostic, InternalError, filled
from axdsl.ir import nodes as ir
from axdsl.ir.expr import reads_config
from axdsl.ir.head import has_lm_signature, takes_segments
from axdsl.ir.nodes import ConfigFields, DType, HeadSplit
from axdsl.ir.printer import fit_lines, value_text
from axdsl.objectives import fits, objective_args, objective_name
from axdsl.primitives.quantized import QUANTIZED_POINT


@dataclass
class ParamRow:
    """One row of the generated `param_table`: the code of each column."""

    path: str
    shape: str
    axes: str
    init: str
    scale: str
    spec: str
    dtype: str  # "" when it is cfg.param_dtype, the table's default


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
    # the one way each user value (a path, a name, a data file) is printed in each language
    env.filters.update(pystr=py_str, py_comment=py_comment, py_doc=py_doc, sh=sh)
    return env


def render_template(name: str, **context) -> str:
    return _env().get_template(name).render(**context)


def shared_functions(module: ir.Module) -> tuple[list[list[LayerFunction]], EinsumLetters]:
    """Each model's layer functions, checked to be one code: the models of a spec share the
    generated layer functions and differ only in `Config` values. A model whose code differs (a
    static written inside a block, another block layer) is a located error; `axdsl check` runs
    this too, so the mistake does not wait for `build`. Returns the functions and the one table
    of einsum letters they use."""
    letters = EinsumLetters()  # one table for every model: they share the layer functions
    per_model = [_functions(m, module.schedule, letters) for m in module.models]
    first = [(f.name, f.body) for f in per_model[0]]
    table = _param_table(module.models[0].root)
    for model, fns in zip(module.models[1:], per_model[1:], strict=True):
        if [(f.name, f.body) for f in fns] != first:
            raise CompileError(
                [
                    Diagnostic(
                        model.span,
                        f"model `{model.name}` has a different structure from "
                        f"`{module.models[0].name}`",
                        "models in one spec share generated layer code; "
                        "put this model in its own spec file",
                    )
                ]
            )
        if _param_table(model.root) != table:  # a size written inside a block (`MoE(experts = 32)`)
            raise CompileError(
                [
                    Diagnostic(
                        model.span,
                        f"model `{model.name}` has a parameter table (shapes, initializers or "
                        "dtypes) other than "
                        f"`{module.models[0].name}`'s where no hyperparameter says so: "
                        f"{_first_difference(_param_table(model.root), table)}",
                        "models in one spec share one parameter table, set by Config fields; "
                        "make what differs "
                        "a model hyperparameter, or put this model in its own spec file",
                    )
                ]
            )
    return per_model, letters


def _planned_helpers(
    module: ir.Module, per_model: list[list[LayerFunction]], decode: DecodePath | None
) -> set[str]:
    """The helpers plan_functions recorded (`module.helpers`), checked against those the
    emitters called: a difference is a compiler bug (a primitive's `needs` and its emitter
    disagree)."""
    planned = set(module.helpers)
    called = {h for fns in per_model for f in fns for h in f.helpers}
    called |= decode.helpers if decode else set()
    if module.models[0].head is not None:  # loss_fn's chunked loss
        called.add(primitives.FUSED_CROSS_ENTROPY.name)
    if called != planned:
        raise InternalError(
            f"plan_functions recorded helpers {sorted(planned)}, the emitters called "
            f"{sorted(called)}"
        )
    return planned


def _first_difference(table: tuple[list[str], list], first: tuple[list[str], list]) -> str:
    """The first size or parameter row of `table` that the first model's table does not have."""
    theirs = {" ".join(str(x).split()) for x in first[0] + first[1]}
    mine = [" ".join(str(x).split()) for x in table[0] + table[1]]
    extra = next((f"`{line}`" for line in mine if line not in theirs), None)
    missing = next((f"`{line}`" for line in sorted(theirs - set(mine))), None)
    return extra or f"it lacks {missing}"


@dataclass(frozen=True)
class ModelSource:
    """The unformatted sources of model.py and of kernels.py beside it (None: the model calls
    no helper)."""

    model: str
    kernels: str | None


def emit_model(module: ir.Module) -> ModelSource:
    """The unformatted sources of generated/<spec>/<target>/model.py and kernels.py: the model
    itself, and the helpers it calls, copied from axdsl/kernels/ (model.py imports those it
    calls by name from `.kernels`)."""
    per_model, letters = shared_functions(module)
    first = per_model[0]
    model = module.models[0]
    root = model.root
    functions = first
    fields = _config_fields(model, module.config)
    sharding = _sharding_context(module.schedule, root)
    objective = objective_name(module)
    loss = objective == "next_token" and has_lm_signature(root)
    plan = model.decode
    decodes = plan is not None and plan.problem is None
    split = model.head
    head = None
    top = (root, functions[-1])
    if split is not None:
        functions, head = _split_root(functions, split, module.schedule, letters, decodes)
        top = (split.body, functions[-3])  # <root>_hidden
    decode = None
    if plan is not None and decodes:
        decode = decode_path(root, plan, functions, module.schedule, letters, top)
    helper_code, helper_imports = helpers.select(_planned_helpers(module, per_model, decode))
    imports = {line for f in functions for line in f.imports} | (
        decode.imports if decode else set()
    )
    if decode or split:
        imports.add("import functools")
    custom = objective != "next_token" and fits(root, objective)
    # optax: the plain next-token loss and the objectives' losses (fused_cross_entropy and loss()
    # use none)
    uses_optax = (loss and split is None) or (custom and objective != "loss")
    imports |= _template_imports(sharding is not None, uses_optax)
    locals_, rows = _param_table(root)
    context = dict(
        version=__version__,
        spec=module.spec,
        sha256=module.sha256,
        target=module.target_name,
        models=[m.name for m in module.models],
        root_layer=root.layer,
        build_choices=_build_choices(root) + _fixed_fields(root, module.config),
        fields=fields,
        configs=[
            (m.name, _overrides(fields, _config_fields(m, module.config))) for m in module.models
        ],
        param_locals=locals_,
        param_rows=rows,
        init_kinds=_init_kinds(root),
        init_pair=any(len(p.init.args) > 1 for inst in root.walk() for p in inst.params),
        empty_layers=[
            py_str(i.path.strip("/"))
            for i in root.walk()
            if i is not root and not i.params and not i.children
        ],
        param_dtype=root.hparam("param_dtype") is not None,
        letters=letters.legend(),
        sharding=sharding,
        functions=functions,
        root_fn=functions[-1].name,
        root_aux=functions[-1].aux,
        root_rng=functions[-1].rng,
        loss=loss,
        loss_chunk=split.chunk if split is not None else 0,
        loss_mask=_reads_loss_mask(module),  # chat data: loss_fn takes its batches' mask
        segments=takes_segments(root),  # packed rows: the forward and loss_fn take segment ids
        head=head,
        decode=decode,
        no_decode=plan.problem if plan is not None else None,
        root_args=", ".join(f"{a.name}: jax.Array" for a in root.fwd.args),
        root_arg_names=", ".join(a.name for a in root.fwd.args),
        root_result="[B, S, vocab]" if has_lm_signature(root) else dims_text(root.fwd.result),
        objective_doc=objective_doc(objective) if custom else "",
        objective_loss=(
            objective_code(
                objective, objective_args(module), root, functions[-1].rng, functions[-1].aux
            )
            if custom
            else ""
        ),
    )
    return _render(context, imports, helper_code, helper_imports)


def _reads_loss_mask(module: ir.Module) -> bool:
    """Whether the train block reads chat data, whose batches carry a loss_mask for loss_fn."""
    t = module.train_settings
    return t is not None and "data" in dict(t.settings) and t.get("data").kind is ir.DataKind.CHAT


def _render(
    context: dict, imports: set[str], helper_code: list[str], helper_imports: set[str]
) -> ModelSource:
    """model.py from the template, and kernels.py with the helpers when there are any; model.py
    imports by name what its code calls from kernels.py (rendered once to see what that is)."""
    kernels = (
        render_template(
            "kernels.py.j2",
            imports=import_block(helper_imports),
            helpers=helper_code,
            **{k: context[k] for k in ("version", "spec", "sha256", "target", "models")},
        )
        if helper_code
        else None
    )
    draft = render_template(
        "model.py.j2", imports=import_block(imports), kernel_names=(), **context
    )
    calls = helpers.linked(draft, kernels) if kernels else ()
    if not calls:
        return ModelSource(draft, kernels)
    model_code = render_template(
        "model.py.j2", imports=import_block(imports), kernel_names=calls, **context
    )
    return ModelSource(model_code, kernels)


# Every import line generated code may have, in isort order (standard library first).
_IMPORT_ORDER = (
    "import dataclasses",
    "import functools",
    "import math",
    "import zlib",
    "from collections.abc import Callable",
    "",
    "import jax",
    "import jax.numpy as jnp",
    "import numpy as np",
    "import optax",
    "from jax.ad_checkpoint import checkpoint_name",
    "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel",
    "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask",
    "from jax.sharding import Mesh",
    "from jax.sharding import PartitionSpec as P",
)


def import_block(needed: set[str]) -> str:
    """The import lines in `needed`, in isort order; every line must be a known one."""
    unknown = needed - set(_IMPORT_ORDER)
    assert not unknown, f"no place in _IMPORT_ORDER for {sorted(unknown)}"
    return "\n".join(line for line in _IMPORT_ORDER if line in needed or line == "")


def _template_imports(sharding: bool, loss: bool) -> set[str]:
    """What the template's own code uses: Config, the parameter table, the mesh, the loss."""
    out = {"import dataclasses", "import zlib", "import jax", "import jax.numpy as jnp"}
    if sharding:
        out |= {
            "import math",
            "import numpy as np",
            "from jax.sharding import Mesh",
            "from jax.sharding import PartitionSpec as P",
        }
    if loss:
        out.add("import optax")
    return out


# ----------------------------------------------------------------------------- functions
def _functions(
    model: ir.Model, schedule: ir.Schedule | None, letters: EinsumLetters
) -> list[LayerFunction]:
    """The layer functions plan_functions recorded (`model.functions`), in its order (leaves
    first). The layers the decode path shares read positions from `pos` (their decode form is
    merged in by codegen/decode.py). The instances of one function must print one body: a
    difference is a compiler bug in plan_functions."""
    root = model.root
    plan = filled(model.functions or None, f"the functions of model {model.name}", "plan_functions")
    planned = {path: f for f in plan for path in f.paths}
    by_name: dict[str, LayerFunction] = {}

    def visit(inst: ir.Instance) -> tuple[str, bool, bool]:
        child_fn, child_rng, child_aux = {}, {}, {}
        for c in inst.children:
            child_fn[c.name], child_rng[c.name], child_aux[c.name] = visit(c)
        shared = planned[inst.path]
        name, own, aux = shared.name, shared.rng, shared.aux
        emitter = FunctionEmitter(
            inst,
            child_fn,
            child_rng,
            own,
            schedule,
            letters=letters,
            child_aux=child_aux,
            own_aux=aux,
            master=shared.master,
            takes_pos=shared.takes_pos,
            staged=shared.staged,
            reorders=inst is root,
        )
        body = emitter.emit_body()
        args = ", ".join(f"{a.name}: jax.Array" for a in inst.fwd.args)
        if (f := by_name.get(name)) is not None:
            if (f.layer, f.body, f.args) != (inst.layer, body, args):
                raise InternalError(
                    f"plan_functions shares `{name}` between {f.paths[0]} and {inst.path}, "
                    "whose bodies differ"
                )
            f.paths.append(inst.path)
            f.helpers |= emitter.helpers
            return f.name, f.rng, f.aux
        sig = ", ".join(f"{a.name}: {dims_text(a.dims)}" for a in inst.fwd.args)
        result = dims_text(inst.fwd.result)
        if aux:  # inside the pipeline's stages: the loss's statistics (plan_pipeline)
            loss = "its auxiliary loss's statistics" if shared.staged else "auxiliary loss []"
            result = f"({result}, {loss})"
        doc_head = f"{_defined_at(inst)}: {sig} -> {result}."
        by_name[name] = LayerFunction(
            name,
            inst.layer,
            args,
            own,
            body,
            doc_head,
            [inst.path],
            aux,
            emitter.imports,
            emitter.helpers,
            emitter.chunks(),
            emitter.result,
        )
        return name, own, aux

    visit(root)
    out = [by_name[f.name] for f in plan]
    for f in out:
        where = ", ".join(f.paths)
        f.doc = f"{f.doc}\n\n    Used at {where}.\n    "
    return out


def _defined_at(inst: ir.Instance) -> str:
    """`Attention (std/transformer.axl:13)` for a layer function's docstring: the file's name
    escaped (py_doc), for it is the user's."""
    return f"{inst.layer} ({py_doc(inst.layer_span.file)}:{inst.layer_span.line})"


def _split_root(
    functions: list[LayerFunction],
    split: HeadSplit,
    schedule: ir.Schedule | None,
    letters: EinsumLetters,
    decodes: bool = False,
) -> tuple[list[LayerFunction], dict]:
    """The root function as `<root>_hidden` (up to the output head), `<root>_head` (the head)
    and the root calling both, for the fused cross-entropy of `loss_fn` (axdsl/ir/head.py); and
    what the template's loss_fn needs to know of them."""
    *layers, root_fn = functions
    root = split.body
    fn_of = {path: f.name for f in layers for path in f.paths}
    child_fn = {c.name: fn_of[c.path] for c in root.children}
    child_rng = {
        c.name: next(f.rng for f in layers if f.name == child_fn[c.name]) for c in root.children
    }
    child_aux = {
        c.name: next(f.aux for f in layers if f.name == child_fn[c.name]) for c in root.children
    }
    mixed = bool(ir.master_weight_paths(root))
    body = FunctionEmitter(
        root,
        child_fn,
        child_rng,
        root_fn.rng,
        schedule,
        letters=letters,
        child_aux=child_aux,
        own_aux=root_fn.aux,
        master=mixed,
        takes_pos=decodes,
        reorders=True,
    )
    head = FunctionEmitter(
        replace(split.head, children=()),
        {},
        {},
        False,
        schedule,
        letters=letters,
        master=mixed,
    )
    sig = ", ".join(f"{a.name}: {dims_text(a.dims)}" for a in root.fwd.args)
    hidden = dims_text(root.fwd.result)
    where = _defined_at(root)
    hidden_fn = LayerFunction(
        f"{root_fn.name}_hidden",
        root.layer,
        root_fn.args,
        root_fn.rng,
        body.emit_body(),
        f"{where} up to its output head: {sig} -> {hidden}"
        f"{', auxiliary loss []' if root_fn.aux else ''}."
        f"\n\n    `loss_fn` applies the head itself, a chunk of positions at a time.\n    ",
        [],
        root_fn.aux,
        body.imports,
        body.helpers,
        body.chunks(),
        body.result,
    )
    head_fn = LayerFunction(
        f"{root_fn.name}_head",
        root.layer,
        f"{split.hidden}: jax.Array",
        False,
        head.emit_body(),
        f"The output head of {where}: {split.hidden}: {hidden} -> "
        f"{dims_text(split.head.fwd.result)}."
        f"\n\n    Position-wise: each position's logits read only its own {split.hidden}.\n    ",
        [],
        False,
        head.imports,
        head.helpers,
    )
    rng = ", rng=rng" if root_fn.rng else ""
    args = ", ".join(a.name for a in root.fwd.args)
    head_params = "{k: params[k] for k in HEAD_PARAMS}"  # the head casts only what it reads
    if root_fn.aux:
        calls = [
            f"{split.hidden}, aux = {hidden_fn.name}(cfg, params, {args}{rng})  # {hidden}, []",
            f"return {head_fn.name}(cfg, {head_params}, {split.hidden}), aux",
        ]
    else:
        calls = [
            f"{split.hidden} = {hidden_fn.name}(cfg, params, {args}{rng})  # {hidden}",
            f"return {head_fn.name}(cfg, {head_params}, {split.hidden})",
        ]
    composed = replace(root_fn, body=calls, imports=set(), helpers=set())
    context = dict(
        hidden=hidden_fn.name,
        fn=head_fn.name,
        arg=split.hidden,
        dims=hidden,
        params=_tuple([py_str(k) for k in split.params]),
    )
    return [*layers, hidden_fn, head_fn, composed], context


# ----------------------------------------------------------------------------- config
_PY_TYPES = {
    ir.HParamKind.INT: "int",
    ir.HParamKind.FLOAT: "float",
    ir.HParamKind.DTYPE: "jax.typing.DTypeLike",
}


def _config_fields(model: ir.Model, config: ConfigFields | None) -> list[ConfigField]:
    """The fields select_config kept (every numeric one without it), with where each was set."""
    fields = []
    for h in model.root.hparams:
        if h.type.kind not in _PY_TYPES or config is not None and h.name not in config.fields:
            continue
        v = h.value.value
        default = f"jnp.{v.jnp}" if isinstance(v, DType) else repr(v)
        fields.append(ConfigField(h.name, _PY_TYPES[h.type.kind], default, f"{h.origin}"))
    return fields


def _hparam(root: ir.Instance, name: str) -> ir.HParam:
    """A root hyperparameter that select_config named, so it exists."""
    h = root.hparam(name)
    assert h is not None, name
    return h


def _fixed_fields(root: ir.Instance, config: ConfigFields | None) -> list[str]:
    """One docstring line of the defaults select_config fixed (no code reads them)."""
    fixed = config.fixed if config is not None else ()
    values = ", ".join(f"{n} = {value_text(_hparam(root, n).value.value)}" for n in fixed)
    return [f"{values} (defaults no code reads)"] if fixed else []


def _overrides(base: list[ConfigField], fields: list[ConfigField]) -> str:
    by_name = {f.name: f.default for f in base}
    return ", ".join(f"{f.name}={f.default}" for f in fields if by_name.get(f.name) != f.default)


def _build_choices(root: ir.Instance) -> list[str]:
    lines = []
    for inst in root.walk():
        for h in inst.hparams:
            kind = h.type.kind
            if kind in (
                ir.HParamKind.BOOL,
                ir.HParamKind.STRING,
                ir.HParamKind.LAYER,
                ir.HParamKind.ENUM,
            ):
                if (
                    inst is root
                    or h.origin.kind is ir.OriginKind.SET
                    or kind is ir.HParamKind.BOOL
                    and h.value.value
                ):
                    if kind is ir.HParamKind.LAYER and inst is not root:
                        continue
                    prefix = "" if inst is root else inst.path.strip("/") + "."
                    lines.append(f"{prefix}{h.name} = {value_text(h.value.value)}")
    return lines


# ----------------------------------------------------------------------------- parameter table
_TAKEN = {"cfg", "key", "jax", "jnp", "np", "P", "Param", "math", "zlib"}


def _param_table(root: ir.Instance) -> tuple[list[str], list[str]]:
    """(local assignments, rows) of `param_table(cfg)`: one row per parameter, in tree order.

    A shape names its dims by local variables bound from cfg (`head_dim = cfg.dim // cfg.heads`),
    so each row stays one line; a literal size is written as the number.
    """
    names: dict[tuple[str, str], str] = {}  # (dim name or "", size code) -> local name
    rows: list[ParamRow] = []
    root_pdtype = root.hparam("param_dtype")
    for inst in root.walk():
        for p in inst.params:
            dims = [_local(d, names) for d in p.full_dims]
            axes = [_dq(a) for a in p.full_axes]
            default = root_pdtype is not None and root_pdtype.value.value == p.dtype
            rows.append(
                ParamRow(
                    path=_dq((inst.path.rstrip("/") + "/" + p.name).lstrip("/")) + ":",
                    shape=_tuple(dims),
                    axes=_tuple(axes),
                    init=_dq(p.init.kind),
                    scale=_init_args(p.init),
                    spec=spec_text(p.sharding) if p.sharding is not None else "None",
                    dtype="" if default else f"jnp.{p.dtype.jnp}",
                )
            )
    fields = [(n, c) for (_, c), n in names.items() if c == f"cfg.{n}"]
    locals_ = (
        [f"{', '.join(n for n, _ in fields)} = {', '.join(c for _, c in fields)}"] if fields else []
    )
    locals_ += [f"{n} = {c}" for (_, c), n in names.items() if c != f"cfg.{n}"]
    return locals_, _aligned(rows)


def _init_args(init: ir.Init) -> str:
    """The `scale` column: the initializer's one argument, a pair for two, 1.0 for none."""
    if len(init.args) > 1:
        return "(" + ", ".join(py_value(a) for a in init.args) + ")"
    return py_value(init.args[0]) if init.args else "1.0"


def _init_kinds(root: ir.Instance) -> list[str]:
    """The initializers the parameters use, in InitKind order: `_param` has a branch for each
    (zeros for a model without parameters, whose _param is never called but must still compile
    with its imports used)."""
    used = {p.init.kind for inst in root.walk() for p in inst.params}
    return [str(k) for k in ir.InitKind if k in used] or [str(ir.InitKind.ZEROS)]


def _aligned(rows: list[ParamRow]) -> list[str]:
    """The table's header comment and rows, each column padded to its widest cell."""
    if not rows:  # a model without parameters (only a forward) has an empty table
        return []
    cols = ["shape", "axes", "init", "scale"] + (["spec"] if rows[0].spec != "None" else [])
    titles = {
        "shape": "shape",
        "axes": "logical axes",
        "init": "init",
        "scale": "scale",
        "spec": "mesh",
    }
    cells = [
        [r.path] + [getattr(r, c) + ("," if i < len(cols) - 1 else "") for i, c in enumerate(cols)]
        for r in rows
    ]
    width = [max(len(row[i]) for row in cells) for i in range(len(cols) + 1)]
    header = (
        "# path".ljust(width[0])
        + "       "
        + " ".join(titles[c].ljust(w) for c, w in zip(cols, width[1:], strict=True))
    )
    lines = [header.rstrip()]
    for r, row in zip(rows, cells, strict=True):
        padded = [cell.ljust(w) for cell, w in zip(row[:-1], width[:-1], strict=True)] + [row[-1]]
        text = padded[0] + " Param(" + " ".join(padded[1:])
        lines.append(text + (f", dtype={r.dtype}" if r.dtype else "") + "),")
    return lines


def _dq(s: str) -> str:
    """A double-quoted Python literal (the table is outside black, which would normalize quotes)."""
    return json.dumps(str(s))


def _local(d: ir.Dim, names: dict[tuple[str, str], str]) -> str:
    """The local variable for a dim's size, bound once per size expression that reads cfg (a
    layer's `hidden` that is cfg.ffn is `ffn`) and once per dim name otherwise (`experts = 128`
    and `head_dim = 128` stay two names, but a name already bound to another size reuses a local
    of its own size); a dim without code is written as its number."""
    if d.expr is None:
        return str(d.size)
    code = py(d.expr)
    key = ("" if reads_config(d.expr) else d.name, code)
    same_size = [n for (_, c), n in names.items() if c == code]
    if key not in names and same_size and dim_label(d.name, d.expr) in names.values():
        return same_size[0]  # RMSNorm's `dim` that is head_dim = 128 reads head_dim, not dim_2
    if key not in names:
        name = base = dim_label(d.name, d.expr)
        n = 1
        while (
            name in names.values()
            or name in _TAKEN
            or keyword.iskeyword(name)
            or not name.isidentifier()
        ):
            n += 1
            name = f"{base}_{n}" if base.isidentifier() else f"dim_{n}"
        names[key] = name
    return names[key]


def _tuple(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


# ----------------------------------------------------------------------------- schedule
_REMAT_DOC = {
    "full": "keep only each layer's input; recompute the rest in the backward pass",
    "save_dots": "keep matmul outputs without batch dims; recompute the rest",
    "save": "keep the named points listed; recompute the rest",
    "offload": "move the offloaded points to host memory, keep the saved ones; recompute the rest",
}


def _remat_policy(r: ir.RematPolicy, quantized: bool) -> str:
    """The jax policy of `r`; save_dots also saves the fp8/int8 helpers' outputs when matmuls are
    quantized (their custom VJPs hide the dots from dots_with_no_batch_dims_saveable)."""
    names = lambda xs: "[" + ", ".join(py_str(x) for x in xs) + "]"  # noqa: E731
    if r.kind is ir.RematKind.FULL:
        return "jax.checkpoint_policies.nothing_saveable"
    if r.kind is ir.RematKind.SAVE_DOTS and quantized:
        return (
            "jax.checkpoint_policies.save_from_both_policies(\n"
            "    jax.checkpoint_policies.dots_with_no_batch_dims_saveable,\n"
            f"    jax.checkpoint_policies.save_only_these_names({py_str(QUANTIZED_POINT)}),\n)"
        )
    if r.kind is ir.RematKind.SAVE_DOTS:
        return "jax.checkpoint_policies.dots_with_no_batch_dims_saveable"
    if r.kind is ir.RematKind.SAVE:
        return f"jax.checkpoint_policies.save_only_these_names(*{names(r.save)})"
    return (
        "jax.checkpoint_policies.save_and_offload_only_these_names(\n"
        f"    names_which_can_be_saved={names(r.save)},\n"
        f"    names_which_can_be_offloaded={names(r.offload)},\n"
        '    offload_src="device",\n    offload_dst="pinned_host",\n)'
    )


def _sharding_context(s: ir.Schedule | None, root: ir.Instance) -> dict | None:
    if s is None:
        return None
    written = dict(s.mesh.value)
    mesh = {a: written.get(a, 1) for a, _ in s.mesh_sizes}
    resolved = ", ".join(f"{a}={n}" for a, n in s.mesh_sizes if n != 1 or mesh[a] == -1)
    used = [(k, c) for k, c in s.rules if any(written.get(a, 1) != 1 for a in c.value)]
    origins = {c.origin for _, c in used}
    rules = [
        f"{k} -> {', '.join(c.value)}" + ("" if len(origins) == 1 else f" ({c.origin})")
        for k, c in used
    ]
    r = s.remat.value
    uses_remat = any(
        i.remat is not None and i.remat.kind is not ir.RematKind.NONE for i in root.walk()
    )
    return dict(
        name=s.name,
        chips=s.chips,
        mesh_origin=s.mesh.origin,
        resolved=resolved,
        mesh_shape="{" + ", ".join(f"{py_str(a)}: {n}" for a, n in mesh.items()) + "}",
        rules="; ".join(rules) or "everything replicated but the batch",
        rules_origin=f", from {origins.pop()}" if len(origins) == 1 else "",
        remat=(
            (
                r.kind,
                _REMAT_DOC[r.kind],
                s.remat.origin,
                _remat_policy(r, s.quantize.value.format is not ir.QuantFormat.NONE),
            )
            if uses_remat
            else None
        ),
        remat_fit=fit_lines(s.remat_fit) if s.remat_fit is not None else [],
        no_remat=f"remat({r.kind}) from {s.remat.origin}" if not uses_remat else None,
        quantize=_quantize_line(s.quantize),
    )


def _quantize_line(q: ir.Choice) -> str | None:
    """quantize_matmuls' decision when it is `none` (otherwise each quantized matmul says it)."""
    if q.value.format is ir.QuantFormat.NONE:
        return f"quantize(none) from {q.origin}: every matmul runs in the compute dtype"
    return None
