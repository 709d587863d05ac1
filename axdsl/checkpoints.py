"""Which checkpoint of a train.py run is good to read, for the commands that read one (`sample`,
`export-hf`): read-only (a training may still be running), newest first, damaged ones skipped.

A step directory is good when orbax finished it (commit_success.txt), and either its
axdsl_checksums.json (written by the generated runtime after each commit) matches every file, or,
for a step killed before its checksums were written, the metadata files orbax reads first are
there and parse. The generated runtime checks the same things before it resumes (axdsl/runtime/
checkpoints.py: checksum_problem, structure_problem); generated code cannot import axdsl, so the
two are kept in step by tests/test_damaged_checkpoints.py, which damages real checkpoints.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHECKSUMS = "axdsl_checksums.json"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def step_problem(step_dir: Path) -> str | None:
    """What is wrong with one step directory of a run; None when it looks good."""
    if not (step_dir / "commit_success.txt").exists():
        return "orbax did not finish writing it"
    if not (step_dir / CHECKSUMS).exists():
        return _structure_problem(step_dir)
    try:
        table = json.loads((step_dir / CHECKSUMS).read_text(encoding="utf-8"))["files"]
        table = {name: (int(size), str(digest)) for name, (size, digest) in table.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return f"{CHECKSUMS} is unreadable"
    for name, (size, digest) in sorted(table.items()):
        path = step_dir / name
        if not path.is_file():
            return f"{name} is missing"
        if (actual := path.stat().st_size) != size:
            state = "empty" if not actual else "truncated"
            return f"{name} has {actual} bytes, {size} were written ({state})"
        if _sha256(path) != digest:
            return f"{name} is corrupt: its content differs from what was written (sha256)"
    return None


def _structure_problem(step_dir: Path) -> str | None:
    for name in ("state/_METADATA", "data/metadata"):
        path = step_dir / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return f"{name} is damaged (not valid JSON)"
    return None


def steps_newest_first(checkpoints: Path) -> list[int]:
    """The step directories orbax committed, newest first."""
    return sorted(
        (
            int(p.name)
            for p in checkpoints.glob("*")
            if p.name.isdigit() and (p / "commit_success.txt").exists()
        ),
        reverse=True,
    )


def good_steps(checkpoints: Path, warn) -> list[int]:
    """Committed steps newest first, each damaged one reported through `warn(message)` and left
    out (never moved: the reader is read-only)."""
    good = []
    for step in steps_newest_first(checkpoints):
        problem = step_problem(checkpoints / str(step))
        if problem is None:
            good.append(step)
        else:
            warn(f"checkpoint {step} in {checkpoints} is damaged ({problem}); skipping it")
    return good
