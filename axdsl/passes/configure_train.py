"""configure_train: check the `train { }` section and resolve every training setting.

    train {
      batch = 32  seq = 128  steps = 2000  microbatches = 2
      optimizer = adamw(lr = 3e-4, b1 = 0.9, b2 = 0.95, weight_decay = 0.1)
      schedule = cosine(warmup = 100, final = 0.1)
      clip = 1.0  z_loss = 1e-4  eval_every = 200  seed = 0
      data = tokens("data/train.bin", dtype = "u16")
      checkpoint(every = 500, keep = 3, async = true, dir = "checkpoints")
    }

The optimizers and schedules and their arguments are axdsl/optim/'s registry. An optimizer's dtype
arguments (`adamw(mu_dtype = bf16)` keeps the first moment in bf16) are optional and resolved
only when given.
Every key, optimizer, schedule and data source is checked here with a located error; the
defaults below apply to keys the spec leaves out, and `axdsl dump` shows each value's origin.
The batch must split evenly into micro-batches and over the mesh axes that shard `batch`; seq
must fit every model's max_seq; a warmup must fit in the run (and, for wsd, before the decay);
decay rates (b1, b2) lie in [0, 1) and `final` in [0, 1]. A schedule's warmup left out is a tenth
of the run, at most 100 steps. train.py re-checks what its command-line flags can change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from axdsl import finetune, lora, objectives, optim
from axdsl.errors import Diagnostics, Span, did_you_mean
from axdsl.ir import nodes as ir
from axdsl.ir.dtypes import INT32_MAX
from axdsl.ir.printer import value_text

DATA_SOURCES = (
    "default",
    "tokens",
    "text",
    "pairs",
    "arrays",
    "synthetic_images",
    "synthetic_pairs",
)
INT_KEYS = {
    "batch": (8, 1),
    "seq": (128, 2),
    "steps": (1000, 1),
    "microbatches": (1, 1),
    "eval_every": (100, 0),
    "eval_batches": (4, 1),
    "log_every": (10, 1),
    "seed": (0, 0),
    "max_bad_steps": (3, 1),
}
FLOAT_KEYS = {"clip": (1.0, 0.0), "z_loss": (0.0, 0.0)}
CHECKPOINT = {"every": 100, "keep": 3, "async": True, "dir": "checkpoints"}
# Mixed precision: the models' `dtype` (compute) and `param_dtype` (storage), overridden for
# training.
DTYPE_KEYS = ("dtype", "param_dtype")
FLOAT_DTYPES = ("f32", "bf16", "f16")
KEYS = (
    tuple(INT_KEYS)
    + tuple(FLOAT_KEYS)
    + DTYPE_KEYS
    + ("optimizer", "schedule", "data", "checkpoint", "objective", "evals")
    + finetune.KEYS
)
EVAL_SUFFIXES = (".jsonl", ".json", ".txt")  # multiple choice (JSON lines) or a text


def configure_train(module: ir.Module) -> ir.Module:
    diags = Diagnostics()
    sec = module.train_block
    values: dict[str, ir.Choice] = {}
    if sec is not None:
        for name, value, span in ((st.name, st.value, st.span) for st in sec.settings):
            if name == "checkpoint":
                diags.error(
                    span,
                    "`checkpoint` is a directive, not a setting",
                    'write checkpoint(every = 500, keep = 3, async = true, dir = "checkpoints")',
                )
            elif name not in KEYS:
                hint = did_you_mean(name, KEYS) or f"train settings: {', '.join(KEYS)}"
                diags.error(span, f"unknown train setting `{name}`", hint)
            elif name in values:
                diags.error(span, f"`{name}` is set twice in the train block", "keep one")
            else:
                checked = _check(name, value, span, diags)
                if checked is not None:
                    values[name] = ir.Choice(checked, ir.set_at(span))
        for d in sec.directives:
            if d.name == "lora":
                if "lora" in values:
                    diags.error(d.span, "lora(...) is given twice in the train block", "keep one")
                elif (adapters := lora.parse(d, diags)) is not None:
                    values["lora"] = ir.Choice(adapters, ir.set_at(d.span))
                continue
            if d.name != "checkpoint":
                hint = (
                    did_you_mean(d.name, ("checkpoint", "lora"))
                    or "the train block's directives are checkpoint(...) and lora(...)"
                )
                diags.error(d.span, f"unknown train directive `{d.name}`", hint)
                continue
            ckpt = _checkpoint(d, diags)
            if ckpt is not None:
                values["checkpoint"] = ir.Choice(ckpt, ir.set_at(d.span))
    _defaults(values, module)
    _cross_checks(values, module, diags)
    finetune.cross_check(values, module, diags)
    lora.cross_check(values, module, diags)
    _evals_fit(values, module, diags)
    diags.raise_if_any()
    # dtype and param_dtype appear only when set: by default training keeps the models' own.
    return replace(
        module,
        train_settings=ir.TrainSettings(
            tuple((k, values[k]) for k in KEYS + ("lora",) if k in values)
        ),
    )


def _defaults(values: dict[str, ir.Choice], module: ir.Module) -> None:
    for k, (default, _) in INT_KEYS.items():
        values.setdefault(k, ir.Choice(default))
    max_seq = module.models[0].root.hparam("max_seq")
    if "seq" in values and values["seq"].origin.is_default and max_seq is not None:
        values["seq"] = ir.Choice(min(128, max_seq.value.value), _default("128, at most max_seq"))
    for k, (fdefault, _) in FLOAT_KEYS.items():
        values.setdefault(k, ir.Choice(fdefault))
    default_opt = optim.OPTIMIZERS[optim.DEFAULT_OPTIMIZER]
    values.setdefault("optimizer", ir.Choice(ir.NamedCall(default_opt.kind, default_opt.arguments)))
    steps = values["steps"].value
    warm = min(100, max(steps // 10, 0))
    default_sched = optim.SCHEDULES[optim.DEFAULT_SCHEDULE]
    values.setdefault(
        "schedule", ir.Choice(ir.NamedCall(default_sched.kind, default_sched.arguments))
    )
    sched = values["schedule"].value
    if sched.arg("warmup", 0) is None:  # the warmup left out: a tenth of the run, at most 100
        args = tuple((k, warm if k == "warmup" else v) for k, v in sched.args)
        values["schedule"] = replace(values["schedule"], value=ir.NamedCall(sched.name, args))
    objective = (
        values["objective"].value.name if "objective" in values else ir.ObjectiveKind.NEXT_TOKEN
    )
    data = objectives.synthetic_default(objective)  # classify, seq2seq: nothing can be downloaded
    if data is not None:  # a learnable set made here
        values.setdefault("data", ir.Choice(data, _default(f"{data.kind}()")))
    values.setdefault("data", ir.Choice(ir.DataSource(ir.DataKind.DEFAULT)))
    values.setdefault("checkpoint", ir.Choice(ir.CheckpointPolicy()))


def _default(note: str) -> ir.Origin:
    return ir.Origin(ir.OriginKind.DEFAULT, note=note)


def _check(name: str, value: Any, span: Span, diags: Diagnostics) -> Any:
    if name in INT_KEYS:
        low = INT_KEYS[name][1]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            diags.error(span, f"`{name}` must be an integer >= {low}, got {_show(value)}")
            return None
        if value > INT32_MAX:
            diags.error(
                span,
                f"`{name}` must be at most 2**31 - 1 = {INT32_MAX:,}, got {value:,}",
                "the generated step counts in int32, as JAX does with x64 off",
            )
            return None
        return value
    if name in FLOAT_KEYS:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            diags.error(span, f"`{name}` must be a number >= 0, got {_show(value)}")
            return None
        return float(value)
    if name in DTYPE_KEYS:
        if not (isinstance(value, ir.NameValue) and value.id in FLOAT_DTYPES):
            diags.error(
                span,
                f"`{name}` is one of {', '.join(FLOAT_DTYPES)}, got {_show(value)}",
                "for example dtype = bf16",
            )
            return None
        return ir.DTYPES[value.id]
    if name == "optimizer":
        return _call(value, span, optim.OPTIMIZERS, "optimizer", diags)
    if name == "schedule":
        return _call(value, span, optim.SCHEDULES, "schedule", diags)
    if name == "objective":
        return objectives.check_call(value, span, diags)
    if name in finetune.KEYS:
        return finetune.check(name, value, span, diags)
    if name == "evals":
        return _evals(value, span, diags)
    return _data(value, span, diags)


def _evals_fit(values: dict[str, ir.Choice], module: ir.Module, diags: Diagnostics) -> None:
    """`evals` score a model that predicts the next token over rows of tokens (next_token, chat):
    the objectives whose train.py has the hook."""
    if "evals" not in values:
        return
    kind = values["objective"].value.name if "objective" in values else None
    if kind is not None and not objectives.get(kind).token_rows:
        diags.error(
            module.report_at(values["evals"].span),
            f"`evals` score next-token models, and this train block's objective is {kind}",
            "remove evals, or score the run's checkpoints with `axdsl eval RUN --task FILE`",
        )


def _evals(value: Any, span: Span, diags: Diagnostics) -> tuple[str, ...] | None:
    """`evals = ["tasks/choice.jsonl", "tasks/text.txt"]`: task files scored at each evaluation
    (docs/eval.md), relative to the spec's directory; train.py reads and checks their content."""
    paths = value if isinstance(value, tuple) else None
    if not paths or not all(isinstance(p, str) and p.strip() for p in paths):
        diags.error(
            span,
            "`evals` takes a non-empty list of task file paths",
            'for example evals = ["tasks/choice.jsonl", "tasks/text.txt"]',
        )
        return None
    for path in paths:
        if not path.endswith(EVAL_SUFFIXES):
            diags.error(
                span,
                f"`evals` task {path!r} is neither JSON lines nor a text",
                "multiple-choice tasks are .jsonl, perplexity texts are .txt (docs/eval.md)",
            )
            return None
    return tuple(p.strip() for p in paths)


