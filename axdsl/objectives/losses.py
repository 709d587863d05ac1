"""The loss of each non-next-token objective in model.py (masked_lm, seq2seq, classify, loss(),
and the preference objectives dpo, simpo and orpo).

next_token keeps its template in model.py.j2; each other objective's registry entry
(axdsl/objectives/__init__.py) points at one function here, which writes the objective's settings
as module constants, then `loss_fn(cfg, params, batch, ...)` over a dict of named arrays (the
runtime's batches), and for masked_lm and classify an `accuracy`; the preference objectives also
write `sequence_logps` and return a dict of metrics. `mask_tokens` (masked_lm) draws
every random choice from its key, so a step's masks are a pure function of (seed, step), like
dropout. Codegen (codegen/emit_objective.py) fills in the `LossSite` and places the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from axdsl.ir import nodes as ir


@dataclass(frozen=True)
class LossSite:
    """What one model.py's loss_fn is written against: the root layer, the objective's arguments
    (defaults filled in), whether the forward takes a dropout key and returns auxiliary losses."""

    root: ir.Instance
    args: dict[str, Any]
    rng: bool
    aux: bool

    @property
    def forward(self) -> ir.Forward:
        """The root layer's forward (an objective fits only a root that has one)."""
        if self.root.forward is None:
            raise AssertionError(f"{self.root.layer} has no forward to write a loss_fn for")
        return self.root.forward

    @property
    def names(self) -> tuple[str, ...]:
        """The root forward's inputs, in order."""
        return tuple(a.name for a in self.forward.args)

    @property
    def vocab(self) -> str:
        if self.root.hparam("vocab") is not None:
            return "cfg.vocab"
        return str(self.forward.result[-1].size)

    @property
    def fwd(self) -> str:
        return "forward_with_aux" if self.aux else "forward"

    @property
    def drop(self) -> str:
        return ", rng=rng" if self.rng else ""

    @property
    def rng_arg(self) -> str:
        return ", rng: jax.Array | None = None" if self.rng else ""

    @property
    def rng_doc(self) -> str:
        return "\n    `rng` drives dropout; None: off." if self.rng else ""

    @property
    def aux_doc(self) -> str:
        return " + auxiliary losses" if self.aux else ""

    @property
    def unpack(self) -> str:
        return "logits, aux = " if self.aux else "logits = "

    @property
    def total(self) -> str:
        return "ce + aux" if self.aux else "ce"


ZLOSS = [
    "    if z_loss:  # keeps the softmax normalizer near 1",
    "        loss = loss + z_loss * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)",
]


