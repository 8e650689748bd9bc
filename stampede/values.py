"""Parsers of user values: job keys (stampede.spec.OPTIONS) and command flags.

Each parser returns the parsed value or raises ValueError saying what is allowed; the
caller names where the value came from (file and key, or flag) and turns it into one
UsageError. The words that mark a credential are here too, once: a job file is copied
into archives and sidecars, so credentials come from the environment only.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from pathlib import Path

from stampede.errors import UsageError
from stampede.units import SIZE_HELP, format_bytes, parse_size

MAX_SECONDS = 10**7   # ~4 months: beyond it a deadline or delay is a typo, not a wish
JITTER_DISTRIBUTIONS = ("uniform", "exponential")

# Words that name credentials in a storage option's key (AWS_SECRET_ACCESS_KEY, token, ...).
SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "auth")
SECRET_EXCEPTIONS = frozenset({"sse_kms_key_id"})
URL_WITH_PASSWORD = re.compile(r"^[a-zA-Z][\w+.-]*://[^/@\s]*:[^/@\s]*@")
CREDENTIALS_FROM = ("credentials come from the environment (AWS_ACCESS_KEY_ID, "
                    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ...), never from the job file")


def shown(value: object) -> str:
    """A user's value as an error message may echo it: repr, but never a URL's password."""
    if isinstance(value, str) and URL_WITH_PASSWORD.match(value):
        return "'<a URL with a password, not shown>'"
    return repr(value)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (from its st_mode)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_text(path: Path, what: str, limit_bytes: int | None = None) -> str:
    """A user's text file (a job, an archive, a sidecar, a peer tool's output): read_bytes'
    file decoded, or one UsageError naming it and saying what it should have been."""
    try:
        return read_bytes(path, what, limit_bytes).decode()
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text (UTF-8) file, so not {what_article(what)}") from None


def read_bytes(path: Path, what: str, limit_bytes: int | None = None) -> bytes:
    """A file stampede reads whole, or one UsageError naming it and saying what it should
    have been. Looked at before it is read: a FIFO would hang the read, a device
    (/dev/zero) never end it, a directory is nothing to read, so only a regular file is
    read; `limit_bytes` bounds what a reader of a peer's output takes in (a file that grows
    while it is read included)."""
    try:   # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise UsageError(f"{path}: cannot read the {what} ({error.strerror})") from None
    status = os.fstat(descriptor)           # the file opened, not the name: no race
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        raise UsageError(f"{path}: is {file_kind(status.st_mode)}, not a regular file, so "
                         f"not {what_article(what)}")
    too_large = UsageError(f"{path}: more than {format_bytes(limit_bytes or 0)}, larger than "
                           f"any {what} stampede reads")
    with os.fdopen(descriptor, "rb") as stream:
        if limit_bytes is not None and status.st_size > limit_bytes:
            raise too_large
        try:
            data = stream.read(-1 if limit_bytes is None else limit_bytes + 1)
        except OSError as error:
            raise UsageError(f"{path}: cannot read the {what} ({error.strerror})") from None
    if limit_bytes is not None and len(data) > limit_bytes:
        raise too_large
    return data


def _identity(path: Path) -> tuple[int, int, str]:
    """What a path is, however it is spelled (relative, through a link, a hard link): its
    device and inode; for one that does not exist yet, its directory's and its name."""
    try:
        status = os.stat(path)
        return status.st_dev, status.st_ino, ""
    except OSError:
        parent = os.stat(path.absolute().parent) if path.absolute().parent.exists() else None
        return (parent.st_dev, parent.st_ino, path.name) if parent else (-1, -1, str(path.absolute()))


