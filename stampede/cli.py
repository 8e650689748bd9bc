"""The `stampede` command: argument parsing, the MPI entry point, errors to exit codes.

Only this module resolves COMM_WORLD (through stampede.mpi.world, called by the command
handlers). Errors are caught here and nowhere else: a StampedeError becomes one line on
rank 0 and the same exit status on every rank; any other exception aborts the whole MPI
job instead of leaving ranks in a barrier. The commands themselves are stampede.commands'.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from stampede import __version__
from stampede.commands import COMMANDS, commands_text, metrics_text
from stampede.errors import StampedeError
from stampede.launcher import launcher_rank, launcher_size

if TYPE_CHECKING:
    from stampede.mpi import Comm


class _Parser(argparse.ArgumentParser):
    """argparse that prints usage errors on rank 0 only (every rank exits 2), and whose
    epilog may be given as epilog_text, a function called only when help is printed:
    every rank parses its command line, none of them prints the help."""

    def __init__(self, *args: Any, epilog_text: Callable[[], str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epilog_text = epilog_text

    def format_help(self) -> str:
        if self.epilog_text is not None:
            self.epilog, self.epilog_text = self.epilog_text(), None
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        if launcher_rank() == 0:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    def _get_value(self, action: argparse.Action, arg_string: str) -> object:
        """A value its flag cannot take (--target-ranks 0, --lost-nodes x): one line, exit 2,
        not the command's whole usage before it (the flag and what it allows are named)."""
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as error:
            if launcher_rank() == 0:
                print(f"{self.prog}: error: {error}", file=sys.stderr)
            sys.exit(2)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        """A command's flags it does not know (`mttr --target-mttr`) refused by the command's
        own parser, naming it, not by the top one with `stampede [-h] [--version] COMMAND`."""
        parsed, extras = super().parse_known_args(args, namespace)
        command = getattr(parsed, "command", None)
        if extras and command and self.prog == "stampede":
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                    action.choices[command].error(
                        f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, its width found in shutil.get_terminal_size's order without
    importing shutil (and the compression modules it pulls in): argparse makes a formatter
    for every add_argument, on every rank."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)


def _columns() -> int:
    """$COLUMNS, else the width of the terminal on stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    stdout = sys.__stdout__
    try:
        return os.get_terminal_size(stdout.fileno()).columns or 80 if stdout else 80
    except (AttributeError, ValueError, OSError):   # not a terminal, or closed
        return 80


def _modules_for(argv: Sequence[str] | None) -> list[str]:
    """The command modules this command line needs registered: the command's own, or
    every one (--help, a mistyped command)."""
    words = [word for word in (sys.argv[1:] if argv is None else argv) if not word.startswith("-")]
    command = words[0] if words else ""
    if command in COMMANDS:
        return [COMMANDS[command]]
    return list(dict.fromkeys(COMMANDS.values()))


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    formatter = _Formatter
    parser = _Parser(prog="stampede", formatter_class=formatter,
                     usage="%(prog)s [-h] [--version] COMMAND ...",
                     description="Benchmark the storage stampede of a checkpoint's life: N MPI "
                                 "ranks open, stat and read a checkpoint at the same moment.\n\n"
                                 + commands_text(),
                     epilog_text=metrics_text)
    parser.add_argument("--version", action="version", version=f"stampede {__version__}")
    # listed by group in the description, not as argparse's one block; prog: each
    # command's usage and errors begin "stampede run", not the top usage's text
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser, help=argparse.SUPPRESS,
                                     prog="stampede")
    for module in _modules_for(argv):
        importlib.import_module(module).register(commands, formatter)
    return parser


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one command (`stampede COMMAND`'s flags)."""
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction))
    found: argparse.ArgumentParser = commands.choices[command]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv)
    return run_command(parser, parser.parse_args(argv))


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The parsed command run: its output flags checked first, then its handler; errors to
    exit statuses; the target's lock it held let go."""
    refused = True
    try:
        status = _handle(parser, args)
        refused = status == 2
        return status
    finally:
        _let_go(refused)


def _let_go(refused: bool) -> None:
    """The target's lock the command held (stampede.commands.flags.job_world), let go;
    `refused`: what taking it made, taken back where the command left nothing in it."""
    lock = sys.modules.get("stampede.checkpoint.lock")
    if lock is not None:
        lock.release_held(refused)


def _handle(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    comm = None
    try:
        _check_outputs(parser, args)
        status: int = args.func(args)
        return status
    except StampedeError as error:
        comm = _initialised_comm()
        if comm is not None and comm.Get_size() > 1 and not error.collective:
            # Raised on this rank alone while MPI runs: the others may be waiting for it.
            print(f"stampede {args.command}: error on rank {comm.Get_rank()}: {error}",
                  file=sys.stderr, flush=True)
            _abort(comm, error.exit_status)
        if launcher_rank() == 0:
            print(f"stampede {args.command}: error: {error}", file=sys.stderr, flush=True)
        return error.exit_status
    except KeyboardInterrupt as interrupt:   # 128 + the signal, as the shell reports it
        return 128 + int(getattr(interrupt, "signal", signal.SIGINT))
    except Exception:  # a bug: stop the whole job rather than hang the other ranks
        import traceback

        traceback.print_exc()
        comm = _initialised_comm()
        if comm is not None and comm.Get_size() > 1:
            _abort(comm, 1)
        return 1


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """stampede.commands.outputs' guard, by rank 0 alone: it alone writes what the flags
    name, and the others must not each probe the file system (at 16,384 ranks a storm, and
    inside `stampede startup`'s measured import). Under a launcher of several ranks the
    others wait in MPI_Init: a refusal is printed, then MPI started and the job aborted with
    its status (rank 0 exiting alone would leave them spinning there)."""
    if launcher_rank() != 0:
        return
    from stampede.commands.outputs import check_outputs

    try:
        check_outputs(command_parser(parser, args.command), args)
    except StampedeError as error:
        if (launcher_size() or 1) > 1:
            print(f"stampede {args.command}: error: {error}", file=sys.stderr, flush=True)
            from stampede.mpi import world

            _abort(world(), error.exit_status)
            sys.exit(error.exit_status)   # Abort may return before the launcher's kill
        raise


def _abort(comm: Comm, status: int) -> None:
    from stampede.mpi import abort

    abort(comm, status=status)


def _initialised_comm() -> Comm | None:
    mpi4py = sys.modules.get("mpi4py.MPI")
    if mpi4py is None or not mpi4py.Is_initialized() or mpi4py.Is_finalized():
        return None
    return mpi4py.COMM_WORLD
