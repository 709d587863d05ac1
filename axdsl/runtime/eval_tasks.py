"""Task files for `axdsl eval`, read and checked before any model is loaded.

The kind of a task is told by the file: a .txt file is text to measure perplexity and bits per
byte on; a JSON-lines file whose first object has "choices" is multiple choice (lm-evaluation-
harness's local style: {"context", "choices", "gold"}); one whose first object has "prompt" is
greedy generation scored by exact match ({"prompt", "answer", optional "until"}). Every problem is
reported with its file and line, so a mistake is found without a traceback and without waiting
for a model to load. `axdsl eval` and a train block's `evals = [...]` both read tasks here.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path

from axdsl.runtime.chat import json_kind, keys_of

# Problems listed for one file before the rest are summarised: enough to see a pattern.
MAX_PROBLEMS = 10


class TaskKind(enum.Enum):
    """What a task measures."""

    CHOICE = "multiple_choice"  # acc and acc_norm from the log-likelihood of each choice
    PERPLEXITY = "perplexity"  # perplexity and bits per byte of a text
    GENERATE = "generate"  # exact match of greedy generation


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a task file, located (line 0: the file as a whole)."""

    path: Path
    line: int
    message: str
    hint: str

    def render(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        return f"{where}: error: {self.message}\n  hint: {self.hint}"


class TaskError(Exception):
    """Task files that cannot be evaluated; `problems` say where and why."""

    def __init__(self, problems: list[Problem]):
        super().__init__(problems[0].message if problems else "bad task")
        self.problems = problems

    def render(self) -> str:
        shown = [p.render() for p in self.problems[:MAX_PROBLEMS]]
        more = len(self.problems) - MAX_PROBLEMS
        return "\n".join(shown + ([f"... and {more} more"] if more > 0 else []))


@dataclass(frozen=True)
class ChoiceItem:
    """A multiple-choice question: each choice is scored as `delimiter + choice` after `context`
    (lm-evaluation-harness's target delimiter, a space by default)."""

    line: int
    context: str
    choices: tuple[str, ...]
    gold: int
    delimiter: str = " "


@dataclass(frozen=True)
class GenerateItem:
    """A prompt to continue greedily; the output, cut at the first of `until`, must equal
    `answer` (both stripped of surrounding whitespace)."""

    line: int
    prompt: str
    answer: str
    until: tuple[str, ...] = ()


@dataclass
class Task:
    """One task file: its kind and its items (or, for perplexity, its text)."""

    path: Path
    kind: TaskKind
    choices: list[ChoiceItem] = field(default_factory=list)
    generate: list[GenerateItem] = field(default_factory=list)
    text: str = ""

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def size(self) -> int:
        """Items in the task (UTF-8 bytes for a text)."""
        if self.kind is TaskKind.PERPLEXITY:
            return len(self.text.encode("utf-8"))
        return len(self.choices) if self.kind is TaskKind.CHOICE else len(self.generate)


JSONL_HINT = (
    'each line is one JSON object: {"context": ..., "choices": [...], "gold": i} for multiple '
    'choice, {"prompt": ..., "answer": ...} for generation; a .txt file is text for perplexity'
)


def read_tasks(paths: list[Path]) -> list[Task]:
    """Every task file read and checked; a TaskError with all their problems otherwise."""
    tasks, problems = [], []
    for path in paths:
        try:
            tasks.append(read_task(path))
        except TaskError as exc:
            problems += exc.problems
    if problems:
        raise TaskError(problems)
    return tasks


def read_task(path: Path) -> Task:
    """One task file, its kind told by its name (.txt) or its first object's keys."""
    raw = _read_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TaskError(
            [
                Problem(
                    path,
                    line,
                    f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}",
                    "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
                )
            ]
        ) from None
    if path.suffix == ".txt":
        if not text.strip():
            raise TaskError([Problem(path, 0, "the text is empty", "give a text to measure")])
        return Task(path, TaskKind.PERPLEXITY, text=text)
    return _read_jsonl(path, text)


