"""`project`'s request-rate table (stampede.model.prefix_projection), in the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stampede.present.tables import ItemColumn, item_table
from stampede.units import format_bytes, format_duration, format_number

if TYPE_CHECKING:
    from rich.console import Console

    from stampede.model.prefix_projection import PrefixProjection, Rates


def _needed(item: PrefixProjection) -> str:
    if not item.shows_needed:
        return ""
    if item.needed is None:
        return "none"
    one, more = ("prefix", "prefixes") if item.rates.by_prefix else ("bucket", "buckets")
    return f"{item.needed:,} {one if item.needed == 1 else more}"


def _per_rank(item: PrefixProjection) -> str:
    """A rank's requests per pass (w writes, r reads, l a LIST), then the partition's lone
    ones (+N: list-bcast's LIST, a save's publish and releases' DELETEs)."""
    load = item.load
    every = load.listers >= load.ranks
    parts = [f"{count:,}{kind}" for count, kind in (
        (int(every), "l"), (load.writes_per_rank, "w"), (load.reads_per_rank, "r")) if count]
    parts += [f"+{count:,}{kind}" for count, kind in (
        (0 if every else load.listers, "l"), (load.lone_writes, "w")) if count]
    return " ".join(parts)


def _last(item: PrefixProjection) -> str:
    if item.outcome.fails:
        return "[bold red]fails[/]"
    return format_duration(item.outcome.last_rank_s)


COLUMNS: tuple[ItemColumn[PrefixProjection], ...] = (
    ItemColumn("rates", lambda item: item.rates.name, left=True),
    ItemColumn("layout", lambda item: item.layout, left=True, whole=True),
    ItemColumn("keys", lambda item: item.keys, left=True),
    ItemColumn("ranks/partition", lambda item: f"{item.per_partition:,}"),
    ItemColumn("per rank", _per_rank),
    ItemColumn("asked/s", lambda item: format_number(item.load.ranks / item.load.latency_s)
               if item.load.latency_s > 0 else "-"),
    ItemColumn("503s", lambda item: format_number(item.outcome.throttles)),
    ItemColumn("backoff", lambda item: format_duration(item.outcome.backoff_s)),
    ItemColumn("failed", lambda item: format_number(item.outcome.failed)),
    ItemColumn("last rank", _last),
    ItemColumn("K needed", _needed),
)


def render_prefix_rates(items: Sequence[PrefixProjection], rates: Sequence[Rates],
                        nranks: int, target_s: float, retry: str,
                        bytes_per_rank: float | None, console: Console,
                        phase: str = "restore") -> None:
    """The table, then where each set of rates came from."""
    each = "as archived" if bytes_per_rank is None else format_bytes(bytes_per_rank)
    doing, blocks, spread = ("restoring", "blocks", "copies") if phase == "restore" else \
        ("saving", "parts", "keys")
    console.print(item_table(
        f"object store request rates at {nranks:,} ranks, each {doing} {each} in its "
        f"run's {blocks}: each layout's busiest partition "
        f"per {phase} (503s, backoff summed over its ranks; retries {retry}), and the "
        f"partitions ({spread} round-robin) that {phase} it within "
        f"{format_duration(target_s)} with no request failed", COLUMNS, items))
    for chosen in rates:
        limit = chosen.limit
        ramp = (f", doubling every {format_duration(limit.doubling_s)}"
                if limit.doubling_s != float("inf") else "")
        lists = "LISTs among them" if limit.lists_read else \
            f"{format_number(limit.list_per_s)} LISTs/s"
        writes = f", {format_number(limit.writes_per_s)} writes/s" + (
            f" (burst {format_number(limit.writes_burst)})"
            if limit.writes_burst != limit.burst else "") if phase == "save" else ""
        console.print(f"[dim]{chosen.name}: {format_number(limit.read_per_s)} reads/s{writes} "
                      f"and {lists} per {chosen.partition}, "
                      f"burst {format_number(limit.burst)}{ramp}"
                      f"{f' ({chosen.source})' if chosen.source else ''}[/]")
    round_trip = next((item.load.latency_s for item in items), 0.0)
    console.print("[dim]per rank: a rank's requests per pass, w writes (PUT/POST/DELETE), "
                  "r reads (GET/HEAD), l a LIST; +N: the partition's lone ones (list-bcast's "
                  "LIST; a save's publish, rank 0's, and the released version's DELETEs)[/]")
    console.print(f"[dim]asked/s: the partition's ranks' requests a second unthrottled (each "
                  f"{format_duration(round_trip)}, the median round trip of the archived runs' "
                  f"requests); fails: a request met max_attempts 503s "
                  f"(the {phase} fails, named as throttling); K needed none: not even a "
                  "partition per rank does[/]")
