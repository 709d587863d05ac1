"""Checkpoints with orbax: save with checksums, find complete and undamaged steps, set damaged
ones aside, resume from the newest good one, and roll back after a bad step.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import hashlib
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from axdsl.runtime.files import replace_file
from axdsl.runtime.processes import is_lead

CHECKSUMS = "axdsl_checksums.json"  # in each step directory: the size and sha256 of its files


class CheckpointManager(ocp.CheckpointManager):
    """orbax's manager that also writes each committed step's checksums (orbax alone never
    notices a flipped byte).

    An async save commits in the background, so a step's checksums are written at the next
    wait_until_finished: each save begins with one, and train.py ends with one. A step committed
    but killed before its checksums were written cannot be verified: it is restored if orbax can
    read it, and set aside if it cannot.
    """

    def wait_until_finished(self) -> None:
        try:
            super().wait_until_finished()
        except Exception as exc:  # noqa: BLE001 - a save failed in the background: disk full, I/O
            save_failed(Path(self.directory), exc)
        if is_lead():
            for step in self.all_steps():
                write_checksums(step_dir(self, step))


def io_failure(exc: BaseException | None) -> str | None:
    """The operating system's reason when `exc` (or what caused it) is a failed read or write,
    as Python or tensorstore words it ("No space left on device"); else None."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
        if code := re.search(r"os_error_code='(\d+)'", str(exc)):
            return os.strerror(int(code.group(1)))
        exc = exc.__cause__ or exc.__context__
    return None


def save_failed(directory: Path, exc: BaseException) -> NoReturn:
    """Exit 1 with one line for a checkpoint that could not be written (a full disk gave 450
    lines and five tracebacks of orbax's threads), naming the cause and the newest complete
    checkpoint, which the failed save left intact."""
    cause = io_failure(exc) or (str(exc).splitlines() or [type(exc).__name__])[0][:300]
    done = sorted(
        int(p.name) for p in directory.glob("[0-9]*") if (p / "commit_success.txt").exists()
    )
    kept = (
        f"checkpoint {done[-1]} and those before it are intact: make room, then rerun the same "
        "command to resume from it"
        if done
        else "no checkpoint was complete before it: make room, then rerun the same command"
    )
    sys.exit(f"error: saving a checkpoint in {directory} failed: {cause}; {kept}")


# Logs that report a failed save's writes, a traceback each: absl's (orbax's threads) and
# asyncio's ("Task exception was never retrieved" for tensorstore writes still in flight).
QUIETED_LOGS = ("absl", "asyncio")


def _not_io_failure(record: logging.LogRecord) -> bool:
    """A filter for QUIETED_LOGS: drop the records of a failed read or write, each a traceback
    from one of orbax's threads or tasks; save_failed reports the failure in one line."""
    return not (record.exc_info and io_failure(record.exc_info[1]))


def _quiet_closed_loop(previous):
    """An unraisable-exception hook that drops "Event loop is closed": after a failed save,
    tensorstore's writes still in flight report to orbax's closed loop, a traceback each (tens
    of them on a full disk); any other unraisable exception goes to `previous`."""

    def hook(unraisable) -> None:
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            previous(unraisable)

    return hook


def checkpoint_manager(run_dir: Path, tc) -> ocp.CheckpointManager:
    """Orbax checkpoints under RUN_DIR/{tc.checkpoint_dir}: keep the newest K, save asynchronously.

    Orbax writes each step to `<step>.orbax-checkpoint-tmp-*`, writes `commit_success.txt` into it
    and renames it to `<step>` when complete; leftover temporary directories are removed here.
    """
    if _not_io_failure not in logging.getLogger("absl").filters:
        for name in QUIETED_LOGS:
            logging.getLogger(name).addFilter(_not_io_failure)
        sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=tc.checkpoint_keep,
        enable_async_checkpointing=tc.checkpoint_async,
        cleanup_tmp_directories=True,
        create=True,
    )
    return CheckpointManager((run_dir / tc.checkpoint_dir).absolute(), options=options)


def step_dir(manager: ocp.CheckpointManager, step: int) -> Path:
    return Path(manager.directory) / str(step)


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_checksums(directory: Path) -> None:
    """Write `CHECKSUMS` (atomically) into a committed step directory that has none yet."""
    if not (directory / "commit_success.txt").exists() or (directory / CHECKSUMS).exists():
        return
    files = sorted(
        p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(CHECKSUMS)
    )
    table = {p.relative_to(directory).as_posix(): [p.stat().st_size, sha256(p)] for p in files}
    replace_file(directory / CHECKSUMS, json.dumps({"files": table}, indent=1))