def _call(
    value: Any,
    span: Span,
    table: Mapping[ir.OptimizerKind, optim.Optimizer] | Mapping[ir.ScheduleKind, optim.Schedule],
    what: str,
    diags: Diagnostics,
) -> ir.NamedCall | None:
    """`adamw(lr = 3e-4)` or a bare `adamw`: the kind and every argument, defaults filled in
    (`table` is optim's registry of optimizers or of schedules)."""
    if isinstance(value, ir.NameValue):
        value = ir.CallValue(value.id)
    if not isinstance(value, ir.CallValue):
        diags.error(
            span, f"`{what}` takes one of {', '.join(table)}, as in {next(iter(table))}(...)"
        )
        return None
    fn, args, kwargs = value.fn, value.args, value.kwargs
    if fn not in table:
        diags.error(
            span,
            f"unknown {what} `{fn}`",
            did_you_mean(fn, table) or f"{what}s: {', '.join(table)}",
        )
        return None
    if args:
        diags.error(
            span,
            f"{fn}(...) takes `name = value` arguments",
            (
                f"for example {fn}(lr = 3e-4)"
                if what == "optimizer"
                else f"for example {fn}(warmup = 100)"
            ),
        )
        return None
    entry = table[fn]  # type: ignore[index]  # a str key finds its StrEnum kind
    defaults: dict[str, Any] = dict(entry.defaults)
    out = dict(defaults)
    dtypes = entry.dtypes if isinstance(entry, optim.Optimizer) else ()
    decay_phase = isinstance(entry, optim.Schedule) and entry.decay_phase
    for k, v in kwargs:
        if k in dtypes:
            if isinstance(v, ir.NameValue) and v.id in FLOAT_DTYPES:
                out[k] = ir.DTYPES[v.id]
            else:
                diags.error(
                    span,
                    f"{fn}({k} = ...) is one of {', '.join(FLOAT_DTYPES)}, got {_show(v)}",
                    f"for example {fn}({k} = bf16)",
                )
            continue
        if k not in out:
            diags.error(
                span,
                f"{fn} has no argument `{k}`",
                did_you_mean(k, (*out, *dtypes)) or f"its arguments: {', '.join((*out, *dtypes))}",
            )
            continue
        if isinstance(defaults[k], bool):
            ok = isinstance(v, bool)
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
        if not ok:
            diags.error(
                span,
                f"{fn}({k} = ...) must be "
                f"{'true or false' if isinstance(defaults[k], bool) else 'a number >= 0'}, "
                f"got {_show(v)}",
            )
            continue
        out[k] = v
    if what == "optimizer" and out["lr"] <= 0:
        diags.error(span, f"{fn}: the learning rate must be positive")
    for k in ("b1", "b2"):
        if k in out and not out[k] < 1:
            diags.error(span, f"{fn}({k} = {out[k]}) is a decay rate, in [0, 1)")
    if out.get("warmup") is not None and out["warmup"] != int(out["warmup"]):
        diags.error(span, f"{fn}(warmup = {out['warmup']}) is a number of steps, an integer")
    if "final" in out and out["final"] > 1:
        diags.error(
            span, f"{fn}(final = {out['final']}) is a fraction of the peak learning rate, in [0, 1]"
        )
    if decay_phase and not 0 < out["decay"] <= 1:
        diags.error(span, f"{fn}(decay = ...) is the fraction of steps spent decaying, in (0, 1]")
    return ir.NamedCall(entry.kind, tuple(out.items()))


