"""`python -m axdsl` is the `axdsl` command."""

import sys

from axdsl.cli import main

sys.exit(main())
