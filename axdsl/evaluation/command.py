"""`axdsl eval RUN --task FILE ...`: score a run's newest good checkpoint, or an import-hf output,
on task files, print a table and write RUN/evals/<task>.json.

The model is loaded as `axdsl sample` loads it (sampling.load_run_model, load_imported_model); the
text goes through the run's own tokenizer as sample and train use it: UTF-8 bytes for a byte-level
run, the run's kept tokenizer.json for one trained through a tokenizer, the Hugging Face
directory's tokenizer.json for an import (or `--tokenizer`). Contexts and continuations are
tokenized as lm-evaluation-harness does (axdsl/runtime/evals.py `encode_pair`, which a train
block's `evals` share).
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from axdsl.errors import shorten_words
from axdsl.runtime.eval_tasks import Problem, Task, TaskError, TaskKind, read_tasks
from axdsl.runtime.files import replace_file

WRITTEN_BY = "axdsl eval"  # in every JSON eval writes: only such a file is ever replaced
RUN_HINT = (
    "give a run directory (holding run.json), an `axdsl import-hf` output (holding import.json) "
    "or its params checkpoint"
)


class EvalError(Exception):
    """A RUN or option that cannot be evaluated: shown as `axdsl: error: ...`."""


@dataclass
class Text:
    """How strings become the model's ids and back, and the ids that frame them: `prefix` is what
    an empty context (or a text's first token) is conditioned on, lm-evaluation-harness's BOS or
    else EOS (None: nothing, the first token is context only); `eos` stops generation (`stop()`
    gives it: `find_eos`, when there is one, finds it the first time a task generates); `limit`
    bounds the ids generation may pick (a byte-level model's 256)."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    source: str
    prefix: int | None = None
    eos: int | None = None
    limit: int | None = None
    find_eos: Callable[[], int | None] | None = None

    def stop(self) -> int | None:
        """The id generation stops at (found once, when a task first needs it)."""
        if self.find_eos is not None:
            self.eos, self.find_eos = self.find_eos(), None
        return self.eos


@dataclass
class Loaded:
    """The model to evaluate, where its results go, and what to record about it."""

    scorer: Any  # axdsl.runtime.evals.Scorer
    model: Any  # the generated model module (generation uses its decode path)
    text: Text
    out_dir: Path
    about: dict
    max_tokens: int = 64  # the most tokens one generation item may produce


def evaluate(
    run: Path,
    task_paths: list[Path],
    tokenizer: Path | None = None,
    batch: int = 8,
    max_tokens: int = 64,
) -> int:
    """Evaluate `run` on every task file; 0 when all ran and were written, 1 on a user mistake
    (located, with a hint)."""
    try:
        if batch < 1 or max_tokens < 1:
            raise EvalError("--batch and --max-tokens must be at least 1")
        tasks = read_tasks(task_paths)
        out_dir = results_dir(run)
        targets = result_paths(out_dir, tasks)
        loaded = load(run, out_dir, tokenizer, batch, max_tokens)
        results = [run_task(loaded, task) for task in tasks]
    except TaskError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except EvalError as exc:
        print(f"axdsl: error: {shorten_words(str(exc))}", file=sys.stderr)
        return 1
    print(table(results))
    for result, path in zip(results, targets, strict=True):
        try:
            write_result(path, {"written_by": WRITTEN_BY, **loaded.about, **result})
        except OSError as exc:  # a full disk, or a symlink in the way: the old file stays whole
            print(f"axdsl: error: {path}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    print(f"wrote {', '.join(str(p) for p in targets)}")
    return 0


# ----------------------------------------------------------------------------- the run


def results_dir(run: Path) -> Path:
    """Where RUN's results go: RUN/evals for a run, beside import.json for an import."""
    if (run / "run.json").is_file():
        return run / "evals"
    for where in (run, run.parent):  # runs/x-hf or runs/x-hf/params
        if (where / "import.json").is_file():
            return where / "evals"
    if not run.exists():
        raise EvalError(f"{run} does not exist: {RUN_HINT}")
    raise EvalError(f"{run} is not a run: it has no run.json nor import.json; {RUN_HINT}")


def result_paths(out_dir: Path, tasks: list[Task]) -> list[Path]:
    """evals/<task>.json for each task (<task>-2.json ... when two share a name); a file there
    that eval did not write is never replaced: checked before the model loads."""
    paths: list[Path] = []
    for task in tasks:
        path, n = out_dir / f"{task.name}.json", 1
        while path in paths:
            n += 1
            path = out_dir / f"{task.name}-{n}.json"
        paths.append(path)
        if path.exists() and not _ours(path):
            raise EvalError(
                f"{path} exists and was not written by axdsl eval: not replacing it; "
                "move it aside or rename the task file"
            )
    return paths


def _ours(path: Path) -> bool:
    """Whether `path` is a results file eval wrote (so a new evaluation may replace it)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("written_by") == WRITTEN_BY


def load(
    run: Path, out_dir: Path, tokenizer: Path | None, batch: int, max_tokens: int = 64
) -> Loaded:
    """The model of `run` (its newest good checkpoint, or the import's parameters), with its
    text codec and window."""
    from axdsl import sampling
    from axdsl.runtime.evals import Scorer

    if (run / "run.json").is_file():
        model = sampling.load_run_model(run, "`eval` scores")
        if isinstance(model, str):
            raise EvalError(model)
        tc = model.tc
        window = min(tc.seq, getattr(model.cfg, "max_seq", tc.seq))
        text = run_text(run, tc, tokenizer)
        about = {"run": str(run), "step": model.step, "spec": model.info.get("spec")}
    else:
        model = sampling.load_imported_model(out_dir.parent)
        if isinstance(model, str):
            raise EvalError(model)
        window = getattr(model.cfg, "max_seq", 2048)
        text = hf_text(Path(model.info["hf_dir"]), tokenizer)
        about = {"run": str(out_dir.parent), "step": None, "spec": model.info.get("spec")}
    if "dec_tokens" in inspect.signature(model.model.forward).parameters:
        raise EvalError(f"{run} is an encoder-decoder model: `eval` scores decoder-only models")
    about |= {"tokenizer": text.source, "window": window, "max_tokens": max_tokens}
    scorer = Scorer(model.model.forward, model.cfg, model.params, window, batch)
    return Loaded(scorer, model.model, text, out_dir, about, max_tokens)


def run_text(run: Path, tc, tokenizer: Path | None) -> Text:
    """A run's codec, as `sample` uses it; a run on token files borrows the tokenizer of the
    Hugging Face model it was fine-tuned from, or --tokenizer."""
    from axdsl.hf.exporter import import_source
    from axdsl.textcodec import CodecError, TextCodec

    hf_dir = import_source(run)
    if tokenizer is not None:
        return tokenizer_text(tokenizer, hf_config(hf_dir))
    try:
        codec = TextCodec.for_run(run, tc.data, getattr(tc, "tokenizer", ""))
    except CodecError as exc:
        raise EvalError(str(exc)) from None
    if codec.kind == "bytes":
        return Text(
            lambda s: list(s.encode("utf-8")),
            lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"),
            "bytes (UTF-8)",
            limit=256,
        )
    if codec.kind == "tokenizer":
        text = _tokenizer_codec(codec.tokenizer, str(run / "tokenizer.json"), hf_config(hf_dir))
        # as sample: ids past the tokenizer are untrained
        if tc.data not in ("chat", "preferences"):
            return replace(text, limit=codec.limit)
        # a chat run stops at its template's end of turn: rendered only when a task generates
        return replace(text, limit=codec.limit, find_eos=lambda: _chat_end(run, text.eos))
    if hf_dir is not None:
        return hf_text(hf_dir, None)
    raise EvalError(
        f"{run} trained on token files and keeps no tokenizer: give --tokenizer "
        "(a tokenizer.json or a Hugging Face directory holding one)"
    )


def _chat_end(run: Path, eos: int | None) -> int | None:
    """A chat run's generation stop: the end-of-turn token of the chat template it trained with
    (as `sample --chat` stops), so that an answer ends where the assistant's turn does; `eos`
    when the run keeps no template that can be read. An EvalError when the template fails."""
    from axdsl.sampling import ChatError, run_chat_template

    try:
        info = json.loads((run / "run.json").read_text(encoding="utf-8"))
        chat = run_chat_template(run, info)
    except (ChatError, OSError, ValueError):
        return eos
    try:
        stops = chat.end_of_turn()
    except ChatError as exc:
        raise EvalError(f"{exc}: a generation task stops at its end-of-turn token") from None
    return stops[0] if stops else eos


def hf_text(hf_dir: Path, tokenizer: Path | None) -> Text:
    """An import's codec: --tokenizer, else the Hugging Face directory's tokenizer.json, with
    its config's BOS (or EOS) as the prefix and its EOS as the stop."""
    config = hf_config(hf_dir)
    if tokenizer is None and not (hf_dir / "tokenizer.json").is_file():
        raise EvalError(
            f"{hf_dir} has no tokenizer.json, and tasks are text: give --tokenizer "
            "(a tokenizer.json or a directory holding one)"
        )
    return tokenizer_text(tokenizer or hf_dir, config)


def hf_config(hf_dir: Path | None) -> dict:
    """config.json of a Hugging Face directory ({} when there is none)."""
    from axdsl.sampling import _hf_config

    return _hf_config(hf_dir) if hf_dir is not None else {}


def tokenizer_text(path: Path, config: dict) -> Text:
    """A codec from a tokenizer.json, or a directory holding one."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises plain Exceptions for files it cannot read
        raise EvalError(f"{file} is not a tokenizer.json: {str(exc)[:200]}") from None
    return _tokenizer_codec(tok, str(file), config)


def _tokenizer_codec(tok, source: str, config: dict) -> Text:
    """Encode without special tokens (as sample, and as lm-evaluation-harness for a causal
    model), decode skipping them; prefix and stop from a Hugging Face config. Generation picks
    among all the model's ids, as transformers' `generate` does."""
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    eos = eos if isinstance(eos, int) else None
    return Text(
        lambda s: list(tok.encode(s, add_special_tokens=False).ids),
        lambda ids: tok.decode(ids),
        source,
        prefix=bos if isinstance(bos, int) else eos,
        eos=eos,
    )


# ----------------------------------------------------------------------------- the tasks


def run_task(loaded: Loaded, task: Task) -> dict:
    """One task's metrics and per-item details, as written to its JSON."""
    runners = {TaskKind.CHOICE: choice_task, TaskKind.PERPLEXITY: text_task}
    result = runners.get(task.kind, generate_task)(loaded, task)
    return {"task": str(task.path), "kind": task.kind.value, **result}


def choice_task(loaded: Loaded, task: Task) -> dict:
    """acc and acc_norm over the items (axdsl/runtime/evals.py: choice_rows, choice_scores)."""
    from axdsl.runtime.evals import choice_rows, choice_scores

    t, scorer = loaded.text, loaded.scorer
    rows = choice_rows(task, t.encode, t.prefix, scorer.window)
    metrics, items = choice_scores(task, scorer.log_likelihoods(rows))
    return {"metrics": metrics, "n": len(task.choices), "items": items}


def text_task(loaded: Loaded, task: Task) -> dict:
    """Perplexity and bits per byte of a text, in disjoint windows of the model's window."""
    from axdsl.runtime.evals import text_rows, text_scores

    rows = text_rows(loaded.text.encode(task.text), loaded.text.prefix, loaded.scorer.window)
    scored = sum(r.scored for r in rows)
    if not scored:
        raise TaskError(
            [Problem(task.path, 0, "the text is a single token", "give a longer text to measure")]
        )
    metrics = text_scores(loaded.scorer.log_likelihoods(rows), scored, task.size)
    return {
        "metrics": metrics,
        "n": scored,
        "bytes": task.size,
        "windows": len(rows),
        "first_token_scored": loaded.text.prefix is not None,
    }


def generate_task(loaded: Loaded, task: Task) -> dict:
    """Exact match of greedy generation (the output cut at the item's stop strings, both sides
    stripped of surrounding whitespace)."""
    items, hits = [], 0
    for item in task.generate:
        prompt = loaded.text.encode(item.prompt) or (
            [loaded.text.prefix] if loaded.text.prefix is not None else []
        )
        if not prompt:
            raise TaskError([Problem(task.path, item.line, "the prompt is empty", "give a prompt")])
        t = loaded.text
        ids, output = greedy(
            loaded,
            prompt,
            loaded.max_tokens,
            t.stop(),
            t.limit,
            t.decode,
            item.until,
        )
        hit = output.strip() == item.answer.strip()
        hits += hit
        items.append({"line": item.line, "output": output, "ids": ids, "exact_match": hit})
    n = len(task.generate)
    return {"metrics": {"exact_match": hits / n}, "n": n, "items": items}


def greedy(
    loaded: Loaded,
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
    import numpy as np

    from axdsl.sampling import Sampling, generate_tokens

    scorer, ids = loaded.scorer, []
    for token in generate_tokens(
        loaded.model,
        scorer.cfg,
        scorer.params,
        prompt,
        scorer.window,
        max_tokens,
        Sampling(temperature=0.0, eos=eos),
        np.random.default_rng(0),
        limit,
    ):
        if token == eos:
            break
        ids.append(token)
        if until and any(stop in decode(ids) for stop in until):
            break
    text = decode(ids)
    cut = min((text.find(s) for s in until if s in text), default=len(text))
    return ids, text[:cut]


# ----------------------------------------------------------------------------- output


def table(results: list[dict]) -> str:
    """task | metric | value | n, one row per metric."""
    rows = [("task", "metric", "value", "n")]
    for result in results:
        for metric, value in result["metrics"].items():
            rows.append((Path(result["task"]).name, metric, f"{value:.4f}", str(result["n"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(
            c.rjust(w) if i >= 2 else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def write_result(path: Path, result: dict) -> None:
    """The results as JSON, written atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
