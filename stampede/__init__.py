"""stampede: benchmark the storage stampede of a checkpoint restore.

Importing the package is deliberately cheap (no numpy, rich or mpi4py): at 16,384 ranks
the tool's own import is itself a metadata stampede on the shared file system.
"""

__version__ = "0.1.0"
