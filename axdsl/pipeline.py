"""The compiler pipeline in one place: load -> build the IR -> PASSES -> codegen.

    spec.axl --lark--> AST --irbuild ("resolve")--> IR --check, infer_shapes, stack_repeats--> IR
        --configure_target, choose_update_skip, configure_train, annotate_sharding,
          shard_activations, insert_remat, unroll_repeats, quantize_matmuls, select_kernels,
          plan_context, fit_remat, plan_pipeline, choose_xla_flags--> IR
        --split_head, plan_decode, select_config, plan_functions--> IR
        --codegen--> model.py, train.py

The first passes are the algorithm (target-independent); the target passes are the schedule, and
none of them may change what is computed except quantize_matmuls, within stated bounds. The
last passes decide the generated program's shape (the fused loss's cut, the decode path, the
Config's fields, which instances share a generated function) and
record it in the IR, so codegen only prints.

Each pass is `module -> module` (the target's name is `module.target_name`); tests run the IR
verifier after every one.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from collections.abc import Callable

from axdsl.errors import CompileError
from axdsl.ir import nodes as ir
from axdsl.irbuild import build_module
from axdsl.passes.annotate_sharding import annotate_sharding
from axdsl.passes.check import check
from axdsl.passes.choose_update_skip import choose_update_skip
from axdsl.passes.choose_xla_flags import choose_xla_flags
from axdsl.passes.configure_target import configure_target
from axdsl.passes.configure_train import configure_train
from axdsl.passes.infer_shapes import infer_shapes
from axdsl.passes.fit_remat import fit_remat
from axdsl.passes.insert_remat import insert_remat
from axdsl.passes.plan_context import plan_context
from axdsl.passes.plan_decode import plan_decode
from axdsl.passes.plan_functions import plan_functions
from axdsl.passes.plan_pipeline import plan_pipeline
from axdsl.passes.quantize_matmuls import quantize_matmuls
from axdsl.passes.select_config import select_config
from axdsl.passes.select_kernels import select_kernels
from axdsl.passes.shard_activations import shard_activations
from axdsl.passes.split_head import split_head
from axdsl.passes.stack_repeats import stack_repeats
from axdsl.passes.unroll_repeats import unroll_repeats
from axdsl.syntax.loader import Program, load

Pass = Callable[[ir.Module], ir.Module]

# The ordered pass list: algorithm passes, the target (schedule) passes, then the program's shape.
PASSES: tuple[tuple[str, Pass], ...] = (
    ("check", check),
    ("infer_shapes", infer_shapes),
    ("stack_repeats", stack_repeats),
    ("configure_target", configure_target),
    ("choose_update_skip", choose_update_skip),
    ("configure_train", configure_train),
    ("annotate_sharding", annotate_sharding),
    ("shard_activations", shard_activations),
    ("insert_remat", insert_remat),
    ("unroll_repeats", unroll_repeats),
    ("quantize_matmuls", quantize_matmuls),
    ("select_kernels", select_kernels),
    ("plan_context", plan_context),
    ("fit_remat", fit_remat),
    ("plan_pipeline", plan_pipeline),
    ("choose_xla_flags", choose_xla_flags),
    ("split_head", split_head),
    ("plan_decode", plan_decode),
    ("select_config", select_config),
    ("plan_functions", plan_functions),
)
PASS_NAMES = ("resolve",) + tuple(name for name, _ in PASSES)


def compile_spec(
    path: Path,
    target: str = "cpu",
    after: str | None = None,
    on_pass: Callable[[str, ir.Module], None] | None = None,
) -> ir.Module:
    """Run the pipeline on `path` for `target`, stopping after pass `after` if given."""
    program = load(path)
    return run_passes(program, target, after, on_pass)


def run_passes(
    program: Program,
    target: str = "cpu",
    after: str | None = None,
    on_pass: Callable[[str, ir.Module], None] | None = None,
) -> ir.Module:
    try:
        module = build_module(program, target)
        module = replace(module, passes_run=("resolve",))
        if on_pass:
            on_pass("resolve", module)
        if after == "resolve":
            return module
        for name, fn in PASSES:
            module = fn(module)
            module = replace(module, passes_run=module.passes_run + (name,))
            if on_pass:
                on_pass(name, module)
            if after == name:
                return module
    except CompileError as exc:
        raise CompileError(exc.diagnostics, program.sources) from None
    return module
