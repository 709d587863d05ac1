"""`train.py --profile START:STOP`: a jax.profiler trace of exactly those steps in RUN_DIR/profile,
whose XLA ops carry the spec's layer and named-point scopes; bad windows are one-line errors.

The trace is read as raw bytes (no xprof/tensorboard-plugin-profile here): the .xplane.pb holds
the compiled program's HLO with each op's `op_name` metadata, the scope path
`jit(steps)/.../blocks/closed_call/attn/query_proj/dot_general`; trace.json.gz holds the host
events, among them one "train" step per jitted call.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu")
ARGS = ["--steps", "6", "--batch", "8", "--seq", "64", "--eval-every", "0", "--checkpoint-every", "0",
        "--log-every", "1", "--no-progress", "--compile-cache", "none"]


def train(run: Path, *extra: str) -> subprocess.CompletedProcess:
    """generated/tiny_llama/cpu/train.py as its users run it, on 2 fake CPU devices."""
    return subprocess.run([sys.executable, "-m", "generated.tiny_llama.cpu.train", *ARGS, "--out", str(run), *extra],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


def test_profile_traces_the_window_with_layer_and_point_names(tmp_path):
    proc = train(tmp_path / "run", "--profile", "2:4")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"profile of steps 2..3 in {tmp_path / 'run' / 'profile'}" in proc.stderr
    [xplane] = (tmp_path / "run" / "profile").glob("plugins/profile/*/*.xplane.pb")
    ops = xplane.read_bytes()
    for scope in (b"/attn/", b"/mlp/", b"/attn_norm/", b"/attn/query_proj/", b"/mlp/mlp_hidden/"):
        assert scope in ops, scope  # layers (jax.named_scope) and named points (`as mlp_hidden`)
    [events] = xplane.parent.glob("*.trace.json.gz")
    assert (xplane.parent / "perfetto_trace.json.gz").is_file()  # ui.perfetto.dev, trace_report.py
    steps = [e["args"]["step_num"] for e in json.loads(gzip.decompress(events.read_bytes()))["traceEvents"]
             if e.get("name") == "train"]
    assert steps == ["2"]  # one call, of steps 2 and 3: the window's bounds end calls (cpu runs up to 8)
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) >= 6  # the run itself went on


@pytest.mark.parametrize("value, why", [("4:2", "0 <= START < STOP"), ("3:3", "0 <= START < STOP"),
                                        ("-1:2", "START:STOP"), ("2", "START:STOP"), ("a:b", "START:STOP"),
                                        ("2:7", "STOP is at most 6")])
def test_a_bad_window_is_a_one_line_error(value, why):
    from generated import runtime

    with pytest.raises(SystemExit) as exit:
        runtime.profile_window(value, SimpleNamespace(steps=6))
    assert str(exit.value).startswith(f"error: --profile ") and why in str(exit.value)
    assert "\n" not in str(exit.value)


def test_a_bad_window_stops_train_py_before_it_starts(tmp_path):
    proc = train(tmp_path / "run", "--profile", "5:1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --profile '5:1'")
    assert not (tmp_path / "run" / "run.json").exists()


def test_calls_end_at_the_window_bounds():
    from generated.tiny_llama.cpu import train as tm

    tc = dataclasses.replace(tm.TRAIN, steps=30, steps_per_call=8, eval_every=0, checkpoint_every=0)
    calls, step = [], 0
    while step < tc.steps:
        calls.append(tm.runtime.steps_in_call(tc, step, (10, 13)))
        step += calls[-1]
    assert calls == [8, 2, 3, 8, 8, 1]  # steps 10..12 are one call of their own


def test_a_run_ended_inside_the_window_still_writes_its_trace(tmp_path):
    """Preemption (SystemExit 143) or an error inside the window: leaving the `with` stops the trace."""
    import jax.numpy as jnp

    from generated import runtime

    with pytest.raises(SystemExit):
        with runtime.Profile(SimpleNamespace(profile="1:5", out=tmp_path), SimpleNamespace(steps=8)) as profile:
            profile.before(1, jnp.zeros(()))
            jnp.arange(4.0).sum().block_until_ready()
            raise SystemExit(143)
    assert not profile.active and list(tmp_path.glob("profile/plugins/profile/*/*.xplane.pb"))
