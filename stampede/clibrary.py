"""A C client library through ctypes (libcephfs for stampede.libcephfs, libnfs for
stampede.backends.libnfs), loaded as each binding loads it: the first of its names that
loads, every function of its prototype table bound (restype, argtypes); a library that is
missing, or lacks a function of the table (too old or too new for the binding), refused
in one UsageError with its install hint, before any I/O."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

from stampede.errors import UsageError

# function name -> (its restype, its argtypes): the binding's C signatures, as ctypes says them
Prototypes = dict[str, tuple[object, list[object]]]


def load(names: Iterable[str], prototypes: Prototypes, missing: str, versions: str,
         hint: str) -> ctypes.CDLL:
    """The first of `names` loaded (errno kept for each call), its prototypes bound.
    `missing`: what is said when none loads; `versions`: the library's versions the
    binding takes, said when a function is absent."""
    for name in names:
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            break
        except OSError:
            continue
    else:
        raise UsageError(missing, hint=hint)
    try:
        for function_name, (restype, argtypes) in prototypes.items():
            function = getattr(lib, function_name)
            function.restype, function.argtypes = restype, argtypes
    except AttributeError as error:
        raise UsageError(f"the {name.rsplit('/', 1)[-1]} found lacks {error.name or error}: too old or "
                         f"too new for stampede's binding ({versions})", hint=hint) from None
    return lib