# What an output flag names (stampede.commands.outputs declares each flag with one): a file
# written whole (replaced if it exists; its directory must exist), an archive appended to
# (it may exist; its directories are made), a directory written into (made if missing).
OUTPUT_FILE, OUTPUT_ARCHIVE, OUTPUT_DIRECTORY = "file", "archive", "directory"
OUTPUT_KINDS = (OUTPUT_FILE, OUTPUT_ARCHIVE, OUTPUT_DIRECTORY)
# Where an archive's runs keep their sidecars and traces (ARCHIVE_STEM.runs/: results.archive's
# sidecar_dir) and a trace's name (results.trace.trace_path): stampede's own, never an output.
SIDECARS_SUFFIX = ".runs"
TRACE_SUFFIX = ".trace.npz"


def refuse_overwrite(flag: str, output: str | Path, inputs: Mapping[str, Path | None],
                     kind: str = OUTPUT_FILE) -> None:
    """The one check of a path stampede is asked to write (`kind`: OUTPUT_KINDS), before
    any work, so that a result is never lost after it was measured, and nothing stampede
    reads is written over. A UsageError, one line, when the path
    - is one of the command's inputs (`inputs`: what each is, in words -> its path), compared
      by what the paths are, not how they are spelled (relative, a link, a hard link), or
      lies inside one that is a directory;
    - is a trace's name (*.trace.npz) or lies inside an archive's ARCHIVE.runs/ (its
      sidecars and traces): stampede writes those itself, beside their run;
    - is a symbolic link (writing would land wherever it points);
    - names a directory where a file is written (".", "./", "x/", an existing directory),
      a file where a directory is, or anything not a regular file (a FIFO would block the
      write, /dev/full fail it, /dev/null lose it);
    - cannot be written: its directory missing (a file's; an archive's or a directory's
      are made), not a directory, or refusing a new file (read-only, /proc): tried with a
      file created and removed there, which a read-only mount or /proc refuses even to root."""
    text = os.fspath(output)
    output = Path(text)
    if not text or (text.endswith(os.sep) and kind != OUTPUT_DIRECTORY):
        raise UsageError(f"{flag} {text!r}: names a directory, not a file: give {flag} a "
                         "file's name")
    _refuse_inputs(flag, output, inputs)
    if output.name.endswith(TRACE_SUFFIX):
        raise UsageError(f"{flag} {output}: is a trace's name (*{TRACE_SUFFIX}): traces are "
                         "stampede's own, written beside their run; give another name")
    for place in dict.fromkeys((output.absolute(), Path(os.path.realpath(output)))):
        runs = next((p for p in (place, *place.parents) if p.name.endswith(SIDECARS_SUFFIX)),
                    None)
        if runs is not None:
            raise UsageError(f"{flag} {output}: lies inside {runs}, where an archive's runs "
                             "keep their sidecars and traces; give a path outside it")
    if output.is_symlink():
        raise UsageError(f"{flag} {output}: is a symbolic link (to {os.readlink(output)}); "
                         "stampede does not write through a link: give the path itself")
    try:
        status: os.stat_result | None = os.stat(output)
    except FileNotFoundError:
        status = None
    except OSError as error:
        raise UsageError(f"{flag} {output}: cannot look at it ({error.strerror})") from None
    if status is not None:
        _refuse_existing(flag, output, status.st_mode, kind)
        return
    directory = output.absolute().parent
    if kind != OUTPUT_FILE:   # made with its parents: the nearest that exists must take it
        directory = next(p for p in output.absolute().parents if p.exists())
    if not directory.is_dir():
        missing = "does not exist" if not directory.exists() else "is not a directory"
        raise UsageError(f"{flag} {output}: its directory {directory} {missing}")
    _try_creating_in(flag, output, directory)


def _refuse_inputs(flag: str, output: Path, inputs: Mapping[str, Path | None]) -> None:
    mine = _identity(output)
    above = set()
    for parent in output.absolute().parents:
        with contextlib.suppress(OSError):
            status = os.stat(parent)
            above.add((status.st_dev, status.st_ino, ""))
    for what, path in inputs.items():
        if path is None:
            continue
        if _identity(path) == mine:
            raise UsageError(f"{flag} {output}: is the {what} ({path}); writing there would "
                             f"replace it: give {flag} another name")
        inside = Path(os.path.realpath(path)) in Path(os.path.realpath(output)).parents
        if inside or (path.is_dir() and _identity(path) in above):
            raise UsageError(f"{flag} {output}: lies inside the {what} ({path}): give {flag} "
                             "a path outside it")


