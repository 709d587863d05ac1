"""Training objectives: what a train block's `objective = ...` builds, and which models fit it.

    objective = next_token()                # the default: tokens [B, S] -> logits [B, S, vocab]
    objective = masked_lm(rate = 0.15, mask_token = 4)  # BERT's masked-LM, 80/10/10 replacement
    objective = seq2seq(start_token = 0)    # teacher forcing: dec_tokens = start + targets[:-1]
    objective = classify(smoothing = 0.1)   # labels [B], logits [B, classes]
    objective = loss()                      # the forward returns the loss itself
    objective = dpo(beta = 0.1)             # preference pairs against a frozen reference
    objective = simpo(beta = 2.0, gamma = 0.5)  # preference pairs, length-normalized, no reference
    objective = orpo(beta = 0.1)            # the chosen answers' NLL plus an odds-ratio term

`loss()` is for anything the others do not say: the root forward takes batch fields by name and
returns one number (every dim of size 1, as `mean(x, B)` leaves it), which train.py minimizes.
Its batches are those of its data: images and labels (arrays, synthetic_images), packed pairs
(tokens, segments, targets, dec_segments) or token rows (tokens, segments, types).

Each objective names the root forward's inputs it reads (issue 11's names: tokens, types,
segments, dec_tokens, dec_segments, images) and the output rank it needs; configure_train checks a
model against them with a located error at the `objective = ...` line. The generated loss_fn
(templates/model.py.j2) and batches (axdsl/runtime/examples.py) follow the objective.

Each objective has one entry in `REGISTRY` (keyed by `ir.ObjectiveKind`) that holds what the
other stages ask of it: its arguments, the model it fits, the data it reads, its batches' fields,
whether they have a sequence length, its loss_fn (`losses.py`) and its metrics. Codegen and the
templates read these flags; nothing else compares objective names. This module also checks the
data sources the non-LM objectives read (pairs, arrays, synthetic_images).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from axdsl.errors import Diagnostics, Span, did_you_mean, relocated
from axdsl.ir import nodes as ir
from axdsl.ir.head import has_lm_signature
from axdsl.ir.rewrite import prims_of
from axdsl.ir.printer import value_text
from axdsl.objectives import losses
from axdsl.objectives.losses import LossSite

Kind = ir.ObjectiveKind
TOKEN_DATA = (ir.DataKind.DEFAULT, ir.DataKind.TOKENS, ir.DataKind.TEXT)
PAIR_DATA = (ir.DataKind.PAIRS, ir.DataKind.SYNTHETIC_PAIRS)
IMAGE_DATA = (ir.DataKind.ARRAYS, ir.DataKind.SYNTHETIC_IMAGES)


@dataclass(frozen=True)
class Objective:
    """One objective: what it needs from the model, what it reads, and what train.py and model.py
    do for it."""

    kind: ir.ObjectiveKind
    arguments: tuple[tuple[str, float | int | None], ...]  # and their defaults (None: required)
    required: tuple[str, ...]  # forward inputs it needs
    optional: tuple[str, ...]  # forward inputs it can also give
    rank: int  # of the root forward's result
    result: str  # the result, in words, for errors
    data: tuple[ir.DataKind, ...]  # the data kinds it reads
    data_hint: str = 'for example data = tokens("train.bin")'  # when it is given another kind
    token_rows: bool = False  # batches are rows of tokens [B, S + 1] (runtime.get_batch), shifted
    fields: tuple[str, ...] = ()  # else a dict of these arrays (loss(): its data's batches')
    trimmed: tuple[str, ...] = ()  # fields a batch holds only when the forward takes them
    images: bool = False  # batches are images [B, H, W, C] and labels [B]: no sequence length
    seq_doc: str = ""  # TrainConfig's seq comment when it is not tokens per sequence
    synthetic: ir.DataKind | None = None  # its data when the train block names none (made here)
    masks: bool = False  # loss_fn takes a key that picks masked positions (a step's randomness)
    accuracy: bool = False  # model.py has `accuracy`; evaluation logs eval_accuracy
    spec_loss: bool = False  # the root forward returns the loss itself
    loss: Callable[[LossSite], str] | None = None  # loss_fn's source; None: model.py.j2's own
    doc: str = ""  # what model.py's loss_fn computes, for its docstring
    check: Callable[[dict[str, Any], Span, Diagnostics], None] | None = None  # its arguments
    stats: tuple[str, ...] = ()  # metrics loss_fn returns beside the loss (dpo, simpo, orpo)
    lm: bool = False  # it trains a next-token model: tokens [B, S] -> logits [B, S, vocab]
    reference: bool = False  # rows carry the initial parameters' log-probabilities (dpo)

    @property
    def has_seq(self) -> bool:
        return not self.images

    @property
    def preferences(self) -> bool:
        """Its rows are preference pairs (dpo, simpo, orpo): chosen and rejected answers with
        their masks, [B, seq + 1] each, and two sequences a row for the throughput."""
        return self.data == (ir.DataKind.PREFERENCES,)


def _check_masked_lm(args: dict[str, Any], span: Span, diags: Diagnostics) -> None:
    if not 0 < args["rate"] < 1:
        diags.error(
            span,
            f"masked_lm(rate = {args['rate']}) is the fraction of tokens masked, in (0, 1)",
            "BERT masks 0.15",
        )


@dataclass(frozen=True)
class Weight:
    """A preference objective's numeric argument: the least it may be (`above`: strictly), what
    it means and the values its paper uses, for the error a value out of range gets."""

    name: str
    least: float
    above: bool
    meaning: str
    usual: str

    def check(self, objective: str, args: dict[str, Any], span: Span, diags: Diagnostics) -> None:
        value = args[self.name]
        if value > self.least or (value == self.least and not self.above):
            return
        bound = f"{'>' if self.above else '>='} {self.least:g}"
        diags.error(
            span, f"{objective}({self.name} = {value}) {self.meaning}, a number {bound}", self.usual
        )


def _weights(
    objective: str, *weights: Weight
) -> Callable[[dict[str, Any], Span, Diagnostics], None]:
    """The argument check of a preference objective: each of its weights in range."""

    def check(args: dict[str, Any], span: Span, diags: Diagnostics) -> None:
        for w in weights:
            w.check(objective, args, span, diags)

    return check


_check_dpo = _weights(
    "dpo",
    Weight(
        "beta", 0, True, "weighs the log-ratios to the reference", "the DPO paper uses 0.1 to 0.5"
    ),
)
_check_simpo = _weights(
    "simpo",
    Weight(
        "beta", 0, True, "scales the length-normalized rewards", "the SimPO paper uses 2.0 to 2.5"
    ),
    Weight(
        "gamma",
        0,
        False,
        "is the target reward margin",
        "the SimPO paper uses 0.5 to 1.5 (0: no margin)",
    ),
)
_check_orpo = _weights(
    "orpo",
    Weight(
        "beta",
        0,
        True,
        "weighs the odds-ratio term beside the NLL",
        "the ORPO paper uses 0.1 to 0.25",
    ),
)


def _check_classify(args: dict[str, Any], span: Span, diags: Diagnostics) -> None:
    if not 0 <= args["smoothing"] < 1:
        diags.error(
            span, f"classify(smoothing = {args['smoothing']}) is label smoothing, in [0, 1)"
        )


REGISTRY: dict[ir.ObjectiveKind, Objective] = {
    # chat data: token rows too, with a loss_mask field (runtime/chat.py, model.py's loss_fn)
    Kind.NEXT_TOKEN: Objective(
        Kind.NEXT_TOKEN,
        (("sep", -1),),  # sep: documents end with it, for a packed model's segment ids; -1: none
        ("tokens",),
        (),
        3,
        "logits [B, S, vocab]",
        (*TOKEN_DATA, ir.DataKind.CHAT),
        token_rows=True,
        lm=True,
    ),
    Kind.MASKED_LM: Objective(
        Kind.MASKED_LM,
        (("rate", 0.15), ("mask_token", None), ("sep", -1)),  # sep: documents end with it; -1: none
        ("tokens",),
        ("segments", "types"),
        3,
        "logits [B, S, vocab]",
        TOKEN_DATA,
        fields=("tokens", "segments", "types"),
        trimmed=("segments", "types"),
        masks=True,
        accuracy=True,
        loss=losses.masked_lm_loss,
        doc="the masked-LM loss (BERT's 80/10/10 masking, loss on masked positions only) and "
        "`accuracy`",
        check=_check_masked_lm,
    ),
    Kind.SEQ2SEQ: Objective(
        Kind.SEQ2SEQ,
        (("start_token", 0),),
        ("tokens", "dec_tokens"),
        ("segments", "dec_segments"),
        3,
        "logits [B, T, vocab]",
        PAIR_DATA,
        'for example data = pairs("src.bin", "tgt.bin", eos = 0)',
        fields=("tokens", "segments", "targets", "dec_segments"),
        seq_doc="positions per row, of the source and of the target",
        synthetic=ir.DataKind.SYNTHETIC_PAIRS,
        loss=losses.seq2seq_loss,
        doc="the sequence-to-sequence loss (teacher forcing, loss on target tokens)",
    ),
    Kind.CLASSIFY: Objective(
        Kind.CLASSIFY,
        (("smoothing", 0.0),),
        ("images",),
        (),
        2,
        "logits [B, classes]",
        IMAGE_DATA,
        'for example data = arrays("train.npz") or synthetic_images()',
        fields=("images", "labels"),
        images=True,
        synthetic=ir.DataKind.SYNTHETIC_IMAGES,
        accuracy=True,
        loss=losses.classify_loss,
        doc="the classification loss (cross-entropy against `labels`), and `accuracy`",
        check=_check_classify,
    ),
    # the root forward computes the loss itself (one number); train.py minimizes it
    Kind.LOSS: Objective(
        Kind.LOSS,
        (),
        (),
        (),
        0,
        "a loss: one number (every dim of size 1, as `mean(x, B)` leaves it)",
        TOKEN_DATA + PAIR_DATA + IMAGE_DATA,
        spec_loss=True,
        loss=losses.explicit_loss,
        doc="the loss the spec's forward computes (objective = loss())",
    ),
}
PAIR_FIELDS = ("chosen", "chosen_mask", "rejected", "rejected_mask")
PAIR_STATS = ("reward_accuracy", "margin", "chosen_logp", "rejected_logp")


def _preference(
    kind: Kind,
    arguments: tuple[tuple[str, Any], ...],
    loss: Callable[[losses.LossSite], str],
    doc: str,
    check: Callable[[dict[str, Any], Span, Diagnostics], None],
    stats: tuple[str, ...] = PAIR_STATS,
    reference: bool = False,
) -> Objective:
    """A preference objective's entry: a next-token model over preferences(...) pairs, rows of a
    chosen and a rejected answer with their masks (and the reference's log-probabilities of both
    when it has a `reference`)."""
    fields = PAIR_FIELDS + (("ref_chosen", "ref_rejected") if reference else ())
    return Objective(
        kind,
        arguments,
        ("tokens",),
        (),
        3,
        "logits [B, S, vocab]",
        (ir.DataKind.PREFERENCES,),
        'data = preferences("pairs.jsonl", tokenizer = "DIR")',
        fields=fields,
        seq_doc="tokens per row of a chosen or a rejected conversation, less one",
        loss=loss,
        doc=doc,
        check=check,
        stats=stats,
        lm=True,
        reference=reference,
    )


# Direct preference optimization (Rafailov et al. 2023) of a next-token model over preference
# pairs: the reference log-probabilities come from the run's initial parameters (train.py computes
# them once per row, as `ref_chosen` and `ref_rejected`, before the first step).
REGISTRY[Kind.DPO] = _preference(
    Kind.DPO,
    (("beta", 0.1),),
    losses.dpo_loss,
    "the DPO loss over (chosen, rejected) pairs against the reference log-probabilities",
    _check_dpo,
    reference=True,
)
# SimPO (Meng et al. 2024) and ORPO (Hong et al. 2024): preference objectives without a
# reference, so their rows carry no reference log-probabilities and train.py runs no frozen pass.
REGISTRY[Kind.SIMPO] = _preference(
    Kind.SIMPO,
    (("beta", 2.0), ("gamma", 0.5)),
    losses.simpo_loss,
    "the SimPO loss over (chosen, rejected) pairs: length-normalized rewards, no reference",
    _check_simpo,
)
REGISTRY[Kind.ORPO] = _preference(
    Kind.ORPO,
    (("beta", 0.1),),
    losses.orpo_loss,
    "the ORPO loss over (chosen, rejected) pairs: the chosen answers' NLL plus the log "
    "odds-ratio term, no reference",
    _check_orpo,
    stats=PAIR_STATS + ("nll", "log_odds"),
)
# Objectives: their arguments and defaults (None: required), as configure_train checks them
ARGUMENTS = {str(k): dict(o.arguments) for k, o in REGISTRY.items()}
# loss(): which objective's batches each data kind gives (else masked_lm's token rows)
LOSS_BATCHES = {
    **{d: Kind.CLASSIFY for d in IMAGE_DATA},
    **{d: Kind.SEQ2SEQ for d in PAIR_DATA},
}


@dataclass(frozen=True)
class ExampleData:
    """A data source beyond tokens/text: how many path strings it takes, its options and their
    defaults, and an example for errors."""

    paths: int
    options: tuple[tuple[str, Any], ...]
    example: str

    @property
    def defaults(self) -> dict[str, Any]:
        return dict(self.options)


DATA_SOURCES: dict[ir.DataKind, ExampleData] = {
    ir.DataKind.PAIRS: ExampleData(
        2, (("eos", 0), ("dtype", "u16")), 'pairs("src.bin", "tgt.bin", eos = 0)'
    ),
    ir.DataKind.ARRAYS: ExampleData(1, (), 'arrays("train.npz")'),
    ir.DataKind.SYNTHETIC_IMAGES: ExampleData(
        0,
        (("count", 4096), ("noise", 0.5), ("seed", 0)),
        "synthetic_images(count = 4096, noise = 0.5)",
    ),
    ir.DataKind.SYNTHETIC_PAIRS: ExampleData(
        0, (("count", 4096), ("eos", 1), ("seed", 0)), "synthetic_pairs(count = 4096, eos = 1)"
    ),
}


def get(kind: ir.ObjectiveKind | str) -> Objective:
    """The registry entry of `kind` (a generated train.py's OBJECTIVE string is one too)."""
    return REGISTRY[ir.ObjectiveKind(kind)]


def objective_name(module: ir.Module) -> ir.ObjectiveKind:
    """The objective module's train block builds: next_token unless it says otherwise."""
    t = module.train_settings
    if t is None or "objective" not in dict(t.settings):
        return Kind.NEXT_TOKEN
    return ir.ObjectiveKind(t.get("objective").name)


def objective_of(module: ir.Module) -> Objective:
    """The registry entry of the objective module's train block builds."""
    return REGISTRY[objective_name(module)]


def batch_fields(batches: ir.ObjectiveKind | str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The fields of one batch of `batches`' kind for a forward taking `names`: classify's images
    and labels, seq2seq's four packed fields, masked_lm's tokens and the segments/types it takes."""
    o = get(batches)
    return tuple(k for k in o.fields if k not in o.trimmed or k in names)


def batches_of(module: ir.Module) -> ir.ObjectiveKind:
    """The objective whose batches the train block reads: its own, or for loss() the one its data
    kind implies (classify's images, seq2seq's pairs, masked_lm's token rows)."""
    name = objective_name(module)
    if not REGISTRY[name].spec_loss:
        return name
    return LOSS_BATCHES.get(module.train.get("data").kind, Kind.MASKED_LM)


def batches_objective(module: ir.Module) -> Objective:
    """The registry entry of batches_of(module)."""
    return REGISTRY[batches_of(module)]


def _input_names(root: ir.Instance) -> set[str]:
    """The names of the root forward's inputs."""
    return {a.name for a in root.forward.args} if root.forward is not None else set()


def objective_args(module: ir.Module) -> dict[str, Any]:
    t = module.train_settings
    if t is None or "objective" not in dict(t.settings):
        return {}
    return dict(t.get("objective").args)


def fits(root: ir.Instance, name: ir.ObjectiveKind | str) -> bool:
    """Whether the root layer's forward has the inputs and output rank objective `name` needs."""
    return _mismatch(root, get(name)) is None


def trainable(module: ir.Module) -> bool:
    """Whether train.py is generated: the first model fits the train block's objective."""
    return fits(module.models[0].root, objective_name(module))


def inputs(root: ir.Instance) -> tuple[str, ...]:
    return tuple(a.name for a in root.fwd.args)


def _check_causal(module: ir.Module, diags: Diagnostics) -> None:
    """Next-token prediction reads each position's future through attention that is not causal
    (nor windowed, nor masked): it trains to copy the next token, to a near-zero loss and useless
    samples. An error at the user's line that made it so (`Attention(causal = false)`)."""
    for m in module.models:
        if _mismatch(m.root, REGISTRY[Kind.NEXT_TOKEN]) is not None:
            continue  # next_token does not train it (an encoder, a classifier): no train.py
        tree = {i.path: i for i in m.root.walk()}
        for inst in tree.values():
            for prim in prims_of(inst, "attention"):
                causal, window = (ir.plain(prim.attr(k)) for k in ("causal", "window"))
                masked = any(prim.operand(k) is not None for k in ("mask", "bias"))
                if causal or window or masked:  # segment ids still show a segment's future
                    continue
                user = ir.user_line(
                    ("causal",), functools.partial(ir.hparam_origins, tree, inst.path)
                )
                diags.add(
                    relocated(
                        prim.span,
                        f"model `{m.name}` trains to predict the next token, but attention in "
                        f"`{inst.path}` is not causal: every position sees the token it predicts",
                        "keep causal = true for a language model; an encoder (BERT) trains with "
                        "objective = masked_lm(...)",
                        user,
                        f"in layer `{inst.layer}` at `{inst.path}`",
                    )
                )
                return


def _mismatch(root: ir.Instance, shape: Objective) -> str | None:
    """Why the root forward does not fit objective `shape`; None when it does."""
    f = root.forward
    if f is None:
        return "it has no forward"
    names = inputs(root)
    if shape.lm:
        ok = has_lm_signature(root)
        return None if ok else "its forward is not tokens [B, S] -> logits [B, S, vocab]"
    if shape.spec_loss:  # its inputs are checked against the data's fields (_loss_fields)
        if any(d.size != 1 for d in f.result):
            return (
                f"its forward returns [{', '.join(str(d) for d in f.result)}], not {shape.result}"
            )
        return None
    missing = [n for n in shape.required if n not in names]
    if missing:
        return f"its forward takes {_list(names)}, with no `{missing[0]}`"
    extra = [n for n in names if n not in shape.required + shape.optional]
    if extra:
        return (
            f"its forward takes `{extra[0]}`, which {shape.kind} does not provide "
            f"(it provides {_list(shape.required + shape.optional)})"
        )
    if len(f.result) != shape.rank:
        return f"its forward returns [{', '.join(str(d) for d in f.result)}], not {shape.result}"
    return None


def _loss_fields(module: ir.Module, values: dict[str, ir.Choice], diags: Diagnostics) -> None:
    """loss(): every forward input is a field of the data's batches; image batches need `images`
    and the root's `classes` (synthetic_images makes that many patterns, arrays' labels are below
    it)."""
    kind = values["data"].value.kind
    batches = REGISTRY[LOSS_BATCHES.get(kind, Kind.MASKED_LM)]
    fields = batches.fields
    where = module.report_at(values["objective"].span)
    for m in module.models:
        names = inputs(m.root)
        extra = [n for n in names if n not in fields]
        if extra:
            diags.error(
                where,
                f"objective loss reads model `{m.name}`'s input `{extra[0]}` from data `{kind}`, "
                f"whose batches hold {_list(fields)}",
                "name the forward's inputs after the batch's fields",
            )
            return
        if batches.images and ("images" not in names or m.root.hparam("classes") is None):
            diags.error(
                where,
                f"objective loss over `{kind}` needs model `{m.name}`'s forward to take `images` "
                "and its layer a `classes` hyperparameter",
                "images [B, H, W, C] and labels [B] below classes",
            )
            return


def _list(names) -> str:
    return ", ".join(f"`{n}`" for n in names) or "nothing"


def check_call(value: Any, span: Span, diags: Diagnostics) -> ir.NamedCall | None:
    """`masked_lm(rate = 0.15, mask_token = 4)`: the name and every argument, defaults filled in
    (the name as an ir.ObjectiveKind)."""
    table = ARGUMENTS
    if isinstance(value, ir.NameValue):
        value = ir.CallValue(value.id)
    if not isinstance(value, ir.CallValue):
        diags.error(
            span,
            f"`objective` is one of {', '.join(f'{k}(...)' for k in table)}",
            "for example objective = masked_lm(rate = 0.15, mask_token = 4)",
        )
        return None
    if value.fn not in table:
        diags.error(
            span,
            f"unknown objective `{value.fn}`",
            did_you_mean(value.fn, tuple(table)) or f"objectives: {', '.join(table)}",
        )
        return None
    if value.args:
        diags.error(
            span,
            f"{value.fn}(...) takes `name = value` arguments",
            "for example masked_lm(rate = 0.15, mask_token = 4)",
        )
        return None
    out = dict(table[value.fn])
    for k, v in value.kwargs:
        if k not in out:
            diags.error(
                span,
                f"{value.fn} has no argument `{k}`",
                did_you_mean(k, tuple(out)) or f"its arguments: {', '.join(out) or 'none'}",
            )
            continue
        integer = k in ("mask_token", "start_token", "sep")
        if integer and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            diags.error(
                span, f"{value.fn}({k} = ...) is a token id, an integer >= 0, got {value_text(v)}"
            )
            continue
        if not integer and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
            diags.error(span, f"{value.fn}({k} = ...) is a number, got {value_text(v)}")
            continue
        out[k] = v if integer else float(v)
    for k, v in out.items():
        if v is None:
            diags.error(
                span,
                f"{value.fn}(...) needs `{k}`",
                f"the id of the [MASK] token, as in " f"{value.fn}({k} = 4)",
            )
            return None
    objective = get(value.fn)
    if objective.check is not None:
        objective.check(out, span, diags)
    return ir.NamedCall(objective.kind, tuple(out.items()))


def synthetic_default(objective: ir.ObjectiveKind | str) -> ir.DataSource | None:
    """classify's and seq2seq's data when the train block names none: a learnable set made on the
    machine (nothing can be downloaded); None for the objectives that read token data."""
    kind = get(objective).synthetic
    return ir.DataSource(kind, options=DATA_SOURCES[kind].options) if kind is not None else None


def check_data(value: Any, span: Span, diags: Diagnostics) -> ir.DataSource | None:
    """pairs("src.bin", "tgt.bin", eos = 0, dtype = "u16"), arrays("train.npz") or
    synthetic_images(count = 4096, noise = 0.5, seed = 0)."""
    if isinstance(value, ir.NameValue):
        value = ir.CallValue(value.id)
    fn, args, kwargs = value.fn, value.args, dict(value.kwargs)
    source = DATA_SOURCES[ir.DataKind(fn)]
    paths, example = source.paths, source.example
    if len(args) != paths or not all(isinstance(a, str) for a in args):
        diags.error(
            span,
            f"{fn}(...) takes {paths or 'no'} path string{'s' if paths != 1 else ''}",
            f"as in {example}",
        )
        return None
    opts = source.defaults
    for k, v in kwargs.items():
        if k not in opts:
            diags.error(
                span,
                f"{fn}(...) has no option `{k}`",
                did_you_mean(k, tuple(opts)) or f"as in {example}",
            )
            return None
        if k == "dtype":
            if v not in tuple(ir.TokenWidth):
                diags.error(span, f'token files hold "u16" or "u32" tokens, not {value_text(v)}')
                return None
        elif k == "noise":
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0):
                diags.error(span, f"{fn}(noise = ...) is a standard deviation, a number >= 0")
                return None
            v = float(v)
        elif not (
            isinstance(v, int) and not isinstance(v, bool) and v >= (2 if k == "count" else 0)
        ):
            diags.error(
                span,
                f"{fn}({k} = ...) must be an integer >= {2 if k == 'count' else 0}, "
                f"got {value_text(v)}",
            )
            return None
        opts[k] = v
    dtype = opts.pop("dtype", None)
    return ir.DataSource(
        ir.DataKind(fn),
        args[0] if args else None,
        ir.TokenWidth(dtype) if dtype is not None else None,
        args[1] if len(args) > 1 else None,
        tuple(opts.items()),
    )


def cross_check(values: dict[str, ir.Choice], module: ir.Module, diags: Diagnostics) -> None:
    """The objective against every model's forward, its ids against the vocab, the data kind."""
    choice = values.get("objective")
    if choice is None or REGISTRY[choice.value.name].lm:
        _check_causal(module, diags)
    if choice is None:  # next_token by default: a model that does not fit simply gets no train.py
        data = values["data"]
        if data.value.kind is ir.DataKind.PREFERENCES:
            diags.error(
                module.report_at(data.span),
                "data preferences(...) is for objective = dpo(...), simpo(...) or orpo(...): "
                "pairs of a chosen and a rejected answer",
                "add objective = dpo(beta = 0.1) to the train block, or train on "
                'chat("conversations.jsonl", tokenizer = ...)',
            )
        if data.value.kind in DATA_SOURCES:
            diags.error(
                module.report_at(data.span),
                f"data {data.value.kind}(...) is for another objective than next_token",
                "set objective = seq2seq(...) for pairs and synthetic_pairs, classify() for arrays "
                "and synthetic_images",
            )
        return
    shape, args = get(choice.value.name), dict(choice.value.args)
    name, where = shape.kind, module.report_at(choice.span)
    if shape.spec_loss:
        _loss_fields(module, values, diags)
    for m in module.models:
        why = _mismatch(m.root, shape)
        if why is not None:
            hint = (
                "reduce the loss to one number, "
                "e.g. `return mean(cross_entropy(logits, labels), B)`"
                if shape.spec_loss
                else (
                    f"{name} needs forward({', '.join(shape.required)}"
                    f"{''.join(f', {o}?' for o in shape.optional)}) -> {shape.result}"
                )
            )
            diags.error(where, f"objective {name} does not fit model `{m.name}`: {why}", hint)
            return
        vocab = m.root.fwd.result[-1].size if m.root.fwd.result else None
        if args.get("sep", -1) >= 0 and "segments" not in _input_names(m.root):
            diags.error(
                where,
                f"{name}(sep = {args['sep']}) packs documents into rows with segment ids, "
                f"but model `{m.name}`'s forward takes no `segments`",
                (
                    "set `packed = true` (std's DecoderLM), or drop sep"
                    if shape.lm
                    else "add `segments: [B, S]` to the forward and pass it to "
                    "attention(segment_ids = ...), or drop sep"
                ),
            )
            return
        for k in ("mask_token", "start_token", "sep"):
            if k in args and vocab is not None and args[k] >= vocab:
                diags.error(
                    where,
                    f"{name}({k} = {args[k]}) is not below model `{m.name}`'s vocab {vocab}",
                    "use an id the model can embed",
                )
                return
    data = values["data"]
    kind = data.value.kind
    result = module.models[0].root.fwd.result
    eos = data.value.option("eos")
    vocab = result[-1].size if not shape.spec_loss and result else None
    if eos is not None and vocab is not None and eos >= vocab:
        diags.error(
            data.span or where,
            f"{kind}(eos = {eos}) is not below the model's vocab {vocab}",
            "use an id the model can embed",
        )
    if kind not in shape.data:
        diags.error(
            data.span or where,
            f"objective {name} reads data {_list(shape.data)}, not `{kind}`",
            shape.data_hint,
        )
