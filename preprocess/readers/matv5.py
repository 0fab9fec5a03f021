"""A bounded reader for the numeric matrices of MATLAB level-5 (v5, v6, v7) .mat files.

scipy's v5 parser is C code that trusts the file: a damaged or hostile file can crash the process
(a segmentation fault found by fuzzing) or make it allocate what a header claims. This reader parses
only what the converter needs (the names, shapes and classes of top-level variables, and the data of
one numeric matrix), checks every length against the bytes that hold it before allocating, and caps
decompression at the size the matrix declares. Layout: "MAT-File Format", MathWorks, section 1.

Each top-level element is an ``miMATRIX`` or an ``miCOMPRESSED`` (zlib) wrapping one. A matrix holds
sub-elements: array flags (class, complex / logical bits), dimensions, name, real part, imaginary part.
Numeric data may be stored in a smaller type than its class (MATLAB saves whole-number doubles as
int8 or uint8); it is converted to the class's type.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hsgds.errors import InputError
from hsgds.preprocess.readers.base import check_fits_in_memory

__all__ = ["Variable", "list_variables", "load_variable"]

MI_INT8, MI_INT32, MI_UINT32, MI_MATRIX, MI_COMPRESSED, MI_UTF8 = 1, 5, 6, 14, 15, 16
#: storage types of numeric data (miINT8 ... miUINT64)
_MI_DTYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
#: numeric classes: mx class id -> (MATLAB class name, numpy dtype)
_MX_NUMERIC = {6: ("double", "float64"), 7: ("single", "float32"), 8: ("int8", "int8"), 9: ("uint8", "uint8"),
               10: ("int16", "int16"), 11: ("uint16", "uint16"), 12: ("int32", "int32"),
               13: ("uint32", "uint32"), 14: ("int64", "int64"), 15: ("uint64", "uint64")}
_MX_OTHER = {1: "cell", 2: "struct", 3: "object", 4: "char", 5: "sparse", 16: "function", 17: "opaque"}
_FLAG_COMPLEX, _FLAG_LOGICAL = 0x08, 0x02
#: the matrix header (flags, dimensions, name) is small; more than this is a damaged file
_MAX_HEADER = 1 << 16
_MAX_DIMS = 32
#: deflate cannot expand more than about 1032:1
_DEFLATE_MAX_RATIO = 1032
_FIX = "the file is damaged; re-save it with MATLAB"


@dataclass(frozen=True)
class Variable:
    """A top-level variable: where it is and what its header says (nothing of its data is read)."""

    name: str
    shape: tuple[int, ...]
    cls: str  # MATLAB class: "double", "uint16", "logical", "cell", ...
    complex: bool
    offset: int  # file offset of the element's tag
    nbytes: int  # bytes of the element after its tag
    compressed: bool

    @property
    def numeric(self) -> bool:
        return self.cls in {name for name, _ in _MX_NUMERIC.values()} | {"logical"}


def _u32(buf: bytes | memoryview, at: int, endian: str) -> int:
    return int.from_bytes(buf[at:at + 4], "little" if endian == "<" else "big")


class _Cursor:
    """Reads tagged elements from a buffer, refusing any length that runs past its end."""

    def __init__(self, data: bytes | memoryview, endian: str, where: str, pos: int = 0) -> None:
        self.data, self.pos, self.endian, self.where = memoryview(data), pos, endian, where

    def tag(self) -> tuple[int, memoryview]:
        """One element: (data type, payload), advancing past its padding."""
        if self.pos + 8 > len(self.data):
            raise InputError(f"{self.where}: an element runs past the end of its data; {_FIX}")
        first = _u32(self.data, self.pos, self.endian)
        if first >> 16:  # small data element: type and byte count packed in 4 bytes, data in the next 4
            mdtype, nbytes = first & 0xFFFF, first >> 16
            if nbytes > 4:
                raise InputError(f"{self.where}: a small data element claims {nbytes} bytes; {_FIX}")
            payload = self.data[self.pos + 4:self.pos + 4 + nbytes]
            self.pos += 8
            return mdtype, payload
        mdtype, nbytes = first, _u32(self.data, self.pos + 4, self.endian)
        start = self.pos + 8
        if nbytes > len(self.data) - start:
            raise InputError(f"{self.where}: an element of {nbytes} bytes runs past the end of its data "
                             f"({len(self.data) - start} left); {_FIX}")
        self.pos = start + nbytes + (-nbytes % 8)
        return mdtype, self.data[start:start + nbytes]


def _endian(path: Path, head: bytes) -> str:
    if len(head) < 128:
        raise InputError(f"{path} is too short for a MATLAB v5 file ({len(head)} bytes); {_FIX}")
    marker = bytes(head[126:128])
    if marker == b"IM":
        return "<"
    if marker == b"MI":
        return ">"
    raise InputError(f"{path} has no MATLAB v5 endian marker (bytes 126-127 are {marker!r}); {_FIX}")


def _matrix_header(cur: _Cursor) -> tuple[str, tuple[int, ...], str, bool]:
    """Parse flags, dimensions and name from a matrix's sub-elements: (name, shape, class, complex)."""
    mdtype, flags = cur.tag()
    if mdtype != MI_UINT32 or len(flags) != 8:
        raise InputError(f"{cur.where}: a matrix does not start with its array flags; {_FIX}")
    word = _u32(flags, 0, cur.endian)
    mx, bits = word & 0xFF, (word >> 8) & 0xFF
    if mx in _MX_NUMERIC:
        cls = "logical" if bits & _FLAG_LOGICAL else _MX_NUMERIC[mx][0]
    elif mx in _MX_OTHER:
        cls = _MX_OTHER[mx]
    else:
        raise InputError(f"{cur.where}: unknown MATLAB array class {mx}; {_FIX}")
    mdtype, dims = cur.tag()
    # some writers store the dimensions as miUINT32 (read as int32 all the same: a set top bit is refused below)
    # and the name as miUTF8; scipy and MATLAB read both
    if mdtype not in (MI_INT32, MI_UINT32) or len(dims) % 4 or not 2 <= len(dims) // 4 <= _MAX_DIMS:
        raise InputError(f"{cur.where}: a matrix has invalid dimensions; {_FIX}")
    shape = tuple(int(v) for v in np.frombuffer(dims, dtype=f"{cur.endian}i4"))
    if min(shape) < 0:
        raise InputError(f"{cur.where}: a matrix has negative dimensions {shape}; {_FIX}")
    mdtype, raw_name = cur.tag()
    if mdtype not in (MI_INT8, MI_UTF8):
        raise InputError(f"{cur.where}: a matrix has no valid name; {_FIX}")
    name = bytes(raw_name).decode("utf-8" if mdtype == MI_UTF8 else "latin-1", errors="replace")
    return name, shape, cls, bool(bits & _FLAG_COMPLEX)