def _data(value: Any, span: Span, diags: Diagnostics):
    """ "default", tokens("file.bin", dtype = "u16") or text("file or directory"); pairs, arrays,
    synthetic_images and synthetic_pairs (objectives.check_data)."""
    if value == "default" or value == ir.NameValue("default"):
        return ir.DataSource(ir.DataKind.DEFAULT)
    if isinstance(value, ir.CallValue) and value.fn == "default":  # default(tokenizer = ...)
        opts = dict(value.kwargs)
        if value.args or set(opts) - {"tokenizer"}:
            diags.error(
                span,
                "default(...) takes only `tokenizer = ...`",
                "for example default(tokenizer = bpe(vocab = 4096))",
            )
            return None
        return ir.DataSource(
            ir.DataKind.DEFAULT, tokenizer=_tokenizer(opts.get("tokenizer"), span, diags)
        )
    if (
        isinstance(value, (ir.CallValue, ir.NameValue))
        and getattr(value, "fn", getattr(value, "id", "")) in objectives.DATA_SOURCES
    ):
        return objectives.check_data(value, span, diags)
    if isinstance(value, (ir.CallValue, ir.NameValue)) and _fn_name(value) in CHAT_EXAMPLES:
        return _chat(value, span, diags)
    if isinstance(value, ir.CallValue) and value.fn in ("tokens", "text"):
        fn, args, kwargs = value.fn, value.args, value.kwargs
        if len(args) != 1 or not isinstance(args[0], str):
            diags.error(span, f'{fn}(...) takes one path string, as in {fn}("data/train.bin")')
            return None
        opts = dict(kwargs)
        allowed = {"tokens": {"dtype"}, "text": {"tokenizer"}}[fn]
        for k in opts:
            if k not in allowed:
                diags.error(
                    span,
                    f"{fn}(...) has no option `{k}`",
                    (
                        'tokens(path, dtype = "u16") or text(path, tokenizer = ...); '
                        "token files are already tokenized"
                        if k == "tokenizer"
                        else 'tokens(path, dtype = "u16") or text(path, tokenizer = ...)'
                    ),
                )
                return None
        dtype = opts.get("dtype", ir.TokenWidth.U16.value)
        if dtype not in tuple(ir.TokenWidth):
            diags.error(span, f'token files hold "u16" or "u32" tokens, not {_show(dtype)}')
            return None
        if fn == "text":
            return ir.DataSource(
                ir.DataKind.TEXT, args[0], tokenizer=_tokenizer(opts.get("tokenizer"), span, diags)
            )
        return ir.DataSource(ir.DataKind.TOKENS, args[0], ir.TokenWidth(dtype))
    diags.error(
        span,
        'data is "default", tokens("file.bin", dtype = "u16"), text("path"), '
        'chat("conversations.jsonl", tokenizer = "dir"), pairs("src.bin", "tgt.bin"), '
        'arrays("train.npz"), synthetic_images() or synthetic_pairs()',
        "the default is the Python standard library's source files, read as bytes",
    )
    return None


