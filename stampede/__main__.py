"""`python -m stampede` is the same as the `stampede` command."""

import sys

from stampede.cli import main

sys.exit(main())
