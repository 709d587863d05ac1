"""Emit `train.py`: the spec's train block as a `TrainConfig`, its optimizer and schedule as optax;
`runtime.py`, the support module every train.py imports (data, flags, checkpoints, metrics); and
`slurm.sh`, a batch script that runs train.py on every node of a SLURM allocation.

The train.py template holds the fixed parts (state, step, loop); this module renders the parts the
spec chooses, so the generated file contains only the optimizer and schedule in use (and the
dropout key only for models with dropout). runtime.py depends on no spec: one copy serves all.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from axdsl import __version__, lora, optim, primitives
from axdsl.analysis.flops import TrainingFlops
from axdsl.codegen import runtime_source
from axdsl.codegen.emit import render_template
from axdsl.codegen.names import py_comment, py_str, spec_text
from axdsl.errors import filled
from axdsl.ir import nodes as ir
from axdsl.ir.head import takes_segments
from axdsl.ir.rewrite import tree_has
from axdsl.objectives import (
    DATA_SOURCES,
    Objective,
    batches_objective,
    inputs,
    objective_args,
    objective_of,
)
from axdsl.primitives.moe import balanced_biases
from axdsl.targets import profiles


@dataclass
class Field:
    name: str
    type: str
    default: str
    comment: str

    @property
    def fits(self) -> bool:
        """Whether `name: type = default  # comment` fits black's 100 columns (else: comment
        above)."""
        line = f"    {self.name}: {self.type} = {self.default}  # {py_comment(self.comment)}"
        return len(line) <= 100


def emit_train(module: ir.Module, package: str, flops: list[TrainingFlops]) -> str:
    """The unformatted source of generated/<spec>/<target>/train.py."""
    t = module.train
    fields = _fields(module)
    opt = t.get("optimizer")
    optimizer, schedule = optim.optimizer(opt.name), optim.schedule(t.get("schedule").name)
    profile = profiles()[module.target.profile]
    batch_axes = module.target.kept_axes("batch")
    objective, batches = objective_of(module), batches_objective(module)
    return render_template(
        "train.py.j2",
        version=__version__,
        spec=module.spec,
        sha256=module.sha256,
        target=module.target_name,
        models=[m.name for m in module.models],
        package=package,
        profile=profile.name,
        peak_flops=f"{profile.peak_flops('bf16'):.4g}",
        peak_nominal=profile.peak_nominal,
        flops=flops,
        train_fields=fields,
        schedule_doc=schedule.doc,
        schedule_body=list(schedule.body),
        optimizer_doc=optimizer.doc,
        optimizer_body=optimizer.lines(opt),
        batch_axes=spec_text((batch_axes,))[2:-1] or "None",
        dropout=uses_dropout(module.models[0].root),
        lm=objective.token_rows,
        chat=is_chat(module),  # batches of tokens and loss_mask; loss_fn takes the mask
        segments=takes_segments(module.models[0].root),  # packed chat rows: and segment ids
        documents=_documents(module),  # packed token rows: segment ids from tc.sep
        objective=str(objective.kind),
        inputs=repr(inputs(module.models[0].root)),
        batches=str(batches.kind),
        batch_fields=", ".join(batches.fields),
        masks=objective.masks,  # loss_fn and accuracy take a key for the masks
        stats=list(objective.stats),  # loss_fn's metrics beside the loss (dpo, simpo, orpo)
        stats_text=repr(objective.stats),
        preferences=objective.preferences,  # rows of preference pairs (dpo, simpo, orpo)
        reference=objective.reference,  # rows carry the initial parameters' logps (dpo)
        accuracy=objective.accuracy,
        spec_loss=objective.spec_loss,  # train.py reads its batches as BATCHES does
        images=batches.images,
        image_shapes=_image_shapes(module, objective) if batches.images else [],
        rng_use="masks tokens" if objective.masks else "drops out",
        rng_what="Masking and dropout" if objective.masks else "Dropout",
        lora="lora" in dict(t.settings),
        evals="evals" in dict(t.settings),  # score task files at each evaluation
        lora_targets=lora.adapter_table(module) if "lora" in dict(t.settings) else [],
        lora_origin=str(t.choice("lora").origin) if "lora" in dict(t.settings) else "",
        # LoRA trains adapters only: the selection biases stay as they are, like every base weight
        balance=[] if "lora" in dict(t.settings) else balanced_biases(module.models[0].root),
        remat_fit=_remat_fit(module.target) if batches.has_seq else None,
        context_chunks=_context_chunks(module.target) if batches.has_seq else None,
        gpu_runtime=_gpu_runtime(module.target),
        # the host CPU is the target: jax starts no accelerator backend (see train.py.j2)
        host_only=module.target.kind is ir.ChipKind.CPU,
        update_skip=str(module.target.update_skip),
        platform=str(module.target.kind).upper(),
    )


def _gpu_runtime(schedule: ir.Schedule) -> dict | None:
    """The XLA flags and memory fraction choose_xla_flags recorded (GPUs; None elsewhere), each
    with its reason as comment lines."""
    runtime = schedule.gpu_runtime
    if runtime is None:
        return None
    return dict(
        flags=[(_comment(_sentence(f.reason), 4), py_str(f.text)) for f in runtime.flags],
        mem_fraction=py_str(str(runtime.mem_fraction)),
        mem_fraction_why=_comment(_sentence(runtime.mem_fraction_reason), 4),
    )


def _sentence(reason: str) -> str:
    """A reason as the IR keeps it (`order the step ...`) as a comment's sentence."""
    return reason[:1].upper() + reason[1:] + "."


