"""stampede: benchmark the storage stampede of a checkpoint restore.

Importing the package is deliberately cheap (no numpy, rich or mpi4py): at 16,384 ranks
the tool's own import is itself a metadata stampede on the shared file system.
"""

import time as _time

# The first line of stampede that runs in a process: `stampede startup` measures the
# interpreter's start-up up to here, and the imports from here on.
FIRST_LINE_NS = _time.time_ns()

__version__ = "0.1.0"