def masked_lm_loss(s: LossSite) -> str:
    """BERT's masking, the loss on the masked positions, and their accuracy."""
    names, args = s.names, s.args
    call = ", ".join("tokens" if n == "tokens" else f'batch["{n}"]' for n in names)
    keep = 'batch["segments"] > 0' if "segments" in names else "None"
    fields = ", ".join(f"{n} [B, S]" for n in names)
    return "\n".join(
        [
            f"MASK_RATE = {args['rate']!r}  # masked_lm(rate): the fraction of tokens predicted",
            f"MASK_TOKEN = {args['mask_token']!r}  # masked_lm(mask_token): the [MASK] id",
            "",
            "",
            "def mask_tokens(cfg: Config, tokens: jax.Array, key: jax.Array, keep:"
            " jax.Array | None = None):",
            '    """BERT\'s masking of tokens [B, S]: (inputs,'
            " selected). Each token (where `keep`: not",
            "    padding) is selected with probability MASK_RATE;"
            " a selected token becomes MASK_TOKEN 80% of",
            '    the time, a uniformly random token 10%, and stays itself 10%."""',
            "    pick, how, draw = jax.random.split(key, 3)",
            "    selected = jax.random.uniform(pick, tokens.shape) < MASK_RATE",
            "    if keep is not None:",
            "        selected = selected & keep",
            "    u = jax.random.uniform(how, tokens.shape)",
            f"    random = jax.random.randint(draw, tokens.shape, 0, {s.vocab}, tokens.dtype)",
            "    inputs = jnp.where(selected & (u < 0.8), MASK_TOKEN,"
            " jnp.where(selected & (u < 0.9), random, tokens))",
            "    return inputs.astype(tokens.dtype), selected",
            "",
            "",
            "def loss_fn(",
            f"    cfg: Config, params: dict, batch: dict, mask_rng: jax.Array{s.rng_arg},"
            " z_loss: float = 0.0",
            ") -> tuple[jax.Array, jax.Array]:",
            '    """(loss to minimize, mean cross-entropy over the masked positions)'
            " of the masked-LM objective.",
            "",
            f"    batch: {fields}. mask_tokens(mask_rng) picks the positions and their",
            "    replacements; the model predicts each selected position's original token.",
            f"    loss = cross-entropy{s.aux_doc} + z_loss * mean(logsumexp(logits) ** 2)"
            f" (z-loss).{s.rng_doc}",
            '    """',
            f'    tokens, selected = mask_tokens(cfg, batch["tokens"], mask_rng, {keep})',
            f"    {s.unpack}{s.fwd}(cfg, params, {call}{s.drop})  # [B, S, vocab]",
            "    weights = selected.astype(jnp.float32)",
            "    per_token = optax.softmax_cross_entropy_with_integer_labels(logits,"
            ' batch["tokens"])',
            "    ce = jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(weights), 1.0)",
            f"    loss = {s.total}",
            *ZLOSS,
            "    return loss, ce",
            "",
            "",
            "def accuracy(cfg: Config, params: dict, batch: dict, mask_rng:"
            " jax.Array) -> jax.Array:",
            '    """The fraction of the positions mask_tokens(mask_rng)'
            " selects whose largest logit is the",
            '    original token."""',
            f'    tokens, selected = mask_tokens(cfg, batch["tokens"], mask_rng, {keep})',
            f"    hits = (jnp.argmax(forward(cfg, params, {call}), axis=-1)"
            ' == batch["tokens"]) & selected',
            "    return jnp.sum(hits) / jnp.maximum(jnp.sum(selected), 1)",
        ]
    )


def seq2seq_loss(s: LossSite) -> str:
    """Teacher forcing over packed (source, target) pairs, the loss on the target tokens."""
    parts = {
        "tokens": 'batch["tokens"]',
        "segments": 'batch["segments"]',
        "dec_tokens": "dec_tokens",
        "dec_segments": 'batch["dec_segments"]',
    }
    call = ", ".join(parts[n] for n in s.names)
    src = ", segments [B, S] (0: padding)" if "segments" in s.names else ""
    return "\n".join(
        [
            f"START_TOKEN = {s.args['start_token']!r}  # seq2seq(start_token):"
            " the decoder's first input",
            "",
            "",
            "def loss_fn(",
            f"    cfg: Config, params: dict, batch: dict{s.rng_arg}, z_loss: float = 0.0",
            ") -> tuple[jax.Array, jax.Array]:",
            '    """(loss to minimize, mean cross-entropy over target tokens)'
            " of the seq2seq objective.",
            "",
            f"    batch: tokens [B, S] (the source){src}, targets [B, T] and dec_segments [B, T]",
            "    (0: padding, k: the row's k-th example). Teacher forcing:"
            " each example's decoder reads",
            "    START_TOKEN then its targets shifted right (dec_tokens) and predicts each target;",
            "    padding is left out.",
            f"    loss = cross-entropy{s.aux_doc} + z_loss * mean(logsumexp(logits) ** 2)"
            f" (z-loss).{s.rng_doc}",
            '    """',
            '    targets, dec_segments = batch["targets"], batch["dec_segments"]',
            "    starts = dec_segments != jnp.pad(dec_segments[:, :-1], ((0, 0), (1, 0)))"
            "  # an example's first position",
            "    dec_tokens = jnp.where(starts, START_TOKEN, jnp.pad(targets[:, :-1],"
            " ((0, 0), (1, 0))))",
            f"    {s.unpack}{s.fwd}(cfg, params, {call}{s.drop})  # [B, T, vocab]",
            "    weights = (dec_segments > 0).astype(jnp.float32)",
            "    per_token = optax.softmax_cross_entropy_with_integer_labels(logits, targets)",
            "    ce = jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(weights), 1.0)",
            f"    loss = {s.total}",
            *ZLOSS,
            "    return loss, ce",
        ]
    )


