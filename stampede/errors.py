"""The error hierarchy. Raised anywhere, caught only in the CLI.

- `UsageError` (exit 2): the job or the command line is wrong; found before any I/O.
- `CheckpointError` (exit 2): the checkpoint on the target does not match the job
  (not prepared, prepared for another rank count, a foreign directory).
- `RunFailed` (exit 1): the run itself went wrong (I/O errors, corrupt data, deadline);
  what was measured is archived, marked invalid, before this is raised.
"""


class StampedeError(Exception):
    """Base class: one clear line for the user, and the exit status to leave with."""

    exit_status = 1
    # True when raised on every rank at once (by stampede.mpi.collective): the ranks then
    # leave together. An error raised on one rank alone, once MPI runs, aborts the job.
    collective = False

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class UsageError(StampedeError):
    """A bad job file, override or command-line argument."""

    exit_status = 2


class CheckpointError(StampedeError):
    """The target does not hold the checkpoint this job needs."""

    exit_status = 2


class RunFailed(StampedeError):
    """The run finished with errors; its partial results are archived as invalid."""

    exit_status = 1


def install_hint(extra: str) -> str:
    """How to install an optional part, as this stampede was installed: from a clone
    (editable) its own path with the extra, else the package's name with it."""
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent
    if (here / "setup.cfg").is_file() and (here / "stampede").is_dir():
        return f"pip install -e '{here}[{extra}]'"
    return f"pip install 'stampede[{extra}]'"
