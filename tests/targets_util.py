"""Build a spec for a target in memory and import the generated package from a temporary dir."""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

from axdsl.build import build_files, write_atomic

_counter = itertools.count()


def import_generated(spec: Path, target: str, tmp: Path):
    """(model module, train module or None) of `spec` built for `target`, under a fresh package name."""
    files = build_files(spec, target)
    name = f"axgen_{target.replace('-', '_')}_{next(_counter)}"
    out = tmp / name / "spec" / "target"  # <root>/<spec>/<target>/, as train.py's `from ... import runtime` needs
    write_atomic(out, files, make_packages=True)
    if str(tmp) not in sys.path:
        sys.path.insert(0, str(tmp))
    model = importlib.import_module(f"{name}.spec.target.model")
    train = importlib.import_module(f"{name}.spec.target.train") if "train.py" in files else None
    return model, train
