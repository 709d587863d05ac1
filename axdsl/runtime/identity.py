"""What a run is, and the check that a rerun into its directory continues that same run.

run.json records the run's identity: its target, a digest of the generated code it trains
(model.py and train.py), every train setting that shapes its results, and a digest of its data.
A rerun that finds checkpoints in the run directory resumes only when its own identity is the
same, so that a resume is the run a fresh start with these settings would be: not the first
steps of one spec, target, data or schedule followed by another's. Otherwise one line naming
each difference, before data and compute, and exit 1.

`--steps` is special: a longer (or shorter) run is the same run when the learning rate of
every step already taken is unchanged (a constant schedule, or steps still in warmup or before a
WSD decay). A cosine schedule stretched over more steps is not: its lr jumps at the resume.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import ast
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from axdsl.runtime.chat import tokenizer_folder
from axdsl.runtime.data import data_path, unreadable
from axdsl.runtime.processes import is_lead

# Train settings that are schedule, not results: changing them on a resume mixes nothing.
# (micro-batches split the same batch; steps is checked by its learning rates.)
NEUTRAL_SETTINGS = frozenset(
    {
        "steps",
        "microbatches",
        "eval_every",
        "eval_batches",
        "log_every",
        "max_bad_steps",
        "steps_per_call",
        "checkpoint_every",
        "checkpoint_keep",
        "checkpoint_async",
        "checkpoint_dir",
    }
)
DATA_SETTINGS = ("data_path", "data_target")  # compared by content: the files may move
CODE_FILES = ("model.py", "kernels.py", "train.py")  # kernels.py: only when the model has helpers
# chat data: the files of its tokenizer that shape the ids (vocabulary, template, special tokens)
CHAT_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
SAMPLE_BYTES = 1 << 16  # a data file's digest reads this much of its start and of its end


def code_digest(path: Path) -> str:
    """sha256 of the program in a generated file: its syntax tree without docstrings, so that
    comments, formatting and the version in its header do not count; its code does."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.body and _is_docstring(node.body[0]):
                node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def files_digest(path: Path) -> str | None:
    """A digest of a data file or directory: each file's name (relative), size, first and last
    SAMPLE_BYTES. Cheap on terabytes and blind to a move, not to an edit, an append or a new
    file. None when the path is absent, or neither a file nor a directory (a FIFO, a device,
    whose open would block or never end): the data check refuses those later."""
    if not (path.is_file() or path.is_dir()):
        return None  # a FIFO would block the open (and a device never end): load_data refuses it
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        try:
            size = file.stat().st_size
            digest.update(f"{file.relative_to(path) if path.is_dir() else ''}\0{size}\0".encode())
            with file.open("rb") as f:
                digest.update(f.read(SAMPLE_BYTES))
                f.seek(max(size - SAMPLE_BYTES, 0))
                digest.update(f.read(SAMPLE_BYTES))
        except OSError as exc:
            unreadable(exc)
    return digest.hexdigest()


def tokenizer_digest(folder: Path) -> str:
    """sha256 over the chat tokenizer's files in `folder` (CHAT_TOKENIZER_FILES, those present)."""
    digest = hashlib.sha256()
    for name in CHAT_TOKENIZER_FILES:
        if (folder / name).is_file():
            digest.update(f"{name}\0".encode() + (folder / name).read_bytes())
    return digest.hexdigest()


def run_identity(tc, spec: str, target: str, file: str, data_from_flag: bool) -> dict:
    """The identity run.json records: `file` is train.py's `__file__`; `data_from_flag`: the
    data path came from --data (relative to the working directory, else to the spec)."""
    here = Path(file).resolve().parent
    data = {}
    for name in DATA_SETTINGS:
        if getattr(tc, name, ""):
            where = dataclasses.replace(tc, data_path=getattr(tc, name))
            data[name] = files_digest(data_path(where, spec, data_from_flag))
    if getattr(tc, "data", "") in ("chat", "preferences"):  # ids: tokenizer and template too
        data["tokenizer"] = tokenizer_digest(tokenizer_folder(tc.tokenizer, spec))
    return {
        "target": target,
        "code": {name: code_digest(here / name) for name in CODE_FILES if (here / name).exists()},
        "data": data,
    }


