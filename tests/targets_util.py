"""Build a spec for a target in memory and import the generated package from a temporary dir."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
from pathlib import Path

from axdsl.build import build_files, write_atomic

# Tests check what programs compute, not how fast they run: XLA's CPU backend compiles them without
# LLVM's expensive optimizations (tests/test_repeat.py: 82 s -> 48 s on 2 cores). The HLO passes
# (fusion, SPMD partitioning, collectives) are unchanged. Every test process gets these flags:
# conftest.py for pytest's own, xla_flags() for the subprocesses a test starts.
QUICK_XLA = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a test process with `devices` fake CPU devices, compiling quickly."""
    return f"{QUICK_XLA} --xla_force_host_platform_device_count={devices}"

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
