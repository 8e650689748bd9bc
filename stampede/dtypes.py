"""Element types, in one table: those stampede writes, and the names it meets in the
checkpoints of other tools.

Names follow safetensors (F16, BF16, F32, I64, ...): catalogued tensors of every format
carry them (stampede.existing), DCP's torch dtypes are translated to them, and the dtypes
a synthetic checkpoint can hold (`checkpoint.dtype`) map to them.
"""

from __future__ import annotations

from typing import NamedTuple


class DType(NamedTuple):
    """A dtype stampede writes: `checkpoint.dtype`."""

    safetensors: str       # its name in a safetensors header
    itemsize: int
    exponent_mask: int     # all exponent bits: set together = Inf or NaN
    hdf5: str              # numpy's type string for h5py ("" where HDF5 has none)


WRITTEN = {
    "float16": DType("F16", 2, 0x7C00, "<f2"),
    "bfloat16": DType("BF16", 2, 0x7F80, ""),
    "float32": DType("F32", 4, 0x7F800000, "<f4"),
}
# safetensors name -> the written dtype of that name (what check_finite can check)
FLOATS = {kind.safetensors: name for name, kind in WRITTEN.items()}

# Bytes per element by safetensors name; an unknown or sub-byte dtype is sliced on byte
# boundaries (itemsize 1).
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "C32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
    "C128": 16,
}
# torch dtype names (as DCP's metadata carries them) -> safetensors names
FROM_TORCH = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "int16": "I16", "uint16": "U16",
    "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32",
    "int64": "I64", "uint64": "U64", "float64": "F64", "complex64": "C64",
    "complex128": "C128",
}


def itemsize(name: str) -> int:
    """Bytes per element of a safetensors dtype name; 1 when unknown or sub-byte."""
    return ITEMSIZE.get(name, 1)


def from_numpy(dtype: object) -> str:
    """A numpy dtype's safetensors name (F32, I64, BOOL, ...), else numpy's own string."""
    kind, size_bytes = getattr(dtype, "kind", ""), int(getattr(dtype, "itemsize", 0))
    names = {"f": f"F{size_bytes * 8}", "i": f"I{size_bytes * 8}", "u": f"U{size_bytes * 8}",
             "c": f"C{size_bytes * 8}", "b": "BOOL"}
    name = names.get(kind, "")
    return name if name in ITEMSIZE else str(getattr(dtype, "str", dtype))