def _fn_name(value: ir.CallValue | ir.NameValue) -> str:
    """The name of a call (`chat(...)`) or of a bare name (`chat`)."""
    return value.fn if isinstance(value, ir.CallValue) else value.id


# chat(...) and preferences(...): a .jsonl rendered with a tokenizer's chat template; their options
CHAT_EXAMPLES = {
    "chat": 'chat("conversations.jsonl", tokenizer = "hf/llama", train_on = "assistant")',
    "preferences": 'preferences("pairs.jsonl", tokenizer = "hf/llama")',
}
CHAT_OPTIONS = {"chat": ("tokenizer", "train_on"), "preferences": ("tokenizer",)}


def _chat(value: ir.CallValue | ir.NameValue, span: Span, diags: Diagnostics):
    """`chat("conversations.jsonl", tokenizer = "DIR or tokenizer.json", train_on = "assistant")`:
    conversations rendered with the tokenizer's chat template; the loss on the assistant turns
    (train_on = "assistant", the default) or on every token ("all"). `preferences("pairs.jsonl",
    tokenizer = ...)`: (prompt, chosen, rejected) lines for objective = dpo(...), rendered alike."""
    fn = _fn_name(value)
    example, allowed = CHAT_EXAMPLES[fn], CHAT_OPTIONS[fn]
    args = value.args if isinstance(value, ir.CallValue) else ()
    opts = dict(value.kwargs) if isinstance(value, ir.CallValue) else {}
    if len(args) != 1 or not isinstance(args[0], str) or not args[0]:
        diags.error(span, f"{fn}(...) takes one path string, a .jsonl file", f"as in {example}")
        return None
    for k in opts:
        if k not in allowed:
            diags.error(
                span,
                f"{fn}(...) has no option `{k}`",
                did_you_mean(k, allowed) or f"as in {example}",
            )
            return None
    tokenizer = opts.get("tokenizer")
    if not isinstance(tokenizer, str) or not tokenizer:
        diags.error(
            span,
            f'{fn}(...) needs `tokenizer = "..."`: the directory of a Hugging Face tokenizer '
            "(tokenizer.json and its chat template) or its tokenizer.json",
            f"as in {example}; `axdsl import-hf` writes one beside the model",
        )
        return None
    if fn == "preferences":
        return ir.DataSource(ir.DataKind.PREFERENCES, args[0], tokenizer=ir.Tokenizer(tokenizer))
    train_on = opts.get("train_on", ir.TrainOn.ASSISTANT.value)
    if train_on not in tuple(ir.TrainOn):
        diags.error(
            span,
            f'chat(train_on = {_show(train_on)}) is "assistant" or "all"',
            '"assistant" (the default) takes the loss on the assistant turns only',
        )
        return None
    return ir.DataSource(
        ir.DataKind.CHAT,
        args[0],
        tokenizer=ir.Tokenizer(path=tokenizer),
        train_on=ir.TrainOn(train_on),
    )


