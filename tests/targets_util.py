"""Build a spec for a target in memory and import the generated package from a temporary dir."""

from __future__ import annotations

import importlib
import importlib.util
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


def import_model(files: dict[str, str], directory: Path, module: str = "model"):
    """Write a build's Python files (model.py and the kernels.py it imports from) into
    `directory` and import `module` from there as a package, under a fresh name."""
    directory.mkdir(parents=True, exist_ok=True)
    for file in ("__init__.py", "model.py", "kernels.py"):
        if file in files:
            (directory / file).write_text(files[file], encoding="utf-8")
    (directory / "__init__.py").touch()
    alias = f"axgen_model_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(
        alias, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[alias] = package
    spec.loader.exec_module(package)
    return importlib.import_module(f"{alias}.{module}")


def kernels_of(model):
    """The kernels.py module beside an imported generated model.py."""
    return importlib.import_module(f"{model.__package__}.kernels")
