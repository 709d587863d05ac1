"""The runtime's source modules (axdsl/runtime/) imported and run directly, and the generated
runtime.py made from them: every module copied under its heading, nothing of axdsl imported, and
no jax imported to build it."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from axdsl.codegen import runtime_source
import pytest

from axdsl.runtime import api, checkpoints, command_line, data, examples, files, metrics, tokenizers

ROOT = Path(__file__).resolve().parent.parent


def test_batches_are_a_function_of_seed_and_step():
    tokens = np.arange(1000, dtype=np.uint16)
    train, held_out = data.split(tokens)
    assert len(train) == 980 and held_out[0] == 980
    tc = SimpleNamespace(seed=3, seq=8, batch=4)
    rows = data.batch_rows(train, tc, 5, slice(None))
    assert rows.shape == (4, 9) and rows.dtype == np.int32
    assert (np.diff(rows, axis=1) == 1).all()  # consecutive tokens of the stream
    np.testing.assert_array_equal(rows, data.batch_rows(train, tc, 5, slice(None)))
    np.testing.assert_array_equal(rows[2:], data.batch_rows(train, tc, 5, slice(2, None)))
    assert not np.array_equal(rows, data.batch_rows(train, tc, 6, slice(None)))


def test_token_problems_name_ids_past_the_vocab():
    assert data.token_problems(np.array([1, 2, 3]), 4) == []
    (problem,) = data.token_problems(np.array([1, 9, 7, 2]), 5, chunk=3)
    assert problem.startswith("2 of 4 token ids are >= the model's vocab 5 (the largest is 9)")
    assert data.token_problems(np.array([], dtype=np.uint16), 5) == ["the data holds no tokens"]


def test_tokenization_cache_round_trips_and_damage_is_set_aside(tmp_path):
    ids = np.array([5, 6, 7], dtype=np.uint16)
    cache = tmp_path / "x.tokens.npy"
    files.replace_file(cache, _npy(ids))
    digest = __import__("hashlib").sha256(ids.tobytes()).hexdigest()
    files.replace_file(cache.with_name(cache.name + ".sha256"), digest.encode())
    np.testing.assert_array_equal(tokenizers.read_cached(cache), ids)
    files.replace_file(cache, _npy(ids + 1))
    assert tokenizers.read_cached(cache) is None
    assert not cache.exists() and any(p.name.endswith(".damaged") for p in tmp_path.iterdir())


def test_replace_file_replaces_a_link_and_writes_nothing_through_it(tmp_path):
    (tmp_path / "mine").write_text("mine")
    (tmp_path / "out.json").symlink_to("mine")
    (tmp_path / "out.json.partial").symlink_to("mine")  # a name the old writers used
    files.replace_file(tmp_path / "out.json", "new\n")
    assert (tmp_path / "mine").read_text() == "mine"
    assert not (tmp_path / "out.json").is_symlink()
    assert (tmp_path / "out.json").read_text() == "new\n"


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path):
    path = tmp_path / "spec.axl"
    path.write_text("old\n")
    path.chmod(0o640)

    def cut_short(tmp: Path) -> None:
        tmp.write_text("ne")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        files.replace_file_with(path, cut_short)
    assert path.read_text() == "old\n" and sorted(tmp_path.iterdir()) == [path]
    files.replace_file(path, "new\n")
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o640  # mode kept


def test_open_append_refuses_a_link(tmp_path):
    (tmp_path / "mine").write_text("mine\n")
    (tmp_path / "metrics.jsonl").symlink_to("mine")
    with pytest.raises(files.UnsafePathError, match="metrics.jsonl is a symlink"):
        files.open_append(tmp_path / "metrics.jsonl")
    assert (tmp_path / "mine").read_text() == "mine\n"
    with files.open_append(tmp_path / "new.jsonl") as f:
        f.write("{}\n")
    assert (tmp_path / "new.jsonl").read_text() == "{}\n"


def _npy(a: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, a)
    return buffer.getvalue()


def test_checksums_find_truncated_and_corrupt_files(tmp_path):
    (tmp_path / "commit_success.txt").write_text("ok")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "a.bin").write_bytes(b"abcdef")
    checkpoints.write_checksums(tmp_path)
    assert checkpoints.checksum_problem(tmp_path) is None
    (tmp_path / "state" / "a.bin").write_bytes(b"abcdeX")
    assert "corrupt" in checkpoints.checksum_problem(tmp_path)
    (tmp_path / "state" / "a.bin").write_bytes(b"abc")
    assert checkpoints.checksum_problem(tmp_path) == (
        "state/a.bin has 3 bytes, 6 were written (truncated)"
    )


def test_a_failed_saves_tracebacks_are_dropped_from_orbax_and_asyncio_logs(tmp_path, capsys):
    """A full disk mid-save: orbax's threads (absl) and tensorstore's tasks still in flight
    (asyncio's "Task exception was never retrieved") each log a traceback; save_failed's one line
    says it. Other errors still reach the logs."""
    import logging

    tc = SimpleNamespace(checkpoint_keep=1, checkpoint_async=True, checkpoint_dir="checkpoints")
    checkpoints.checkpoint_manager(tmp_path, tc).close()
    full = ValueError(
        "RESOURCE_EXHAUSTED: Error writing \"step/0\": No space left on device [os_error_code='28']"
    )
    assert checkpoints.io_failure(full) == "No space left on device"
    for name in checkpoints.QUIETED_LOGS:
        log = logging.getLogger(name)
        dropped = log.makeRecord(
            name, logging.ERROR, "f", 1, "failed", (), (ValueError, full, None)
        )
        kept = log.makeRecord(
            name, logging.ERROR, "f", 1, "other", (), (KeyError, KeyError(1), None)
        )
        assert not log.filter(dropped), name
        assert log.filter(kept), name


def test_pairs_pack_into_rows_with_segments():
    sources = [np.array([1, 2]), np.array([3])]
    targets = [np.array([4]), np.array([5, 6])]
    rows = examples.pack_pairs(sources, targets, seq=4, packed=True)
    np.testing.assert_array_equal(rows["tokens"][0], [1, 2, 3, 0])
    np.testing.assert_array_equal(rows["segments"][0], [1, 1, 2, 0])
    assert len(examples.pack_pairs(sources, targets, seq=4, packed=False)["tokens"]) == 2


def test_a_call_ends_at_the_next_event():
    tc = SimpleNamespace(steps_per_call=8, steps=20, eval_every=5, checkpoint_every=0)
    assert command_line.steps_in_call(tc, 0) == 5
    assert command_line.steps_in_call(tc, 5, bounds=(7,)) == 2
    assert command_line.steps_in_call(tc, 15) == 5


def test_metrics_rows_are_strict_json():
    row = metrics.json_safe({"step": 1, "loss": math.nan, "train": {"clip": math.inf}})
    assert row == {
        "step": 1,
        "loss": None,
        "train": {"clip": None},
        "nonfinite": ["loss", "train.clip"],
    }
    json.dumps(row, allow_nan=False)


def test_check_api_stops_a_mismatched_train_py():
    api.check_api(api.API)
    try:
        api.check_api(api.API + 1)
    except SystemExit as exc:
        assert "rebuild it" in str(exc)
    else:
        raise AssertionError("check_api accepted another API")


def test_generated_runtime_is_the_modules_bodies_under_their_headings():
    text = runtime_source.emit_runtime("0")
    tree = ast.parse(text)
    for section in runtime_source.SECTIONS:
        assert section.heading() in text
        _, body = runtime_source.module_parts((ROOT / section.path).read_text(), section.path)
        assert body in text
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(m.split(".")[0] == "axdsl" for m in imported)
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert len(names) == len(set(names)), "two runtime modules define the same name"
    assert sorted(p.stem for p in (ROOT / "axdsl/runtime").glob("[!_]*.py")) == sorted(
        s.module for s in runtime_source.SECTIONS
    ), "every runtime module is a section of runtime.py"


def test_building_the_runtime_imports_no_jax():
    code = (
        "import sys; from axdsl.codegen import runtime_source; runtime_source.emit_runtime('0'); "
        "assert 'jax' not in sys.modules and 'numpy' not in sys.modules, 'imported jax'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_replacing_a_fifo_writes_into_it_and_keeps_it(tmp_path):
    """A target that is not a regular file (a FIFO here; /dev/full or /dev/stdout for a user) is
    written to, never renamed over: as root, renaming over /dev/full replaced the device node."""
    import os
    import stat
    import threading

    from axdsl.runtime.files import replace_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    replace_file(fifo, b"results\n")
    reader.join(timeout=10)
    assert got == [b"results\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary file left