def _tokenizer(value: Any, span: Span, diags: Diagnostics) -> ir.Tokenizer | None:
    """`tokenizer = "tokenizer.json"` (a tokenizers file, e.g. an imported HF model's) or
    `tokenizer = bpe(vocab = N)` (a byte-level BPE trained on the data, saved in the run)."""
    if value is None:
        return None
    if isinstance(value, str) and value:
        return ir.Tokenizer(path=value)
    if (
        isinstance(value, (ir.CallValue, ir.NameValue))
        and getattr(value, "fn", getattr(value, "id", "")) == "bpe"
    ):
        opts = dict(getattr(value, "kwargs", ()))
        vocab = opts.pop("vocab", 0)
        if getattr(value, "args", ()) or opts:
            diags.error(span, "bpe(...) takes only `vocab = N`", "for example bpe(vocab = 4096)")
            return None
        if (
            isinstance(vocab, bool)
            or not isinstance(vocab, int)
            or not (vocab == 0 or 256 < vocab < 1 << 31)
        ):
            diags.error(
                span,
                f"bpe(vocab = {_show(vocab)}) must be an integer above 256, the byte alphabet",
                "omit vocab to use the model's vocabulary size",
            )
            return None
        return ir.Tokenizer(bpe_vocab=vocab)
    diags.error(
        span,
        f"tokenizer = {_show(value)} is neither a tokenizer.json path nor bpe(vocab = N)",
        'for example tokenizer = "hf/tokenizer.json" or tokenizer = bpe(vocab = 4096)',
    )
    return None


