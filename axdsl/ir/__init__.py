"""The typed IR: resolved layer instances, printable (`printer.py`) and checkable (`verify.py`)."""