def classify_loss(s: LossSite) -> str:
    """Cross-entropy of images against their labels (optionally smoothed), and the accuracy."""
    smoothing = s.args["smoothing"]
    if smoothing:
        smooth = [
            '    labels = optax.smooth_labels(jax.nn.one_hot(batch["labels"],'
            " logits.shape[-1]), SMOOTHING)",
            "    loss = optax.softmax_cross_entropy(logits, labels).mean()"
            + (" + aux" if s.aux else ""),
        ]
    else:
        smooth = [f"    loss = {s.total}"]
    return "\n".join(
        [
            f"SMOOTHING = {smoothing!r}  # classify(smoothing):"
            " label smoothing of the loss (not of the reported ce)",
            "",
            "",
            "def loss_fn(",
            f"    cfg: Config, params: dict, batch: dict{s.rng_arg}, z_loss: float = 0.0",
            ") -> tuple[jax.Array, jax.Array]:",
            '    """(loss to minimize, mean cross-entropy) of classifying images [B, H, W, C]'
            " into labels [B].",
            "",
            f"    loss = cross-entropy against labels smoothed by SMOOTHING{s.aux_doc}",
            f"    + z_loss * mean(logsumexp(logits) ** 2) (z-loss).{s.rng_doc}",
            '    """',
            f'    {s.unpack}{s.fwd}(cfg, params, batch["images"]{s.drop})  # [B, classes]',
            "    ce = optax.softmax_cross_entropy_with_integer_labels(logits,"
            ' batch["labels"]).mean()',
            *smooth,
            *ZLOSS,
            "    return loss, ce",
            "",
            "",
            "def accuracy(cfg: Config, params: dict, batch: dict) -> jax.Array:",
            '    """The fraction of images whose largest logit is their label."""',
            '    return jnp.mean(jnp.argmax(forward(cfg, params, batch["images"]), axis=-1)'
            ' == batch["labels"])',
        ]
    )


def explicit_loss(s: LossSite) -> str:
    """loss(): the root forward is the loss; loss_fn feeds it the batch's fields by name."""
    root = s.root
    args = s.forward.args
    fields = ", ".join(f"{a.name} [{', '.join(str(d.name) for d in a.dims)}]" for a in args)
    call = ", ".join(f'batch["{a.name}"]' for a in args)
    aux_doc = ", plus the auxiliary losses" if s.aux else ""
    unpack, total = ("out, aux = ", "spec_loss + aux") if s.aux else ("out = ", "spec_loss")
    return "\n".join(
        [
            "def loss_fn(",
            f"    cfg: Config, params: dict, batch: dict{s.rng_arg}, z_loss: float = 0.0",
            ") -> tuple[jax.Array, jax.Array]:",
            '    """(loss to minimize, the spec\'s loss) of objective loss():'
            f" {root.layer}'s forward over the",
            f"    batch's {fields}, which returns the loss as one number{aux_doc}.",
            f"    z_loss does not apply: there are no logits here.{s.rng_doc}",
            '    """',
            "    del z_loss",
            f"    {unpack}{s.fwd}(cfg, params, {call}{s.drop})",
            "    spec_loss = jnp.reshape(out, ()).astype(jnp.float32)",
            f"    return {total}, spec_loss",
        ]
    )


def sequence_logps_source(s: LossSite) -> list[str]:
    """model.py's `sequence_logps`, shared by the preference objectives: each row's summed
    log-probability of its answer's tokens (dpo's reference is computed with it too)."""
    return [
        "def sequence_logps(",
        f"    cfg: Config, params: dict, tokens: jax.Array, mask: jax.Array{s.rng_arg}",
        ") -> jax.Array:",
        '    """The log-probability of each row\'s marked labels, summed [B]: of tokens[:, 1:]'
        " read from",
        "    tokens[:, :-1] [B, S + 1] where mask[:, 1:] is 1 (a preference pair's answer)."
        f"{s.rng_doc}",
        '    """',
        f"    logits = forward(cfg, params, tokens[:, :-1]{_one_segment(s)}{s.drop})"
        "  # [B, S, vocab]",
        "    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)",
        "    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]" "  # [B, S]",
        "    return jnp.sum(picked * mask[:, 1:], axis=-1)",
    ]


def _one_segment(s: LossSite) -> str:
    """`, segments` for a packed model's forward: a preference row is one conversation."""
    return ", jnp.ones_like(tokens[:, :-1])" if "segments" in s.names else ""


