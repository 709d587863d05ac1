"""The model side of `axdsl eval`: log-likelihoods of continuations in padded batches, perplexity
over a text in windows, and greedy generation through `axdsl sample`'s KV-cache path.

Every log-likelihood is one row of token ids whose last tokens are scored: a row is at most the
model's window plus one token (the inputs and their next tokens), cut from the left as
lm-evaluation-harness cuts. Rows are sorted by length and run `batch` at a time, padded on the
right to a length bucket (a power of two, at most the window), so a task compiles one forward per
bucket rather than one per row; right padding changes nothing for a causal model, and the padded
positions are never read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from axdsl.sampling import Sampling, generate_tokens

SMALLEST_BUCKET = 16  # rows shorter than this are padded to it: fewer shapes to compile


@dataclass(frozen=True)
class Row:
    """Token ids whose last `scored` ids are scored, each given the ids before it."""

    ids: tuple[int, ...]
    scored: int


@dataclass
class Scorer:
    """A loaded model, ready to score rows: `window` is the most tokens one forward sees."""

    model: Any
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
        logp, greedy = (np.asarray(a) for a in self._forward()(self.params, inputs, targets))
        out = []
        for n, row in enumerate(rows):
            end = len(row.ids) - 1
            scored = slice(end - row.scored, end)
            out.append(
                (float(logp[n, scored].astype(np.float64).sum()), bool(greedy[n, scored].all()))
            )
        return out

    def _forward(self) -> Callable:
        """jit(params, inputs [B, L], targets [B, L]) -> (log p(target) [B, L], is argmax [B, L]),
        compiled once per shape."""
        if self._jitted is None:
            import jax
            import jax.numpy as jnp

            model, cfg = self.model, self.cfg

            @jax.jit
            def forward(params, inputs, targets):
                logits = model.forward(cfg, params, inputs).astype(jnp.float32)
                logp = jax.nn.log_softmax(logits, axis=-1)
                picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
                return picked, jnp.argmax(logits, axis=-1) == targets

            self._jitted = forward
        return self._jitted


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


def perplexity(results: list[tuple[float, bool]], tokens: int, n_bytes: int) -> dict[str, float]:
    """Perplexity per token and bits per byte from the windows' log-likelihoods: total nats
    over the tokens scored, and over ln 2 times the text's UTF-8 bytes."""
    nats = -sum(ll for ll, _ in results)
    return {
        "perplexity": math.exp(nats / tokens),
        "bits_per_byte": nats / (math.log(2) * n_bytes),
        "nats_per_token": nats / tokens,
    }


def greedy(
    scorer: Scorer,
    prompt: list[int],
    max_tokens: int,
    eos: int | None,
    limit: int | None,
    decode: Callable[[list[int]], str],
    until: tuple[str, ...],
) -> tuple[list[int], str]:
    """The greedy continuation of `prompt` (ids, and its text cut at the first of `until`),
    generated as `axdsl sample --temperature 0` generates: prefill, then one KV-cache decode step
    per token (full forwards for a model without a decode path). Stops at `eos`, at a stop
    string, or after `max_tokens`."""
    ids: list[int] = []
    tokens: Iterator[int] = generate_tokens(
        scorer.model,
        scorer.cfg,
        scorer.params,
        prompt,
        scorer.window,
        max_tokens,
        Sampling(temperature=0.0, eos=eos),
        np.random.default_rng(0),
        limit,
    )
    for token in tokens:
        if token == eos:
            break
        ids.append(token)
        if until and any(stop in decode(ids) for stop in until):
            break
    text = decode(ids)
    cut = min((text.find(s) for s in until if s in text), default=len(text))
    return ids, text[:cut]
