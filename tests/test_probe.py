"""The hostile-input harness (benchmarks/probe.py, issue 38 item 5) as tests: one test per probe.

Each probe does one hostile thing (a spec, a command-line value, data, a run directory, a resume
that changed, a Hugging Face config, a signal, a full disk, a link planted where a command writes)
and says what must come of it: the exit code, words of the error, files left untouched; never a
traceback or an internal error (exit 70), and no exit 0 without the right result. The probes share
one lab (a real 2-step tiny_llama run and its Hugging Face export, made once for the module); most
run in this process through `axdsl.cli.main` or the committed trainer's `main`, a few as real
processes where a signal or a full disk is the point. `python benchmarks/probe.py` prints them as a
table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from probe import PROBES, Lab, make_lab, run_probe  # noqa: E402


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Lab:
    return make_lab(tmp_path_factory.mktemp("probe"))


def test_the_harness_covers_every_class_with_50_cases_beyond_the_issue():
    classes = {p.cls for p in PROBES}
    assert classes == {"spec", "cli", "data", "rundir", "resume", "hf", "signal", "disk", "write"}
    assert sum(not p.issue for p in PROBES) >= 50
    assert len({p.id for p in PROBES}) == len(PROBES), "two probes with one id"


@pytest.mark.parametrize("probe", PROBES, ids=[p.id for p in PROBES])
def test_probe(lab, probe):
    if probe.elsewhere:  # a training run of its own: the test named runs the same in CI
        pytest.skip(f"slow here; CI runs it as {probe.elsewhere}")
    got = run_probe(probe, lab)
    if got.skipped:
        pytest.skip(got.skipped)
    assert (
        not got.problems
    ), f"{probe.id}: {'; '.join(got.problems)}\n{got.err[-3000:]}{got.out[-1000:]}"
