"""Scoring tasks by log-likelihood: `axdsl eval`'s multiple choice and perplexity, and a train
block's `evals = [...]`, run at each evaluation of a training and logged to metrics.jsonl and
TensorBoard as eval_<task>_<metric>.

Every log-likelihood is one row of token ids whose last tokens are scored: a row is at most the
model's window plus one token (the inputs and their next tokens), cut from the left as
lm-evaluation-harness cuts. Rows are sorted by length and run `batch` at a time, padded on the
right to a length bucket (a power of two, at most the window), so a task compiles one forward per
bucket rather than one per row; right padding changes nothing for a causal model, and the padded
positions are never read.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from axdsl.runtime.eval_tasks import Problem, Task, TaskError, TaskKind, read_tasks

SMALLEST_BUCKET = 16  # rows shorter than this are padded to it: fewer shapes to compile


@dataclass(frozen=True)
class Row:
    """Token ids whose last `scored` ids are scored, each given the ids before it."""

    ids: tuple[int, ...]
    scored: int


@dataclass
class Scorer:
    """A model's forward (cfg, params, tokens [B, S]) -> logits, ready to score rows: `window`
    is the most tokens one forward sees."""

    forward: Callable
    cfg: Any
    params: Any
    window: int
    batch: int = 8
    _jitted: Callable | None = None

    def log_likelihoods(self, rows: list[Row]) -> list[tuple[float, bool]]:
        """(sum of the scored ids' log-probabilities, whether each was the argmax) for each row,
        in the order given."""
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i].ids))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        for start in range(0, len(order), self.batch):
            chunk = order[start : start + self.batch]
            for i, result in zip(chunk, self._score([rows[i] for i in chunk]), strict=True):
                results[i] = result
        return results

    def _score(self, rows: list[Row]) -> list[tuple[float, bool]]:
        """One padded batch of rows (each at most window + 1 ids) through the jitted forward."""
        length = bucket(max(len(r.ids) - 1 for r in rows), self.window)
        inputs = np.zeros((self.batch, length), np.int32)
        targets = np.zeros((self.batch, length), np.int32)
        for n, row in enumerate(rows):
            inputs[n, : len(row.ids) - 1] = row.ids[:-1]
            targets[n, : len(row.ids) - 1] = row.ids[1:]
        logp, greedy = (np.asarray(a) for a in self._compiled()(self.params, inputs, targets))
        out = []
        for n, row in enumerate(rows):
            scored = slice(len(row.ids) - 1 - row.scored, len(row.ids) - 1)
            total = float(logp[n, scored].astype(np.float64).sum())
            out.append((total, bool(greedy[n, scored].all())))
        return out

    def _compiled(self) -> Callable:
        """jit(params, inputs [B, L], targets [B, L]) -> (log p(target) [B, L], is argmax [B, L]),
        compiled once per shape."""
        if self._jitted is None:
            forward, cfg = token_forward(self.forward), self.cfg

            @jax.jit
            def scores(params, inputs, targets):
                logits = forward(cfg, params, inputs).astype(jnp.float32)
                logp = jax.nn.log_softmax(logits, axis=-1)
                picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
                return picked, jnp.argmax(logits, axis=-1) == targets

            self._jitted = scores
        return self._jitted


def token_forward(forward: Callable) -> Callable:
    """A next-token model's forward as (cfg, params, tokens [B, S]) -> logits: a packed model's
    (it also reads segment ids) sees each row as one sequence, segments all 1."""
    if "segments" not in inspect.signature(forward).parameters:
        return forward
    return lambda cfg, params, tokens: forward(cfg, params, tokens, jnp.ones_like(tokens))


def bucket(length: int, window: int) -> int:
    """The padded length for a row of `length` inputs: the next power of two (at least
    SMALLEST_BUCKET), never more than the window."""
    return min(window, max(SMALLEST_BUCKET, 1 << max(0, length - 1).bit_length()))


def continuation_row(context: list[int], continuation: list[int], window: int) -> Row:
    """The row scoring `continuation` after `context`, cut from the left to window + 1 ids (the
    scored ids are never cut while they fit)."""
    ids = (context + continuation)[-(window + 1) :]
    return Row(tuple(ids), min(len(continuation), len(ids) - 1))


def text_rows(tokens: list[int], prefix: int | None, window: int) -> list[Row]:
    """Disjoint windows over a text: every token is predicted exactly once, by a forward of at
    most `window` inputs that starts one token before the tokens it predicts (lm-evaluation-
    harness's rolling windows). With a `prefix` (BOS) the first token is predicted from it;
    without one the first token is only context."""
    ids = ([prefix] if prefix is not None else []) + tokens
    return [
        Row(tuple(ids[start : start + window + 1]), min(window, len(ids) - 1 - start))
        for start in range(0, len(ids) - 1, window)
    ]


def encode_pair(
    encode: Callable[[str], list[int]], context: str, continuation: str
) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-evaluation-harness's `_encode_pair` makes them:
    spaces ending the context move to the continuation; the whole string is tokenized, and the
    continuation's ids are those after the context's own tokenization (so a token that spans the
    boundary counts as continuation)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(context + continuation)
    context_ids = encode(context)
    return context_ids, whole[len(context_ids) :]


def choice_rows(
    task: Task, encode: Callable[[str], list[int]], prefix: int | None, window: int
) -> list[Row]:
    """One row per choice of every item, in order; a TaskError at the items that cannot be
    scored (a choice that tokenizes to nothing, an empty context with no BOS to condition on)."""
    rows, problems = [], []
    for item in task.choices:
        for choice in item.choices:
            context, continuation = encode_pair(encode, item.context, item.delimiter + choice)
            if not continuation:
                problems.append(
                    Problem(task.path, item.line, "a choice tokenizes to nothing to score",
                            "give every choice some text")
                )  # fmt: skip
                break
            if not context and prefix is None:
                problems.append(
                    Problem(
                        task.path,
                        item.line,
                        "the context is empty and the model has no BOS token to condition on",
                        "give a non-empty context (this model's text has no BOS)",
                    )
                )
                break
            rows.append(continuation_row(context or [prefix], continuation, window))  # type: ignore[list-item]
    if problems:
        raise TaskError(problems)
    return rows


def choice_scores(task: Task, results: list[tuple[float, bool]]) -> tuple[dict, list[dict]]:
    """acc (the most likely choice is gold) and acc_norm (likelihood per character of the
    choice, lm-evaluation-harness's normalisation), and each item's details."""
    scores = iter(results)
    items, acc, acc_norm = [], 0, 0
    for item in task.choices:
        lls = [next(scores)[0] for _ in item.choices]
        normed = [ll / max(1, len(c)) for ll, c in zip(lls, item.choices, strict=True)]
        best, best_norm = lls.index(max(lls)), normed.index(max(normed))
        acc, acc_norm = acc + (best == item.gold), acc_norm + (best_norm == item.gold)
        items.append({"line": item.line, "loglikelihoods": lls, "pred": best, "gold": item.gold})
    n = len(task.choices)
    return {"acc": acc / n, "acc_norm": acc_norm / n}, items


def text_scores(results: list[tuple[float, bool]], tokens: int, n_bytes: int) -> dict[str, float]:
    """Perplexity per token and bits per byte from the windows' log-likelihoods: total nats
    over the tokens scored, and over ln 2 times the text's UTF-8 bytes."""
    nats = -sum(ll for ll, _ in results)
    return {
        "perplexity": math.exp(nats / tokens),
        "bits_per_byte": nats / (math.log(2) * n_bytes),
        "nats_per_token": nats / tokens,
    }


# ----------------------------------------------------------------------------- during training


@dataclass
class TrainEval:
    """A task of the train block's `evals`, tokenized once: its rows and how to score them."""

    task: Task
    rows: list[Row]


def prepare_evals(tc, spec: str, run_dir: Path, window: int) -> list[TrainEval]:
    """tc.evals read (relative to the spec's directory, as data paths are), checked and tokenized
    with the run's own codec before the first step; a mistake exits with its file and line."""
    if jax.process_count() > 1:  # the scores would live on every process's devices
        print("warning: evals are not run in runs of several processes", file=sys.stderr)
        return []
    paths = [p if p.is_absolute() else Path(spec).parent / p for p in map(Path, tc.evals)]
    try:
        tasks = read_tasks(paths)
        encode = eval_encoder(tc, run_dir)
        prepared = []
        for task in tasks:
            if task.kind is TaskKind.GENERATE:
                raise TaskError(
                    [Problem(task.path, 0, "generation tasks are not run during training",
                             "score them with `axdsl eval RUN --task FILE`")]
                )  # fmt: skip
            if task.kind is TaskKind.CHOICE:
                rows = choice_rows(task, encode, None, window)
            else:
                rows = text_rows(encode(task.text), None, window)
            prepared.append(TrainEval(task, rows))
    except TaskError as exc:
        sys.exit(exc.render())
    return prepared


def eval_encoder(tc, run_dir: Path) -> Callable[[str], list[int]]:
    """The run's text codec, as `axdsl sample` uses it: UTF-8 bytes, or the tokenizer the run
    keeps (RUN_DIR/tokenizer.json, written before the first step), encoded without special
    tokens. A run on token files has no text: its evals are refused."""
    if tc.data in ("tokens", "pairs"):
        sys.exit("error: evals need text, and this run trains on token files (no tokenizer)")
    if not getattr(tc, "tokenizer", ""):
        return lambda s: list(s.encode("utf-8"))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    return lambda s: list(tok.encode(s, add_special_tokens=False).ids)


def run_evals(evals: list[TrainEval], scorer: Scorer) -> dict[str, float]:
    """Every prepared task scored with `scorer` (the current parameters): eval_<task>_acc and
    _acc_norm, or eval_<task>_perplexity and _bits_per_byte."""
    row: dict[str, float] = {}
    for e in evals:
        results = scorer.log_likelihoods(e.rows)
        if e.task.kind is TaskKind.CHOICE:
            metrics = choice_scores(e.task, results)[0]
        else:
            metrics = text_scores(results, sum(r.scored for r in e.rows), e.task.size)
            del metrics["nats_per_token"]
        row |= {f"eval_{e.task.name}_{k}": v for k, v in metrics.items()}
    return row