def _read_bytes(path: Path) -> bytes:
    """The file's bytes; a missing or unreadable file is a located problem."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TaskError(
            [Problem(path, 0, f"cannot read the task: {exc.strerror or exc}", JSONL_HINT)]
        ) from None


def _read_jsonl(path: Path, text: str) -> Task:
    """A JSON-lines task: its kind from the first object's keys, then every line checked."""
    objects, problems = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            objects.append((number, json.loads(line)))
        except (ValueError, RecursionError) as exc:
            problems.append(Problem(path, number, f"not JSON ({exc})", JSONL_HINT))
    if not objects and not problems:
        problems.append(Problem(path, 0, "the task has no items", JSONL_HINT))
    kind = _kind_of(objects)
    if kind is None and objects:
        number, obj = objects[0]
        what = f"an object with {keys_of(obj)}" if isinstance(obj, dict) else json_kind(obj)
        problems.append(Problem(path, number, f"not a task item: {what}", JSONL_HINT))
    task = Task(path, kind or TaskKind.CHOICE)
    for number, obj in objects if kind is not None else []:
        item, wrong = _choice(obj, number) if kind is TaskKind.CHOICE else _generate(obj, number)
        problems += [Problem(path, number, message, hint) for message, hint in wrong]
        if isinstance(item, ChoiceItem):
            task.choices.append(item)
        elif isinstance(item, GenerateItem):
            task.generate.append(item)
    if problems:
        raise TaskError(problems)
    return task


def _kind_of(objects: list[tuple[int, object]]) -> TaskKind | None:
    """CHOICE or GENERATE from the first object's keys; None when it is neither."""
    first = objects[0][1] if objects else None
    if isinstance(first, dict) and "choices" in first:
        return TaskKind.CHOICE
    if isinstance(first, dict) and "prompt" in first:
        return TaskKind.GENERATE
    return None


CHOICE_HINT = '{"context": "...", "choices": ["a", "b"], "gold": 0}: gold indexes choices'


def _choice(obj: object, line: int) -> tuple[ChoiceItem | None, list[tuple[str, str]]]:
    """A multiple-choice item from one parsed line, or what is wrong with it."""
    if not isinstance(obj, dict):
        return None, [(f"an item is a JSON object, not {json_kind(obj)}", CHOICE_HINT)]
    wrong = []
    context, choices, gold = obj.get("context"), obj.get("choices"), obj.get("gold")
    delimiter = obj.get("delimiter", " ")
    if not isinstance(context, str):
        said = "no context" if "context" not in obj else f"context is {json_kind(context)}"
        wrong.append((f"{said}, not a string", CHOICE_HINT))
    if not isinstance(choices, list) or not choices:
        said = "empty" if choices == [] else json_kind(choices) if "choices" in obj else "missing"
        wrong.append((f"choices is {said}: a multiple-choice item needs a list", CHOICE_HINT))
    elif not all(isinstance(c, str) for c in choices):
        wrong.append(("every choice must be a string", CHOICE_HINT))
    if not isinstance(gold, int) or isinstance(gold, bool):
        said = "no gold" if "gold" not in obj else f"gold is {json_kind(gold)}"
        wrong.append((f"{said}, not the index of the right choice", CHOICE_HINT))
    elif isinstance(choices, list) and choices and not 0 <= gold < len(choices):
        wrong.append(
            (f"gold {gold} is out of range for {len(choices)} choices", "gold counts from 0")
        )
    if not isinstance(delimiter, str):
        wrong.append((f"delimiter is {json_kind(delimiter)}, not a string", CHOICE_HINT))
    if wrong:
        return None, wrong
    return ChoiceItem(line, obj["context"], tuple(obj["choices"]), obj["gold"], delimiter), []


GENERATE_HINT = '{"prompt": "...", "answer": "...", "until": ["\\n"]}: until is optional'


def _generate(obj: object, line: int) -> tuple[GenerateItem | None, list[tuple[str, str]]]:
    """A generation item from one parsed line, or what is wrong with it."""
    if not isinstance(obj, dict):
        return None, [(f"an item is a JSON object, not {json_kind(obj)}", GENERATE_HINT)]
    wrong = []
    for key in ("prompt", "answer"):
        if not isinstance(obj.get(key), str):
            said = f"no {key}" if key not in obj else f"{key} is {json_kind(obj[key])}"
            wrong.append((f"{said}, not a string", GENERATE_HINT))
    until = obj.get("until", [])
    until = [until] if isinstance(until, str) else until
    if not isinstance(until, list) or not all(isinstance(u, str) and u for u in until):
        wrong.append(("until must be a list of non-empty stop strings", GENERATE_HINT))
    if wrong:
        return None, wrong
    return GenerateItem(line, obj["prompt"], obj["answer"], tuple(until)), []
