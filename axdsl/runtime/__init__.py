"""The training runtime every generated train.py imports, as ordinary modules split by concern.

`axdsl build` copies these modules into one generated file, <root>/runtime.py
(axdsl/codegen/runtime_source.py: each module's body under a heading that names it, their imports
merged at the top), so the generated code imports nothing of axdsl. Here they are linted,
type-checked and imported by tests (tests/test_runtime_modules.py). A module imports only the
standard library, jax, numpy, optax, orbax, tqdm, tokenizers, tensorboardX and its siblings, and
defines each name once across the package: the copies share one namespace.
"""
