"""`stampede slurm`: an sbatch script for a job (stampede.sbatch renders it), printed,
written with --output, or submitted only with --submit. Every input is checked first: the
job and its --set overrides are loaded and validated as `stampede run` would, so a bad key
fails here, not after a queue wait."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.flags import add_job_arguments, add_renamed, set_words
from stampede.commands.outputs import add_output
from stampede.sbatch import DEFAULT_TIME

if TYPE_CHECKING:
    from stampede.commands import Subparsers


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "slurm", formatter_class=formatter,
        help="Render an sbatch script for a job (one restore, or a sweep with --ranks); print "
             "it, write it with --output, submit it only with --submit.",
        description="Render an sbatch script that prepares and runs a job under srun "
                    "--mpi=pmi2, from slurm/restore.sbatch (or slurm/sweep.sbatch with --ranks).",
        epilog="examples:\n"
               "  stampede slurm jobs/quickstart.toml --nodes 4 --ranks-per-node 8 "
               "--set target.path=/lustre/me/ckpt\n"
               "  stampede slurm jobs/quickstart.toml --nodes 4 --ranks-per-node 8 "
               "--ranks 1,8,16,32 --submit\n"
               "  stampede slurm jobs/quickstart.toml --ranks 8:1,8:2,8:4 --nodes 4 "
               "--output sweep.sbatch\n"
               "The script starts in the current directory (--chdir), so relative paths in the "
               "job mean what they mean here. Site options (account, QOS) can be given to "
               "sbatch as SBATCH_ACCOUNT, SBATCH_QOS in the environment.")
    add_job_arguments(sub, "override a job key (passed to every step)",
                      access="none")   # the commands it launches lock for themselves
    sub.add_argument("--nodes", default=None, metavar="N",
                     help="nodes to allocate (default 1; with --ranks, enough for the largest step)")
    add_renamed(sub, "--ranks-per-node", "--ntasks-per-node", default=None, metavar="K",
                help="ranks per node, sbatch's --ntasks-per-node (default 1; with --ranks, "
                     "enough for the largest step)")
    sub.add_argument("--ranks", default=None, metavar="R[:N],...",
                     help="sweep: rank counts, each optionally on N nodes, e.g. 1,2,4,8 or 8:1,8:2 "
                          "(default node count: the fewest that hold R at --ranks-per-node)")
    sub.add_argument("--time", default=DEFAULT_TIME, metavar="HH:MM:SS",
                     help=f"wall-clock limit, HH:MM:SS or D-HH:MM:SS (default {DEFAULT_TIME})")
    sub.add_argument("--partition", default="", metavar="P",
                     help="partition (default: the cluster's default)")
    sub.add_argument("--clean", action="store_true",
                     help="remove the checkpoint at the end of the job (only what prepare wrote)")
    add_output(sub, "--output", default="", metavar="FILE.sbatch",
               help="write the script to this file instead of printing it")
    sub.add_argument("--submit", action="store_true",
                     help="submit the script with sbatch and print the job id")
    sub.set_defaults(func=cmd_slurm)


def cmd_slurm(args: argparse.Namespace) -> int:
    from stampede.checkpoint.plan import bytes_per_rank
    from stampede.sbatch import allocation_for, check_partition, check_time, parse_count, render
    from stampede.spec import load_job

    allocation = allocation_for(parse_count("--nodes", args.nodes),
                                parse_count("--ranks-per-node", args.ranks_per_node), args.ranks)
    time_limit = check_time(args.time)
    partition = check_partition(args.partition)
    spec = load_job(args.job, args.set)    # the job and overrides, validated before any queue
    counts = [step.ranks for step in allocation.steps] or [allocation.nodes * allocation.ntasks_per_node]
    for nranks in counts:
        bytes_per_rank(spec, nranks)       # the checkpoint divides over each rank count
    script = render(Path(args.job).resolve(), spec.name, args.set, allocation, time_limit,
                    partition, args.clean, command_line(args))
    if args.output:
        Path(args.output).write_text(script)
        print(f"wrote {args.output}", file=sys.stderr)
    elif not args.submit:
        sys.stdout.write(script)
    if args.submit:
        print(submit(script, args.output))
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The `stampede slurm` command that renders this script, recorded in it."""
    words = ["stampede", "slurm", args.job, *set_words(args.set)]
    for flag, value in (("--nodes", args.nodes), ("--ranks-per-node", args.ranks_per_node),
                        ("--ranks", args.ranks), ("--time", args.time),
                        ("--partition", args.partition or None)):
        words += [flag, str(value)] if value is not None else []
    return shlex.join(words + (["--clean"] if args.clean else []))


def submit(script: str, path: str) -> str:
    """Submit with sbatch (the written file, else the script on stdin); the job id."""
    from stampede.errors import StampedeError, UsageError

    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise UsageError("--submit needs sbatch, and none is on PATH",
                         hint="run on a Slurm login node, or --output FILE and submit it there")
    command = [sbatch, "--parsable", *([path] if path else [])]
    done = subprocess.run(command, input=None if path else script, capture_output=True, text=True)
    if done.returncode:
        raise StampedeError(f"sbatch failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]