def _checkpoint(d: ir.Directive, diags: Diagnostics):
    if d.args:
        diags.error(
            d.args[0].span,
            "checkpoint(...) takes `name = value` arguments",
            "for example checkpoint(every = 500, keep = 3)",
        )
        return None
    out: dict[str, Any] = dict(CHECKPOINT)
    for k, v, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if k not in out:
            diags.error(
                span,
                f"checkpoint has no option `{k}`",
                did_you_mean(k, CHECKPOINT) or f"options: {', '.join(CHECKPOINT)}",
            )
        elif k in ("every", "keep") and not (
            isinstance(v, int) and not isinstance(v, bool) and v >= (0 if k == "every" else 1)
        ):
            diags.error(
                span, f"checkpoint({k} = ...) must be an integer >= {0 if k == 'every' else 1}"
            )
        elif k == "async" and not isinstance(v, bool):
            diags.error(span, "checkpoint(async = ...) is true or false")
        elif k == "dir" and not isinstance(v, str):
            diags.error(
                span, "checkpoint(dir = ...) is a path string, relative to the run directory"
            )
        else:
            out[k] = v
    return ir.CheckpointPolicy(out["every"], out["keep"], out["async"], out["dir"])


def _cross_checks(values: dict[str, ir.Choice], module: ir.Module, diags: Diagnostics) -> None:
    batch, micro = values["batch"], values["microbatches"]

    def where(c: ir.Choice) -> Span:
        return module.report_at(c.span)

    s = module.schedule
    if batch.value % micro.value:
        diags.error(
            where(micro),
            f"microbatches = {micro.value} does not divide batch = {batch.value}",
            "pick a divisor of the batch",
        )
    elif s is not None:
        ways = math.prod(s.size(a) for a in s.kept_axes("batch"))
        if batch.origin.is_default and batch.value % (ways * micro.value):
            need = ways * micro.value
            batch = values["batch"] = ir.Choice(
                need * math.ceil(batch.value / need),
                _default(f"a multiple of the {ways}-way batch sharding"),
            )
        per_micro = batch.value // micro.value
        if ways > 1 and per_micro % ways:
            diags.error(
                where(batch),
                f"each micro-batch has {per_micro} sequences, which the {ways}-way "
                f"batch sharding on {s.name} does not divide",
                f"use a batch that is a multiple of {ways * micro.value}",
            )
    for k in DTYPE_KEYS:
        for m in module.models:
            if k in values and m.root.hparam(k) is None:
                diags.error(
                    module.report_at(values[k].span),
                    f"model `{m.name}` has no `{k}` to override",
                    f"its layer `{m.root.layer}` would need a `{k}: dtype` hyperparameter",
                )
    seq = values["seq"]
    for m in module.models:
        ms = m.root.hparam("max_seq")
        if ms is not None and isinstance(ms.value.value, int) and ms.value.value < 1:
            diags.error(
                ms.origin.span or ms.span,  # the user's `max_seq = ...`, else the declaration
                f"max_seq = {ms.value.value} leaves {m.name} no position to run",
                "set max_seq to the longest sequence the model runs (at least 1)",
            )
            continue
        if ms is not None and seq.value > ms.value.value and seq.span is not None:
            diags.error(
                seq.span,
                f"seq = {seq.value} is longer than {m.name}'s max_seq = {ms.value.value}",
                f"use seq <= {ms.value.value}, or raise max_seq in the model",
            )
    objectives.cross_check(values, module, diags)
    sched = values["schedule"]
    args = dict(sched.value.args)
    steps = values["steps"].value
    if sched.span is not None and args.get("warmup", 0) > steps:
        diags.error(
            sched.span,
            f"warmup = {args['warmup']} is longer than the run (steps = {steps})",
            "use a warmup shorter than steps",
        )
    elif (
        sched.span is not None
        and optim.schedule(sched.value.name).decay_phase
        and args["warmup"] > int(steps * (1 - args["decay"]))
    ):
        diags.error(
            sched.span,
            f"{sched.value.name}: warmup = {args['warmup']} overlaps the decay, which starts at "
            f"step {int(steps * (1 - args['decay']))} of {steps}",
            "shorten the warmup or the decay",
        )


def _show(v: Any) -> str:
    return value_text(v)