# The lines every preference loss_fn starts with: both answers as one batch [2B, S + 1]
PAIR_BATCH = [
    '    tokens = jnp.concatenate([batch["chosen"], batch["rejected"]])',
    '    mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]])',
]
# What the batch of every preference loss_fn holds, for its docstring
PAIR_DOC = [
    "    batch: chosen and rejected [B, S + 1] (one prompt and its two answers, rendered"
    " with the",
    "    chat template), chosen_mask and rejected_mask (1 on each answer's tokens).",
]
# Reference-free objectives (simpo, orpo): said in their loss_fn's docstring
REFERENCE_FREE = [
    "    Reference-free: there is no reference model, so no frozen pass computes reference",
    "    log-probabilities (train.py holds one copy of the weights and runs no extra forward).",
]


# The docstring of DPO's loss_fn after its first line; _closing(s) ends it
_DPO_DOC = [
    "    batch: chosen and rejected [B, S + 1] (one prompt and its two answers, rendered"
    " with the",
    "    chat template), chosen_mask and rejected_mask (1 on each answer's tokens),"
    " ref_chosen and",
    "    ref_rejected [B] (the answers' log-probabilities under the reference: the run's"
    " initial",
    "    parameters). Both answers run as one batch [2B, S + 1].",
    "    loss = -mean(log sigmoid(BETA * ((chosen - ref_chosen) - (rejected -"
    " ref_rejected)))). Metrics:",
    "    the loss, reward_accuracy (the pairs whose chosen reward is the larger),"
    " margin (the mean",
    "    reward difference), chosen_logp and rejected_logp (means over the pairs).",
]


# The docstring of SimPO's loss_fn after its first line; _closing(s) ends it
_SimPO_DOC = [
    *PAIR_DOC,
    *REFERENCE_FREE,
    "    Each answer's reward is BETA times its log-probability per answer token; both" " answers",
    "    run as one batch [2B, S + 1].",
    "    loss = -mean(log sigmoid(BETA * (chosen / |chosen| - rejected / |rejected|)" " - GAMMA)).",
    "    Metrics: the loss, reward_accuracy (the pairs whose chosen reward is the larger),"
    " margin",
    "    (the mean reward difference, GAMMA not subtracted), chosen_logp and rejected_logp"
    " (summed",
    "    over each answer, means over the pairs).",
]


# The docstring of ORPO's loss_fn after its first line; _closing(s) ends it
_ORPO_DOC = [
    *PAIR_DOC,
    *REFERENCE_FREE,
    "    Both answers run as one batch [2B, S + 1]. With p each answer's mean"
    " log-probability per",
    "    answer token, exponentiated: loss = nll + BETA * -mean(log sigmoid(log_odds(chosen"
    " p) -",
    "    log_odds(rejected p))), nll the chosen answers' cross-entropy per answer token."
    " Metrics:",
    "    the loss, reward_accuracy (the pairs whose chosen reward BETA * log p is the"
    " larger), margin",
    "    (the mean reward difference), chosen_logp and rejected_logp (summed over each"
    " answer, means",
    "    over the pairs), nll, and log_odds (the mean log odds ratio).",
]


def _pair_loss_fn(s: LossSite, name: str, doc: list[str]) -> list[str]:
    """The start of a preference objective's loss_fn: its signature, its docstring (`doc` after
    the first line, then _closing), both answers as one batch [2B, S + 1] and their
    log-probabilities `logps`."""
    return [
        "def loss_fn(",
        f"    cfg: Config, params: dict, batch: dict{s.rng_arg}, z_loss: float = 0.0",
        ") -> tuple[jax.Array, dict]:",
        f'    """(loss to minimize, metrics) of {name} over a batch of preference pairs.',
        "",
        *doc[:-1],
        doc[-1] + _closing(s),
        '    """',
        *PAIR_BATCH,
        f"    logps = sequence_logps(cfg, params, tokens, mask{s.drop})  # [2B]",
    ]


def _pair_metrics(extra: tuple[str, ...] = ()) -> list[str]:
    """The metrics dict every preference loss_fn returns (`extra`: more of its own entries)."""
    return [
        "    metrics = {",
        '        "loss": loss,',
        '        "reward_accuracy": jnp.mean(margin > 0),',
        '        "margin": jnp.mean(margin),',
        '        "chosen_logp": jnp.mean(chosen),',
        '        "rejected_logp": jnp.mean(rejected),',
        *extra,
        "    }",
        "    return loss, metrics",
    ]


