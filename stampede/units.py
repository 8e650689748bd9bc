"""Sizes and durations: parsing user text and printing values with their units.

GB is 10^9 bytes and GiB is 2^30 bytes, everywhere; bandwidth is always GB/s (decimal).
"""

import math
import re

# Unit conversions, named: 1e9 is both ns per s and bytes per GB, so neither is written
# bare outside the tables of this module.
NS_PER_S = 10**9
NS_PER_MS = 10**6
NS_PER_US = 10**3
US_PER_S = 10**6
MS_PER_S = 10**3
BYTES_PER_GB = 10**9      # GB, GB/s: decimal, everywhere
BYTES_PER_KIB = 2**10
BYTES_PER_MIB = 2**20
BYTES_PER_GIB = 2**30

_SIZE_FACTORS = {
    "": 1,
    "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
    "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "p": 10**15, "pb": 10**15, "e": 10**18, "eb": 10**18,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50, "eib": 2**60,
}   # every unit format_bytes prints is read back
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

# The alignment of every read and write buffer, offset and length under O_DIRECT (the
# logical block size; 4 KiB covers every Linux file system in practice), and where the
# data of a formatted file stampede writes starts.
ALIGN_BYTES = 4096

SIZE_HELP = "a byte count or a size with a unit: 4096, 4MiB, 1.5GiB, 2GB (GB = 10^9, GiB = 2^30)"


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as '4MiB'. Raises ValueError naming the value."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a size")
    match = _SIZE_RE.match(value)
    if not match or match.group(2).lower() not in _SIZE_FACTORS:
        raise ValueError(f"{value!r} is not a size")
    number, unit = match.groups()
    size = float(number) * _SIZE_FACTORS[unit.lower()]
    if size != int(size):
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(size)


_DURATION_FACTORS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(value: str) -> float:
    """Seconds from '600', '90s', '10min', '1.5h'. Raises ValueError naming the value."""
    match = _SIZE_RE.match(value)
    if not match or match.group(2).lower() not in _DURATION_FACTORS or float(match.group(1)) <= 0:
        raise ValueError(f"{value!r} is not a duration > 0 (e.g. 600, 90s, 10min, 1h)")
    return float(match.group(1)) * _DURATION_FACTORS[match.group(2).lower()]


def format_bytes(nbytes: float) -> str:
    """Binary units for sizes of files and blocks (what users type in job files)."""
    for unit, factor in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                         ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= factor:
            value = nbytes / factor
            # past 9,999 EiB (every rank of a billion reading everything) never e-notation
            return f"{value:.4g} {unit}" if abs(value) < 10_000 else f"{value:,.0f} {unit}"
    if 0 < abs(nbytes) < 1:   # a size split over more ranks than it has bytes: not "0 B"
        return "under 1 B" if abs(nbytes) < 0.01 else f"{nbytes:.2f} B"
    return f"{nbytes:.0f} B"


def format_seconds(seconds: float) -> str:
    """A duration with a unit chosen so that 2 µs and 20 s both stay readable."""
    if seconds != seconds:  # NaN: no sample
        return "-"
    unit, factor = seconds_unit(seconds)
    return f"{format_in(seconds, factor)} {unit}"


def format_duration(seconds: float) -> str:
    """A duration a person reads (a recovery, a budget): minutes from 2 min, hours from
    2 h, else format_seconds; never scientific notation."""
    if seconds != seconds:
        return "-"
    if math.isinf(seconds):
        return "never"
    for unit, factor in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(seconds) >= 2 * factor:
            value = seconds / factor
            return f"{value:,.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}"
    return format_seconds(seconds)


def format_rate(value: float, unit: str) -> str:
    """A rate with an SI prefix, three digits: 8.2 TB/s, 3.4 GB/s, 120 kops/s."""
    if value != value:
        return "-"
    if math.isinf(value):
        return "unlimited"
    for prefix, factor in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{format_plain(value)} {unit}"


def seconds_unit(seconds: float) -> tuple[str, float]:
    """The unit (s, ms, µs, ns) in which `seconds` reads best, and its factor."""
    magnitude = abs(seconds) if seconds == seconds else 1.0
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if magnitude >= factor:
            return unit, factor
    return "ns", 1e-9


def format_in(seconds: float, factor: float) -> str:
    """A duration (or a rate) as a bare number of three significant digits in a unit chosen
    elsewhere (a table row's unit, GB/s), never in e-notation."""
    if seconds != seconds:
        return "-"
    value = seconds / factor
    text = f"{value:.3g}"
    return f"{value:.0f}" if abs(value) >= 1000 or "e" in text else text   # 999.96: "1000"


def format_plain(value: float) -> str:
    """A count or a quantity a person reads, never in e-notation: 8,000,000,000 GPUs,
    0.001, 1.17; below 0.001 "under 0.001"."""
    if value != value:
        return "-"
    if math.isinf(value):
        return "unlimited" if value > 0 else "-unlimited"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if value == 0 or abs(value) >= 0.001:
        return f"{value:.4g}"
    return "under 0.001" if value > 0 else "above -0.001"


ALREADY_MET = "already met"
MET_BELOW = 0.01   # a need under 1% of what the storage showed: met, not a tiny multiple


def format_times(ratio: float, sign: str = "×") -> str:
    """What a target needs over what the storage showed, as a person reads it: "12.9×",
    "0.41×", "1,200×"; "already met" below MET_BELOW (never 3.36e-05×); "" where there
    is no ratio (nothing measured, or no limit reached)."""
    if not (ratio > 0 and math.isfinite(ratio)):
        return ""
    if ratio < MET_BELOW:
        return ALREADY_MET
    return f"{ratio:.3g}{sign}" if ratio < 1000 else f"{ratio:,.0f}{sign}"


def format_amplification(ratio: float) -> str:
    """Bytes read over bytes needed, as a person reads it: "8.0x", "1.0x", "0.50x" (a
    broadcast's member reads none of its own), "2,048x"; "-" where nothing was measured."""
    if not (ratio >= 0 and math.isfinite(ratio)):
        return "-"
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    return f"{ratio:.1f}x" if ratio >= 1 or ratio == 0 else f"{ratio:.2g}x"


def format_probability(probability: float) -> str:
    """A probability: 0.0123, or "1 in 1,234,567" when smaller than 0.001 (never 1e-12)."""
    if probability != probability:
        return "-"
    if probability >= 0.001:
        return f"{probability:.3g}"
    if probability < 1e-15:   # 0 included: underflow, not certainty
        return "under 1 in 10^15"
    return f"1 in {1 / probability:,.0f}"


def format_percent(fraction: float) -> str:
    """A fraction as a percentage a person reads: 2%, 0.5%, "under 0.01%" (never 1e-30%)."""
    if fraction != fraction:
        return "-"
    percent = fraction * 100
    if 0 < abs(percent) < 0.01:
        return "under 0.01%"
    return f"{percent:.3g}%" if abs(percent) < 1000 else f"{percent:,.0f}%"


def format_number(value: float) -> str:
    """Three significant digits with k/M for thousands/millions; '-' when there is none."""
    if value != value:
        return "-"
    for suffix, factor in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"