def check_resume(
    run_dir: Path, tc, identity: dict, lr_schedule, force: bool = False
) -> dict | None:
    """Before data and compute: when RUN_DIR holds checkpoints, this command must continue the
    run that wrote them. `lr_schedule` is train.py's (TrainConfig -> optax schedule). With
    `force` (--force-resume) a mismatch is a warning, and the record of it (step, changes) is
    returned for run.json; else None."""
    info = recorded(run_dir)
    steps = _saved_steps(run_dir / tc.checkpoint_dir)
    if info is None or not steps:
        return None  # a new run
    old = info.get("train", {})
    problems = []
    if info.get("target") != identity["target"]:
        problems.append(f"its target is {info.get('target')}, this one is {identity['target']}")
    if "identity" in info:
        problems += _identity_changes(info["identity"], identity)
    elif is_lead():
        print(
            f"warning: {run_dir / 'run.json'} predates run identities: a change of the spec or of "
            "the data is not detected on this resume",
            file=sys.stderr,
        )
    for field in dataclasses.fields(tc):
        name, new = field.name, json.loads(json.dumps(getattr(tc, field.name)))
        if name in NEUTRAL_SETTINGS or name in DATA_SETTINGS or name not in old:
            continue
        if old[name] != new:
            problems.append(f"{name} was {old[name]!r}, now {new!r}")
    if max(steps) > tc.steps:  # it resumed past its end with exit 0: more steps than asked for
        problems.append(
            f"steps was {old.get('steps')}, now {tc.steps}: it has taken {max(steps)} already, "
            "and a resume cannot take steps back"
        )
    elif old.get("steps", tc.steps) != tc.steps:
        problems += _schedule_change(tc, old, max(steps), lr_schedule)
    if not problems:
        return None
    if force:
        if is_lead():
            print(f"warning: --force-resume: {'; '.join(problems)}", file=sys.stderr)
        return {"step": max(steps), "changes": problems}
    sys.exit(
        f"error: {run_dir} holds checkpoints of another run (up to step {max(steps)}); "
        "resuming it here would mix two runs: " + "; ".join(problems) + ".\n  hint: rerun "
        "with its own settings to resume it; to start from its weights instead, give a new "
        f"--out and --init-from {run_dir}; to mix them anyway, --force-resume (run.json "
        "records it)"
    )


def recorded(run_dir: Path) -> dict | None:
    """RUN_DIR/run.json as a dict, or None when it is missing or not JSON (the one reader of
    run.json here: check_run_dir, check_resume and start_run)."""
    try:
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _saved_steps(checkpoints: Path) -> list[int]:
    """The steps of the checkpoints in `checkpoints`, complete or not."""
    if not checkpoints.is_dir():
        return []
    return [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and p.is_dir()]


def _identity_changes(old: dict, new: dict) -> list[str]:
    """What differs between two recorded identities: generated code, data."""
    problems = []
    for name in CODE_FILES:
        if old.get("code", {}).get(name) != new["code"].get(name):
            problems.append(f"its generated {name} differs (the spec or axdsl changed)")
    for name, digest in new["data"].items():
        if old.get("data", {}).get(name, digest) != digest:
            problems.append(f"the data of {name} differs (another file, or its contents changed)")
    return problems


def _schedule_change(tc, old: dict, saved: int, lr_schedule) -> list[str]:
    """[] when the learning rate of every step before `saved` is the same under the old steps
    and the new, else the first step where they differ and both rates."""
    before = dataclasses.replace(tc, steps=old["steps"])
    taken = np.arange(saved)
    old_lr = np.asarray(lr_schedule(before)(taken))
    new_lr = np.asarray(lr_schedule(tc)(taken))
    differ = np.flatnonzero(old_lr != new_lr)
    if not len(differ):
        return []
    at = int(differ[0])
    return [
        f"steps was {old['steps']}, now {tc.steps}: that changes the learning rate of steps it "
        f"already took (step {at}: {old_lr[at]:.3g}, now {new_lr[at]:.3g})"
    ]
