"""`stampede completion bash|zsh`: a shell completion script made from the parsers
themselves (every command, each command's flags, the choices of those that have them),
job files (*.toml) where a JOB is asked, the job keys of stampede.spec.OPTIONS after
--set, file names after a flag that takes a path (an output, --checkpoint PATH) and nothing
after one that takes another value (--trace-limit SIZE: never the job files). zsh gets the
same function through its bashcompinit."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from stampede.commands import Subparsers

SHELLS = ("bash", "zsh")

# The script's fixed part; script() fills in the @NAMES@.
BASH = r"""# stampede completion for bash (made by `stampede completion bash`)
_stampede_jobs() {
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -X '!*.toml' -- "$cur") $(compgen -d -- "$cur"))
}
_stampede() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local cmd="" flags="" words="" job=0 i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac
    done
    if [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "@COMMANDS@ --help --version" -- "$cur"))
        return
    fi
    if [[ $prev == --set ]]; then
        compopt -o nospace 2>/dev/null
        COMPREPLY=($(compgen -W "@SET_KEYS@" -- "$cur"))
        return
    fi
    case "$cmd $prev" in
@CHOICES@
    esac
    case "$cmd" in
@FLAGS_BY_COMMAND@
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    elif [[ -n $words ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    elif ((job)); then
        _stampede_jobs
    fi
}
complete -o default -F _stampede stampede
"""
ZSH_PREAMBLE = """# stampede completion for zsh (made by `stampede completion zsh`): the bash function
# through zsh's bashcompinit (which needs compinit loaded first)
(( $+functions[compdef] )) || { autoload -U +X compinit && compinit; }
autoload -U +X bashcompinit && bashcompinit
"""


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "completion", formatter_class=formatter,
        help="Print a completion script for bash or zsh: commands, their flags, job files, "
             "the --set keys.",
        description="Print a shell completion script: the commands, each command's flags and "
                    "their choices, job files (*.toml) for JOB, the job keys after --set.",
        epilog="install:\n  bash: echo 'source <(stampede completion bash)' >> ~/.bashrc\n"
               "  zsh:  echo 'source <(stampede completion zsh)' >> ~/.zshrc")
    sub.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    sub.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(script(args.shell))
    return 0


def script(shell: str) -> str:
    """The completion script for the shell, from every command's parser."""
    from stampede.cli import build_parser
    from stampede.spec import OPTIONS

    commands = next(action for action in build_parser([])._actions
                    if isinstance(action, argparse._SubParsersAction))
    flag_cases, choice_cases = [], []
    for name, sub in commands.choices.items():
        flags, words, job = [], [], 0
        for action in sub._actions:
            flags += action.option_strings
            if action.option_strings and action.choices:
                choice_cases.append(f"        {shlex.quote(f'{name} {action.option_strings[-1]}')}) "
                                    f"COMPREPLY=($(compgen -W {_words(action.choices)} -- "
                                    '"$cur")); return ;;')
            elif action.option_strings and _takes_job(action):   # mttr --job FILE.toml
                choice_cases.append(f"        {shlex.quote(f'{name} {action.option_strings[-1]}')}) "
                                    "_stampede_jobs; return ;;")
            elif _takes_value(action) and not _takes_path(action):   # --trace-limit SIZE
                patterns = "|".join(shlex.quote(f"{name} {flag}") for flag in action.option_strings)
                choice_cases.append(f"        {patterns}) compopt +o default 2>/dev/null; "
                                    "COMPREPLY=(); return ;;")
            elif not action.option_strings and action.choices:
                words += [str(choice) for choice in action.choices]
            elif not action.option_strings and _takes_job(action):
                job = 1
        flag_cases.append(f"        {shlex.quote(name)}) flags={_words(flags)}; "
                          f"words={_words(words)}; job={job} ;;")
    text = (BASH.replace("@COMMANDS@", " ".join(commands.choices))
            .replace("@SET_KEYS@", " ".join(f"{option.key}=" for option in OPTIONS))
            .replace("@CHOICES@", "\n".join(choice_cases))
            .replace("@FLAGS_BY_COMMAND@", "\n".join(flag_cases)))
    return (ZSH_PREAMBLE if shell == "zsh" else "") + text


def _takes_job(action: argparse.Action) -> bool:
    """Whether the argument is a job file, by its help or metavar (import's --job is a name)."""
    return action.metavar == "JOB" or "TOML" in (action.help or "")


def _takes_value(action: argparse.Action) -> bool:
    """A flag followed by a value of its own (not --set's KEY=VALUE, completed apart)."""
    return bool(action.option_strings) and action.nargs != 0 and "--set" not in \
        action.option_strings and not isinstance(action, argparse._HelpAction)


def _takes_path(action: argparse.Action) -> bool:
    """A flag whose value is a path: an output (stampede.commands.outputs), or one whose
    metavar says so (PATH, DIR, FILE...): the shell's file names complete it."""
    from stampede.commands.outputs import Output

    metavar = action.metavar if isinstance(action.metavar, str) else ""
    return isinstance(action, Output) or any(word in metavar.upper()
                                             for word in ("PATH", "DIR", "FILE"))


def _words(items: Iterable[object]) -> str:
    return shlex.quote(" ".join(str(item) for item in items))
