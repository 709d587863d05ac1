"""axdsl: describe a model once in a small language, emit readable JAX for every accelerator.

The pipeline is syntax -> IR -> passes -> targets -> codegen; see docs/architecture.md.
This package never imports jax: building code must stay fast and runnable anywhere.
"""

__version__ = "0.1.0"