def _inflate(f, nbytes: int, limit: int, where: str) -> bytes:
    """Decompress the zlib stream of ``nbytes`` at the file position, keeping at most ``limit`` bytes
    of output (a size the caller has bounded, never the stream's say-so)."""
    d = zlib.decompressobj()
    out = bytearray()
    left = nbytes
    try:
        while left and len(out) < limit:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)
            out += d.decompress(chunk, limit - len(out))
    except zlib.error as exc:
        raise InputError(f"{where}: compressed data is corrupt ({exc}); {_FIX}") from None
    return bytes(out)


def _top_tag(f, pos: int, size: int, path: Path, endian: str) -> tuple[int, int]:
    f.seek(pos)
    tag = f.read(8)
    mdtype, nbytes = _u32(tag, 0, endian), _u32(tag, 4, endian)
    if mdtype >> 16 or nbytes > size - pos - 8:
        raise InputError(f"{path}: the variable at offset {pos} claims {nbytes} bytes, past the end of the "
                         f"{size}-byte file; {_FIX}")
    return mdtype, nbytes


def _matrix_cursor(data: bytes, endian: str, where: str) -> _Cursor:
    """A cursor on the sub-elements of an inflated ``miMATRIX`` element (tag included in ``data``)."""
    if len(data) < 8 or _u32(data, 0, endian) != MI_MATRIX:
        raise InputError(f"{where}: a compressed variable does not hold a matrix; {_FIX}")
    return _Cursor(data, endian, where, pos=8)