def _comment(text: str, indent: int) -> list[str]:
    """`text` as comment lines that fit black's 100 columns at `indent`."""
    return textwrap.wrap(text, 100 - indent - 2, break_long_words=False, break_on_hyphens=False)


def _context_chunks(schedule: ir.Schedule) -> int | None:
    """Pieces per `seq` shard the sequence is cut into under context parallelism (2 in the
    zig-zag order, else 1), for check_config's --seq check; None without it."""
    context = schedule.context.value
    if context is None:
        return None
    return 2 if context.balance else 1


def _remat_fit(schedule: ir.Schedule) -> dict | None:
    """What check_config says when a run's step is larger than the one fit_remat sized its
    policy for (nothing when it chose full: no policy recomputes more; images have no seq)."""
    fit = schedule.remat_fit
    if fit is None or schedule.remat.value.kind is ir.RematKind.FULL:
        return None
    return dict(
        tokens=fit.batch * fit.seq,
        batch=fit.batch,
        seq=fit.seq,
        kind=str(schedule.remat.value.kind),
    )


def emit_runtime() -> str:
    """The unformatted source of <root>/runtime.py (the same for every spec and target)."""
    return runtime_source.emit_runtime(__version__)


def uses_dropout(root: ir.Instance) -> bool:
    """Whether the model's forward takes a dropout key (`rng`)."""
    return tree_has(root, lambda p: primitives.get(p.name).uses_rng)


