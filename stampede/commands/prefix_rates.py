"""`project`'s object-store flags (--preset, --prefix-rate, --prefix-burst, --target-mttr,
--retry-mode, --max-attempts): checked before the archive is read, and the request-rate
table (stampede.model.prefix_projection) they ask for. Glue only."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from stampede.errors import UsageError
from stampede.targets import RATE_PRESETS

if TYPE_CHECKING:
    from stampede.model.prefix_projection import Rates
    from stampede.results.archived import Archive

DEFAULT_TARGET_MTTR = "60s"
DEFAULT_BURST = 10.0          # emulate-s3's default --burst: what a fit assumes unless told
RETRY_MODES = ("standard", "adaptive")   # stampede.backends.s3retry.MODES
PREFIX_RATE_KEYS = ("read", "list", "write", "burst")
FIT_ATTEMPTS = 1_000          # a fit's clients never give up: the valid runs' did not


def add_prefix_rate_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--preset", default="", metavar="STORES",
                     help="object stores whose documented request rates the restore (or save) is "
                          "projected "
                          f"against, comma-separated: {', '.join(RATE_PRESETS)} (per prefix, per "
                          "directory bucket, per bucket ramping; sources in the object-stores "
                          "guide); prints the request-rate table")
    sub.add_argument("--prefix-rate", default="", metavar="RATES",
                     help="your store's rates per partition, e.g. "
                          "read=5500,list=5500,write=3500,burst=5500 (LIST and write as read, "
                          "burst one second of reads unless given); prints the "
                          "request-rate table. Without it or --preset the table shows only when "
                          "archived runs met 503s: their rate is fitted")
    sub.add_argument("--prefix-burst", type=float, default=DEFAULT_BURST, metavar="B",
                     help="the burst a fitted rate assumes (default: emulate-s3's, "
                          f"{DEFAULT_BURST:g} requests)")
    sub.add_argument("--target-mttr", default=DEFAULT_TARGET_MTTR, metavar="DURATION",
                     help="the restore (or save) time the request-rate table's K needed aims at "
                          f"(default {DEFAULT_TARGET_MTTR})")
    sub.add_argument("--retry-mode", choices=RETRY_MODES, default="standard",
                     help="the clients' retry mode in the request-rate table (default standard)")
    sub.add_argument("--max-attempts", type=int, default=3, metavar="N",
                     help="the clients' attempts per request in the request-rate table "
                          "(default 3, AWS's)")


class Asked(NamedTuple):
    """The flags, checked."""

    presets: tuple[str, ...]
    given: dict[str, float] | None
    burst: float
    target_s: float
    retry_mode: str
    max_attempts: int


def prefix_rate_flags(args: argparse.Namespace) -> Asked:
    """The flags checked (UsageError, exit 2, before any I/O)."""
    from stampede.units import parse_duration
    from stampede.values import did_you_mean

    presets = tuple(name.strip() for name in args.preset.split(",") if name.strip())
    for name in presets:
        if name not in RATE_PRESETS:
            raise UsageError(f"--preset {args.preset!r}: {name!r} is not a preset (one of "
                             f"{', '.join(RATE_PRESETS)}){did_you_mean(name, tuple(RATE_PRESETS))}")
    try:
        target_s = parse_duration(args.target_mttr)
    except ValueError as error:
        raise UsageError(f"--target-mttr: {error}") from None
    if not (target_s > 0 and math.isfinite(target_s)):
        raise UsageError(f"--target-mttr {args.target_mttr}: must be a duration above 0")
    if not (args.prefix_burst >= 1 and math.isfinite(args.prefix_burst)):
        raise UsageError(f"--prefix-burst {args.prefix_burst:g}: must be a number >= 1")
    if args.max_attempts < 1:
        raise UsageError(f"--max-attempts {args.max_attempts}: must be at least 1")
    given = _prefix_rate(args.prefix_rate) if args.prefix_rate.strip() else None
    return Asked(presets, given, args.prefix_burst, target_s, args.retry_mode,
                 args.max_attempts)


def _prefix_rate(text: str) -> dict[str, float]:
    """read=R[,list=R][,write=R][,burst=B]: numbers above 0 (burst at least 1); read
    required."""
    found: dict[str, float] = {}
    allowed = f"KEY=NUMBER pairs, keys {', '.join(PREFIX_RATE_KEYS)} (read required), " \
              "e.g. read=5500,list=5500,write=3500"
    for part in (item.strip() for item in text.split(",")):
        key, sep, value = part.partition("=")
        key = key.strip()
        try:
            number = float(value) if sep else math.nan
        except ValueError:
            number = math.nan
        if key not in PREFIX_RATE_KEYS or key in found or not math.isfinite(number) \
                or number <= 0 or (key == "burst" and number < 1):
            raise UsageError(f"--prefix-rate {text!r}: {part!r} is not valid: {allowed}")
        found[key] = number
    if "read" not in found:
        raise UsageError(f"--prefix-rate {text!r}: no read rate: {allowed}")
    return found


def prefix_rate_table(asked: Asked, archive: Archive, nranks: int,
                      bytes_per_rank: float | None, layouts: tuple[str, ...] = (),
                      phase: str = "restore") -> bool:
    """The table, when asked for or when the archive's runs met 503s; whether it showed.
    `bytes_per_rank`: the workload's at the target (None: each run's own); `layouts`:
    only these (--layout; none: every one archived); `phase`: the restore's or the save's
    (--phase) runs."""
    from stampede.backends.s3retry import RetryPolicy
    from stampede.model.prefix_projection import (
        Rates,
        fitted_rates,
        preset_rates,
        project_prefixes,
    )
    from stampede.model.prefix_rate import Limit, RunLoad, run_loads
    from stampede.present.report import make_console
    from stampede.present.report_prefix_rate import render_prefix_rates

    runs = [run for run in run_loads(archive.rows, phase)
            if not layouts or run.layout in layouts]
    if not runs:
        if asked.presets or asked.given:
            raise UsageError(f"--preset/--prefix-rate: the archives hold no valid {phase} run "
                             "to take each rank's requests from")
        return False

    def policy() -> RetryPolicy:
        return RetryPolicy(asked.retry_mode, asked.max_attempts)

    def fitting(run: RunLoad) -> Callable[[], RetryPolicy]:
        """The run's clients' retry mode (its sidecar's); never giving up: the runs
        fitted were valid, none ran out of attempts."""
        mode = _retry_mode(archive, run.run_id)
        return lambda: RetryPolicy(mode, FIT_ATTEMPTS)

    rates: list[Rates] = []
    fitted = fitted_rates(runs, asked.burst, fitting)
    if fitted is not None:
        rates.append(fitted)
    if asked.given:
        read = asked.given["read"]
        rates.append(Rates("--prefix-rate", Limit(read, asked.given.get("list", read),
                                                  asked.given.get("burst", read),
                                                  write_per_s=asked.given.get("write")),
                           "prefix"))
    rates += [preset_rates(RATE_PRESETS[name]) for name in asked.presets]
    if not rates:
        return False
    items = project_prefixes(runs, rates, nranks, asked.target_s, policy, bytes_per_rank)
    render_prefix_rates(items, rates, nranks, asked.target_s,
                        f"{asked.retry_mode}, {asked.max_attempts} attempts", bytes_per_rank,
                        make_console(), phase)
    return True


def _retry_mode(archive: Archive, run_id: str) -> str:
    """The retry mode a run's S3 clients had (its sidecar's storage.retry), standard
    where the sidecar does not say."""
    document = (archive.sidecar(run_id).value or {}) if run_id else {}
    storage = document.get("storage")
    retry = storage.get("retry") if isinstance(storage, dict) else None
    mode = retry.get("mode") if isinstance(retry, dict) else None
    return mode if mode in RETRY_MODES else "standard"
