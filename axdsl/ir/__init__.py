"""The typed IR: resolved layer instances, printable (`printer.py`), with Config expressions as
trees (`expr.py`). It imports nothing of the compiler above it: the verifier, which checks calls
against the primitive registry, is axdsl/passes/verify.py."""