def checksum_problem(directory: Path) -> str | None:
    """What differs between a step directory's files and its checksums; None if nothing does."""
    try:
        table = json.loads((directory / CHECKSUMS).read_text(encoding="utf-8"))["files"]
        table = {name: (int(size), str(digest)) for name, (size, digest) in table.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return f"{CHECKSUMS} is unreadable"
    for name, (size, digest) in sorted(table.items()):
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if (actual := path.stat().st_size) != size:
            how = "empty" if not actual else "truncated"
            return f"{name} has {actual} bytes, {size} were written ({how})"
        if sha256(path) != digest:
            return f"{name} is corrupt: its content differs from what was written (sha256)"
    return None


def structure_problem(directory: Path) -> str | None:
    """Without checksums: whether the metadata files orbax reads first are there and parse."""
    for name in ("state/_METADATA", "data/metadata"):
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return f"{name} is {'empty' if path.stat().st_size == 0 else 'not valid JSON'}"
    return None


def checkpoint_problem(directory: Path) -> str | None:
    """What is wrong with a committed step directory, or None when it looks intact."""
    if (directory / CHECKSUMS).exists():
        return checksum_problem(directory)
    return structure_problem(directory)


def set_aside(manager: ocp.CheckpointManager, step: int, problem: str) -> None:
    """Report a damaged step and rename it to `<step>.damaged` (kept, never deleted; orbax no
    longer lists it). Only process 0 renames; the others wait for it."""
    source = step_dir(manager, step)
    target, n = source.with_name(f"{step}.damaged"), 1
    while target.exists():
        n += 1
        target = source.with_name(f"{step}.damaged-{n}")
    if is_lead():
        print(f"checkpoint {step} is damaged: {problem}; set aside as {target}", file=sys.stderr)
        source.rename(target)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
    manager.reload()


def complete_steps(manager: ocp.CheckpointManager) -> list[int]:
    """Steps with a complete checkpoint, oldest first; partial ones are set aside (`set_aside`).

    On a local disk orbax lists every `<step>` directory, but only one it finished holds
    `commit_success.txt`: a directory without it (a copy cut short, a crashed writer) is never
    restored, so the previous complete checkpoint is used instead.
    """
    steps = []
    for step in manager.all_steps():
        if (Path(manager.directory) / str(step) / "commit_success.txt").exists():
            steps.append(step)
        else:
            # kept, never deleted: a save cut short, or files that are not axdsl's
            set_aside(manager, step, "it is incomplete (no commit_success.txt)")
    return sorted(steps)


def save(manager: ocp.CheckpointManager, state: dict, step: int, skipped: int, tc) -> None:
    """Save the state and the data position (step, and data skipped after restores)."""
    data = {
        "step": step,
        "skipped": skipped,
        "seed": tc.seed,
        "batch": tc.batch,
        "seq": getattr(tc, "seq", None),
    }
    manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data)),
    )


def restore(manager: ocp.CheckpointManager, abstract: dict, step: int) -> tuple[dict, dict]:
    """The train state (placed as `abstract` says) and the data position saved at `step`."""
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()
        ),
    )
    return restored["state"], restored["data"]


def restore_good(
    manager: ocp.CheckpointManager, abstract: dict, steps: list[int]
) -> tuple[int, dict, dict] | None:
    """(step, state, data position) of the newest of `steps` that is intact and restores; the
    damaged ones after it are reported and set aside. None when none is good."""
    for step in reversed(steps):
        problem = checkpoint_problem(step_dir(manager, step))
        if problem is None:
            try:
                return step, *restore(manager, abstract, step)
            except Exception as exc:  # tensorstore and orbax raise many types for unreadable data
                if (
                    step_dir(manager, step) / CHECKSUMS
                ).exists():  # intact: it is this run that differs
                    sys.exit(
                        f"error: checkpoint {step} is intact but does not fit this train state "
                        f"(was the model or optimizer changed?): {str(exc).splitlines()[0][:300]}"
                    )
                first = (str(exc).splitlines() or [type(exc).__name__])[0]
                problem = f"orbax cannot read it: {first[:300]}"
        set_aside(manager, step, problem)
    return None


def resume(
    manager: ocp.CheckpointManager, abstract: dict, run_dir: Path
) -> tuple[dict, int, int] | None:
    """(state, step, data skipped) from the newest good checkpoint; None when there is none."""
    if not (found := restore_good(manager, abstract, complete_steps(manager))):
        return None
    _, state, data = found
    if is_lead():
        print(f"resumed from step {data['step']} in {run_dir}", file=sys.stderr)
    return state, data["step"], data["skipped"]


def rollback(manager: ocp.CheckpointManager, abstract: dict, good: int) -> tuple[dict, dict] | None:
    """(state, data position) of the newest good checkpoint at or before step `good`; None if none.

    Damaged ones are set aside; checkpoints after it are from the stretch being abandoned (it is
    redone): they are deleted.
    """
    manager.wait_until_finished()
    found = restore_good(manager, abstract, [s for s in complete_steps(manager) if s <= good])
    if not found:
        return None
    step, state, data = found
    for later in [s for s in manager.all_steps() if s > step]:
        manager.delete(later)
    return state, data
