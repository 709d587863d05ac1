"""Chat data for training: `data = chat("conversations.jsonl", tokenizer = DIR, train_on = ...)`
read into rows of token ids and loss mask (with axdsl/runtime/chat.py's encoding).

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import sys
from pathlib import Path

from axdsl.runtime.chat import (
    encode_chat,
    load_special_tokens,
    load_template,
    scan_conversations,
    tokenizer_folder,
)
from axdsl.runtime.data import data_path
from axdsl.runtime.examples import pack_examples, split_rows
from axdsl.runtime.processes import is_lead
from axdsl.runtime.tokenizers import read_tokenizer, write_atomic

# data = chat("conversations.jsonl", tokenizer = DIR, train_on = ...): every conversation is
# encoded (encode_chat) and put in a row of its own of seq + 1 tokens (the model's forward takes
# no segment ids, so a row holds one conversation: attention and positions stay inside it),
# padded with id 0 and loss mask 0. A longer conversation is cut; the cuts are counted.


def load_chat(cfg, tc, spec: str, from_flag: bool, run_dir: Path | None = None):
    """(train rows, eval rows, figures) of chat data, checked before the first step. Rows are
    {"tokens": [N, seq + 1], "loss_mask": [N, seq + 1]} (int32; the mask is 1 on the tokens the
    loss is taken on, read at the label positions 1..seq); figures say how many conversations,
    rows, tokens and loss tokens there are and how many conversations were cut (run.json). The
    run keeps RUN_DIR/tokenizer.json, which `axdsl sample` decodes with."""
    path = data_path(tc, spec, from_flag)
    if not path.is_file():
        sys.exit(f"error: chat data {path} does not exist or is not a file")
    folder = tokenizer_folder(tc.tokenizer, spec)
    if not (folder / "tokenizer.json").is_file():
        sys.exit(
            f"error: tokenizer {tc.tokenizer!r} is not a tokenizer.json nor a directory of one"
        )
    try:
        template = load_template(folder)
        special = load_special_tokens(folder)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    tokenizer = read_tokenizer(folder / "tokenizer.json", "a tokenizers tokenizer.json")
    conversations = read_conversations(path)
    encoded = [encode_line(m, n, path, tokenizer, template, special, tc) for n, m in conversations]
    vocab = getattr(cfg, "vocab", None)
    top = max(int(ids.max(initial=0)) for ids, _ in encoded)
    if vocab is not None and top >= vocab:
        sys.exit(
            f"error: chat data {path}: the tokenizer gives id {top}, not below the model's vocab "
            f"{vocab}: the tokenizer is another model's"
        )
    width = tc.seq + 1  # a row is seq inputs and, shifted by one, seq labels
    fields = {"tokens": [ids for ids, _ in encoded], "loss_mask": [mask for _, mask in encoded]}
    rows = pack_examples([(fields, "segments")], width, packed=False)
    del rows["segments"]  # one conversation to a row: the model reads no segment ids
    figures = chat_figures(encoded, rows, width)
    if is_lead():
        print(
            f"chat data: {figures['conversations']} conversations, {figures['loss_tokens']} of "
            f"{figures['tokens']} tokens trained on (train_on {tc.train_on}); "
            f"{figures['cut']} longer than seq + 1 = {width} tokens were cut",
            file=sys.stderr,
        )
    keep_tokenizer(folder / "tokenizer.json", run_dir)
    train, held_out = split_rows(rows)
    if tc.eval_every and not len(held_out["tokens"]):
        sys.exit(
            f"error: {len(rows['tokens'])} conversations leave none for the eval split "
            "(the last 2%): add conversations or set --eval-every 0"
        )
    return train, held_out, figures


def read_conversations(path: Path) -> list[tuple[int, list[dict]]]:
    """(line number, messages) of each non-blank line of a chat file; exits naming the first
    problems (bad JSON with its line, unknown roles, no assistant turn, ...) when there are any."""
    found, problems = scan_conversations(path)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        sys.exit(f"error: chat data {path}: " + "; ".join(problems[:5]) + more)
    if not found:
        sys.exit(f"error: chat data {path} holds no conversation")
    return found


def encode_line(messages: list[dict], n: int, path: Path, tokenizer, template, special, tc):
    """encode_chat of line `n`'s conversation; exits naming the line when its template fails."""
    import jinja2

    try:
        return encode_chat(messages, tokenizer, template, special, tc.train_on)
    except (ValueError, jinja2.TemplateError) as exc:
        sys.exit(f"error: chat data {path}, line {n}: the chat template fails: {exc}")


def chat_figures(encoded: list, rows: dict, width: int) -> dict[str, int]:
    """How many conversations, rows, tokens (as encoded), loss tokens (in the rows, at label
    positions) and cut conversations the chat data has."""
    return {
        "conversations": len(encoded),
        "rows": len(rows["tokens"]),
        "tokens": sum(len(ids) for ids, _ in encoded),
        "loss_tokens": int(rows["loss_mask"][:, 1:].sum()),
        "cut": sum(len(ids) > width for ids, _ in encoded),
    }


def keep_tokenizer(source: Path, run_dir: Path | None) -> None:
    """RUN_DIR/tokenizer.json: a copy of the chat data's tokenizer (process 0, once)."""
    if run_dir is None or not is_lead():
        return
    kept = run_dir / "tokenizer.json"
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(kept, source.read_bytes())
