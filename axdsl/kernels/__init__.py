"""The JAX helper functions generated models call, as real code: linted, type-checked and run by
tests (tests/test_kernels_source.py).

A primitive's `Helper` names where its source is here (`Source("rope", ("apply_rope",))`);
codegen copies those definitions into model.py as written, reading the files as text, so the
build imports no jax and the generated code imports nothing of axdsl. A module here imports only
jax, numpy and the standard library (vjp_blocks.py: nothing), never the rest of axdsl.
"""
