"""Chat data for training: `data = chat("conversations.jsonl", tokenizer = DIR, train_on = ...)`
read into rows of token ids and loss mask (with axdsl/runtime/chat.py's encoding).

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import json
import sys
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from axdsl.runtime.chat import (
    answer_mask,
    encode_chat,
    load_special_tokens,
    load_template,
    preference_conversations,
    scan_conversations,
    tokenizer_folder,
)
from axdsl.runtime.data import data_path
from axdsl.runtime.examples import pack_examples, split_rows
from axdsl.runtime.processes import is_lead
from axdsl.runtime.files import replace_file
from axdsl.runtime.tokenizers import read_tokenizer

# data = chat("conversations.jsonl", tokenizer = DIR, train_on = ...): every conversation is
# encoded (encode_chat) and put in rows of seq + 1 tokens, padded with id 0 and loss mask 0. A
# model that reads segment ids (DecoderLM's `packed = true`) gets as many conversations to a row
# as fit, in order, numbered 1, 2, ... in `segments`: attention and positions stay inside each.
# Otherwise a row holds one conversation. A longer conversation is cut; the cuts are counted.


def load_chat(cfg, tc, spec: str, from_flag: bool, run_dir: Path | None = None, batch=()):
    """(train rows, eval rows, figures) of chat data, checked before the first step. Rows are
    {"tokens": [N, seq + 1], "loss_mask": [N, seq + 1]} (int32; the mask is 1 on the tokens the
    loss is taken on, read at the label positions 1..seq), and "segments" [N, seq + 1] when the
    `batch` fields hold them (the model reads segment ids); figures say how many conversations,
    rows, tokens and loss tokens there are and how many conversations were cut (run.json). The
    run keeps RUN_DIR/tokenizer.json, which `axdsl sample` decodes with."""
    path, (tokenizer, template, special) = chat_path(tc, spec, from_flag), chat_tokenizer(tc, spec)
    folder = tokenizer_folder(tc.tokenizer, spec)
    conversations = read_conversations(path)
    encoded = [
        encode_line(m, n, path, (tokenizer, template, special), tc.train_on, folder)
        for n, m in conversations
    ]
    check_vocab([ids for ids, _ in encoded], cfg, path)
    width = tc.seq + 1  # a row is seq inputs and, shifted by one, seq labels
    packed = "segments" in batch
    rows = chat_rows(encoded, width, packed)
    figures = chat_figures(encoded, rows, width)
    if is_lead():
        print(
            f"chat data: {figures['conversations']} conversations, {figures['loss_tokens']} of "
            f"{figures['tokens']} tokens trained on (train_on {tc.train_on}); "
            f"{figures['cut']} longer than seq + 1 = {width} tokens were cut; "
            f"{figures['rows']} rows" + (", several conversations to a row" if packed else ""),
            file=sys.stderr,
        )
    keep_tokenizer(tc, spec, template, special, run_dir)
    return (*split_chat_rows(rows, tc, "conversations"), figures)


def chat_rows(encoded: list, width: int, packed: bool) -> dict[str, np.ndarray]:
    """Rows of `width` of the encoded (ids, mask) conversations: one to a row, or `packed` as
    many as fit, in order, with their segment ids. A conversation's first token is then no
    label (its input would be the end of another conversation)."""
    fields = {"tokens": [ids for ids, _ in encoded], "loss_mask": [mask for _, mask in encoded]}
    rows = pack_examples([(fields, "segments")], width, packed=packed)
    if not packed:
        del rows["segments"]  # one conversation to a row: the model reads no segment ids
        return rows
    starts = rows["segments"] != np.pad(rows["segments"], ((0, 0), (1, 0)))[:, :-1]
    rows["loss_mask"] = np.where(starts, 0, rows["loss_mask"]).astype(np.int32)
    return rows


def chat_path(tc, spec: str, from_flag: bool) -> Path:
    """The .jsonl of chat or preference data (exits when it is not a file)."""
    path = data_path(tc, spec, from_flag)
    if not path.is_file():
        sys.exit(f"error: {tc.data} data {path} does not exist or is not a file")
    return path


def chat_tokenizer(tc, spec: str) -> tuple:
    """(tokenizers.Tokenizer, chat template, special tokens) of tc.tokenizer; exits saying what
    is missing."""
    folder = tokenizer_folder(tc.tokenizer, spec)
    if not (folder / "tokenizer.json").is_file():
        sys.exit(
            f"error: tokenizer {tc.tokenizer!r} is not a tokenizer.json nor a directory of one"
        )
    try:
        template, special = load_template(folder), load_special_tokens(folder)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    return (
        read_tokenizer(folder / "tokenizer.json", "a tokenizers tokenizer.json"),
        template,
        special,
    )


def check_vocab(ids: list[np.ndarray], cfg, path: Path) -> None:
    """Exit when the tokenizer gives an id the model cannot embed."""
    vocab = getattr(cfg, "vocab", None)
    top = max(int(i.max(initial=0)) for i in ids)
    if vocab is not None and top >= vocab:
        sys.exit(
            f"error: data {path}: the tokenizer gives id {top}, not below the model's vocab "
            f"{vocab}: the tokenizer is another model's"
        )


def split_chat_rows(rows: dict, tc, what: str) -> tuple[dict, dict]:
    """The train and eval rows (the last 2%); exits when evaluation has none."""
    train, held_out = split_rows(rows)
    if tc.eval_every and not len(next(iter(held_out.values()))):
        sys.exit(
            f"error: {len(next(iter(rows.values())))} {what} leave none for the eval split "
            "(the last 2%): add data or set --eval-every 0"
        )
    return train, held_out


def read_conversations(path: Path, preferences: bool = False) -> list:
    """(line number, messages, or with `preferences` the line's object) of each non-blank line of
    a chat or preferences file; exits naming the first problems (bad JSON with its line, unknown
    roles, no assistant turn, ...) when there are any."""
    found, problems = scan_conversations(path, preferences)
    what = "preferences" if preferences else "chat"
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        sys.exit(f"error: {what} data {path}: " + "; ".join(problems[:5]) + more)
    if not found:
        sys.exit(f"error: {what} data {path} holds no {'pair' if preferences else 'conversation'}")
    return found


def encode_line(messages: list[dict], n: int, path: Path, chat: tuple, train_on: str, folder: Path):
    """encode_chat of line `n`'s conversation; exits naming the line and the template when the
    template fails (render_chat makes whatever it raises a TemplateFailure, a ValueError)."""
    tokenizer, template, special = chat
    try:
        return encode_chat(messages, tokenizer, template, special, train_on)
    except ValueError as exc:
        sys.exit(f"error: data {path}, line {n}: the chat template of {folder} fails: {exc}")


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


def keep_tokenizer(tc, spec: str, template: str, special: dict, run_dir: Path | None) -> None:
    """What the run's chat data was rendered with, kept in RUN_DIR as a tokenizer directory
    (process 0, once): tokenizer.json, chat_template.jinja and special_tokens_map.json (the
    named special tokens the template reads). `axdsl sample --chat` and `axdsl eval` prompt with
    these, so a run still chats as it trained after its tokenizer's directory changes or goes."""
    if run_dir is None or not is_lead():
        return
    source = tokenizer_folder(tc.tokenizer, spec) / "tokenizer.json"
    special_map = json.dumps(special, indent=2, sort_keys=True) + "\n"
    kept = {
        "tokenizer.json": source.read_bytes,
        "chat_template.jinja": lambda: template.encode("utf-8"),
        "special_tokens_map.json": lambda: special_map.encode("utf-8"),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, content in kept.items():
        if not (run_dir / name).exists():
            replace_file(run_dir / name, content())


# ------------------------------------------------------------------- preference pairs (dpo)
# data = preferences("pairs.jsonl", tokenizer = DIR) with objective = dpo(...): each line's prompt
# with its chosen answer, and with its rejected one, encoded as chat data is, each in a row of its
# own; the mask marks the answer's tokens only. The reference's log-probabilities of both answers
# are added to the rows before the first step (with_reference).


def load_preferences(cfg, tc, spec: str, from_flag: bool, run_dir: Path | None = None):
    """(train rows, eval rows, figures) of preference pairs, checked before the first step. Rows
    are chosen, chosen_mask, rejected, rejected_mask [N, seq + 1] (int32: ids, and 1 on the
    answer's tokens); figures: pairs, and those cut (a side longer than seq + 1 tokens)."""
    path, (tokenizer, template, special) = chat_path(tc, spec, from_flag), chat_tokenizer(tc, spec)
    folder = tokenizer_folder(tc.tokenizer, spec)
    sides: dict[str, list] = {k: [] for k in ("chosen", "chosen_mask", "rejected", "rejected_mask")}
    for n, obj in read_conversations(path, preferences=True):
        chosen, rejected, turns = preference_conversations(obj)
        for side, messages in (("chosen", chosen), ("rejected", rejected)):
            chat = (tokenizer, template, special)
            ids, mask = encode_line(messages, n, path, chat, "assistant", folder)
            sides[side].append(ids)
            sides[f"{side}_mask"].append(answer_mask(mask, turns))
    check_vocab(sides["chosen"] + sides["rejected"], cfg, path)
    width = tc.seq + 1
    rows = pack_examples(
        [
            ({"chosen": sides["chosen"], "chosen_mask": sides["chosen_mask"]}, "chosen_rows"),
            (
                {"rejected": sides["rejected"], "rejected_mask": sides["rejected_mask"]},
                "rejected_rows",
            ),
        ],
        width,
        packed=False,
    )
    del rows["chosen_rows"], rows["rejected_rows"]  # one pair to a row
    cut = sum(
        len(c) > width or len(r) > width
        for c, r in zip(sides["chosen"], sides["rejected"], strict=True)
    )
    figures = {"pairs": len(sides["chosen"]), "cut": cut}
    if is_lead():
        print(
            f"preference data: {figures['pairs']} pairs; {cut} with a side longer than "
            f"seq + 1 = {width} tokens were cut",
            file=sys.stderr,
        )
    keep_tokenizer(tc, spec, template, special, run_dir)
    return (*split_chat_rows(rows, tc, "pairs"), figures)


def with_reference(rows: dict, logps, params, tc, sharding) -> dict:
    """`rows` with ref_chosen and ref_rejected [N] (float32): each answer's log-probability under
    `params` (the reference), from `logps(params, tokens, mask)` -> [batch], run over the rows
    tc.batch at a time (the last batch filled from the first rows), each process feeding its own
    part of every batch."""
    n = len(rows["chosen"])
    per = tc.batch // jax.process_count()
    mine = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
    out = dict(rows)
    for side in ("chosen", "rejected"):
        found = []
        for start in range(0, n, tc.batch):
            picks = np.arange(start, start + tc.batch)[mine] % n
            batch = [
                jax.make_array_from_process_local_data(
                    sharding, rows[k][picks], (tc.batch, tc.seq + 1)
                )
                for k in (side, f"{side}_mask")
            ]
            found.append(
                np.asarray(multihost_utils.process_allgather(logps(params, *batch), tiled=True))
            )
        out[f"ref_{side}"] = np.concatenate(found)[:n].astype(np.float32)
    return out
