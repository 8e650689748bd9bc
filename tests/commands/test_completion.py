"""`stampede completion`: the bash script sourced in a real bash and asked, as bash asks it
on TAB, for commands, a command's flags and their choices, job files and --set keys."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stampede.commands import COMMANDS


def completions(cwd: Path, *words: str) -> list[str]:
    """What _stampede offers for the command line `words`, the last being the word under
    the cursor."""
    script = (f"source <({shlex.quote(sys.executable)} -m stampede completion bash); "
              f"COMP_WORDS=(stampede {' '.join(shlex.quote(word) for word in words)}); "
              f"COMP_CWORD={len(words)}; _stampede; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return sorted(line for line in done.stdout.splitlines() if line)


def test_commands_flags_choices_and_set_keys_complete(tmp_path: Path) -> None:
    assert completions(tmp_path, "pro") == ["project"]
    assert completions(tmp_path, "") == sorted([*COMMANDS, "--help", "--version"])
    # the new names only: project's old --ranks is read, never offered
    assert completions(tmp_path, "project", "--target-r") == ["--target-ranks",
                                                              "--target-ranks-per-node"]
    assert completions(tmp_path, "project", "--r") == ["--replicas", "--retry-mode", "--rtt-s"]
    assert completions(tmp_path, "slurm", "--ra") == ["--ranks", "--ranks-per-node"]
    assert completions(tmp_path, "report", "--") == sorted(
        ["--help", "--run", "--last", "--html", "--png", "--target-ranks", "--target-mttr",
         "--target-ranks-per-node", "--target-model", "--target-size", "--target-bytes-per-rank"])
    assert completions(tmp_path, "project", "--phase", "") == ["restore", "save"]
    assert completions(tmp_path, "completion", "") == ["bash", "zsh"]
    assert completions(tmp_path, "run", "job.toml", "--set", "checkpoint.si") == [
        "checkpoint.size=", "checkpoint.size_per_rank="]


def test_a_job_argument_completes_job_files_and_directories(tmp_path: Path) -> None:
    for name in ("quick.toml", "results.csv", "notes.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "jobs").mkdir()
    assert completions(tmp_path, "run", "") == ["jobs", "quick.toml"]
    assert completions(tmp_path, "mttr", "--job", "") == ["jobs", "quick.toml"]
    assert completions(tmp_path, "sweep", "--ranks", "1,2", "q") == ["quick.toml"]


def test_a_flag_that_takes_a_value_offers_no_job_files(tmp_path: Path) -> None:
    """After --trace-limit (a size) it once offered the job files; a flag that takes a path
    (an output, --checkpoint PATH) is left to the shell's file names."""
    (tmp_path / "quick.toml").write_text("")
    for words in (("run", "quick.toml", "--trace-limit", ""), ("analyze", "--segments", ""),
                  ("save", "quick.toml", "--scale", "")):
        assert completions(tmp_path, *words) == [], words
    script = subprocess.run([sys.executable, "-m", "stampede", "completion", "bash"],
                            capture_output=True, text=True, timeout=60).stdout
    # an empty answer alone would fall back to file names (complete -o default): switched off
    assert "'run --trace-limit') compopt +o default 2>/dev/null; COMPREPLY=(); return ;;" in script
    for path_flag in ("'analyze --chrome'", "'run --checkpoint'", "'report --png'"):
        assert path_flag not in script, path_flag
    assert completions(tmp_path, "run", "quick.toml", "--trace", "") == ["quick.toml"]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_script_is_valid_shell(shell: str) -> None:
    printed = subprocess.run([sys.executable, "-m", "stampede", "completion", shell],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "complete -o default -F _stampede stampede\n" in printed.stdout
    assert ("autoload -U +X bashcompinit && bashcompinit" in printed.stdout) == (shell == "zsh")
    checked = subprocess.run(["bash", "-n"], input=printed.stdout, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