def emit_slurm(module: ir.Module, package: str, spec_stem: str) -> str:
    """generated/<spec>/<target>/slurm.sh: a SLURM batch script that runs train.py on every node
    (`spec_stem` names its default run directory, runs/<spec_stem>-<target>)."""
    schedule = module.target
    profile = profiles()[schedule.profile]
    per_node = min(schedule.chips, profile.chips_per_host)
    return render_template(
        "slurm.sh.j2",
        version=__version__,
        spec=module.spec,
        sha256=module.sha256,
        target=module.target_name,
        model=module.models[0].name,
        package=package,
        path=package.replace(".", "/"),
        chips=schedule.chips,
        profile=profile.name,
        kind=profile.kind,
        nodes=-(-schedule.chips // per_node),
        per_node=per_node,
        run_name=f"{spec_stem}-{module.target_name}",
        steps_per_call=schedule.steps_per_call.value,
    )


def _fields(module: ir.Module) -> list[Field]:
    t = module.train
    out = [Field("model", "str", py_str(module.models[0].name), "a name in model.CONFIGS")]
    origin = dict(t.settings)

    def add(name: str, value, comment: str) -> None:
        typ = (
            "bool"
            if isinstance(value, bool)
            else "int" if isinstance(value, int) else "float" if isinstance(value, float) else "str"
        )
        out.append(
            Field(name, typ, py_str(value) if isinstance(value, str) else repr(value), comment)
        )

    batches = batches_objective(module)  # the data fields follow the batches (loss(): its data's)
    for key in ("batch", "seq", "steps", "microbatches"):
        if key != "seq" or batches.has_seq:  # images have no sequence length
            add(
                key,
                t.get(key),
                (
                    _doc(key, origin[key].origin)
                    if key != "seq" or not batches.seq_doc
                    else f"{batches.seq_doc}; {origin[key].origin}"
                ),
            )
    opt, opt_args = t.get("optimizer").name, t.get("optimizer").args
    for k, v in opt_args:
        add(
            k,
            v if isinstance(v, (bool, str)) else float(v),  # str: a dtype (mu_dtype)
            f"{opt}: {k}; {origin['optimizer'].origin}",
        )
    sched, sched_args = t.get("schedule").name, t.get("schedule").args
    for k, v in sched_args:
        add(
            k,
            int(v) if k == "warmup" else float(v),
            f"{sched} schedule: {k}; {origin['schedule'].origin}",
        )
    for key, what in (("dtype", "compute dtype"), ("param_dtype", "parameter dtype")):
        choice = origin.get(key)
        add(
            key,
            choice.value if choice else "",
            f"{what}; \"\": the model's ({choice.origin if choice else 'default'})",
        )
    for key in (
        "clip",
        "z_loss",
        "eval_every",
        "eval_batches",
        "log_every",
        "seed",
        "max_bad_steps",
    ):
        add(key, t.get(key), _doc(key, origin[key].origin))
    calls = module.target.steps_per_call
    add(
        "steps_per_call",
        calls.value,
        f"train steps one jitted call runs, the same results; {calls.origin}",
    )
    data = t.get("data")
    if (synthetic := batches.synthetic) is not None:  # pairs or images
        _example_fields(add, batches.images, synthetic, data, origin["data"].origin)
    elif data.kind in (ir.DataKind.CHAT, ir.DataKind.PREFERENCES):
        _chat_fields(add, data, origin["data"].origin)
    else:
        add("data", str(data.kind), f"default, tokens or text ({origin['data'].origin})")
        add("data_path", data.path or "", "token file, or text file or directory")
        add(
            "data_dtype",
            str(data.dtype or ir.TokenWidth.U16),
            "token file element type: u16 or u32",
        )
    if _documents(module):
        add(
            "sep",
            objective_args(module).get("sep", -1),
            "next_token(sep): documents end with this id, and a packed row's segment ids "
            "count them 1, 2, ...; -1: a row is one document",
        )
    elif "sep" in objective_args(module):  # masked_lm
        add(
            "sep",
            objective_args(module).get("sep", -1),
            "masked_lm(sep): rows start after this id and "
            "pack the documents it ends, segment ids 1, 2, ...; "
            "-1: rows from anywhere, one segment",
        )
    if data.tokenizer is not None and data.kind in (ir.DataKind.DEFAULT, ir.DataKind.TEXT):
        tok = data.tokenizer
        add(
            "tokenizer",
            tok.path if tok.path is not None else "bpe",
            'tokenizer.json (relative to the spec), or "bpe": '
            "train one on the data, kept in the run",
        )
        if tok.path is None:
            add("bpe_vocab", tok.bpe_vocab, "BPE vocabulary size; 0: the model's vocab")
    tune = dict(t.settings)
    add(
        "init_from",
        tune["init_from"].value if "init_from" in tune else "",
        'parameters a new run starts from (params checkpoint or run); "": random',
    )
    add(
        "freeze",
        tune["freeze"].value if "freeze" in tune else "",
        "parameters left as they are: comma-separated globs over paths",
    )
    if "evals" in tune:  # only a spec with evals has this field
        out.append(
            Field(
                "evals",
                "tuple",
                repr(tune["evals"].value),
                "task files scored at each evaluation (docs/eval.md), relative to the spec",
            )
        )
    if "lora" in tune:  # only a spec with lora(...) has these fields
        adapters = tune["lora"].value
        add("lora_rank", adapters.rank, f"LoRA adapter rank; {tune['lora'].origin}")
        add(
            "lora_alpha",
            adapters.alpha,
            "LoRA scale numerator: W + (lora_alpha / lora_rank) * A @ B",
        )
    ckpt = t.get("checkpoint")
    add(
        "checkpoint_every",
        ckpt.every,
        f"steps between checkpoints; 0: never ({origin['checkpoint'].origin})",
    )
    add("checkpoint_keep", ckpt.keep, "newest checkpoints kept")
    add("checkpoint_async", ckpt.async_save, "save in the background while training continues")
    add("checkpoint_dir", ckpt.dir, "inside the run directory")
    return out


def _documents(module: ir.Module) -> bool:
    """Whether train.py numbers the documents of token rows for a packed model (its forward
    reads segment ids) from tc.sep: next_token over token or text data."""
    root = module.models[0].root
    return objective_of(module).token_rows and not is_chat(module) and takes_segments(root)


def is_chat(module: ir.Module) -> bool:
    """Whether the train block reads chat data (its batches carry a loss_mask)."""
    return module.train.get("data").kind is ir.DataKind.CHAT


def _chat_fields(add, data: ir.DataSource, origin) -> None:
    """The data fields of chat and preference data: the file, the tokenizer, and for chat data
    what the loss is on."""
    tokenizer = filled(data.tokenizer, "chat data's tokenizer", "configure_train")
    if data.kind is ir.DataKind.PREFERENCES:
        add("data", str(data.kind), f"preferences: pairs, one JSON object a line ({origin})")
        add("data_path", data.path or "", 'a .jsonl of {"prompt", "chosen", "rejected"}')
    else:
        add("data", str(data.kind), f"chat: conversations, one JSON object a line ({origin})")
        add("data_path", data.path or "", 'a .jsonl of {"messages": [{"role", "content"}, ...]}')
    add(
        "tokenizer",
        tokenizer.path or "",
        "its directory (tokenizer.json, chat template), relative to the spec",
    )
    if data.kind is ir.DataKind.CHAT:
        add(
            "train_on",
            str(data.train_on or ir.TrainOn.ASSISTANT),
            '"assistant": the loss on assistant turns only; "all": on every token',
        )


def _example_fields(add, images: bool, synthetic: ir.DataKind, data: ir.DataSource, origin) -> None:
    """The data fields of classify (images) and seq2seq (pairs): the source, its files and the
    options of the synthetic set, whichever is in use (a flag can switch between them)."""
    made = DATA_SOURCES[synthetic].defaults | (dict(data.options) if data.kind is synthetic else {})
    if images:
        add("data", str(data.kind), f"synthetic_images (made here) or arrays ({origin})")
        add(
            "data_path",
            data.path or "",
            "arrays: a .npz holding images [N, H, W, C] and labels [N]",
        )
    else:
        pairs = ir.DataKind.PAIRS
        files = DATA_SOURCES[pairs].defaults | (dict(data.options) if data.kind is pairs else {})
        add("data", str(data.kind), f"synthetic_pairs (made here) or pairs ({origin})")
        add("data_path", data.path or "", "pairs: the source token file")
        add("data_target", data.path2 or "", "pairs: the target token file")
        add(
            "data_dtype",
            str(data.dtype or ir.TokenWidth.U16),
            "token files' element type: u16 or u32",
        )
        add(
            "eos",
            made["eos"] if data.kind is synthetic else files["eos"],
            "the id that ends every example",
        )
    add("synthetic_count", made["count"], f"{synthetic}: how many examples it makes")
    if images:
        add(
            "synthetic_noise",
            float(made["noise"]),
            "synthetic_images: std of the noise on each class's pattern",
        )
    add("synthetic_seed", made["seed"], f"{synthetic}: the seed it is made from")


def _image_shapes(module: ir.Module, objective: Objective) -> list[tuple[str, str, int]]:
    """Image batches: each model's image shape (H, W, C) and number of classes, from its forward
    (loss(): from its `classes`)."""
    out = []
    for m in module.models:
        f = m.root.fwd
        images = next(a for a in f.args if a.name == "images")
        classes = (
            _classes(m.root).value.value if objective.spec_loss else ir.static_size(f.result[-1])
        )
        out.append((m.name, repr(tuple(d.size for d in images.dims[1:])), classes))
    return out


def _classes(root: ir.Instance) -> ir.HParam:
    """The `classes` hyperparameter of an image model's root, which loss() reads."""
    return filled(root.hparam("classes"), f"hyperparameter `classes` of {root.path}", "resolve")


_DOCS = {
    "batch": "global batch, in sequences",
    "seq": "tokens per sequence",
    "steps": "optimizer steps",
    "microbatches": "gradient accumulation: the batch runs in this many pieces",
    "clip": "clip gradients to this global norm; 0: off",
    "z_loss": "weight of the z-loss; 0: off",
    "eval_every": "steps between evaluations; 0: never",
    "eval_batches": "batches per evaluation",
    "log_every": "steps between log lines",
    "seed": "parameters and data order",
    "max_bad_steps": "non-finite steps in a row before rolling back",
}


def _doc(key: str, origin) -> str:
    return f"{_DOCS[key]}; {origin}"
