"""AST -> IR: the stage between syntax/ and passes/ (as mypyc's irbuild/).

build.py       build_module: one spec's models and sections -> ir.Module
instances.py   layer instances with every hyperparameter resolved, params and children
forward.py     a layer's forward body -> typed tensor expressions (primitives from the registry)
sections.py    train and target blocks -> ir.Section
consteval.py   static expressions -> HValue (value and the ir.expr tree that recomputes it from cfg)
context.py     BuildContext (program, diagnostics, evaluator) and Scope, passed explicitly
"""

from axdsl.irbuild.build import build_module

__all__ = ["build_module"]