def list_variables(path: Path) -> dict[str, Variable]:
    """The top-level variables of a v5 file, from their headers only (no data is read)."""
    size = path.stat().st_size
    out: dict[str, Variable] = {}
    with path.open("rb") as f:
        endian = _endian(path, f.read(128))
        pos = 128
        while size - pos >= 8:  # MATLAB may leave a few padding bytes at the end
            mdtype, nbytes = _top_tag(f, pos, size, path, endian)
            if mdtype == MI_COMPRESSED:
                cur = _matrix_cursor(_inflate(f, nbytes, _MAX_HEADER, str(path)), endian, str(path))
            elif mdtype == MI_MATRIX:
                cur = _Cursor(f.read(min(nbytes, _MAX_HEADER)), endian, str(path))
            else:
                raise InputError(f"{path}: a top-level element of type {mdtype} is not a matrix; {_FIX}")
            name, shape, cls, cplx = _matrix_header(cur)
            out[name] = Variable(name, shape, cls, cplx, pos, nbytes, mdtype == MI_COMPRESSED)
            pos += 8 + nbytes
    return out


def load_variable(path: Path, var: Variable) -> np.ndarray:
    """The data of one numeric variable, in MATLAB's shape (column-major order, as a Fortran-order array)."""
    if not var.numeric:
        raise InputError(f"variable {var.name!r} in {path.name} is a {var.cls}, not a numeric array")
    if var.complex:
        raise InputError(f"variable {var.name!r} in {path.name} is complex, which is unsupported; "
                         "save its magnitude or real part")
    target = np.dtype("uint8" if var.cls == "logical" else  # as scipy: logicals are uint8
                      next(dt for name, dt in _MX_NUMERIC.values() if name == var.cls))
    count = math.prod(var.shape)
    where = f"variable {var.name!r} in {path}"
    # every element takes at least one stored byte, and deflate expands at most ~1032:1
    if count > var.nbytes * (_DEFLATE_MAX_RATIO if var.compressed else 1):
        raise InputError(f"{where} claims shape {var.shape} but is stored in {var.nbytes} bytes; {_FIX}")
    check_fits_in_memory(count * target.itemsize, f"{where} (loaded whole)",
                         "save it with save(..., '-v7.3'), which is read in windows")
    size = path.stat().st_size
    with path.open("rb") as f:
        endian = _endian(path, f.read(128))
        mdtype, nbytes = _top_tag(f, var.offset, size, path, endian)
        if (mdtype == MI_COMPRESSED) != var.compressed or nbytes != var.nbytes:
            raise InputError(f"{where} changed while it was being read; convert again")
        if var.compressed:
            # tag + header sub-elements + real part (at most 8 bytes an element) + padding
            limit = 8 + _MAX_HEADER + 8 + count * 8 + 8
            cur = _matrix_cursor(_inflate(f, nbytes, limit, where), endian, where)
        else:
            cur = _Cursor(f.read(nbytes), endian, where)
    name, shape, cls, _ = _matrix_header(cur)
    if (name, shape, cls) != (var.name, var.shape, var.cls):
        raise InputError(f"{where} changed while it was being read; convert again")
    mdtype, real = cur.tag()
    if mdtype not in _MI_DTYPES:
        raise InputError(f"{where}: data of storage type {mdtype} is not numeric; {_FIX}")
    stored = np.dtype(_MI_DTYPES[mdtype]).newbyteorder(endian)
    if len(real) != count * stored.itemsize:
        raise InputError(f"{where}: {len(real)} bytes of {stored.name} data for shape {shape} "
                         f"({count * stored.itemsize} expected); {_FIX}")
    values = np.frombuffer(real, dtype=stored)
    return values.astype(target.newbyteorder("="), copy=True).reshape(shape, order="F")
