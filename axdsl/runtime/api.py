"""The runtime's interface version, which each generated train.py checks before it runs.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import sys

# The interface train.py files call. A build rewrites this file but keeps a train.py you edited,
# so each train.py states the API it was written for and `check_api` stops a mismatch up front.
API = 4


def check_api(expected: int) -> None:
    """Exit with a message (not a traceback deep in a run) when train.py and this file disagree."""
    if expected != API:
        sys.exit(
            f"train.py was written for runtime API {expected}, but {__file__} has API {API}: "
            "rebuild it with `axdsl build SPEC --target T --force` and carry your edits over"
        )