def _refuse_existing(flag: str, output: Path, mode: int, kind: str) -> None:
    """An output that exists: a directory to write into, or a regular file we may open to
    write (opened, nothing written: root's access() says yes where /proc says no)."""
    if kind == OUTPUT_DIRECTORY:
        if not stat.S_ISDIR(mode):
            what = "a file" if stat.S_ISREG(mode) else file_kind(mode)
            raise UsageError(f"{flag} {output}: is {what}, not a directory")
        _try_creating_in(flag, output, output)
        return
    if stat.S_ISDIR(mode):
        raise UsageError(f"{flag} {output}: is a directory; give {flag} a file's name")
    if not stat.S_ISREG(mode):
        raise UsageError(f"{flag} {output}: is {file_kind(mode)}, not a regular file "
                         "stampede can write")
    try:
        os.close(os.open(output, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as error:
        raise UsageError(f"{flag} {output}: cannot write it ({error.strerror})") from None


def _try_creating_in(flag: str, output: Path, directory: Path) -> None:
    """A file created in `directory` and removed at once: what writing there will do."""
    probe = directory / f".stampede-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except OSError as error:
        raise UsageError(f"{flag} {output}: cannot write in {directory} ({error.strerror})"
                         ) from None
    with contextlib.suppress(OSError):
        probe.unlink()


def what_article(what: str) -> str:
    return f"an {what}" if what[:1] in "aeiou" else f"a {what}"


def did_you_mean(value: object, candidates: Iterable[str]) -> str:
    import difflib  # only a mistyped value needs it; every rank imports this module

    close = difflib.get_close_matches(str(value), list(candidates), n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


def size(value: object) -> int:
    try:
        return parse_size(value)
    except ValueError:
        raise ValueError(f"must be {SIZE_HELP}") from None


def positive_size(value: object) -> int:
    parsed = size(value)
    if parsed <= 0:
        raise ValueError("must be a size greater than zero")
    return parsed


def optional_size(value: object) -> int | None:
    """A positive size, or "" for none."""
    return None if value == "" else positive_size(value)


def whole_number(low: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"must be a whole number >= {low}")
        return value
    return parse


def seconds(value: object) -> float:
    """A positive duration in seconds, at most MAX_SECONDS."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 < value <= MAX_SECONDS:
        raise ValueError(f"must be a number of seconds > 0 and <= {MAX_SECONDS:g}")
    return float(value)


def fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError("must be a number from 0 up to (not including) 1")
    return float(value)


def number_at_least(low: float, strictly: bool = False) -> Callable[[object], float]:
    """A finite number >= low (> low when strictly): for command flags such as --gpus."""
    def parse(value: object) -> float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError("must be a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value < low or (strictly and value == low):
            raise ValueError(f"must be a finite number {'>' if strictly else '>='} {low:g}")
        return float(value)
    return parse


def nonempty_text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def optional_path(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a path (a string), or empty")
    return value


def target_path(value: object) -> str:
    path = nonempty_text(value)
    if URL_WITH_PASSWORD.match(path):
        raise ValueError(f"holds a password in a URL (user:password@): {CREDENTIALS_FROM}")
    return path


def scale(value: object) -> Fraction:
    """A factor in (0, 1]: a number or a fraction written "1/1024" (kept exact)."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        factor = Fraction(value.strip() if isinstance(value, str) else value).limit_denominator(
            2**40)
    except (ValueError, ZeroDivisionError, OverflowError):  # inf: no fraction
        raise ValueError('must be a factor above 0 and at most 1, e.g. "1/1024" or 0.01') from None
    if not 0 < factor <= 1:
        raise ValueError('must be a factor above 0 and at most 1, e.g. "1/1024" or 0.01')
    return factor


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def choice(allowed: tuple[str, ...]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}{did_you_mean(value, allowed)}")
        return str(value)
    return parse


def choice_list(allowed: tuple[str, ...], unique: bool) -> Callable[[object], tuple[str, ...]]:
    """A list of allowed words; a plain string is one word, or comma-separated words."""
    choose = choice(allowed)

    def parse(value: object) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not items:
            raise ValueError(f"must be one or a list of {', '.join(allowed)}")
        words = tuple(choose(item.strip() if isinstance(item, str) else item) for item in items)
        if unique and len(set(words)) != len(words):
            raise ValueError("must not name the same entry twice")
        return words
    return parse


def jitter(value: object) -> str:
    """'none', or DISTRIBUTION:SECONDS (uniform: delays in [0, s); exponential: mean s)."""
    allowed = "none, uniform:SECONDS or exponential:SECONDS (e.g. uniform:0.5)"
    if value == "none":
        return "none"
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"must be {allowed}")
    distribution, _, text = value.partition(":")
    if distribution not in JITTER_DISTRIBUTIONS:
        raise ValueError(f"must be {allowed}{did_you_mean(distribution, JITTER_DISTRIBUTIONS)}")
    try:
        if not 0 < float(text) <= MAX_SECONDS:
            raise ValueError
    except ValueError:
        raise ValueError(f"must be {allowed}, with 0 < seconds <= {MAX_SECONDS:g}") from None
    return f"{distribution}:{float(text):g}"


def stripe_count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError("must be a whole number: 0 = the file system's default, -1 = every "
                         "OST, N = N OSTs")
    return value


# Lustre's smallest stripe (LOV_MIN_STRIPE_SIZE) and CephFS's smallest stripe unit
# (CEPH_MIN_STRIPE_UNIT): both file systems refuse a stripe size that is not a multiple.
STRIPE_SIZE_UNIT = 64 * 1024


def stripe_size(value: object) -> int | None:
    """target.stripe_size: "" (the file system's default), or a multiple of 64 KiB."""
    size = optional_size(value)
    if size is not None and size % STRIPE_SIZE_UNIT:
        raise ValueError(f"must be a multiple of 64 KiB (Lustre and CephFS stripe in 64 KiB "
                         f"units), not {size} bytes")
    return size


def looks_like_credential(key: str) -> bool:
    lowered = key.lower()
    return lowered not in SECRET_EXCEPTIONS and any(word in lowered for word in SECRET_WORDS)


def credential_in(table: Mapping[str, object], where: str = "") -> str:
    """What names or holds a credential in a table, at any depth ("" if nothing): a key
    that looks like one ("secret looks like a credential"), or a URL with a password in it
    ("endpoint_url holds a password in a URL (user:password@)"). The value is never shown."""
    for key, item in table.items():
        if looks_like_credential(str(key)):
            return f"{where}{key} looks like a credential"
        if isinstance(item, str) and URL_WITH_PASSWORD.match(item):
            return f"{where}{key} holds a password in a URL (user:password@)"
        if isinstance(item, Mapping):
            found = credential_in(item, f"{where}{key}.")
            if found:
                return found
    return ""


def storage_options(value: object) -> dict[str, object]:
    """fsspec storage options (endpoint, timeouts, ...): a table, no credentials in it."""
    if not isinstance(value, dict):
        raise ValueError("must be a table, e.g. {client_kwargs = {endpoint_url = "
                         '"http://127.0.0.1:8333"}}')
    found = credential_in(value)
    if found:
        raise ValueError(f"{found}: {CREDENTIALS_FROM}")

    def check(table: dict[str, object], where: str) -> None:
        for key, item in table.items():
            if isinstance(item, dict):
                check(item, f"{where}{key}.")
            elif not isinstance(item, str | int | float | bool):
                raise ValueError(f"{where}{key} must be a string, number, boolean or table")
    check(value, "")
    return dict(value)