def _closing(s: LossSite) -> str:
    """The end of a preference loss_fn's docstring: what it leaves out."""
    return (
        " z_loss is unused"
        + (" and the MoE auxiliary losses are left out." if s.aux else ".")
        + s.rng_doc
    )


def dpo_loss(s: LossSite) -> str:
    """Direct preference optimization (Rafailov et al. 2023): each pair's chosen and rejected
    answers' log-probabilities against the reference's, the loss -log sigmoid(beta * margin)."""
    return "\n".join(
        [
            f"BETA = {s.args['beta']!r}  # dpo(beta): the weight of the log-ratios to the"
            " reference",
            "",
            "",
            *sequence_logps_source(s),
            "",
            "",
            *_pair_loss_fn(s, "DPO", _DPO_DOC),
            "    chosen, rejected = jnp.split(logps, 2)",
            '    rewards = BETA * (chosen - batch["ref_chosen"]), BETA * (rejected -'
            ' batch["ref_rejected"])',
            "    margin = rewards[0] - rewards[1]",
            "    loss = optax.sigmoid_binary_cross_entropy(margin, jnp.ones_like(margin)).mean()"
            "  # -log sigmoid",
            *_pair_metrics(),
        ]
    )


def simpo_loss(s: LossSite) -> str:
    """SimPO (Meng et al. 2024): reference-free; each answer's reward is beta times its mean
    log-probability per token, and the loss -log sigmoid(reward margin - gamma)."""
    return "\n".join(
        [
            f"BETA = {s.args['beta']!r}  # simpo(beta): the scale of the length-normalized"
            " rewards",
            f"GAMMA = {s.args['gamma']!r}  # simpo(gamma): the target reward margin",
            "",
            "",
            *sequence_logps_source(s),
            "",
            "",
            *_pair_loss_fn(s, "SimPO", _SimPO_DOC),
            "    lengths = jnp.maximum(jnp.sum(mask[:, 1:], axis=-1), 1)  # answer tokens"
            " (a cut-off answer: 1)",
            "    chosen, rejected = jnp.split(logps, 2)",
            "    rewards = jnp.split(BETA * logps / lengths, 2)",
            "    margin = rewards[0] - rewards[1]",
            "    loss = optax.sigmoid_binary_cross_entropy(margin - GAMMA,"
            " jnp.ones_like(margin)).mean()  # -log sigmoid",
            *_pair_metrics(),
        ]
    )


def orpo_loss(s: LossSite) -> str:
    """ORPO (Hong et al. 2024): reference-free; the chosen answers' NLL plus beta times
    -log sigmoid of the log odds ratio of their mean per-token probabilities."""
    return "\n".join(
        [
            f"BETA = {s.args['beta']!r}  # orpo(beta): the weight of the odds-ratio term beside"
            " the NLL",
            "",
            "",
            *sequence_logps_source(s),
            "",
            "",
            "def log_odds(logp: jax.Array) -> jax.Array:",
            '    """log(p / (1 - p)) of probabilities p given as log p (an answer\'s mean'
            " log-probability",
            "    per token). p is kept below 1 - 1e-6 so that log(1 - p) stays finite when the"
            " model is",
            '    sure of an answer."""',
            "    logp = jnp.minimum(logp, -1e-6)",
            "    return logp - jnp.log(-jnp.expm1(logp))  # log(1 - p) = log(-expm1(log p))",
            "",
            "",
            *_pair_loss_fn(s, "ORPO", _ORPO_DOC),
            "    lengths = jnp.sum(mask[:, 1:], axis=-1)  # answer tokens [2B]",
            "    chosen, rejected = jnp.split(logps, 2)",
            "    means = jnp.split(logps / jnp.maximum(lengths, 1), 2)  # log p: per token",
            '    nll = -jnp.sum(chosen) / jnp.maximum(jnp.sum(batch["chosen_mask"][:, 1:]), 1)'
            "  # per token",
            "    ratio = log_odds(means[0]) - log_odds(means[1])",
            "    loss = nll + BETA * optax.sigmoid_binary_cross_entropy(ratio,"
            " jnp.ones_like(ratio)).mean()",
            "    margin = BETA * (means[0] - means[1])",
            *_pair_metrics(('        "nll": nll,', '        "log_odds": jnp.mean(ratio),')),
        ]
    )
